"""Well-typed but inconsistent records through select, close and compact (bench/fuzz/records.py makes
them), and bad JSONL rows through the data reader: never a traceback, never exit 0 with a changed
meaning. The validator's own messages are checked at the end."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridgecli.data.examples import DataOptions, iter_pairs
from bridgecli.errors import FormatError, InputError
from bridgecli.format import open_writer, read_all
from bridgecli.format.validate import check_example

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("fuzz_records", ROOT / "bench" / "fuzz" / "records.py")
fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), name=st.sampled_from(fuzz.NAMES))
def test_inconsistent_records_end_in_exit_3(tmp_path, seed, name):
    case = fuzz.run_case(seed, name, tmp_path)
    assert fuzz.contained(case), case


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), stage=st.sampled_from(["scores", "selection", "closure"]))
def test_consistent_streams_pass(tmp_path, seed, stage):
    """The other half: what the real steps make is never refused (no false alarms)."""
    import random

    examples = fuzz.consistent_stream(random.Random(seed), stage)
    path = tmp_path / f"{seed}.bridge"
    with open_writer(path, msgspec.structs.replace(fuzz.HEADER, stage=stage)) as writer:
        for ex in examples:
            writer.write(ex)
    header, back = read_all(path)
    assert back == examples


def test_every_mutation_is_exercised(tmp_path):
    for k, name in enumerate(fuzz.NAMES):
        case = fuzz.run_case(k, name, tmp_path)
        assert fuzz.contained(case), case


def test_bench_reports_its_count(tmp_path, capsys):
    summary = fuzz.main(["--cases", str(len(fuzz.NAMES)), "-o", str(tmp_path / "fuzz.json")])
    assert summary["cases"] == len(fuzz.NAMES) and summary["failures"] == 0
    assert summary["outcomes"] == {"exit 3": summary["command_runs"]}
    assert f"{len(fuzz.NAMES)} cases" in capsys.readouterr().out
    assert json.loads((tmp_path / "fuzz.json").read_text())["cases"] == len(fuzz.NAMES)


# -- the validator's messages -------------------------------------------------------------------------

@pytest.mark.parametrize("name, field", [
    ("kinds_short", "tokens.kinds"), ("a_dtype_object", "scores.a"), ("A_transposed", "scores.A"),
    ("b_r_huge", "selection.b_r"), ("units_odd", "closure.units"), ("supervise_out_of_range", "closure.supervise"),
    ("selection_missing", "selection"), ("offsets_short", "tokens.offsets"),
])
def test_messages_name_the_record_and_field(tmp_path, name, field):
    header, examples, stage = fuzz.broken_stream(3, name)
    path = tmp_path / "s.bridge"
    with open_writer(path, header) as writer:
        for ex in examples:
            writer.write(ex)
    with pytest.raises(FormatError) as info:
        read_all(path)
    message = str(info.value)
    assert message.startswith(f"{path}, record ") and f"field '{field}'" in message and "\n" not in message
    assert info.value.exit_code == 3


def test_duplicate_ids_and_unknown_stage(tmp_path):
    for name, text in (("duplicate_id", "duplicate id"), ("stage_unknown", "unknown stage")):
        header, examples, _ = fuzz.broken_stream(11, name)
        path = tmp_path / f"{name}.bridge"
        with open_writer(path, header) as writer:
            for ex in examples:
                writer.write(ex)
        with pytest.raises(FormatError, match=text):
            read_all(path)


def test_check_example_on_its_own():
    import random

    ex = fuzz.consistent_stream(random.Random(0), "closure")[0]
    check_example(ex, "closure")
    with pytest.raises(FormatError, match="field 'closure.alpha'"):
        check_example(msgspec.structs.replace(ex, closure=msgspec.structs.replace(ex.closure, alpha=2.0)), "closure")


# -- bad JSONL rows -------------------------------------------------------------------------------------

_value = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=3), max_leaves=6)
_line = st.one_of(
    st.binary(max_size=40).filter(lambda b: b"\n" not in b and b"\r" not in b),
    _value.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(["prompt", "response", "instruction", "output", "messages", "input", "id"]),
                    _value, max_size=4).map(lambda d: json.dumps(d).encode()),
)


def _read_all_or_one_line_error(path) -> None:
    """Every pair of ``path`` reads, or reading stops with one InputError line that names the file."""
    try:
        for _ in iter_pairs(path, DataOptions()):
            pass
    except InputError as err:
        message = str(err)
        assert message.startswith(str(path)) and "\n" not in message


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(_line, min_size=1, max_size=5))
def test_bad_jsonl_rows_give_one_input_error(tmp_path, lines):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    _read_all_or_one_line_error(path)


_column = st.one_of(
    st.lists(st.none() | st.text(max_size=6), min_size=1, max_size=4),
    st.lists(st.integers(-5, 5), min_size=1, max_size=4),
    st.lists(st.lists(st.integers(0, 3), max_size=2), min_size=1, max_size=4),
    st.lists(st.floats(allow_nan=True), min_size=1, max_size=4),
    st.lists(st.dictionaries(st.sampled_from(["role", "content"]), st.text(max_size=4), max_size=2), min_size=1,
             max_size=4),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(columns=st.dictionaries(st.sampled_from(["prompt", "response", "instruction", "output", "messages", "id"]),
                               _column, min_size=1, max_size=3))
def test_bad_parquet_rows_give_one_input_error(tmp_path, columns):
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = min(len(v) for v in columns.values())
    path = tmp_path / "rows.parquet"
    try:
        pq.write_table(pa.table({k: v[:n] for k, v in columns.items()}), path)
    except pa.lib.ArrowException:
        return  # not a file pyarrow can write: nothing to read
    _read_all_or_one_line_error(path)
