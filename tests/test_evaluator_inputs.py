"""The ready checks' input rule (issue 49): empty is empty from every source, a parsed value
is read, never a `TypeError`; and the options that follow a peer, on the peer's own cases
(each table names the peer's file it comes from)."""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from patronus_tasks import ConfigError, DatasetError, run_experiment
from patronus_tasks.evaluators import (
    bleu,
    chrf,
    contains,
    exact_match,
    json_equal,
    json_schema,
    json_valid,
    numeric_close,
    pii,
    refusal,
    regex,
    rouge,
    sql_equivalent,
    sql_result_match,
    string_similarity,
    token_f1,
)
from patronus_tasks.evaluators.base import EMPTY_OUTPUT

from .test_evaluators_offline import LOCAL, judge

# One dataset, written as each source writes it: "" and None are both empty, "  " too.
ROWS: list[dict[str, Any]] = [
    {"sid": "1", "evaluated_model_output": "Paris", "evaluated_model_gold_answer": "paris"},
    {"sid": "2", "evaluated_model_output": "", "evaluated_model_gold_answer": "x 3"},
    {"sid": "3", "evaluated_model_output": " \n", "evaluated_model_gold_answer": "x 3"},
    {"sid": "4", "evaluated_model_output": "Paris 3", "evaluated_model_gold_answer": ""},
    {"sid": "5", "evaluated_model_output": "Paris 3", "evaluated_model_gold_answer": None},
    {"sid": "6", "evaluated_model_output": "", "evaluated_model_gold_answer": "  "},
    {"sid": "7", "evaluated_model_output": "7", "evaluated_model_gold_answer": "007"},
    {"sid": "8", "evaluated_model_output": "42", "evaluated_model_gold_answer": 42},
    {"sid": "9", "evaluated_model_output": "5", "evaluated_model_gold_answer": '["5", "7"]'},
]
CHECKS = [exact_match, string_similarity, token_f1, numeric_close, contains, lambda: regex("^$")]


def _sources(tmp_path: Path) -> dict[str, Any]:
    jsonl, table = tmp_path / "d.jsonl", tmp_path / "d.csv"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    with table.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(ROWS[0]))
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in r.items()} for r in ROWS)
    return {"jsonl": jsonl, "csv": table, "list": ROWS, "dataframe": pd.DataFrame(ROWS)}


def test_the_same_rows_judge_alike_from_jsonl_csv_a_list_and_a_dataframe(tmp_path: Path) -> None:
    seen = {}
    for source, data in _sources(tmp_path).items():
        exp = run_experiment(f"inputs-{source}", data=data, evaluators=[make() for make in CHECKS],
                             results_dir=tmp_path / "results", **LOCAL)
        df = exp.to_dataframe()
        seen[source] = {(r["sid"], r["evaluator_name"]): (
            r["status"], r["pass"], r["error_type"],
            r["explanation"] if r["status"] == "ok" else r["error_message"])
            for r in df.astype(object).where(df.notna(), None).to_dict("records")}
        lines = exp.summary().format()
        assert "3 x evaluator 'exact_match': DatasetError: exact_match: the gold answer is empty; " \
               "fill in evaluated_model_gold_answer" in lines and "(first: sid 4)" in lines, lines
    assert seen["csv"] == seen["jsonl"] == seen["list"] == seen["dataframe"]
    got = seen["jsonl"]
    for sid in ("4", "5", "6"):  # "", None, "  ": the row's error, in the same words
        status, _, error_type, message = got[(sid, "exact_match")]
        assert (status, error_type) == ("error", "DatasetError")
        assert message.startswith("exact_match: the gold answer is empty; fill in")
    for sid in ("2", "3"):
        assert got[(sid, "token_f1")] == ("ok", False, None, EMPTY_OUTPUT)
    assert got[("2", "regex")][:2] == ("ok", False)  # "" no longer matches /^$/
    assert got[("7", "exact_match")][:2] == ("ok", False)  # "007" is a text in a CSV too
    assert got[("8", "exact_match")][:2] == ("ok", True)  # 42 from JSON, "42" from a CSV
    assert got[("9", "numeric_close")][:2] == ("ok", True)  # a JSON list of answers


