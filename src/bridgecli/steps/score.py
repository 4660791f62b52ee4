"""``bridge score``: tokenise the data and score every example with the warmup checkpoint.

Examples are scored in windows of ``window`` examples: inside a window they are bucketed by length
under a padded-token budget (``max_tokens``, at most ``batch_size`` rows), and written back in input
order, one zstd frame per window. The loop keeps the GPU busy: it queues a batch's device work
before it collects the batch before, reads and tokenises the next window between batches (on a GPU,
once a child process has loaded the tokenizer, that child does it: :mod:`..data.prefetch`;
tokenising holds the GIL), and hands finished windows to a writer thread (same bytes as scoring and
writing one batch after another). On a GPU's first run the fast tail's kernels compile in a thread
while the model loads (:mod:`..modeling.kernel_warmup`).
Under ``torchrun`` (one node or several) each rank reads and scores the records whose index is
congruent to its rank, writes a shard next to the output, and rank 0 merges the shards into the
output (see :mod:`bridgecli.runtime.ranks`). With an output file, progress is committed after every window, so
``--resume`` continues a killed run and produces the same bytes as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import threading
import time
from collections import deque
from itertools import islice
from pathlib import Path
from typing import Iterator

import msgspec
import torch

from .. import PRODUCER
from ..artifacts.warmup_run import WarmupRun
from ..core.buckets import bucket
from ..data.examples import DataOptions, Report, file_digest, iter_examples, with_model_limit
from ..data import prefetch
from ..data.sources import read_records, require_records
from ..errors import BridgeError, EmptyResultError, UsageError
from ..format.records import Example, Header, ModelInfo
from ..format.writer import StreamWriter
from ..io import (
    check_input,
    check_output_file,
    is_stdio,
    open_binary_output,
    refuse_terminal,
    reporting_write_errors,
)
from ..timings import mark
from ..modeling import kernel_warmup
from ..modeling.loading import cache_root, claim_device, fingerprint, resolve, resolve_device
from ..modeling.scoring import DoneScores, ScoringContext, load_scoring_checkpoint
from ..progress import note, progress_bar
from ..registry import get
from ..runtime import ranks
from ..runtime.ranks import Dist
from ..runtime.resumable import ResumableOutput
from .common import now, step_record
from .options import ScoreOptions


def _count(path: str, opts: DataOptions) -> int:
    n = sum(1 for _ in read_records(path, opts.split))
    return min(n, opts.limit) if opts.limit is not None else n


def windows(examples: Iterator[Example], size: int) -> Iterator[list[Example]]:
    """Examples ``size`` at a time."""
    while True:
        chunk = list(islice(examples, size))
        if not chunk:
            return
        yield chunk


def score_window(scorer, window: list[Example], max_tokens: int, max_rows: int, on_batch=None) -> list[Example]:
    """Score a window in length buckets, one batch after another; return its examples, in input
    order, with scores (the serial form of the loop in :func:`_run_windows`). ``on_batch(n)`` is
    called after every scoring pass of ``n`` examples (progress)."""
    scored: dict[int, Example] = {}
    for group in bucket([len(ex.tokens.input_ids) for ex in window], max_tokens, max_rows):
        batch = [window[i] for i in group]
        for i, sc in zip(group, scorer.score(batch)):
            scored[i] = msgspec.structs.replace(window[i], scores=sc)
        if on_batch is not None:
            on_batch(len(group))
    return [scored[i] for i in range(len(window))]


def compile_caches() -> None:
    """Keep torch.compile's on-disk caches (compiled graphs, their Triton kernels) under bridgecli's
    cache folder, unless ``TORCHINDUCTOR_CACHE_DIR`` is set: they then survive what clears the
    temporary folder, so only the first run on a machine compiles. (Triton's own cache, which also
    holds the attention kernel's autotuning, is ``~/.triton/cache`` or ``TRITON_CACHE_DIR``.)"""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))


def _load(opts: ScoreOptions, device: str):
    run = WarmupRun.open(opts.run)
    dtype = opts.dtype if opts.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")
    if device.startswith("cuda"):
        compile_caches()
        torch.backends.cuda.matmul.allow_tf32 = opts.tf32
        torch.backends.cudnn.allow_tf32 = opts.tf32
    return load_scoring_checkpoint(run, dtype, device), dtype


def _start_kernel_warmup(opts: ScoreOptions, device: str) -> kernel_warmup.Warmup | None:
    """Compile the bridge scorer's GPU kernels in a thread while the model loads (kernel_warmup.py)."""
    if not device.startswith("cuda") or opts.scorer != "bridge" or opts.dtype not in ("auto", "bfloat16", "float16"):
        return None
    config = kernel_warmup.read_config(WarmupRun.open(opts.run).checkpoint)
    if config is None or not kernel_warmup.wanted(device, config):
        return None
    dtype = torch.float16 if opts.dtype == "float16" else torch.bfloat16
    done = kernel_warmup.marker(cache_root(), config, device, dtype)
    if done.exists() and os.environ.get("BRIDGE_KERNEL_WARMUP") != "always":
        return None  # warmed on an earlier run of this machine
    return kernel_warmup.start(config, device, dtype, done)


def _score_stdin(opts: ScoreOptions) -> int:
    """Data on stdin (``bridge score - ...``): it is read twice (counted for the progress bar, digested
    to recognise the data later) and then scored, so it is first copied to a temporary JSONL file
    (errors name it ``<stdin>``)."""
    import shutil
    import sys
    import tempfile

    if Dist.from_env().world > 1:
        raise UsageError("several ranks need the data in a file: pass its path instead of -")
    with tempfile.TemporaryDirectory(prefix="bridge-score-") as tmp:
        path = Path(tmp) / "stdin.jsonl"
        with reporting_write_errors(path), open(path, "wb") as fh:  # a full /tmp: one line naming the copy
            shutil.copyfileobj(sys.stdin.buffer, fh)
        try:
            return run_score(dataclasses.replace(opts, data=str(path), source="<stdin>"))
        except BridgeError as err:  # a bad record: name the data as the user gave it
            if err.file == str(path):
                err.file = "<stdin>"
                err.args = (err.render(),)
            raise


def check_score_options(opts: ScoreOptions) -> None:
    """Every parameter in its range (see :mod:`bridgecli.runtime.params`), before anything is read."""
    from ..runtime import params

    params.check(opts)
    params.check_data_options(opts.data_opts)
    params.check_device(opts.device)


def run_score(opts: ScoreOptions) -> int:
    if is_stdio(opts.data):
        return _score_stdin(opts)
    check_score_options(opts)
    check_output_file(opts.out)
    refuse_terminal(opts.out)
    check_input(opts.data)  # missing or empty data, missing warmup run: one line before any model loads
    if not is_stdio(opts.data):
        require_records(opts.data, opts.data_opts.split, allow_empty=opts.allow_empty)
    WarmupRun.open(opts.run)
    dist = Dist.from_env()
    if dist.world > 1 and is_stdio(opts.out):
        raise UsageError("several ranks need an output file: pass -o FILE")
    if opts.resume and is_stdio(opts.out):
        raise UsageError("--resume needs an output file (-o FILE)")
    started = now()
    device = resolve_device(opts.device)
    if dist.world > 1:
        if device.startswith("cuda"):
            device = f"cuda:{dist.local_rank}"  # the GPU on this node; the shard goes by the global rank
            torch.cuda.set_device(dist.local_rank)
        ranks.init(dist)
    else:
        claim_device(device)
    try:
        if dist.world > 1:
            assert opts.out is not None  # stdout is refused above with several ranks
            ranks.check_shared_folder(dist, opts.out)  # before any model loads
        return _score(opts, dist, device, started)
    finally:
        if dist.world > 1:
            ranks.close()


def _score(opts: ScoreOptions, dist: Dist, device: str, started: str) -> int:
    # the tokenising process (opt-in, see data/prefetch.py) starts first: its interpreter and
    # tokenizer load while the model does
    tokproc = None
    if prefetch.wanted(device) and not is_stdio(opts.data):
        tokproc = prefetch.TokenizeProcess(str(WarmupRun.open(opts.run).checkpoint))
        mark("tokenising process started")
    try:
        return _score_with(opts, dist, device, started, tokproc)
    finally:
        if tokproc is not None:
            tokproc.close()


def _score_with(
    opts: ScoreOptions, dist: Dist, device: str, started: str, tokproc: prefetch.TokenizeProcess | None
) -> int:
    scorer_entry = get("scorer", opts.scorer)
    if dist.rank == 0:
        note(f"scoring on {device}" + (f" with {dist.world} ranks" if dist.world > 1 else ""))
    mark("start of scoring")
    warmup = _start_kernel_warmup(opts, device)
    ck, dtype = _load(opts, device)
    mark("model loaded")
    run, meta, tokenizer, model, direction = ck.run, ck.meta, ck.tokenizer, ck.model, ck.direction
    ctx = ScoringContext(
        model=model,
        tokenizer=tokenizer,
        direction=direction.v,
        attention_layers=opts.attention_layers,
        device=device,
        options={"scorer_options": dict(opts.scorer_options)},
    )
    try:
        scorer = scorer_entry.obj(ctx)
    except ValueError as exc:
        raise UsageError(f"--scorer {opts.scorer}: {exc}") from None
    if warmup is not None:
        warmup.join()  # the kernels it compiles are then in Triton's cache; none compiles twice at once
        mark(f"kernel warm-up joined (took {warmup.seconds:.2f} s)")
    mark("scorer ready")
    startup = getattr(scorer, "startup_note", None)  # e.g. a scorer that compiles before its first batch
    if startup and dist.rank == 0:
        note(startup)
    # a scorer may size its own passes (atp: what its reverse pass fits in the free GPU memory)
    default_max_tokens: int = getattr(scorer, "max_tokens_cuda", 32768) if device.startswith("cuda") else 4096
    max_tokens = opts.max_tokens or default_max_tokens

    data_opts = with_model_limit(opts.data_opts, model)  # --max-length defaults to the model's limit
    digest = file_digest(opts.data)
    leave_out = meta.leave_out(opts.data, digest)
    if leave_out is not None:
        data_opts = dataclasses.replace(data_opts, exclude_ids=leave_out)
    params = {
        "scorer": opts.scorer,
        "scorer_options": dict(opts.scorer_options),
        "from": str(run.root),
        "checkpoint_fingerprint": fingerprint(resolve(str(run.checkpoint))),
        "direction_layers": direction.meta.layers,
        "lambda": direction.meta.lam,
        "attention_layers": opts.attention_layers,
        "dtype": dtype,
        "tf32": opts.tf32 if device.startswith("cuda") and dtype == "float32" else False,
        "device": device.split(":")[0],
        "max_tokens": max_tokens,
        "batch_size": opts.batch_size,
        "window": opts.window,
        "data": opts.source or str(opts.data),
        "data_digest": digest,
        "chat_template": data_opts.chat_template,
        "max_length": data_opts.max_length,
        "limit": data_opts.limit,
        "prompt_field": data_opts.prompt_field,
        "response_field": data_opts.response_field,
        "excluded_warmup_ids": len(data_opts.exclude_ids),
    }
    if dist.world > 1:
        params["shard"] = [dist.rank, dist.world]
    header = Header(
        stage="scores",
        producer=PRODUCER,
        created=started,
        model=ModelInfo(
            source=meta.base_model,
            fingerprint=meta.base_fingerprint or fingerprint(resolve(meta.base_model)),
            tokenizer_fingerprint=ck.tokenizer_fingerprint,
            chat_template=data_opts.chat_template,
        ),
        steps=[msgspec.structs.replace(step_record("score", params), time=started)],
        source=opts.source or str(opts.data),
    )
    report = Report()
    total = (_count(opts.data, opts.data_opts) + dist.world - 1 - dist.rank) // dist.world
    if dist.world > 1:  # each rank reads and tokenises only its own records (index % world == rank)
        data_opts = dataclasses.replace(data_opts, shard=(dist.rank, dist.world))
    if tokproc is not None:  # tokenised here until the child process is ready, then by the child
        examples = prefetch.handover(opts.data, tokenizer, data_opts, report, tokproc)
    else:
        examples = iter_examples(opts.data, tokenizer, data_opts, report)

    out = opts.out
    if out is None or is_stdio(out):
        with open_binary_output(out) as fh:
            writer = StreamWriter(fh, header, records_per_frame=None)
            done = _run_windows(
                scorer, examples, dist, opts, max_tokens, writer, total, skip=0, commit=lambda w, pos: w.flush()
            )
            writer.close()
    elif (finished := ranks.finished_shard(dist, out, opts.resume, header)) is not None:
        done = finished  # --resume: this rank had written its whole shard before another rank stopped
        note(f"rank {dist.rank}: its shard was finished ({done} examples)")
    else:
        target = dist.shard_path(out) if dist.world > 1 else Path(out)
        output = ResumableOutput(target)
        if not opts.resume and output.leftover():
            note(f"replacing {output.partial.name} left by an interrupted run (pass --resume to continue it)")
        with reporting_write_errors(target):  # a full disk: one line naming the output
            writer, skip = output.open(header, opts.resume)
            if skip:
                note(f"resuming after {skip} examples ({writer.count} written)")
            try:
                done = _run_windows(
                    scorer, examples, dist, opts, max_tokens, writer, total, skip=skip, commit=output.commit
                )
                output.finish(writer)
            except BaseException:
                kept = output.abandon()
                if kept:
                    note(kept)
                raise
    if dist.world > 1:  # wait for every shard; the run's report and count are the sum of the ranks'
        per_rank = ranks.gather((report, done))
        report = ranks.merge_reports([r for r, _ in per_rank])
        total = sum(n for _, n in per_rank)
        assert out is not None  # stdout is refused with several ranks (run_score)
        merged = ranks.merge_shards(dist, out, frame=opts.window)
        if dist.rank == 0:
            note(f"merged {dist.world} shards: {merged} examples")
    else:
        total = done
    for line in report.lines():
        if dist.rank == 0:
            note(line)
    if total == 0 and not opts.allow_empty:
        if out is not None and not is_stdio(out) and dist.rank == 0:
            Path(out).unlink(missing_ok=True)
        why = "; ".join(report.lines()) or "no example in the data"
        raise EmptyResultError(
            f"scored 0 examples ({why})", file=str(opts.data), hint="pass --allow-empty to accept an empty result"
        )
    note(f"scored {done} examples" + (f" on rank {dist.rank}" if dist.world > 1 else ""))
    return done


class _Ahead:
    """Examples read and tokenised ahead of the scoring loop, a few at a time: the loop asks for
    some between two batches, while the GPU computes, instead of a whole window at once while the
    GPU waits."""

    def __init__(self, examples: Iterator[Example], most: int):
        self.examples = examples
        self.most = most  # never hold more than this many
        self.buf: deque[Example] = deque()
        self.exhausted = False

    def fill(self, n: int) -> None:
        """Read up to ``n`` more examples (fewer at the end of the data or at ``most``)."""
        while n > 0 and not self.exhausted and len(self.buf) < self.most:
            ex = next(self.examples, None)
            if ex is None:
                self.exhausted = True
            else:
                self.buf.append(ex)
                n -= 1

    def take(self, n: int) -> list[Example]:
        self.fill(n - len(self.buf))
        return [self.buf.popleft() for _ in range(min(n, len(self.buf)))]


class _WriterThread:
    """Encodes, compresses, writes and commits scored examples in input order on a thread of its own
    (zstd releases the GIL), so the loop goes on queueing GPU work. The loop hands over each run of a
    window's examples as soon as every example before it is scored (:meth:`put`) and the window's end
    once it is complete (:meth:`commit`): a window's frame is compressed while its later batches are
    still computed, so little is left to write when the last batch is done (zstd's output does not
    depend on how its input is cut, so the bytes are those of writing the window at once). At most
    ``depth`` windows' worth of examples wait."""

    def __init__(self, writer: StreamWriter, commit, window: int, depth: int = 2):
        self.writer = writer
        self.commit_fn = commit
        self.most = max(1, depth * window)  # examples queued before put() waits
        self.queue: queue.Queue = queue.Queue()
        self.queued = 0
        self.room = threading.Condition()
        self.error: BaseException | None = None
        self.first: float | None = None  # when the first window was committed
        self.thread = threading.Thread(target=self._run, name="bridge-score-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            kind, value = item
            try:
                if self.error is None:
                    if kind == "examples":
                        for ex in value:
                            self.writer.write(ex)
                    else:
                        self.commit_fn(self.writer, value)
                        if self.first is None:
                            self.first = time.perf_counter()
            except BaseException as exc:  # re-raised on the main thread
                self.error = exc
            finally:  # drained either way: the main thread stops at its next call
                if kind == "examples":
                    with self.room:
                        self.queued -= len(value)
                        self.room.notify_all()

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def put(self, examples: list[Example]) -> None:
        """Write ``examples`` next (the stream's next records, in order)."""
        with self.room:
            while self.queued > 0 and self.queued + len(examples) > self.most:
                self._check()
                self.room.wait(timeout=0.1)
            self._check()
            self.queued += len(examples)
        self.queue.put(("examples", examples))

    def commit(self, position: int) -> None:
        """End the window written so far (a committed, resumable frame after ``position`` inputs)."""
        self._check()
        self.queue.put(("commit", position))

    def close(self) -> None:
        """Wait until everything queued is written; raise what the thread raised."""
        self.queue.put(None)
        self.thread.join()
        self._check()


class _Window:
    """A window in the loop: its examples, their scored copies so far, how many of them (in input
    order) went to the writer, and the input position after it."""

    def __init__(self, examples: list[Example], end: int):
        self.examples = examples
        self.scored: dict[int, Example] = {}
        self.sent = 0
        self.end = end

    def ready(self) -> list[Example]:
        """The scored examples that follow those already sent, in input order, up to the first gap."""
        start = self.sent
        while self.sent < len(self.examples) and self.sent in self.scored:
            self.sent += 1
        return [self.scored[i] for i in range(start, self.sent)]

    @property
    def complete(self) -> bool:
        return self.sent == len(self.examples)


def _run_windows(
    scorer,
    examples,
    dist: Dist,
    opts: ScoreOptions,
    max_tokens: int,
    writer: StreamWriter,
    total: int,
    skip: int,
    commit,
) -> int:
    """Score window after window and write each in input order. The GPU work of one batch is queued
    before the results of the one before are collected (``scorer.launch``), and between the two the
    host reads ahead into the next window; finished windows go to a writer thread."""
    position = 0
    tokens = 0
    first_tokens: int | None = None  # tokens in the first scored window
    launch = getattr(scorer, "launch", None) or (lambda batch: DoneScores(scorer.score(batch)))
    ahead = _Ahead(examples, most=opts.window)
    out = _WriterThread(writer, commit, opts.window)
    t0 = time.perf_counter()
    mark("scoring loop starts")
    # the batch whose device work is queued: (its window, its indices in the window, handle)
    pending: tuple | None = None

    first_batch_done = False

    def collect(bar, task) -> None:
        nonlocal tokens, first_tokens, first_batch_done
        assert pending is not None
        win, group, handle = pending
        results = handle.result()
        if not first_batch_done:
            first_batch_done = True
            mark("first batch done")
        for i, sc in zip(group, results):
            win.scored[i] = msgspec.structs.replace(win.examples[i], scores=sc)
        bar.update(task, advance=len(group))
        ready = win.ready()  # written as soon as every example before them is scored
        if ready:
            out.put(ready)
            tokens += sum(len(ex.tokens.input_ids) for ex in ready)
        if win.complete:
            if first_tokens is None:
                first_tokens = tokens
                mark("first window scored")
            out.commit(win.end)

    try:
        with progress_bar() as bar:
            task = bar.add_task("scoring", total=total, unit="ex")
            while window := ahead.take(opts.window):
                if position + len(window) <= skip:  # already committed by the interrupted run
                    position += len(window)
                    bar.update(task, completed=position, _start=position)  # the rate counts this run's work only
                    continue
                position += len(window)
                if pending is None and not first_batch_done:
                    mark("first window read and tokenised")
                win = _Window(window, position)
                groups = bucket([len(ex.tokens.input_ids) for ex in window], max_tokens, opts.batch_size)
                step = -(-opts.window // len(groups))  # read the next window over this window's batches
                for group in groups:
                    handle = launch([window[i] for i in group])
                    if pending is None and not first_batch_done:
                        mark("first batch queued")
                    if pending is not None:
                        collect(bar, task)
                    pending = (win, group, handle)
                    ahead.fill(step)
            if pending is not None:
                collect(bar, task)
                pending = None
            out.close()
            mark("last window written")
    finally:
        if out.thread.is_alive():  # an error in the loop: stop the writer after what it holds
            with contextlib.suppress(BaseException):
                out.close()
    elapsed = time.perf_counter() - t0
    if tokens:
        # the first window carries one-time work (kernel compilation and autotuning, allocator growth):
        # the rate after it is the steady one
        after = ""
        first = out.first
        if first is not None and first_tokens is not None and tokens > first_tokens and t0 + elapsed > first:
            steady = (tokens - first_tokens) / (t0 + elapsed - first)
            after = f"; {steady:,.0f} tokens/s after the first window, which took {first - t0:.1f} s"
        note(
            f"scoring took {elapsed:.1f} s for {tokens} tokens ({tokens / elapsed:,.0f} tokens/s"
            + (f", rank {dist.rank}" if dist.world > 1 else "")
            + after
            + ")"
        )
    return writer.count
