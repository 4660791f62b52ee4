"""Data shapes and file readers: recognised shapes, overrides, and one-line errors that name
the file, the record and the field."""

from __future__ import annotations

import gzip
import json

import pytest

from bridgecli.data.examples import DataOptions, Report, iter_examples
from bridgecli.data.shapes import to_pair
from bridgecli.data.sources import read_records
from bridgecli.errors import InputError


@pytest.mark.parametrize("rec,shape,prompt,response", [
    ({"prompt": "P", "response": "R"}, "prompt-response", "P", "R"),
    ({"prompt": "P", "completion": "R"}, "prompt-response", "P", "R"),
    ({"prompt": [{"role": "user", "content": "P"}], "completion": [{"role": "assistant", "content": "R"}]},
     "prompt-response", "P", "R"),
    ({"messages": [{"role": "user", "content": "P"}, {"role": "assistant", "content": "R"}]}, "chat", "P", "R"),
    ({"conversations": [{"from": "human", "value": "P"}, {"from": "gpt", "value": "R"}]}, "chat", "P", "R"),
    ({"instruction": "I", "input": "X", "output": "R"}, "alpaca", "I\n\nX", "R"),
    ({"instruction": "I", "input": "", "output": "R"}, "alpaca", "I", "R"),
    ({"question": "Q", "answer": "A"}, "gsm8k", "Q", "A"),
    ({"problem": "Q", "solution": "A"}, "math", "Q", "A"),
])
def test_shapes(rec, shape, prompt, response):
    pair = to_pair(rec, 3, "line 4", "f.jsonl")
    assert pair.shape == shape
    assert pair.messages[-1]["content"] == prompt
    assert pair.response == response
    assert pair.id == "3"


def test_id_field_and_overrides():
    pair = to_pair({"id": "abc", "q": "Q", "a": "A"}, 0, "line 1", "f", prompt_field="q", response_field="a")
    assert (pair.id, pair.messages[0]["content"], pair.response) == ("abc", "Q", "A")


@pytest.mark.parametrize("rec,field", [
    ({"foo": 1}, None),
    ({"question": "Q", "answer": 3}, "answer"),
    ({"question": "Q", "answer": "  "}, "answer"),
    ({"messages": [{"role": "user", "content": "P"}]}, "messages[0].role"),
    ({"messages": [{"role": "wizard", "content": "P"}, {"role": "assistant", "content": "R"}]}, "messages[0].role"),
])
def test_shape_errors_name_record_and_field(rec, field):
    with pytest.raises(InputError) as exc:
        to_pair(rec, 0, "line 7", "data.jsonl")
    msg = str(exc.value)
    assert msg.startswith("data.jsonl, line 7")
    if field:
        assert f"field '{field}'" in msg
    assert "\n" not in msg


def test_jsonl_bad_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"question": "a", "answer": "b"}\n\n{not json}\n')
    with pytest.raises(InputError) as exc:
        list(read_records(p))
    assert str(exc.value).startswith(f"{p}, line 3: invalid JSON")


def test_readers_agree(tmp_path):
    import datasets

    rows = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(5)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with gzip.open(tmp_path / "d.jsonl.gz", "wt") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "d.json").write_text(json.dumps({"data": rows}))
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "saved_dict"))
    for name in ("d.jsonl", "d.jsonl.gz", "d.json", "d.parquet", "saved", "saved_dict"):
        got = [rec for _, rec in read_records(tmp_path / name)]
        assert got == rows, name


def test_unknown_format(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("a,b\n")
    with pytest.raises(InputError, match="unknown data format"):
        list(read_records(p))


def test_iter_examples_limits_and_reports(tmp_path, tokenizer):
    rows = [{"question": "q" * (1 + 40 * (i == 2)), "answer": "a"} for i in range(5)]
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = Report()
    exs = list(iter_examples(p, tokenizer, DataOptions(max_length=40, limit=4, exclude_ids=frozenset({"1"})), report))
    assert [e.id for e in exs] == ["0", "3"]
    assert report.excluded == 1 and report.too_long == ["2"] and report.read == 4
