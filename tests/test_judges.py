"""LLM judges against a real HTTP server on 127.0.0.1 speaking the OpenAI chat API with
scripted answers (tests/judge_server.py): verdicts, scales, logprobs, garbage,
refusals, out-of-scale answers, 429s and 500s, endpoints without structured output;
a judge that gives no verdict is that row's unscored error, never a pass or a 0."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from patronus_tasks import ConfigError, DatasetError, JudgeError, QualityGateError, run_experiment, task
from patronus_tasks.evaluators import (
    answer_relevance,
    calibrate,
    context_recall,
    context_relevance,
    factuality,
    faithfulness,
    judge_agreement,
    llm_judge,
    pairwise_judge,
)
from patronus_tasks.evaluators.judge import LLM_JUDGE_PROMPT
from patronus_tasks.http import Endpoint
from patronus_tasks.openai import openai_endpoint
from patronus_tasks.results.agreement import cohen_kappa, krippendorff_alpha

from .judge_server import ScriptedJudge, judge_server

LOCAL: dict[str, Any] = dict(backend="local", print_summary=False, html_report=False)


def rows(*outputs: str, **extra: Any) -> list[dict[str, Any]]:
    return [{"sid": f"r{i}", "evaluated_model_input": f"question {i}", "evaluated_model_output": out,
             "evaluated_model_gold_answer": f"gold {i}", **extra} for i, out in enumerate(outputs)]


def endpoint(server: Any, **options: Any) -> Any:
    return Endpoint(server.url, headers={"authorization": "Bearer sk-secret-judge-key"}, backoff=0.01,
                    **options)


def records(exp: Any) -> dict[str, Any]:
    df = exp.to_dataframe()
    return {r["sid"]: r for _, r in df[df["evaluator_name"].notna()].iterrows()}


def test_a_rubric_judge_reads_every_field_and_never_passes_silently(results_dir: Path) -> None:
    script = ScriptedJudge(script={
        "GOOD": [{"explanation": "fine", "pass": True}],
        "BAD": [{"explanation": "rude", "pass": False}],
        "GARBAGE": ["the answer looks fine to me"],
        "REFUSES": [("refusal", "I can't help with evaluating that.")],
        "SORRY": ["I'm sorry, but I cannot evaluate this content."],
        "OUTSIDE": [{"explanation": "hm", "pass": "maybe"}],
        "BUSY": ["429", {"explanation": "ok after the wait", "pass": True}],
        "DOWN": ["500"],
    })
    with judge_server(script) as server:
        judge = llm_judge("The answer is polite and uses the context.", model="judge-1",
                          endpoint=endpoint(server))
        data = rows("GOOD", "BAD", "GARBAGE", "REFUSES", "SORRY", "OUTSIDE", "BUSY", "DOWN",
                    evaluated_model_retrieved_context=["ctx-A", "ctx-B"])
        exp = run_experiment("judges", data=data, evaluators=[judge], results_dir=results_dir, **LOCAL)
    got = records(exp)
    assert (got["r0"]["pass"], got["r0"]["score"], got["r1"]["pass"]) == (True, 1.0, False)
    assert got["r6"]["pass"] and got["r6"]["explanation"] == "ok after the wait"
    # What the judge was asked: the rubric, the input, the context, the gold answer, the
    # output; in the form of a JSON schema (structured output), at temperature 0.
    first = next(r for r in script.requests if "GOOD" in script.prompt(r))
    prompt = first.body["messages"][1]["content"]
    for part in ("The answer is polite and uses the context.", "question 0", "[1] ctx-A\n[2] ctx-B",
                 "gold 0", "GOOD"):
        assert part in prompt, part
    assert first.body["response_format"]["json_schema"]["schema"]["required"] == ["explanation", "pass"]
    assert first.body["temperature"] == 0 and first.body["model"] == "judge-1"
    assert first.headers["authorization"] == "Bearer sk-secret-judge-key"
    # No verdict: an error on that row, with what the judge said, and never a pass or a score.
    reasons = {"r2": "no JSON object", "r3": "refused", "r4": "refused", "r5": "out of its scale",
               "r7": "did not answer"}
    for sid, said in reasons.items():
        r = got[sid]
        assert r["status"] == "error" and r["error_type"] == "JudgeError", sid
        assert said in r["error_message"], (sid, r["error_message"])
        assert r["pass"] is None and pd.isna(r["score"]), sid
    assert "the answer looks fine to me" in got["r2"]["error_message"]
    assert "I can't help with evaluating that." in got["r3"]["error_message"]
    assert "HTTP 500" in got["r7"]["error_message"]
    stats = exp.summary().evaluators[0]
    assert (stats.passed, stats.judged, stats.unscored, stats.errors) == (2, 3, 5, 5)
    assert stats.pass_rate == pytest.approx(2 / 3)
    assert "2 of 3 judged rows passed (66.7%), 5 unscored" in exp.summary().headline()
    assert "5 unscored: no verdict, out of the pass rate" in exp.format_summary()
    # Tokens of every call that answered, the model named; the key nowhere.
    assert got["r0"]["evaluation_input_tokens"] == 100 and got["r0"]["evaluation_model"] == "judge-1"
    written = exp.to_dataframe().to_json() + (results_dir / "judges").joinpath(
        exp.name, "manifest.json").read_text()
    assert "sk-secret-judge-key" not in written


def test_scales_logprobs_and_choices() -> None:
    script = ScriptedJudge(script={
        "WEIGHTED": [("logprobs", {"explanation": "x", "score": 4}, "score",
                      {"4": 0.6, "3": 0.3, "5": 0.1})],
        "PLAIN": [{"explanation": "x", "score": 5}],
        "HIGH": [{"explanation": "x", "score": 7}],
        "PICK": [("logprobs", {"explanation": "x", "choice": "good"}, "choice", {"good": 0.75, "bad": 0.25})],
        "YESNO": [("logprobs", {"explanation": "x", "pass": True}, "pass", {"true": 0.9, "false": 0.1})],
    })
    with judge_server(script) as server:
        five = llm_judge("helpful", scale=5, threshold=0.7, endpoint=endpoint(server))
        weighted = _run(five.evaluate(evaluated_model_output="WEIGHTED"))
        # G-Eval: 0.6*4 + 0.3*3 + 0.1*5 = 3.8 on 1-5, (3.8 - 1) / 4 in [0, 1]; 4 kept as raw.
        assert weighted.score_raw == pytest.approx(0.7) and weighted.pass_ is True
        assert weighted.metadata["raw"] == 4 and weighted.metadata["logprobs"] is True
        assert weighted.metadata["raw_weighted"] == pytest.approx(3.8)
        plain = _run(five.evaluate(evaluated_model_output="PLAIN"))
        assert plain.score_raw == 1.0 and plain.metadata["logprobs"] is False
        with pytest.raises(JudgeError, match="out of its scale") as err:
            _run(five.evaluate(evaluated_model_output="HIGH"))
        assert err.value.reason == "out_of_scale" and '"score": 7' in (err.value.raw or "").replace("'", '"')
        asked = next(r for r in script.requests if "WEIGHTED" in script.prompt(r)).body
        assert asked["logprobs"] is True and asked["top_logprobs"] == 20
        choices = llm_judge("tone", scale={"good": 1.0, "bad": 0.0}, endpoint=endpoint(server))
        picked = _run(choices.evaluate(evaluated_model_output="PICK"))
        assert picked.score_raw == pytest.approx(0.75) and picked.pass_ and picked.metadata["raw"] == "good"
        yes = _run(llm_judge("ok", endpoint=endpoint(server)).evaluate(evaluated_model_output="YESNO"))
        assert yes.pass_ is True and yes.score_raw == pytest.approx(0.9)


def _run(coro: Any) -> Any:
    import asyncio

    return asyncio.run(coro)


def test_an_endpoint_without_structured_output_or_logprobs_is_asked_plainly() -> None:
    script = ScriptedJudge(no_structured=True, no_logprobs=True,
                           default='Here you go:\n```json\n{"explanation": "fine", "score": 3}\n```')
    with judge_server(script) as server:
        judge = llm_judge("clear", scale=5, endpoint=endpoint(server))

        async def twice() -> list[Any]:
            return [await judge.evaluate(evaluated_model_output="a"),
                    await judge.evaluate(evaluated_model_output="b")]

        first, second = _run(twice())
    assert first.score_raw == second.score_raw == 0.5
    # Answered without both options; the second call did not offer them again.
    assert len(script.requests) == 2
    assert all("response_format" not in r.body and "logprobs" not in r.body for r in script.requests)
    strict = llm_judge("clear", endpoint=openai_endpoint(base_url="http://127.0.0.1:9"), structured=True)
    assert strict.judgements[0].structured is True


def test_a_panel_takes_the_majority_and_a_failing_member_leaves_the_row_unscored() -> None:
    script = ScriptedJudge(script={"ROW": [{"explanation": "x", "pass": True}]})
    with judge_server(script) as server:
        panel = llm_judge("correct", judges=["a", "b", "c"], endpoint=endpoint(server),
                          prompt=LLM_JUDGE_PROMPT + "\n(a panel)")
        # The three are asked at once; the script answers in the order the calls arrive.
        script.script = {"ROW": [{"explanation": "yes", "pass": True}, {"explanation": "no", "pass": False},
                                 {"explanation": "yes", "pass": True}, {"explanation": "yes", "pass": True}]}
        result = _run(panel.evaluate(evaluated_model_output="ROW"))
        assert result.pass_ is True and result.score_raw == pytest.approx(2 / 3)
        assert [j["model"] for j in result.metadata["judges"]] == ["a", "b", "c"]
        assert result.usage.input_tokens == 300 and result.usage.model == "a+b+c"
        script.script = {"ROW": ["500"]}
        with pytest.raises(JudgeError, match="did not answer"):
            _run(panel.evaluate(evaluated_model_output="ROW"))
        assert "(a panel)" in script.requests[0].body["messages"][1]["content"]


def test_factuality_and_answer_relevance() -> None:
    script = ScriptedJudge(script={"SUPERSET": [{"explanation": "adds details", "choice": "B"}],
                                   "WRONG": [{"explanation": "says Lyon", "choice": "D"}],
                                   "RELEVANT": [{"explanation": "on topic", "score": 4}]})
    with judge_server(script) as server:
        fact = factuality(endpoint=endpoint(server))
        more = _run(fact.evaluate(evaluated_model_gold_answer="Paris", evaluated_model_output="SUPERSET",
                                  evaluated_model_input="capital?"))
        assert (more.score_raw, more.pass_, more.metadata["raw"]) == (0.6, True, "B")
        wrong = _run(fact.evaluate(evaluated_model_gold_answer="Paris", evaluated_model_output="WRONG"))
        assert (wrong.score_raw, wrong.pass_) == (0.0, False)
        prompt = script.requests[0].body["messages"][1]["content"]
        assert "[Expert]: Paris" in prompt and "[Submission]: SUPERSET" in prompt and "superset" in prompt
        rel = _run(answer_relevance(endpoint=endpoint(server)).evaluate(
            evaluated_model_input="what?", evaluated_model_output="RELEVANT"))
        assert rel.score_raw == 0.75 and rel.pass_


def test_rag_judges_list_what_does_not_hold() -> None:
    claims = {"explanation": "one unsupported", "claims": [
        {"claim": "Paris is in France", "supported": True},
        {"claim": "Paris has 90 million people", "supported": False}]}
    script = ScriptedJudge(script={
        "FAITH": [claims],
        "NOCLAIM": [{"explanation": "nothing claimed", "claims": []}],
        "RELEV": [{"explanation": "x", "passages": [{"passage": "1", "relevant": True},
                                                     {"passage": "2", "relevant": False}]}],
        "SHORT": [{"explanation": "x", "passages": [{"passage": "1", "relevant": True}]}],
        "RECALL": [{"explanation": "x", "statements": [{"statement": "a", "attributed": True},
                                                       {"statement": "b", "attributed": True},
                                                       {"statement": "c", "attributed": False}]}],
    })
    context = ["Paris is the capital of France.", "Bananas are yellow."]
    with judge_server(script) as server:
        ep = endpoint(server)
        faith = _run(faithfulness(endpoint=ep).evaluate(evaluated_model_retrieved_context=context,
                                                        evaluated_model_output="FAITH"))
        assert faith.score_raw == 0.5 and not faith.pass_
        assert faith.explanation.startswith("unsupported claims (1):\n- Paris has 90 million people")
        assert len(faith.metadata["claims"]) == 2
        sent = script.requests[0].body["messages"][1]["content"]
        assert "[1] Paris is the capital of France.\n[2] Bananas are yellow." in sent
        none = _run(faithfulness(endpoint=ep).evaluate(evaluated_model_retrieved_context=context,
                                                       evaluated_model_output="NOCLAIM"))
        assert none.score_raw == 1.0 and none.pass_
        rel = _run(context_relevance(endpoint=ep).evaluate(evaluated_model_input="RELEV",
                                                           evaluated_model_retrieved_context=context))
        assert rel.score_raw == 0.5 and rel.pass_ and "passages not relevant (1)" in rel.explanation
        with pytest.raises(JudgeError, match="2 passages were given, the judge marked 1"):
            _run(context_relevance(endpoint=ep).evaluate(evaluated_model_input="SHORT",
                                                         evaluated_model_retrieved_context=context))
        recall = _run(context_recall(endpoint=ep).evaluate(
            evaluated_model_gold_answer="RECALL", evaluated_model_retrieved_context=context))
        assert recall.score_raw == pytest.approx(2 / 3) and recall.pass_


@task
def answer_v2(evaluated_model_input: str) -> str:
    return f"NEW {evaluated_model_input}"


@task
def answer_v1(evaluated_model_input: str) -> str:
    return f"OLD {evaluated_model_input}"


def test_pairwise_asks_both_orders_and_calls_disagreement_a_tie(results_dir: Path) -> None:
    data = [{"sid": s, "evaluated_model_input": s} for s in ("win", "lose", "biased")]
    base = run_experiment("pair", data=data, task=answer_v1, experiment_name="v1",
                          results_dir=results_dir, **LOCAL)

    def verdict(req: Any) -> Any:
        text = req.body["messages"][1]["content"]
        a = text.split("[Answer A]\n")[1].split("\n")[0]
        if "biased" in a:
            return 200, {}, {"choices": [{"message": {"content": json.dumps(
                {"explanation": "first is better", "choice": "A"})}}]}
        new_first = a.startswith("NEW")
        better_new = "win" in a
        choice = ("A" if new_first else "B") if better_new else ("B" if new_first else "A")
        return 200, {}, {"choices": [{"message": {"content": json.dumps(
            {"explanation": "reasons", "choice": choice})}}], "usage": {"prompt_tokens": 5}}

    from .servers import serve

    with serve(verdict) as server:
        judge = pairwise_judge(base, endpoint=endpoint(server))
        exp = run_experiment("pair", data=data, task=answer_v2, evaluators=[judge],
                             experiment_name="v2", results_dir=results_dir, **LOCAL)
        assert len(server.requests) == 6  # every row asked twice, in both orders
        orders = [r.body["messages"][1]["content"].split("[Answer A]\n")[1][:3] for r in server.requests]
        assert sorted(orders) == ["NEW"] * 3 + ["OLD"] * 3
    got = records(exp)
    assert (got["win"]["score"], got["win"]["pass"]) == (1.0, True)
    assert (got["lose"]["score"], got["lose"]["pass"]) == (0.0, False)
    assert got["biased"]["score"] == 0.5 and "the two orders disagree" in got["biased"]["explanation"]
    missing = pairwise_judge(base, endpoint=openai_endpoint(base_url="http://127.0.0.1:9"))
    with pytest.raises(DatasetError, match="no output for row sid=other"):
        from patronus_tasks.define.row import Row

        _run(missing.evaluate(row=Row({"sid": "other"}), evaluated_model_output="x"))


# Calibration.

def test_kappa_and_alpha_as_computed_by_hand() -> None:
    # 10 rows: human pass/fail against judge; agree on 7.
    pairs = [("pass", "pass")] * 4 + [("fail", "fail")] * 3 + [("pass", "fail")] * 2 + [("fail", "pass")]
    # p_o = 0.7; human: 6 pass 4 fail; judge: 5 pass 5 fail; p_e = 0.6*0.5 + 0.4*0.5 = 0.5
    assert cohen_kappa(pairs, ["fail", "pass"]) == pytest.approx((0.7 - 0.5) / (1 - 0.5))
    # Quadratic weights on 1-3: one row off by 2 weighs 1, off by 1 weighs 1/4.
    ordinal = [("1", "1"), ("2", "2"), ("3", "3"), ("1", "3"), ("2", "3")]
    observed = (1 + 0.25) / 5
    rows_, cols = {"1": 2 / 5, "2": 2 / 5, "3": 1 / 5}, {"1": 1 / 5, "2": 1 / 5, "3": 3 / 5}
    w = {("1", "2"): 0.25, ("2", "1"): 0.25, ("2", "3"): 0.25, ("3", "2"): 0.25, ("1", "3"): 1, ("3", "1"): 1}
    expected = sum(w.get((a, b), 0) * rows_[a] * cols[b] for a in rows_ for b in cols)
    assert cohen_kappa(ordinal, ["1", "2", "3"], weighted=True) == pytest.approx(1 - observed / expected)
    # Krippendorff's alpha, nominal, by pairs: units of three raters.
    units = [["a", "a", "a"], ["a", "b", "a"], ["b", "b", "b"], ["b", "b", None]]
    values = [v for u in units for v in u if v is not None]
    n = len(values)
    d_o = sum(sum(x != y for i, x in enumerate(u) for j, y in enumerate(u) if i != j) / (len(u) - 1)
              for u in ([v for v in u if v is not None] for u in units)) / n
    d_e = sum(x != y for i, x in enumerate(values) for j, y in enumerate(values) if i != j) / (n * (n - 1))
    assert krippendorff_alpha(units) == pytest.approx(1 - d_o / d_e)


def test_calibrate_a_judge_against_human_labels(results_dir: Path) -> None:
    labels = ["pass", "pass", "fail", "fail", "pass", "fail", "pass", "fail"]
    judged = [True, True, False, True, True, False, False, False]
    script = ScriptedJudge(script={f"OUT{i}": [{"explanation": f"e{i}", "pass": v}]
                                   for i, v in enumerate(judged)})
    data = [{"sid": f"s{i}", "evaluated_model_input": "q", "evaluated_model_output": f"OUT{i}", "label": lab}
            for i, lab in enumerate(labels)]
    data.append({"sid": "s8", "evaluated_model_input": "q", "evaluated_model_output": "OUT0", "label": None})
    with judge_server(script) as server:
        judge = llm_judge("correct", endpoint=endpoint(server), name="correctness")
        cal = calibrate(judge, data, results_dir=results_dir, **LOCAL)
        # 6 of 8 agree; human 4/4, judge 4/4: p_e = 0.5, kappa = (0.75 - 0.5) / 0.5
        assert cal.agreement.n == 8 and cal.agreement.unlabelled == 1
        assert cal.metrics["judge_accuracy"] == 0.75 and cal.metrics["judge_kappa"] == pytest.approx(0.5)
        assert cal.confusion.loc["fail", "pass"] == 1 and cal.confusion.loc["pass", "fail"] == 1
        assert sorted(cal.disagreements["sid"]) == ["s3", "s6"]
        assert "Cohen's kappa 0.500" in str(cal) and "s3" in str(cal)
        values = {m.name: m.value for m in cal.experiment.manifest.metrics}
        assert values["judge_kappa"] == pytest.approx(0.5)
        assert cal.experiment.manifest.tags["calibration"] == "correctness|label"
        # The HTML report and the Prefect -report artifact show the matrix and the rows.
        from patronus_tasks.prefect.ui.artifacts import calibration_markdown
        from patronus_tasks.report.build import build_report

        page = build_report(cal.experiment)
        assert "<h3>Judge calibration</h3>" in page and "Rows where they disagree" in page
        markdown = "\n".join(calibration_markdown(cal.experiment))
        assert "## Judge calibration" in markdown and "| s3 | fail | pass | e3 |" in markdown
        with pytest.raises(QualityGateError, match="judge_kappa"):
            calibrate(judge, data, min_kappa=0.6, results_dir=results_dir, **LOCAL)
        bad = [*data, {"sid": "s9", "evaluated_model_output": "OUT1", "label": "maybe"}]
        with pytest.raises(DatasetError, match=r"row sid=s9: label='maybe' is not a label"):
            calibrate(judge, bad, results_dir=results_dir, **LOCAL)
        # The same figure on an ordinary experiment whose rows carry labels.
        exp = run_experiment("nightly", data=data, evaluators=[judge], results_dir=results_dir,
                             metrics=[judge_agreement(judge)], min_metrics={"judge_kappa": 0.4}, **LOCAL)
        assert {m.name for m in exp.manifest.metrics} >= {"judge_kappa", "judge_accuracy", "judge_n"}


def test_a_scale_judge_is_calibrated_with_weighted_kappa_and_a_panel_with_alpha(results_dir: Path) -> None:
    # Each row asked of two judges at once: their two answers, in whichever order they come.
    answers = {"o0": [3, 3], "o1": [3, 4], "o2": [1, 2], "o3": [5, 5]}
    script = ScriptedJudge(script={k: [{"explanation": "x", "score": v} for v in vs]
                                   for k, vs in answers.items()})
    data = [{"sid": f"s{i}", "evaluated_model_output": f"o{i}", "label": lab}
            for i, lab in enumerate([3, 3, 1, 5])]
    with judge_server(script) as server:
        cal = calibrate(llm_judge("good", scale=5, endpoint=endpoint(server), judges=["m1", "m2"]),
                        data, results_dir=results_dir, **LOCAL)
    a = cal.agreement
    # The panel's answer: its mean score's nearest value (3; 3.5 -> 4; 1.5 -> 2; 5).
    pairs = [("3", "3"), ("3", "4"), ("1", "2"), ("5", "5")]
    assert a.weighted and a.categories == ["1", "2", "3", "4", "5"] and a.accuracy == 0.5
    assert a.kappa == pytest.approx(cohen_kappa(pairs, a.categories, weighted=True))
    # Krippendorff's alpha (interval) across the two judges, by pairs.
    units = list(answers.values())
    values = [v for u in units for v in u]
    n = len(values)
    d_o = sum(sum((x - y) ** 2 for i, x in enumerate(u) for j, y in enumerate(u) if i != j) / (len(u) - 1)
              for u in units) / n
    d_e = sum((x - y) ** 2 for i, x in enumerate(values)
              for j, y in enumerate(values) if i != j) / (n * (n - 1))
    assert a.judges == ["m1", "m2"] and a.alpha == pytest.approx(1 - d_o / d_e)
    assert cal.metrics["judge_alpha"] == pytest.approx(a.alpha)


def test_bad_judge_options_are_config_errors() -> None:
    for make, message in [
        (lambda: llm_judge("x", scale=1), "scale must be an int from 2 to 10"),
        (lambda: llm_judge("x", scale={"good": 2}), "scale must be None"),
        (lambda: llm_judge(""), "criteria must be a non-empty text"),
        (lambda: llm_judge("x", judges=["a"], model="b"), "not both"),
        (lambda: llm_judge("x", judges=[3]), "each of judges="),
        (lambda: llm_judge("x", threshold=2), "threshold must be a number from 0 to 1"),
        (lambda: llm_judge("x", aggregate="median"), "aggregate must be one of"),
        (lambda: llm_judge("x", structured="yes"), "structured must be True, False or None"),
        (lambda: faithfulness(treshold=0.5), "unknown option 'treshold'"),
        (lambda: calibrate(object(), []), "judge must be an evaluator"),  # type: ignore[arg-type]
    ]:
        with pytest.raises(ConfigError, match=message):
            make()


def test_a_cached_judge_asks_once(results_dir: Path) -> None:
    script = ScriptedJudge(default={"explanation": "fine", "pass": True})
    with judge_server(script) as server:
        judge = llm_judge("fine", endpoint=endpoint(server), cache=True)
        for name in ("first", "second"):
            run_experiment("cached-judge", data=rows("a", "b"), evaluators=[judge], experiment_name=name,
                           results_dir=results_dir, **LOCAL)
    assert len(script.requests) == 2


def test_a_judge_that_times_out_after_its_retries_is_unscored_not_failed() -> None:
    script = ScriptedJudge(default={"explanation": "late", "pass": True}, delay=0.6)
    with judge_server(script) as server:
        judge = llm_judge("fine", endpoint=endpoint(server, timeout=0.2, max_attempts=2))
        with pytest.raises(JudgeError, match=r"did not answer.*ReadTimeout") as err:
            _run(judge.evaluate(evaluated_model_output="x"))
    assert err.value.reason == "no_answer" and err.value.attempts == 2


def test_every_judge_without_a_verdict_is_unscored_llmjudge_timeouts_and_subclasses_too(
        results_dir: Path) -> None:
    """No answer is never a fail: `LLMJudge`'s endpoint down or answering with no message,
    a judge stopped by its own ``timeout_seconds``, a `JudgeError` subclass of the user's."""
    from patronus_tasks import evaluator
    from patronus_tasks.openai import LLMJudge

    class MyJudgeError(JudgeError):
        pass

    @evaluator
    def own_judge(evaluated_model_output: str) -> bool:
        if evaluated_model_output != "GOOD":
            raise MyJudgeError("my judge could not read it", raw="?", reason="unparseable")
        return True

    script = ScriptedJudge(script={"GOOD": [{"pass": True, "explanation": "ok"}], "DOWN": ["500"],
                                   "EMPTY": [("raw", {"choices": []})]},
                           default={"pass": True, "explanation": "ok"})
    with judge_server(script) as server:
        legacy = LLMJudge("legacy", "is fine", model="m", endpoint=endpoint(server, max_attempts=2))
        exp = run_experiment("unscored", data=rows("GOOD", "DOWN", "EMPTY"),
                             evaluators=[legacy, own_judge], results_dir=results_dir, **LOCAL)
        slow = llm_judge("fine", endpoint=endpoint(server), timeout_seconds=0.3, name="slow")
        script.delay = 1.0
        timed = run_experiment("unscored", data=rows("GOOD"), evaluators=[slow],
                               results_dir=results_dir, **LOCAL)
    for stats in exp.summary().evaluators:
        assert (stats.passed, stats.judged, stats.unscored) == (1, 1, 2), stats
    said = exp.to_dataframe().query("evaluator_name == 'legacy'").set_index("sid")["error_message"]
    assert "did not answer" in said["r1"] and "HTTP 500" in said["r1"]
    assert "answered with no message" in said["r2"]
    mine = exp.to_dataframe().query("evaluator_name == 'own_judge' and status == 'error'")
    assert set(mine["error_type"]) == {"JudgeError"}
    assert mine["error_message"].str.startswith("MyJudgeError: my judge could not read it").all()
    late = timed.to_dataframe().iloc[0]
    assert (late["error_type"], late["pass"]) == ("JudgeError", None)
    assert "timed out after 0.3 s (timeout_seconds): no verdict" in late["error_message"]
    assert timed.summary().evaluators[0].unscored == 1


