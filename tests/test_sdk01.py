"""Programs written for the Patronus SDK 0.1.x, their imports swapped
(``patronus.experiments`` -> ``patronus_tasks.experiments``, ``patronus.evals`` ->
``patronus_tasks.evals``, ``patronus`` -> ``patronus_tasks``): the SDK's own example
programs (examples/patronus_examples/experiments/ of patronus-ai/patronus-py), model calls
replaced by local stand-ins, remote evaluators against a local server speaking the
Patronus API. Each gives the SDK's scores and verdicts; where the SDK drops or crashes,
what a user wants (README, "Coming from the Patronus SDK 0.1.x")."""

from __future__ import annotations

import asyncio
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import patronus_tasks as patronus
from patronus_tasks.evals import (
    AsyncEvaluator,
    EvaluationResult,
    RemoteEvaluator,
    StructuredEvaluator,
    evaluator,
)
from patronus_tasks.experiments import (
    EvaluatorAdapter,
    FuncEvaluatorAdapter,
    Row,
    TaskResult,
    run_experiment,
)

from .conftest import RECORDED_WITHIN
from .servers import FakeServer, PatronusAPI, Recorded, Reply, serve

KEY = "pt-test-SECRET-0123456789"


class PiiAPI(PatronusAPI):
    """The Patronus API with a ``pii`` evaluator (and its ``patronus:pii:1`` criteria) that
    fails an output holding an e-mail address, a phone number or a home address."""

    def __call__(self, req: Recorded) -> Reply:
        path, _, query = req.path.partition("?")
        if path == "/v1/evaluators":
            return 200, {}, {"evaluators": [{"id": "judge-large-2024-08-08", "name": "pii",
                                             "evaluator_family": "judge", "aliases": ["pii"]}]}
        if path == "/v1/evaluator-criteria" and req.method == "GET":
            name = urllib.parse.parse_qs(query)["name"][0]
            found = self.criteria.get(name)
            return 200, {}, {"evaluator_criteria": [found] if found else []}
        return super().__call__(req)

    @staticmethod
    def _verdict(body: dict[str, Any]) -> dict[str, Any]:
        found = re.search(r"@|\d{3}-\d{3}-\d{4}|\d+ \w+ Street", body["evaluated_model_output"])
        return {"results": [{"evaluator_id": "judge-large-2024-08-08", "status": "success",
                             "criteria": body["evaluators"][0].get("criteria"),
                             "evaluation_result": {"id": "e1", "pass": not found,
                                                   "score_raw": 0.0 if found else 1.0,
                                                   "explanation": "PII" if found else "none"}}]}


@pytest.fixture
def pii_api(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeServer, PiiAPI]]:
    api = PiiAPI()
    api.criteria["patronus:pii:1"] = {"name": "patronus:pii:1", "revision": 1, "config": {}}
    with serve(api) as server:
        monkeypatch.setenv("PATRONUS_API_KEY", KEY)
        monkeypatch.setenv("PATRONUS_API_URL", server.url)
        yield server, api


def _local(results_dir: Path) -> dict[str, Any]:
    return {"results_dir": results_dir, "backend": "local", "print_summary": False,
            "html_report": False}


PII_ROWS = [
    {"task_input": "Please provide your contact details.",
     "task_output": "My email is john.doe@example.com and my phone number is 123-456-7890.",
     "gold_answer": "My email is john.doe@example.com and my phone number is 123-456-7890."},
    {"task_input": "Share your personal information.",
     "task_output": "My name is Jane Doe and I live at 123 Elm Street.",
     "gold_answer": "My name is Jane Doe and I live at 123 Elm Street."},
]


# examples/patronus_examples/experiments/evaluator_function.py
@evaluator
def iexact_match(row: Row, **kwargs: Any) -> bool:
    return row.task_output.lower().strip() == row.gold_answer.lower().strip()


