"""The manifest typed from write to read: `Experiment.manifest` is the `Manifest` that
``manifest.json`` was written from; a dict only in the file."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from patronus_tasks import ConfigError, Experiment, evaluator, run_experiment
from patronus_tasks.record.manifest import MANIFEST_VERSION, Manifest
from patronus_tasks.record.manifest_file import ManifestFile

DATA = [{"evaluated_model_input": "a", "evaluated_model_output": "A!"},
        {"evaluated_model_input": "b", "evaluated_model_output": "b"},
        {"evaluated_model_input": "c", "evaluated_model_output": "C!"}]


@evaluator
def shouts(evaluated_model_output: str) -> bool:
    return evaluated_model_output.endswith("!")


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> Experiment:
    # No HTML report: it is written after the run returns, and the tests copy the folder.
    return run_experiment("proj", data=DATA, evaluators=shouts, backend="local",
                          results_dir=tmp_path_factory.mktemp("results"), print_summary=False,
                          html_report=False)


def _file(folder: Path | object) -> dict[str, object]:
    return dict(json.loads((Path(str(folder)) / "manifest.json").read_text()))


def _copy(exp: Experiment, to: Path, **changes: object) -> Path:
    """The experiment's folder copied, its manifest.json changed (None: key removed)."""
    folder = to / "proj" / "copy"
    shutil.copytree(Path(str(exp.path)), folder)
    data = {k: v for k, v in {**_file(folder), **changes}.items() if v is not None}
    (folder / "manifest.json").write_text(json.dumps(data))
    return folder


def test_the_manifest_is_the_model_its_file_was_written_from(done: Experiment) -> None:
    m = done.manifest
    assert isinstance(m, Manifest) and done.info is m
    assert (m.status, m.rows, m.errored_rows, m.manifest_version) == ("completed", 3, 0, MANIFEST_VERSION)
    assert m.links[0].evaluators[0].name == "shouts" and m.dataset.rows == 3
    assert m.to_json() == _file(done.path)
    assert Experiment(done.path).manifest == m  # read back: the same model


def test_an_older_manifest_loads_and_a_newer_one_keeps_what_it_adds(
        done: Experiment, tmp_path: Path) -> None:
    older = _copy(done, tmp_path / "old", manifest_version=None, repeats=None, usage=None,
                  calls=None, cached_calls=None, cost_usd=None, python=None)
    m = Experiment(older).manifest
    assert (m.manifest_version, m.repeats, m.calls, m.usage, m.python) == (1, 1, None, None, None)
    assert Experiment(older).summary().evaluators[0].passed == 2
    newer = Experiment(_copy(done, tmp_path / "new", manifest_version=2, shards=4)).manifest
    assert newer.manifest_version == 2 and newer.to_json()["shards"] == 4


def test_reading_it_as_a_dict_is_kept(done: Experiment) -> None:
    m = done.manifest
    assert m["rows"] == m.rows == 3 and m["dataset"]["sha256"] == m.dataset.sha256
    assert m["links"][0]["evaluators"][0]["name"] == "shouts"
    assert m["usage"][0]["step"] == "shouts" and m["usage"][0]["calls"] == 3
    assert "rows" in m and "reports" not in m and m.get("reports", "none") == "none"
    with pytest.raises(KeyError, match="reports"):
        m["reports"]
    with pytest.raises(KeyError):
        m["no such field"]


def test_an_experiment_keeps_its_own_runs_manifest_after_a_retry_in_its_folder(
        tmp_path: Path) -> None:
    flaky = {"calls": 0}

    @evaluator
    def fails_once(evaluated_model_output: str) -> bool:
        flaky["calls"] += 1
        if flaky["calls"] == 1:
            raise RuntimeError("once")
        return True

    first = run_experiment("proj", data=DATA[:1], evaluators=fails_once, backend="local",
                           results_dir=tmp_path, experiment_name="e", print_summary=False)
    loaded = Experiment(first.path)  # nothing asked of it before the retry
    again = run_experiment("proj", data=DATA[:1], evaluators=fails_once, backend="local",
                           results_dir=tmp_path, experiment_name="e", retry_errors=True,
                           print_summary=False)
    assert again.path == first.path and _file(first.path)["evaluator_errors"] == 0
    assert (first.manifest.evaluator_errors, loaded.manifest.evaluator_errors) == (1, 1)
    assert again.manifest.evaluator_errors == 0


def test_without_its_file_the_results_say_the_manifest(done: Experiment, tmp_path: Path) -> None:
    folder = _copy(done, tmp_path)
    (folder / "manifest.json").unlink()
    m = Experiment(folder).manifest
    assert (m.experiment_id, m.status, m.rows) == (done.manifest.experiment_id, "completed", 3)
    empty = Experiment(tmp_path / "proj" / "nothing")
    assert empty.name == "nothing" and empty.metrics == []
    with pytest.raises(FileNotFoundError, match=r"no manifest\.json"):
        _ = empty.manifest


def test_a_manifest_it_cannot_read_names_its_file(done: Experiment, tmp_path: Path) -> None:
    broken = Experiment(_copy(done, tmp_path, status="halfway"))
    assert len(broken.to_dataframe()) == 3  # the records stay readable
    with pytest.raises(ConfigError, match=r"manifest\.json holds no .*\(status: Input should"):
        _ = broken.manifest


@dataclass
class _Progress:
    """What a recording says of Prefect's progress (`RecordsProgress`)."""

    flow_run_id: str | None = "f-1"
    series: str | None = None
    expected: int = 6
    recorded: int = 0
    lost: int = 0
    ended: bool = False


def test_the_file_keeps_prefects_progress_and_a_later_run_keeps_its_own(
        done: Experiment, tmp_path: Path) -> None:
    folder = _copy(done, tmp_path)
    first, later = ManifestFile(folder), ManifestFile(folder)
    first.write(done.manifest)
    first.note_records(_Progress())
    assert first.current is not None and first.current.flow_run_id == "f-1"
    assert _file(folder)["prefect"] == {"task_runs": 6, "task_runs_recorded": 0,
                                        "task_runs_lost": 0, "complete": False}
    rerun = done.manifest.model_copy(update={"started_at": "later", "status": "running"})
    assert later.write(rerun).prefect is None  # nothing noted by its own recording yet
    first.note_records(_Progress(recorded=6, ended=True))
    assert first.current.prefect is not None and first.current.prefect.complete
    assert _file(folder)["started_at"] == "later" and "prefect" not in _file(folder)