def test_a_csv_cell_is_the_text_written_as_from_json_lines(tmp_path: Path) -> None:
    # A column of numbers only: pandas' guess read "007" as 7 and "42.0" as 42.
    table, lines = tmp_path / "n.csv", tmp_path / "n.jsonl"
    rows = [("1", "007", "007"), ("2", "42.0", "42.0"), ("3", "n/a", "1e3")]
    table.write_text("sid,evaluated_model_output,evaluated_model_gold_answer\n"
                     + "".join(",".join(r) + "\n" for r in rows))
    names = ("sid", "evaluated_model_output", "evaluated_model_gold_answer")
    lines.write_text("".join(json.dumps(dict(zip(names, r, strict=True))) + "\n" for r in rows))
    passed = {}
    for data in (table, lines):
        df = run_experiment(f"cells-{data.suffix[1:]}", data=data, evaluators=[exact_match()],
                            results_dir=tmp_path / "results", **LOCAL).to_dataframe()
        passed[data.suffix] = df.set_index("sid")["pass"].to_dict()
    assert passed[".csv"] == passed[".jsonl"] == {"1": True, "2": True, "3": False}


EVERY_CHECK = [exact_match, contains, token_f1, string_similarity, rouge, bleu, chrf, json_valid,
               json_equal, numeric_close, refusal, pii, lambda: regex("4"),
               lambda: regex(r"(\d)", group=1), lambda: json_schema({"type": "object"})]
PARSED = [42, 4.5, np.int64(42), np.float64(2.0), {"a": [1, 2]}, [1, 2], True, np.array([1, 2])]


@pytest.mark.parametrize("make", EVERY_CHECK)
def test_a_parsed_value_is_read_never_a_type_error(make: Any) -> None:
    ev = make()
    for value in PARSED:
        for gold in (value, "42"):
            try:
                result = judge(ev, value, gold)
            except DatasetError:  # a gold answer this check cannot use: the row's error
                continue
            # (sacrebleu's 100 can be 100.00000000000004)
            assert result.pass_ in (True, False) and 0 <= result.score_raw <= 1 + 1e-12, (value, gold)


@pytest.mark.parametrize("make", [exact_match, contains, token_f1, string_similarity, rouge, bleu,
                                  chrf, json_equal, numeric_close, lambda: regex(r"(\d)", group=1)])
def test_an_empty_gold_is_the_rows_error_and_an_empty_output_fails(make: Any) -> None:
    ev = make()
    lists = [] if ev.name == "json_equal" else [[], ["", None], np.array([], dtype=object)]
    for gold in (None, "", " \t\n", float("nan"), pd.NA, *lists):  # [] is JSON to json_equal
        with pytest.raises(DatasetError, match="the gold answer is empty; fill in evaluated_model"):
            judge(ev, "Paris 3", gold)
    for output in (None, "", "   ", float("nan")):
        result = judge(ev, output, '{"a": 1}' if ev.name == "json_equal" else "Paris 3")
        assert (result.pass_, result.explanation) == (False, EMPTY_OUTPUT), output


def test_the_findings_of_issue_49() -> None:
    with pytest.raises(DatasetError):
        judge(string_similarity(), "a", "")  # scored 0 where the README promised the error
    for ev in (exact_match(), string_similarity(), token_f1()):
        with pytest.raises(DatasetError):
            judge(ev, "", "")  # passed from a JSON Lines file
    assert not judge(regex("^$"), "").pass_
    # pydantic-evals' Equals(42) (tests/evals/test_evaluator_common.py, test_equals)
    assert judge(exact_match(), 42, 42).pass_ and not judge(exact_match(), 43, 42).pass_
    assert judge(exact_match(), {"a": 1}, {"a": 1}).pass_  # autoevals' ExactMatch on dicts
    assert judge(json_valid(), {"a": 1}).pass_ and judge(json_equal(), {"a": 1}, '{"a": 1.0}').pass_
    assert judge(exact_match(), "42", np.float64(42.0)).pass_  # an int column with a gap



def test_the_sql_checks_read_by_the_same_rule() -> None:
    for ev in (sql_result_match("CREATE TABLE t (a INTEGER);"), sql_equivalent()):
        for gold in (None, "", "  \n"):  # compared with 0 rows (and failed) before the rule
            with pytest.raises(DatasetError, match="the gold answer is empty"):
                judge(ev, "SELECT a FROM t", gold)
        assert (judge(ev, " ", "SELECT a FROM t").explanation) == EMPTY_OUTPUT
        assert judge(ev, "SELECT a FROM t", "SELECT a FROM t").pass_

