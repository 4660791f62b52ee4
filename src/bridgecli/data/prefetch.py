"""Read and tokenise a data file in a child process, off the scoring loop's main thread.

Tokenising (chat template, fast tokenizer, offsets) holds the GIL for most of its ~0.85 ms an
example, so a thread would take that time from the loop that feeds the GPU; a child process does
not. :func:`prefetch_examples` starts one (a fresh interpreter, ``python -m
bridgecli.data.prefetch``: the parent may hold a CUDA context, which a forked child must not
inherit, and multiprocessing's ``spawn`` would re-run the caller's main script), which loads the
tokenizer itself from the same source, runs :func:`~bridgecli.data.examples.iter_examples` and
writes the examples back in order, in msgpack chunks on its stdout; a thread of the parent reads
them into a bounded queue (memory stays flat). At the end the child sends the :class:`Report`,
which the parent copies into its own, so the run's report lines are the same; an error in the child
(a bad record, a tokenizer that does not load) is raised in the parent with its type and message,
after the examples read before it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import queue as queue_mod
import struct
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import BinaryIO, Iterator

import msgspec

from ..format.records import Example
from ..optionspec import switch
from ..timings import ORIGIN, mark
from .examples import DataOptions, Report, example_of, iter_examples, iter_pairs

#: examples a chunk, and chunks the parent holds before its reader waits
CHUNK = 32
DEPTH = 16
ENV = "BRIDGE_TOKENIZE_PROCESS"
_FRAME = struct.Struct("<cI")  # kind (b"T" tokenizer loaded, b"E" examples, b"R" report, b"X" error), length


def wanted(device: str) -> bool:
    """Whether ``bridge score`` tokenises in a child process: ``BRIDGE_TOKENIZE_PROCESS=1`` always,
    ``auto`` (the default) on CUDA, where the main thread's time is what the GPU waits for, ``0``
    never. On CPU the model's arithmetic dwarfs tokenising. Measured on an H200 (docs/benchmarks.md):
    with :func:`handover` the loop never waits for the child's start, and after it runs at 92-95K
    tokens/s instead of 79-81K (1B shape, GSM8K)."""
    value = os.environ.get(ENV, "auto")
    if value.strip().lower() == "auto":
        return device.startswith("cuda")
    return switch(value) is True


def _send(fh: BinaryIO, kind: bytes, payload: bytes) -> None:
    fh.write(_FRAME.pack(kind, len(payload)))
    fh.write(payload)


def _child_main() -> None:
    """The child: read the tokenizer source pickled on stdin and load it, then ``(path, opts)``;
    write frames on stdout."""
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # anything printed by a library goes to stderr, not into the frames
    tokenizer_source = pickle.load(sys.stdin.buffer)
    encoder = msgspec.msgpack.Encoder()
    chunk: list[Example] = []
    report = Report()
    try:
        from ..modeling.loading import load_tokenizer, tokenizer_loads_without_torch

        mark("tokenising process: imports done")
        torchless = "torch" not in sys.modules and tokenizer_loads_without_torch(tokenizer_source)
        if torchless:
            _without_torch()
        import transformers  # noqa: F401  (timed apart from the tokenizer's own load)

        mark("tokenising process: transformers imported" + (" (without torch)" if torchless else ""))
        tokenizer = load_tokenizer(tokenizer_source)
        mark("tokenising process: tokenizer loaded")
        _send(out, b"T", b"")  # ready: the parent may hand over to it now
        out.flush()
        try:
            path, opts = pickle.load(sys.stdin.buffer)
        except EOFError:
            return  # closed before any data was asked for
        mark("tokenising process: data file received")
        sent = 0
        for ex in iter_examples(path, tokenizer, opts, report):
            chunk.append(ex)
            if len(chunk) >= CHUNK:
                _send(out, b"E", encoder.encode(chunk))
                chunk = []
                out.flush()
                sent += 1
                if sent in (1, 8):
                    mark(f"tokenising process: {sent * CHUNK} examples sent")
        if chunk:
            _send(out, b"E", encoder.encode(chunk))
        _send(out, b"R", pickle.dumps(dataclasses.asdict(report)))
    except BrokenPipeError:
        return  # the parent stopped reading
    except Exception as exc:  # every error goes to the parent, after the examples before it
        if chunk:
            _send(out, b"E", encoder.encode(chunk))
        _send(out, b"X", _portable(exc))
    out.flush()


def _without_torch() -> None:
    """Make transformers see no torch in this process: a fast tokenizer needs none, and importing
    torch (its CUDA libraries included) took most of the child's start on a GPU host busy loading
    the model. ``importlib.util.find_spec`` reports a module whose ``sys.modules`` entry is None as
    absent, and importing it raises ImportError."""
    sys.modules["torch"] = None  # type: ignore[assignment]
    os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"  # "PyTorch was not found ..." on import


def _portable(exc: BaseException) -> bytes:
    """``exc`` pickled as (class, args, attributes), or a RuntimeError's when those do not pickle."""
    try:
        data = pickle.dumps((type(exc), exc.args, dict(vars(exc))))
        pickle.loads(data)
        return data
    except Exception:
        return pickle.dumps((RuntimeError, (f"{type(exc).__name__}: {exc}",), {}))


