"""``bridge compact``: the training rows BRIDGE executes (compacted prompt + full response)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import EmptyResultError, UsageError
from ..format.reader import open_reader
from ..format.records import Example
from ..format.spec import PROMPT, RESPONSE
from ..io import atomic_path, is_stdio, open_text_output
from ..progress import note
from ..training.rows import Row, compact_row
from .common import now, require_stage

FORMATS = ("jsonl", "text")
META_SUFFIX = ".bridge.json"


@dataclass
class CompactOptions:
    inp: str | None = None
    out: str | None = None
    format: str = "jsonl"
    allow_empty: bool = False  # writing 0 rows: an error unless set


@dataclass
class CompactStats:
    rows: int = 0
    dropped: list[str] = field(default_factory=list)
    #: why each dropped row has no supervised token: reason -> count (see :func:`drop_reason`)
    reasons: dict[str, int] = field(default_factory=dict)
    read: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    supervised: int = 0
    response_tokens: int = 0


def supervision_of(example: Example) -> list[int]:
    """The final supervision set: the closure's when present, else the token-level selection."""
    if example.closure is not None:
        return example.closure.supervise
    return example.selection.response_keep


#: why a row keeps no supervised response token, worded for the warning compact prints
REASONS = {
    "no-response": "an empty response",
    "selection": "the selection supervises no response token (b_r = 0: is --rho-r 0 or too small?)",
    "too-long": "every structural unit is longer than the budget b_r (close keeps whole units only: a finer "
                "--segmenter, e.g. step or sentence, or a larger --rho-r keeps them)",
    "no-gain": "no unit that fits b_r has a positive score (close never chooses a unit with q(u) <= 0)",
}


def drop_reason(example: Example) -> str:
    """Why ``example`` keeps no supervised response token: a key of :data:`REASONS`."""
    if len(example.tokens.response_positions()) == 0:
        return "no-response"
    sel = example.selection
    if not sel.response_keep or sel.b_r == 0:
        return "selection"
    closure = example.closure
    if closure is not None and closure.units:
        sizes = [e - s for s, e in zip(closure.units[::2], closure.units[1::2])]
        if min(sizes) > sel.b_r:
            return "too-long"
    return "no-gain"


def explain_drops(stats: "CompactStats") -> str:
    return "; ".join(f"{n} with {REASONS[r]}" for r, n in sorted(stats.reasons.items(), key=lambda kv: -kv[1]))


def render_text(example: Example, row: Row, supervise: list[int]) -> str:
    """A human view: the executed prompt, then the response with supervised runs in [[ ]]."""
    kinds = np.frombuffer(example.tokens.kinds, dtype=np.uint8)
    spans = example.tokens.spans()
    keep = set(example.selection.prompt_keep)
    sup = set(supervise)
    prompt_parts, resp_parts, open_ = [], [], False
    for pos, kind in enumerate(kinds):
        s, e = spans[pos]
        piece = example.text[s:e]
        if kind == RESPONSE:
            if pos in sup and not open_:
                resp_parts.append("[[")
                open_ = True
            elif pos not in sup and open_:
                resp_parts.append("]]")
                open_ = False
            resp_parts.append(piece)
        elif kind == PROMPT:
            if pos in keep:
                prompt_parts.append(piece)
        elif not resp_parts:
            prompt_parts.append(piece)
    if open_:
        resp_parts.append("]]")
    n_p = int((kinds == PROMPT).sum())
    n_r = int((kinds == RESPONSE).sum())
    head = (f"### {example.id}  prompt kept {len(keep)}/{n_p}, supervised {len(sup)}/{n_r}, "
            f"executed {len(row.input_ids)}/{len(kinds)} tokens")
    return f"{head}\n{''.join(prompt_parts)}\n--- response ---\n{''.join(resp_parts)}\n"


def run_compact(opts: CompactOptions) -> CompactStats:
    if opts.format not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, got {opts.format!r}")
    stats = CompactStats()
    with open_reader(opts.inp) as reader:
        require_stage(reader.header, "selection", reader.name, "run `bridge select` (and `bridge close`) first")
        header = reader.header
        if header.stage == "selection":
            note("no closure step in this stream: supervising the token-level selection")
        with open_text_output(opts.out) as fh:
            for ex in reader:
                stats.read += 1
                supervise = supervision_of(ex)
                row = compact_row(ex.id, ex.tokens, ex.selection.prompt_keep, supervise)
                if not supervise:
                    stats.dropped.append(ex.id)
                    reason = drop_reason(ex)
                    stats.reasons[reason] = stats.reasons.get(reason, 0) + 1
                    continue
                stats.rows += 1
                stats.tokens_before += len(ex.tokens.input_ids)
                stats.response_tokens += len(ex.tokens.response_positions())
                stats.tokens_after += len(row.input_ids)
                stats.supervised += len(supervise)
                if opts.format == "jsonl":
                    fh.write(json.dumps({"id": row.id, "input_ids": row.input_ids, "labels": row.labels}) + "\n")
                else:
                    fh.write(render_text(ex, row, supervise) + "\n")
            if stats.rows == 0 and not opts.allow_empty:  # raised inside: no output file is left
                what = (f"all {stats.read} rows have no supervised response token: {explain_drops(stats)}"
                        if stats.read else "the stream holds no example")
                raise EmptyResultError(f"no training row to write; {what}", file=reader.name,
                                       hint="pass --allow-empty to write an empty file anyway")
    if stats.dropped:
        shown = ", ".join(stats.dropped[:5]) + (" ..." if len(stats.dropped) > 5 else "")
        most = len(stats.dropped) * 2 > stats.read
        note(("warning: " if most else "")
             + f"dropped {len(stats.dropped)} of {stats.read} rows with no supervised response token "
             f"({shown}): {explain_drops(stats)}")
    if stats.tokens_before:
        note(f"wrote {stats.rows} rows: {stats.tokens_after} executed tokens of {stats.tokens_before} "
             f"({stats.tokens_after / stats.tokens_before:.1%}), {stats.supervised} supervised of "
             f"{stats.response_tokens} response tokens")
    if not is_stdio(opts.out) and opts.format == "jsonl":
        meta = {
            "created": now(), "model": header.model.source, "model_fingerprint": header.model.fingerprint,
            "tokenizer_fingerprint": header.model.tokenizer_fingerprint,
            "steps": [{"step": s.step, "params": s.params} for s in header.steps],
            "rows": stats.rows, "dropped": stats.dropped, "tokens_executed": stats.tokens_after,
            "tokens_original": stats.tokens_before, "supervised": stats.supervised,
        }
        with atomic_path(meta_path(opts.out)) as tmp:
            Path(tmp).write_text(json.dumps(meta, indent=2))
    return stats


def meta_path(out: str | Path) -> Path:
    return Path(str(out) + META_SUFFIX)
