"""The ready offline evaluators (patronus_tasks.evaluators): each against cases whose truth
is known, the metric ones equal to the reference libraries on the same strings."""

from __future__ import annotations

import os
import pickle
import re
import shutil
import sqlite3
import string
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from patronus_tasks import ConfigError, DatasetError, run_experiment, task
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

LOCAL: dict[str, Any] = dict(backend="local", print_summary=False, html_report=False)
PAIRS = [("the cat sat on the mat", "the cat is on the mat"),
         ("Paris is the capital of France.", "The capital of France is Paris"),
         ("kitten", "sitting"), ("a b c d e f", "f e d c b a"), ("", "nothing here"),
         ("Der schnelle braune Fuchs", "The quick brown fox")]


def judge(ev: Any, output: str | None, gold: Any = None) -> Any:
    kwargs = {"evaluated_model_output": output}
    if "evaluated_model_gold_answer" in ev.signature.names:
        kwargs["evaluated_model_gold_answer"] = gold
    return ev.evaluate(**kwargs)


# The reference libraries' values, on the same strings.

@pytest.mark.parametrize(("out", "gold"), PAIRS)
def test_string_similarity_is_rapidfuzz(out: str, gold: str) -> None:
    from rapidfuzz import fuzz
    from rapidfuzz.distance import JaroWinkler, Levenshtein

    def score(**options: Any) -> float:
        return float(judge(string_similarity(**options), out, gold).score_raw)

    assert score() == Levenshtein.normalized_similarity(out, gold)
    assert score(metric="jaro_winkler") == JaroWinkler.similarity(out, gold)
    assert score(metric="token_set") == fuzz.token_set_ratio(out, gold) / 100


@pytest.mark.parametrize(("out", "gold"), PAIRS)
def test_rouge_is_rouge_score(out: str, gold: str) -> None:
    from rouge_score import rouge_scorer

    for kind in ("rouge1", "rouge2", "rougeL"):
        want = rouge_scorer.RougeScorer([kind]).score(gold, out)[kind].fmeasure
        assert judge(rouge(kind=kind), out, gold).score_raw == want
    stemmed = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True).score(gold, out)["rougeL"]
    assert judge(rouge(use_stemmer=True), out, gold).score_raw == stemmed.fmeasure


@pytest.mark.parametrize(("out", "gold"), PAIRS)
def test_bleu_and_chrf_are_sacrebleu(out: str, gold: str) -> None:
    import sacrebleu

    assert judge(bleu(), out, gold).score_raw == sacrebleu.sentence_bleu(out, [gold]).score / 100
    assert judge(chrf(), out, gold).score_raw == sacrebleu.sentence_chrf(out, [gold]).score / 100
    plus = sacrebleu.sentence_chrf(out, [gold], word_order=2).score / 100
    assert judge(chrf(word_order=2), out, gold).score_raw == plus


def test_several_gold_answers_are_references_or_the_best() -> None:
    import sacrebleu
    from rouge_score import rouge_scorer

    out, golds = "the cat sat on the mat", ["a dog ran", "the cat is on the mat"]
    assert judge(bleu(), out, golds).score_raw == sacrebleu.sentence_bleu(out, golds).score / 100
    best = rouge_scorer.RougeScorer(["rougeL"]).score(golds[1], out)["rougeL"].fmeasure
    assert judge(rouge(), out, '["a dog ran", "the cat is on the mat"]').score_raw == best
    assert judge(exact_match(), "A dog ran", golds).pass_ is True


# SQuAD's official evaluation script (v2.0), as published: the reference for token_f1.

def _squad_normalize(s: str) -> str:
    def remove_articles(text: str) -> str:
        return re.compile(r"\b(a|an|the)\b", re.UNICODE).sub(" ", text)

    def white_space_fix(text: str) -> str:
        return " ".join(text.split())

    def remove_punc(text: str) -> str:
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def _squad_f1(a_gold: str, a_pred: str) -> float:
    gold_toks, pred_toks = _squad_normalize(a_gold).split(), _squad_normalize(a_pred).split()
    common = Counter(gold_toks) & Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision, recall = 1.0 * num_same / len(pred_toks), 1.0 * num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


@pytest.mark.parametrize(("out", "gold"), [*PAIRS, ("The Eiffel Tower!", "eiffel tower"),
                                           ("an apple, a pear", "The apple and the pear")])
def test_token_f1_is_squads(out: str, gold: str) -> None:
    result = judge(token_f1(), out, gold)
    assert result.score_raw == pytest.approx(_squad_f1(gold, out), abs=1e-15)
    assert result.pass_ is (result.score_raw >= 0.5)


# Text checks.

