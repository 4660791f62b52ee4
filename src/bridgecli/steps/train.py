"""``bridge train``: SFT from theta_old on compacted rows (or any input_ids/labels JSONL), into the
run folder OUT that :mod:`bridgecli.artifacts.train_run` lays out.

Single process: ``bridge train ...``. Several GPUs: ``torchrun --nproc-per-node N -m bridgecli
train ...`` or ``accelerate launch [--config_file fsdp.yaml] -m bridgecli train ...``: the same
flags, rank 0 writes.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from .. import PRODUCER
from ..artifacts.rows_meta import read_rows_meta
from ..artifacts.train_run import (
    ADAPTER,
    CLEAR,
    FINISHED,
    REPLACE,
    SUMMARY,
    TrainSummary,
    check_run_dir,
    overwrite_dir,
    read_summary,
    settle_killed_overwrite,
    write_summary,
)
from ..data.sources import read_records
from ..errors import EmptyResultError, InputError, ModelError, UsageError
from ..modeling.loading import fingerprint, load_model, load_tokenizer, resolve, resolve_device, tokenizer_fingerprint
from ..io import check_input, check_output, replace_dir
from ..progress import note
from ..training import lora as lora_mod
from ..training.flops import FORMULA
from ..runtime.allocator import fix_mmap_threshold
from ..training.config import config_dict, on_device
from ..training.limits import RowLimit, limit_of_config, model_limit, row_limit
from ..training.rows import IGNORE, Row
from ..training.sft import (
    FitResult,
    check_max_flops,
    check_resume,
    fit,
    make_accelerator,
    resolve_max_flops,
    training_plan,
)
from .common import now
from .options import TrainOptions


def check_vocab(path: str | Path, rows: list[Row], vocab_size: int, where: str | None = None) -> None:
    """Every token id of ``rows`` (read from ``path``) inside the model's vocabulary."""
    for row in rows:
        bad = next((x for x in row.input_ids if not 0 <= x < vocab_size), None)
        if bad is not None:
            raise InputError(
                f"token id {bad} is outside the model's vocabulary ({vocab_size})",
                file=str(path),
                record=where or f"id {row.id}",
                field="input_ids",
                hint="was it made with another tokenizer?",
            )


def read_rows(
    path: str | Path,
    vocab_size: int | None,
    tokenizer_fp: str | None = None,
    model_name: str = "the model",
    limit: RowLimit | None = None,
) -> list[Row]:
    """The JSONL rows of ``bridge compact``. A row's ``tokenizer_fingerprint`` (written by compact)
    must equal ``tokenizer_fp`` when both are known: the check holds even without the side file.
    ``limit``: a row longer than it is refused, or clipped (and dropped when that leaves it no
    supervised label; counted in ``limit``)."""
    rows = []
    p = Path(path)
    if p.is_file():
        from ..format.spec import MAGIC

        with open(p, "rb") as fh:
            if fh.read(len(MAGIC)) == MAGIC:
                raise InputError(
                    "a bridge stream, not a file of training rows",
                    file=str(p),
                    hint="`bridge compact STREAM -o train.jsonl` turns a closed stream into rows",
                )
    for where, rec in read_records(p):
        ids = _int_list(rec.get("input_ids"), p, where, "input_ids")
        labels = _int_list(rec.get("labels"), p, where, "labels")
        if len(ids) != len(labels):
            raise InputError(
                f"labels has {len(labels)} entries, input_ids {len(ids)}", file=str(p), record=where, field="labels"
            )
        if vocab_size is not None:
            check_vocab(p, [Row(where, ids, labels)], vocab_size, where)
        if any(y != IGNORE and y != x for x, y in zip(ids, labels)):
            raise InputError(
                "labels must be -100 or equal input_ids (unshifted)", file=str(p), record=where, field="labels"
            )
        row_fp = rec.get("tokenizer_fingerprint")
        if row_fp is not None and not isinstance(row_fp, str):
            raise InputError("expected a string", file=str(p), record=where, field="tokenizer_fingerprint")
        if row_fp and tokenizer_fp and row_fp != tokenizer_fp:
            raise ModelError(
                f"this row was tokenised with another tokenizer than {model_name}'s",
                file=str(p),
                record=where,
                field="tokenizer_fingerprint",
                hint="train the model the data was scored for, or re-run the pipeline",
            )
        row_id = str(rec["id"]) if "id" in rec else None
        weights = _weights(rec.get("loss_weights"), len(ids), p, where)
        if limit is not None:
            fitted = limit.fit(ids, labels, file=str(p), where=where, row_id=row_id)
            if fitted is None:
                continue
            ids, labels = fitted
            if weights is not None:
                weights = weights[: len(ids)]  # clipped as the ids are: the first tokens
        rows.append(Row(row_id if row_id is not None else where, ids, labels, weights))
    return rows


