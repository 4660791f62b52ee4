"""Batched greedy generation for a Hugging Face causal LM.

Prompts are tokenized once, sorted by length (less padding), left-padded per batch and run
through ``model.generate`` (greedy, KV cache). Generation stops for a row at EOS or at the first
stop string; a batch stops as soon as every row has stopped. The decoded continuation is cut at
the first stop string, which is not included.

Batches hold ``batch_size`` prompts, or fewer where ``batch_tokens`` caps rows x (longest prompt
+ ``max_new_tokens``), the KV cache a batch can fill (:func:`plan_batches`). ``compile=True`` asks
transformers for a static KV cache and a ``torch.compile``d decoding step on CUDA (one cache size
and one row count for every batch, so the step compiles once); elsewhere it generates as without.

The per-step host work is kept small for batches of a thousand rows: the EOS check and the
progress bar look at the newest token only, and a stop string is looked for (by decoding the last
few tokens, as before) only in rows still running whose newest token can end one
(:class:`.stopping.StopOnStrings`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import time
from typing import Any, Callable, Iterator, Sequence, Union

import torch
from rich.progress import Progress
from transformers import StoppingCriteriaList

from ..errors import UsageError
from ..progress import make_progress, note
from . import journal
from .stopping import ItemProgress, StopOnStrings, cut_at_stop
from .tasks import EvalOptions

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


def chat_turns(shots: Sequence[tuple[str, str]], question: str) -> list[Message]:
    """A few-shot chat: each worked example as a user turn and the assistant's answer, then the
    question as the last user turn."""
    messages: list[Message] = []
    for asked, answered in shots:
        messages.append({"role": "user", "content": asked})
        messages.append({"role": "assistant", "content": answered})
    messages.append({"role": "user", "content": question})
    return messages


def render_prompt(tokenizer: Any, prompt: Prompt, *, chat_template: bool = True) -> str:
    """The text that is tokenized for ``prompt``. With a chat template a bare string becomes one
    user turn; without one, a chat is flattened by :func:`render_plain`."""
    if uses_chat_template(tokenizer, chat_template):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return prompt if isinstance(prompt, str) else render_plain(list(prompt))


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
    """A bar on stderr (progress lines inside a pipe or into a log); off when asked, or under
    BRIDGE_NO_PROGRESS (see :mod:`bridgecli.progress`)."""
    return make_progress(None if enabled else False)


def plan_batches(
    lengths: Sequence[int], *, batch_size: int, batch_tokens: int | None, max_new_tokens: int
) -> list[tuple[int, int]]:
    """``(start, end)`` slices of prompts sorted longest first (``lengths``): at most
    ``batch_size`` rows each, and with ``batch_tokens``, at most ``batch_tokens // (longest prompt
    of the batch + max_new_tokens)`` rows (at least one): the KV cache a batch can fill."""
    out = []
    start = 0
    while start < len(lengths):
        rows = batch_size
        if batch_tokens is not None:
            rows = min(rows, max(1, batch_tokens // (lengths[start] + max_new_tokens)))
        end = min(len(lengths), start + rows)
        out.append((start, end))
        start = end
    return out


#: where ``compile=True`` takes effect (transformers compiles the decoding step on these devices)
COMPILE_DEVICES = ("cuda", "xpu")


def compile_config() -> Any:
    """What ``compile=True`` hands transformers: its defaults (inductor, CUDA graphs through
    "reduce-overhead"), static shapes."""
    from transformers import CompileConfig

    return CompileConfig(fullgraph=False, dynamic=False)


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
    batch_tokens: int | None = None,
    compile: bool = False,
    stats: dict[str, Any] | None = None,
) -> list[str]:
    """Greedy continuations of ``prompts`` (chats as lists of ``{"role", "content"}`` messages, or
    plain strings), in input order, each cut at the first stop string.

    Chats are rendered with the tokenizer's chat template when ``chat_template`` is true and the
    tokenizer has one (see :func:`render_prompt`). Special tokens are dropped from the output.
    ``batch_tokens`` and ``compile``: see the module docstring. A ``stats`` dict is filled with
    what was generated: ``batches`` (rows, padded prompt tokens, decoding steps, generated tokens
    and seconds of each; none for continuations taken from a journal), ``items`` (input index ->
    generated tokens, EOS or stop string included, and whether ``max_new_tokens`` cut it off) and
    ``compiled``."""
    _check_sizes(max_new_tokens, batch_size, batch_tokens)
    if stats is not None:
        stats.update(batches=[], items={}, compiled=False)
    if not prompts:
        return []
    chat = uses_chat_template(tokenizer, chat_template)
    texts = [render_prompt(tokenizer, p, chat_template=chat_template) for p in prompts]
    outputs: list[str] = [""] * len(texts)
    # an interrupted `bridge eval` resumed: continuations already in the task's journal are reused
    book = journal.active()
    keys = [journal.key(t, max_new_tokens, stop) for t in texts] if book is not None else []
    todo = _reuse(book, keys, outputs, stats)
    if not todo:
        return outputs
    # A rendered chat template already holds its special tokens (BOS included); plain text gets the
    # tokenizer's usual ones.
    encoded = dict(zip(todo, tokenizer([texts[i] for i in todo], add_special_tokens=not chat)["input_ids"]))
    order = sorted(todo, key=lambda i: -len(encoded[i]))
    device = getattr(model, "device", None) or next(model.parameters()).device
    lengths = [len(encoded[i]) for i in order]
    plan, compiled = _plan(lengths, batch_size, batch_tokens, max_new_tokens, compile, torch.device(device).type)
    with _generating(model, tokenizer, progress, description) as bar:
        eos_list = _eos_ids(model, tokenizer)
        plain = _greedy_config(
            model, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, eos_ids=eos_list
        )
        config = _static_config(plain, lengths[0] + max_new_tokens) if compiled else plain
        task = bar.add_task(description, total=len(texts), completed=len(texts) - len(todo), unit="item")
        for start, end in plan:
            rows = order[start:end]
            # a compiled step keeps its row count: the last batch is filled up with copies of its last row
            filled = rows + [rows[-1]] * ((plan[0][1] - plan[0][0]) - len(rows) if compiled else 0)
            batch = tokenizer.pad({"input_ids": [encoded[i] for i in filled]}, padding=True, return_tensors="pt")
            prompt_length = batch["input_ids"].shape[1]
            base = len(texts) - len(todo) + start
            began = time.perf_counter()
            watcher = functools.partial(_watch, tokenizer, stop, bar, task, base, prompt_length, eos_list, len(rows))
            ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
            out, watch, config = _generate_batch(model, ids, mask, config, plain, watcher)
            compiled = compiled and config is not plain
            seconds = time.perf_counter() - began
            continuations = tokenizer.batch_decode(out[: len(rows), prompt_length:], skip_special_tokens=True)
            for i, text in zip(rows, continuations):
                outputs[i] = cut_at_stop(text, stop)
            numbers = _numbers(rows, watch, out.shape[1] - prompt_length)
            if book is not None:
                book.add([(keys[i], {"text": outputs[i], "meta": numbers[i]}) for i in rows])
            bar.update(task, completed=base + len(rows))
            if stats is not None:
                stats["items"].update(numbers)
                stats["batches"].append(_batch_stats(numbers, prompt_length, out.shape[1] - prompt_length, seconds))
    if stats is not None:
        stats["compiled"] = compiled
    return outputs


@contextlib.contextmanager
def _generating(model: Any, tokenizer: Any, progress: bool, description: str) -> Iterator[Progress]:
    """Left padding, eval mode and no autograd for the duration, and the progress bar."""
    with (
        _left_padding(tokenizer),
        _eval_mode(model),
        torch.inference_mode(),
        progress_bar(progress, description) as bar,
    ):
        yield bar


def _watch(
    tokenizer: Any,
    stop: Sequence[str],
    bar: Progress,
    task: Any,
    base: int,
    prompt_length: int,
    eos_ids: list[int],
    rows: int,
) -> ItemProgress:
    """A fresh watch of one batch's rows (and their stop strings), for one ``model.generate``."""
    stop_rule = StopOnStrings(tokenizer, stop, prompt_length) if any(stop) else None
    return ItemProgress(bar, task, base, prompt_length, eos_ids, stop_rule, counted=rows)


