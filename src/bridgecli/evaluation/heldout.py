"""``heldout-loss``: the token-mean loss of the reference responses of a held-out file.

Every record of the file (any shape ``bridge score`` reads: chat messages, prompt/response,
Alpaca, GSM8K, MATH; JSONL, JSON, Parquet or a ``save_to_disk`` folder) is tokenised exactly as
``bridge score`` tokenises it (:func:`bridgecli.data.tokenize.tokenize_pair`, the chat template by
default), and the model is scored on what full SFT supervises: every response token and the EOS
that ends it, each given the whole prompt and the response before it. The result is

    loss = sum over examples of summed token losses / sum over examples of response tokens

(natural log, the training loss's normalisation) with a 95% percentile bootstrap interval over
examples (:mod:`bridgecli.evaluation.bootstrap`, seed 0, 1000 resamples), the token count and the
example count. Examples longer than the model's positions are left out and counted.

Scoring is batched (rows sorted by length, right-padded) and the output head runs only on the
positions that predict a supervised token. While ``bridge eval`` runs, each example's
``[loss sum, tokens]`` is recorded in the task's journal, keyed by a digest of its token ids and
labels, so an interrupted run resumed with ``--resume`` scores only the examples it lacks.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ..data.examples import DataOptions, read_pairs
from ..data.shapes import Pair
from ..data.tokenize import Tokenized, tokenize_pair
from ..errors import InputError, UsageError
from ..progress import note
from ..training.batching import MicroBatch
from ..training.rows import IGNORE, Row, full_response_row
from . import journal
from .bootstrap import ratio_bootstrap
from .generate import _eval_mode, progress_bar
from .loglik import _max_length
from .readers import check_limit
from .tasks import EvalOptions, EvalRun, model_name


def load_tokenized(
    path: str, tokenizer: Any, *, chat_template: bool = True, limit: int | None = None
) -> list[tuple[int, str, Pair, Tokenized]]:
    """``(index, where, pair, tokenized)`` for the first ``limit`` records of ``path``, tokenised
    exactly as ``bridge score`` tokenises them."""
    loaded = []
    for index, where, pair in read_pairs(path, DataOptions(limit=limit)):  # eval has no --split, --prompt-field
        tok = tokenize_pair(tokenizer, pair, chat_template=chat_template, file=str(path), where=where)
        loaded.append((index, where, pair, tok))
    if not loaded:
        raise InputError("no records", file=str(path))
    return loaded


def load_rows(
    path: str, tokenizer: Any, *, chat_template: bool = True, limit: int | None = None
) -> list[tuple[int, str, Row]]:
    """``(index, where, row)`` for the first ``limit`` records of ``path``: the row as full SFT
    trains on it (labels on the response tokens and the EOS)."""
    return [
        (index, where, full_response_row(pair.id, tok.tokens))
        for index, where, pair, tok in load_tokenized(path, tokenizer, chat_template=chat_template, limit=limit)
    ]


def fitting(model: Any, ids: Sequence[str], lengths: Sequence[int], file: str) -> list[bool]:
    """Which examples (ids ``ids``, ``lengths`` tokens each) fit the model's positions. The others
    are named in a note; none fitting is an :class:`InputError`."""
    max_len = _max_length(model)
    fits = [max_len is None or n <= max_len for n in lengths]
    skipped = [i for i, ok in zip(ids, fits) if not ok]
    if skipped:
        note(
            f"left out {len(skipped)} examples longer than the model's {max_len} positions "
            f"({', '.join(skipped[:5])}{' ...' if len(skipped) > 5 else ''})"
        )
    if not any(fits):
        raise InputError(f"every example is longer than the model's {max_len} positions", file=file)
    return fits


def pad_id(tokenizer: Any) -> int:
    """The id that pads a scoring batch (never scored): the pad token, else EOS, else 0."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)


def row_key(row: Row) -> str:
    """What decides an example's loss besides the model: its token ids and labels."""
    payload = json.dumps(["heldout", row.input_ids, row.labels])
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _token_losses(model: Any, mb: MicroBatch) -> torch.Tensor:
    """Next-token cross-entropy (float32) of every supervised position, in row-major order."""
    keep, target = mb.keep, mb.target
    assert keep is not None and target is not None  # set by MicroBatch.__post_init__
    kwargs = {"input_ids": mb.input_ids, "attention_mask": mb.attention_mask, "use_cache": False}
    try:
        logits = model(**kwargs, logits_to_keep=keep).logits
        if logits.dim() == 2 and logits.shape[0] == target.shape[0]:
            return F.cross_entropy(logits.float(), target, reduction="none")
    except (TypeError, IndexError, ValueError):
        pass  # a model whose forward takes no boolean logits_to_keep: full logits
    logits = model(**kwargs).logits
    return F.cross_entropy(logits[keep].float(), target, reduction="none")


