"""Batched greedy generation for a Hugging Face causal LM.

Prompts are tokenized once, sorted by length (less padding), left-padded per batch and run
through ``model.generate`` (greedy, KV cache). Generation stops for a row at EOS or at the first
stop string; a batch stops as soon as every row has stopped. The decoded continuation is cut at
the first stop string, which is not included.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator, Sequence, Union, cast

import torch
from rich.progress import Progress
from transformers import StoppingCriteria, StoppingCriteriaList

from ..errors import UsageError
from ..progress import make_progress
from . import journal

Message = dict[str, str]
Prompt = Union[str, list[Message]]


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def uses_chat_template(tokenizer: Any, chat_template: bool = True) -> bool:
    """Whether prompts will be rendered with the chat template: asked for, and the tokenizer has one."""
    return chat_template and has_chat_template(tokenizer)


def render_plain(messages: list[Message]) -> str:
    """A chat as plain text, for tokenizers without a chat template: the turns' contents, one
    paragraph each. Tasks that care about the plain format pass strings instead."""
    return "\n\n".join(m["content"] for m in messages)


def render_prompt(tokenizer: Any, prompt: Prompt, *, chat_template: bool = True) -> str:
    """The text that is tokenized for ``prompt``. With a chat template a bare string becomes one
    user turn; without one, a chat is flattened by :func:`render_plain`."""
    if uses_chat_template(tokenizer, chat_template):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return prompt if isinstance(prompt, str) else render_plain(list(prompt))


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to (not including) the earliest occurrence of any stop string."""
    cut = len(text)
    for s in stop:
        if s:
            i = text.find(s)
            if 0 <= i < cut:
                cut = i
    return text[:cut]


class StopOnStrings(StoppingCriteria):
    """Per-row stop once the continuation (tokens after ``prompt_length``) contains a stop string.

    Only the last ``window`` tokens are decoded at each step: a stop string completes in the newest
    token and spans at most about one token per character."""

    def __init__(self, tokenizer: Any, stop: Sequence[str], prompt_length: int):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.prompt_length = prompt_length
        self.window = max((len(s) for s in self.stop), default=0) + 8

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        tail = input_ids[:, self.prompt_length :][:, -self.window :]
        texts = self.tokenizer.batch_decode(tail, skip_special_tokens=True)
        hit = [any(s in t for s in self.stop) for t in texts]
        # transformers' StoppingCriteria types the result as the legacy torch.BoolTensor
        return cast(torch.BoolTensor, torch.tensor(hit, dtype=torch.bool, device=input_ids.device))


@contextlib.contextmanager
def _left_padding(tokenizer: Any) -> Iterator[None]:
    """Left padding and a pad token (EOS when the tokenizer has none) for the duration; restored after."""
    side, pad = tokenizer.padding_side, tokenizer.pad_token
    tokenizer.padding_side = "left"
    if pad is None:
        if tokenizer.eos_token is None:
            raise UsageError("the tokenizer has neither a pad token nor an EOS token; cannot batch prompts")
        tokenizer.pad_token = tokenizer.eos_token
    try:
        yield
    finally:
        tokenizer.padding_side = side
        if pad is None:
            tokenizer.pad_token = None


@contextlib.contextmanager
def _eval_mode(model: Any) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids: list[int] = []
    for source in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        for i in [source] if isinstance(source, int) else source or []:
            if i not in ids:
                ids.append(i)
    return ids


def _greedy_config(model: Any, *, max_new_tokens: int, pad_token_id: int, eos_ids: list[int]):
    config = copy.deepcopy(model.generation_config)
    # Plain greedy, whatever the checkpoint's defaults: no sampling, no beams, no repetition
    # penalties. The sampling knobs get their neutral values (transformers would refill None from
    # the checkpoint and then warn that they are ignored).
    config.update(
        do_sample=False,
        num_beams=1,
        num_return_sequences=1,
        temperature=1.0,
        top_k=50,
        top_p=1.0,
        typical_p=1.0,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        max_length=None,
    )
    config.max_new_tokens = max_new_tokens
    config.pad_token_id = pad_token_id
    config.eos_token_id = eos_ids or None
    return config


def progress_bar(enabled: bool, description: str = "") -> Progress:
    """A bar (or, inside a pipe, progress lines) on stderr; off when asked, when stderr is not a
    terminal, or under BRIDGE_NO_PROGRESS (see :mod:`bridgecli.progress`)."""
    return make_progress(None if enabled else False)


