"""Each step's record in what it writes (a stream header's step parameters, the rows' sidecar) comes from
its options type (optionspec.recorded): every field is recorded unless its declaration says
``record=False``. A step that left a field out would fail here, naming the field; score's and reference's
records are checked where they run a model (test_score_e2e_pipeline.py, test_baselines.py)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from bridgecli.format.reader import open_reader
from bridgecli.optionspec import group, internal, option, recorded, recorded_names
from bridgecli.steps.options import CloseOptions, CompactOptions, SelectOptions


def unrecorded(cls: type, params: dict) -> list[str]:
    """The fields of the options type ``cls`` that are recorded by their declaration but missing from a
    step's ``params``: each named as ``Type.field``."""
    missing = []

    def walk(tp: type) -> None:
        import typing

        hints = typing.get_type_hints(tp)
        for f in dataclasses.fields(tp):
            spec = f.metadata.get("option") or f.metadata.get("group")
            if not (spec.record if spec is not None else f.metadata.get("record", True)):
                continue
            if "group" in f.metadata:
                args = [a for a in getattr(hints[f.name], "__args__", ()) if a is not type(None)]
                walk(args[0] if args else hints[f.name])
            elif f.name not in params:
                missing.append(f"{tp.__name__}.{f.name}")

    walk(cls)
    return missing


@dataclass
class _Inner:
    depth: int = option(2, "Depth.")
    path: Path = internal(Path("x/y"))


@dataclass
class _Options:
    inp: str = option("-", "Input.", record=False)
    rho: float = option(0.5, "Rho.")
    tags: frozenset = internal(frozenset({"b", "a"}))
    cache: str = internal("", record=False)
    inner: _Inner = group(_Inner)


def test_every_field_is_recorded_unless_its_declaration_says_otherwise():
    opts = _Options()
    assert recorded(opts) == {"rho": 0.5, "tags": ["a", "b"], "depth": 2, "path": "x/y"}
    assert recorded_names(_Options) == ["rho", "tags", "depth", "path"]
    assert recorded(opts, rho=0.25, digest="sha256:1") == {"rho": 0.25, "tags": ["a", "b"], "depth": 2,
                                                           "path": "x/y", "digest": "sha256:1"}
    json.dumps(recorded(opts))  # what a header or sidecar holds


def test_the_check_names_a_field_a_step_left_out():
    assert unrecorded(_Options, recorded(_Options())) == []
    assert unrecorded(_Options, {"rho": 0.5, "tags": [], "path": "x"}) == ["_Inner.depth"]


@pytest.fixture(scope="module")
def scores(tmp_path_factory, tokenizer):
    from test_show import synthetic, write_stream

    exs = [msgspec.structs.replace(e, selection=None, closure=None) for e in synthetic(tokenizer, closure=False)]
    return write_stream(tmp_path_factory.mktemp("records") / "scores.bridge", exs, "scores")


def test_select_close_and_compact_record_every_field(scores, tmp_path):
    from bridgecli.artifacts.rows_meta import read_rows_meta
    from bridgecli.steps.close import run_close
    from bridgecli.steps.compact import run_compact
    from bridgecli.steps.select import run_select

    run_select(SelectOptions(inp=str(scores), out=str(tmp_path / "sel.bridge"), protect_prompt=["digits"]))
    run_close(CloseOptions(inp=str(tmp_path / "sel.bridge"), out=str(tmp_path / "closed.bridge")))
    run_compact(CompactOptions(inp=str(tmp_path / "closed.bridge"), out=str(tmp_path / "rows.jsonl")))
    with open_reader(str(tmp_path / "closed.bridge")) as reader:
        select, close = (s.params for s in reader.header.steps[-2:])
    assert unrecorded(SelectOptions, select) == [] and unrecorded(CloseOptions, close) == []
    assert select["protect_prompt"] == ["digits"] and select["method"] == "bridge" and select["preset"] is None
    assert "workers" not in select and "out" not in close  # declared record=False
    compact = read_rows_meta(tmp_path / "rows.jsonl").steps[-1]
    assert compact.step == "compact" and unrecorded(CompactOptions, compact.params) == []