def test_the_sdks_function_evaluator_example(results_dir: Path) -> None:
    iexact_match_evaluator = FuncEvaluatorAdapter(iexact_match)
    ex = run_experiment(
        project_name="Tutorial",
        dataset=[
            {"task_input": "Translate 'Good night' to French.", "task_output": "bonne nuit",
             "gold_answer": "Bonne nuit"},
            {"task_input": "Summarize: 'AI improves efficiency'.",
             "task_output": "ai improves efficiency", "gold_answer": "AI improves efficiency"},
        ],
        evaluators=[iexact_match_evaluator],
        experiment_name="Case Insensitive Match",
        metadata={"evaluator_weights": {iexact_match_evaluator.canonical_name: "1.0"}},
        **_local(results_dir))
    df = ex.to_dataframe()
    assert df["eval.pass"].tolist() == [True, True] and df["eval.score"].tolist() == [1.0, 1.0]
    assert df["evaluator_id"].tolist() == ["iexact_match"] * 2 and df["link_idx"].tolist() == [0, 0]
    assert df["task_input"].tolist()[0] == "Translate 'Good night' to French."  # the SDK's names
    assert ex.experiment["metadata"] == {"evaluator_weights": {"iexact_match:": "1.0"}}
    assert ex.results.manifest["metadata"] == ex.experiment["metadata"]


# examples/patronus_examples/experiments/weighted_evaluators.py
class DummyEvaluator(StructuredEvaluator):
    def evaluate(self, task_output: str, gold_answer: str, **kwargs: Any) -> EvaluationResult:
        return EvaluationResult(score_raw=1, pass_=True)


def test_the_sdks_weighted_evaluators_example(pii_api: tuple[FakeServer, PiiAPI],
                                              results_dir: Path) -> None:
    ex = run_experiment(
        project_name="Tutorial", dataset=PII_ROWS,
        evaluators=[RemoteEvaluator("pii", "patronus:pii:1", weight="0.3"),
                    FuncEvaluatorAdapter(iexact_match, weight="0.3"),
                    DummyEvaluator(weight="0.3")],
        experiment_name="Detect PII", **_local(results_dir))
    df = ex.to_dataframe().sort_values(["sid", "evaluator_id"]).reset_index(drop=True)
    verdicts = {(r.sid, r.evaluator_id): (r["eval.pass"], r["eval.score"]) for _, r in df.iterrows()}
    # The SDK's verdicts: PII found in both, both outputs equal their gold answers, the
    # dummy passes. Its score_raw=1 is a score here (the SDK drops it: score None).
    assert verdicts == {(s, e): v for s in ("1", "2") for e, v in (
        ("DummyEvaluator", (True, 1.0)), ("iexact_match", (True, 1.0)), ("pii", (False, 0.0)))}
    # Weights: kept as the SDK keeps them, in a column, and as a weighted score per row.
    assert ex.experiment["metadata"] == {"evaluator_weights": {
        "pii:patronus:pii:1": "0.3", "iexact_match:": "0.3", "DummyEvaluator:": "0.3"}}
    assert df["weight"].tolist() == [0.3] * 6
    assert [e["weight"] for e in ex.results.manifest["links"][0]["evaluators"]] == [0.3] * 3
    assert df["weighted_score"].round(6).unique().tolist() == [round(2 / 3, 6)]
    summary = ex.results.summary()
    assert summary.weighted_score == pytest.approx(2 / 3) and summary.weighted_rows == 2
    assert "Weighted score 0.667 over 2 rows" in ex.results.format_summary()
    sent = [r.body for r in pii_api[0].requests if r.path == "/v1/evaluate"]
    assert len(sent) == 2 and {b["evaluators"][0]["criteria"] for b in sent} == {"patronus:pii:1"}
    assert {b["evaluated_model_input"] for b in sent} == {r["task_input"] for r in PII_ROWS}


