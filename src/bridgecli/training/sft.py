"""The SFT loop shared by ``bridge warmup`` and ``bridge train``.

Loss: the token-level mean over supervised positions of the whole effective batch (the paper's
Z_r). Every micro-batch contributes sum(token losses) / Z, where Z is the number of supervised
tokens of its optimizer step over all ranks, known to every rank from the (seeded) plan; so neither
gradient accumulation, nor packing, nor the number of processes changes the normalisation. Under
DDP/FSDP the gradients are averaged over ranks, hence each rank backpropagates
``world_size * sum / Z``.

Efficiency: micro-batches are packed padding-free (or length-bucketed, see batching.py) and the
output head runs only on the positions that carry loss, a chunk of them at a time (loss.py), so
executed tokens, not padding or unsupervised positions, set the cost. Attention never runs cuDNN's
kernel (modeling/sdpa_backends.py: its backward gave NaN gradients for some masked shapes in bf16).

Distribution goes through accelerate (``torchrun``/``accelerate launch`` start the processes;
DDP or FSDP as accelerate is configured); the data plan is the same on every rank, each rank takes
its token-balanced share of every step, and only rank 0 writes metrics, checkpoints and models.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from ..artifacts.train_run import METRICS
from ..errors import UsageError
from ..io import atomic_dir
from ..modeling.sdpa_backends import training_backends
from ..progress import note
from ..runtime.precision import use_tf32
from . import checkpoint
from .batching import collate, dummy_batch, micro_batches, plan_digest, split_ranks, step_plan, step_rows
from .guard import check_finite
from .config import RESUMABLE_CHANGES, SFTConfig, config_dict
from .flops import Shape, rows_flops, shape_of, steps_for_flops
from .loss import accumulate, dummy_loss, token_loss_sum
from .packing import check_packing, one_line
from .rows import Row

if TYPE_CHECKING:
    from accelerate import Accelerator

__all__ = [
    "FitResult",
    "SFTConfig",
    "accumulate",
    "check_resume",
    "cosine_lr",
    "fit",
    "make_accelerator",
    "training_plan",
    "check_max_flops",
    "resolve_max_flops",
    "resolve_packing",
    "save_model",
    "step_plan",
    "step_rows",
    "token_loss_sum",
    "train",
]


def cosine_lr(step: int, total: int, base: float, warmup_ratio: float) -> float:
    """The learning rate of optimizer step ``step`` (0-based) of ``total``: a linear warmup over
    ceil(total x warmup_ratio) steps that reaches ``base`` on its last step, then a cosine decay
    toward 0 that starts moving on the very next step (a 2-step run: base, base/2) and never
    reaches 0 on a step that still trains. Without warmup the decay starts at ``base`` on step 0."""
    warm = max(1, int(math.ceil(total * warmup_ratio))) if warmup_ratio > 0 else 0
    if step < warm:
        return base * (step + 1) / warm
    if warm:  # the peak was the warmup's last step
        progress = (step - warm + 1) / max(1, total - warm + 1)
    else:
        progress = step / max(1, total)
    return base * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


# ---------------------------------------------------------------------------------------------
# setup


def make_accelerator(device: str = "cpu", bf16: bool = False):
    """An ``accelerate.Accelerator`` for this process (one per process; torchrun/accelerate
    launch decide how many). Mixed precision bf16 only on CUDA."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    kwargs = {"cpu": not str(device).startswith("cuda"), "mixed_precision": "bf16" if bf16 else "no"}
    try:
        return Accelerator(**kwargs)
    except ValueError:  # an earlier Accelerator of this (single) process was made with other settings
        AcceleratorState._reset_state(reset_partial_state=True)
        return Accelerator(**kwargs)


def resolve_packing(model, requested: bool | None) -> tuple[bool, str]:
    """``--packing`` forces it (after the same check, which must pass), ``--no-packing`` turns it
    off, the default packs where the check passes."""
    if requested is False:
        return False, "length bucketing (--no-packing)"
    ok, why = check_packing(model)
    if ok:
        return True, f"padding-free packing ({why})"
    if requested:
        raise UsageError(f"packing is not exact for this model: {why}", hint="train with --no-packing")
    return False, f"length bucketing: packing is not exact for this model ({why})"


