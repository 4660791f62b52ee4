"""``bridge warmup``: short SFT from theta_old on the warm split, then the direction v."""

from __future__ import annotations

import random

import torch

from .. import PRODUCER
from ..artifacts.direction_file import Direction, DirectionMeta
from ..artifacts.warmup_run import WarmupMeta, check_warmup_dir, write_warmup_run
from ..data.examples import CHOOSE_SPLIT, DataOptions, Report, file_digest, iter_examples, iter_pairs, with_model_limit
from ..errors import UsageError
from ..io import check_input, check_output
from ..training import direction as direction_mod
from ..modeling.loading import fingerprint, load_model, load_tokenizer, resolve, resolve_device, tokenizer_fingerprint
from ..modeling.params import tail_parameters
from ..progress import note, progress_bar
from ..training.rows import full_response_row
from ..runtime.allocator import fix_mmap_threshold
from ..training.config import config_dict, on_device
from ..training.sft import train
from .common import now
from .options import WarmupOptions


def split_ids(ids: list[str], fraction: float, seed: int) -> set[str]:
    """A deterministic ``fraction`` of ``ids`` (at least one when fraction > 0)."""
    if not 0.0 < fraction < 1.0:
        raise UsageError(f"a fraction must lie strictly between 0 and 1, got {fraction}")
    k = max(1, round(len(ids) * fraction))
    return set(random.Random(seed).sample(sorted(ids), k))


def check_warmup_options(opts: WarmupOptions) -> None:
    """Every parameter in its range (see :mod:`bridgecli.runtime.params`), before anything is read."""
    from ..runtime import params
    from ..training.config import check_sft

    check_sft(opts.sft)
    params.check_data_options(opts.data_opts)
    params.check(opts)
    params.check_device(opts.device)


def run_warmup(opts: WarmupOptions) -> dict:
    """Warm up and write the run folder ``opts.out`` (locked while this runs: a second warmup into the
    same folder stops at once). A finished run there is refused at once, or with --overwrite replaced
    once the new one is written."""
    from ..io import folder_lock

    check_warmup_options(opts)
    check_output(opts.out, inputs=(opts.data, opts.val), folder=True)
    with folder_lock(opts.out, "warmup run folder"):
        return _run_warmup(opts)


def _run_warmup(opts: WarmupOptions) -> dict:
    check_warmup_dir(opts.out, overwrite=opts.overwrite)
    _check_inputs(opts)
    ref = resolve(opts.model)
    device = resolve_device(opts.device)
    on_device(opts.sft, device)
    opts.sft.bf16 = False  # warmup trains in float32 (it has no --bf16)
    if device == "cpu" and opts.sft.gradient_checkpointing:  # memory first, as train
        fix_mmap_threshold()
    note(f"loading {ref.spec}")
    tokenizer = load_tokenizer(ref)
    model = load_model(ref, device=device)
    warm_ids, val_ids = _held_out_ids(opts)
    warm, val = _warm_and_val(opts, tokenizer, model, warm_ids, val_ids)
    history, v, stats, val_loss, val_tokens = _warm_up(opts, model, tokenizer, warm, val, device)
    direction = Direction(v, DirectionMeta.of(stats, layers=opts.direction_layers, base_model=ref.spec))
    common = _common_direction(opts, model, tokenizer, direction, val, device)
    meta = WarmupMeta(
        producer=PRODUCER,
        created=now(),
        base_model=ref.spec,
        base_fingerprint=fingerprint(ref),
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        chat_template=opts.data_opts.chat_template,
        data=str(opts.data),
        data_digest=file_digest(opts.data),
        warm_ids=sorted(warm_ids) if warm_ids is not None else None,
        val=str(opts.val) if opts.val else None,
        val_ids=sorted(val_ids) if val_ids is not None else None,
        warm_examples=len(warm),
        val_examples=len(val),
        val_loss=val_loss,
        val_tokens=val_tokens,
        direction_layers=opts.direction_layers,
        direction=stats,
        common_direction=common.meta.fit,
        sft=config_dict(opts.sft),
        steps=len(history),
        final_train_loss=history[-1]["loss"] if history else None,
    )
    write_warmup_run(
        opts.out,
        model=model,
        tokenizer=tokenizer,
        meta=meta,
        direction=direction,
        history=history,
        common=common,
        fingerprint=lambda folder: fingerprint(resolve(str(folder))),
    )
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return meta.to_dict()


