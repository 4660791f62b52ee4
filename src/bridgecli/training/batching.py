"""From rows to optimizer steps to micro-batches to tensors.

An optimizer step is a fixed number of rows (``batch_size * grad_accum``, the paper's effective
batch 64), shuffled per epoch with the seed. How a step is cut into micro-batches only changes the
floating-point summation order, never the gradient: the loss is normalised by the step's total
supervised tokens (Z_r), which every rank knows from the plan.

Two ways to cut a step:

- packing (padding-free): rows are bin-packed (first-fit decreasing) into sequences of at most
  ``pack_length`` tokens; each sequence is one line of the micro-batch, its ``position_ids``
  restarting at 0 for every row, with no attention mask. transformers then builds a
  block-diagonal causal mask (``masking_utils.find_packed_sequence_indices``; flash attention
  takes the same position ids as varlen boundaries, with one line per micro-batch), so no token
  attends across rows. Only the short tail of each line is padding. Keeping lines short (about the
  longest row) keeps the dense attention kernels (sdpa, eager) from computing a huge masked square:
  their cost per token grows with the line length.
- bucketing: one row per line, rows sorted by length and right-padded with an attention mask (the
  fallback for architectures whose packed forward does not match separate forwards).

With ``max_tokens_per_batch`` a micro-batch computes at most that many tokens (lines x the
longest line); a single longer line is a micro-batch on its own. Without it, a micro-batch takes
``batch_size`` rows of the step (packed into as few lines as ``pack_length`` allows).
"""

from __future__ import annotations

import hashlib
import json
from array import array
import random
from dataclasses import dataclass
from typing import Sequence

import torch

from .config import SFTConfig
from .rows import IGNORE, Row


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [B, L]
    labels: torch.Tensor  # [B, L], unshifted, IGNORE where no loss
    attention_mask: torch.Tensor | None  # [B, L] for padded batches, None when packed
    position_ids: torch.Tensor | None  # [1, L] restarting per row when packed, None when padded
    rows: int
    tokens: int  # real (executed) tokens
    computed: int  # tokens the forward computes, padding included
    keep: torch.Tensor | None = None  # [B, L] bool: the positions whose next token carries loss
    target: torch.Tensor | None = None  # [n] those next tokens, in row-major order of ``keep``
    weights: torch.Tensor | None = None  # [B, L] float32 loss weights aligned with ``labels`` (None: all 1)
    target_weight: torch.Tensor | None = None  # [n] the weights of ``target``

    def __post_init__(self):
        if self.keep is None:  # computed here, on the CPU, so the device never syncs for them
            self.keep = torch.zeros_like(self.labels, dtype=torch.bool)
            self.keep[:, :-1] = self.labels[:, 1:] != IGNORE
            self.target = self.labels[:, 1:][self.keep[:, :-1]]
            if self.weights is not None:
                self.target_weight = self.weights[:, 1:][self.keep[:, :-1]]

    def to(self, device) -> "MicroBatch":
        def move(t):
            return None if t is None else t.to(device, non_blocking=True)

        return MicroBatch(
            move(self.input_ids),
            move(self.labels),
            move(self.attention_mask),
            move(self.position_ids),
            self.rows,
            self.tokens,
            self.computed,
            move(self.keep),
            move(self.target),
            move(self.weights),
            move(self.target_weight),
        )


def step_rows(n_rows: int, cfg: SFTConfig) -> list[list[int]]:
    """Optimizer steps -> row indices, shuffled per epoch with ``cfg.seed``. Fractional epochs
    take a prefix of the last shuffled epoch; ``max_steps`` truncates."""
    rng = random.Random(cfg.seed)
    per_step = cfg.rows_per_step
    total_rows = int(round(n_rows * cfg.epochs))
    order: list[int] = []
    while len(order) < total_rows:
        idx = list(range(n_rows))
        rng.shuffle(idx)
        order += idx
    order = order[:total_rows]
    steps = [order[s : s + per_step] for s in range(0, len(order), per_step)]
    if cfg.max_steps is not None:
        steps = steps[: cfg.max_steps]
    return steps


