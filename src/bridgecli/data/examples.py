"""From a data file to tokenised :class:`Example` records (the ``tokens`` stage of a stream)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Iterator

from ..format.records import Example
from ..optionspec import count, internal, option
from .shapes import Pair, to_pair
from .sources import read_records
from .tokenize import tokenize_pair


@dataclass
class DataOptions:
    prompt_field: str | None = option(None, "Record field holding the prompt (overrides shape detection).")
    response_field: str | None = option(None, "Record field holding the response.")
    chat_template: bool = option(
        True, "Render with the tokenizer's chat template when it has one.", "--chat-template/--no-chat-template"
    )
    max_length: int | None = option(
        None,
        "Skip (and report) examples longer than this many tokens (score, warmup: "
        "default and upper bound the model's limit, max_position_embeddings).",
        range=count(),
    )
    split: str | None = option(None, "Split of a save_to_disk DatasetDict.")
    limit: int | None = option(None, "Use only the first N records.", range=count())
    #: ids left out (those warmup used; the step records how many)
    exclude_ids: frozenset[str] = internal(frozenset(), record=False)
    #: (rank, world): keep only records whose index is congruent to rank (before tokenising)
    shard: tuple[int, int] | None = internal(None, record=False)
    #: records before this index are read past, not used (the tokenising process's handover)
    start: int = internal(0, record=False)


@dataclass
class Report:
    """What was left out, for the end-of-step summary on stderr."""

    read: int = 0
    too_long: list[str] = field(default_factory=list)
    max_length: int | None = None
    excluded: int = 0

    def add(self, other: Report) -> None:
        """Take in ``other``'s counts (summed) and lists (joined after ours); a setting
        (``max_length``, the same for both) is taken from ``other`` where ours is unset."""
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, list):
                a.extend(b)
            elif f.name != "max_length" and type(a) is int and type(b) is int:
                setattr(self, f.name, a + b)
            elif a is None or a == f.default:
                setattr(self, f.name, b)

    def lines(self) -> list[str]:
        out = []
        if self.excluded:
            out.append(f"left out {self.excluded} examples used by warmup")
        if self.too_long:
            shown = ", ".join(self.too_long[:5]) + (" ..." if len(self.too_long) > 5 else "")
            out.append(f"skipped {len(self.too_long)} examples longer than --max-length {self.max_length} ({shown})")
        return out


def with_model_limit(opts: DataOptions, model) -> DataOptions:
    """``opts`` with ``max_length`` set to the model's limit (``max_position_embeddings``) when it is
    not given; :class:`UsageError` when it is given above that limit. Longer examples are then
    skipped and reported instead of running the model past what it was built for."""
    import dataclasses

    from ..errors import UsageError

    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if not isinstance(limit, int) or limit <= 0:
        return opts
    if opts.max_length is None:
        return dataclasses.replace(opts, max_length=limit)
    if opts.max_length > limit:
        raise UsageError(
            f"--max-length {opts.max_length} is beyond the model's limit of {limit} tokens",
            hint=f"leave --max-length out (default: {limit}) or lower it",
        )
    return opts


#: what the commands with DataOptions' flags (warmup, score, reference, analyze) tell a user whose data
#: is a ``save_to_disk`` folder of several splits, or has records of no known shape
CHOOSE_SPLIT = "choose one with --split"
NAME_FIELDS = "use --prompt-field and --response-field"


def iter_pairs(path: str | Path, opts: DataOptions) -> Iterator[tuple[int, str, Pair]]:
    """:func:`read_pairs` for a command with DataOptions' flags: its errors name them."""
    return read_pairs(path, opts, choose=CHOOSE_SPLIT, name_fields=NAME_FIELDS)


def read_pairs(
    path: str | Path, opts: DataOptions, *, choose: str | None = None, name_fields: str | None = None
) -> Iterator[tuple[int, str, Pair]]:
    """Yield ``(index, where, pair)``; ``index`` counts records in file order from 0. ``choose`` and
    ``name_fields``: the hints for a folder of several splits and a record of no known shape (default:
    what any caller can do; see :func:`~bridgecli.data.sources.read_records`, :func:`~.shapes.to_pair`)."""
    for index, (where, rec) in enumerate(read_records(path, opts.split, choose=choose)):
        if opts.limit is not None and index >= opts.limit:
            return
        if index < opts.start:
            continue
        if opts.shard is not None and index % opts.shard[1] != opts.shard[0]:
            continue
        yield (
            index,
            where,
            to_pair(
                rec,
                index,
                where,
                str(path),
                prompt_field=opts.prompt_field,
                response_field=opts.response_field,
                hint=name_fields,
            ),
        )


def iter_examples(path: str | Path, tokenizer, opts: DataOptions, report: Report | None = None) -> Iterator[Example]:
    report = report if report is not None else Report()
    for index, where, pair in iter_pairs(path, opts):
        ex = example_of(path, index, where, pair, tokenizer, opts, report)
        if ex is not None:
            yield ex


def example_of(
    path: str | Path, index: int, where: str, pair: Pair, tokenizer, opts: DataOptions, report: Report
) -> Example | None:
    """One record of :func:`iter_pairs` tokenised, or None when it is left out (counted in ``report``)."""
    report.read += 1
    if pair.id in opts.exclude_ids:
        report.excluded += 1
        return None
    tok = tokenize_pair(tokenizer, pair, chat_template=opts.chat_template, file=str(path), where=where)
    if opts.max_length is not None and len(tok.tokens.input_ids) > opts.max_length:
        report.too_long.append(pair.id)
        report.max_length = opts.max_length
        return None
    return Example(id=pair.id, index=index, text=tok.text, tokens=tok.tokens)


def file_digest(path: str | Path) -> str:
    """sha256 of a data file (or of a folder's files), to recognise the same data later."""
    p = Path(path)
    h = hashlib.sha256()
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return "sha256:" + h.hexdigest()
