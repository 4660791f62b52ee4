"""When a row of a generated batch is done (:mod:`.generate`): at EOS or at the first stop string.

:class:`StopOnStrings` stops a row once its continuation holds a stop string, decoding only the rows
whose newest token can end one (:class:`EndingTokens`); :class:`ItemProgress` counts the rows that
ended (EOS or stop string) on the progress bar, and when each did; :func:`cut_at_stop` cuts the
decoded text at the first stop string."""

from __future__ import annotations

import weakref
from typing import Any, Sequence, cast

import torch
from rich.progress import Progress
from transformers import StoppingCriteria


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