def test_a_panels_cost_is_each_models_tokens_at_its_own_price(results_dir: Path) -> None:
    script = ScriptedJudge(default={"pass": True, "explanation": "ok"})
    with judge_server(script) as server:
        panel = llm_judge("fine", judges=[("gpt-4o", endpoint(server)), ("gpt-4o-mini", endpoint(server))])
        exp = run_experiment("panel-cost", data=rows("a"), evaluators=[panel], results_dir=results_dir,
                             **LOCAL)
    row = exp.to_dataframe().iloc[0]
    assert row["evaluation_model"] == "gpt-4o+gpt-4o-mini" and row["evaluation_input_tokens"] == 200
    # 100 in, 20 out each: gpt-4o at $2.50/$10 per Mtok, gpt-4o-mini at $0.15/$0.60.
    gpt4o, mini = 100 * 2.5e-6 + 20 * 10e-6, 100 * 0.15e-6 + 20 * 0.6e-6
    assert row["evaluation_cost_usd"] == pytest.approx(gpt4o + mini)


def test_a_judge_nobody_pointed_anywhere_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is asked of api.openai.com unless said (a row's prompt holds its data)."""
    from patronus_tasks.openai import LLMJudge

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    for make in (lambda: llm_judge("fine"), lambda: LLMJudge("j", "fine"), openai_endpoint):
        with pytest.raises(ConfigError, match="no model endpoint: set OPENAI_BASE_URL"):
            make()
    with pytest.raises(ConfigError, match=r"needs its scheme \(http://127.0.0.1:8000/v1"):
        openai_endpoint("127.0.0.1:8000/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert openai_endpoint().base_url == "https://api.openai.com/v1"


def test_calibrate_gives_its_figures_with_the_gate_that_failed(results_dir: Path) -> None:
    script = ScriptedJudge(default={"pass": True, "explanation": "ok"})
    data = [{**r, "label": label} for r, label in zip(rows("a", "b", "c", "d"), [True, False, True, False],
                                                       strict=True)]
    with judge_server(script) as server:
        judge = llm_judge("fine", endpoint=endpoint(server))
        with pytest.raises(QualityGateError, match="judge_kappa") as err:
            calibrate(judge, data, min_kappa=0.5, results_dir=results_dir, **LOCAL)
    assert err.value.calibration.agreement.accuracy == 0.5