def plan_digest(steps: Sequence[Sequence[int]], rows: Sequence[Row]) -> str:
    """Identity of the data order and content, stored in checkpoints so ``--resume`` can refuse
    to continue a run on other data or another order."""
    h = hashlib.sha256()
    for r in rows:
        h.update(len(r.input_ids).to_bytes(4, "little"))
        h.update(array("q", r.input_ids).tobytes())
        h.update(array("q", r.labels).tobytes())
        if r.weights is not None:
            h.update(array("d", r.weights).tobytes())
    h.update(json.dumps(steps).encode())
    return "sha256:" + h.hexdigest()[:32]


def split_ranks(rows: Sequence[Row], idx: Sequence[int], world: int) -> list[list[int]]:
    """Deal a step's rows to ``world`` ranks, balancing tokens (longest first to the least loaded
    rank). Deterministic, so every rank computes the same split without communicating."""
    if world == 1:
        return [list(idx)]
    load = [0] * world
    out: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(idx, key=lambda i: (-len(rows[i].input_ids), i)):
        r = min(range(world), key=lambda k: (load[k], len(out[k]), k))
        out[r].append(i)
        load[r] += len(rows[i].input_ids)
    return out


def ffd(rows: Sequence[Row], idx: Sequence[int], cap: int) -> list[list[int]]:
    """First-fit-decreasing bin packing of rows into sequences of at most ``cap`` tokens (a row
    longer than ``cap`` is a sequence of its own)."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(idx, key=lambda i: (-len(rows[i].input_ids), i)):
        n = len(rows[i].input_ids)
        for b, free in enumerate(room):
            if n <= free:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(max(0, cap - n))
    return bins


def micro_batches(
    rows: Sequence[Row],
    idx: Sequence[int],
    *,
    packing: bool,
    batch_size: int,
    max_tokens: int | None,
    pack_length: int | None = None,
) -> list[list[list[int]]]:
    """Cut one rank's rows of a step into micro-batches of sequences of row indices.

    Bucketing: every sequence is one row. Packing: a sequence is several rows of at most
    ``pack_length`` tokens together (``None``: no limit), and a micro-batch stacks sequences
    (padded to the longest). See the module docstring for the budgets."""
    if not idx:
        return []
    length = {i: len(rows[i].input_ids) for i in idx}
    by_length = sorted(idx, key=lambda i: (-length[i], i))
    if packing:
        if max_tokens is None:
            cap = pack_length or sum(length.values())
            return [ffd(rows, idx[s : s + batch_size], cap) for s in range(0, len(idx), batch_size)]
        cap = min(pack_length or max_tokens, max_tokens)
        seqs = sorted(ffd(rows, idx, cap), key=lambda q: -sum(length[i] for i in q))
        lens = [sum(length[i] for i in q) for q in seqs]
    else:
        if max_tokens is None:
            return [[[i] for i in by_length[s : s + batch_size]] for s in range(0, len(by_length), batch_size)]
        seqs = [[i] for i in by_length]
        lens = [length[i] for i in by_length]
    out: list[list[list[int]]] = []  # sequences longest first; cut where count x longest > budget
    cur: list[list[int]] = []
    longest = 0
    for q, n in zip(seqs, lens):
        if cur and (len(cur) + 1) * longest > max_tokens:
            out.append(cur)
            cur = []
        if not cur:
            longest = n
        cur.append(q)
    if cur:
        out.append(cur)
    return out


def step_plan(
    rows: Sequence[Row],
    cfg: SFTConfig,
    *,
    packing: bool = False,
    rank: int = 0,
    world: int = 1,
    pack_length: int | None = None,
) -> list[list[list[list[int]]]]:
    """Optimizer steps -> this rank's micro-batches -> sequences -> row indices."""
    return [
        micro_batches(
            rows,
            split_ranks(rows, step, world)[rank],
            packing=packing,
            batch_size=cfg.batch_size,
            max_tokens=cfg.max_tokens_per_batch,
            pack_length=pack_length,
        )
        for step in step_rows(len(rows), cfg)
    ]


