"""Typed errors. Every error the CLI reports is one line, names where it happened, and maps to an exit code."""

from __future__ import annotations

from .display import printable


class BridgeError(Exception):
    """Base class: a problem the user can fix. The CLI prints ``str(err)`` on one line and exits ``exit_code``."""

    exit_code = 1

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        record: int | str | None = None,
        field: str | None = None,
        hint: str | None = None,
    ):
        self.message = message
        self.file = file
        self.record = record
        self.field = field
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        where = []
        if self.file is not None:
            where.append(str(self.file))
        if self.record is not None and self.record != "":
            # "line 12", "row 3", "item 0", "header" are already descriptive; bare numbers are record indices
            where.append(
                self.record if isinstance(self.record, str) and not self.record.isdigit() else f"record {self.record}"
            )
        if self.field is not None:
            where.append(f"field '{self.field}'")
        text = ": ".join([", ".join(where), self.message]) if where else self.message
        if self.hint:
            text += f" ({self.hint})"
        # one line, and no control character from the data it names reaches the terminal
        return printable(" ".join(text.split("\n")))


class EmptyResultError(BridgeError):
    """A step that would keep no example or row (an empty input, a selection that supervises
    nothing): an error unless the user passed ``--allow-empty``."""

    exit_code = 1


class UsageError(BridgeError):
    """Bad flags or combinations of flags."""

    exit_code = 2


class FormatError(BridgeError):
    """A bridge stream file that cannot be read: wrong magic, newer major version, truncated, corrupted."""

    exit_code = 3


class InputError(BridgeError):
    """A data file (JSONL, JSON, Parquet, ...) whose records cannot be understood."""

    exit_code = 4


class ModelError(BridgeError):
    """A model, tokenizer or run folder that cannot be used."""

    exit_code = 5


class PluginError(BridgeError):
    """A plugin that is missing, collides with another, or misbehaves."""

    exit_code = 6


class WriteError(BridgeError):
    """An output that could not be written: the disk or quota is full, the file outgrew the size limit,
    the device failed. The output's temporary files are removed and an earlier output is kept."""

    exit_code = 7
