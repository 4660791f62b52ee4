"""``bridge compact``: the training rows BRIDGE executes (compacted prompt + full response)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import UsageError
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


@dataclass
class CompactStats:
    rows: int = 0
    dropped: list[str] = field(default_factory=list)
    tokens_before: int = 0
    tokens_after: int = 0
    supervised: int = 0
    response_tokens: int = 0


def supervision_of(example: Example) -> list[int]:
    """The final supervision set: the closure's when present, else the token-level selection."""
    if example.closure is not None:
        return example.closure.supervise
    return example.selection.response_keep


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
        # every row names its tokenizer: train checks it even when the side file is gone (TRL and
        # other trainers select the columns they use)
        fp = header.model.tokenizer_fingerprint
        fingerprint = {"tokenizer_fingerprint": fp} if fp else {}
        with open_text_output(opts.out) as fh:
            for ex in reader:
                supervise = supervision_of(ex)
                row = compact_row(ex.id, ex.tokens, ex.selection.prompt_keep, supervise)
                if not supervise:
                    stats.dropped.append(ex.id)
                    continue
                stats.rows += 1
                stats.tokens_before += len(ex.tokens.input_ids)
                stats.response_tokens += len(ex.tokens.response_positions())
                stats.tokens_after += len(row.input_ids)
                stats.supervised += len(supervise)
                if opts.format == "jsonl":
                    fh.write(json.dumps({"id": row.id, "input_ids": row.input_ids, "labels": row.labels,
                                         **fingerprint}) + "\n")
                else:
                    fh.write(render_text(ex, row, supervise) + "\n")
    if stats.dropped:
        shown = ", ".join(stats.dropped[:5]) + (" ..." if len(stats.dropped) > 5 else "")
        note(f"dropped {len(stats.dropped)} rows with no supervised response token ({shown})")
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