def generation_mode(
    tokenizer: Any, options: EvalOptions, plain_stop: Sequence[str]
) -> tuple[bool, bool, tuple[str, ...]]:
    """What a generation task renders and stops at: ``(chat_template asked, chat template used,
    stop strings)``. Generation tasks use the chat template unless ``--chat-template`` is off; the
    task's stop strings apply to plain-text prompts only."""
    use_template = options.chat_template is not False
    chat = uses_chat_template(tokenizer, use_template)
    return use_template, chat, (() if chat else tuple(plain_stop))


def generate_for_task(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    options: EvalOptions,
    *,
    stop: Sequence[str],
    max_new_tokens: int,
    description: str,
    stats: dict[str, Any] | None = None,
) -> list[str]:
    """:func:`generate` with an answer task's options (gsm8k, math): batch size and tokens, chat
    template, progress and ``--compile``."""
    return generate(
        model,
        tokenizer,
        prompts,
        max_new_tokens=max_new_tokens,
        batch_size=options.batch_size,
        stop=stop,
        chat_template=options.chat_template is not False,
        progress=options.progress,
        description=description,
        batch_tokens=options.batch_tokens,
        compile=options.compile,
        stats=stats,
    )


def _check_sizes(max_new_tokens: int, batch_size: int, batch_tokens: int | None) -> None:
    if max_new_tokens < 1:
        raise UsageError(f"max_new_tokens must be at least 1 (got {max_new_tokens})")
    if batch_size < 1:
        raise UsageError(f"batch size must be at least 1 (got {batch_size})")
    if batch_tokens is not None and batch_tokens < 1:
        raise UsageError(f"batch tokens must be at least 1 (got {batch_tokens})")


