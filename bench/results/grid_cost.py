"""What a grid row costs as a user pays it: training FLOPs from a stated formula over executed tokens, the
GPU-seconds of the whole pipeline the row needs, and the step count of a compute-matched full-SFT control.

The formula (stated in docs/results.md, "Cost as users pay it"; computed by bridgecli.training.flops, which
`bridge train` also records in each step's metrics and its bridge_train.json): a forward pass over a row of
``s`` tokens costs

    F(s) = 2 * N_mm * s + 2 * L * d_attn * s**2

where ``N_mm`` is the number of weights used in matrix products per token (every block's attention and MLP
projections and the output head; the embedding lookup is free), ``L`` the number of blocks and ``d_attn`` the
query width (heads x head dim): QK^T and AV each cost 2 * d_attn multiply-adds per key attended, and a causal
row attends s/2 keys on average. Training costs three forward passes (the backward pass two), so a training
run costs ``3 * sum F(s)`` over the rows it executes, padding excluded (padded positions are counted apart, as
``computed`` tokens, from the training log).

    grid_cost.py match FULL_ROWS SELECTED_ROWS CONFIG EPOCHS ROWS_PER_STEP
        the --max-steps of a full-SFT run over FULL_ROWS that costs what EPOCHS epochs over SELECTED_ROWS cost
    grid_cost.py flops ROWS CONFIG [EPOCHS]
        the training FLOPs of EPOCHS epochs over ROWS (a compacted train.jsonl), and the tokens
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from bridgecli.training.flops import Shape, rows_flops, shape_of

# The shared steps (grid.sh's done marks) that each row's pipeline needs, as a user would run it: a random draw
# and full SFT need no warm-up or scoring; every row that reads a_j, the warm-up model's loss or a reference pass
# needs the steps that make it. A row's GPU-seconds are these plus its own select, close, compact and train.
_SCORED = ("warmup", "score")
NEEDS: dict[str, tuple[str, ...]] = {
    "base": (),
    "full": (),
    "random": (),
    "random-close": (),
    "random-resp": (),
    "rho1": ("warmup", "score", "ref-base", "ref-warmup"),
    "tokencleaning": ("warmup", "score", "ref-base", "ref-warmup"),
    "llm+tc": ("warmup", "score", "ref-base", "ref-warmup"),
    "bridge-atp": ("warmup", "score-atp"),
    "rho-loss": ("warmup", "score", "ref-base"),
    "bridge-debiased": ("warmup", "score-debiased"),
    "bridge-resp-debiased": ("warmup", "score-debiased"),
}


def needs(method: str) -> tuple[str, ...]:
    """The shared steps ``method``'s pipeline runs (a control ``full-match-X`` is full SFT: none; ``X-trim``
    what X needs)."""
    if method.startswith("full-match-"):
        return ()
    if method.endswith("-trim"):
        return needs(method[: -len("-trim")])
    return NEEDS.get(method, _SCORED)


def matmul_params(cfg: dict) -> tuple[int, int, int]:
    """``(N_mm, L, d_attn)`` of a decoder-only transformer's HF config (Llama, Qwen2, Gemma, SmolLM shapes):
    per block q, k, v, o and a gated MLP (gate, up, down), and the output head (tied or not, it is a product);
    bridgecli.training.flops.shape_of, the one place the formula lives (`bridge train` records it too)."""
    shape = shape_of(cfg)
    if shape is None:
        raise ValueError("the FLOPs formula describes dense decoder configs only (hidden_size, num_hidden_layers, ...)")
    return shape.n_mm, shape.layers, shape.d_attn


def row_lengths(rows: Path) -> list[int]:
    """Each compacted row's token count (``input_ids``), in file order."""
    with open(rows, encoding="utf-8") as f:
        return [len(json.loads(line)["input_ids"]) for line in f if line.strip()]


def train_flops(lengths: list[int], cfg: dict, epochs: float = 1.0) -> float:
    """``3 * sum F(s)`` over ``epochs`` passes of rows of these lengths."""
    return epochs * rows_flops(lengths, Shape(*matmul_params(cfg)))


def consumed_flops(lengths: list[int], cfg: dict, executed: int) -> float:
    """The training FLOPs of a run that executed ``executed`` real tokens of these rows (a run stopped by
    --max-steps consumes part of an epoch): the rows' FLOPs per token, times ``executed``."""
    total = sum(lengths)
    return train_flops(lengths, cfg) * executed / total if total else 0.0


def steps_per_epoch(rows: int, rows_per_step: int) -> int:
    return math.ceil(rows / rows_per_step)


def matched_steps(full: list[int], selected: list[int], cfg: dict, epochs: int, rows_per_step: int) -> int:
    """The --max-steps at which full SFT over ``full`` has spent what ``epochs`` epochs over ``selected`` cost:
    full SFT's whole schedule (``epochs`` epochs) scaled by the FLOPs ratio, rounded, at least one step."""
    ratio = train_flops(selected, cfg) / train_flops(full, cfg)
    return max(1, round(epochs * steps_per_epoch(len(full), rows_per_step) * ratio))


def training_log(metrics: Path) -> dict[str, float]:
    """Sums over a training log's steps (``metrics.jsonl``): real tokens executed, tokens computed with padding,
    rows, steps (a resumed run's log holds each step once: the last record of a step wins), the steps' own
    seconds (``step_time``: forward, backward and optimizer; not the model's load or the checkpoints), and the
    seconds between steps (``elapsed`` minus the steps' own time: the checkpoints of ``--save-every``, 6-10 s
    each for a 0.5B model on an H200, and a fraction of a second in all for the rows' loading and the log)."""
    steps: dict[int, dict] = {}
    if metrics.is_file():
        for line in metrics.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line) if line.strip() else {}
            if "step" in rec and "executed_tokens" in rec:
                steps[rec["step"]] = rec
    return {
        "steps": len(steps),
        "executed": sum(r["executed_tokens"] for r in steps.values()),
        "computed": sum(r.get("computed_tokens") or r["executed_tokens"] for r in steps.values()),
        "rows": sum(r.get("rows", 0) for r in steps.values()),
        "step_seconds": round(sum(r.get("step_time") or 0.0 for r in steps.values()), 1),
        "between_steps_seconds": _between_steps(steps),
    }


def _between_steps(steps: dict[int, dict]) -> float:
    """The time a run spent between its steps: each step's ``elapsed`` less the last step's and its own
    ``step_time``, summed over consecutive logged steps (a resumed run's gap at the resume is left out)."""
    total = 0.0
    for s, rec in steps.items():
        before = steps.get(s - 1)
        if before is None or rec.get("elapsed") is None or before.get("elapsed") is None or "step_time" not in rec:
            continue
        gap = rec["elapsed"] - before["elapsed"] - rec["step_time"]
        if gap >= 0:  # a resumed run's clock restarts: its first step after the resume is left out
            total += gap
    return round(total, 1)


def main(argv: list[str]) -> None:
    if argv[:1] == ["match"] and len(argv) == 6:
        full, selected, cfg = (
            row_lengths(Path(argv[1])),
            row_lengths(Path(argv[2])),
            json.loads(Path(argv[3]).read_text()),
        )
        print(matched_steps(full, selected, cfg, int(argv[4]), int(argv[5])))
    elif argv[:1] == ["flops"] and len(argv) in (3, 4):
        lengths, cfg = row_lengths(Path(argv[1])), json.loads(Path(argv[2]).read_text())
        epochs = float(argv[3]) if len(argv) == 4 else 1.0
        print(json.dumps({"rows": len(lengths), "tokens": sum(lengths), "flops": train_flops(lengths, cfg, epochs)}))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
