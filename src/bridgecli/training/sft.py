"""The SFT loop shared by ``bridge warmup`` and ``bridge train``.

Loss: the token-level mean over supervised positions of the whole effective batch (the paper's
Z_r): every micro-batch contributes sum(token losses) / (supervised tokens in its optimizer step),
so gradient accumulation never changes the normalisation.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from ..io import atomic_dir
from .config import SFTConfig
from .rows import IGNORE, Row


def step_plan(rows: Sequence[Row], cfg: SFTConfig) -> list[list[list[int]]]:
    """Optimizer steps -> micro-batches -> row indices, shuffled per epoch with ``cfg.seed``.
    Fractional epochs take a prefix of the last shuffled epoch."""
    rng = random.Random(cfg.seed)
    per_step = cfg.batch_size * cfg.grad_accum
    total_rows = int(round(len(rows) * cfg.epochs))
    order: list[int] = []
    while len(order) < total_rows:
        idx = list(range(len(rows)))
        rng.shuffle(idx)
        order += idx
    order = order[:total_rows]
    steps = []
    for s in range(0, len(order), per_step):
        chunk = order[s:s + per_step]
        steps.append([chunk[m:m + cfg.batch_size] for m in range(0, len(chunk), cfg.batch_size)])
    if cfg.max_steps is not None:
        steps = steps[: cfg.max_steps]
    return steps


def cosine_lr(step: int, total: int, base: float, warmup_ratio: float) -> float:
    warm = max(1, int(math.ceil(total * warmup_ratio))) if warmup_ratio > 0 else 0
    if step < warm:
        return base * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return base * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def collate(rows: Sequence[Row], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    length = max(len(r.input_ids) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), length), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r.input_ids)
        ids[i, :n] = torch.as_tensor(r.input_ids)
        labels[i, :n] = torch.as_tensor(r.labels)
        mask[i, :n] = 1
    return ids.to(device), mask.to(device), labels.to(device)


def token_loss_sum(model, ids, mask, labels) -> torch.Tensor:
    """Sum of next-token cross-entropies over positions whose (unshifted) label is not -100."""
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    shift_logits = logits[:, :-1].float()
    shift_labels = labels[:, 1:]
    return F.cross_entropy(shift_logits.reshape(-1, shift_logits.shape[-1]), shift_labels.reshape(-1),
                           ignore_index=IGNORE, reduction="sum")


def accumulate(model, micro_batches: Sequence[Sequence[Row]], *, pad_id: int, device="cpu", bf16: bool = False) -> float:
    """Backward over the micro-batches of one optimizer step with the loss normalised by the
    step's total supervised tokens (Z_r), so gradients do not depend on how rows are grouped."""
    z = max(1, sum(r.supervised for mb in micro_batches for r in mb))
    total = 0.0
    for mb in micro_batches:
        ids, mask, labels = collate(mb, pad_id, device)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = token_loss_sum(model, ids, mask, labels) / z
        loss.backward()
        total += float(loss.detach())
    return total


def train(model, rows: Sequence[Row], cfg: SFTConfig, *, pad_id: int, device="cpu",
          on_step: Callable[[dict], None] | None = None, progress=None) -> list[dict]:
    """Run SFT in place on ``model``; return one metrics dict per optimizer step."""
    torch.manual_seed(cfg.seed)
    rows = [r for r in rows if r.supervised > 0]
    plan = step_plan(rows, cfg)
    if not plan:
        return []
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    model.train()
    history = []
    task = progress.add_task("training", total=len(plan)) if progress is not None else None
    use_bf16 = cfg.bf16 and str(device).startswith("cuda")
    for step, micro in enumerate(plan):
        lr = cosine_lr(step, len(plan), cfg.lr, cfg.warmup_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        z = max(1, sum(rows[i].supervised for mb in micro for i in mb))
        total = accumulate(model, [[rows[i] for i in mb] for mb in micro], pad_id=pad_id, device=device,
                           bf16=use_bf16)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
        opt.step()
        opt.zero_grad(set_to_none=True)
        rec = {"step": step + 1, "loss": total, "lr": lr, "grad_norm": grad_norm, "tokens": z,
               "rows": sum(len(mb) for mb in micro)}
        history.append(rec)
        if on_step is not None:
            on_step(rec)
        if progress is not None:
            progress.update(task, advance=1, description=f"training loss {total:.4f}")
    model.eval()
    return history


def save_model(model, tokenizer, folder: str | Path, extra: dict | None = None) -> Path:
    """Save an HF model folder atomically (temp folder + rename)."""
    with atomic_dir(folder) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if extra:
            (tmp / "bridge.json").write_text(json.dumps(extra, indent=2, default=str))
    return Path(folder)