@pytest.mark.parametrize(("options", "out", "gold", "passed"), [
    ({}, "  Paris ", "paris", True),
    ({"ignore_case": False}, "Paris", "paris", False),
    ({}, "New   York", "new york", True),
    ({"ignore_whitespace": False}, "New   York", "New York", False),
    ({"ignore_whitespace": "surrounding"}, " New  York ", "New York", False),
    ({"ignore_whitespace": "all"}, "N e w York", "NewYork", True),
    ({}, "\uff30\uff41\uff52\uff49\uff53", "Paris", True),
    ({"normalize_unicode": False}, "\uff30\uff41\uff52\uff49\uff53", "Paris", False),
    ({}, "Paris.", "Paris", False),
    ({"ignore_punctuation": True}, "Paris!", "«Paris»", True),
])
def test_exact_match_options(options: dict[str, Any], out: str, gold: str, passed: bool) -> None:
    result = judge(exact_match(**options), out, gold)
    assert result.pass_ is passed and result.score_raw == float(passed)


def test_contains_regex_refusal() -> None:
    assert judge(contains(), "It is Paris, France", "paris").pass_
    assert not judge(contains(ignore_case=False), "It is Paris", "paris").pass_
    assert judge(contains("tower"), "The Eiffel Tower").pass_
    assert judge(contains(any_of=["x", "tower"]), "The Eiffel Tower").pass_
    missing = judge(contains(all_of=["eiffel", "rome"]), "The Eiffel Tower")
    assert not missing.pass_ and "'rome'" in missing.explanation
    assert judge(regex(r"\d{3}-\d{4}"), "call 555-1234 now").pass_
    assert not judge(regex(r"\d+", full_match=True), "abc 123").pass_
    assert judge(regex(r"yes", flags=re.I), "YES").pass_
    for said in ("I'm sorry, but I can't help with that.", "I cannot provide that information.",
                 "As an AI language model, I cannot browse the web.", "I must decline.", ""):
        assert judge(refusal(), said).pass_, said
    for said in ("Sure! The capital is Paris.", "I can help with that: here it is.",
                 "Sorry for the delay, the answer is 42."):
        assert not judge(refusal(), said).pass_, said
        assert judge(refusal(expect=False), said).pass_, said


@pytest.mark.parametrize(("options", "out", "gold", "passed"), [
    ({}, "The total is 1,234.50 USD", "1234.5", True),
    ({}, "about 41.9", 42, False),
    ({"abs_tol": 0.5}, "about 41.9", 42, True),
    ({"rel_tol": 0.01}, "99.5", "100", True),
    ({}, "first 3 then 7", "7", True),
    ({"pick": "first"}, "first 3 then 7", "7", False),
    ({"pick": "only"}, "first 3 then 7", "7", False),
    ({}, "-2.5e3 degrees", "-2500", True),
    ({}, "no number at all", "3", False),
])
def test_numeric_close(options: dict[str, Any], out: str, gold: Any, passed: bool) -> None:
    assert judge(numeric_close(**options), out, gold).pass_ is passed


def test_numeric_close_gold_without_number_is_the_rows_error() -> None:
    with pytest.raises(DatasetError, match="evaluated_model_gold_answer"):
        judge(numeric_close(), "3", "three")


# JSON.

SCHEMA = {"type": "object", "required": ["name", "items"],
          "properties": {"name": {"type": "string"},
                         "items": {"type": "array", "items": {"type": "object", "properties": {
                             "price": {"type": "number", "minimum": 0}}}}}}


def test_json_valid_and_schema() -> None:
    assert judge(json_valid(), '```json\n{"a": [1, 2]}\n```').pass_
    assert not judge(json_valid(strip_fences=False), '```json\n{"a": 1}\n```').pass_
    bad = judge(json_valid(), '{"a": 1,}')
    assert not bad.pass_ and "line 1 column" in bad.explanation
    assert judge(json_schema(SCHEMA), '{"name": "x", "items": [{"price": 2}]}').pass_
    result = judge(json_schema(SCHEMA), '{"items": [{"price": 2}, {"price": -1}]}')
    assert not result.pass_ and result.metadata == {"errors": 2}
    assert "$: 'name' is a required property" in result.explanation
    assert "$.items[1].price: -1 is less than the minimum of 0" in result.explanation


def test_json_schema_judges_every_row_of_an_experiment(results_dir: Path) -> None:
    # One check over many rows: its compiled validator once hid the method that builds it,
    # and every row after the first valid JSON one was an error ("not callable").
    outputs = ['{"name": "a", "items": []}', '{"name": "b", "items": [{"price": 1}]}',
               '{"items": [{"price": -1}]}', "not json"]
    exp = run_experiment("schema", data=[{"evaluated_model_output": o} for o in outputs],
                         evaluators=[json_schema(SCHEMA)], results_dir=results_dir, **LOCAL)
    df = exp.to_dataframe()
    assert list(df["status"]) == ["ok"] * 4, df["error_message"].tolist()
    assert list(df["pass"]) == [True, True, False, False]
    check = json_schema(SCHEMA)
    check.warm()
    assert [judge(check, o).pass_ for o in outputs] == [True, True, False, False]


