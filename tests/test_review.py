"""People in the loop (`review`): rows of a judged run picked, asked in the Prefect UI's
pause form (read and answered through Prefect's own API, on the session server) or in a
terminal (a pseudo-terminal), the labels kept in labels.parquet, the judge held to them,
the labelled set grown, and a judge whose kappa with people fell called regressed.

The judged run: twelve rows judged offline by a scripted OpenAI-compatible server (two
judges: ``correct``, with log-probabilities on three rows, and ``panel``, two models that
split on two rows), made once for the module."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from prefect import flow

from patronus_tasks import ConfigError, review, run_experiment
from patronus_tasks.evaluators import calibrate, llm_judge
from patronus_tasks.http import Endpoint
from patronus_tasks.record.labels import Label, add_labels
from patronus_tasks.results import load_experiment
from patronus_tasks.results.agreement import cohen_kappa, krippendorff_alpha
from patronus_tasks.review.form import model, paginate
from patronus_tasks.review.rows import reviewables
from patronus_tasks.review.select import choose

from .judge_server import completion, with_logprobs
from .servers import Recorded, Reply, serve
from .waits import until

#: Row i's answers: ``correct`` passes rows 0-7; ``panel``'s two models split on 3 and 10.
PASSING = range(8)
LOGPROBS = {1: 0.55, 2: 0.3, 9: 0.7}  # P(pass) where the endpoint gave log-probabilities
SPLIT = {3, 10}
HOSTILE = "see [docs](http://evil.example) ![x](http://evil.example/i.png) <img src=x> **now** # h"
#: A terminal's escape sequences (clear the screen, set its title): never written to one.
CONTROL = "\x1b[2J\x1b]0;pwned\x07"


def judge(req: Recorded) -> Reply:
    """``correct`` and ``panel`` answer each row as the module's tables say."""
    prompt = "\n".join(m["content"] for m in req.body["messages"])
    i = int(re.search(r"OUT(\d+)", prompt).group(1))  # type: ignore[union-attr]
    model_name = req.body["model"]
    if "Criterion: polite" in prompt:
        verdict = {"explanation": f"panel {i}", "pass": not (i in SPLIT and model_name == "m2")}
        return 200, {}, completion(json.dumps(verdict), model=model_name)
    verdict = {"explanation": f"because {i} {HOSTILE}{CONTROL}", "pass": i in PASSING}
    if i in LOGPROBS:
        p = LOGPROBS[i]
        return 200, {}, completion(json.dumps(verdict), model=model_name, logprobs=with_logprobs(
            verdict, "pass", {"true": p, "false": 1 - p}))
    return 200, {}, completion(json.dumps(verdict), model=model_name)


def rows(n: int = 12) -> list[dict[str, Any]]:
    return [{"sid": f"s{i:02d}", "evaluated_model_input": f"question {i}",
             "evaluated_model_output": f"OUT{i} " + (HOSTILE if i == 0 else "an answer"),
             "evaluated_model_gold_answer": f"gold {i}",
             "evaluated_model_retrieved_context": [f"passage {i}a", f"passage {i}b"]} for i in range(n)]


def judges(url: str) -> list[Any]:
    return [llm_judge("Criterion: correct", endpoint=Endpoint(url), name="correct"),
            llm_judge("Criterion: polite", endpoint=Endpoint(url), judges=["m1", "m2"], name="panel")]


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The judged run's folder (a copy per test: `run`)."""
    where = tmp_path_factory.mktemp("judged")
    with serve(judge) as server:
        exp = run_experiment("reviews", data=rows(), evaluators=judges(server.url),
                             experiment_name="night", results_dir=where, backend="local",
                             print_summary=False, html_report=False)
    return Path(exp.path)


@pytest.fixture
def run(judged: Path, tmp_path: Path) -> Any:
    """A fresh copy of the judged run, its own labels."""
    folder = tmp_path / "results" / "reviews" / "night"
    shutil.copytree(judged, folder)
    return load_experiment(str(folder))