# numeric_close: every gold answer, a number's boundary, the relative score.

@pytest.mark.parametrize(("out", "gold", "passed"), [
    ("5", ["5", "7"], True), ("7", ["5", "7"], True), ("6", ["5", "7"], False),
    ("7", "[5, 7]", True), ("7", np.array([5, 7]), True), ("7", ["seven", "7"], True),
    ("42abc", "42", False), ("0x1F", "0", False), ("the 3rd", "3", False), ("v2", "2", False),
    ("42%", "42", True), ("$42", "42", True), ("It is (42).", "42", True), ("1.2.3", "1.2", False),
])
def test_numeric_close_reads_each_gold_and_numbers_that_stand_alone(out: str, gold: Any,
                                                                    passed: bool) -> None:
    assert judge(numeric_close(), out, gold).pass_ is passed


# Inspect AI's match(numeric=True) cases (tests/scorer/test_match.py): its verdicts, ours.
INSPECT_NUMERIC = [
    ("28 + 32 = 60\nThis solves the problem.", "60", True),
    ("**ANSWER: 28 + 32 = 60**\nThis solves the problem.", "60", True),
    ("The answer is 25", "5", False), ("the value is 110", "10", False), ("5", "-5", False),
    ("the result is -5", "-5", True), ("the result is -5 exactly", "-5", True),
    ("pi is approximately 3.14", "3.14", True), ("pi is approximately 33.14", "3.14", False),
    ("the value is 1000", "1e3", True), ("2.0", "2", True), ("result: -5.0", "-5", True),
    ("answer: \u22125", "-5", True), ("the answer is \uff11\uff12\uff13", "123", True),
    ("The answer is 42!", "42", True), ("The answer is 42?", "42", True),
    ("The answer is 42:", "42", True), ("The answer is (42).", "42", True),
    ("The answer is [42]", "42", True), ("The answer is 42abc", "42", False),
    ("got 7 and 11", "25", False),
]


@pytest.mark.parametrize(("out", "gold", "passed"), INSPECT_NUMERIC)
def test_numeric_close_on_inspects_cases(out: str, gold: str, passed: bool) -> None:
    assert judge(numeric_close(), out, gold).pass_ is passed


# autoevals' NumericDiff (py/autoevals/test_values.py test_numeric; test_number.py, the
# repository's scaled version: its 0.4.1 release overflows at +-1.8e308).
BIG = sys.float_info.max
NUMERIC_DIFF = [(0, 0, 1), (0, 1, 0), (1, 2, 2 / 3), (1.0, 2.0, 2 / 3), (-1, 2, 0), (BIG, BIG, 1),
                (BIG, BIG / 2, 2 / 3), (BIG, -BIG, 0), (-BIG, -BIG / 2, 2 / 3),
                (1e-320, 1e-320 / 2, 2 / 3), (0, BIG, 0), (10, 5, 2 / 3)]


@pytest.mark.parametrize(("out", "gold", "score"), NUMERIC_DIFF)
def test_numeric_close_relative_score_is_autoevals_numeric_diff(out: float, gold: float,
                                                                score: float) -> None:
    result = judge(numeric_close(score="relative"), repr(out), gold)
    assert math.isfinite(result.score_raw) and result.score_raw == pytest.approx(score)
    assert result.pass_ is (out == gold)  # the pass is the tolerance's, not the score's


def test_numeric_close_relative_takes_the_nearest_gold_and_the_pass_stays_the_tolerances() -> None:
    result = judge(numeric_close(score="relative"), "about 105", ["100", "300"])
    assert result.score_raw == pytest.approx(1 - 5 / 205) and not result.pass_
    assert result.metadata == {"expected": 100.0, "got": 105.0}
    assert judge(numeric_close(score="relative", rel_tol=0.05), "about 105", ["100", "300"]).pass_
    with pytest.raises(ConfigError, match="score must be one of 'binary', 'relative'"):
        numeric_close(score="graded")