def _rebuild(data: bytes) -> BaseException:
    cls, args, attrs = pickle.loads(data)
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(attrs)
    return exc


class TokenizeProcess:
    """A child process that loads the tokenizer from ``tokenizer_source`` as soon as it starts
    (so that overlaps the caller's own loading), then tokenises one data file for
    :meth:`examples`. :meth:`close` (or garbage collection) stops it."""

    def __init__(self, tokenizer_source: str):
        package_root = str(Path(__file__).resolve().parents[2])  # the child imports this bridgecli
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        env["BRIDGE_TIMINGS_ORIGIN"] = repr(ORIGIN)  # its BRIDGE_TIMINGS marks on our time axis
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bridgecli.data.prefetch"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(pickle.dumps(tokenizer_source))
        self.proc.stdin.flush()
        #: set once the child has loaded its tokenizer (see :func:`handover`)
        self.ready = threading.Event()
        self._frames: queue_mod.Queue = queue_mod.Queue(maxsize=DEPTH)
        self._stop = threading.Event()
        assert self.proc.stdout is not None
        self._reader = threading.Thread(
            target=_read,
            args=(self.proc.stdout, self._frames, self._stop, self.ready),
            name="bridge-tokenise-reader",
            daemon=True,
        )
        self._reader.start()
        self._finalizer = weakref.finalize(self, _stop, self.proc, self._stop)
        self.used = False

    def examples(self, path: str | Path, opts: DataOptions, report: Report | None = None) -> Iterator[Example]:
        """The examples :func:`iter_examples` yields for ``path``, in the same order; ``report`` is
        filled in when the stream ends, as ``iter_examples`` would have filled it. Once only."""
        assert not self.used, "a TokenizeProcess reads one data file"
        self.used = True
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        with contextlib.suppress(BrokenPipeError):  # the child failed already: its error frame follows
            proc.stdin.write(pickle.dumps((str(path), opts)))
            proc.stdin.close()
        return self._consume(report)

    def _consume(self, report):
        decoder = msgspec.msgpack.Decoder(list[Example])
        try:
            while True:
                item = self._frames.get()
                if item is None:
                    code = self.proc.wait()
                    raise RuntimeError(f"the tokenising process ended without finishing (exit code {code})")
                kind, payload = item
                if kind == b"E":
                    yield from decoder.decode(payload)
                elif kind == b"R":
                    if report is not None:
                        for key, value in pickle.loads(payload).items():
                            setattr(report, key, value)
                    return
                else:
                    raise _rebuild(payload)
        finally:
            self.close()
            self._reader.join(timeout=5)

    def close(self) -> None:
        self._finalizer()


def _stop(proc: subprocess.Popen, reading: threading.Event) -> None:
    reading.set()
    if proc.poll() is None:
        proc.kill()  # stopped early (or an error): the child's work is not wanted
    proc.wait()
    for fh in (proc.stdin, proc.stdout):
        if fh is not None:
            with contextlib.suppress(OSError):
                fh.close()


def handover(
    path: str | Path, tokenizer, opts: DataOptions, report: Report, proc: TokenizeProcess, first: int = 0
) -> Iterator[Example]:
    """:func:`iter_examples` for ``path``, tokenised here until ``proc`` has loaded its tokenizer
    (and at least the records before index ``first``), then by ``proc`` from the next record on. The
    loop never waits for the child's start (which can take longer than the model's load on a busy
    GPU host), and once the child runs, tokenising leaves the loop's thread. ``report`` ends up as
    one ``iter_examples`` call would have left it; a child that never gets ready is never used."""
    for index, where, pair in iter_pairs(path, opts):
        if index >= first and proc.ready.is_set():
            mark(f"tokenising handed over at record {index}")
            tail_report = Report()
            yield from proc.examples(path, dataclasses.replace(opts, start=index), tail_report)
            report.add(tail_report)
            return
        ex = example_of(path, index, where, pair, tokenizer, opts, report)
        if ex is not None:
            yield ex


def prefetch_examples(
    path: str | Path, tokenizer_source: str, opts: DataOptions, report: Report | None = None
) -> Iterator[Example]:
    """:func:`iter_examples` for ``path`` with the tokenizer loaded from ``tokenizer_source``, read
    and tokenised in a child process started now (see :class:`TokenizeProcess`)."""
    return TokenizeProcess(tokenizer_source).examples(path, opts, report)


def _read(fh: BinaryIO, frames: queue_mod.Queue, stop: threading.Event, ready: threading.Event) -> None:
    """Move the child's frames into ``frames`` (blocking when it is full); ``None`` at the end. The
    ready frame sets ``ready`` instead."""

    def put(item) -> bool:
        while not stop.is_set():
            try:
                frames.put(item, timeout=0.2)
                return True
            except queue_mod.Full:
                continue
        return False

    while True:
        head = fh.read(_FRAME.size)
        if len(head) < _FRAME.size:
            put(None)
            return
        kind, size = _FRAME.unpack(head)
        payload = fh.read(size)
        if len(payload) < size:
            put(None)
            return
        if kind == b"T":
            ready.set()
        elif not put((kind, payload)):
            return


if __name__ == "__main__":
    _child_main()