def sids(found: list[Any]) -> list[str]:
    return [r.sid for r in found]


def test_rows_are_selected_each_way(run: Any) -> None:
    records, labels = run.to_dataframe(), run.labels()
    correct = reviewables(records, labels, "correct", ["pass", "fail"])
    panel = reviewables(records, labels, "panel", ["pass", "fail"])
    assert len(correct) == 12 and correct[3].p_pass is None and correct[1].p_pass == pytest.approx(0.55)
    # A sample stratified by the judge's answer: 8 of 12 pass, so 4 of 6 do.
    sample = choose(correct, "sample", 6, seed=1).rows
    assert len(sample) == 6 and sum(r.verdict == "pass" for r in sample) == 4
    assert sids(choose(correct, "sample", 6, seed=1).rows) == sids(sample)  # seeded: the same
    assert sids(choose(correct, "sample", 6, seed=2).rows) != sids(sample)
    assert sids(choose(correct, "failed", 10).rows) == ["s08", "s09", "s10", "s11"]
    assert sids(choose(correct, "failed", 2).rows) == ["s08", "s09"]  # n caps them
    # Between the bounds, the nearest to a coin toss first; rows without log-probabilities
    # are none of them.
    assert sids(choose(correct, "uncertain", 10).rows) == ["s01", "s02", "s09"]
    assert sids(choose(correct, "uncertain", 10, bounds=(0.5, 0.6)).rows) == ["s01"]
    assert sids(choose(panel, "disagreements", 10).rows) == ["s03", "s10"]
    assert panel[3].judges == [("m1", "pass"), ("m2", "fail")] or panel[3].split
    assert sids(choose(correct, lambda r: r.sid.endswith("7"), 10).rows) == ["s07"]
    # Nothing matches: said why.
    assert "no panel" in choose(correct, "disagreements", 5).why_none
    assert "log-probabilities" in choose(panel, "uncertain", 5).why_none
    with pytest.raises(ConfigError, match="select must be one of"):
        choose(correct, "worst", 5)
    with pytest.raises(ConfigError, match="bounds must be"):
        choose(correct, "uncertain", 5, bounds=(0.8, 0.2))


def test_the_form_holds_each_rows_facts_and_nothing_renders_as_markdown(run: Any) -> None:
    rows_ = reviewables(run.to_dataframe(), run.labels(), "correct", ["pass", "fail"])
    page = paginate("correct", rows_[:3], ["pass", "fail"], None)[0]
    schema = model(page).model_json_schema()
    props = schema["properties"]
    assert next(iter(props)) == "reviewer" and schema["required"] == ["reviewer"]
    assert props["reviewer"]["minLength"] == 1  # the name asked once, never empty
    labels = [p for name, p in props.items() if name.startswith("label_")]
    notes = [p for name, p in props.items() if name.startswith("note_")]
    assert len(labels) == len(notes) == 3
    assert labels[0]["title"] == "s00: the judge said pass" and labels[0]["default"] == "skip"
    assert labels[0]["enum"] == ["pass", "fail", "skip"]  # a drop-down, the scale and skip
    assert notes[0] == {"default": "", "description": "Optional: why, in a few words.",
                        "maxLength": 2000, "title": "s00: your note", "type": "string"}  # no None toggle
    facts = labels[0]["description"]
    visible = facts.replace("\u2060", "").replace("\ufeff", "")  # as v2 shows it
    for part in ("question 0", "OUT0", "gold 0", "[1] passage 0a [2] passage 0b", "because 0"):
        assert f"{part}" in visible, part
    # Model output never renders as Markdown: no link, image, tag or emphasis survives in
    # v1 (which renders the description); v2 shows the same text, the marks invisible.
    assert not visible.startswith("▸ judge")  # the title says the judge's answer
    assert HOSTILE in visible and "\x1b" not in facts and "\x07" not in facts
    for construct in ("[docs](", "![x](", "<img", "**now", "http://"):
        assert construct not in facts, construct
    # Pre-set to the judge's answer only when asked, and then said on the field.
    preset = model(paginate("correct", rows_[:1], ["pass", "fail"], None, preset=True)[0])
    field = next(p for n, p in preset.model_json_schema()["properties"].items() if n.startswith("label_"))
    assert field["default"] == "pass" and "pre-set to it here" in field["title"]
    # The answer read back: a label per row not skipped; one off the scale refused.
    label_names = [n for n in props if n.startswith("label_")]
    answer = model(page).model_validate({"reviewer": " Ann ", label_names[0]: "fail",
                                         label_names[1]: "skip"}).model_dump()
    assert [(x.sid, x.label, x.reviewer) for x in page.read(answer)] == [("s00", "fail", "Ann")]
    with pytest.raises(ValueError):
        model(page).model_validate({"reviewer": "Ann", label_names[0]: "maybe"})
    with pytest.raises(ValueError):
        model(page).model_validate({"reviewer": ""})


