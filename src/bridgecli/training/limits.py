"""How long a training row may be, and what happens to a longer one.

The limit is the model's: ``max_position_embeddings`` of its config (or ``n_positions`` /
``max_sequence_length``, the names some configs use), else its tokenizer's ``model_max_length`` when
that is a real number and not transformers' "no limit" placeholder. :func:`model_limit` reads it from
the model's files without loading the model: a folder's ``config.json`` (and
``tokenizer_config.json``), the converted copy of a GGUF file or, before there is one, the GGUF's own
``<arch>.context_length`` metadata, and an HF id's files only when they are already in the local
hub cache (no network). ``bridge compact`` warns about rows over it; ``bridge train`` refuses them
before the first step, or clips them with ``--clip-long-rows`` (:class:`RowLimit`).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import InputError, ModelError

#: config names of the longest position a model was built for, in the order they are looked up
CONFIG_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length")
#: a tokenizer's ``model_max_length`` above this is transformers' "unset" placeholder (1e30), not a limit
SANE_TOKENIZER_LIMIT = 10_000_000
#: the flag that clips long rows instead of refusing them
CLIP_FLAG = "--clip-long-rows"


def limit_of_config(config: Any) -> int | None:
    """The model's position limit in a config dict (or in its ``text_config``), or None."""
    if not isinstance(config, dict):
        return None
    for key in CONFIG_KEYS:
        value = config.get(key)
        if type(value) is int and value > 0:
            return value
    return limit_of_config(config.get("text_config")) if "text_config" in config else None


