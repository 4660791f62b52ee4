"""Read raw records from JSONL (optionally .gz), JSON, Parquet or an HF ``save_to_disk`` folder.

Every reader yields ``(where, record)`` where ``where`` names the record for error messages
("line 12", "item 3", "row 7").
"""

from __future__ import annotations

import bz2
import gzip
import json
from pathlib import Path
from typing import Any, Iterator

import msgspec

from ..errors import InputError

_json = msgspec.json.Decoder()


def open_text(path: str | Path):
    """Open a text file for reading (UTF-8); ``.gz`` and ``.bz2`` are decompressed on the fly."""
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    if path.suffix == ".bz2":
        return bz2.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8", newline="")


def open_binary(path: str | Path):
    """Open a file for reading bytes; ``.gz`` and ``.bz2`` are decompressed on the fly."""
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    if path.suffix == ".bz2":
        return bz2.open(path, "rb")
    return open(path, "rb")


def _not_utf8(exc: UnicodeDecodeError) -> str:
    return f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at column {exc.start + 1})"


def jsonl_objects(path: str | Path) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line of a JSONL file (also .gz/.bz2); a line
    that is not UTF-8 or not a JSON object raises InputError naming the file and line."""
    with open_binary(path) as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(_not_utf8(exc), file=str(path), record=f"line {lineno}") from None
            if not line.strip():
                continue
            try:
                rec = _json.decode(line)
            except msgspec.DecodeError as exc:
                raise InputError(f"invalid JSON ({exc})", file=str(path), record=f"line {lineno}") from None
            if not isinstance(rec, dict):
                raise InputError(
                    f"expected a JSON object, got {type(rec).__name__}", file=str(path), record=f"line {lineno}"
                )
            yield lineno, rec


def read_jsonl(path: Path) -> Iterator[tuple[str, dict]]:
    for lineno, rec in jsonl_objects(path):
        yield f"line {lineno}", rec


def read_json(path: Path) -> Iterator[tuple[str, dict]]:
    try:
        with open_text(path) as fh:
            data = json.load(fh)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON ({exc})", file=str(path)) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x})", file=str(path)) from None
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if "data" in data and isinstance(data["data"], list):
            data = data["data"]
        elif len(lists) == 1:
            data = lists[0]
        else:
            raise InputError(
                "expected a JSON array of records (or an object with one array, e.g. 'data')", file=str(path)
            )
    if not isinstance(data, list):
        raise InputError("expected a JSON array of records", file=str(path))
    for i, rec in enumerate(data):
        if not isinstance(rec, dict):
            raise InputError("expected a JSON object", file=str(path), record=f"item {i}")
        yield f"item {i}", rec


def read_parquet(path: Path) -> Iterator[tuple[str, dict]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:
        raise InputError(f"cannot read Parquet ({exc})", file=str(path)) from None
    row = 0
    for batch in pf.iter_batches(batch_size=1024):
        for rec in batch.to_pylist():
            yield f"row {row}", rec
            row += 1


def read_hf_disk(path: Path, split: str | None, choose: str | None = None) -> Iterator[tuple[str, dict]]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise InputError(f"cannot load the saved dataset ({exc})", file=str(path)) from None
    if isinstance(ds, datasets.DatasetDict):
        names = list(ds.keys())
        chosen = split or ("train" if "train" in ds else None)
        if chosen is None or chosen not in ds:
            raise InputError(
                f"the dataset has splits {names} and none is chosen",
                file=str(path),
                hint=choose or f"pass the folder of one split, e.g. {Path(path) / names[0]}",
            )
        ds = ds[chosen]
    for row, rec in enumerate(ds):
        yield f"row {row}", rec


def is_hf_disk(path: Path) -> bool:
    return path.is_dir() and any((path / n).exists() for n in ("dataset_info.json", "state.json", "dataset_dict.json"))


def require_records(
    path: str | Path,
    split: str | None = None,
    *,
    allow_empty: bool = False,
    hint: str | None = None,
    choose: str | None = None,
) -> None:
    """Fail at once (InputError, one line) when a data file holds no record, unless ``allow_empty``.
    ``hint``: what the command offers for an empty input (score: ``--allow-empty``; warmup: nothing);
    ``choose``: how the command chooses a split (see :func:`read_records`)."""
    if allow_empty:
        return
    if next(iter(read_records(path, split, choose=choose)), None) is None:
        raise InputError("holds no records", file=str(path), hint=hint)


def read_records(
    path: str | Path, split: str | None = None, *, choose: str | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(where, record)`` from any supported file or folder. A ``save_to_disk`` folder of several
    splits takes ``split`` (default ``train``); without it, the error's hint is ``choose``, how the
    command names a split (:data:`~bridgecli.data.examples.CHOOSE_SPLIT` where it has ``--split``), else
    the folder of one split."""
    p = Path(path)
    if not p.exists():
        raise InputError("no such file or folder", file=str(p))
    if p.is_dir():
        if is_hf_disk(p):
            yield from read_hf_disk(p, split, choose)
            return
        raise InputError("a folder that is not a datasets save_to_disk folder", file=str(p))
    name = p.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        yield from read_jsonl(p)
    elif name.endswith((".json", ".json.gz")):
        yield from read_json(p)
    elif name.endswith(".parquet"):
        yield from read_parquet(p)
    else:
        raise InputError("unknown data format; use .jsonl, .json, .parquet or a save_to_disk folder", file=str(p))
