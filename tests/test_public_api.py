"""The public surface: a sorted ``__all__`` of names that exist, and nothing private."""

import importlib
from pathlib import Path

import pytest

SURFACE = {
    "patronus_tasks": {
        "Cache", "Client", "ConfigError", "Dataset", "DatasetError", "EvaluationResult", "Evaluator",
        "Experiment", "ExperimentError", "InvalidResultError", "JudgeError", "Link", "Parent",
        "PatronusTasksError", "QualityGateError", "RemoteAPIError", "RemoteEvaluator", "Row",
        "Summary", "Sweep", "Task", "TaskResult", "UnparseableResponseError", "Usage",
        "__version__", "arun_experiment", "asweep", "evaluator", "init", "load_dataset",
        "read_csv", "read_jsonl", "review", "run_experiment", "simple_evaluator", "simple_task",
        "span", "sweep", "task", "traced",
    },
    "patronus_tasks.sweep": {"MATRIX_COLUMNS", "Sweep", "asweep", "sweep"},
    # The Patronus SDK 0.1.x's modules, under the names its programs import them by.
    "patronus_tasks.experiments": {
        "BaseEvaluatorAdapter", "ChainLink", "Dataset", "EvalParent", "EvalsMap",
        "EvaluatorAdapter", "Experiment", "FuncEvaluatorAdapter", "RemoteDatasetLoader", "Row",
        "StructuredEvaluatorAdapter", "Tags", "TaskResult", "run_experiment",
    },
    "patronus_tasks.evals": {
        "AsyncEvaluator", "AsyncRemoteEvaluator", "AsyncStructuredEvaluator", "EvaluationResult",
        "Evaluator", "RemoteEvaluator", "StructuredEvaluator", "bundled_eval", "evaluator",
    },
    "patronus_tasks.datasets": {"Attachment", "Dataset", "DatasetLoader", "Fields",
                                "RemoteDatasetLoader", "Row", "read_csv", "read_jsonl"},
    "patronus_tasks.results": {
        "Comparison", "ErrorInfo", "EvaluatorComparison", "EvaluatorStats", "Experiment",
        "MetricValue", "RepeatStats", "Summary", "UsageTotal", "compare_experiments",
        "list_experiments", "load_experiment",
    },
    "patronus_tasks.metrics": {"Metric", "MetricValue", "accuracy_by", "evaluate_metrics",
                               "metric", "precision_recall_f1"},
    "patronus_tasks.prices": {"DEFAULT_PRICES", "PRICES_AS_OF", "PRICE_SOURCES", "Price",
                              "PriceTable"},
    "patronus_tasks.trace": {"MAX_VALUE_CHARS", "Collector", "Span", "SpanData", "ToolCall", "Trace",
                             "collecting", "dump_spans", "load_spans", "span", "traced"},
    "patronus_tasks.openai": {
        "ChatTask", "LLMJudge", "UnparseableResponseError", "as_messages", "chat_completion",
        "chat_request", "openai_endpoint",
    },
    "patronus_tasks.http": {"Endpoint", "RemoteAPIError"},
    "patronus_tasks.patronus": {"PatronusReporter", "RemoteAPIError", "RemoteDataset",
                                "RemoteEvaluator", "patronus_endpoint"},
    "patronus_tasks.prefect": {"accept_baseline", "experiment_flow_run_name", "use_built_in_server",
                               "verdict_state"},
    "patronus_tasks.review": {"MAX_PAGE_SIZE", "PAGE_SIZE", "Review", "Reviewable", "review",
                              "review_in_terminal", "reviewed_experiment"},
    "patronus_tasks.evaluators": {
        "Calibration", "Judge", "JudgeError", "answer_relevance", "bleu", "calibrate", "chrf",
        "contains", "context_recall", "context_relevance", "exact_match", "factuality",
        "faithfulness", "json_equal", "json_schema", "json_valid", "judge_agreement", "llm_judge",
        "numeric_close", "pairwise_judge", "pii", "refusal", "regex", "rouge", "sql_equivalent",
        "sql_result_match", "string_similarity", "token_f1",
        "budget", "no_loops", "span_matches", "tool_args_valid", "tool_calls_match",
        "trajectory_judge",
    },
    "patronus_tasks.agents": {"AgentTask", "BudgetExceeded", "Decision", "LOCAL_MODEL", "Policy",
                              "Tool", "ToolError", "as_messages", "local_endpoint", "tools_of"},
}


@pytest.mark.parametrize("module", sorted(SURFACE))
def test_all_is_sorted_and_importable(module: str) -> None:
    names = importlib.import_module(module).__all__
    assert names == sorted(names)
    for name in names:
        assert hasattr(importlib.import_module(module), name), name


@pytest.mark.parametrize("module", sorted(SURFACE))
def test_public_surface_is_the_documented_one(module: str) -> None:
    assert set(importlib.import_module(module).__all__) == SURFACE[module]


def test_exception_tree() -> None:
    from patronus_tasks import (
        ConfigError,
        DatasetError,
        ExperimentError,
        InvalidResultError,
        PatronusTasksError,
    )

    assert issubclass(DatasetError, ConfigError)
    for exc in (ConfigError, InvalidResultError, ExperimentError):
        assert issubclass(exc, PatronusTasksError)
    assert not issubclass(ExperimentError, ConfigError)


def test_readme_documents_every_fixed_column() -> None:
    from pathlib import Path

    from patronus_tasks.record.records import COLUMNS

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for name, typ, meaning in COLUMNS:
        assert f"| `{name}` | {typ} | {meaning} |" in readme, name


@pytest.mark.parametrize("face", ["patronus_tasks", "patronus_tasks.evaluators"])
def test_a_lazy_face_names_the_modules_its_type_checking_imports_name(face: str) -> None:
    """A face imports each name from its home on first use (`_HOMES`, module paths as
    strings); its ``if TYPE_CHECKING:`` block says the same with import statements, which
    the type checker and the import tools follow: the two must agree, name by name."""
    import ast

    module = importlib.import_module(face)
    tree = ast.parse(Path(module.__file__ or "").read_text())
    guarded = next(n for n in tree.body if isinstance(n, ast.If)
                   and getattr(n.test, "id", None) == "TYPE_CHECKING")
    imported = {alias.name: node.module for node in guarded.body
                if isinstance(node, ast.ImportFrom) for alias in node.names}
    homes = {name: f"patronus_tasks.{home}" for name, home in module._HOMES.items()}
    assert imported == homes
    assert set(homes) | {"__version__"} >= set(module.__all__) - {"__version__"}