def limit_of_tokenizer_config(config: Any) -> int | None:
    """A tokenizer config's ``model_max_length`` when it is a limit (a positive whole number no larger
    than :data:`SANE_TOKENIZER_LIMIT`), else None."""
    value = config.get("model_max_length") if isinstance(config, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    if 0 < value <= SANE_TOKENIZER_LIMIT and float(value).is_integer():
        return int(value)
    return None


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def limit_of_folder(folder: Path) -> tuple[int, str] | None:
    """(limit, where it comes from) from an HF model folder's files, or None."""
    limit = limit_of_config(_json(folder / "config.json"))
    if limit is not None:
        return limit, "max_position_embeddings"
    limit = limit_of_tokenizer_config(_json(folder / "tokenizer_config.json"))
    if limit is not None:
        return limit, "the tokenizer's model_max_length"
    return None


# GGUF metadata: value type -> struct format of a scalar (8: string, 9: array)
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_MAGIC = b"GGUF"
_GGUF_MAX_KEY = 1 << 16


def _gguf_value(fh: BinaryIO, kind: int, keep: bool) -> Any:
    """Read (``keep``) or skip one metadata value of type ``kind``."""
    if kind == 8:
        (size,) = struct.unpack("<Q", fh.read(8))
        if not keep or size > _GGUF_MAX_KEY:
            fh.seek(size, 1)
            return None
        return fh.read(size).decode("utf-8", "replace")
    if kind == 9:
        item, count = struct.unpack("<IQ", fh.read(12))
        if item in _GGUF_SCALARS:
            fh.seek(count * struct.calcsize("<" + _GGUF_SCALARS[item]), 1)
        else:
            for _ in range(count):
                _gguf_value(fh, item, False)
        return None
    fmt = "<" + _GGUF_SCALARS[kind]  # KeyError: a type this reader does not know
    (value,) = struct.unpack(fmt, fh.read(struct.calcsize(fmt)))
    return value


def limit_of_gguf(path: Path) -> int | None:
    """``<general.architecture>.context_length`` from a GGUF file's metadata (read up to that key only;
    no tensor is touched), or None."""
    try:
        with open(path, "rb") as fh:
            magic, version = fh.read(4), struct.unpack("<I", fh.read(4))[0]
            if magic != _GGUF_MAGIC or version < 2:
                return None
            _tensors, pairs = struct.unpack("<QQ", fh.read(16))
            arch = None
            found: dict[str, int] = {}
            for _ in range(pairs):
                (size,) = struct.unpack("<Q", fh.read(8))
                if size > _GGUF_MAX_KEY:  # not a GGUF this reader understands
                    return None
                key = fh.read(size).decode("utf-8", "replace")
                (kind,) = struct.unpack("<I", fh.read(4))
                wanted = key == "general.architecture" or key.endswith(".context_length")
                value = _gguf_value(fh, kind, wanted)
                if key == "general.architecture" and isinstance(value, str):
                    arch = value
                elif wanted and type(value) is int:
                    found[key] = value
                if arch is not None and f"{arch}.context_length" in found:
                    value = found[f"{arch}.context_length"]
                    return value if value > 0 else None
    except (OSError, struct.error, KeyError, ValueError, OverflowError):
        return None
    return None


def _hub_snapshot(repo: str) -> Path | None:
    """The local hub cache's snapshot folder of ``repo`` (its ``main`` revision, else any), or None: no
    network, and no more than ``huggingface_hub.constants`` imported."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return None
    base = Path(constants.HF_HUB_CACHE) / ("models--" + repo.replace("/", "--"))
    snapshots = base / "snapshots"
    if not snapshots.is_dir():
        return None
    try:
        main = (base / "refs" / "main").read_text().strip()
    except OSError:
        main = ""
    if main and (snapshots / main).is_dir():
        return snapshots / main
    found = sorted(p for p in snapshots.iterdir() if p.is_dir())
    return found[-1] if found else None


def model_limit(ref: Any) -> tuple[int, str] | None:
    """(the longest row the model takes, where that number comes from) for a resolved model
    (:func:`bridgecli.modeling.loading.resolve`), read from its files only; None when they are not
    here to read."""
    from ..modeling.loading import _converted_dir

    if ref.gguf_file:
        try:
            converted = _converted_dir(ref)
        except (OSError, ModelError):
            converted = None
        found = limit_of_folder(converted) if converted is not None else None
        if found is not None:
            return found
        limit = limit_of_gguf(Path(ref.path) / ref.gguf_file)
        return (limit, "the GGUF's context_length") if limit is not None else None
    folder = Path(ref.path)
    if folder.is_dir():
        return limit_of_folder(folder)
    snapshot = _hub_snapshot(ref.path)
    return limit_of_folder(snapshot) if snapshot is not None else None


def model_limit_of(spec: str | None) -> tuple[int, str] | None:
    """:func:`model_limit` of a ``--model`` value or a stream's model source; None also when it does
    not resolve here (a folder moved, the default model not installed)."""
    from ..modeling.loading import resolve

    try:
        return model_limit(resolve(spec))
    except (ModelError, OSError):
        return None


def row_limit(max_length: int | None, clip: bool, found: tuple[int, str] | None) -> RowLimit | None:
    """The :class:`RowLimit` of ``bridge train``: ``--max-length`` when given (a :class:`UsageError` above
    the model's limit ``found``, as in score and warmup), else the model's limit; None when neither is
    known."""
    from ..errors import UsageError

    if max_length is not None:
        if found is not None and max_length > found[0]:
            raise UsageError(
                f"--max-length {max_length} is beyond the model's limit of {found[0]} tokens ({found[1]})",
                hint=f"leave --max-length out (default: {found[0]}) or lower it",
            )
        return RowLimit(max_length, f"--max-length {max_length}", clip)
    if found is not None:
        return RowLimit(found[0], f"the model's limit of {found[0]:,} tokens ({found[1]})", clip)
    return None


@dataclass
class RowLimit:
    """The longest row ``bridge train`` takes, and what it does with a longer one: refuse it (the
    default) or, with ``clip``, keep its first ``max_length`` tokens and their labels. A clipped row
    that is left with no supervised label is dropped. :meth:`fit` applies it to one row and counts."""

    max_length: int
    #: how messages name the limit: ``--max-length 512``, ``the model's limit of 8,192 tokens (...)``
    what: str
    clip: bool = False
    clipped: int = 0
    longest: int = 0
    dropped: list[str] = field(default_factory=list)

    def fit(
        self, ids: list[int], labels: list[int], *, file: str, where: str, row_id: str | None
    ) -> tuple[list[int], list[int]] | None:
        """``(ids, labels)`` of one row within the limit: as they are when short enough, else cut to the
        first ``max_length`` positions (``clip``) or refused (:class:`InputError` naming the file, the
        row and its length). None for a clipped row left with no supervised label (counted in
        ``dropped``)."""
        n = len(ids)
        if n <= self.max_length:
            return ids, labels
        if not self.clip:
            record = where if row_id is None or row_id == where else f"{where} (id {row_id})"
            raise InputError(
                f"the row has {n:,} tokens, more than {self.what}",
                file=file,
                record=record,
                field="input_ids",
                hint=f"pass {CLIP_FLAG} to keep its first {self.max_length:,} tokens, or leave the row out",
            )
        self.clipped += 1
        self.longest = max(self.longest, n)
        ids, labels = ids[: self.max_length], labels[: self.max_length]
        if all(y == -100 for y in labels[1:]):  # position 0 predicts nothing: see Row.supervised
            self.dropped.append(row_id if row_id is not None else where)
            return None
        return ids, labels

    def fresh(self) -> "RowLimit":
        """The same limit with its counts at zero (for a second reading of the rows)."""
        return RowLimit(self.max_length, self.what, self.clip)

    def summary(self) -> str | None:
        """The note a clipping run prints, or None when no row was clipped."""
        if not self.clipped:
            return None
        text = (
            f"clipped {self.clipped} rows with more than {self.what} to their first {self.max_length:,} tokens "
            f"(the longest had {self.longest:,}; labels past that are not trained)"
        )
        if self.dropped:
            shown = ", ".join(self.dropped[:5]) + (" ..." if len(self.dropped) > 5 else "")
            text += f"; dropped {len(self.dropped)} of them left with no supervised label ({shown})"
        return text


__all__ = [
    "CLIP_FLAG",
    "CONFIG_KEYS",
    "SANE_TOKENIZER_LIMIT",
    "RowLimit",
    "limit_of_config",
    "limit_of_folder",
    "limit_of_gguf",
    "limit_of_tokenizer_config",
    "model_limit",
    "model_limit_of",
    "row_limit",
]