def _weights(val: Any, n: int, p: Path, where: str) -> list[float] | None:
    """A row's ``loss_weights`` (``bridge compact`` of a weighted selection): None, or n finite numbers >= 0."""
    if val is None:
        return None
    if not isinstance(val, list) or len(val) != n:
        raise InputError(
            f"expected a list of {n} numbers (one per token)", file=str(p), record=where, field="loss_weights"
        )
    out = []
    for x in val:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
            raise InputError(f"{x!r} is not a finite number >= 0", file=str(p), record=where, field="loss_weights")
        out.append(float(x))
    return out


def _int_list(val: Any, p: Path, where: str, name: str) -> list[int]:
    """``val`` when it is a list of integers. JSON ``true``/``false`` are refused: Python reads them as
    bools, which are ints (``True == 1``), but they are no token id or label."""
    if not isinstance(val, list):
        raise InputError("expected a list of integers", file=str(p), record=where, field=name)
    if not set(map(type, val)) <= _INT:
        k, bad = next((k, x) for k, x in enumerate(val) if type(x) is not int)
        shown = ("true" if bad else "false") if isinstance(bad, bool) else repr(bad)[:40]
        raise InputError(f"expected a list of integers, entry {k} is {shown}", file=str(p), record=where, field=name)
    return val


_INT = {int}


def _loaded_limit(model) -> tuple[int, str] | None:
    """The position limit in a loaded model's config (when its files did not give one)."""
    to_dict = getattr(getattr(model, "config", None), "to_dict", None)
    limit = limit_of_config(to_dict() if callable(to_dict) else None)
    return (limit, "max_position_embeddings") if limit is not None else None


def _install(tmp: Path, out: Path) -> None:
    """Move everything in ``tmp`` into ``out`` (replacing), then remove ``tmp``."""
    for child in tmp.iterdir():
        target = out / child.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(child, target)
    tmp.rmdir()


