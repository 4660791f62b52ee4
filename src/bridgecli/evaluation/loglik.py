"""Log-likelihood of continuations given contexts, batched: the scoring behind multiple-choice tasks.

For a request ``(context, continuation)`` the score is the sum over the continuation's tokens of
``log p(token | everything before it)``. Tokenisation follows lm-evaluation-harness: trailing
spaces of the context move to the front of the continuation, ``context + continuation`` is
tokenized as one string, the continuation's tokens are those past the context's own token count,
and the model sees the context's own tokens followed by them. The tokenizer adds
its usual special tokens (SmolLM2 adds none; Llama-style tokenizers add BOS); an empty context
is replaced by the BOS (else EOS) token.

Requests whose model input (all tokens but the last) is identical share one forward pass: the
four ``" A"``..``" D"`` answers of an MMLU question cost one forward of the question. Inputs are
sorted by length, left-padded per batch with explicit position ids (so every row sees the
positions it would see alone), and only the last logits each row needs are computed
(``logits_to_keep``). Each continuation token's log-probability (its logit less the position's
log-sum-exp, in float32) and whether it is the argmax are taken on the model's device; only those
numbers leave it. (Moving the whole ``[batch, tail, vocab]`` log-softmax to the host made a
151,936-token vocabulary's HellaSwag host-bound on a GPU: about 20 requests a second.)

While ``bridge eval`` runs a task, each scored batch is recorded in the task's journal, and an
interrupted run resumed with ``--resume`` scores only what the journal does not hold
(:mod:`bridgecli.evaluation.journal`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..errors import UsageError
from . import journal
from .generate import _eval_mode, progress_bar


@dataclass(frozen=True)
class LogLik:
    logprob: float  # sum of the continuation's token log-probabilities
    greedy: bool  # every continuation token is the argmax at its position
    n_tokens: int  # continuation tokens scored


def encode_pair(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """``(context tokens, continuation tokens)`` as described in the module docstring."""
    n_spaces = len(context) - len(context.rstrip(" "))
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tokenizer(context + continuation)["input_ids"]
    ctx = tokenizer(context)["input_ids"] if context else []
    # a tokenizer that appends EOS (rare) would put it inside the continuation: drop it
    eos = tokenizer.eos_token_id
    if eos is not None and whole and whole[-1] == eos and not continuation.endswith(tokenizer.eos_token or "\0"):
        whole = whole[:-1]
        ctx = ctx[:-1] if ctx and ctx[-1] == eos else ctx
    cont = whole[len(ctx) :]
    if not ctx:
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos
        if start is None:
            raise UsageError("an empty context needs a BOS or EOS token to condition on; this tokenizer has neither")
        ctx = [start]
    if not cont:
        raise UsageError(f"the continuation {continuation!r} encodes to no tokens")
    return ctx, cont


def _max_length(model: Any) -> int | None:
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _forward_tail(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: int) -> torch.Tensor:
    """Logits of the last ``keep`` positions: ``[batch, keep, vocab]``, in the model's dtype, on its device."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    try:
        logits = model(**inputs, logits_to_keep=keep).logits
    except TypeError:  # a model whose forward has no logits_to_keep
        logits = model(**inputs).logits
    return logits[:, -keep:, :]


def continuation_scores(logits: torch.Tensor, conts: Sequence[tuple[int, Sequence[int]]]) -> list[tuple[float, bool]]:
    """For each ``(row, continuation tokens)``, with the continuation right-aligned in the row's ``logits``
    (``[batch, tail, vocab]``): the sum of its tokens' float32 log-probabilities (summed in float64) and
    whether every token is its position's argmax. Computed where ``logits`` are; only the picked values
    move to the host."""
    tail = logits.shape[1]
    rows: list[int] = []
    cols: list[int] = []
    targets: list[int] = []
    owner: list[int] = []
    for k, (b, cont) in enumerate(conts):
        n = len(cont)
        rows += [b] * n
        cols += range(tail - n, tail)
        targets += cont
        owner += [k] * n
    dev = logits.device
    r = torch.tensor(rows, dtype=torch.long, device=dev)
    c = torch.tensor(cols, dtype=torch.long, device=dev)
    t = torch.tensor(targets, dtype=torch.long, device=dev)
    picked = logits[r, c].float()  # [tokens, vocab]: only the positions some continuation reads
    token_lp = picked.gather(-1, t[:, None])[:, 0] - torch.logsumexp(picked, dim=-1)
    hit = picked.argmax(-1) == t
    token_lp, hit = token_lp.double().cpu(), hit.cpu()
    who = torch.tensor(owner, dtype=torch.long)
    sums = torch.zeros(len(conts), dtype=torch.float64).index_add_(0, who, token_lp)
    misses = torch.zeros(len(conts), dtype=torch.long).index_add_(0, who, (~hit).long())
    return [(float(sums[k]), bool(misses[k] == 0)) for k in range(len(conts))]