def _reuse(book: Any, keys: list[str], outputs: list[str], stats: dict[str, Any] | None) -> list[int]:
    """Fill ``outputs`` (and ``stats``) with the continuations the journal ``book`` already holds:
    the input indices still to generate."""
    todo, kept = journal.pending(book, keys, len(outputs))
    for i, found in kept.items():
        outputs[i] = found["text"] if isinstance(found, dict) else found
        if stats is not None and isinstance(found, dict) and isinstance(found.get("meta"), dict):
            stats["items"][i] = found["meta"]
    return todo


def _plan(
    lengths: list[int], batch_size: int, batch_tokens: int | None, max_new_tokens: int, compile: bool, device: str
) -> tuple[list[tuple[int, int]], bool]:
    """The batches (:func:`plan_batches`) and whether they run compiled: on a device of
    :data:`COMPILE_DEVICES` every batch has the first one's row count, so the step compiles once."""
    plan = plan_batches(lengths, batch_size=batch_size, batch_tokens=batch_tokens, max_new_tokens=max_new_tokens)
    compiled = compile and device in COMPILE_DEVICES
    if compile and not compiled:
        note(f"--compile: generating on {device} without a static cache or compilation (CUDA only)")
    if compiled:  # one row count for every batch: the step compiles once
        rows_each = plan[0][1] - plan[0][0]
        plan = [(start, min(start + rows_each, len(lengths))) for start in range(0, len(lengths), rows_each)]
    return plan, compiled


def _static_config(plain: Any, cache_length: int) -> Any:
    """``plain`` with a static cache of ``cache_length`` (one size for every batch) and compilation."""
    config = copy.deepcopy(plain)
    config.cache_implementation = "static"
    config.max_cache_len = cache_length
    config.compile_config = compile_config()
    return config


def _generate_batch(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    config: Any,
    plain: Any,
    watcher: Callable[[], ItemProgress],
) -> tuple[torch.Tensor, ItemProgress, Any]:
    """``model.generate`` on one padded batch: its output ids, the :class:`ItemProgress` that watched
    it, and the config that worked. Where a compiled config fails (anything but an interrupt or a
    lack of memory), that is said once and the batch runs again with ``plain``."""
    while True:
        watch = watcher()
        try:
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                stopping_criteria=StoppingCriteriaList([watch]),
            )
            return out, watch, config
        except (KeyboardInterrupt, torch.OutOfMemoryError):
            raise
        except Exception as err:
            if config is plain:
                raise
            first = (str(err).strip().splitlines() or [""])[0][:200]
            note(f"--compile failed ({type(err).__name__}: {first}); generating without it")
            config = plain


def _batch_stats(numbers: dict[int, dict[str, Any]], prompt_tokens: int, steps: int, seconds: float) -> dict[str, Any]:
    return {
        "rows": len(numbers),
        "prompt_tokens": prompt_tokens,
        "steps": steps,
        "new_tokens": sum(n["new_tokens"] for n in numbers.values()),
        "seconds": round(seconds, 4),
    }


def _numbers(rows: list[int], watch: ItemProgress, steps: int) -> dict[int, dict[str, Any]]:
    """Per input index: the tokens it generated (its EOS or stop string included; ``steps`` when it
    never ended) and whether the length limit cut it off."""
    out = {}
    for k, i in enumerate(rows):
        at = int(watch.finished_at[k]) if watch.finished_at is not None else -1
        out[i] = {"new_tokens": at if at >= 0 else steps, "hit_limit": at < 0}
    return out


def add_generation_stats(records: list[dict[str, Any]], stats: dict[str, Any]) -> dict[str, Any]:
    """Each record (in prompt order) gets ``new_tokens`` and ``hit_limit`` from a :func:`generate`
    ``stats`` dict (None for a continuation journaled by an older version); returns
    the summary's ``generation`` entry: items cut off by the length limit, tokens, seconds, batches."""
    known = stats.get("items", {})
    for k, record in enumerate(records):
        item = known.get(k)
        record["new_tokens"] = None if item is None else item["new_tokens"]
        record["hit_limit"] = None if item is None else item["hit_limit"]
    batches = stats.get("batches", [])
    return {
        "hit_limit": sum(1 for r in records if r["hit_limit"]),
        "generated_items": len(known),
        "new_tokens": sum(b["new_tokens"] for b in batches),
        "seconds": round(sum(b["seconds"] for b in batches), 3),
        "batches": len(batches),
        "compiled": bool(stats.get("compiled")),
    }
