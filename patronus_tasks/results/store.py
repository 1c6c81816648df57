"""Finding experiments in a results directory (local or object storage), by path or by name."""

from __future__ import annotations

from pathlib import Path

from patronus_tasks.exceptions import ConfigError
from patronus_tasks.record import parquet as _parquet
from patronus_tasks.record.location import Location
from patronus_tasks.results.experiment import Experiment
from patronus_tasks.settings import default_results_dir


def list_experiments(results_dir: str | Path | None = None) -> list[Experiment]:
    """Every experiment under ``results_dir``, oldest first (those whose manifest cannot
    be read left out: `scan` says them; one damaged file hid every run)."""
    return scan(results_dir)[0]


def scan(results_dir: str | Path | None = None
         ) -> tuple[list[Experiment], list[tuple[Experiment, str]]]:
    """The experiments under ``results_dir`` (oldest first), and those unreadable."""
    found = [Experiment(p.parent) for p in _root(results_dir).glob(f"*/*/{_parquet.MANIFEST_FILE}")]
    readable, unreadable = [], []
    for e in found:
        try:
            readable.append((e.manifest.started_at, str(e.location), e))
        except (ConfigError, OSError) as exc:
            unreadable.append((e, str(exc)))
    return [e for *_, e in sorted(readable, key=lambda t: t[:2])], unreadable


def _root(results_dir: str | Path | None) -> Location:
    return Location.of(results_dir if results_dir is not None else default_results_dir())


def _from_path(path: Location) -> Experiment | None:
    if path.name.endswith(".parquet") and path.is_file():
        path = path.parent
    if (path / _parquet.MANIFEST_FILE).exists() or (path / _parquet.RESULTS_FILE).exists():
        return Experiment(path)
    return None


def load_experiment(path_or_name: str | Path, results_dir: str | Path | None = None) -> Experiment:
    """An experiment by folder, ``results.parquet`` path, ``project/experiment`` or name.

    A name matches experiments by their ``experiment_name`` (the latest run wins, so
    ``nightly`` is the last nightly run), then by folder name (``nightly-2``), then by
    project (its latest run).
    """
    direct = _from_path(Location.of(path_or_name))
    if direct is not None:
        return direct
    text = str(path_or_name)
    if text.startswith(("/", "./", "../", "~")):  # a path, not a name: said as one
        raise ConfigError(f"no experiment's folder at {text} (no manifest.json nor "
                          "results.parquet there): check the path; `patronus-tasks list` shows "
                          "the experiments.")
    runs = list_experiments(results_dir)
    whole = [e for e in runs if text in (e.name, f"{e.project}/{e.name}")]
    project, _, name = text.rpartition("/")
    if whole and "/" in text:  # a name with a slash in it ("llama/3.1", kept as llama_3.1)
        return _one_project(whole, text)
    matches = [e for e in runs if name in (e.name, e.location.name)
               and (not project or project in (e.project, e.location.parent.name))]
    by_name = [e for e in matches if e.name == name]
    # A bare project name: its latest run (`show text-to-sql` after a nightly).
    of_project = [] if project else [e for e in runs if name in (e.project, e.location.parent.name)]
    chosen = by_name or matches or of_project
    if not chosen:
        raise ConfigError(f"no experiment {text!r} under {_root(results_dir)}; "
                          "`patronus-tasks list` shows them.")
    return _one_project(chosen, text)


def _one_project(chosen: list[Experiment], text: str) -> Experiment:
    """The latest of ``chosen``, when they are of one project (else say which)."""
    if len({e.project for e in chosen}) > 1:
        raise ConfigError(f"{text!r} names experiments in several projects "
                          f"({', '.join(sorted({e.project for e in chosen}))}); "
                          "say which: PROJECT/EXPERIMENT.")
    return chosen[-1]


def load_pair(a: Experiment | str | Path, b: Experiment | str | Path,
              results_dir: str | Path | None = None) -> tuple[Experiment, Experiment]:
    """Two runs to compare. ``nightly`` is the experiment's latest run, and also the folder
    of its first: where both names came to one run (``compare nightly nightly-2``), the
    one naming another run's folder means that run (else, one run twice: the command line
    says so)."""
    ea, eb = (as_experiment(x, results_dir) for x in (a, b))
    if ea.location == eb.location:
        for given, other in ((a, eb), (b, ea)):
            folder = _by_folder(given, results_dir)
            if folder is not None and folder.location != other.location:
                return (folder, eb) if given is a else (ea, folder)
    return ea, eb


def _by_folder(given: Experiment | str | Path, results_dir: str | Path | None) -> Experiment | None:
    """The run whose folder ``given`` names (``nightly``, ``project/nightly``), if one."""
    if not isinstance(given, str):
        return None
    project, _, folder = given.rpartition("/")
    found = [e for e in list_experiments(results_dir) if e.location.name == folder
             and (not project or project == e.location.parent.name)]
    return found[-1] if len(found) == 1 else None


def as_experiment(given: Experiment | str | Path, results_dir: str | Path | None = None) -> Experiment:
    """``given``, or the experiment `load_experiment` finds by it (a `ConfigError` naming
    what was given when it is neither)."""
    if isinstance(given, Experiment):
        return given
    if isinstance(given, str | Path):
        return load_experiment(given, results_dir)
    raise ConfigError(f"expected an Experiment, or a folder or name of one (as "
                      f"load_experiment takes), not {type(given).__name__}.")