class ItemProgress(StoppingCriteria):
    """Moves the bar per item while a batch generates: a row counts as done once its continuation
    holds an EOS token or (through the wrapped ``stop`` criteria) a stop string. Never stops a row
    by itself; returns what ``stop`` returns."""

    def __init__(
        self,
        bar: Progress,
        task: Any,
        base: int,
        prompt_length: int,
        eos_ids: Sequence[int],
        stop: StoppingCriteria | None = None,
    ):
        self.bar, self.task, self.base = bar, task, base
        self.prompt_length = prompt_length
        self.eos = torch.tensor(sorted(set(eos_ids)), dtype=torch.long) if eos_ids else None
        self.stop = stop
        self.done: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        hit = (
            self.stop(input_ids, scores, **kwargs)
            if self.stop is not None
            else torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        )
        finished = hit.clone()
        if self.eos is not None:
            generated = input_ids[:, self.prompt_length :]
            finished |= torch.isin(generated, self.eos.to(input_ids.device)).any(dim=1)
        self.done = finished if self.done is None else (self.done | finished)
        self.bar.update(self.task, completed=self.base + int(self.done.sum()))
        return cast(torch.BoolTensor, hit)  # a bool tensor, typed as transformers' StoppingCriteria says


def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    *,
    max_new_tokens: int = 256,
    batch_size: int = 8,
    stop: Sequence[str] = (),
    chat_template: bool = True,
    progress: bool = True,
    description: str = "generating",
) -> list[str]:
    """Greedy continuations of ``prompts`` (chats as lists of ``{"role", "content"}`` messages, or
    plain strings), in input order, each cut at the first stop string.

    Chats are rendered with the tokenizer's chat template when ``chat_template`` is true and the
    tokenizer has one (see :func:`render_prompt`). Special tokens are dropped from the output."""
    if max_new_tokens < 1:
        raise UsageError(f"max_new_tokens must be at least 1 (got {max_new_tokens})")
    if batch_size < 1:
        raise UsageError(f"batch size must be at least 1 (got {batch_size})")
    if not prompts:
        return []
    chat = uses_chat_template(tokenizer, chat_template)
    texts = [render_prompt(tokenizer, p, chat_template=chat_template) for p in prompts]
    outputs: list[str] = [""] * len(texts)
    # an interrupted `bridge eval` resumed: continuations already in the task's journal are reused
    book = journal.active()
    keys = [journal.key(t, max_new_tokens, stop) for t in texts] if book is not None else []
    todo, kept = journal.pending(book, keys, len(texts))
    for i, text in kept.items():
        outputs[i] = text
    if not todo:
        return outputs
    # A rendered chat template already holds its special tokens (BOS included); plain text gets the
    # tokenizer's usual ones.
    encoded = dict(zip(todo, tokenizer([texts[i] for i in todo], add_special_tokens=not chat)["input_ids"]))
    order = sorted(todo, key=lambda i: -len(encoded[i]))
    device = getattr(model, "device", None) or next(model.parameters()).device

    with (
        _left_padding(tokenizer),
        _eval_mode(model),
        torch.inference_mode(),
        progress_bar(progress, description) as bar,
    ):
        eos_list = _eos_ids(model, tokenizer)
        config = _greedy_config(
            model, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, eos_ids=eos_list
        )
        task = bar.add_task(description, total=len(texts), completed=len(texts) - len(todo), unit="item")
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            batch = tokenizer.pad({"input_ids": [encoded[i] for i in rows]}, padding=True, return_tensors="pt")
            input_ids = batch["input_ids"].to(device)
            attention_mask = batch["attention_mask"].to(device)
            prompt_length = input_ids.shape[1]
            stop_rule = StopOnStrings(tokenizer, stop, prompt_length) if any(stop) else None
            base = len(texts) - len(todo) + start
            criteria = StoppingCriteriaList([ItemProgress(bar, task, base, prompt_length, eos_list, stop_rule)])
            out = model.generate(
                input_ids=input_ids, attention_mask=attention_mask, generation_config=config, stopping_criteria=criteria
            )
            continuations = tokenizer.batch_decode(out[:, prompt_length:], skip_special_tokens=True)
            for i, text in zip(rows, continuations):
                outputs[i] = cut_at_stop(text, stop)
            if book is not None:
                book.add([(keys[i], outputs[i]) for i in rows])
            bar.update(task, completed=base + len(rows))
    return outputs
