"""Datasets and rows: every accepted input, field mapping, sample ids, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from patronus_tasks import DatasetError, Row, load_dataset, read_csv, read_jsonl

DATASETS = Path(__file__).resolve().parent.parent / "datasets"
RECORDS = [
    {"evaluated_model_input": "q1", "language": "sql", "n": 1},
    {"evaluated_model_input": "q2", "language": "text", "n": 2},
]


def _inputs(ds) -> list[str]:  # type: ignore[no-untyped-def]
    return [r.evaluated_model_input for r in ds.rows()]


def test_every_input_form_gives_the_same_rows(tmp_path: Path) -> None:
    df = pd.DataFrame(RECORDS)
    df.to_csv(tmp_path / "d.csv", index=False)
    df.to_parquet(tmp_path / "d.parquet")
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in RECORDS) + "\n")
    for data in (RECORDS, df, tmp_path / "d.csv", str(tmp_path / "d.jsonl"), tmp_path / "d.parquet"):
        ds = load_dataset(data)
        assert _inputs(ds) == ["q1", "q2"], data
        assert [r.sid for r in ds.rows()] == ["1", "2"]
        assert [r.language for r in ds.rows()] == ["sql", "text"]


def test_row_is_a_series_with_field_properties() -> None:
    row = next(load_dataset([{"evaluated_model_input": "hi", "sid": 7, "extra": None}]).rows())
    assert isinstance(row, Row) and isinstance(row, pd.Series)
    assert row.sid == "7" and row.evaluated_model_input == "hi"
    assert row.evaluated_model_output is None and row.evaluated_model_gold_answer is None
    assert row["extra"] is None and row.extra is None
    with pytest.raises(AttributeError):
        _ = row.no_such_column


def test_field_mapping_like_the_reference_sdk(tmp_path: Path) -> None:
    path = tmp_path / "qa.csv"
    path.write_text("id,question,answer,note\na,What?,NA,\nb,Why?,because,x\n")
    ds = read_csv(path, sid_field="id", evaluated_model_input_field="question",
                  evaluated_model_gold_answer_field="answer")
    rows = list(ds.rows())
    assert [r.sid for r in rows] == ["a", "b"]
    assert rows[0].evaluated_model_input == "What?"
    assert rows[0].evaluated_model_gold_answer == "NA"  # text, not a missing value
    assert rows[0].note is None  # an empty cell is missing
    jl = tmp_path / "qa.jsonl"
    jl.write_text('{"q": "x", "ctx": ["a", "b"]}\n\n{"q": "y", "ctx": []}\n')
    ds2 = read_jsonl(jl, evaluated_model_input_field="q",
                     evaluated_model_retrieved_context_field="ctx")
    first = next(ds2.rows())
    assert first.evaluated_model_input == "x" and first.evaluated_model_retrieved_context == ["a", "b"]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing.csv", "no such dataset file"),
        (lambda p: (p / "d.xlsx").write_text("x") and p / "d.xlsx", "unknown dataset format '.xlsx'"),
        (lambda p: (p / "e.csv").write_text("a,b\n") and p / "e.csv", "is empty"),
        (lambda p: (p / "bad.jsonl").write_text('{"a": 1}\n{oops\n') and p / "bad.jsonl",
         "bad.jsonl:2: not valid JSON"),
        (lambda p: (p / "dup.csv").write_text("sid,x\n1,a\n1,b\n") and p / "dup.csv",
         "duplicate sample ids ['1']"),
        (lambda p: (p / "nosid.csv").write_text("sid,x\n1,a\n,b\n") and p / "nosid.csv",
         "rows at positions [1] have no 'sid'"),
    ],
)
def test_bad_datasets_say_what_and_where(tmp_path: Path, make, message: str) -> None:  # type: ignore[no-untyped-def]
    path = make(tmp_path)
    with pytest.raises(DatasetError) as err:
        load_dataset(path)
    assert message in str(err.value)
    if "missing" not in str(path):
        assert str(path.name) in str(err.value)


def test_bad_mappings_and_inputs() -> None:
    with pytest.raises(DatasetError, match="no column 'question'"):
        read_jsonl(DATASETS / "text_to_sql.jsonl", evaluated_model_input_field="question")
    with pytest.raises(DatasetError, match="unknown field mapping"):
        read_jsonl("x.jsonl", input_field="q")
    with pytest.raises(DatasetError, match="not int"):
        load_dataset(3)  # type: ignore[arg-type]
    with pytest.raises(DatasetError, match="is empty"):
        load_dataset([])


def test_content_hash_tracks_content() -> None:
    a, b = load_dataset(RECORDS), load_dataset(RECORDS)
    c = load_dataset([{**RECORDS[0], "n": 9}, RECORDS[1]])
    assert a.content_hash() == b.content_hash() != c.content_hash()


def test_a_csv_cell_holding_a_json_list_of_passages_is_that_list(tmp_path: Path) -> None:
    """As a JSON Lines file and the SDK 0.1.x's read_csv give it: a RAG evaluator moved
    from JSONL to CSV must not get ``ctx[0] == '['``; a plain passage stays a str."""
    path = tmp_path / "rag.csv"
    pd.DataFrame({"q": ["a", "b", "c"],
                  "ctx": ['["Paris is in France.", "France is in Europe."]', "one passage",
                          "[not json"]}).to_csv(path, index=False)
    rows = list(read_csv(path, evaluated_model_input_field="q",
                         evaluated_model_retrieved_context_field="ctx").rows())
    assert [r.evaluated_model_retrieved_context for r in rows] == [
        ["Paris is in France.", "France is in Europe."], "one passage", "[not json"]
    assert next(load_dataset(str(path)).rows())["ctx"].startswith("[")  # other columns: as read


def test_a_mistyped_row_attribute_and_a_missing_file_say_what_there_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = next(load_dataset([{"evaluated_model_input": "x", "topic": "t"}]).rows())
    with pytest.raises(AttributeError, match="no column 'evaluated_model_inptu'; its columns: "
                                             "evaluated_model_input, topic, sid"):
        _ = row.evaluated_model_inptu
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetError, match=f"looked for {tmp_path.resolve() / 'data' / 'qa.jsonl'}"):
        load_dataset("data/qa.jsonl")


def test_a_csv_list_of_non_texts_is_not_a_list_of_passages(tmp_path: Path) -> None:
    path = tmp_path / "ctx.csv"
    pd.DataFrame({"evaluated_model_input": ["a"], "evaluated_model_retrieved_context": ["[1, 2]"]}
                 ).to_csv(path, index=False)
    assert next(read_csv(path).rows()).evaluated_model_retrieved_context == "[1, 2]"