def resolve_pack_length(model, rows: Sequence[Row], cfg: SFTConfig) -> int | None:
    """``cfg.pack_length``, else one line per micro-batch for flash attention (true varlen: no
    wasted attention), else the longest row rounded up to 64 (dense kernels compute lines x
    length^2 attention, so lines stay short and full)."""
    if cfg.pack_length is not None:
        return cfg.pack_length
    if one_line(model):
        return None
    longest = max((len(r.input_ids) for r in rows), default=1)
    return -(-longest // 64) * 64


@dataclass
class FitResult:
    history: list[dict]
    model: Any  # the unwrapped model, trained in place (a PreTrainedModel; a peft PeftModel with --lora)
    accelerator: Accelerator
    packing: bool
    packing_note: str
    resumed_from: int = 0
    plan_digest: str = ""
    steps_total: int = 0
    prepared: Any = None  # the model as accelerate wrapped it (DDP/FSDP), for gathering its state


def training_plan(rows: Sequence[Row], cfg: SFTConfig) -> tuple[list[Row], list[list[int]], str]:
    """What :func:`fit` trains on: the rows with a supervised token (in order), the rows of each optimizer
    step, and their :func:`plan_digest` (what a resume compares with the run it continues)."""
    rows = [r for r in rows if r.supervised > 0]
    steps = step_rows(len(rows), cfg)
    return rows, steps, plan_digest(steps, rows)


def check_resume(state: dict, cfg: SFTConfig, digest: str, world: int, meta: dict | None, where: Path) -> None:
    """Refuse (:class:`UsageError` naming ``where``) to continue a run whose recorded ``state`` (a checkpoint's
    ``trainer_state.json``, or what a finished run's summary records) was made with other settings than
    ``cfg`` (those of :data:`RESUMABLE_CHANGES` and bf16 may change), on other data or another data order
    (``digest``), by another number of processes or from another base model (``meta``)."""
    saved = state.get("config", {})
    now = config_dict(cfg)
    diffs = [
        f"{k}={saved.get(k)!r} (now {now[k]!r})"
        for k in now
        if k not in RESUMABLE_CHANGES and k != "bf16" and saved.get(k) != now[k]
    ]
    if diffs:
        raise UsageError(
            f"{where} was made with other settings: {', '.join(diffs)}",
            hint="resume with the flags of the original run",
        )
    if state.get("plan_digest") != digest:
        raise UsageError(
            f"{where} was made on other data or another data order", hint="resume with the same data file and seed"
        )
    if state.get("world_size") != world:
        raise UsageError(
            f"{where} was made by {state.get('world_size')} processes, this run has {world}",
            hint="resume with the same number of processes",
        )
    for k, v in (meta or {}).items():
        if k in state.get("meta", {}) and state["meta"][k] != v:
            raise UsageError(f"{where} was made with {k} {state['meta'][k]}, this run has {v}")


# ---------------------------------------------------------------------------------------------
# the loop


def fit(
    model,
    rows: Sequence[Row],
    cfg: SFTConfig,
    *,
    pad_id: int,
    device="cpu",
    accelerator=None,
    run_dir: str | Path | None = None,
    resume: bool = False,
    meta: dict | None = None,
    on_step: Callable[[dict], None] | None = None,
    progress=None,
    live: bool | None = None,
) -> FitResult:
    """Train ``model`` in place. With ``run_dir``: metrics.jsonl and (``cfg.save_every``)
    checkpoints there, ``resume`` continues from the latest complete checkpoint."""
    if cfg.max_flops is not None and cfg.max_steps is None:  # a programming error: train resolves it first
        raise ValueError("SFTConfig.max_flops unresolved: call resolve_max_flops(model, rows, cfg) before fit")
    rows, steps, digest = training_plan(rows, cfg)
    acc = accelerator or make_accelerator(device, bool(cfg.bf16) and str(device).startswith("cuda"))
    use_tf32(str(device), cfg.tf32)
    world, rank, main = acc.num_processes, acc.process_index, acc.is_main_process
    if world > 1:
        device = acc.device
    torch.manual_seed(cfg.seed)
    if not steps:
        return FitResult([], model, acc, False, "no rows with a supervised token", plan_digest=digest)
    packing, packing_note = resolve_packing(model, cfg.packing)
    pack_length = resolve_pack_length(model, rows, cfg) if packing else None
    if packing:
        packing_note += f"; lines of at most {pack_length} tokens" if pack_length else "; one line per micro-batch"
    prepared, opt = _prepare(model, cfg, acc, device)

    run_dir = Path(run_dir) if run_dir is not None else None
    start = _resumed_step(acc, run_dir, cfg, digest, meta, len(steps)) if resume and run_dir is not None else 0
    metrics, history = _open_metrics(run_dir, start) if run_dir is not None and main else (None, [])
    task = (
        progress.add_task("training", total=len(steps), completed=start, unit="step") if progress is not None else None
    )
    from .live import LiveView

    # the caller's bar when it passes one, else our live view (rank 0, stderr a terminal)
    view = LiveView(len(steps), start, show=live if main and progress is None else False)
    rows_done = [0, *itertools.accumulate(len(step_idx) for step_idx in steps)]
    t0 = time.perf_counter()
    elapsed0 = history[-1].get("elapsed", 0.0) if history else 0.0
    setup = _StepSetup(cfg, pad_id, device, packing, pack_length, world, rank)
    shape = _flops_shape(model, cfg)  # training FLOPs (flops.py)
    try:
        with view, training_backends():  # cuDNN's attention backward can give NaN (modeling/sdpa_backends.py)
            for s in range(start, len(steps)):
                rec = _one_step(prepared, opt, acc, rows, steps[s], s, len(steps), setup)
                check_finite(rec, history, cfg)
                rec["elapsed"] = round(elapsed0 + time.perf_counter() - t0, 4)
                rec["epoch"] = round(rows_done[s + 1] / len(rows), 4)  # rows seen so far (the last step may be short)
                if shape is not None:  # the step's rows by the stated formula (training/flops.py)
                    rec["flops"] = rows_flops((len(rows[i].input_ids) for i in steps[s]), shape)
                history.append(rec)
                if metrics is not None:
                    metrics.write(json.dumps(rec) + "\n")
                    metrics.flush()
                if main and on_step is not None:
                    on_step(rec)
                view.update(rec)
                if progress is not None:
                    progress.update(task, advance=1, description=f"training loss {rec['loss']:.4f}")
                if run_dir is not None and cfg.save_every and (s + 1) % cfg.save_every == 0 and s + 1 < len(steps):
                    _save_checkpoint(acc, run_dir, s + 1, len(steps), digest, setup, meta, rec["elapsed"])
    finally:
        if metrics is not None:
            metrics.close()
    released = _release(acc, prepared)
    if _checkpointing(cfg, device):
        _stop_checkpointing(released)
    return FitResult(
        history,
        released,
        acc,
        packing,
        packing_note,
        resumed_from=start,
        plan_digest=digest,
        steps_total=len(steps),
        prepared=prepared,
    )


def _flops_shape(model, cfg: SFTConfig) -> Shape | None:
    """What the FLOPs formula reads of ``model``; None for LoRA (frozen weights) or a shape it does not describe."""
    return None if cfg.lora is not None else shape_of(_config_dict(model))


def _no_flops_figure(why: str) -> UsageError:
    return UsageError(f"--max-flops: the FLOPs formula has no figure for {why}", hint="give --max-steps instead")


def check_max_flops(cfg: SFTConfig) -> None:
    """Refuse ``cfg.max_flops`` where no model can give it a figure (LoRA: frozen weights): callable before
    any model loads; :func:`resolve_max_flops` checks the model's own shape."""
    if cfg.max_flops is not None and cfg.lora is not None:
        raise _no_flops_figure("a LoRA run")


def resolve_max_flops(model, rows: Sequence[Row], cfg: SFTConfig) -> str | None:
    """``cfg.max_flops`` as ``cfg.max_steps`` (in place, so that the run records the steps it ran): the step
    count of this plan whose training FLOPs come nearest it. A line saying so, or None without --max-flops.
    A --max-steps given beside it must be that count (a finished run's recorded settings hold both)."""
    if cfg.max_flops is None:
        return None
    check_max_flops(cfg)
    shape = _flops_shape(model, cfg)
    if shape is None:
        raise _no_flops_figure("this model's config (not a dense decoder it describes)")
    plan_rows, plan, _ = training_plan(rows, replace(cfg, max_steps=None))
    if not plan:
        return None
    k, flops = steps_for_flops([[len(plan_rows[i].input_ids) for i in idx] for idx in plan], shape, cfg.max_flops)
    if cfg.max_steps is not None and cfg.max_steps != k:
        raise UsageError(
            f"--max-flops {cfg.max_flops:.4g} is {k} steps here, and --max-steps says {cfg.max_steps}",
            hint="give one of them",
        )
    cfg.max_steps = k
    return f"--max-flops {cfg.max_flops:.4g}: {k} of {len(plan)} steps, {flops:.4g} training FLOPs"


def _config_dict(model) -> dict | None:
    """The model's Hugging Face config as a dict, or None (a model without one)."""
    config = getattr(model, "config", None)
    to_dict = getattr(config, "to_dict", None)
    return to_dict() if callable(to_dict) else None


def _prepare(model, cfg: SFTConfig, acc: Accelerator, device) -> tuple[Any, Any]:
    """The model in training mode (gradient checkpointing as ``cfg`` asks; by default on the CPU only:
    :func:`_checkpointing`) and its AdamW, both prepared by accelerate: ``(prepared model, optimizer)``.
    AdamW is the fused one on CUDA and the CPU: the default (foreach) makes temporary copies of every
    parameter-sized state (half a gigabyte for a 135M model), the fused one updates in place."""
    if _checkpointing(cfg, device):
        enable = getattr(model, "activation_checkpointing_enable", None)  # newer transformers: the old name warns
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        hooked = getattr(model, "_require_grads_hooks", None) or getattr(model, "_require_grads_hook", None)
        if hasattr(model, "enable_input_require_grads") and not hooked:  # (newer transformers hook it themselves:
            model.enable_input_require_grads()  # a second hook would replace the first's handle, never removed)
    model.train()
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        fused=str(device).startswith(("cuda", "cpu")) or None,
    )
    # model and optimizer together, so that FSDP can re-point the optimizer at its sharded parameters
    return acc.prepare(model, opt, device_placement=[acc.num_processes > 1, False])