def _label_each(folder: str, reviewer: str, sids: list[str]) -> None:
    from patronus_tasks.record.location import Location

    for sid in sids:  # one write per label: each reads, adds to and replaces the file
        add_labels(Location.of(folder), [Label(sid, "correct", "pass", reviewer)])


def test_two_reviewers_writing_at_once_lose_no_label(tmp_path: Path) -> None:
    # A terminal's review beside a flow's, on one experiment: without a lock, each read
    # the file, added its label and replaced it, and one of two concurrent writes was lost.
    import multiprocessing

    from patronus_tasks.record.labels import read_labels
    from patronus_tasks.record.location import Location

    sids = [f"s{i:02d}" for i in range(40)]
    fork = multiprocessing.get_context("fork")
    writers = [fork.Process(target=_label_each, args=(str(tmp_path), who, sids)) for who in ("Ann", "Bo")]
    for w in writers:
        w.start()
    for w in writers:
        w.join(60)
    assert [w.exitcode for w in writers] == [0, 0]
    kept = read_labels(Location.of(str(tmp_path)))
    assert sorted(kept.groupby("reviewer").size().items()) == [("Ann", 40), ("Bo", 40)]

def test_labels_are_kept_apart_per_reviewer_and_the_judge_is_held_to_them(run: Any) -> None:
    from patronus_tasks.results.reviewed import of_experiment

    # Ann labels eight rows (she differs from the judge on s01 and s08); Bo labels five of
    # them (he differs from Ann on s02).
    ann = {"s00": "pass", "s01": "fail", "s02": "pass", "s03": "pass", "s08": "pass",
           "s09": "fail", "s10": "fail", "s11": "fail"}
    bo = {"s00": "pass", "s01": "fail", "s02": "fail", "s08": "pass", "s09": "fail"}
    add_labels(run.location, [Label(s, "correct", v, "Ann", "first") for s, v in ann.items()])
    add_labels(run.location, [Label("s00", "correct", "fail", "Ann", "changed my mind")])
    add_labels(run.location, [Label(s, "correct", v, "Bo") for s, v in bo.items()])
    ann["s00"] = "fail"
    labels = run.labels()
    assert list(labels.columns) == ["sid", "evaluator", "label", "reviewer", "note", "reviewed_at"]
    assert len(labels) == 13 and set(labels["reviewer"]) == {"Ann", "Bo"}
    mine = labels[(labels["reviewer"] == "Ann") & (labels["sid"] == "s00")]
    assert mine[["label", "note"]].values.tolist() == [["fail", "changed my mind"]]
    found = of_experiment(run, "correct")
    # The judge against the reviewers' label per row: s00 and s02 are split evenly (left out).
    agreed = {s: v for s, v in ann.items() if s not in ("s00", "s02")}
    judge_said = {s: "pass" if int(s[1:]) in PASSING else "fail" for s in agreed}
    pairs = [(agreed[s], judge_said[s]) for s in agreed]
    assert found.split == 2 and found.agreement is not None and found.agreement.n == len(pairs)
    assert found.agreement.kappa == pytest.approx(cohen_kappa(pairs, ["fail", "pass"]))
    # The reviewers among themselves: Krippendorff's alpha on the five rows both labelled.
    units = [[ann[s], bo[s]] for s in bo]
    assert found.shared == 5 and found.reviewers_alpha == pytest.approx(krippendorff_alpha(units))
    # A judge is never held to more than the reviewers agree among themselves.
    bar, why = found.bar(0.9)
    assert bar == pytest.approx(found.reviewers_alpha) and "above the reviewers' own agreement" in (why or "")
    assert found.bar(-1.0) == (-1.0, None)
    # As a gate: held to the reviewers' alpha (said), else to min_kappa itself.
    from dataclasses import replace

    from patronus_tasks import QualityGateError
    from patronus_tasks.review.run import Review, gate

    assert found.agreement.kappa >= found.reviewers_alpha
    gate(Review(run, "correct", [], 0, found, ""), 0.9)  # lowered to their alpha: passes
    alone = Review(run, "correct", [], 0, replace(found, reviewers_alpha=None), "")
    with pytest.raises(QualityGateError, match=r"Cohen's kappa with its reviewers .* is below 0.900"):
        gate(alone, 0.9)
    # The HTML report shows them beside the judge's answers.
    from patronus_tasks.report.build import build_report

    page = build_report(run)
    assert "<h3>Human review: correct</h3>" in page and "label by Bo" in page
    # A reviewer's name (as a label) is text, never a path: nothing is written where it points.
    add_labels(run.location, [Label("s03", "correct", "pass", "../../escaped")])
    assert "../../escaped" in set(run.labels()["reviewer"])
    assert not (run.location.local / "../../escaped").exists() and not Path("escaped").exists()


