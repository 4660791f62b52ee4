"""Reading eval data files: compressed text, JSONL records, one-line errors naming file/line/field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, TypedDict

from ..data.sources import jsonl_objects
from ..errors import InputError


def require_file(path: str | Path, hint: str) -> Path:
    p = Path(path)
    if not p.is_file():
        raise InputError("no such file" if not p.exists() else "not a file", file=str(p), hint=hint)
    return p


def iter_jsonl(path: str | Path, *, hint: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for every non-blank line of a JSONL (or .jsonl.gz/.bz2) file."""
    p = require_file(path, hint)
    try:
        yield from jsonl_objects(p)
    except (OSError, UnicodeDecodeError, EOFError) as err:
        raise InputError(f"cannot read: {err}", file=str(p)) from None


class Where(TypedDict):
    """Where a record is, for :func:`field`'s errors: ``field(obj, key, kind, **where)``."""

    file: str
    line: int
    hint: str | None


def field(
    obj: dict[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    *,
    file: str,
    line: int,
    hint: str | None = None,
    optional: bool = False,
) -> Any:
    """``obj[key]``, checked to be of ``kind``; a missing or mistyped field raises InputError."""
    if key not in obj or obj[key] is None:
        if optional:
            return None
        raise InputError("missing", file=file, record=f"line {line}", field=key, hint=hint)
    value = obj[key]
    if (
        not isinstance(value, kind)
        or isinstance(value, bool)
        and bool not in (kind if isinstance(kind, tuple) else (kind,))
    ):
        expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise InputError(
            f"expected {expected}, got {type(value).__name__}", file=file, record=f"line {line}", field=key, hint=hint
        )
    return value


def check_limit(limit: int | None, few_shot: int) -> None:
    from ..errors import UsageError

    if limit is not None and limit < 1:
        raise UsageError(f"--limit must be at least 1 (got {limit})")
    if few_shot < 0:
        raise UsageError(f"--few-shot must be 0 or more (got {few_shot})")