def _checkpointing(cfg: SFTConfig, device) -> bool:
    """Gradient checkpointing as ``cfg`` says; where it says nothing (None), on off CUDA."""
    if cfg.gradient_checkpointing is None:
        return not str(device).startswith("cuda")
    return bool(cfg.gradient_checkpointing)


def _stop_checkpointing(model) -> None:
    """Undo what :func:`_prepare` turned on for checkpointing: a model used after the fit (warmup's
    validation gradient) keeps every activation of a forward again, and no hook makes its input
    embeddings require a gradient (which would keep every layer's activations where only the tail's
    parameters need gradients)."""
    disable = getattr(model, "activation_checkpointing_disable", None) or getattr(
        model, "gradient_checkpointing_disable", None
    )
    if disable is not None:
        disable()
    if hasattr(model, "disable_input_require_grads"):
        model.disable_input_require_grads()


def _resumed_step(acc: Accelerator, run_dir: Path, cfg: SFTConfig, digest: str, meta: dict | None, total: int) -> int:
    """Load the latest complete checkpoint in ``run_dir`` (checked against this run first): its step,
    or 0 when there is none."""
    found = checkpoint.latest(run_dir)
    if found is None:
        if acc.is_main_process:
            note(f"no complete checkpoint in {run_dir / checkpoint.CHECKPOINTS}: starting from step 0")
        return 0
    step_no, path = found
    with open(path / checkpoint.STATE) as fh:
        check_resume(json.load(fh), cfg, digest, acc.num_processes, meta, path)
    checkpoint.load(acc, path)
    if acc.is_main_process:
        note(f"resuming from {path} (step {step_no} of {total})")
    return step_no