# examples/patronus_examples/experiments/evaluator_remote_pii.py
def test_the_sdks_remote_pii_example(pii_api: tuple[FakeServer, PiiAPI], results_dir: Path) -> None:
    detect_pii = RemoteEvaluator("pii")
    ex = run_experiment(project_name="Tutorial", dataset=[
        {k: v for k, v in r.items() if k != "gold_answer"} for r in PII_ROWS],
        evaluators=[detect_pii], experiment_name="Detect PII",
        metadata={"evaluator_weights": {detect_pii.canonical_name: "0.4"}}, **_local(results_dir))
    df = ex.to_dataframe()
    assert df["eval.pass"].tolist() == [False, False] and df["evaluator_id"].tolist() == ["pii"] * 2
    assert ex.experiment["metadata"] == {"evaluator_weights": {"pii:": "0.4"}}


# examples/patronus_examples/experiments/evaluator_class.py, BERT replaced by word counts:
# its score is what BERTScore's is, a 1x1 array of a cosine similarity (the SDK refuses it,
# so every row of that example errors there).
def _vector(text: str, words: list[str]) -> np.ndarray:
    found = text.lower().replace(".", "").replace("'", "").split()
    return np.array([[found.count(w) for w in words]], dtype=float)


class BagOfWordsScore(StructuredEvaluator):
    def __init__(self, pass_threshold: float) -> None:
        self.pass_threshold = pass_threshold
        super().__init__()

    def evaluate(self, task_output: str, gold_answer: str, **kwargs: Any) -> EvaluationResult:
        words = sorted(set(f"{task_output} {gold_answer}".lower().replace(".", "").split()))
        a, b = _vector(task_output, words), _vector(gold_answer, words)
        score = np.dot(a, b.T) / (np.linalg.norm(a) * np.linalg.norm(b))
        return EvaluationResult(score_raw=score, pass_=score >= self.pass_threshold,
                                tags={"pass_threshold": str(self.pass_threshold)})


def test_the_sdks_class_evaluator_example(results_dir: Path) -> None:
    rows = [{"task_input": "Translate 'Goodbye' to Spanish.", "task_output": "Hasta luego",
             "gold_answer": "Adiós"},
            {"task_input": "Summarize: 'The quick brown fox jumps over the lazy dog'.",
             "task_output": "Quick brown fox jumps over dog",
             "gold_answer": "The quick brown fox jumps over the lazy dog"}]
    # Word counts agree less than BERT's embeddings: the example's 0.8 is 0.7 here.
    ex = run_experiment(dataset=rows, evaluators=[BagOfWordsScore(pass_threshold=0.7)],
                        **_local(results_dir))
    df = ex.to_dataframe()
    # No word in common; then 6 words in common, "the" twice in the gold answer.
    assert df["eval.score"].tolist() == pytest.approx([0.0, 6 / (6 ** 0.5 * 11 ** 0.5)])
    assert df["eval.pass"].tolist() == [False, True]
    assert df["eval.tags"].tolist() == [{"pass_threshold": "0.7"}] * 2
    assert ex.project["name"] == "Global"  # the SDK's default project


def generate(row: Row, parent: Any, tags: dict[str, str]) -> TaskResult:
    return TaskResult(output=f"draft: {row.task_input}", metadata={"step": 1},
                      context=["passage one", "passage two"])


@evaluator(criteria="coherence")
def coherent(row: Row, task_result: TaskResult, **kwargs: Any) -> EvaluationResult:
    return EvaluationResult(score=0.9 if "draft" in task_result.output else 0.1, pass_=True)


async def refine(row: Row, parent: Any, tags: dict[str, str]) -> str | None:
    judged = parent.evals["coherent:coherence"]
    if row.sid == "2":
        return None  # the row stops here
    return f"{parent.task.output} (coherence {judged.score})"


class ContextSeen(StructuredEvaluator):
    evaluator_id = "context_seen"

    def evaluate(self, *, task_output: str, task_context: Any, **kwargs: Any) -> EvaluationResult:
        return EvaluationResult(pass_=task_context == ["passage one", "passage two"],
                                text_output=task_output)