def collate_padded(rows: Sequence[Row], pad_id: int) -> MicroBatch:
    """Right-padded batch with an attention mask, one row per line."""
    length = max(len(r.input_ids) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), length), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    weights = torch.ones((len(rows), length), dtype=torch.float32) if _weighted(rows) else None
    for i, r in enumerate(rows):
        n = len(r.input_ids)
        ids[i, :n] = torch.as_tensor(r.input_ids)
        labels[i, :n] = torch.as_tensor(r.labels)
        mask[i, :n] = 1
        if weights is not None and r.weights is not None:
            weights[i, :n] = torch.as_tensor(r.weights, dtype=torch.float32)
    labels[:, 0] = IGNORE  # position 0 has no preceding token
    return MicroBatch(
        ids, labels, mask, None, len(rows), sum(len(r.input_ids) for r in rows), len(rows) * length, weights=weights
    )


def _weighted(rows) -> bool:
    return any(r.weights is not None for r in rows)


def collate_packed(seqs: Sequence[Sequence[Row]], pad_id: int = 0) -> MicroBatch:
    """One line per sequence: its rows concatenated, position ids restarting at 0 for each row, the
    label at each row's first position ignored (it would be predicted from the previous row). Lines
    are padded to the longest; a padding tail is a block of its own (positions from 0 again, no
    label), so no real token attends to it or it to them. No attention mask: transformers derives
    the block-diagonal causal mask from the position ids."""
    lines = []
    weighted = any(_weighted(seq) for seq in seqs)
    line_weights: list[list[float]] = []
    for seq in seqs:
        ids: list[int] = []
        labels: list[int] = []
        pos: list[int] = []
        w: list[float] = []
        for r in seq:
            ids += r.input_ids
            labels += [IGNORE] + list(r.labels[1:])
            pos += range(len(r.input_ids))
            if weighted:
                w += r.weights if r.weights is not None else [1.0] * len(r.input_ids)
        lines.append((ids, labels, pos))
        line_weights.append(w)
    width = max(len(ids) for ids, _, _ in lines)
    real = sum(len(ids) for ids, _, _ in lines)
    out_ids = torch.full((len(lines), width), pad_id, dtype=torch.long)
    out_labels = torch.full((len(lines), width), IGNORE, dtype=torch.long)
    out_pos = torch.zeros((len(lines), width), dtype=torch.long)
    out_weights = torch.ones((len(lines), width), dtype=torch.float32) if weighted else None
    for b, (ids, labels, pos) in enumerate(lines):
        n = len(ids)
        out_ids[b, :n] = torch.as_tensor(ids)
        out_labels[b, :n] = torch.as_tensor(labels)
        out_pos[b, :n] = torch.as_tensor(pos)
        out_pos[b, n:] = torch.arange(width - n)
        if out_weights is not None:
            out_weights[b, :n] = torch.as_tensor(line_weights[b], dtype=torch.float32)
    return MicroBatch(
        out_ids, out_labels, None, out_pos, sum(len(q) for q in seqs), real, len(lines) * width, weights=out_weights
    )


def collate(seqs: Sequence[Sequence[Row]], pad_id: int, *, packing: bool = False) -> MicroBatch:
    """A micro-batch of sequences (packing) or of one-row sequences (padding)."""
    if packing:
        return collate_packed(seqs, pad_id)
    return collate_padded([r for seq in seqs for r in seq], pad_id)


def dummy_batch(pad_id: int) -> MicroBatch:
    """A one-token micro-batch with no loss: a rank with fewer micro-batches than the others in a
    step runs it so that every rank joins the same number of gradient synchronisations."""
    ids = torch.tensor([[pad_id]], dtype=torch.long)
    return MicroBatch(ids, torch.tensor([[IGNORE]]), torch.ones_like(ids), None, 0, 0, 1)
