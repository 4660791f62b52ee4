"""Well-typed but inconsistent records (and bytes after the end record) through select, close and compact,
consistent streams at the format's numeric bounds through every selector (tests/fuzz_cases.py makes them;
bench/fuzz/records.py runs 10,000), and bad JSONL rows through the data reader: never a traceback, never
exit 0 with a changed meaning. The validator's own messages are checked at the end."""

from __future__ import annotations

import json
import random

import fuzz_cases as fuzz  # tests/fuzz_cases.py
import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridgecli.data.examples import DataOptions, iter_pairs
from bridgecli.errors import FormatError, InputError
from bridgecli.format import Array, open_writer, read_all
from bridgecli.format.spec import MAX_QUANTITY
from bridgecli.format.validate import check_example


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), name=st.sampled_from(fuzz.NAMES))
def test_inconsistent_records_end_in_exit_3(tmp_path, seed, name):
    case = fuzz.run_case(seed, name, tmp_path)
    assert fuzz.contained(case), case


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_streams_at_the_numeric_bounds_go_through_every_selector(tmp_path, seed):
    """Scores and references at +-2^48 (the format's bound): select with every selector, close and compact
    succeed, and what they write reads back (finite, within float32's range)."""
    case = fuzz.run_case(seed, fuzz.EXTREME, tmp_path)
    assert fuzz.contained(case), case


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), stage=st.sampled_from(["scores", "selection", "closure"]))
def test_consistent_streams_pass(tmp_path, seed, stage):
    """The other half: what the real steps make is never refused (no false alarms)."""
    examples = fuzz.consistent_stream(random.Random(seed), stage)
    path = tmp_path / f"{seed}.bridge"
    with open_writer(path, msgspec.structs.replace(fuzz.HEADER, stage=stage)) as writer:
        for ex in examples:
            writer.write(ex)
    header, back = read_all(path)
    assert back == examples


def test_every_mutation_is_exercised(tmp_path):
    for k, name in enumerate([*fuzz.NAMES, fuzz.EXTREME]):
        case = fuzz.run_case(k, name, tmp_path)
        assert fuzz.contained(case), case


def test_the_summary_counts_every_case(tmp_path):
    """What bench/fuzz/records.py records: every case counted, the outcomes of every command run."""
    cases = len(fuzz.NAMES) + 10
    summary = fuzz.run(cases, 0, tmp_path)
    assert summary["cases"] == cases and summary["failures"] == 0 and summary["tracebacks"] == 0
    assert sum(summary["per_mutation"].values()) == cases and summary["per_mutation"][fuzz.EXTREME] == cases // 10
    assert set(summary["per_mutation"]) == {*fuzz.NAMES, fuzz.EXTREME}
    assert set(summary["outcomes"]) == {"exit 0", "exit 3"} and sum(summary["outcomes"].values()) == summary[
        "command_runs"]
    # the failures are counted too: a case that cannot be contained
    broken = dict(fuzz.run_case(0, "kinds_short", tmp_path), outcomes={"select --method bridge": "exit 0"})
    assert not fuzz.contained(broken)


# -- the validator's messages -------------------------------------------------------------------------