def test_review_outside_a_flow_names_the_terminal_review(run: Any) -> None:
    with pytest.raises(ConfigError, match=r"inside a flow.*patronus-tasks review .* --evaluator correct"):
        review(run, "correct")
    with pytest.raises(ConfigError, match="say which evaluator"):
        review(run)
    with pytest.raises(ConfigError, match="has no evaluator 'nope'"):
        review(run, "nope")
    for bad, said in [({"page_size": 50}, "page_size must be 1 to 20"), ({"n": 0}, "n must be"),
                      ({"timeout": 0}, "timeout must be"), ({"into": "x.csv"}, "JSON Lines"),
                      ({"reviewers": 0}, "reviewers must be")]:
        with pytest.raises(ConfigError, match=said):
            review(run, "correct", **bad)


def test_reviewed_rows_grow_a_calibration_set_without_duplicates(run: Any, tmp_path: Path) -> None:
    from patronus_tasks.review.into import append

    into = tmp_path / "datasets" / "labels.jsonl"
    rows_ = reviewables(run.to_dataframe(), run.labels(), "correct", ["pass", "fail"])
    people = {"s01": "fail", "s02": "pass", "s08": "fail", "s09": "fail", "s10": "fail", "s11": "pass"}
    add_labels(run.location, [Label(s, "correct", v, "Ann") for s, v in people.items()])
    add_labels(run.location, [Label("s02", "correct", "fail", "Bo")])  # split: not added
    first = append(into, rows_, run.labels(), "reviews/night")
    assert (first.added, first.known, first.split) == (5, 0, 1)
    again = append(into, rows_, run.labels(), "reviews/night")
    assert (again.added, again.known) == (0, 5)  # no duplicates
    written = [json.loads(line) for line in into.read_text().splitlines()]
    assert [w["sid"] for w in written] == ["s01", "s08", "s09", "s10", "s11"]
    assert written[0]["evaluated_model_retrieved_context"] == ["passage 1a", "passage 1b"]
    assert written[0]["label"] == "fail" and written[0]["reviewers"] == ["Ann"]
    # The next night's calibration reads it: the judge against what people said.
    with serve(judge) as server:
        cal = calibrate(judges(server.url)[0], into, results_dir=tmp_path / "cal", backend="local",
                        print_summary=False, html_report=False)
    pairs = [(people[w["sid"]], "pass" if int(w["sid"][1:]) in PASSING else "fail") for w in written]
    assert cal.agreement.n == 5 and cal.agreement.kappa == pytest.approx(cohen_kappa(pairs, ["fail", "pass"]))
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"sid": "x", "evaluator": "tone", "label": "good"}) + "\n")
    with pytest.raises(ConfigError, match="holds rows labelled for 'tone'"):
        append(other, rows_, run.labels(), "reviews/night")


