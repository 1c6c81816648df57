"""The public surface: a sorted ``__all__`` of names that exist, and nothing private."""

import patronus_tasks


def test_all_is_sorted_and_importable() -> None:
    names = patronus_tasks.__all__
    assert names == sorted(names)
    for name in names:
        assert hasattr(patronus_tasks, name), name


def test_public_surface_is_the_documented_one() -> None:
    assert set(patronus_tasks.__all__) == {
        "Client", "ConfigError", "Dataset", "DatasetError", "ErrorInfo", "EvaluationResult",
        "Evaluator", "EvaluatorStats", "Experiment", "ExperimentError", "InvalidResultError",
        "Link", "Parent", "PatronusTasksError", "Row", "Summary", "Task", "TaskResult",
        "__version__", "arun_experiment", "evaluator", "load_dataset", "read_csv",
        "read_jsonl", "run_experiment", "task", "ChatTask", "Endpoint", "LLMJudge",
        "RemoteAPIError", "RemoteEvaluator", "UnparseableResponseError", "chat_completion",
        "openai_endpoint", "patronus_endpoint", "Comparison", "EvaluatorComparison",
        "compare_experiments", "list_experiments", "load_experiment", "experiment_flow_run_name",
        "QualityGateError",
    }


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

    from patronus_tasks._records import COLUMNS

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for name, typ, meaning in COLUMNS:
        assert f"| `{name}` | {typ} | {meaning} |" in readme, name
