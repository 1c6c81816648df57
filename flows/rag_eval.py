"""RAG evaluation: a bundled set of HR-handbook questions, each with the passages a
retriever found, a gold answer and the answer a model gave, judged by several families
of ready evaluators (`patronus_tasks.evaluators`).

Offline by default: the "model" is the dataset's ``answer`` column (the task stands in
for the model call), and the offline checks run: token F1 and ROUGE-L against the gold
answer, personal data in the answer (`pii`), over-refusal (`refusal(expect=False)`).
With ``OPENAI_BASE_URL`` set (any OpenAI-compatible endpoint: OpenAI, vLLM, Ollama,
LM Studio; ``OPENAI_API_KEY`` and ``OPENAI_MODEL`` as needed), the LLM judges run too:
faithfulness to the retrieved passages, their relevance and recall, factuality against
the gold answer. Without it the flow says the judges were skipped and why: no judge
invents an answer.

    python flows/rag_eval.py                    # offline checks, on the bundled data
    OPENAI_BASE_URL=http://localhost:11434/v1 OPENAI_MODEL=llama3.1 python flows/rag_eval.py

People in the loop: with ``review=N`` the run then asks people to label N of its rows
(``review_evaluator``'s, faithfulness by default) in the Prefect UI: the flow run pauses
for a form (on a deployment it is suspended, the worker freed, and once resumed takes
the same experiment up again). The labelled rows go into ``labels`` (a JSON Lines file),
on which each night, before anything else is asked, faithfulness is calibrated: its
kappa with people is part of that night's verdict (``regressed:faithfulness`` when it
fell).
"""

from __future__ import annotations

import logging
import os
import zlib
from pathlib import Path
from typing import Literal

from prefect import flow
from prefect.states import State

from patronus_tasks import Evaluator, Row, review, run_experiment, task
from patronus_tasks.evaluators import (
    calibrate,
    context_recall,
    context_relevance,
    factuality,
    faithfulness,
    pii,
    refusal,
    rouge,
    token_f1,
)
from patronus_tasks.prefect import experiment_flow_run_name, use_built_in_server, verdict_state
from patronus_tasks.results import Experiment
from patronus_tasks.review import reviewed_experiment

HERE = Path(__file__).resolve().parent
logger = logging.getLogger("patronus_tasks.flows.rag")
SKIPPED = ("LLM judges skipped: OPENAI_BASE_URL is not set, so there is no judge to ask (none "
           "is faked). Set it to an OpenAI-compatible endpoint to run faithfulness, "
           "context_relevance, context_recall and factuality.")


@task
def answer(row: Row) -> str:
    """The answer the model gave (the dataset's ``answer`` column stands in for the call)."""
    return str(row.answer)


def evaluators(judges: bool) -> list[Evaluator]:
    """The offline checks, and the judges when an endpoint is configured."""
    checks: list[Evaluator] = [token_f1(), rouge(kind="rougeL", threshold=0.4), pii(),
                               refusal(expect=False, name="answers")]
    if not judges:
        return checks
    return [*checks, faithfulness(), context_relevance(), context_recall(), factuality()]


