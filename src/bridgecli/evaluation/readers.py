"""Reading eval data files: compressed text, JSONL records, one-line errors naming file/line/field."""

from __future__ import annotations

import bz2
import gzip
import json
from pathlib import Path
from typing import Any, Iterator, TextIO

from ..errors import InputError


def open_text(path: str | Path) -> TextIO:
    """Open a text file for reading; ``.gz`` and ``.bz2`` are decompressed on the fly."""
    p = Path(path)
    if p.suffix == ".gz":
        return gzip.open(p, "rt", encoding="utf-8")
    if p.suffix == ".bz2":
        return bz2.open(p, "rt", encoding="utf-8")
    return open(p, encoding="utf-8", newline="")


def require_file(path: str | Path, hint: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise InputError("no such file" if not p.exists() else "not a file", file=str(p), hint=hint)
    return p


def iter_jsonl(path: str | Path, *, hint: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every non-blank line of a JSONL (or .jsonl.gz/.bz2) file."""
    p = require_file(path, hint)
    try:
        with open_text(p) as fh:
            for n, raw in enumerate(fh, start=1):
                if not raw.strip():
                    continue
                try:
                    obj = json.loads(raw)
                except json.JSONDecodeError as err:
                    raise InputError(f"not valid JSON ({err.msg} at column {err.colno})",
                                     file=str(p), record=f"line {n}") from None
                if not isinstance(obj, dict):
                    raise InputError(f"expected a JSON object, got {type(obj).__name__}", file=str(p),
                                     record=f"line {n}")
                yield n, obj
    except (OSError, UnicodeDecodeError, EOFError) as err:
        raise InputError(f"cannot read: {err}", file=str(p)) from None


def field(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], *, file: str, line: int,
          hint: str | None = None, optional: bool = False) -> Any:
    """``obj[key]``, checked to be of ``kind``; a missing or mistyped field raises InputError."""
    if key not in obj or obj[key] is None:
        if optional:
            return None
        raise InputError("missing", file=file, record=f"line {line}", field=key, hint=hint)
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise InputError(f"expected {expected}, got {type(value).__name__}", file=file, record=f"line {line}",
                         field=key, hint=hint)
    return value


def check_limit(limit: int | None, few_shot: int) -> None:
    from ..errors import UsageError

    if limit is not None and limit < 1:
        raise UsageError(f"--limit must be at least 1 (got {limit})")
    if few_shot < 0:
        raise UsageError(f"--few-shot must be 0 or more (got {few_shot})")
