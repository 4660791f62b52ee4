"""A journal of what an eval task has computed, so an interrupted ``bridge eval`` resumes per item.

While a task runs, every continuation :func:`bridgecli.evaluation.generate.generate` produces and
every log-likelihood :func:`bridgecli.evaluation.loglik.loglikelihood` scores is appended to a
JSONL file next to the result, ``eval-TASK.json.partial.jsonl``, flushed after each batch. Its
first line records the request (model fingerprint, task, data, settings); each further line is
``{"key": ..., "text": ..., "meta": {...}}`` for a continuation (the key a digest of the rendered
prompt, the length limit and the stop strings; ``meta`` the tokens generated and whether the limit
cut it off, absent in journals of older versions) or ``{"key": ..., "value": [logprob, greedy, n_tokens]}`` for a
log-likelihood (the key a digest of the context and the continuation). ``bridge eval --resume``
opens the journal of the same request, and both functions take what they find there instead of
computing it again; the journal is removed once the result file is written. The file is locked
while a run writes it, so a second run of the same task into the same folder stops with an error.

Greedy decoding and scoring are deterministic for a given batch, but an input batched with other
neighbours can differ in the last floating-point bits, so a resumed run equals an uninterrupted one
up to those bits (and, for generation, the rare argmax tie that they can flip).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator, Sequence, TextIO

from ..errors import UsageError
from ..io import lock_exclusively, reporting_write_errors

_ACTIVE: contextvars.ContextVar["Journal | None"] = contextvars.ContextVar("bridge_eval_journal", default=None)


def key(text: str, max_new_tokens: int, stop: Sequence[str]) -> str:
    """What decides a greedy continuation besides the model: the rendered prompt, the length limit
    and the stop strings."""
    payload = json.dumps([text, max_new_tokens, list(stop)], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def loglik_key(context: str, continuation: str) -> str:
    """What decides a log-likelihood besides the model: the context and the continuation."""
    payload = json.dumps(["loglik", context, continuation], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class Journal:
    """Continuations and log-likelihoods computed so far for one request, and the file that keeps them."""

    def __init__(self, path: str | os.PathLike, request: dict[str, Any], entries: dict[str, Any]):
        self.path = Path(path)
        self.request = request
        self.entries = entries
        self.reused = 0
        self._fh: TextIO | None = None  # open from _start until close

    @classmethod
    def open(cls, path: str | os.PathLike, request: dict[str, Any], resume: bool) -> "Journal":
        """The journal at ``path``: with ``resume``, what an earlier run of the same request left
        (a journal of another request is an error naming the setting); otherwise a fresh one."""
        path = Path(path)
        entries: dict[str, str] = {}
        if resume and path.exists():
            entries = _read(path, request)
        journal = cls(path, request, entries)
        journal._start(keep=bool(entries))
        return journal

    def _start(self, keep: bool) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # "a", never "w": another run's journal stays intact until the lock says it is ours
        self._fh = fh = open(self.path, "a", encoding="utf-8")
        lock_exclusively(fh, self.path, "eval journal")
        if not keep:
            try:
                fh.truncate(0)
                self._write({"request": self.request})
            except BaseException:
                self.close(remove=True)  # it holds nothing yet
                raise

    def _file(self) -> TextIO:
        assert self._fh is not None, "the journal is not open"
        return self._fh

    def _write(self, obj: dict[str, Any]) -> None:
        fh = self._file()
        with reporting_write_errors(self.path):  # a full disk: one line naming the journal
            fh.write(json.dumps(obj, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def get(self, k: str) -> Any:
        found = self.entries.get(k)
        if found is not None:
            self.reused += 1
        return found

    def add(self, items: Sequence[tuple[str, Any]]) -> None:
        """Record (key, continuation text or log-likelihood value) pairs at once: one flush per batch.
        A continuation may come as ``{"text": ..., "meta": {...}}``; it is read back the same way."""
        fh = self._file()
        with reporting_write_errors(self.path):
            for k, found in items:
                self.entries[k] = found
                if isinstance(found, dict) and "text" in found:
                    line = {"key": k, **found}
                else:
                    line = {"key": k, "text" if isinstance(found, str) else "value": found}
                fh.write(json.dumps(line, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def close(self, remove: bool) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):  # what a full disk kept buffered is lost, not raised again
                self._fh.close()
            self._fh = None
        if remove:
            self.path.unlink(missing_ok=True)


def check_same_request(before: dict[str, Any], request: dict[str, Any], what: str, **where: Any) -> None:
    """A usage error naming the first setting (in name order) in which ``before`` differs from
    ``request``; ``where`` (file, record, field) locates the earlier one."""
    for name in sorted(set(request) | set(before)):
        if before.get(name) != request.get(name):
            raise UsageError(
                f"{what} was made with {name}={before.get(name)!r}, this run asks for {request.get(name)!r}",
                hint="remove it, or drop --resume to evaluate again",
                **where,
            )


def _read(path: Path, request: dict[str, Any]) -> dict[str, Any]:
    entries: dict[str, Any] = {}
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    hint = "remove it, or drop --resume to evaluate again"
    try:
        first = json.loads(lines[0])
    except ValueError:
        raise UsageError(
            "the journal of the interrupted run has no readable request line",
            file=str(path),
            record="line 1",
            hint=hint,
        ) from None
    before = first.get("request") if isinstance(first, dict) else None
    if not isinstance(before, dict):
        raise UsageError(
            "the journal of the interrupted run records no request", file=str(path), record="line 1", hint=hint
        )
    check_same_request(before, request, "the interrupted run", file=str(path), record="line 1")
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            if "text" in item:
                entries[item["key"]] = {"text": item["text"], "meta": item["meta"]} if "meta" in item else item["text"]
            else:
                entries[item["key"]] = item["value"]
        except (ValueError, KeyError, TypeError):
            if number == len(lines):
                break  # a last line without its newline, cut short by the interruption: generated again
            raise UsageError("not a journal entry", file=str(path), record=f"line {number}", hint=hint) from None
    return entries


def pending(book: Journal | None, keys: Sequence[str], n: int) -> tuple[list[int], dict[int, Any]]:
    """Which of ``n`` inputs still need computing, and what ``book`` already holds for the others
    (by input index). Without a journal, all of them need computing."""
    if book is None:
        return list(range(n)), {}
    todo: list[int] = []
    kept: dict[int, Any] = {}
    for i, k in enumerate(keys):
        found = book.get(k)
        if found is None:
            todo.append(i)
        else:
            kept[i] = found
    return todo, kept


def active() -> Journal | None:
    """The journal of the task running now, if any (``generate`` consults it)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def recording(journal: Journal | None) -> Iterator[Journal | None]:
    """Make ``journal`` the active one while a task runs. It is kept when the task fails (for a
    later ``--resume``); the caller removes it once the result is safely written."""
    if journal is None:
        yield None
        return
    token = _ACTIVE.set(journal)
    try:
        yield journal
    finally:
        _ACTIVE.reset(token)
        journal.close(remove=False)