def loglikelihood(
    model: Any,
    tokenizer: Any,
    requests: Sequence[tuple[str, str]],
    *,
    batch_size: int = 8,
    progress: bool = True,
    description: str = "scoring",
) -> list[LogLik]:
    """Score ``(context, continuation)`` pairs; results in input order."""
    if batch_size < 1:
        raise UsageError(f"batch size must be at least 1 (got {batch_size})")
    if not requests:
        return []
    results: list[LogLik | None] = [None] * len(requests)
    # an interrupted `bridge eval` resumed: log-likelihoods already in the task's journal are reused
    book = journal.active()
    keys = [journal.loglik_key(c, x) for c, x in requests] if book is not None else []
    todo, kept = journal.pending(book, keys, len(requests))
    for r, (logprob, greedy, n) in kept.items():
        results[r] = LogLik(float(logprob), bool(greedy), int(n))
    if not todo:
        return results  # type: ignore[return-value]
    max_len = _max_length(model)
    # the model input of each request (whole sequence minus its last token) and its continuation
    inputs: dict[tuple[int, ...], int] = {}
    needs: dict[int, tuple[int, list[int]]] = {}
    for r in todo:
        ctx, cont = encode_pair(tokenizer, *requests[r])
        whole = ctx + cont
        if max_len is not None and len(whole) - 1 > max_len:
            if len(cont) >= max_len:
                raise UsageError(f"a continuation of {len(cont)} tokens does not fit the model's {max_len} positions")
            whole = whole[-(max_len + 1) :]  # drop the oldest context tokens
        key = tuple(whole[:-1])
        needs[r] = (inputs.setdefault(key, len(inputs)), cont)
    unique = list(inputs)
    keep = [0] * len(unique)
    for slot, cont in needs.values():
        keep[slot] = max(keep[slot], len(cont))

    order = sorted(range(len(unique)), key=lambda i: -len(unique[i]))
    by_slot: dict[int, list[int]] = {}
    for r, (slot, _) in needs.items():
        by_slot.setdefault(slot, []).append(r)
    device = getattr(model, "device", None) or next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    with _eval_mode(model), torch.inference_mode(), progress_bar(progress, description) as bar:
        task = bar.add_task(description, total=len(requests), completed=len(requests) - len(todo), unit="input")
        for start in range(0, len(order), batch_size):
            slots = order[start : start + batch_size]
            width = max(len(unique[s]) for s in slots)
            ids = torch.full((len(slots), width), pad, dtype=torch.long)
            mask = torch.zeros((len(slots), width), dtype=torch.long)
            for b, s in enumerate(slots):
                seq = unique[s]
                ids[b, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
                mask[b, width - len(seq) :] = 1
            tail = max(keep[s] for s in slots)
            logits = _forward_tail(model, ids.to(device), mask.to(device), tail)
            batch = [(b, r) for b, s in enumerate(slots) for r in by_slot[s]]
            values = continuation_scores(logits, [(b, needs[r][1]) for b, r in batch])
            del logits
            scored: dict[int, LogLik] = {}  # this batch's, in the order they are recorded
            for (_, r), (logprob, greedy) in zip(batch, values):
                results[r] = scored[r] = LogLik(logprob, greedy, len(needs[r][1]))
            bar.advance(task, len(batch))
            if book is not None:
                book.add([(keys[r], [ll.logprob, ll.greedy, ll.n_tokens]) for r, ll in scored.items()])
    return results  # type: ignore[return-value]