def save_final(result: FitResult, tokenizer, out: Path, summary: TrainSummary, *, lora: bool) -> None:
    """Write the trained model into ``out`` (rank 0), the summary last. Every rank calls this
    (FSDP gathers the full state dict collectively)."""
    from accelerate.utils import DistributedType

    acc = result.accelerator
    state = None
    if result.prepared is not None and acc.distributed_type == DistributedType.FSDP:
        state = acc.get_state_dict(result.prepared)
    if acc.is_main_process:
        tmp = out / ".final.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
            model = result.model
            if lora:
                model.save_pretrained(tmp / ADAPTER)
                model = model.merge_and_unload()
                model.save_pretrained(tmp)
            else:
                model.save_pretrained(tmp, state_dict=state)
            tokenizer.save_pretrained(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a full disk: no half model is left behind
            raise
        _install(tmp, out)
        write_summary(out, summary)
    acc.wait_for_everyone()


def run_train(opts: TrainOptions) -> dict:
    """Train into the run folder ``opts.out``, locked while this runs (by the first process of a
    multi-process launch): a second train into the same folder stops at once."""
    from ..io import folder_lock
    from ..runtime import params
    from ..training.config import check_sft

    check_sft(opts.sft)
    params.check(opts)
    params.check_device(opts.device)
    if opts.resume and opts.overwrite:
        raise UsageError("--resume and --overwrite exclude each other")
    check_input(opts.data)  # before anything loads
    check_output(opts.out, inputs=(opts.data,), folder=True)
    if os.environ.get("RANK", "0") != "0":
        return _run_train(opts)
    with folder_lock(opts.out, "training run folder"):
        for line in settle_killed_overwrite(opts.out):  # before any process looks at the folder
            note(line)
        return _run_train(opts)


def _run_train(opts: TrainOptions) -> dict:
    out = Path(opts.out)
    existed = out.exists()
    action = check_run_dir(out, resume=opts.resume, overwrite=opts.overwrite)  # before anything is read
    side = read_rows_meta(opts.data)
    model_spec = opts.model or (side.model if side is not None else None)
    ref = resolve(model_spec)
    # the longest row, from the model's files: a long row stops the run here, before any model work
    limit = row_limit(opts.max_length, opts.clip_long_rows, model_limit(ref))
    rows = read_rows(opts.data, None, limit=limit)  # read (and checked) before the model loads
    clip_note = limit.summary() if limit is not None else None
    if not any(r.loss_weight > 0 for r in rows):
        return _nothing_to_train(opts, rows, limit)
    cfg = opts.sft
    acc, device = _accelerator(opts)
    main = acc.is_main_process
    # the rows as they trained: before any model loads (--max-flops reads the model's config first: below)
    if action == FINISHED and limit is not None and cfg.max_flops is None:
        return _finished_run(out, opts, ref, rows, acc)
    if clip_note and main:
        note(clip_note)
    check_max_flops(cfg)  # before the model loads: --max-flops with --lora
    if cfg.lora is not None and acc.distributed_type.name == "FSDP":
        raise UsageError(
            "--lora is trained with DDP here, not FSDP (adapters are small)",
            hint="launch without the FSDP accelerate config",
        )
    run_dir = _prepare_run_dir(out, action, acc)
    try:
        return _train_into(run_dir, opts, ref, side, limit, acc, device, finished=action == FINISHED)
    except BaseException:
        if run_dir != out and main:  # --overwrite: the earlier run stays as it was
            shutil.rmtree(run_dir, ignore_errors=True)
        elif main:
            _keep_only_resumable(out, existed)
        raise


def _keep_only_resumable(out: Path, existed: bool) -> None:
    """After a run into ``out`` failed: keep what it wrote when ``--resume`` can continue it (a complete
    checkpoint), else remove it: the folder when this run made it, else its contents (a folder a run may
    train in holds nothing else: :func:`check_run_dir`)."""
    from ..training import checkpoint

    if not out.is_dir() or checkpoint.complete(out):
        return
    if not existed and not out.is_symlink():
        shutil.rmtree(out, ignore_errors=True)
        return
    for child in out.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _train_into(
    run_dir: Path, opts: TrainOptions, ref, side, limit: RowLimit | None, acc, device: str, *, finished: bool = False
) -> dict:
    """Load, train and save into ``run_dir``: ``opts.out``, or (--overwrite) the folder beside it that
    replaces it once the model is written there. ``finished``: --resume of a finished run whose rows
    are known only once the model is loaded (its limit came from the loaded config)."""
    cfg = opts.sft
    main = acc.is_main_process
    out = Path(opts.out)
    if main and not finished:
        note(
            f"training {ref.spec} (theta_old) on {opts.data} on {device}"
            + (f" x {acc.num_processes} processes" if acc.num_processes > 1 else "")
        )
    tokenizer = _load_tokenizer(ref, side, opts)
    model = load_model(ref, device=device)
    rows = _rows_for_model(opts, model, tokenizer, ref, limit, main)
    flops_line = resolve_max_flops(model, rows, cfg)  # --max-flops as --max-steps, before any plan is compared
    if flops_line and main and not finished:
        note(flops_line)
    if finished:
        return _finished_run(out, opts, ref, rows, acc)
    torch.manual_seed(cfg.seed)  # LoRA's initial A matrices
    if cfg.lora is not None:
        model = _with_lora(model, cfg.lora, main)
    meta = _base_meta(ref)
    result = fit(
        model,
        rows,
        cfg,
        pad_id=tokenizer.pad_token_id,
        device=device,
        accelerator=acc,
        run_dir=run_dir,
        resume=opts.resume,
        meta=meta,
        live=opts.live,
    )
    if main:
        note(result.packing_note)
    if not result.history:  # never write a model that no step changed
        raise EmptyResultError(
            "training ran 0 optimizer steps: no model written",
            file=str(opts.data),
            hint="check --max-steps and --epochs",
        )
    summary = _summary(opts, ref, rows, result, acc.num_processes)
    save_final(result, tokenizer, run_dir, summary, lora=cfg.lora is not None)
    if run_dir != out:
        if main:
            replace_dir(run_dir, out)
        acc.wait_for_everyone()
    del model, result
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return summary.to_dict()


def _finished_run(out: Path, opts: TrainOptions, ref, rows: list[Row], acc) -> dict:
    """--resume of a run folder whose run has finished (its summary is written): when it is this
    command's run, nothing is left to train (one line says so; the folder stays as it is); when its
    summary records other settings, data or data order, processes or base model, refused as a resume
    from such a checkpoint is (:func:`check_resume`)."""
    summary = read_summary(out)
    assert summary is not None  # check_run_dir found it
    where = out / SUMMARY
    if summary.sft is None or summary.plan_digest is None or summary.processes is None:
        raise UsageError(
            f"{where} does not record the settings and data order of its run: cannot tell it is this command's",
            hint="pass --overwrite to train again, or another -o",
        )
    recorded = {"base_model": summary.base_model, "base_fingerprint": summary.base_fingerprint}
    state = {
        "config": summary.sft,
        "plan_digest": summary.plan_digest,
        "world_size": summary.processes,
        "meta": {k: v for k, v in recorded.items() if v is not None},
    }
    digest = training_plan(rows, opts.sft)[2]
    check_resume(state, opts.sft, digest, acc.num_processes, _base_meta(ref), where)
    if acc.is_main_process:
        loss = f", final loss {summary.final_loss:.4f}" if summary.final_loss is not None else ""
        note(f"{out} holds this run, already finished ({summary.steps} steps{loss}): nothing to train")
    return {**summary.to_dict(), "written": False, "finished": True}


def _base_meta(ref) -> dict:
    """The base model as a run records it, and a resume compares (:func:`check_resume`'s ``meta``)."""
    return {"base_model": ref.spec, "base_fingerprint": fingerprint(ref)}


def _nothing_to_train(opts: TrainOptions, rows: list[Row], limit: RowLimit | None) -> dict:
    """The result of a run whose rows hold no supervised token (with --allow-empty; refused without)."""
    what = f"none of its {len(rows)} rows has a supervised token (labels all -100)" if rows else "it holds no rows"
    if any(r.supervised for r in rows):  # supervised tokens, every one of weight 0
        what = f"every supervised token of its {len(rows)} rows has loss weight 0 (loss_weights)"
    elif limit is not None and limit.dropped:
        what = f"no row keeps a supervised token after clipping to {limit.what}"
    if not opts.allow_empty:
        raise EmptyResultError(
            f"nothing to train on: {what}",
            file=str(opts.data),
            hint="pass --allow-empty to accept this (no model is written)",
        )
    note(f"nothing to train on: {what}; no model written")
    return {"rows": 0, "steps": 0, "final_loss": None, "written": False}


def _accelerator(opts: TrainOptions):
    """The accelerator of this process and the device it trains on; settles the device's defaults of
    ``opts.sft`` (bf16 on CUDA only, gradient checkpointing on the CPU) and, on the CPU with
    checkpointing, the allocator's mmap threshold."""
    cfg = opts.sft
    device = resolve_device(opts.device)
    on_device(cfg, device)
    if device == "cpu" and cfg.gradient_checkpointing:  # memory first (see --gradient-checkpointing's help)
        fix_mmap_threshold()
    acc = make_accelerator(device, bool(cfg.bf16))
    if acc.num_processes > 1:
        device = str(acc.device)
    return acc, device


def _prepare_run_dir(out: Path, action: str, acc) -> Path:
    """The folder to train into, made ready (rank 0) for ``action`` (:func:`check_run_dir`): ``out``,
    emptied first for :data:`CLEAR`; for :data:`REPLACE` (--overwrite), the hidden ``.NAME.overwrite``
    folder beside it (:func:`overwrite_dir`, made empty), which replaces ``out`` once the new run is
    written. Every rank waits until that is done."""
    run_dir = overwrite_dir(out) if action == REPLACE else out
    acc.wait_for_everyone()  # every rank has looked before rank 0 clears
    if acc.is_main_process and action == CLEAR:  # its contents: a run folder given as a symbolic link stays one
        for child in out.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    if acc.is_main_process and action == REPLACE:
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
    acc.wait_for_everyone()
    return run_dir


def _load_tokenizer(ref, side, opts: TrainOptions):
    """The model's tokenizer, refused when the rows' side file names another one."""
    tokenizer = load_tokenizer(ref)
    if (
        side is not None
        and side.tokenizer_fingerprint
        and side.tokenizer_fingerprint != tokenizer_fingerprint(tokenizer)
    ):
        raise ModelError(
            f"{opts.data} was tokenised with another tokenizer than {ref.spec}'s",
            hint="train the model the data was scored for, or re-run the pipeline",
        )
    return tokenizer


def _rows_for_model(opts: TrainOptions, model, tokenizer, ref, limit: RowLimit | None, main: bool) -> list[Row]:
    """The rows read again, checked against the loaded model (vocabulary, tokenizer) and its row limit
    (from its loaded config when its files did not give one)."""
    late = limit is None
    if limit is None:  # the model's files did not tell its limit: its loaded config does
        limit = row_limit(opts.max_length, opts.clip_long_rows, _loaded_limit(model))
    else:
        limit = limit.fresh()
    rows = read_rows(
        opts.data, model.get_input_embeddings().weight.shape[0], tokenizer_fingerprint(tokenizer), ref.spec, limit
    )
    if late and limit is not None:
        if main and limit.summary():
            note(str(limit.summary()))
        if not any(r.loss_weight > 0 for r in rows):
            raise EmptyResultError(
                f"nothing to train on: no row keeps a supervised token of loss weight > 0 after clipping to {limit.what}",
                file=str(opts.data),
            )
    empty = [r.id for r in rows if r.supervised == 0]
    if empty and main:
        note(f"skipping {len(empty)} rows with no supervised token")
    return rows


def _with_lora(model, lora, main: bool):
    """``model`` with LoRA adapters on ``lora``'s targets (only they train)."""
    model = lora_mod.wrap(model, lora)
    if main:
        t, n = lora_mod.trainable_counts(model)
        note(f"LoRA r={lora.r} alpha={lora.alpha} on {lora.targets}: {t:,} of {n:,} parameters train")
    return model


def _train_flops(history: list[dict]) -> float | None:
    """The run's training FLOPs: the sum of its steps' (None unless every step recorded them)."""
    if not history or any("flops" not in h for h in history):
        return None
    return float(sum(h["flops"] for h in history))


def _summary(opts: TrainOptions, ref, rows: list[Row], result: FitResult, processes: int) -> TrainSummary:
    """What the run folder's summary says of this run (on ``processes`` processes)."""
    cfg = opts.sft
    history = result.history
    used = [r for r in rows if r.supervised > 0]
    flops = _train_flops(history)
    return TrainSummary(
        producer=PRODUCER,
        created=now(),
        base_model=ref.spec,
        base_fingerprint=fingerprint(ref),
        data=str(opts.data),
        rows=len(used),
        sft=config_dict(cfg),
        steps=len(history),
        final_loss=history[-1]["loss"] if history else None,
        supervised_tokens=sum(r.supervised for r in used),
        executed_tokens=sum(len(r.input_ids) for r in used),
        packing=result.packing,
        batching=result.packing_note,
        processes=processes,
        resumed_from_step=result.resumed_from,
        plan_digest=result.plan_digest,
        train_seconds=history[-1]["elapsed"] if history else 0.0,
        train_flops=flops,
        flops_formula=FORMULA if flops is not None else None,
        lora=config_dict(cfg)["lora"],
        adapter=ADAPTER if cfg.lora is not None else None,
    )