def test_a_judge_whose_kappa_with_people_fell_is_regressed(tmp_path: Path) -> None:
    """Two nights of the same calibration set: the second night's judge answers three
    rows otherwise, its kappa falls, and the verdict names it (``regressed:correct``)."""
    from patronus_tasks.results import compare_experiments
    from patronus_tasks.results.verdict import Rule
    from patronus_tasks.results.verdict import judge as verdict

    data = [{"sid": f"c{i}", "evaluated_model_output": f"OUT{i} x",
             "label": "pass" if i in PASSING else "fail"} for i in range(12)]
    runs = []
    for night, flipped in (("one", set()), ("two", {0, 1, 8})):
        def handler(req: Recorded, flipped: set[int] = flipped) -> Reply:
            prompt = "\n".join(m["content"] for m in req.body["messages"])
            i = int(re.search(r"OUT(\d+)", prompt).group(1))  # type: ignore[union-attr]
            passed = (i in PASSING) != (i in flipped)
            return 200, {}, completion(json.dumps({"explanation": "x", "pass": passed}))
        with serve(handler) as server:
            runs.append(calibrate(judges(server.url)[0], data, experiment_name=night,
                                  results_dir=tmp_path, backend="local", print_summary=False,
                                  html_report=False).experiment)
    comparison = compare_experiments(*runs)
    change = comparison.agreements[0]
    assert change.evaluator == "correct" and change.rows == 12 and change.kappa_a == pytest.approx(1.0)
    assert change.kappa_b == pytest.approx(cohen_kappa(
        [("pass" if i in PASSING else "fail", "pass" if (i in PASSING) != (i in {0, 1, 8}) else "fail")
         for i in range(12)], ["fail", "pass"]))
    note = verdict(runs[1].summary(), comparison, Rule())
    assert note.name == "Regressed" and "regressed:correct" in note.tags
    assert "correct agreement with people: Cohen's kappa 1.000 →" in note.message


# In a flow, on the session's Prefect server --------------------------------------


#: The flow runs of `review_pages` (a parameter would be a copy).
RUNS: list[str] = []


@flow(name="review-pages")
def review_pages(folder: str, n: int, timeout: int) -> Any:
    from prefect.runtime import flow_run

    RUNS.append(flow_run.get_id())
    return review(folder, "correct", select="sample", n=n, page_size=5, timeout=timeout,
                  min_kappa=-1.0)


@flow(name="review-nothing")
def review_nothing(folder: str) -> list[str]:
    none = review(folder, "correct", select="disagreements")  # no panel: no row matches
    nobody = review(folder, "correct", select="failed", n=2, timeout=1)
    return [none.message, nobody.message]


@pytest.fixture
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    from patronus_tasks.prefect import pause

    monkeypatch.setattr(pause, "POLL_SECONDS", 0.2)