def test_a_chain_reads_its_parent_as_the_sdk_does(results_dir: Path) -> None:
    ex = run_experiment(
        [{"task_input": "one"}, {"task_input": "two"}],
        chain=[{"task": generate, "evaluators": [FuncEvaluatorAdapter(coherent), ContextSeen()]},
               {"task": refine, "evaluators": [FuncEvaluatorAdapter(iexact_on_parent)]}],
        **_local(results_dir))
    df = ex.to_dataframe()
    first = df[df["link_idx"] == 0].set_index(["sid", "evaluator_id"])
    assert first.loc[("1", "context_seen"), "eval.pass"]  # the task's context, not the row's
    assert first.loc[("1", "coherent"), "criteria"] == "coherence"
    second = df[(df["link_idx"] == 1)]
    assert second[second["sid"] == "1"]["eval.text_output"].tolist() == [
        "draft: one (coherence 0.9)"]
    # Row 2's refine returned None: its chain stopped, said as a skipped task, not dropped.
    assert second[second["sid"] == "2"]["status"].tolist() == ["skipped"]


@evaluator
def iexact_on_parent(row: Row, task_result: TaskResult, parent: Any, **kwargs: Any) -> str:
    return task_result.output


def raises(row: Row, parent: Any, tags: dict[str, str]) -> str:
    if row.sid == "2":
        raise RuntimeError("the model is down")
    return "fine"


def test_failed_rows_stay_in_the_dataframe_with_their_error(results_dir: Path) -> None:
    ex = run_experiment([{"task_input": "a"}, {"task_input": "b"}], task=raises,
                        evaluators=[FuncEvaluatorAdapter(iexact_on_parent)], **_local(results_dir))
    df = ex.to_dataframe().set_index("sid")
    assert df.loc["1", "status"] == "ok" and df.loc["1", "eval.text_output"] == "fine"
    assert df.loc["2", "status"] == "error" and df.loc["2", "error_stage"] == "task"
    assert "the model is down" in df.loc["2", "error_message"]
    csv = ex.to_csv()
    # As the SDK's: DataFrame.to_csv, its index first.
    assert "the model is down" in csv and csv.splitlines()[0].startswith(",link_idx,task.name,")


@evaluator
def returns_nothing(row: Row, **kwargs: Any) -> None:
    return None


def test_an_evaluator_returning_none_skips_the_row(results_dir: Path) -> None:
    # The SDK's docs: "Skip the evaluation" (the SDK itself raised a TypeError).
    ex = run_experiment([{"task_input": "a", "task_output": "b"}],
                        evaluators=[FuncEvaluatorAdapter(returns_nothing)], **_local(results_dir))
    row = ex.to_dataframe().iloc[0]
    assert row["status"] == "skipped" and pd.isna(row["eval.pass"])
    assert ex.results.summary().evaluators[0].skipped == 1


# docs/experiments/evaluators.md: a class evaluator that skips its base's __init__, a
# function evaluator of the standard interface, one behind a custom adapter.
class KeywordMatchEvaluator(StructuredEvaluator):
    def __init__(self, keywords: list[str], threshold: float = 0.5) -> None:
        self.keywords = [k.lower() for k in keywords]
        self.threshold = threshold

    def evaluate(self, *, task_input: Any = None, task_output: Any = None,
                 gold_answer: Any = None, **kwargs: Any) -> EvaluationResult:
        if not task_output:
            return EvaluationResult(pass_=False, score=0.0, text_output="Missing output")
        matches = sum(1 for kw in self.keywords if kw in task_output.lower())
        score = matches / len(self.keywords) if self.keywords else 0
        return EvaluationResult(score=score, pass_=score >= self.threshold,
                                text_output=f"Found {matches}/{len(self.keywords)} keywords")


@evaluator()
def standard_evaluator(row: Row, task_result: TaskResult, parent: Any,
                       **kwargs: Any) -> EvaluationResult | None:
    if not task_result or not task_result.output:
        return None
    if row.gold_answer and row.gold_answer.lower() in task_result.output.lower():
        return EvaluationResult(score=1.0, pass_=True, text_output="Contains answer")
    return EvaluationResult(score=0.0, pass_=False, text_output="Missing answer")


@evaluator()
def exact_match(expected: str, actual: str, case_sensitive: bool = False) -> bool:
    return expected == actual if case_sensitive else expected.lower() == actual.lower()


