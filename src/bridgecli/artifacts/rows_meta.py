"""The side file ``bridge compact`` writes next to its training rows (``OUT.bridge.json``), which
``bridge train`` reads to find the base model and check the tokenizer.

Rows given as a symbolic link have their side file beside the file (or folder) the link names,
named after it, where the rows themselves are written (:func:`bridgecli.io.real_path`): the rows and
their side file go together, whichever name a later command uses for them.

:func:`write_rows_meta` is the one writer, :func:`read_rows_meta` the one reader.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from .json_file import read_struct

SUFFIX = ".bridge.json"


class StepParams(msgspec.Struct):
    """One step of the stream the rows came from, and its parameters."""

    step: str
    params: dict[str, Any] = {}


class RowsMeta(msgspec.Struct, kw_only=True):
    """What the rows are: their format and columns, the model they were tokenised for, the steps
    behind them and their counts. Every field is optional, so that a file that records less reads."""

    created: str | None = None
    format: str | None = None
    columns: list[str] | None = None
    model: str | None = None
    model_fingerprint: str | None = None
    tokenizer_fingerprint: str | None = None
    steps: list[StepParams] = []
    rows: int | None = None
    dropped: list[str] = []
    tokens_executed: int | None = None
    #: the tokens of the examples that have a row, before compaction
    tokens_original: int | None = None
    supervised: int | None = None
    #: every example of the stream and its tokens, those without a row too (an example-level selection
    #: leaves out whole examples)
    examples_read: int | None = None
    tokens_read: int | None = None
    #: ``compact --trim-tail``: rows cut after their last supervised response token, and the tokens cut
    trim_tail: bool = False
    tokens_trimmed: int | None = None


def rows_meta_path(rows: str | Path) -> Path:
    """The side file of the rows at ``rows`` (a file or a folder): beside the rows the name leads to,
    symbolic links followed."""
    from ..io import real_path

    return Path(str(real_path(rows)) + SUFFIX)


def write_rows_meta(rows: str | Path, meta: RowsMeta) -> Path:
    from ..io import atomic_path

    path = rows_meta_path(rows)
    try:
        with atomic_path(path) as tmp:
            Path(tmp).write_text(json.dumps(msgspec.to_builtins(meta), indent=2))
    except BaseException:
        # the rows are written already: an earlier side file would describe other rows (a full disk)
        path.unlink(missing_ok=True)
        raise
    return path


def read_rows_meta(rows: str | Path) -> RowsMeta | None:
    """The side file of ``rows``, or None when there is none (rows made by another tool). Rows named
    through a symbolic link whose target has no side file: the one beside the link, if any (where
    compact wrote it before it followed links)."""
    path = rows_meta_path(rows)
    if not path.is_file():
        path = Path(str(rows) + SUFFIX)
    return read_struct(path, RowsMeta, "the side file `bridge compact` writes")