def _paused(ids: list[str], page: int) -> Any:
    """The flow run once paused for its first form (its state, its form's schema and
    description, read through Prefect's API)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import PrefectHTTPStatusError

    def look() -> Any:
        if not ids:
            return None
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(ids[0]).state
            if state is None or not state.is_paused():
                return None
            keys = state.state_details.run_input_keyset
            try:  # the run is Paused first, its form saved just after (as Prefect's own pause)
                schema = json.loads(client.read_flow_run_input(ids[0], keys["schema"]))
                return state, schema, json.loads(client.read_flow_run_input(ids[0], keys["description"]))
            except PrefectHTTPStatusError as exc:
                if exc.response.status_code == 404:
                    return None
                raise
    return until(look, f"the flow run paused for page {page}", 60)


def test_a_flow_run_pauses_for_each_page_and_the_answers_land(run: Any, prefect_server: str,
                                                               quick_polls: None,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.flow_runs import resume_flow_run

    from patronus_tasks.review.run import plan

    selected = sids(plan(run, "correct", "sample", 7, 0, (0.2, 0.8), None, 1).selected)
    # Zed labelled two of them before: they are not asked again.
    add_labels(run.location, [Label(s, "correct", "fail", "Zed") for s in selected[:2]])
    RUNS.clear()
    ids = RUNS
    result: list[Any] = []
    # Each page waits 20 s: room for this test to read and answer page 1 on a loaded machine
    # (4 s raced it); page 2's wait running out is the timeout the test wants.
    thread = threading.Thread(target=lambda: result.append(review_pages(str(run.path), 7, 20)))
    thread.start()
    try:
        state, schema, description = _paused(ids, 1)
        asked = [p["title"].split(":")[0] for n, p in schema["properties"].items() if n.startswith("label_")]
        assert asked == selected[2:5]  # page 1 of 2: rows 1 to 5, less Zed's two
        assert description.startswith("**Review of correct** on night: page 1 of 2, rows 1 to 3 of 7.")
        # Ann's answer, through Prefect's own resume call: one row's label differs from the judge's.
        names = [n for n in schema["properties"] if n.startswith("label_")]
        said = {s: ("pass" if int(s[1:]) in PASSING else "fail") for s in asked}
        said[asked[0]] = "fail" if said[asked[0]] == "pass" else "pass"
        resume_flow_run(ids[0], run_input={"reviewer": "Ann", **dict(zip(names, said.values(), strict=True)),
                                           names[0].replace("label_", "note_"): "reads *wrong*"})
        until(lambda: len(run.labels()) == 5, "page 1's labels kept")
        _, schema2, _ = _paused_again(ids, state.state_details.pause_key)
        names2 = [n for n in schema2["properties"] if n.startswith("label_")]
        assert len(names2) == 2
        # A label off the scale is refused by Prefect (the form's schema): still paused.
        with pytest.raises(RuntimeError, match="Cannot resume"):
            resume_flow_run(ids[0], run_input={"reviewer": "Ann", names2[0]: "maybe"})
        # Then nobody answers page 2: the flow goes on, page 1's answers kept.
        thread.join(60)
    finally:
        thread.join(60)
    r = result[0]
    assert r.message.startswith("5 of 7 reviewed; page 2 of 2: nobody answered within 20 s"), r.message
    labels = r.labels
    assert len(labels) == 5 and set(labels["reviewer"]) == {"Ann", "Zed"}
    assert labels.set_index("sid").loc[asked[0], "note"] == "reads *wrong*"
    human = {**dict.fromkeys(selected[:2], "fail"), **said}
    pairs = [(human[s], "pass" if int(s[1:]) in PASSING else "fail") for s in human]
    assert r.agreement.n == 5 and r.agreement.kappa == pytest.approx(cohen_kappa(pairs, ["fail", "pass"]))
    with get_client(sync_client=True) as client:
        final = client.read_flow_run(ids[0])
        # Filtered by the server: the session's server holds more artifacts than a page.
        mine = client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[ids[0]])))
    assert final.state.is_completed()
    assert [a.key for a in mine] == ["reviews-correct-review"]
    assert "label by Ann" in mine[0].data and "5 of 7 reviewed" in mine[0].description
    # Each page said to the run's logger (its Logs tab; the suite ships no logs to the API)
    # that the run waits for its form, where it is, and until when.
    waiting = [r for r in caplog.records if "waiting for its form until" in r.getMessage()]
    assert [str(getattr(r, "flow_run_id", "")) for r in waiting] == [str(ids[0])] * 2
    assert "this run's Resume button opens it. Nobody answering by then, it goes on without." \
        in waiting[0].getMessage()


def _paused_again(ids: list[str], before: str) -> Any:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import PrefectHTTPStatusError

    def look() -> Any:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(ids[0]).state
            if state is None or not state.is_paused() or state.state_details.pause_key == before:
                return None
            keys = state.state_details.run_input_keyset
            try:  # (saved just after the state: see `_paused`)
                return state, json.loads(client.read_flow_run_input(ids[0], keys["schema"])), None
            except PrefectHTTPStatusError as exc:
                if exc.response.status_code == 404:
                    return None
                raise
    return until(look, "the flow run paused for its next page", 60)


def test_no_matching_row_asks_nobody_and_a_page_nobody_answers_lets_the_flow_go_on(
        run: Any, prefect_server: str, quick_polls: None) -> None:
    none, nobody = review_nothing(str(run.path))
    assert none.startswith("0 of 0 reviewed; no row of correct matches the selection: the "
                           "evaluator is no panel"), none
    assert nobody.startswith("0 of 2 reviewed; page 1 of 1: nobody answered within 1 s"), nobody
    assert run.labels().empty


# In a terminal ---------------------------------------------------------------------


class Pty:
    """``patronus-tasks review ...`` on a pseudo-terminal, typed into as a person does."""

    def __init__(self, *args: str) -> None:
        import pty
        import subprocess
        import sys

        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen([sys.executable, "-m", "patronus_tasks", "review", *args],
                                     stdin=slave, stdout=slave, stderr=slave, close_fds=True)
        os.close(slave)
        self.seen = b""

    def expect(self, text: str, timeout: float = 60) -> None:
        import select

        def read() -> bool:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                with contextlib.suppress(OSError):  # the other end closed
                    self.seen += os.read(self.master, 65536)
            return text.encode() in self.seen
        until(read, f"{text!r} on the terminal (it showed: {self.seen[-300:]!r})", timeout)

    def type(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())


def test_the_terminal_asks_one_row_at_a_time(run: Any, tmp_path: Path) -> None:
    into = tmp_path / "labels.jsonl"
    t = Pty(str(run.path), "--evaluator", "correct", "--select", "failed", "-n", "3",
            "--into", str(into))
    try:
        t.expect("Your name")
        t.type("Ann")
        t.expect("Row 1 of 3: sid s08")
        t.expect("Your label [pass/fail; Enter: skip; quit]: ")
        t.type("maybe")
        t.expect("'maybe' is not on the scale: answer one of pass/fail.")
        t.type("PASS")
        t.expect("Note (Enter for none): ")
        t.type("looks right to me")
        t.expect("Row 2 of 3: sid s09")
        t.type("")  # skipped
        t.expect("Row 3 of 3: sid s10")
        t.type("fail")
        t.type("")
        t.expect("2 of 3 reviewed")
        assert t.proc.wait(30) == 0
    finally:
        t.proc.kill()
        os.close(t.master)
    labels = run.labels()
    assert [[r.sid, r.label, r.reviewer, r.note if isinstance(r.note, str) else None]
            for r in labels.itertuples()] == [["s08", "pass", "Ann", "looks right to me"],
                                              ["s10", "fail", "Ann", None]]
    assert [json.loads(x)["sid"] for x in into.read_text().splitlines()] == ["s08", "s10"]
    # The facts as text, the model's escape sequences not written to the terminal.
    assert b"OUT8 an answer" in t.seen and b"because 8 see [docs](http://evil.example)" in t.seen
    assert b"\x1b" not in t.seen and b"\x07" not in t.seen