@pytest.mark.parametrize("name, field", [
    ("kinds_short", "tokens.kinds"), ("a_dtype_object", "scores.a"), ("A_transposed", "scores.A"),
    ("b_r_huge", "selection.b_r"), ("units_odd", "closure.units"), ("supervise_out_of_range", "closure.supervise"),
    ("selection_missing", "selection"), ("offsets_short", "tokens.offsets"),
    ("no_response_token", "tokens.kinds"), ("protected_units_duplicate", "closure.protected_units"),
    ("protected_units_wrong", "closure.protected_units"), ("response_keep_unsorted", "selection.response_keep"),
    ("achieved_rho_wrong", "selection.achieved_rho_r"), ("unit_dropped", "closure.units"), ("a_huge", "scores.a"),
    ("loss_nonfinite", "scores.loss"), ("u_sur_huge", "selection.u_sur"),
    ("response_scores_nonfinite", "selection.response_scores"),
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


# -- issue 30's reproductions, through the command line ----------------------------------------------------

def _bridge(*args):
    from typer.testing import CliRunner

    from bridgecli.cli.app import app

    return CliRunner().invoke(app, [str(a) for a in args], env={"BRIDGE_NO_PROGRESS": "1", "COLUMNS": "200"})


def _stream_with(tmp_path, stage: str, change, name: str = "s.bridge"):
    """A consistent stream at ``stage`` with references, its first example changed by ``change``."""
    for seed in range(1000):
        rng = random.Random(seed)
        examples = [fuzz.scored_example(rng, i, interactions=True, references=True) for i in range(3)]
        if all(ex.tokens.kinds.count(1) for ex in examples):
            break
    examples = fuzz._steps(random.Random(0), examples, stage, *_step_functions())
    examples[0] = change(examples[0])
    path = tmp_path / name
    fuzz.write(path, msgspec.structs.replace(fuzz.HEADER, stage=stage), examples)
    return path


def _step_functions():
    from bridgecli.registry import get
    from bridgecli.steps.close import close_example
    from bridgecli.steps.select import select_example

    return select_example, close_example, get


def _scores_with(field: str, value: float, dtype: str):
    def change(ex):
        arr = getattr(ex.scores, field)
        values = arr.numpy("float64").reshape(-1).copy()
        values[0] = value
        return fuzz._scores(ex, **{field: Array.of(values.reshape(arr.shape), dtype)})

    return change


def _reference_with(field: str, value: float):
    def change(ex):
        ref = ex.references["base"]
        values = getattr(ref, field).numpy("float64").copy()
        values[0] = value
        return msgspec.structs.replace(ex, references={**ex.references, "base": msgspec.structs.replace(
            ref, **{field: Array.of(values)})})

    return change


@pytest.mark.parametrize("field, value, dtype", [
    ("B", 1.7e308, "float64"), ("a", 3.4e38, "float32"), ("c", -1.7e308, "float64"), ("a", 2.0**48 * 1.01, "float32"),
    ("loss", float("inf"), "float32"), ("A", float("inf"), "float16"),
])
def test_huge_or_infinite_scores_stop_select(tmp_path, field, value, dtype):
    """Item 4 (values near float64's largest in B, a or c: select wrote NaN/inf scores with exit 0) and item 5
    (an infinite scores.loss)."""
    path = _stream_with(tmp_path, "scores", _scores_with(field, value, dtype))
    result = _bridge("select", path, "-o", tmp_path / "out.bridge")
    assert result.exit_code == 3 and f"record 0, field 'scores.{field}': holds" in result.stderr, result.output
    assert result.stderr.count("\n") == 1 and not (tmp_path / "out.bridge").exists()


@pytest.mark.parametrize("method, field, value", [
    ("rho1", "response_loss", float("nan")), ("tokencleaning", "response_loss", float("nan")),
    ("llm+tc", "prompt_loss", float("nan")), ("tokenseek-approx", "prompt_grad", float("nan")),
    ("tokenseek-approx", "response_grad", float("inf")), ("rho1", "response_loss", float("-inf")),
    ("sstoken", "response_attention", 1e30),
])
def test_bad_references_stop_every_method(tmp_path, method, field, value):
    """Item 5: NaN or infinite references (and gradient norms) wrote NaN or inf scores with exit 0."""
    path = _stream_with(tmp_path, "scores", _reference_with(field, value))
    result = _bridge("select", path, "--method", method, "-o", tmp_path / "out.bridge")
    assert result.exit_code == 3 and f"field 'references.base.{field}': holds" in result.stderr, result.output
    assert not (tmp_path / "out.bridge").exists()


def test_documented_rules_are_enforced(tmp_path):
    """Item 6: an example with no response token, and duplicate protected units, were accepted."""
    path = _stream_with(tmp_path, "closure", lambda ex: fuzz._no_response(ex, random.Random(0)), "empty.bridge")
    result = _bridge("compact", path, "-o", tmp_path / "rows.jsonl")
    assert result.exit_code == 3 and "field 'tokens.kinds': no response token" in result.stderr, result.output

    def twice(ex):
        unit = ex.closure.chosen[0]
        return fuzz._clo(ex, protected_units=[unit, unit])

    path = _stream_with(tmp_path, "closure", twice, "twice.bridge")
    for command in ("close", "compact"):
        result = _bridge(command, path, "-o", tmp_path / "out")
        assert result.exit_code == 3 and "field 'closure.protected_units': holds a unit twice" in result.stderr, \
            result.output
    assert not (tmp_path / "out").exists()


def test_a_stream_at_the_bound_goes_through_the_pipeline(tmp_path):
    """The other side of item 4: values at +-2^48 in a and B, and at 0 and 2^48 in c (an attention mass, never
    negative), pass, and select, close and compact succeed with finite numbers."""
    def at_bound(ex):
        n, m = ex.scores.A.shape
        signs = np.resize([1.0, -1.0], n)
        return fuzz._scores(ex, a=Array.of(signs * MAX_QUANTITY), c=Array.of((signs < 0) * MAX_QUANTITY),
                            B=Array.of(np.full((n, m), MAX_QUANTITY)))

    path = _stream_with(tmp_path, "scores", at_bound)
    for args in (["select", path, "-o", tmp_path / "sel.bridge"], ["close", tmp_path / "sel.bridge", "-o",
                                                                    tmp_path / "clo.bridge"],
                 ["compact", tmp_path / "clo.bridge", "-o", tmp_path / "rows.jsonl"]):
        result = _bridge(*args)
        assert result.exit_code == 0, result.output
    _, examples = read_all(tmp_path / "clo.bridge")
    assert all(np.isfinite(ex.selection.response_scores.numpy()).all() for ex in examples)


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


@pytest.mark.parametrize("value", [-0.001, -1.0, -MAX_QUANTITY])
def test_a_negative_loss_is_a_format_error_before_importance_sampling(tmp_path, value):
    """Issue 40: one token's loss at -0.001 ended `select --preset importance-loss-resp` in a traceback
    (ValueError: tilt scores must be finite and >= 0, exit 1). A loss is never negative: the reader refuses
    it, exit 3, one line naming the record and the field, and nothing is written."""
    def negative(ex):
        values = ex.scores.loss.numpy("float64").copy()
        values[-1] = value
        return fuzz._scores(ex, loss=Array.of(values))

    path = _stream_with(tmp_path, "scores", negative)
    out = tmp_path / "out.bridge"
    result = _bridge("select", path, "--preset", "importance-loss-resp", "-o", out)
    assert result.exit_code == 3, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert "record 0, field 'scores.loss'" in result.output and "values must be >= 0" in result.output
    assert not out.exists()