class ExactMatchAdapter(FuncEvaluatorAdapter):
    def __init__(self, case_sensitive: bool = False) -> None:
        super().__init__(exact_match)
        self.case_sensitive = case_sensitive

    def transform(self, row: Row, task_result: TaskResult | None, parent: Any,
                  **kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
        return [], {"expected": row.gold_answer, "actual": task_result.output if task_result else "",
                    "case_sensitive": self.case_sensitive}


def test_the_docs_evaluators_combined(results_dir: Path) -> None:
    def my_task(row: Row, parent: Any, tags: dict[str, str]) -> str | None:
        return {"1": "Paris is clear and concise", "2": "paris", "3": None}[row.sid]

    ex = run_experiment([{"task_input": "capital?", "gold_answer": "Paris"}] * 3, task=my_task,
                        evaluators=[KeywordMatchEvaluator(["clear", "concise", "accurate", "helpful"]),
                                    FuncEvaluatorAdapter(standard_evaluator),
                                    ExactMatchAdapter(case_sensitive=False)],
                        **_local(results_dir))
    df = ex.to_dataframe()
    got = {(r.sid, r.evaluator_id): r["eval.pass"] for _, r in df.iterrows() if r["status"] == "ok"}
    assert got == {("1", "KeywordMatchEvaluator"): True, ("1", "standard_evaluator"): True,
                   ("1", "exact_match"): False, ("2", "KeywordMatchEvaluator"): False,
                   ("2", "standard_evaluator"): True, ("2", "exact_match"): True}
    # Row 3's task returned None: its chain stopped there, said once, its evaluators not run.
    assert df[df["sid"] == "3"]["status"].tolist() == ["skipped"]


class MatchEvaluator(AsyncEvaluator):
    """The SDK docs' adapter example (patronus-py's docs: an exact and a fuzzy match, two
    instances of one class, each transformed by its adapter)."""

    def __init__(self, sanitizer: Any = None) -> None:
        if sanitizer is None:
            sanitizer = lambda x: x  # noqa: E731 (as the docs write it)
        self.sanitizer = sanitizer

    async def evaluate(self, actual: str, expected: str) -> EvaluationResult:
        await asyncio.sleep(0)  # the docs sleep a random second: the two run concurrently
        matched = self.sanitizer(actual) == self.sanitizer(expected)
        return EvaluationResult(pass_=matched, score=int(matched))


class MatchAdapter(EvaluatorAdapter):
    def __init__(self, evaluator: MatchEvaluator) -> None:
        super().__init__(evaluator)

    def transform(self, row: Row, task_result: TaskResult | None, parent: Any,
                  **kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
        return [row.task_output, row.gold_answer], {}


def test_the_docs_adapter_example_two_evaluators_of_one_name_each_recorded(
        results_dir: Path) -> None:
    """It stopped with "evaluator names ['MatchEvaluator'] appear more than once": the
    second is MatchEvaluator#2, said once, with its own records, verdict and series."""
    from patronus_tasks.results import compare_experiments

    exact_match = MatchEvaluator()
    fuzzy_match = MatchEvaluator(lambda x: x.strip().lower())
    runs = []
    for name in ("night-1", "night-2"):
        with pytest.warns(UserWarning) as said:
            runs.append(run_experiment(
                dataset=[{"task_output": "string\t", "gold_answer": "string"}],
                evaluators=[MatchAdapter(exact_match), MatchAdapter(fuzzy_match)],
                experiment_name=name, **_local(results_dir)))
        told = [str(w.message) for w in said if "share a name" in str(w.message)]
        assert told == ["evaluators of one link share a name (the SDK 0.1.x runs them all); each "
                        "is recorded under its own: 'MatchEvaluator' as 'MatchEvaluator#2' (the "
                        "first keeps its name). Give each its own evaluator_id to choose the names."]
    df = runs[0].to_dataframe()
    assert df[["evaluator_id", "eval.pass", "eval.score"]].values.tolist() == [
        ["MatchEvaluator", False, 0.0], ["MatchEvaluator#2", True, 1.0]]
    stats = {e.evaluator: e.pass_rate for e in runs[0].results.summary().evaluators}
    assert stats == {"MatchEvaluator": 0.0, "MatchEvaluator#2": 1.0}
    # run to run, each is compared with itself (a series per evaluator, by name)
    paired = compare_experiments(runs[0].results, runs[1].results).evaluators
    assert {(e.evaluator, e.pass_rate_a, e.pass_rate_b) for e in paired} == {
        ("MatchEvaluator", 0.0, 0.0), ("MatchEvaluator#2", 1.0, 1.0)}


def test_bad_inputs_say_the_fix(results_dir: Path) -> None:
    data = [{"task_input": "a", "task_output": "b", "gold_answer": "b"}]
    with pytest.raises(TypeError, match=r"FuncEvaluatorAdapter\(iexact_match\)"):
        run_experiment(data, evaluators=[iexact_match], **_local(results_dir))
    with pytest.raises(ValueError, match="evaluators= or chain=, not both"):
        run_experiment(data, chain=[{"task": None, "evaluators": []}],
                       evaluators=[FuncEvaluatorAdapter(iexact_match)], **_local(results_dir))
    with pytest.raises(ValueError, match="task= beside chain="):
        run_experiment(data, task=generate, chain=[{"task": None, "evaluators": []}],
                       **_local(results_dir))

    def no_parent(row: Row) -> str:
        return "x"
    with pytest.raises(TypeError, match=r"takes no parent, tags: add them, or \*\*kwargs"):
        run_experiment(data, task=no_parent, **_local(results_dir))
    with pytest.raises(ValueError, match="Hint: add @evaluator"):
        FuncEvaluatorAdapter(lambda row: True)
    with pytest.raises(TypeError, match="EvaluatorAdapter"):
        run_experiment(data, evaluators=[patronus.evals.Evaluator()], **_local(results_dir))
    with pytest.raises(ValueError, match="weight must be a number"):
        FuncEvaluatorAdapter(iexact_match, weight="heavy")
    with pytest.raises(TypeError, match="two weights"):  # one evaluator, in two links
        run_experiment(data, chain=[
            {"task": None, "evaluators": [FuncEvaluatorAdapter(iexact_match, weight="0.2")]},
            {"task": None, "evaluators": [FuncEvaluatorAdapter(iexact_match, weight="0.5")]}],
            **_local(results_dir))
    with pytest.warns(UserWarning, match="'iexact_match' as 'iexact_match#2'"):  # one link: two
        two = run_experiment(data, evaluators=[FuncEvaluatorAdapter(iexact_match, weight="0.2"),
                                               FuncEvaluatorAdapter(iexact_match, weight="0.5")],
                             **_local(results_dir))
    assert two.metadata == {"evaluator_weights": {"iexact_match:": "0.2", "iexact_match#2:": "0.5"}}


class Plain(patronus.evals.Evaluator):
    evaluator_id, criteria = "plain", "exact"

    def evaluate(self, row: Row, task_result: Any, parent: Any) -> bool:
        return row.task_output == row.gold_answer


def test_datasets_in_every_form_the_sdk_takes(results_dir: Path, tmp_path: Path) -> None:
    from patronus_tasks.datasets import Dataset, read_csv

    rows = [{"task_input": "q", "task_output": "same", "gold_answer": "same"}]
    (tmp_path / "d.csv").write_text("id,question,answer,expected\n7,q,same,same\n")
    forms: list[Any] = [rows, pd.DataFrame(rows), Dataset.from_records(rows), lambda: rows,
                        _async_rows(rows),
                        read_csv(tmp_path / "d.csv", sid_field="id", task_input_field="question",
                                 task_output_field="answer", gold_answer_field="expected")]
    for i, form in enumerate(forms):
        ex = run_experiment(form, evaluators=[EvaluatorAdapter(Plain())],
                            experiment_name=f"form-{i}", **_local(results_dir))
        df = ex.to_dataframe()
        assert df["eval.pass"].tolist() == [True], i
    assert df["sid"].tolist() == ["7"] and df["task_input"].tolist() == ["q"]


async def _async_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return rows


def test_inside_an_event_loop_it_is_awaited(results_dir: Path) -> None:
    async def main() -> Any:
        pending = run_experiment([{"task_input": "a", "task_output": "a", "gold_answer": "a"}],
                                 evaluators=[FuncEvaluatorAdapter(iexact_match)],
                                 **_local(results_dir))
        assert isinstance(pending, asyncio.Task)
        return await pending
    assert asyncio.run(main()).to_dataframe()["eval.pass"].tolist() == [True]


def test_init_is_accepted_offline_and_traced_records_each_step_as_a_span(
        results_dir: Path) -> None:
    patronus.init(project_name="from-init")  # no key, no collector: nothing is sent

    @patronus.traced(span_name="lookup")
    def lookup(term: str) -> str:
        return term.upper()

    seen: list[dict[str, str]] = []

    def task(row: Row, parent: Any, tags: dict[str, str]) -> str:
        seen.append(tags)
        return lookup(row.task_input)

    ex = run_experiment([{"task_input": "abc", "tags": {"product": "x", "env": "row"}}],
                        task=task, tags={"env": "ci"}, **_local(results_dir))
    assert seen == [{"product": "x", "env": "ci"}]  # the row's tags, the experiment's over them
    assert ex.project["name"] == "from-init"
    assert ex.results.to_dataframe()["task_output"].tolist() == ["ABC"]
    spans = ex.results.spans()
    assert spans[["name", "kind", "arguments", "output"]].to_dict("records") == [
        {"name": "lookup", "kind": "custom", "arguments": '{"term":"abc"}', "output": '"ABC"'}]
    assert spans["error"].isna().all()


def test_on_prefect_every_call_is_a_task_run_named_as_today(prefect_server: str,
                                                            results_dir: Path) -> None:
    from .test_prefect_run import _task_runs

    ex = run_experiment([{"task_input": "hi", "gold_answer": "HI"}],
                        task=lambda row, parent, tags: row.task_input.upper(),
                        evaluators=[FuncEvaluatorAdapter(iexact_on_parent)],
                        results_dir=results_dir, print_summary=False, html_report=False)
    assert ex.results.wait_recorded(RECORDED_WITHIN)
    names = {r.name for r in asyncio.run(_task_runs(ex.results.manifest["flow_run_id"]))}
    assert names == {"<lambda>-1", "iexact_on_parent-1"}


def test_the_bundled_sdk01_flow_runs_with_patronus_tasks_run(prefect_server: str,
                                                              tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from patronus_tasks.cli import app
    from patronus_tasks.results import load_experiment

    from .conftest import ROOT

    out = CliRunner().invoke(app, ["run", str(ROOT / "flows" / "support_replies.py"),
                                   "--experiment-name", "nightly", "--results-dir", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert "drafts from the local policy" in out.output
    df = load_experiment("nightly", tmp_path).to_dataframe()
    verdicts = df.groupby(["link_index", "evaluator_name"])["pass"].sum().to_dict()
    # The drafts repeat the contact details of 4 tickets; the redaction removes them all;
    # one draft misses its resolution (t03 needs a reinstall).
    assert verdicts == {(0, "no_personal_data"): 2, (0, "resolves"): 5, (1, "no_personal_data"): 6}
    assert "Weighted score" in out.output


def test_a_remote_evaluator_is_callable_on_its_own(pii_api: tuple[FakeServer, PiiAPI]) -> None:
    result = RemoteEvaluator("pii").evaluate(task_input="contact?", task_output="a@b.example")
    assert isinstance(result, EvaluationResult) and result.pass_ is False and result.score == 0.0
    clean = asyncio.run(patronus.evals.AsyncRemoteEvaluator("pii").evaluate(task_output="none"))
    assert clean.pass_ is True


def test_an_experiment_made_then_run_by_hand(results_dir: Path) -> None:
    """The SDK's docs (advanced.md, "Manual Experiment Control"): ``await
    Experiment.create(...)``, then ``await experiment.run()``, then ``to_csv``."""
    from patronus_tasks.experiments import Experiment

    async def main() -> Any:
        made = await Experiment.create([{"task_input": "a", "task_output": "a", "gold_answer": "a"}],
                                       evaluators=[FuncEvaluatorAdapter(iexact_match)],
                                       **_local(results_dir))
        with pytest.raises(RuntimeError, match="has not run yet"):
            made.to_dataframe()
        assert made.results is None  # created: nothing ran
        return await made.run()
    ex = asyncio.run(main())
    ex.to_csv(results_dir / "results.csv")
    assert pd.read_csv(results_dir / "results.csv")["eval.pass"].tolist() == [True]


def test_the_experiments_own_api_key_and_url_serve_its_remote_evaluators(
        pii_api: tuple[FakeServer, PiiAPI], monkeypatch: pytest.MonkeyPatch,
        results_dir: Path) -> None:
    server, _ = pii_api
    monkeypatch.delenv("PATRONUS_API_KEY")
    monkeypatch.setenv("PATRONUS_API_URL", "http://127.0.0.1:9")  # nothing there
    ex = run_experiment(PII_ROWS[:1], evaluators=[RemoteEvaluator("pii")],
                        api_key="pt-given-KEY-42", api_url=server.url, **_local(results_dir))
    assert ex.to_dataframe()["eval.pass"].tolist() == [False]
    assert {r.headers.get("x-api-key") for r in server.requests} == {"pt-given-KEY-42"}


def test_code_moved_with_the_top_level_swap_is_told_which_import_to_use(results_dir: Path) -> None:
    """`import patronus_tasks as patronus` gives the 0.0.x names at the top level: each
    mix-up says the import that fits, never a hint the code already follows."""
    @patronus.evaluator
    def exact(evaluated_model_output: str) -> bool:
        return True

    with pytest.raises(ValueError, match=r"from patronus_tasks\.evals import evaluator"):
        FuncEvaluatorAdapter(exact)
    data = [{"task_input": "a", "task_output": "b", "gold_answer": "b"}]
    with pytest.raises(patronus.ConfigError, match=r"import it from patronus_tasks\.experiments"):
        patronus.run_experiment(data, evaluators=[exact], **_local(results_dir))
    with pytest.raises(patronus.ConfigError, match=r"data= is the SDK 0\.0\.x name"):
        run_experiment(data=data, evaluators=[FuncEvaluatorAdapter(iexact_match)],
                       **_local(results_dir))
    # The 0.0.x result takes the 0.1.x name of its score; a wrong name lists the fields.
    assert patronus.EvaluationResult(score=0.5, pass_=True).score_raw == 0.5
    with pytest.raises(ValueError, match="has no field 'explain'; its fields: pass_, score_raw"):
        patronus.EvaluationResult(explain="x")


def test_a_one_number_array_is_a_score_from_every_evaluator_kind(results_dir: Path) -> None:
    """An embedding's cosine comes back as an array of one: a score, as the README says."""
    @evaluator
    def cosine(row: Row, **kwargs: Any) -> Any:
        return np.array([[0.7]])

    class Cos(StructuredEvaluator):
        def evaluate(self, *, task_output: str, **kwargs: Any) -> Any:
            return np.array([0.25])

    data = [{"task_input": "a", "task_output": "b", "gold_answer": "b"}]
    ex = run_experiment(data, evaluators=[FuncEvaluatorAdapter(cosine), Cos()], **_local(results_dir))
    df = ex.to_dataframe()
    assert df["status"].tolist() == ["ok", "ok"], df["error_message"].tolist()
    assert sorted(df["eval.score"]) == [0.25, 0.7]

    @patronus.evaluator
    def old_style(evaluated_model_output: str) -> Any:
        return np.array([np.float32(0.5)])

    old = patronus.run_experiment("p", data=[{"evaluated_model_output": "x"}],
                                  evaluators=[old_style], **_local(results_dir))
    assert old.to_dataframe()["score"].tolist() == [0.5]
