"""The one reader of the JSON files the steps leave for each other (``warmup.json``,
``bridge_train.json``, the rows' side file): decoded into their msgspec struct, or one error line; and
what a run's record (``warmup.json``, ``bridge_train.json``) starts with."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import msgspec

from ..errors import BridgeError, InputError

T = TypeVar("T")


class RunRecord(msgspec.Struct, kw_only=True):
    """The first fields of a run's record: what made it and when, and the base model it started from
    (its source, required, and fingerprint). The rest are the run's own."""

    producer: str | None = None
    created: str | None = None
    base_model: str
    base_fingerprint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)


def read_struct(path: Path, kind: type[T], what: str, error: type[BridgeError] = InputError) -> T | None:
    """The file at ``path`` decoded as ``kind``, or None when there is no file there. A file that is not
    valid JSON or not ``kind`` raises ``error`` naming the file: ``not WHAT: why``."""
    if not path.is_file():
        return None
    try:
        return msgspec.json.decode(path.read_bytes(), type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise error(f"not {what}: {exc}", file=str(path)) from None
