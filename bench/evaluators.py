"""What the ready evaluators cost: run by hand, not by the tests.

    .venv/bin/python bench/evaluators.py               # both scenarios, 3 rounds
    .venv/bin/python bench/evaluators.py --scenario offline --rounds 5

- ``offline``: 2,000 rows, a task returning the row's answer, four offline evaluators per
  row: the ready ones (`exact_match`, `token_f1`, `rouge`, `json_valid`) against
  hand-written equivalents (the same computations as plain ``@evaluator`` functions),
  each mode in its own process, rounds alternating, on the default backend (every call a
  task run, recorded on a Prefect server this script starts) and on ``backend="local"``.
  Figures: seconds to results and CPU seconds (the recorder process included), and the
  ratio ready / hand-written.
- ``judge``: a judge at C=64 against an OpenAI-compatible stand-in answering after 0.5 s
  (bench/latency_server.py): `llm_judge` in an experiment (taskless, the default backend)
  against a bare asyncio loop making the same calls through the same HTTP client; rows/s
  as a share of C/L.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def rows(n: int) -> list[dict[str, Any]]:
    return [{"sid": f"s{i}", "evaluated_model_input": f"question {i}",
             "answer": f'{{"answer": "The tower in Paris number {i % 97}", "n": {i}}}',
             "evaluated_model_gold_answer": f"the tower in Paris number {i % 89}"} for i in range(n)]


def ready_evaluators() -> list[Any]:
    from patronus_tasks.evaluators import exact_match, json_valid, rouge, token_f1

    return [exact_match(), token_f1(), rouge(), json_valid()]


def hand_evaluators() -> list[Any]:
    """The same four computations, as a user would write them."""
    import re
    import string
    import unicodedata
    from collections import Counter

    from rouge_score import rouge_scorer

    from patronus_tasks import EvaluationResult, evaluator

    scorer = rouge_scorer.RougeScorer(["rougeL"])

    def norm(s: str) -> str:
        return " ".join(unicodedata.normalize("NFKC", s).casefold().split())

    def squad(s: str) -> list[str]:
        s = "".join(c for c in s.lower() if c not in string.punctuation)
        return re.sub(r"\b(a|an|the)\b", " ", s).split()

    @evaluator
    def exact(evaluated_model_output: str, evaluated_model_gold_answer: str) -> bool:
        return norm(evaluated_model_output) == norm(evaluated_model_gold_answer)

    @evaluator
    def f1(evaluated_model_output: str, evaluated_model_gold_answer: str) -> EvaluationResult:
        p, g = squad(evaluated_model_output), squad(evaluated_model_gold_answer)
        same = sum((Counter(p) & Counter(g)).values())
        score = 0.0 if not same else 2 * same / (len(p) + len(g))
        return EvaluationResult(pass_=score >= 0.5, score_raw=score)

    @evaluator
    def rouge_l(evaluated_model_output: str, evaluated_model_gold_answer: str) -> EvaluationResult:
        score = scorer.score(evaluated_model_gold_answer, evaluated_model_output)["rougeL"].fmeasure
        return EvaluationResult(pass_=score >= 0.5, score_raw=score)

    @evaluator
    def valid(evaluated_model_output: str) -> bool:
        try:
            json.loads(evaluated_model_output)
            return True
        except ValueError:
            return False

    return [exact, f1, rouge_l, valid]


def run_offline(kind: str, backend: str, n: int, out: str) -> dict[str, Any]:
    from patronus_tasks import Row, run_experiment, task

    @task
    def answer(row: Row) -> str:
        return str(row.answer)

    start = time.perf_counter()  # both kinds' imports and set-up inside the window
    evaluators = ready_evaluators() if kind == "ready" else hand_evaluators()
    exp = run_experiment("bench-evaluators", data=rows(n), task=answer, evaluators=evaluators,
                         backend=backend, max_concurrency=16, results_dir=out,
                         print_summary=False, html_report=False)
    seconds = time.perf_counter() - start
    if backend == "prefect":
        exp.wait_recorded(300)
    return {"seconds": seconds, "records": len(exp.to_dataframe(["sid"]))}


async def _plain_judge(url: str, n: int, c: int) -> None:
    from patronus_tasks.evaluators.asking import Capabilities, Judgement, ask
    from patronus_tasks.evaluators.forms import PassFail
    from patronus_tasks.evaluators.judge import SYSTEM
    from patronus_tasks.http import Endpoint

    endpoint, sem, form = Endpoint(url, max_in_flight=c, max_attempts=1), asyncio.Semaphore(c), PassFail()
    j, caps = Judgement("judge", endpoint, {"temperature": 0}, None, None), Capabilities()

    async def one(i: int) -> None:
        async with sem:
            messages = [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": f"judge output {i}"}]
            assert (await ask(j, messages, form, caps)).reading.passed

    await asyncio.gather(*(one(i) for i in range(n)))
    await endpoint.aclose()


def run_judge(kind: str, url: str, n: int, c: int, out: str) -> dict[str, Any]:
    start = time.perf_counter()
    if kind == "plain":
        asyncio.run(_plain_judge(url, n, c))
        return {"seconds": time.perf_counter() - start}
    from patronus_tasks import run_experiment
    from patronus_tasks.evaluators import llm_judge
    from patronus_tasks.http import Endpoint

    judge = llm_judge("reads well", model="judge", endpoint=Endpoint(url, max_in_flight=c, max_attempts=1))
    data = [{"sid": f"s{i}", "evaluated_model_output": f"output {i}"} for i in range(n)]
    exp = run_experiment("bench-judge", data=data, evaluators=[judge], max_concurrency=c,
                         results_dir=out, print_summary=False, html_report=False)
    seconds = time.perf_counter() - start
    assert exp.summary().evaluators[0].passed == n
    return {"seconds": seconds}


def _child(argv: list[str]) -> None:
    """One measured run, in its own process: prints its JSON line."""
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["offline", "judge"])
    p.add_argument("kind")
    p.add_argument("--backend", default="prefect")
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--url", default="")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    found = (run_offline(a.kind, a.backend, a.rows, a.out) if a.what == "offline"
             else run_judge(a.kind, a.url, a.rows, a.concurrency, a.out))
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    found["cpu"] = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    print(json.dumps(found))


def measure(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", *args], env=env, capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def offline(rounds: int, env: dict[str, str], tmp: str) -> None:
    print("== offline: 2000 rows, 4 evaluators per row (ready vs hand-written), medians of "
          f"{rounds} alternating rounds")
    print(f"{'backend':<8} {'ready s':>8} {'hand s':>8} {'x time':>7} {'ready cpu':>10} "
          f"{'hand cpu':>9} {'x cpu':>6}")
    for backend in ("prefect", "local"):
        got: dict[str, list[dict[str, Any]]] = {"ready": [], "hand": []}
        for r in range(rounds):
            for kind in ("ready", "hand") if r % 2 == 0 else ("hand", "ready"):
                got[kind].append(measure(["offline", kind, "--backend", backend, "--out",
                                          f"{tmp}/{backend}-{kind}-{r}"], env))
        s = {k: _median([x["seconds"] for x in v]) for k, v in got.items()}
        c = {k: _median([x["cpu"] for x in v]) for k, v in got.items()}
        print(f"{backend:<8} {s['ready']:8.2f} {s['hand']:8.2f} {s['ready'] / s['hand']:7.3f} "
              f"{c['ready']:10.2f} {c['hand']:9.2f} {c['ready'] / c['hand']:6.3f}")


def judge(rounds: int, env: dict[str, str], tmp: str) -> None:
    from servers import wait

    port = _port()
    model = subprocess.Popen([sys.executable, str(HERE / "latency_server.py"), str(port), "0.5"])
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait(f"http://127.0.0.1:{port}/", model)
        n, c, latency = 2000, 64, 0.5
        limit = c / latency
        print(f"== judge: {n} rows, C={c}, L={latency} s, one judge call per row: "
              f"C/L limit {limit:.0f} rows/s")
        print(f"{'mode':<8} {'rows/s':>7} {'%C/L':>6} {'x plain':>8} {'cpu s':>6}")
        got: dict[str, list[dict[str, Any]]] = {"plain": [], "ready": []}
        for r in range(rounds):
            for kind in ("plain", "ready") if r % 2 == 0 else ("ready", "plain"):
                got[kind].append(measure(["judge", kind, "--url", url, "--rows", str(n), "--concurrency",
                                          str(c), "--out", f"{tmp}/judge-{kind}-{r}"], env))
        plain = n / _median([x["seconds"] for x in got["plain"]])
        for kind, runs in got.items():
            rate = n / _median([x["seconds"] for x in runs])
            print(f"{kind:<8} {rate:7.1f} {rate / limit:6.1%} {rate / plain:8.3f} "
                  f"{_median([x['cpu'] for x in runs]):6.2f}")
    finally:
        model.terminate()


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", choices=["offline", "judge", "all"], default="all")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    from servers import start

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "prefect-home"
        home.mkdir()
        server = start("builtin", home)
        env = {**os.environ, "PREFECT_API_URL": server.api_url, "PREFECT_HOME": str(home)}
        try:
            if a.scenario in ("offline", "all"):
                offline(a.rounds, env, tmp)
            if a.scenario in ("judge", "all"):
                judge(a.rounds, env, tmp)
        finally:
            server.stop()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2:])
    else:
        main()
