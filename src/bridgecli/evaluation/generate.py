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
(:class:`StopOnStrings`).
"""

from __future__ import annotations

import contextlib
import copy
import time
import weakref
from typing import Any, Iterator, Sequence, Union, cast

import torch
from rich.progress import Progress
from transformers import StoppingCriteria, StoppingCriteriaList

from ..errors import UsageError
from ..progress import make_progress, note
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

    A row stays stopped once it has stopped (``generate`` never resumes a stopped row). At each
    step only the rows still running are looked at, and of those only the ones whose newest token
    can end a stop string: its text (decoded after a plain token, so a leading space counts) holds
    the last character of a stop string, or is not whole characters (a byte of a longer one). Those
    rows decode their last ``window`` tokens and are searched for the stop strings, as every row was
    before: a stop string completes in the newest token and spans at most about one token per
    character. Skipping a row can only delay its stop (its text is cut at the stop string anyway),
    never change its output.
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str], prompt_length: int):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.prompt_length = prompt_length
        self.window = max((len(s) for s in self.stop), default=0) + 8
        self.ends = ending_tokens(tokenizer, self.stop)
        self.hit: torch.Tensor | None = None  # on the CPU, one flag per row
        self.seen = prompt_length  # columns already looked at

    def check(self, input_ids: torch.Tensor, running: torch.Tensor | None = None) -> torch.Tensor:
        """The rows (a CPU bool tensor) whose continuation holds a stop string; ``running`` (CPU
        bool) limits the search to rows not otherwise finished."""
        rows = input_ids.shape[0]
        if self.hit is None:
            self.hit = torch.zeros(rows, dtype=torch.bool)
        new = input_ids[:, max(self.seen, self.prompt_length) :].cpu()
        self.seen = input_ids.shape[1]
        if not self.stop or new.shape[1] == 0:
            return self.hit
        look = ~self.hit if running is None else (~self.hit & running)
        if look.any():
            look &= self.ends(new).any(dim=1)
        picked = look.nonzero()[:, 0]
        if len(picked):
            tail = input_ids[picked.to(input_ids.device), self.prompt_length :][:, -self.window :]
            texts = self.tokenizer.batch_decode(tail.cpu(), skip_special_tokens=True)
            for row, text in zip(picked.tolist(), texts):
                if any(s in text for s in self.stop):
                    self.hit[row] = True
        return self.hit

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        # transformers' StoppingCriteria types the result as the legacy torch.BoolTensor
        return cast(torch.BoolTensor, self.check(input_ids).to(input_ids.device))


class EndingTokens:
    """Which token ids can end one of ``stop`` (see :class:`StopOnStrings`): a token's text, decoded
    after a plain one-token anchor (``"a"``) so a leading space counts, holds the last character of
    a stop string or is not whole characters. Decided for each id the first time it is generated
    (a run meets a few thousand distinct ids, not the whole vocabulary) and kept for the tokenizer's
    lifetime. Without a one-token anchor every id counts as one that can."""

    def __init__(self, tokenizer: Any, stop: Sequence[str]):
        self.tokenizer = tokenizer
        self.last = {s[-1] for s in stop if s}
        anchor = tokenizer("a", add_special_tokens=False)["input_ids"]
        self.anchor = anchor[0] if len(anchor) == 1 else None
        self.lead = tokenizer.decode(anchor, skip_special_tokens=True) if self.anchor is not None else ""
        self.known = torch.full((max(len(tokenizer), 1),), -1, dtype=torch.int8)  # -1: not decided yet

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """A bool for each of ``ids`` (a CPU tensor of any shape)."""
        if self.anchor is None:
            return torch.ones(ids.shape, dtype=torch.bool)
        if ids.numel() and int(ids.max()) >= len(self.known):  # an id past the tokenizer's: looked at
            grown = torch.ones((int(ids.max()) + 1,), dtype=torch.int8)
            grown[: len(self.known)] = self.known
            self.known = grown
        ids = ids.clamp(min=0)
        flags = self.known[ids]
        if (flags < 0).any():
            new = torch.unique(ids[flags < 0]).tolist()
            texts = self.tokenizer.batch_decode([[self.anchor, i] for i in new], skip_special_tokens=True)
            for i, t in zip(new, texts):
                t = t[len(self.lead) :] if t.startswith(self.lead) else t
                self.known[i] = int("\ufffd" in t or any(c in t for c in self.last))
            flags = self.known[ids]
        return flags > 0


_ENDS: "weakref.WeakKeyDictionary[Any, dict[tuple[str, ...], EndingTokens]]" = weakref.WeakKeyDictionary()


def ending_tokens(tokenizer: Any, stop: Sequence[str]) -> EndingTokens:
    """The :class:`EndingTokens` of ``tokenizer`` and ``stop``, one per pair while the tokenizer lives."""
    key = tuple(stop)
    try:
        cached = _ENDS.setdefault(tokenizer, {})
    except TypeError:  # not weak-referenceable: a fresh one
        return EndingTokens(tokenizer, stop)
    if key not in cached:
        cached[key] = EndingTokens(tokenizer, stop)
    return cached[key]


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
    by itself; returns what ``stop`` returns. Each call looks only at the tokens added since the last."""

    def __init__(
        self,
        bar: Progress,
        task: Any,
        base: int,
        prompt_length: int,
        eos_ids: Sequence[int],
        stop: StoppingCriteria | None = None,
        counted: int | None = None,
    ):
        self.bar, self.task, self.base = bar, task, base
        self.counted = counted  # rows the bar counts (the first ones); None: all
        self.prompt_length = prompt_length
        self.eos = torch.tensor(sorted(set(eos_ids)), dtype=torch.long) if eos_ids else None
        self.stop = stop
        self.done: torch.Tensor | None = None  # on the CPU
        self.ended: torch.Tensor | None = None  # rows that generated an EOS (on the CPU)
        self.seen = prompt_length
        self.shown = -1
        self.finished_at: torch.Tensor | None = None  # per row: the continuation's length when it ended (-1: not yet)
        self.none: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        rows = input_ids.shape[0]
        if self.done is None or self.ended is None or self.finished_at is None:
            self.done = torch.zeros(rows, dtype=torch.bool)
            self.ended = torch.zeros(rows, dtype=torch.bool)
            self.finished_at = torch.full((rows,), -1, dtype=torch.long)
        new = input_ids[:, max(self.seen, self.prompt_length) :]
        self.seen = input_ids.shape[1]
        if self.eos is not None and new.shape[1]:
            if self.eos.device != input_ids.device:
                self.eos = self.eos.to(input_ids.device)
            self.ended |= torch.isin(new, self.eos).any(dim=1).cpu()
        if isinstance(self.stop, StopOnStrings):
            hit_cpu = self.stop.check(input_ids, running=~self.ended)
            hit = hit_cpu.to(input_ids.device)
        elif self.stop is not None:
            hit = self.stop(input_ids, scores, **kwargs)
            hit_cpu = hit.cpu()
        else:  # no stop strings: the same all-false flags every step
            if self.none is None or self.none.device != input_ids.device:
                self.none = torch.zeros(rows, dtype=torch.bool, device=input_ids.device)
            hit_cpu, hit = torch.zeros(rows, dtype=torch.bool), self.none
        now = self.ended | hit_cpu
        self.finished_at[now & ~self.done] = input_ids.shape[1] - self.prompt_length
        self.done = self.done | now
        count = int(self.done[: self.counted].sum())
        if count != self.shown:
            self.shown = count
            self.bar.update(self.task, completed=self.base + count)
        return cast(torch.BoolTensor, hit)  # a bool tensor, typed as transformers' StoppingCriteria says


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
    if max_new_tokens < 1:
        raise UsageError(f"max_new_tokens must be at least 1 (got {max_new_tokens})")
    if batch_size < 1:
        raise UsageError(f"batch size must be at least 1 (got {batch_size})")
    if batch_tokens is not None and batch_tokens < 1:
        raise UsageError(f"batch tokens must be at least 1 (got {batch_tokens})")
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
    todo, kept = journal.pending(book, keys, len(texts))
    for i, found in kept.items():
        outputs[i] = found["text"] if isinstance(found, dict) else found
        if stats is not None and isinstance(found, dict) and isinstance(found.get("meta"), dict):
            stats["items"][i] = found["meta"]
    if not todo:
        return outputs
    # A rendered chat template already holds its special tokens (BOS included); plain text gets the
    # tokenizer's usual ones.
    encoded = dict(zip(todo, tokenizer([texts[i] for i in todo], add_special_tokens=not chat)["input_ids"]))
    order = sorted(todo, key=lambda i: -len(encoded[i]))
    device = getattr(model, "device", None) or next(model.parameters()).device
    lengths = [len(encoded[i]) for i in order]
    plan = plan_batches(lengths, batch_size=batch_size, batch_tokens=batch_tokens, max_new_tokens=max_new_tokens)
    compiled = compile and torch.device(device).type in COMPILE_DEVICES
    if compile and not compiled:
        note(f"--compile: generating on {torch.device(device).type} without a static cache or compilation (CUDA only)")
    if compiled:  # one row count for every batch: the step compiles once
        rows_each = plan[0][1] - plan[0][0]
        plan = [(start, min(start + rows_each, len(order))) for start in range(0, len(order), rows_each)]

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
        plain = config
        if compiled:
            config = copy.deepcopy(plain)
            config.cache_implementation = "static"
            config.max_cache_len = lengths[0] + max_new_tokens  # one cache size for every batch
            config.compile_config = compile_config()
        task = bar.add_task(description, total=len(texts), completed=len(texts) - len(todo), unit="item")
        for start, end in plan:
            rows = order[start:end]
            # a compiled step keeps its row count: the last batch is filled up with copies of its last row
            filled = rows + [rows[-1]] * ((plan[0][1] - plan[0][0]) - len(rows) if compiled else 0)
            batch = tokenizer.pad({"input_ids": [encoded[i] for i in filled]}, padding=True, return_tensors="pt")
            input_ids = batch["input_ids"].to(device)
            attention_mask = batch["attention_mask"].to(device)
            prompt_length = input_ids.shape[1]
            base = len(texts) - len(todo) + start
            began = time.perf_counter()
            while True:
                stop_rule = StopOnStrings(tokenizer, stop, prompt_length) if any(stop) else None
                watch = ItemProgress(bar, task, base, prompt_length, eos_list, stop_rule, counted=len(rows))
                try:
                    out = model.generate(
                        input_ids=input_ids,
                        attention_mask=attention_mask,
                        generation_config=config,
                        stopping_criteria=StoppingCriteriaList([watch]),
                    )
                    break
                except (KeyboardInterrupt, torch.OutOfMemoryError):
                    raise
                except Exception as err:
                    if config is plain:
                        raise
                    first = (str(err).strip().splitlines() or [""])[0][:200]
                    note(f"--compile failed ({type(err).__name__}: {first}); generating without it")
                    config, compiled = plain, False
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
                stats["batches"].append(
                    {
                        "rows": len(rows),
                        "prompt_tokens": prompt_length,
                        "steps": out.shape[1] - prompt_length,
                        "new_tokens": sum(n["new_tokens"] for n in numbers.values()),
                        "seconds": round(seconds, 4),
                    }
                )
    if stats is not None:
        stats["compiled"] = compiled
    return outputs


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