@flow(name="rag-eval", flow_run_name=experiment_flow_run_name)
def rag_eval(dataset: str = "datasets/rag_qa.jsonl", project: str = "rag-qa",
             experiment_name: str | None = None, max_concurrency: int = 8,
             results_dir: str | None = None, judges: bool | None = None,
             cache: bool = False, resume: bool = False,
             fail_on_regression: bool | Literal["significant", "worse"] = False,
             fail_on_error: int | float | None = None, review: int = 0,
             review_evaluator: str = "faithfulness",
             review_select: Literal["sample", "failed", "uncertain", "disagreements"] = "sample",
             review_timeout: int = 3600, labels: str = "datasets/rag_labels.jsonl") -> State:
    """Judge the dataset's answers with the offline checks and, given an endpoint, the LLM
    judges; the flow run ends Completed with the figures as its message.

    Args:
        dataset: JSONL, a row per question: `evaluated_model_input`, the retrieved passages
            (`evaluated_model_retrieved_context`, a list), `evaluated_model_gold_answer`
            and the model's `answer`. Relative: from the working directory, else this
            project's folder.
        project: The project (and series) of the runs.
        experiment_name: This run's name; empty for a new timestamped one.
        max_concurrency: Rows judged at once.
        results_dir: Where the Parquet results go (a folder or an object-storage URL).
        judges: Run the LLM judges: None (default) when `OPENAI_BASE_URL` is set.
        cache: Answer the judges from the cache when they saw the same row before.
        resume: Go on with the latest run named `experiment_name` (an interrupted or
            crashed one): its finished rows are kept, only the rest run.
        fail_on_regression: Fail the run when it does worse than the previous run of its
            series: true or "significant" (McNemar's test, p < 0.05), "worse" (a pass rate
            fell 5 points or more, or more rows got worse than better). A judge with no
            verdict this run (its endpoint down) fails it too: it could not be checked.
        fail_on_error: Fail the run when more rows errored than this: a row count (0: any
            error fails it) or a share of the rows (0.1: more than a tenth); empty: never.
        review: Rows to ask people about once the run is done, in the Prefect UI (the run
            pauses for a form, a page of 5 rows at a time); 0: none.
        review_evaluator: Whose verdicts people label (faithfulness: needs the judges).
        review_select: Which rows: a "sample" stratified by verdict, the "failed" ones,
            the "uncertain" ones (from the judge's log-probabilities), or "disagreements".
        review_timeout: Seconds a page waits for an answer; then the run goes on.
        labels: The JSON Lines file the labelled rows are added to; with the judges on,
            faithfulness is checked on it first each night (its kappa with people).
    """
    use_judges = bool(os.environ.get("OPENAI_BASE_URL")) if judges is None else judges
    if not use_judges:
        logger.warning(SKIPPED)
        print(SKIPPED)
    # A run suspended for its review runs again from here once resumed: the same experiment.
    experiment = reviewed_experiment()
    if experiment is None:
        calibrated = calibrate_on_labels(_found(labels), project, results_dir) if use_judges else None
        experiment = run_experiment(
            project, data=_found(dataset), task=answer, evaluators=evaluators(use_judges),
            tags={"suite": "rag"}, experiment_name=experiment_name,
            max_concurrency=max_concurrency, results_dir=results_dir,
            cache=True if cache else None, resume=resume, fail_on_regression=fail_on_regression,
            fail_on_error=fail_on_error)
        if calibrated:
            logger.info(calibrated)
    reviewed = ask_people(experiment, review, review_evaluator, review_select, review_timeout,
                          _found(labels))
    state = verdict_state(experiment)  # named after the verdict, the figures its message
    if not use_judges:
        state.message = f"{state.message} (LLM judges skipped)"
    if reviewed:
        state.message = f"{state.message}. Review: {reviewed}"
    return state


def _found(name: str) -> Path:
    """A path as given (absolute, or found from the working directory), else from this
    project's folder."""
    path = Path(name)
    return path if path.is_absolute() or path.exists() else HERE.parent / path


def calibrate_on_labels(labels: Path, project: str, results_dir: str | None) -> str | None:
    """Faithfulness checked on the rows people labelled (none yet: nothing to check): its
    kappa with them, against the last night's on the same rows, is in its verdict."""
    if not labels.is_file() or not labels.read_text(encoding="utf-8").strip():
        return None
    found = calibrate(faithfulness(), labels, project=f"{project}-judges", results_dir=results_dir)
    return found.agreement.headline()


def ask_people(experiment: Experiment, rows: int, evaluator: str, select: str, timeout: int,
               labels: Path) -> str | None:
    """``rows`` of the run labelled by people in the Prefect UI (the review's outcome)."""
    if rows <= 0:
        return None
    names = {e.name for link in experiment.manifest.links for e in link.evaluators}
    if evaluator not in names:
        said = f"review skipped: this run has no {evaluator} (its evaluators: {', '.join(sorted(names))})"
        logger.warning(said)
        return said
    # A seed of the night's own: each night samples other rows (the same within a night,
    # as a suspended run asks again once resumed), and the labelled set grows.
    seed = zlib.crc32(experiment.location.name.encode())
    return review(experiment, evaluator, select=select, n=rows, timeout=timeout, into=labels,
                  seed=seed).message


if __name__ == "__main__":
    use_built_in_server()
    rag_eval()
