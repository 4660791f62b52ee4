r"""``answer-loss``: the loss of the final answer's tokens, given the prompt and the reference reasoning.

Every record of the file is read and tokenised exactly as ``heldout-loss`` reads it (any shape
``bridge score`` reads; the chat template by default; :func:`.heldout.load_tokenized`), and scored
with the same batched forward (:func:`.heldout.row_losses`). Only the tokens of the final answer in
the reference response carry a label:

- a response with ``####`` (GSM8K): the answer is the text after the **last** ``####`` up to the end
  of its line, without surrounding whitespace (``#### 1,080`` -> ``1,080``); the ``####`` marker and
  the space after it are not part of it;
- otherwise (MATH): the content of the **last** ``\boxed{...}`` (or ``\fbox{...}``), braces
  balanced, without the braces (``\boxed{\frac{1}{2}}`` -> ``\frac{1}{2}``);

and the answer's tokens are the response tokens whose characters overlap that text (a token that
also holds a neighbouring character, e.g. `` 42`` for a tokenizer that glues the space to the
digits, is included whole). Each is scored given everything before it: the prompt, the whole
reasoning, and the answer's earlier tokens. Tokens after the answer are never scored (the row is
cut after the answer's last token, which changes nothing in a causal model).

Per item: ``loss`` = the mean negative log-likelihood (natural log) of its answer tokens, with
``loss_sum`` (their sum: ``-log P(answer | prompt, reasoning)``) and ``tokens``. The headline
``loss`` is the **mean over items of the per-item mean** (every item weighs the same, however many
tokens its answer has), with a 95% percentile bootstrap interval over items
(:mod:`.bootstrap`, seed 0, 1000 resamples). ``loss_token_mean`` (sum over items / answer tokens)
and ``nll_sum_mean`` (the mean of ``loss_sum``) are reported beside it. Records whose response
holds no answer span are counted in ``no_answer`` and named in ``no_answer_ids``; records longer
than the model's positions in ``skipped_too_long``; neither is scored.
"""

from __future__ import annotations

import re
from typing import Any

from ..data.tokenize import Tokenized
from ..errors import InputError
from ..format.spec import RESPONSE
from ..training.rows import IGNORE, Row
from .bootstrap import ratio_bootstrap
from .heldout import load_tokenized, loss_items, loss_summary, loss_task_chat, pad_id, row_losses, split_fitting
from .math_verify_grader import last_boxed_span
from .tasks import EvalOptions, EvalRun

TASK = "answer-loss"
_HASH = "####"


def answer_span(text: str) -> tuple[int, int] | None:
    r"""Where the final answer lies in a reference response ``text``, as ``(start, end)``: after
    the last ``####`` (to the end of its line, whitespace stripped) when there is one, else the
    content of the last ``\boxed{}``. None when there is neither or it is empty."""
    at = text.rfind(_HASH)
    if at >= 0:
        start = at + len(_HASH)
        line_end = text.find("\n", start)
        end = len(text) if line_end < 0 else line_end
        m = re.search(r"\S(?:.*\S)?", text[start:end])
        return (start + m.start(), start + m.end()) if m else None
    span = last_boxed_span(text)
    if span is None:
        return None
    start, end = span
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if end > start else None


def answer_row(row_id: str, tok: Tokenized) -> tuple[Row, str] | None:
    """The row that scores only the answer's tokens (cut after the last of them) and the answer
    text, or None when the response holds no answer (or no token of it)."""
    ids, kinds, offsets = tok.tokens.input_ids, tok.tokens.kinds, tok.tokens.offsets
    response = [i for i, k in enumerate(kinds) if k == RESPONSE]
    if not response:
        return None
    r0, r1 = offsets[2 * response[0]], offsets[2 * response[-1] + 1]
    span = answer_span(tok.text[r0:r1])
    if span is None:
        return None
    a, b = r0 + span[0], r0 + span[1]
    answer = [i for i in response if offsets[2 * i] < b and offsets[2 * i + 1] > a and i > 0]
    if not answer:
        return None
    last = answer[-1]
    labels = [IGNORE] * (last + 1)
    for i in answer:
        labels[i] = ids[i]
    return Row(row_id, list(ids[: last + 1]), labels), tok.text[a:b]


def answer_loss_task(model: Any, tokenizer: Any, options: EvalOptions) -> EvalRun:
    """The ``answer-loss`` eval task (see the module docstring)."""
    chat = loss_task_chat(options, TASK)
    loaded = load_tokenized(options.data, tokenizer, chat_template=chat, limit=options.limit)
    found = []
    no_answer: list[str] = []
    for index, where, pair, tok in loaded:
        made = answer_row(pair.id, tok)
        if made is None:
            no_answer.append(pair.id)
        else:
            found.append((index, where, made[0], made[1]))
    if not found:
        raise InputError(
            "no record's response holds a final answer ('#### N' or \\boxed{...})",
            file=options.data,
            hint="answer-loss needs GSM8K- or MATH-style references",
        )
    rows, skipped = split_fitting(model, found, options.data)
    scored = row_losses(
        model,
        [r[2] for r in rows],
        pad_id=pad_id(tokenizer),
        batch_size=options.batch_size,
        progress=options.progress,
        description=TASK,
    )
    means = [total / n for total, n in scored]
    ci = ratio_bootstrap(means, [1.0] * len(means))
    extra = {
        "loss_token_mean": sum(t for t, _ in scored) / sum(n for _, n in scored),
        "nll_sum_mean": sum(t for t, _ in scored) / len(scored),
        "no_answer": len(no_answer),
        "no_answer_ids": no_answer,
    }
    # the loss is the mean over items of each item's mean token loss
    summary = loss_summary(TASK, "items", "items", scored, ci, (skipped, model, options, chat), extra)
    items = loss_items(rows, scored, options.data)
    return {"summary": summary, "items": items}