# JSON: autoevals' JSONDiff and ValidJSON on their own cases (py/autoevals/test_json.py).
JSON_DIFF = [
    ({}, {}, 1), ({"a": 1}, {"a": 1}, 1), ({"a": 1}, {"a": 2}, 0.66667),
    ({"a": 1}, ["a", 1], 0.5714285714285714), ({"a": 1}, {"b": {"a": 1}}, 0),
    ({"a": 1}, {"a": None}, 0), ([], {}, 0), ([], [], 1), ({"k": None}, {"k": ""}, 0),
    ({"mapping": {"a": "foo", "b": "bar"}}, {"mapping": {"a": "Foo", "b": "Bar"}, "Extra": 5},
     0.33333333333333337),
    ('{"x": 1, "y": 2}', '{"y": 2, "x": 1}', 1),
    ('{"o1": {"x": 2, "y": 2}}', '{"o1": {"y": 2, "x": 1}}', 0.83333),
    ('{"x": 1, "y": 2}', '{"x": 1, "z": 2}', 0.3333), ("[1, 2]", "[1, 2]", 1), ("[1, 2]", "[2, 1]", 0.66667),
    ({"a": "abc"}, {"a": "axc"}, 0.66667), ({"a": "xabxcdxxefxgx"}, {"a": "1ab2cd34ef5g6"}, 0.53846),
]


@pytest.mark.parametrize(("out", "gold", "score"), JSON_DIFF)
def test_json_equal_graded_is_autoevals_json_diff(out: Any, gold: Any, score: float) -> None:
    result = judge(json_equal(leaves="graded"), out, gold)
    assert result.score_raw == pytest.approx(score, abs=1e-4)


def test_json_equal_scores_what_the_readme_says() -> None:
    gold = '{"a": 1, "b": 2}'
    assert judge(json_equal(), '{"a": 1, "b": 2, "c": 3}', gold).score_raw == pytest.approx(2 / 3)
    assert judge(json_equal(), '{"a": 1, "b": 2, "c": null}', gold).score_raw == pytest.approx(2 / 3)
    # graded: an absent key reads as null (as JSONDiff); true is not 1 (JSONDiff says 1)
    assert judge(json_equal(leaves="graded"), '{"a": 1, "b": 2, "c": null}', gold).score_raw == 1
    assert judge(json_equal(leaves="graded"), '{"a": true}', '{"a": 1}').score_raw == 0
    assert judge(json_equal(leaves="graded"), '{"a": 1, "b": 3}', gold).score_raw == pytest.approx(0.9)


@pytest.mark.parametrize(("out", "valid"), [
    ("1", 0), ('{ "a": 1, "b": "hello" }', 1), ('[{ "a": 1 }]', 1), ('[{ "a": 1 }', 0),
    ('{ "mapping": { "a": "foo", "b": "bar" }, "extra": 4 }', 1),
    ('{ mapping: { "a": "foo", "b": "bar" }, "extra": 4 }', 0),
    ({"a": 1}, 1), ([1], 1), (42, 0),  # parsed values, as ValidJSON takes them
])
def test_json_valid_require_container_is_autoevals_valid_json(out: Any, valid: int) -> None:
    assert judge(json_valid(require_container=True), out).score_raw == valid
    assert judge(json_valid(), out).pass_ is (valid == 1 or out in ("1", 42))  # any JSON


# regex(group=): Inspect AI's pattern scorer (tests/scorer/test_pattern.py), one group named.
INSPECT_PATTERN = [
    ("(foo)", 1, "foo", ["foo"], True), ("(foo)", 1, "foo", ["target doesn't match"], False),
    ("(foo)", 1, "model doesn't match", ["foo"], False), ("(foo) (bar)", 1, "foo bar", ["foo"], True),
    ("(foo) (bar)", 2, "foo bar", ["bar"], True), ("(f[oz]o) (b[az]r)", 2, "foo bzr", ["bar"], False),
]


@pytest.mark.parametrize(("pattern", "group", "out", "gold", "passed"), INSPECT_PATTERN)
def test_regex_group_on_inspects_cases(pattern: str, group: int, out: str, gold: list[str],
                                       passed: bool) -> None:
    assert judge(regex(pattern, group=group), out, gold).pass_ is passed


def test_regex_group_names_case_and_errors() -> None:
    said = "Reasoning... ANSWER: Paris"
    result = judge(regex(r"ANSWER:\s*(?P<answer>\w+)", group="answer"), said, "paris")
    assert result.pass_ and result.metadata == {"captured": "Paris"}
    assert not judge(regex(r"(a)|(b)", group=2), "a", "a").pass_  # the group took no part
    for group in (3, "nope", True):
        with pytest.raises(ConfigError, match=re.escape("group must be a group of the pattern")):
            regex(r"(a)(b)", group=group)