def _open_metrics(run_dir: Path, start: int):
    """metrics.jsonl in ``run_dir`` opened for writing, holding the records up to step ``start``
    of the run resumed (none for a new run); and those records."""
    run_dir.mkdir(parents=True, exist_ok=True)
    mpath = run_dir / METRICS
    kept = []
    if start and mpath.exists():
        kept = [
            line for line in mpath.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= start
        ]
    metrics = open(mpath, "w")
    for line in kept:
        metrics.write(line + "\n")
    metrics.flush()
    return metrics, [json.loads(line) for line in kept]


def _save_checkpoint(
    acc: Accelerator, run_dir: Path, step: int, total: int, digest: str, setup: _StepSetup, meta: dict | None, elapsed
) -> None:
    """A checkpoint after ``step``, with what a resume checks (:func:`check_resume`)."""
    state = {
        "step": step,
        "total_steps": total,
        "plan_digest": digest,
        "world_size": setup.world,
        "config": config_dict(setup.cfg),
        "meta": meta or {},
        "elapsed": elapsed,
        "packing": setup.packing,
    }
    checkpoint.save(acc, run_dir, step, state, keep=setup.cfg.keep_checkpoints)


def _release(acc: Accelerator, prepared) -> Any:
    """The trained model unwrapped, in eval mode."""
    model = acc.unwrap_model(prepared, keep_fp32_wrapper=False)
    # accelerate refuses to prepare a model twice (and would then skip its autocast): let a later
    # fit of the same model (warmup, then more training) prepare it again
    for m in {id(model): model, id(prepared): prepared}.values():
        if getattr(m, "_is_accelerate_prepared", False):
            m._is_accelerate_prepared = False
    model.eval()
    return model