def row_losses(
    model: Any,
    rows: Sequence[Row],
    *,
    pad_id: int,
    batch_size: int = 8,
    progress: bool = True,
    description: str = "held-out loss",
) -> list[tuple[float, int]]:
    """``(summed token loss, supervised tokens)`` per row, in input order. Rows already in the
    active journal are taken from it; the others are scored and recorded batch by batch."""
    if batch_size < 1:
        raise UsageError(f"batch size must be at least 1 (got {batch_size})")
    results: list[tuple[float, int] | None] = [None] * len(rows)
    book = journal.active()
    keys = [row_key(r) for r in rows] if book is not None else []
    todo, kept = journal.pending(book, keys, len(rows))
    for i, (total, n) in kept.items():
        results[i] = (float(total), int(n))
    todo.sort(key=lambda i: -len(rows[i].input_ids))
    device = getattr(model, "device", None) or next(model.parameters()).device
    with _eval_mode(model), torch.inference_mode(), progress_bar(progress, description) as bar:
        task = bar.add_task(description, total=len(rows), completed=len(rows) - len(todo))
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            width = max(len(rows[i].input_ids) for i in batch)
            ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for b, i in enumerate(batch):
                n = len(rows[i].input_ids)
                ids[b, :n] = torch.tensor(rows[i].input_ids)
                labels[b, :n] = torch.tensor(rows[i].labels)
                mask[b, :n] = 1
            mb = MicroBatch(ids, labels, mask, None, len(batch), int(mask.sum()), ids.numel())
            losses = _token_losses(model, mb.to(device)).double().cpu()
            assert mb.keep is not None  # set by MicroBatch.__post_init__
            owner = mb.keep.nonzero()[:, 0]
            sums = torch.zeros(len(batch), dtype=torch.float64).index_add_(0, owner, losses)
            counts = torch.bincount(owner, minlength=len(batch))
            scored = [(float(sums[b]), int(counts[b])) for b in range(len(batch))]
            for i, result in zip(batch, scored):
                results[i] = result
            if book is not None:
                book.add([(keys[i], list(result)) for i, result in zip(batch, scored)])
            bar.advance(task, len(batch))
    return results  # type: ignore[return-value]


def loss_task_chat(options: EvalOptions, task: str) -> bool:
    """The checks a loss task makes first (``--limit``; no ``--few-shot``), and whether it renders
    with the chat template (yes unless ``--chat-template`` says otherwise)."""
    check_limit(options.limit, options.few_shot)
    if options.few_shot:
        raise UsageError(f"{task} takes no --few-shot: it scores each reference given its own prompt")
    return True if options.chat_template is None else options.chat_template


def split_fitting(model: Any, loaded: list, file: str) -> tuple[list, list[str]]:
    """The loaded rows (``(index, where, row, ...)``) that fit the model's context, and the ids of
    those that do not (:func:`fitting`)."""
    fits = fitting(model, [r[2].id for r in loaded], [len(r[2].input_ids) for r in loaded], file)
    return [r for r, ok in zip(loaded, fits) if ok], [r[2].id for r, ok in zip(loaded, fits) if not ok]


def loss_items(rows: list, scored: list[tuple[float, int]], data: str) -> list[dict[str, Any]]:
    """One record per scored row (``(index, where, row)``, or ``(index, where, row, answer)``):
    where it comes from, its answer if it has one, its tokens and its loss."""
    return [
        {
            "index": r[0],
            "id": r[2].id,
            "source": f"{data}:{r[1]}",
            **({"answer": r[3]} if len(r) > 3 else {}),
            "tokens": n,
            "loss_sum": total,
            "loss": total / n,
        }
        for r, (total, n) in zip(rows, scored)
    ]


def loss_summary(
    task: str,
    average: str,
    over: str,
    scored: list[tuple[float, int]],
    ci: Any,
    run: tuple[list[str], Any, EvalOptions, bool],
    extra: dict[str, Any],
) -> dict[str, Any]:
    """A loss task's summary: the loss with its bootstrap interval (``ci``, resampled ``over`` items
    or examples), the task's own ``extra`` entries, then what was skipped and what ran (``run``:
    the skipped ids, the model, the options and whether the chat template was used)."""
    skipped, model, options, chat = run
    return {
        "task": task,
        "metric": "loss",
        "average": average,
        "n": len(scored),
        "tokens": sum(n for _, n in scored),
        "loss": ci.mean,
        "ci_low": ci.low,
        "ci_high": ci.high,
        "ci_level": ci.level,
        **extra,
        "skipped_too_long": skipped,
        "bootstrap": {"resamples": ci.resamples, "seed": ci.seed, "over": over},
        "model": model_name(model),
        "data": str(options.data),
        "chat_template": chat,
        "settings": options.to_dict(),
    }


def heldout_loss_task(model: Any, tokenizer: Any, options: EvalOptions) -> EvalRun:
    chat = loss_task_chat(options, "heldout-loss")
    loaded = load_rows(options.data, tokenizer, chat_template=chat, limit=options.limit)
    rows, skipped = split_fitting(model, loaded, options.data)
    scored = row_losses(
        model, [r[2] for r in rows], pad_id=pad_id(tokenizer), batch_size=options.batch_size, progress=options.progress
    )
    ci = ratio_bootstrap([s for s, _ in scored], [n for _, n in scored])
    # the loss is a token mean over the file (paired comparisons use loss_sum/tokens)
    run = (skipped, model, options, chat)
    summary = loss_summary("heldout-loss", "tokens", "examples", scored, ci, run, {"perplexity": math.exp(ci.mean)})
    return {"summary": summary, "items": loss_items(rows, scored, options.data)}