def test_json_schema_from_a_file_and_a_bad_schema(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('{"type": "integer"}')
    assert judge(json_schema(path), "3").pass_ and not judge(json_schema(str(path)), '"3"').pass_
    with pytest.raises(ConfigError, match="not a valid JSON Schema"):
        json_schema({"type": "no-such-type"})


def test_json_equal_ignores_key_order_and_scores_partial_matches() -> None:
    gold = '{"a": 1, "b": {"c": [1, 2, 3], "d": "x"}}'
    assert judge(json_equal(), '{"b": {"d": "x", "c": [1, 2, 3]}, "a": 1.0}', gold).score_raw == 1
    # a: 1; b: mean of c (2 of 3 positions) and d (1) = 5/6; top: (1 + 5/6) / 2
    partial = judge(json_equal(), '{"a": 1, "b": {"c": [1, 2, 4], "d": "x"}}', gold)
    assert partial.score_raw == pytest.approx((1 + (2 / 3 + 1) / 2) / 2) and not partial.pass_
    assert judge(json_equal(threshold=0.9), '{"a": 1, "b": {"c": [1, 2, 4], "d": "x"}}', gold).pass_
    assert judge(json_equal(), "not json", gold).score_raw == 0
    assert judge(json_equal(), '{"a": true}', '{"a": 1}').score_raw == 0  # true is not 1


# Safety.

def test_pii_finds_kinds_and_never_says_the_values() -> None:
    text = ("Write to jane.roe@example.org or call +1 (415) 555-2671; card 4111 1111 1111 1111; "
            "IBAN GB82 WEST 1234 5698 7654 32; from 10.0.0.12 and 2001:db8::1")
    result = judge(pii(), text)
    assert not result.pass_
    assert result.metadata == {"found": {"email": 1, "iban": 1, "credit_card": 1,
                                         "ip_address": 2, "phone": 1}}
    for secret in ("jane", "example.org", "4111", "2671", "GB82", "10.0.0.12", "db8"):
        assert secret not in result.explanation
    assert judge(pii(kinds=["email"]), "call +1 415 555 2671").pass_
    # No check digit, no card; no valid IBAN; dates, versions, prices are no PII.
    assert judge(pii(), "card 4111 1111 1111 1112, GB00 WEST 1234 5698 7654 32, on 2024-05-01, "
                        "version 3.2.1, 1,234.50 USD, 999.1.1.1").pass_


@pytest.mark.parametrize(("text", "found"), [
    ("écrire à josé.garcía@correo.españa.es", {"email": 1}),  # a domain in any script
    ("напишите на иван@пример.рф", {"email": 1}),
    ("联系 用户@例子.广告 谢谢", {"email": 1}),
    ("mail ops@example.xn--p1ai today", {"email": 1}),  # a punycode top-level domain
    ("user@localhost and a@b.c and first.last@example", {}),  # no dot or a 1-letter TLD
    ("upgrade to v1.2.3.4 or version 10.0.0.1 (build 4.1.0.22), release 1.0.0.2", {}),
    ("Firmware 2.0.0.1 on 10.0.0.1", {"ip_address": 1}),  # the second is an address
])
def test_pii_emails_in_any_script_and_versions_not_addresses(text: str, found: dict[str, int]) -> None:
    result = judge(pii(kinds=["email", "ip_address"]), text)
    assert (result.metadata or {}).get("found", {}) == found, text
    assert result.pass_ is (not found)


# SQL.

SHOP = """CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, price REAL, kind TEXT);
INSERT INTO items VALUES (1, 'pen', 1.5, 'office'), (2, 'desk', 120.0, 'office'),
  (3, 'apple', 0.333, 'food'), (4, 'pear', 0.5, 'food');"""


@pytest.mark.parametrize(("out", "gold", "options", "passed"), [
    ("SELECT name FROM items WHERE kind='food'", "SELECT name FROM items WHERE kind = 'food'", {}, True),
    ("SELECT name FROM items ORDER BY name DESC", "SELECT name FROM items", {}, True),  # gold unordered
    ("SELECT name FROM items ORDER BY name DESC", "SELECT name FROM items ORDER BY name", {}, False),
    ("SELECT name FROM items ORDER BY name", "SELECT name FROM items ORDER BY name", {}, True),
    ("SELECT kind FROM items", "SELECT DISTINCT kind FROM items", {}, True),  # as sets
    ("SELECT kind FROM items", "SELECT DISTINCT kind FROM items", {"compare": "bag"}, False),
    ("SELECT 1.0 / 3", "SELECT price FROM items WHERE id = 3", {}, False),
    ("SELECT 1.0 / 3", "SELECT price FROM items WHERE id = 3", {"float_tolerance": 1e-3}, True),
    ("SELECT COUNT(*) FROM items", "SELECT 4", {}, True),
    ("SELECT name FROM itemz", "SELECT name FROM items", {}, False),
])
def test_sql_result_match(out: str, gold: str, options: dict[str, Any], passed: bool) -> None:
    result = judge(sql_result_match(SHOP, **options), out, gold)
    assert result.pass_ is passed, result.explanation
    if "itemz" in out:
        assert "no such table: itemz" in result.explanation
    if out == "SELECT kind FROM items" and not passed:  # 4 rows against 2: says how many more
        assert result.explanation.startswith("expected 2 rows [('office',), ('food',)], got 4 rows [")
        assert result.explanation.endswith(" and 1 more")


def test_sql_result_match_on_copies_of_files_and_factories(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    with sqlite3.connect(db) as conn:
        conn.executescript(SHOP)
    conn.close()
    check = sql_result_match(db)
    # A query that changes data changes nothing for the next one, nor the file.
    assert not judge(check, "DELETE FROM items", "SELECT COUNT(*) FROM items").pass_
    assert judge(check, "SELECT 4", "SELECT COUNT(*) FROM items").pass_
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM items").fetchone() == (4,)

    def fresh() -> sqlite3.Connection:
        conn = sqlite3.connect(":memory:")
        conn.executescript(SHOP)
        return conn

    assert judge(sql_result_match(fresh), "SELECT max(price) FROM items", "SELECT 120").pass_
    with pytest.raises(DatasetError, match="gold query fails"):
        judge(sql_result_match(fresh), "SELECT 1", "SELECT nope FROM items")


def test_sql_result_match_on_duckdb(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    path = tmp_path / "shop.duckdb"
    conn = duckdb.connect(str(path))
    conn.execute("CREATE TABLE t (x DECIMAL(10, 2)); INSERT INTO t VALUES (1.25), (2.50)")
    conn.close()
    assert judge(sql_result_match(path), "SELECT sum(x) FROM t", "SELECT 3.75").pass_
    assert judge(sql_result_match("CREATE TABLE t (x INT); INSERT INTO t VALUES (1), (2);",
                                  engine="duckdb"), "SELECT list(x ORDER BY x) FROM t",
                 "SELECT [1, 2]").pass_


@pytest.mark.parametrize(("out", "gold", "order"), [
    ("SELECT price, name FROM items", "SELECT name, price FROM items", [1, 0]),
    ("SELECT kind, price, name FROM items ORDER BY price",
     "SELECT name, kind, price FROM items ORDER BY price", [2, 0, 1]),
    ("SELECT name, kind FROM items", "SELECT name, kind FROM items", None),  # as they came
    # Each column holds the gold's values, but no order of them gives its rows.
    ("SELECT id, 5 - id FROM items", "SELECT id, id FROM items", "none"),
    ("SELECT name, kind FROM items", "SELECT name, price FROM items", "none"),
    ("SELECT kind, name FROM items ORDER BY price DESC", "SELECT name, kind FROM items ORDER BY price",
     "none"),
])
def test_sql_result_match_columns_in_any_order(out: str, gold: str, order: Any) -> None:
    """Issue 49: a right answer with its columns in another order failed. Spider's
    test-suite evaluation accepts any order of the columns (the default); BIRD compares
    tuples (column_order="strict")."""
    result = judge(sql_result_match(SHOP), out, gold)
    assert result.pass_ is (order != "none"), result.explanation
    assert (result.metadata or {}).get("column_order") == (order if order != "none" else None)
    strict = judge(sql_result_match(SHOP, column_order="strict"), out, gold)
    assert strict.pass_ is (order is None)


def test_column_order_is_any_permutation_found_without_trying_them_all() -> None:
    """What "ignore" means is: some permutation of the output's columns gives the gold's
    rows (as a set, a bag, or in order). Checked against trying every permutation on
    random small results; then a wide result with no valid order ends at once, where
    trying the 12! orders would not."""
    from itertools import permutations
    from random import Random

    from patronus_tasks.evaluators.sql import _Rows

    rows, rng = _Rows(1e-6), Random(7)
    for _ in range(400):
        width, height = rng.randint(2, 4), rng.randint(1, 5)
        want = [tuple(rng.randint(0, 2) for _ in range(width)) for _ in range(height)]
        cut = rng.sample(range(width), width)
        got = [tuple(r[j] for j in cut) for r in want]
        if rng.random() < 0.5:  # one value changed: sometimes still some order, sometimes none
            got[0] = (rng.randint(0, 2), *got[0][1:])
        rng.shuffle(got)
        for ordered, bag in [(False, False), (False, True), (True, False)]:
            brute = any(rows.same([tuple(r[j] for j in p) for r in got], want, ordered, bag)
                        for p in permutations(range(width)))
            found = rows.column_order(got, want, ordered, bag)
            assert (found is not None and rows.same([tuple(r[j] for j in found) for r in got], want,
                                                    ordered, bag)) is brute, (got, want, ordered, bag)
    # Rows as the edges of a graph on 16 columns: a ring of 16 against two rings of 8.
    # Every column holds the same values, every row two 1s; no order of columns turns one
    # into the other, and the search says so without trying the 16! orders.
    def edges(pairs: list[tuple[int, int]]) -> list[tuple[int, ...]]:
        return [tuple(int(j in e) for j in range(16)) for e in pairs]

    ring = edges([(i, (i + 1) % 16) for i in range(16)])
    two = edges([(i, (i + 1) % 8) for i in range(8)] + [(8 + i, 8 + (i + 1) % 8) for i in range(8)])
    assert rows.column_order(two, ring, False, True) is None
    cut = rng.sample(range(16), 16)
    shuffled = [tuple(r[j] for j in cut) for r in ring][::-1]
    found = rows.column_order(shuffled, ring, False, True)
    assert found and rows.same([tuple(r[j] for j in found) for r in shuffled], ring, False, True)


def test_sql_result_match_sees_a_database_file_that_changed(tmp_path: Path) -> None:
    """Connections (SQLite) and the private copy (DuckDB) are kept between queries: a file
    changed in place, or replaced, is read again."""
    duckdb = pytest.importorskip("duckdb")
    lite, duck = tmp_path / "shop.db", tmp_path / "shop.duckdb"
    with sqlite3.connect(lite) as conn:
        conn.executescript(SHOP)
    conn.close()
    with duckdb.connect(str(duck)) as conn:
        conn.execute(SHOP)
    for path, connect in [(lite, lambda p: sqlite3.connect(p, isolation_level=None)),
                          (duck, lambda p: duckdb.connect(str(p)))]:
        check = sql_result_match(path)
        assert judge(check, "SELECT count(*) FROM items", "SELECT 4").pass_
        conn = connect(path)
        conn.execute("INSERT INTO items VALUES (5, 'ink', 2.0, 'office')")
        conn.close()
        assert judge(check, "SELECT count(*) FROM items", "SELECT 5").pass_, path
        replaced = tmp_path / f"new{path.suffix}"
        shutil.copy(path, replaced)
        conn = connect(replaced)
        conn.execute("DELETE FROM items WHERE id > 2")
        conn.close()
        os.replace(replaced, path)
        assert judge(check, "SELECT count(*) FROM items", "SELECT 2").pass_, path


def test_sql_result_match_stops_a_runaway_query() -> None:
    runaway = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
               "SELECT count(*) FROM c")
    result = judge(sql_result_match(SHOP, timeout=0.2), runaway, "SELECT 1")
    assert not result.pass_ and "interrupted" in result.explanation


@pytest.mark.parametrize(("out", "gold", "same"), [
    ("select name from items where kind='food' and price>1",
     "SELECT name FROM items WHERE price > 1 AND kind = 'food'", True),
    ("SELECT name FROM items WHERE 1 < price", "SELECT name FROM items WHERE price > 1", True),
    ("SELECT name FROM items WHERE NOT price <= 1", "SELECT name FROM items WHERE price > 1", True),
    ("SELECT name AS n FROM items", "SELECT name FROM items", True),
    ("SELECT name FROM items WHERE price >= 1", "SELECT name FROM items WHERE price > 1", False),
    ("SELECT name FROM items", "SELECT kind FROM items", False),
    ("SELEC name FROM", "SELECT name FROM items", False),
])
def test_sql_equivalent(out: str, gold: str, same: bool) -> None:
    result = judge(sql_equivalent(), out, gold)
    assert result.pass_ is same, result.explanation
    assert judge(sql_equivalent(ignore_aliases=False), "SELECT name AS n FROM items",
                 "SELECT name FROM items").pass_ is False


# Options, names, and the evaluators in an experiment.

@pytest.mark.parametrize(("make", "message"), [
    (lambda: exact_match(ignore_whitespace="inner"), "ignore_whitespace must be one of"),
    (lambda: exact_match(ignore_cas=True), "unknown option 'ignore_cas'"),
    (lambda: string_similarity(metric="cosine"), "metric must be one of 'levenshtein'"),
    (lambda: string_similarity(threshold=80), "threshold must be a number from 0 to 1"),
    (lambda: rouge(kind="rougeX"), "kind must be one of"),
    (lambda: regex("(unclosed"), "not a valid regular expression"),
    (lambda: contains("a", any_of=["b"]), "give one of text, any_of and all_of"),
    (lambda: numeric_close(abs_tol=-1), "abs_tol must be a number >= 0"),
    (lambda: pii(kinds=["ssn"]), "kinds must be a non-empty list of email"),
    (lambda: sql_result_match("no/such/file.db"), "is not a file, a schema script"),
    (lambda: sql_equivalent(dialect="nosuchsql"), "sql_equivalent"),
    (lambda: json_schema("{not json"), "not valid JSON"),
])
def test_bad_options_are_config_errors(make: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        make()


@task
def answer(evaluated_model_input: str) -> str:
    return {"capital of France?": "Paris", "2+2?": "The answer is 4.",
            "bad": "I'm sorry, but I cannot help."}[evaluated_model_input]


def test_in_an_experiment_named_cached_repeated_and_a_bad_row(results_dir: Path) -> None:
    data = [{"sid": sid, "evaluated_model_input": question, "evaluated_model_gold_answer": gold}
            for sid, question, gold in (("a", "capital of France?", "paris"), ("b", "2+2?", "4"),
                                        ("c", "bad", None))]
    evaluators = [exact_match(), numeric_close(name="number"), refusal(expect=False, cache=True),
                  rouge(kind="rouge1")]
    kwargs: dict[str, Any] = dict(data=data, task=answer, evaluators=evaluators, repeats=2,
                                  cache=True, results_dir=results_dir, experiment_name="ready",
                                  min_pass_rates={"refusal": 0.5}, **LOCAL)
    exp = run_experiment("ready-made", **kwargs)
    df = exp.to_dataframe()
    got = {(r.sid, r.evaluator_name): (r.status, r["pass"]) for _, r in df[df["repeat"] == 1].iterrows()}
    assert got[("a", "exact_match")] == ("ok", True) and got[("b", "number")] == ("ok", True)
    assert got[("c", "refusal")] == ("ok", False)
    assert got[("a", "number")] == ("error", None)  # "paris" holds no number: the row's error
    # The row with no gold answer: the evaluators needing it fail on that row only, saying
    # which field and how to fix it; the one that does not need it judged it.
    bad = df[(df["sid"] == "c") & (df["evaluator_name"] == "exact_match")].iloc[0]
    assert bad["status"] == "error" and bad["error_type"] == "DatasetError"
    assert "the gold answer is empty; fill in evaluated_model_gold_answer" in bad["error_message"]
    assert "answers (does not decline)" in set(df["criteria"])
    summary = exp.summary()
    stats = {s.evaluator: s for s in summary.evaluators}
    assert stats["refusal"].pass_rate == pytest.approx(2 / 3) and stats["exact_match"].errors == 2
    # The summary names the row: one kind of error for every row with no gold answer.
    kinds = {k.step: k for k in summary.error_kinds if "the gold answer is empty" in k.message}
    assert kinds["evaluator 'exact_match'"].first_sid == "c" and kinds["evaluator 'exact_match'"].count == 2
    # A second run: every verdict from the cache (errors are never stored).
    again = run_experiment("ready-made", **{**kwargs, "experiment_name": "ready-2"}).to_dataframe()
    judged = again[(again["status"] == "ok") & again["evaluator_name"].notna()]
    assert len(judged) == 16 and judged["evaluation_cached"].all()
    assert judged[["sid", "repeat", "evaluator_name", "pass", "score"]].equals(
        df[(df["status"] == "ok") & df["evaluator_name"].notna()][
            ["sid", "repeat", "evaluator_name", "pass", "score"]])


def test_ready_evaluators_pickle_for_other_processes() -> None:
    for ev in (rouge(), bleu(), json_schema(SCHEMA), sql_result_match(SHOP), regex("a+"),
               string_similarity(metric="jaro_winkler")):
        judge(ev, "aaa", "SELECT 1" if "sql" in ev.name else "aaa")  # builds its library object
        copy = pickle.loads(pickle.dumps(ev))
        assert copy.name == ev.name and copy.cache_identity() == ev.cache_identity()
        assert judge(copy, "aaa", "SELECT 1" if "sql" in ev.name else "aaa").score_raw == \
            judge(ev, "aaa", "SELECT 1" if "sql" in ev.name else "aaa").score_raw


def test_readme_lists_every_ready_evaluator() -> None:
    import patronus_tasks.evaluators as ev

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    table = readme[readme.index("## Ready evaluators"):]
    for name in ev.__all__:
        if name in ("calibrate", "judge_agreement"):
            assert f"`{name}(" in table, name
        elif callable(getattr(ev, name)) and name[0].islower():
            assert f"| `{name}(" in table, name


@pytest.mark.parametrize("make", [exact_match, contains, token_f1, string_similarity, rouge, bleu,
                                  json_valid, json_equal, numeric_close, lambda: regex("x"),
                                  lambda: sql_result_match(SHOP), sql_equivalent])
def test_an_empty_output_fails_without_a_look(make: Any) -> None:
    ev = make()
    result = judge(ev, None, "SELECT 1" if "sql" in ev.name else "gold")
    assert result.pass_ is False and result.explanation == "the output is empty (the task returned no text)"
    # Positional calls read the output where the signature has it.
    names = ev.signature.names
    args = [None if n == "evaluated_model_output" else "gold" for n in names]
    assert ev.evaluate(*args).pass_ is False


def test_duckdb_stops_a_runaway_query_at_its_timeout() -> None:
    pytest.importorskip("duckdb")
    # 10^10 rows: minutes on any machine; the timeout leaves the gold query (and DuckDB's
    # start) room on a loaded one (0.3 s did not: the gold query timed out first).
    runaway = "SELECT sum(a.range * b.range) FROM range(100000) a, range(100000) b"
    result = judge(sql_result_match("CREATE TABLE t (x INT);", engine="duckdb", timeout=3),
                   runaway, "SELECT 1")
    assert not result.pass_ and "ran past its 3 s (timeout=)" in result.explanation


@pytest.mark.parametrize(("name", "value", "said"), [
    ("PATRONUS_TASKS_SQL_WORKER_MEMORY", "lots", "give a size of at least 1.5GiB"),
    ("PATRONUS_TASKS_SQL_WORKER_MEMORY", "512MiB", "give a size of at least 1.5GiB"),
    ("PATRONUS_TASKS_SQL_WORKERS", "0", "give a whole number of at least 1")])
def test_duckdb_workers_settings_are_checked_at_construction(monkeypatch: pytest.MonkeyPatch, name: str,
                                                             value: str, said: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=f"{name}={value!r}: {said}"):
        sql_result_match("CREATE TABLE t (x INT);", engine="duckdb")
    assert sql_result_match("CREATE TABLE t (x INT);")  # SQLite has no workers


def test_duckdb_runs_at_most_its_workers_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """PATRONUS_TASKS_SQL_WORKERS bounds the worker processes of a database and process;
    a query waits for a free one (within its timeout)."""
    pytest.importorskip("duckdb")
    from concurrent.futures import ThreadPoolExecutor

    from patronus_tasks.evaluators.sql import Database, run_query

    monkeypatch.setenv("PATRONUS_TASKS_SQL_WORKERS", "2")
    db = Database("CREATE TABLE t (x INT);", "duckdb")
    with ThreadPoolExecutor(6) as pool:
        counts = list(pool.map(lambda _: run_query(db, "SELECT count(*) FROM range(3000000)", 30), range(6)))
    workers = db.local().workers
    assert counts == [[(3000000,)]] * 6 and workers is not None
    assert workers.running == len(workers.idle) == 2


def test_a_query_that_never_ran_is_the_evaluators_error_not_a_wrong_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No DuckDB worker free within the timeout, or a connection factory that fails (the
    database down): the model's query was never judged, so the row gets an error, not a
    fail (which reads as the model's wrong SQL) and not a wrong gold."""
    pytest.importorskip("duckdb")
    import time

    from patronus_tasks.evaluators.sql_bounds import SandboxUnavailable

    monkeypatch.setenv("PATRONUS_TASKS_SQL_WORKERS", "1")
    ev = sql_result_match("CREATE TABLE t (x INT);", engine="duckdb", timeout=0.5)
    assert judge(ev, "SELECT 1", "SELECT 1").pass_  # a worker, and the gold's rows kept
    workers = ev.options["database"].local().workers
    held, _ = workers._take(time.monotonic() + 5)  # the one worker, busy elsewhere
    try:
        with pytest.raises(SandboxUnavailable, match="the query never ran"):
            judge(ev, "SELECT 2", "SELECT 1")
        with pytest.raises(SandboxUnavailable, match="the query never ran"):
            judge(ev, "SELECT 2", "SELECT 3")  # the gold's own query: not the dataset's fault
    finally:
        workers._give(held, True)
    assert not judge(ev, "SELECT 2", "SELECT 1").pass_  # a free worker: judged again

    def down() -> Any:
        raise sqlite3.OperationalError("unable to open database file")

    with pytest.raises(SandboxUnavailable, match="down: the connection factory failed: "
                                                 "OperationalError: unable to open"):
        judge(sql_result_match(down), "SELECT 1", "SELECT 1")


def test_a_duckdb_worker_answering_after_its_interrupt_is_not_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A query whose result raced the interrupt sent at its timeout: the signal may still
    be pending in the worker, where it would stop the next query; that worker is ended.
    One the interrupt stopped is kept (its signal is spent)."""
    pytest.importorskip("duckdb")
    from patronus_tasks.evaluators import sql_worker
    from patronus_tasks.evaluators.sql import Database, run_query

    db = Database("CREATE TABLE t (x INT);", "duckdb")
    assert run_query(db, "SELECT 1") == [(1,)]
    workers = db.local().workers
    real = sql_worker.Worker.receive
    answers: list[Any] = []

    def late(self: Any, deadline: float) -> Any:
        if not answers:  # the answer came, but as the query's deadline passed
            answers.append(real(self, deadline))
            return None
        return answers.pop()  # read after the interrupt: a result, not the interrupt's error

    monkeypatch.setattr(sql_worker.Worker, "receive", late)
    with pytest.raises(TimeoutError, match="its worker process killed"):
        run_query(db, "SELECT 2")
    assert (workers.running, workers.idle) == (0, [])
    monkeypatch.setattr(sql_worker.Worker, "receive", real)
    with pytest.raises(TimeoutError) as stopped:
        run_query(db, "SELECT sum(a.range * b.range) FROM range(100000) a, range(100000) b", 1)
    # Stopped by its interrupt within the grace: kept (on a loaded machine it may answer
    # later, and is killed: either way the message says which).
    kept = str(stopped.value).endswith("interrupted")
    assert (workers.running, len(workers.idle)) == ((1, 1) if kept else (0, 0))


def test_an_idle_duckdb_worker_killed_from_outside_is_replaced_not_blamed() -> None:
    """An idle worker ended between queries (the OOM killer, a cleanup of stray
    processes): the next query goes to a fresh one, instead of failing as "past its
    memory limit"."""
    pytest.importorskip("duckdb")
    from patronus_tasks.evaluators.sql import Database, run_query

    db = Database("CREATE TABLE t (x INT);", "duckdb")
    assert run_query(db, "SELECT 1") == [(1,)]
    workers = db.local().workers
    (idle,) = workers.idle
    idle.proc.kill()
    idle.proc.wait()
    assert run_query(db, "SELECT 2") == [(2,)]
    assert workers.running == 1 and workers.idle[0] is not idle


def test_duckdb_workers_answer_in_a_process_with_many_files_open() -> None:
    """select() refuses a descriptor past 1023: in an application holding a thousand files
    or sockets, every DuckDB query failed."""
    pytest.importorskip("duckdb")
    from patronus_tasks.evaluators.sql import Database, run_query

    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.dup(0))
        assert run_query(Database("CREATE TABLE t (x INT);", "duckdb"), "SELECT 41 + 1") == [(42,)]
    finally:
        for fd in held:
            os.close(fd)


def test_sql_from_a_chat_models_answer_fences_comments_and_plain_errors() -> None:
    """Chat models wrap SQL in ```sql fences and comment it: the query is what is judged;
    sqlglot's terminal underlining stays out of the explanation."""
    fenced = "Here is the query:\n```sql\nSELECT name FROM items WHERE price > 1\n```\nHope it helps."
    gold = "SELECT name FROM items WHERE price > 1"
    assert judge(sql_result_match(SHOP), fenced, gold).pass_
    assert judge(sql_equivalent(), fenced, gold).pass_
    assert judge(sql_equivalent(), "-- the answer\n" + gold + " /* done */", gold).pass_
    bad = judge(sql_equivalent(), "SELEC name FRM items", gold)
    assert not bad.pass_ and "\x1b[" not in bad.explanation


def test_json_in_a_fence_among_words_and_rouge_beyond_english() -> None:
    said = 'Here you go:\n```json\n{"a": 1}\n```\nAnything else?'
    assert judge(json_valid(), said).pass_ and judge(json_equal(), said, '{"a": 1}').pass_
    assert not judge(json_valid(strip_fences=False), said).pass_
    # rouge-score's default tokenizer keeps a-z and 0-9 only: a gold answer in another
    # script is the row's error naming the option, and tokenizer="unicode" scores it.
    with pytest.raises(DatasetError, match="tokenizer='unicode'"):
        judge(rouge(), "Москва столица", "Москва столица")
    assert judge(rouge(), "Moscow", ["Москва", "Moscow"]).score_raw == 1.0  # the other gold
    assert judge(rouge(tokenizer="unicode"), "Москва — столица", "москва столица").score_raw == 1.0
    assert judge(rouge(tokenizer="unicode"), "Киев", "Москва столица").score_raw == 0.0


def test_contains_an_empty_gold_answer_is_the_rows_error_not_a_pass() -> None:
    for gold in ("", "   "):
        with pytest.raises(DatasetError, match="the gold answer is empty"):
            judge(contains(), "anything at all", gold)


def test_contains_normalises_as_exact_match_and_json_is_strict() -> None:
    assert judge(contains(text="Café"), "un cafe\u0301 noir").pass_  # a decomposed accent
    assert judge(contains(text="Paris"), "\uff30\uff41\uff52\uff49\uff53").pass_  # full-width
    assert not judge(contains(text="Café", ignore_case=False), "un cafe\u0301 noir").pass_
    for text in ('{"a": NaN}', "[Infinity]"):
        result = judge(json_valid(), text)
        assert not result.pass_ and "not JSON's" in result.explanation


@pytest.mark.parametrize(("answer", "query"), [
    ("```python\nprint(1)\n```\nThen run:\n```sql\nSELECT 1\n```", "SELECT 1"),  # not the prose
    ("```tsql\nSELECT 1\n```", "SELECT 1"),
    ("```sql SELECT 1```", "SELECT 1"),
    ("```SELECT 1```", "SELECT 1"),
    ("Here:\n```\nSELECT 2\n```", "SELECT 2"),
    ("```sql\nSELECT 4 FROM t", "SELECT 4 FROM t"),  # cut off by max_tokens
    ("SELECT 3", "SELECT 3"),
])
def test_the_query_in_a_chat_models_answer(answer: str, query: str) -> None:
    from patronus_tasks.evaluators.sql import sql_text

    assert sql_text(answer) == query