def _common_direction(opts: WarmupOptions, model, tokenizer, direction: Direction, val: list, device: str):
    """D_val's mean residual d and the slope beta of a_j on u_j over D_val's response tokens, which
    ``bridge score --scorer-option debias=common`` subtracts (docs/method.md, "The common direction"):
    a forward pass and a scoring pass over D_val."""
    from ..artifacts.common_file import CommonDirection
    from ..training import common_direction

    val_rows = [full_response_row(e.id, e.tokens) for e in val]
    with progress_bar() as bar:
        task = bar.add_task("common direction (D_val)", total=len(val), unit="ex")
        common: CommonDirection = common_direction.fit(
            model,
            tokenizer,
            direction.v,
            direction.meta,
            val,
            val_rows,
            device=device,
            batch_size=opts.sft.batch_size,
            on_batch=lambda n: bar.update(task, advance=n),
        )
    fit = common.meta.fit
    r = "undefined" if fit.fit_pearson is None else f"{fit.fit_pearson:.3f}"
    note(
        f"common direction: beta {fit.beta:.4g} over {fit.fit_tokens} D_val response tokens (Pearson of a_j and u_j {r})"
    )
    return common


def _check_inputs(opts: WarmupOptions) -> None:
    """Validation data named, the input files there and not empty: one line before the model loads."""
    if opts.val is None and opts.val_fraction is None:
        raise UsageError("warmup needs validation data for g_target: pass --val FILE or --val-fraction F")
    check_input(opts.data)
    check_input(opts.val)
    from ..data.sources import require_records

    # an empty file: one line before the model loads (warmup cannot train on nothing: no --allow-empty)
    require_records(opts.data, opts.data_opts.split, choose=CHOOSE_SPLIT)
    if opts.val is not None:
        require_records(opts.val)  # --split is the data's: a split of --val is named by its folder


def _held_out_ids(opts: WarmupOptions) -> tuple[set[str] | None, set[str] | None]:
    """(the warm split's ids, the validation split's ids) drawn from the data by --warm-fraction and
    --val-fraction; None where no fraction draws that split."""
    warm_ids: set[str] | None = None
    val_ids: set[str] | None = None
    if opts.warm_fraction is not None or opts.val_fraction is not None:
        all_ids = [p.id for _, _, p in iter_pairs(opts.data, opts.data_opts)]
        rest = all_ids
        if opts.val is None:
            assert opts.val_fraction is not None  # checked at the start
            val_ids = split_ids(rest, opts.val_fraction, opts.sft.seed + 1)
            rest = [i for i in rest if i not in val_ids]
        if opts.warm_fraction is not None:
            warm_ids = split_ids(rest, opts.warm_fraction, opts.sft.seed)
    return warm_ids, val_ids


def _warm_and_val(
    opts: WarmupOptions, tokenizer, model, warm_ids: set[str] | None, val_ids: set[str] | None
) -> tuple[list, list]:
    """The tokenised examples of the warm split and of the validation split (--val, or held out of the
    data), with the notes on what was left out; refused when either split is empty."""
    data_opts = with_model_limit(opts.data_opts, model)  # --max-length defaults to the model's limit
    report = Report()
    examples = list(iter_examples(opts.data, tokenizer, data_opts, report))
    if warm_ids is not None:
        warm = [e for e in examples if e.id in warm_ids]
    else:
        warm = [e for e in examples if val_ids is None or e.id not in val_ids]
    if opts.val is not None:
        val = list(
            iter_examples(
                opts.val,
                tokenizer,
                DataOptions(
                    prompt_field=opts.data_opts.prompt_field,
                    response_field=opts.data_opts.response_field,
                    chat_template=opts.data_opts.chat_template,
                    max_length=data_opts.max_length,
                ),
                report,
            )
        )
    else:
        assert val_ids is not None  # held out above: without --val, --val-fraction is given
        val = [e for e in examples if e.id in val_ids]
    for line in report.lines():
        note(line)
    if not warm:
        raise UsageError("the warm split is empty")
    if not val:
        raise UsageError("the validation split is empty")
    return warm, val


def _warm_up(opts: WarmupOptions, model, tokenizer, warm: list, val: list, device: str) -> tuple:
    """SFT of ``model`` on ``warm`` (in place), then the direction v of its tail parameters from the
    validation gradient and the warmup's own step: (history, v, direction stats, validation loss,
    validation tokens)."""
    tail = tail_parameters(model, opts.direction_layers)
    theta_old = {n: p.detach().to("cpu", copy=True) for n, p in tail.items()}
    pad = tokenizer.pad_token_id
    warm_rows = [full_response_row(e.id, e.tokens) for e in warm]
    note(f"warmup SFT on {len(warm_rows)} examples, validation {len(val)} examples")
    with progress_bar() as bar:
        history = train(model, warm_rows, opts.sft, pad_id=pad, device=device, progress=bar)
        val_rows = [full_response_row(e.id, e.tokens) for e in val]
        g_target, val_loss, val_tokens = direction_mod.validation_gradient(
            model, val_rows, list(tail), pad_id=pad, device=device, batch_size=opts.sft.batch_size
        )
    params = dict(model.named_parameters())
    g_anchor = {n: params[n].detach().cpu() - theta_old[n] for n in tail}
    v, stats = direction_mod.combine({n: g.cpu() for n, g in g_target.items()}, g_anchor, lam=opts.lam)
    return history, v, stats, val_loss, val_tokens