@dataclass(frozen=True)
class _StepSetup:
    """What every optimizer step of a fit uses besides the model, its optimizer and the data."""

    cfg: SFTConfig
    pad_id: int
    device: Any
    packing: bool
    pack_length: int | None
    world: int
    rank: int


def _one_step(model, opt, acc, rows, idx, s: int, total: int, setup: _StepSetup) -> dict:
    cfg, packing, world, device = setup.cfg, setup.packing, setup.world, setup.device
    t = time.perf_counter()
    lr = cosine_lr(s, total, cfg.lr, cfg.warmup_ratio)
    for g in opt.param_groups:
        g["lr"] = lr
    z = max(1, sum(rows[i].supervised for i in idx))
    parts = split_ranks(rows, idx, world)
    plans = [
        micro_batches(
            rows,
            p,
            packing=packing,
            batch_size=cfg.batch_size,
            max_tokens=cfg.max_tokens_per_batch,
            pack_length=setup.pack_length,
        )
        for p in parts
    ]
    n_micro = max(len(p) for p in plans)
    computed = sum(collate_cost(rows, mb, packing) for p in plans for mb in p)
    mine = plans[setup.rank]
    local = torch.zeros((), dtype=torch.float64, device=device)
    for k in range(n_micro):
        last = k == n_micro - 1
        sync = contextlib.nullcontext() if last else acc.no_sync(model)
        with sync:
            if k < len(mine):
                mb = collate([[rows[i] for i in seq] for seq in mine[k]], setup.pad_id, packing=packing).to(device)
                loss_sum = token_loss_sum(model, mb)
                acc.backward(loss_sum * (world / z))
                local += loss_sum.detach().double()
            else:
                acc.backward(dummy_loss(model, dummy_batch(setup.pad_id).to(device)))
    grad_norm = acc.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], cfg.max_grad_norm)
    finite = math.isfinite(float(grad_norm))
    if finite:  # a NaN or infinite gradient would make every weight NaN: the step is skipped (fit decides more)
        opt.step()
    opt.zero_grad(set_to_none=True)
    if world > 1:
        local = acc.reduce(local, reduction="sum")
    loss = float(local) / z
    dt = time.perf_counter() - t
    executed = sum(len(rows[i].input_ids) for i in idx)
    return {
        "step": s + 1,
        "epoch": 0.0,  # fit sets it: rows seen so far / rows
        "loss": loss,
        "lr": lr,
        "grad_norm": float(grad_norm),
        "tokens": z,
        "executed_tokens": executed,
        "computed_tokens": computed,
        "rows": len(idx),
        "micro_batches": n_micro,
        "step_time": round(dt, 5),
        "tokens_per_s": executed / dt if dt > 0 else 0.0,
        **({} if finite else {"skipped": True}),
    }


def collate_cost(rows: Sequence[Row], mb: Sequence[Sequence[int]], packing: bool) -> int:
    """Tokens a micro-batch's forward computes (padding included): lines x the longest line."""
    lines = (
        [sum(len(rows[i].input_ids) for i in seq) for seq in mb]
        if packing
        else [len(rows[seq[0]].input_ids) for seq in mb]
    )
    return len(lines) * max(lines)


def train(
    model,
    rows: Sequence[Row],
    cfg: SFTConfig,
    *,
    pad_id: int,
    device="cpu",
    on_step: Callable[[dict], None] | None = None,
    progress=None,
) -> list[dict]:
    """Run SFT in place on ``model`` in this process; return one metrics dict per optimizer step."""
    return fit(model, rows, cfg, pad_id=pad_id, device=device, on_step=on_step, progress=progress, live=False).history


def save_model(model, tokenizer, folder: str | Path, extra: dict | None = None) -> Path:
    """Save an HF model folder atomically (temp folder + rename)."""
    with atomic_dir(folder) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if extra:
            (tmp / "bridge.json").write_text(json.dumps(extra, indent=2, default=str))
    return Path(folder)
