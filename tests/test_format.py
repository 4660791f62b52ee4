"""The bridge stream format (docs/format.md): round trips, every failure mode (in process and through
the CLI), the golden files of every released version, the JSON Schema, streaming through a pipe."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import os
import re
import struct
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import msgspec
import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridgecli.errors import FormatError
from bridgecli.format import (
    Array, Closure, End, Example, Header, ModelInfo, Scores, Selection, Step, StreamReader, StreamWriter,
    Tokens, open_writer, read_all,
)
from bridgecli.format import schema as stream_schema
from bridgecli.format.records import ALLOWED_DTYPES
from bridgecli.format.spec import MAGIC, MAJOR, MINOR, PREAMBLE, RECORD_PREFIX, RECORDS_PER_FRAME, STAGES

from tiny import frame_lengths

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden"
SCHEMA_FILE = REPO / "schemas" / f"bridge-stream-v{MAJOR}.schema.json"

HEADER = Header(stage="scores", producer="bridgecli test", created="2025-01-01T00:00:00+00:00",
                model=ModelInfo(source="tiny", fingerprint="sha256:00", tokenizer_fingerprint="sha256:11"),
                steps=[Step(step="score", producer="bridgecli test", time="2025-01-01T00:00:00+00:00",
                            params={"rho": 0.5, "layers": [1, 2], "note": None})],
                source="data.jsonl")


def example(i: int, *, payload: bytes = b"") -> Example:
    """A small scored example; ``payload`` (e.g. incompressible bytes) goes into ``scores.A``."""
    A = Array(dtype="uint8", shape=[len(payload)], data=payload) if payload else Array.of([[1.0, 0.0]], "float16")
    return Example(id=f"ex-{i}", index=i, text=f"question {i}? answer {i}.",
                   tokens=Tokens(input_ids=[1, 10 + i, 11, 2, 20 + i, 3], kinds=bytes([0, 1, 1, 0, 2, 3]),
                                 offsets=[0, 0, 0, 8, 8, 11, 11, 12, 12, 19, 19, 19]),
                   scores=Scores(scorer="bridge", a=Array.of([0.5]), c=Array.of([0.25]), A=A))


# -- byte-level helpers (the layout of docs/format.md, written without the writer) ------------------

def write_stream(examples, header: Header = HEADER, **kwargs) -> bytes:
    buf = io.BytesIO()
    with StreamWriter(buf, header, **kwargs) as writer:
        for ex in examples:
            writer.write(ex)
    return buf.getvalue()


def framed(payload: bytes) -> bytes:
    return RECORD_PREFIX.pack(len(payload), zlib.crc32(payload)) + payload


def assemble(*records: bytes, major: int = MAJOR, minor: int = MINOR) -> bytes:
    """Preamble + one zstd frame (with content checksum) holding the given framed records."""
    body = zstandard.ZstdCompressor(write_checksum=True).compress(b"".join(records))
    return PREAMBLE.pack(MAGIC, major, minor) + body


def read_bytes(data: bytes, validate: bool = False) -> tuple[StreamReader, list[Example]]:
    """The wire format alone (records need not make sense: tests/test_validate.py checks that)."""
    reader = StreamReader(io.BytesIO(data), "<test>", validate=validate)
    return reader, list(reader)


# -- round trips ------------------------------------------------------------------------------------

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
_u32 = st.integers(0, 2**32 - 1)
_floats = st.floats(allow_nan=False, width=64)


@st.composite
def arrays(draw) -> Array:
    dtype = draw(st.sampled_from(ALLOWED_DTYPES))
    shape = draw(st.lists(st.integers(0, 4), max_size=3))
    n = math.prod(shape) * np.dtype(dtype).itemsize
    return Array(dtype=dtype, shape=shape, data=draw(st.binary(min_size=n, max_size=n)))


@st.composite
def examples(draw) -> Example:
    n_tok = draw(st.integers(0, 12))
    tokens = Tokens(input_ids=draw(st.lists(st.integers(0, 2**31 - 1), min_size=n_tok, max_size=n_tok)),
                    kinds=bytes(draw(st.lists(st.integers(0, 3), min_size=n_tok, max_size=n_tok))),
                    offsets=draw(st.lists(_u32, min_size=2 * n_tok, max_size=2 * n_tok)))
    scores = draw(st.none() | st.builds(Scores, scorer=_text, a=arrays(), c=arrays(), A=arrays(),
                                        loss=st.none() | arrays()))
    selection = draw(st.none() | st.builds(
        Selection, method=_text, b_p=_u32, b_r=_u32, prompt_keep=st.lists(_u32, max_size=6),
        response_keep=st.lists(_u32, max_size=6), response_scores=arrays(), u_sur=st.lists(_floats, max_size=5)))
    closure = draw(st.none() | st.builds(
        Closure, segmenter=_text, alpha=_floats, units=st.lists(_u32, max_size=6), chosen=st.lists(_u32, max_size=3),
        supervise=st.lists(_u32, max_size=6)))
    return Example(id=draw(_text), index=draw(st.integers(0, 2**63 - 1)), text=draw(_text), tokens=tokens,
                   scores=scores, selection=selection, closure=closure)


_json = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | _floats | _text,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
                     max_leaves=8)
headers = st.builds(
    Header, stage=st.sampled_from(STAGES), producer=_text, created=_text,
    model=st.builds(ModelInfo, source=_text, fingerprint=_text, tokenizer_fingerprint=_text,
                    chat_template=st.booleans()),
    steps=st.lists(st.builds(Step, step=_text, producer=_text, time=_text,
                             params=st.dictionaries(_text, _json, max_size=4)), max_size=3),
    source=_text)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(header=headers, exs=st.lists(examples(), max_size=5), records_per_frame=st.integers(1, 4))
def test_round_trip(header, exs, records_per_frame):
    data = write_stream(exs, header, records_per_frame=records_per_frame)
    reader, got = read_bytes(data)
    assert reader.version == (MAJOR, MINOR)
    assert reader.header == header
    assert got == exs
    assert reader.count == len(exs)
    # the header has a frame of its own; then records_per_frame records (the end record included) a frame
    assert len(frame_lengths(data[PREAMBLE.size:])) == 1 + math.ceil((len(exs) + 1) / records_per_frame)


@settings(max_examples=100, deadline=None)
@given(arr=arrays())
def test_array_numpy_round_trip(arr):
    values = arr.numpy()
    assert values.dtype == np.dtype(arr.dtype) and list(values.shape) == arr.shape
    assert Array.of(values, arr.dtype) == arr  # bit for bit, NaN payloads included


def test_array_of_is_little_endian():
    arr = Array.of(np.array([1, 256], dtype=">i4"), "int32")
    assert arr.data == struct.pack("<2i", 1, 256)
    assert arr.numpy().tolist() == [1, 256]


def test_empty_stream():
    data = write_stream([])
    reader, got = read_bytes(data)
    assert got == [] and reader.count == 0 and reader.header == HEADER
    assert len(frame_lengths(data[PREAMBLE.size:])) == 2  # header frame, end frame


def test_many_examples_span_many_frames():
    exs = [example(i) for i in range(1000)]
    data = write_stream(exs)
    frames = frame_lengths(data[PREAMBLE.size:])
    assert len(frames) == 1 + math.ceil(1001 / RECORDS_PER_FRAME)
    reader, got = read_bytes(data)
    assert got == exs and reader.count == 1000


def test_one_record_per_frame():
    exs = [example(i) for i in range(5)]
    data = write_stream(exs, records_per_frame=1)
    assert len(frame_lengths(data[PREAMBLE.size:])) == 1 + 5 + 1
    assert read_bytes(data)[1] == exs


def test_writer_interrupted_leaves_a_stream_without_end_record():
    buf = io.BytesIO()
    with pytest.raises(RuntimeError):
        with StreamWriter(buf, HEADER) as writer:
            writer.write(example(0))
            raise RuntimeError("boom")
    with pytest.raises(FormatError, match="without an end record"):
        read_bytes(buf.getvalue())


def test_open_writer_creates_the_file_only_when_complete(tmp_path):
    path = tmp_path / "out.bridge"
    with pytest.raises(RuntimeError):
        with open_writer(path, HEADER) as writer:
            writer.write(example(0))
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with open_writer(path, HEADER) as writer:
        writer.write(example(0))
    header, got = read_all(path)
    assert header == HEADER and got == [example(0)]


def test_skippable_frames_are_ignored():
    """Reserved for metadata (docs/format.md): version 1 writers write none, readers skip them."""
    skippable = struct.pack("<II", 0x184D2A50, 5) + b"notes"
    data = write_stream([example(0)])
    got = read_bytes(data[:PREAMBLE.size] + skippable + data[PREAMBLE.size:] + skippable)[1]
    assert got == [example(0)]
    # whole frames without content after the end record: skippable ones of any size, an empty zstd frame
    empty = zstandard.ZstdCompressor().compress(b"")
    tail = struct.pack("<II", 0x184D2A5F, 0) + empty + struct.pack("<II", 0x184D2A55, 3) + b"abc"
    assert read_bytes(data + tail)[1] == [example(0)]


# -- newer minor version: still read, unknown fields ignored -------------------------------------

def _with_extra(record, **nested_extra) -> bytes:
    """Encode ``record`` as a later minor version might: with fields this reader does not know."""
    d = msgspec.to_builtins(record, builtin_types=(bytes,))
    d["added_in_a_later_minor"] = {"any": ["shape", 1, 2.5]}
    for key, value in nested_extra.items():
        d[key]["also_added"] = value
    return msgspec.msgpack.encode(d)


def newer_minor_stream() -> bytes:
    return assemble(framed(_with_extra(HEADER, model=True)),
                    framed(_with_extra(example(0), tokens=[1, 2], scores=b"\x00")),
                    framed(_with_extra(example(1))),
                    framed(_with_extra(End(count=2))), minor=MINOR + 7)


def test_newer_minor_version_reads_and_ignores_unknown_fields():
    reader, got = read_bytes(newer_minor_stream())
    assert reader.version == (MAJOR, MINOR + 7)
    assert reader.header == HEADER
    assert got == [example(0), example(1)]


# -- failure modes: each is exactly one FormatError with a one-line message -----------------------

def _good(**kwargs) -> bytes:
    return write_stream([example(0), example(1)], **kwargs)


def _cut_inside_big_record() -> bytes:
    """A record larger than a zstd block (128 KiB), cut in the middle of its frame: the reader gets
    the first part of the record's bytes, then EOF."""
    data = write_stream([example(0, payload=np.random.default_rng(0).bytes(300_000))], records_per_frame=1)
    header_frame, example_frame, _end = frame_lengths(data[PREAMBLE.size:])
    return data[:PREAMBLE.size + header_frame + example_frame // 2]


def _flip_inside_body() -> bytes:
    """One byte flipped in the middle of a compressed frame (incompressible data: zstd stores it
    as is, so the flip changes the content and the frame's content checksum catches it)."""
    data = bytearray(write_stream([example(0, payload=np.random.default_rng(1).bytes(4000))], records_per_frame=1))
    header_frame, example_frame, _end = frame_lengths(bytes(data[PREAMBLE.size:]))
    data[PREAMBLE.size + header_frame + example_frame // 2] ^= 0xFF
    return bytes(data)


def _without_end_record() -> bytes:
    data = _good(records_per_frame=1)
    *_, end_frame = frame_lengths(data[PREAMBLE.size:])
    return data[:-end_frame]


JSONL = b'{"prompt": "What is 2 + 2?", "response": "2 + 2 = 4. #### 4"}\n' * 3
HEADER_REC = framed(msgspec.msgpack.encode(HEADER))
EX0, EX1 = framed(msgspec.msgpack.encode(example(0))), framed(msgspec.msgpack.encode(example(1)))
END2 = framed(msgspec.msgpack.encode(End(count=2)))


def _crc_mismatch() -> bytes:
    """Example 0's payload changed after its CRC was computed, then compressed again: the zstd layer
    is valid, only the record CRC can tell."""
    ex0 = bytearray(EX0)
    ex0[ex0.index(b"question 0")] = ord("Q")
    return assemble(HEADER_REC, bytes(ex0), EX1, END2)


#: name -> (file bytes, regex the one-line message must match)
FAILURES: dict[str, tuple[bytes, str]] = {
    "empty file": (b"", r"empty or truncated file: no bridge preamble"),
    "truncated preamble": (_good()[:7], r"empty or truncated file: no bridge preamble"),
    "preamble only": (_good()[:PREAMBLE.size], r"truncated: no header record"),
    "wrong magic": (b"GIF89a" + bytes(range(64)), r"not a bridge stream \(bad magic bytes\)$"),
    "jsonl by mistake": (JSONL, r"not a bridge stream \(bad magic bytes\) .*run `bridge score`"),
    "tiny json by mistake": (b'{"a": 1}\n', r"not a bridge stream .*run `bridge score`"),
    "bare zstd": (zstandard.ZstdCompressor().compress(JSONL), r"not a bridge stream .*bare zstd file"),
    "newer major": (PREAMBLE.pack(MAGIC, MAJOR + 1, 0) + _good()[PREAMBLE.size:],
                    rf"written with stream format {MAJOR + 1}\.0; this bridgecli reads format {MAJOR}\.x "
                    r"\(upgrade bridgecli to read it\)"),
    "truncated inside a record": (assemble(HEADER_REC, EX0, EX1[:len(EX1) // 2]),
                                  r"truncated inside record 1 after 1 complete records \(the writer was interrupted"),
    "truncated inside a record's frame": (_cut_inside_big_record(), r"truncated inside record 0 after 0 complete"),
    "truncated at a record boundary": (_without_end_record(),
                                       r"truncated: the stream ends after 2 records without an end record"),
    "truncated after the header": (assemble(HEADER_REC), r"the stream ends after 0 records without an end record"),
    "flipped byte in compressed body": (_flip_inside_body(), r"record 0: corrupted compressed data"),
    "crc mismatch": (_crc_mismatch(), r"record 0: corrupted: checksum mismatch$"),
    "implausible length": (assemble(HEADER_REC, RECORD_PREFIX.pack(0xFFFF_FFF0, 0)),
                           r"record 0: corrupted: record length \d+ is implausible"),
    "end count mismatch": (assemble(HEADER_REC, EX0, EX1, framed(msgspec.msgpack.encode(End(count=3)))),
                           r"end record counts 3 examples but 2 were read"),
    "data after the end record": (_good() + b"trailing garbage\n",
                                  r"corrupted: data after the end record \(.*concatenated"),
    "zstd frame after the end record": (_good() + zstandard.ZstdCompressor().compress(EX0),
                                        r"corrupted: data after the end record"),
    "two streams concatenated": (_good() + _good(), r"corrupted: data after the end record"),
    # the decompressor stops in silence inside a frame cut short: the reader walks the frames itself
    "one byte 0x50 after the end record": (_good() + b"\x50", r"corrupted: data after the end record \(.*no whole"),
    "one byte 0x5F after the end record": (_good() + b"\x5f", r"corrupted: data after the end record"),
    "a zstd magic after the end record": (_good() + b"\x28\xb5\x2f\xfd", r"corrupted: data after the end record"),
    "a skippable frame cut short after the end record": (
        _good() + (struct.pack("<II", 0x184D2A50, 5) + b"notes")[:-1], r"corrupted: data after the end record"),
    "a skippable frame's magic alone after the end record": (
        _good() + struct.pack("<I", 0x184D2A5A), r"corrupted: data after the end record"),
    "an empty zstd frame cut short after the end record": (
        _good() + zstandard.ZstdCompressor().compress(b"")[:-1], r"corrupted: data after the end record"),
    "first record not a header": (assemble(EX0), r"the first record is not a header"),
    "second header": (assemble(HEADER_REC, EX0, HEADER_REC), r"record 1: a second header inside the stream"),
    "unknown record type": (assemble(HEADER_REC, framed(msgspec.msgpack.encode({"type": "future", "x": 1}))),
                            r"record 0: cannot decode record"),
    "wrong field type": (assemble(HEADER_REC, framed(msgspec.msgpack.encode(
        {**msgspec.to_builtins(example(0), builtin_types=(bytes,)), "index": "zero"}))),
        r"record 0: cannot decode record \(Expected `int`, got `str` - at `\$\.index`\)"),
}


@pytest.fixture(scope="module")
def failure_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("failures")
    paths = {}
    for k, (name, (data, _)) in enumerate(FAILURES.items()):
        paths[name] = folder / f"case{k:02d}.bridge"
        paths[name].write_bytes(data)
    return paths


@pytest.mark.parametrize("name", list(FAILURES))
def test_failure_mode_raises_one_format_error(name, failure_files):
    path = failure_files[name]
    with pytest.raises(FormatError) as info:
        read_all(path)
    err = info.value
    message = str(err)
    assert err.exit_code == 3
    assert "\n" not in message
    assert re.match(rf"{re.escape(str(path))}(, [^:]+)?: ", message), message  # names the file first
    assert re.search(FAILURES[name][1], message), message
    assert err.__cause__ is None


def test_every_single_byte_corruption_is_detected_or_harmless():
    """Flip each byte after the preamble: the reader either raises FormatError or, when the flip hit a
    bit zstd may ignore (window size, block header slack), returns exactly the original records."""
    data = _good(records_per_frame=1)
    original = read_bytes(data)[1]
    for pos in range(PREAMBLE.size, len(data)):
        tampered = bytearray(data)
        tampered[pos] ^= 0xFF
        try:
            got = read_bytes(bytes(tampered))[1]
        except FormatError:
            continue
        assert got == original, f"byte {pos} flipped silently changed the records"


# -- the same failures through the CLI -----------------------------------------------------------

def _bridge_command() -> list[str]:
    script = Path(sys.executable).with_name("bridge")
    return [str(script)] if script.exists() else [sys.executable, "-m", "bridgecli"]


@pytest.fixture(scope="module")
def cli_runs(failure_files, tmp_path_factory, request) -> dict[str, dict]:
    """name -> {"code", "stdout", "stderr"} of `bridge inspect FILE` for every failure case, a newer
    minor version and the golden files, each in a forked child of one interpreter that imported the CLI once
    (tests/forked_cli.py: a real process, its own files and exit status; a fresh interpreter per case would
    cost seconds each); plus "console script" for one genuine `bridge` process."""
    folder = tmp_path_factory.mktemp("cli")
    newer = folder / "newer-minor.bridge"
    newer.write_bytes(newer_minor_stream())
    cases = {name: ["inspect", str(path)] for name, path in failure_files.items()}
    cases["newer minor"] = ["inspect", "--json", str(newer)]
    for path in sorted(GOLDEN.glob("*.bridge")):
        cases[f"golden {path.name}"] = ["inspect", "--json", str(path)]
    env = {**os.environ, "BRIDGE_NO_PROGRESS": "1", "PYTHONUNBUFFERED": "1"}
    # one genuine console-script process, run while the forked children work
    real = subprocess.Popen([*_bridge_command(), "inspect", str(failure_files["jsonl by mistake"])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=folder)
    runs: dict[str, dict] = {}
    if hasattr(os, "fork"):
        forked = request.getfixturevalue("forked_bridge")
        for name, args in cases.items():
            p = forked.run(args, cwd=folder, env={**os.environ, "BRIDGE_NO_PROGRESS": "1"}, timeout=300)
            runs[name] = {"code": p.returncode, "stdout": p.stdout.decode(), "stderr": p.stderr.decode()}
    else:  # pragma: no cover - no fork (Windows): one process per case
        for name, args in cases.items():
            p = subprocess.run([*_bridge_command(), *args], capture_output=True, text=True, env=env, cwd=folder,
                               timeout=300)
            runs[name] = {"code": p.returncode, "stdout": p.stdout, "stderr": p.stderr}
    out, err = real.communicate(timeout=300)
    runs["console script"] = {"code": real.returncode, "stdout": out, "stderr": err}
    return runs


def _assert_cli_error(run: dict, pattern: str) -> None:
    assert run["code"] == 3, run
    assert run["stdout"] == ""
    assert "Traceback" not in run["stderr"], run["stderr"]
    lines = run["stderr"].splitlines()
    assert len(lines) == 1, run["stderr"]
    assert lines[0].startswith("bridge inspect: error: "), lines[0]
    assert re.search(pattern, lines[0]), lines[0]


@pytest.mark.integration  # the `bridge` console script (cli_runs)
@pytest.mark.parametrize("name", list(FAILURES))
def test_failure_mode_through_the_cli(name, cli_runs):
    _assert_cli_error(cli_runs[name], FAILURES[name][1])


@pytest.mark.integration  # the `bridge` console script (cli_runs)
def test_console_script_reports_a_jsonl_file_in_one_line(cli_runs):
    _assert_cli_error(cli_runs["console script"], r"not a bridge stream .*run `bridge score` on it")


@pytest.mark.integration  # the `bridge` console script (cli_runs)
def test_newer_minor_version_through_the_cli(cli_runs):
    run = cli_runs["newer minor"]
    assert run["code"] == 0, run
    info = json.loads(run["stdout"])
    assert info["format"] == f"{MAJOR}.{MINOR + 7}" and info["examples"] == 2


# -- golden files: every released version, read forever -----------------------------------------

def _golden_cases() -> list[tuple[str, str]]:
    cases = []
    for expected in sorted(GOLDEN.glob("v*-expected.json")):
        for name in json.loads(expected.read_text(encoding="utf-8"))["files"]:
            cases.append((expected.name, name))
    return cases


GOLDEN_CASES = _golden_cases()


def test_golden_sets_exist():
    """Every released version has a golden set; the current one included."""
    assert (GOLDEN / f"v{MAJOR}.{MINOR}-expected.json").exists(), (
        f"no golden files for format {MAJOR}.{MINOR}: run `python tests/golden/make_golden.py` once and commit them")
    stages = {name.split("-", 1)[1].removesuffix(".bridge") for exp, name in GOLDEN_CASES
              if exp == f"v{MAJOR}.{MINOR}-expected.json"}
    assert stages == set(STAGES)


def assert_contains(actual, expected, path: str = "$") -> None:
    """``actual`` has everything ``expected`` has (objects may have more keys: fields a later minor
    version added, with their defaults)."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: expected an object, got {actual!r}"
        for key, value in expected.items():
            assert key in actual, f"{path}.{key} is missing"
            assert_contains(actual[key], value, f"{path}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), f"{path}: {actual!r} != {expected!r}"
        for k, (a, e) in enumerate(zip(actual, expected)):
            assert_contains(a, e, f"{path}[{k}]")
    else:
        assert actual == expected and type(actual) is type(expected), f"{path}: {actual!r} != {expected!r}"


def _expected(expected_name: str, name: str) -> dict:
    return json.loads((GOLDEN / expected_name).read_text(encoding="utf-8"))["files"][name]


@pytest.mark.parametrize(("expected_name", "name"), GOLDEN_CASES)
def test_golden_file_decodes_as_expected(expected_name, name):
    exp = _expected(expected_name, name)
    path = GOLDEN / name
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == exp["sha256"], (
        f"{name} changed: released golden files are never rewritten (add a new set for a new version)")
    with open(path, "rb") as fh:
        reader = StreamReader(fh, name)
        got = list(reader)
    assert list(reader.version) == exp["format"]
    assert reader.header.stage == exp["stage"]
    assert_contains(msgspec.to_builtins(reader.header), exp["header"], "header")
    assert reader.count == exp["count"] == len(got) == len(exp["examples"])
    assert len(frame_lengths(data[PREAMBLE.size:])) == exp["zstd_frames"]
    for k, (ex, want) in enumerate(zip(got, exp["examples"])):
        where = f"examples[{k}]"
        assert_contains(msgspec.to_builtins(ex), want["record"], where)
        assert ex.stage() == want["stage"]
        tok = ex.tokens
        assert tok.prompt_positions().tolist() == want["positions"]["prompt"]
        assert tok.response_positions().tolist() == want["positions"]["response"]
        assert tok.eos_positions().tolist() == want["positions"]["eos"]
        spans, resp, eos = tok.spans(), tok.response_positions(), tok.eos_positions()[0]
        assert ex.text[spans[resp[0], 0]:spans[resp[-1], 1]] == want["response_text"]
        assert ex.text[spans[eos, 0]:spans[eos, 1]] == want["eos_text"]
        for field, arr_want in want["arrays"].items():
            arr = ex  # a dotted path: attributes, and map keys (references.NAME.part)
            for piece in field.split("."):
                arr = arr[piece] if isinstance(arr, dict) else getattr(arr, piece)
            if arr_want is None:
                assert arr is None, f"{where}.{field}"
                continue
            values = arr.numpy()
            assert arr.dtype == arr_want["dtype"] and list(values.shape) == arr_want["shape"], f"{where}.{field}"
            assert values.reshape(-1)[:4].tolist() == arr_want["head"], f"{where}.{field}"
            assert float(values.astype(np.float64).sum()) == pytest.approx(arr_want["sum"], rel=1e-9, abs=1e-12)
        if ex.scores is not None:
            n, m = len(resp), len(tok.prompt_positions())
            assert ex.scores.A.shape == [n, m] and ex.scores.a.shape == [n]
        if ex.closure is not None:
            units = np.asarray(ex.closure.units).reshape(-1, 2)
            filled = set(getattr(ex.closure, "filled", []))  # (1.3) close --fill's tokens outside the chosen units
            assert set(ex.closure.supervise) == {p for u in ex.closure.chosen for p in range(*units[u])} | filled


def _read_without_bridgecli(path: Path):
    """What docs/format.md shows: the format read with zstandard + msgpack (or msgspec) alone."""
    try:
        import msgpack

        unpack = msgpack.unpackb
    except ImportError:
        unpack = msgspec.msgpack.decode
    with open(path, "rb") as fh:
        magic, major, minor = struct.unpack("<8sHH", fh.read(12))
        assert magic == b"\x89BRIDGE\n" and major == 1
        body = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True)
        while True:
            length, crc = struct.unpack("<II", body.read(8))
            payload = body.read(length)
            assert len(payload) == length and zlib.crc32(payload) == crc
            record = unpack(payload)
            yield record
            if record["type"] == "end":
                return


def _b64(obj):
    if isinstance(obj, bytes):
        return base64.b64encode(obj).decode()
    if isinstance(obj, dict):
        return {k: _b64(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_b64(v) for v in obj]
    return obj


@pytest.mark.parametrize(("expected_name", "name"), GOLDEN_CASES)
def test_golden_file_reads_without_bridgecli(expected_name, name):
    exp = _expected(expected_name, name)
    header, *exs, end = [_b64(r) for r in _read_without_bridgecli(GOLDEN / name)]
    assert_contains(header, exp["header"])
    assert end == {"type": "end", "count": exp["count"]}
    for ex, want in zip(exs, exp["examples"], strict=True):
        # the writer leaves no field out, so the plain decoding has every field the structs have
        assert_contains(ex, want["record"])


@pytest.mark.integration  # the `bridge` console script (cli_runs)
def test_golden_files_through_the_cli(cli_runs):
    for expected_name, file in GOLDEN_CASES:
        run = cli_runs[f"golden {file}"]
        assert run["code"] == 0, run
        info = json.loads(run["stdout"])
        exp = _expected(expected_name, file)
        assert info["examples"] == exp["count"] and info["stage"] == exp["stage"]


# -- JSON Schema ----------------------------------------------------------------------------------

def test_schema_file_matches_the_records():
    assert SCHEMA_FILE.exists(), f"missing {SCHEMA_FILE.relative_to(REPO)}"
    assert stream_schema.render() == SCHEMA_FILE.read_text(encoding="utf-8"), (
        "the JSON Schema drifted from the records in bridgecli/format/records.py: regenerate it with "
        f"`python -m bridgecli.format.schema > schemas/{SCHEMA_FILE.name}` (and remember: adding a field is "
        "a minor version bump and needs a default; anything else is a major one)")


@pytest.mark.parametrize(("expected_name", "name"), GOLDEN_CASES)
def test_golden_records_validate_against_the_schema(expected_name, name):
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text(encoding="utf-8")))
    header, exs = read_all(GOLDEN / name)
    for record in (header, *exs, End(count=len(exs))):
        validator.validate(msgspec.to_builtins(record))


def test_the_schema_holds_the_readers_rules_on_numbers():
    """What the reader refuses among a record's JSON numbers, the schema refuses too (issue 40): a negative
    index, budget or position, a token id beyond 2^31, a retention ratio or an alpha outside [0, 1]; and it
    says which arrays are never negative (their values are bytes it cannot read)."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    _, exs = read_all(GOLDEN / "v1.3-closure.bridge")
    good = msgspec.to_builtins(exs[0])
    validator.validate(good)
    for path, value in [(("index",), -1), (("selection", "b_r"), -1), (("selection", "prompt_keep", 0), -3),
                        (("tokens", "input_ids", 0), 2**31), (("selection", "achieved_rho_r"), 1.5),
                        (("closure", "alpha"), -0.1), (("closure", "supervise", 0), -1),
                        (("tokens", "offsets", 0), -1)]:
        bad = json.loads(json.dumps(good))
        holder = bad
        for key in path[:-1]:
            holder = holder[key]
        if isinstance(holder, list) and not holder:
            continue
        holder[path[-1]] = value
        assert not validator.is_valid(bad), path
    props = schema["$defs"]
    assert "never negative" in props["Scores"]["properties"]["loss"]["description"]
    assert "never negative" in props["Reference"]["properties"]["response_grad"]["description"]
    assert "never negative" not in props["Scores"]["properties"]["a"]["description"]


# -- streaming ------------------------------------------------------------------------------------

def test_reader_sees_records_before_the_writer_closes():
    """Pipes between steps stream: a record flushed by the writer reaches a reader on a buffered
    pipe (like sys.stdin.buffer) while the writer is still open."""
    read_fd, write_fd = os.pipe()
    first_seen = threading.Event()
    streamed = []

    def produce():
        with os.fdopen(write_fd, "wb") as fh:
            writer = StreamWriter(fh, HEADER)
            writer.write(example(0))
            writer.flush()
            streamed.append(first_seen.wait(timeout=20))  # False: the reader needed the close to see it
            writer.write(example(1))
            writer.close()

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        with os.fdopen(read_fd, "rb") as fh:
            reader = StreamReader(fh, "<pipe>")
            records = iter(reader)
            assert next(records) == example(0)
            first_seen.set()
            assert list(records) == [example(1)]
            assert reader.count == 2
    finally:
        first_seen.set()
        thread.join(timeout=30)
    assert streamed == [True], "the reader only saw the first record after the writer closed the stream"
