"""``bridge score``: tokenise the data and score every example with the warmup checkpoint.

This module orchestrates: the checks before anything loads, stdin copied to a file, the model and the
scorer (built through its plugin's factory and held to :class:`bridgecli.hookspecs.Scorer`), the
stream's header, and where the stream goes. Examples are scored in windows of ``window`` examples,
one zstd frame per window, by the pipelined loop of :mod:`.score_loop` (on a GPU the data is read and
tokenised by a child process once it has loaded the tokenizer: :mod:`bridgecli.data.prefetch`). On a
GPU's first run the fast tail's kernels compile in a thread while the model loads
(:mod:`bridgecli.modeling.kernel_warmup`), for a scorer whose factory declares ``warm_kernels``.
Under ``torchrun`` (one node or several) each rank reads and scores the records whose index is
congruent to its rank, writes a shard next to the output, and rank 0 merges the shards into the
output (:mod:`.score_torchrun`). With an output file, progress is committed after every window, so
``--resume`` continues a killed run and produces the same bytes as an uninterrupted one. Scores
holding a NaN, an infinity or a number the format does not allow stop the run with one line naming the
data's record (:func:`.score_loop.check_batch`); the windows committed before stay resumable.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any, Iterator

import msgspec
import torch

from .. import PRODUCER
from ..artifacts.warmup_run import WarmupRun
from ..contracts import as_scorer_factory, build_scorer
from ..data import prefetch
from ..data.examples import DataOptions, Report, file_digest, iter_examples, with_model_limit
from ..data.sources import read_records, require_records
from ..errors import BridgeError, EmptyResultError, UsageError
from ..format.records import Example, Header, ModelInfo
from ..format.writer import StreamWriter
from ..hookspecs import Scorer, ScorerFactory
from ..io import (
    check_input,
    check_output_file,
    is_stdio,
    open_binary_output,
    refuse_terminal,
    reporting_write_errors,
)
from ..modeling import kernel_warmup
from ..modeling.loading import cache_root, fingerprint, resolve, resolve_device
from ..modeling.scoring import ScoringCheckpoint, load_scoring_checkpoint
from ..progress import note
from ..registry import Entry, get
from ..runtime import ranks
from ..runtime.ranks import Dist
from ..runtime.resumable import ResumableOutput
from ..runtime.precision import use_tf32
from ..timings import mark
from . import score_torchrun as torchrun
from .common import now, step_record
from .options import ScoreOptions
from .score_loop import run_windows, score_window, windows

__all__ = ["ScoreOptions", "check_score_options", "compile_caches", "run_score", "score_window", "windows"]

#: padded tokens of one pass when neither --max-tokens nor the scorer says: on a GPU, elsewhere
MAX_TOKENS_CUDA = 32768
MAX_TOKENS_CPU = 4096


def _count(path: str, opts: DataOptions) -> int:
    n = sum(1 for _ in read_records(path, opts.split))
    return min(n, opts.limit) if opts.limit is not None else n


def compile_caches() -> None:
    """Keep torch.compile's on-disk caches (compiled graphs, their Triton kernels) under bridgecli's
    cache folder, unless ``TORCHINDUCTOR_CACHE_DIR`` is set: they then survive what clears the
    temporary folder, so only the first run on a machine compiles. (Triton's own cache, which also
    holds the attention kernel's autotuning, is ``~/.triton/cache`` or ``TRITON_CACHE_DIR``.)"""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))


def _load(opts: ScoreOptions, run: WarmupRun, device: str) -> tuple[ScoringCheckpoint, str]:
    dtype = opts.dtype if opts.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")
    if device.startswith("cuda"):
        compile_caches()
        use_tf32(device, opts.tf32)
    return load_scoring_checkpoint(run, dtype, device), dtype


def _start_kernel_warmup(
    opts: ScoreOptions, run: WarmupRun, device: str, factory: ScorerFactory
) -> kernel_warmup.Warmup | None:
    """Compile the scorer's GPU kernels in a thread while the model loads (kernel_warmup.py), when its
    factory declares ``warm_kernels``."""
    if not device.startswith("cuda") or not factory.warm_kernels or opts.dtype not in ("auto", "bfloat16", "float16"):
        return None
    config = kernel_warmup.read_config(run.checkpoint)
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

    torchrun.check_stdin(Dist.from_env())
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
    check_output_file(opts.out, inputs=(opts.data,))
    refuse_terminal(opts.out)
    check_input(opts.data)  # missing or empty data, missing warmup run: one line before any model loads
    require_records(opts.data, opts.data_opts.split, allow_empty=opts.allow_empty)
    run = WarmupRun.open(opts.run)
    dist = Dist.from_env()
    torchrun.check_options(dist, opts.out)
    if opts.resume and is_stdio(opts.out):
        raise UsageError("--resume needs an output file (-o FILE)")
    started = now()
    with torchrun.session(dist, resolve_device(opts.device), opts.out) as device:
        return _score(opts, run, dist, device, started)


def _score(opts: ScoreOptions, run: WarmupRun, dist: Dist, device: str, started: str) -> int:
    # the tokenising process (opt-in, see data/prefetch.py) starts first: its interpreter and
    # tokenizer load while the model does
    tokproc = None
    if prefetch.wanted(device):
        tokproc = prefetch.TokenizeProcess(str(run.checkpoint))
        mark("tokenising process started")
    try:
        return _score_with(opts, run, dist, device, started, tokproc)
    finally:
        if tokproc is not None:
            tokproc.close()


def _build(opts: ScoreOptions, entry: Entry, ck: ScoringCheckpoint, device: str) -> Scorer:
    ctx = ck.context(opts.attention_layers, device, {"scorer_options": dict(opts.scorer_options)})
    return build_scorer(entry.obj, ctx, f"--scorer {opts.scorer}", entry.plugin)


def _score_with(
    opts: ScoreOptions,
    run: WarmupRun,
    dist: Dist,
    device: str,
    started: str,
    tokproc: prefetch.TokenizeProcess | None,
) -> int:
    entry = get("scorer", opts.scorer)
    if dist.rank == 0:
        note(f"scoring on {device}" + (f" with {dist.world} ranks" if dist.world > 1 else ""))
    mark("start of scoring")
    warmup = _start_kernel_warmup(opts, run, device, as_scorer_factory(entry.obj))
    ck, dtype = _load(opts, run, device)
    mark("model loaded")
    scorer = _build(opts, entry, ck, device)
    if warmup is not None:
        warmup.join()  # the kernels it compiles are then in Triton's cache; none compiles twice at once
        mark(f"kernel warm-up joined (took {warmup.seconds:.2f} s)")
    mark("scorer ready")
    if scorer.startup_note and dist.rank == 0:  # e.g. a scorer that compiles before its first batch
        note(scorer.startup_note)
    if opts.max_tokens:
        max_tokens = opts.max_tokens
    elif not device.startswith("cuda"):
        max_tokens = MAX_TOKENS_CPU
    else:  # a scorer may size its own passes (atp: what its reverse pass fits in the free GPU memory)
        max_tokens = scorer.max_tokens_cuda or MAX_TOKENS_CUDA

    data_opts = with_model_limit(opts.data_opts, ck.model)  # --max-length defaults to the model's limit
    digest = file_digest(opts.data)
    leave_out = ck.meta.leave_out(opts.data, digest)
    if leave_out is not None:
        data_opts = dataclasses.replace(data_opts, exclude_ids=leave_out)
    params = _params(opts, ck, dtype, device, data_opts, digest, max_tokens)
    if dist.world > 1:
        params["shard"] = [dist.rank, dist.world]
    header = _header(opts, ck, data_opts, params, started)
    report = Report()
    total = (_count(opts.data, opts.data_opts) + dist.world - 1 - dist.rank) // dist.world
    if dist.world > 1:  # each rank reads and tokenises only its own records (index % world == rank)
        data_opts = dataclasses.replace(data_opts, shard=(dist.rank, dist.world))
    if tokproc is not None:  # tokenised here until the child process is ready, then by the child
        examples = prefetch.handover(opts.data, ck.tokenizer, data_opts, report, tokproc)
    else:
        examples = iter_examples(opts.data, ck.tokenizer, data_opts, report)
    done = _write(opts, dist, scorer, examples, header, max_tokens, total)
    report, total = torchrun.finish(dist, opts.out, report, done, frame=opts.window)
    _conclude(opts, dist, report, total, done)
    return done


def _params(
    opts: ScoreOptions,
    ck: ScoringCheckpoint,
    dtype: str,
    device: str,
    data_opts: DataOptions,
    digest: str,
    max_tokens: int,
) -> dict[str, Any]:
    """The ``score`` step's parameters, recorded in the stream's header."""
    direction = ck.direction
    return {
        "scorer": opts.scorer,
        "scorer_options": dict(opts.scorer_options),
        "from": str(ck.run.root),
        "checkpoint_fingerprint": fingerprint(resolve(str(ck.run.checkpoint))),
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


def _header(
    opts: ScoreOptions, ck: ScoringCheckpoint, data_opts: DataOptions, params: dict[str, Any], started: str
) -> Header:
    meta = ck.meta
    return Header(
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


def _write(
    opts: ScoreOptions,
    dist: Dist,
    scorer: Scorer,
    examples: Iterator[Example],
    header: Header,
    max_tokens: int,
    total: int,
) -> int:
    """Score ``examples`` into the output (stdout, a file, or this rank's shard; resumable with a file)."""
    loop = functools.partial(
        run_windows,
        window=opts.window,
        batch_size=opts.batch_size,
        max_tokens=max_tokens,
        total=total,
        rank=dist.rank if dist.world > 1 else None,
        source=str(opts.data),
        hint=f"scorer '{opts.scorer}' with the checkpoint of {opts.run}: did its warmup diverge?",
    )
    out = opts.out
    if out is None or is_stdio(out):
        with open_binary_output(out) as fh:
            writer = StreamWriter(fh, header, records_per_frame=None)
            done = loop(scorer, examples, writer, skip=0, commit=lambda w, pos: w.flush())
            writer.close()
        return done
    finished = ranks.finished_shard(dist, out, opts.resume, header)
    if finished is not None:  # --resume: this rank had written its whole shard before another rank stopped
        note(f"rank {dist.rank}: its shard was finished ({finished} examples)")
        return finished
    target = torchrun.target(dist, out)
    output = ResumableOutput(target)
    if not opts.resume and output.leftover():
        note(f"replacing {output.partial.name} left by an interrupted run (pass --resume to continue it)")
    with reporting_write_errors(target):  # a full disk: one line naming the output
        writer, skip = output.open(header, opts.resume)
        if skip:
            note(f"resuming after {skip} examples ({writer.count} written)")
        try:
            done = loop(scorer, examples, writer, skip=skip, commit=output.commit)
            output.finish(writer)
        except BaseException:
            kept = output.abandon()
            if kept:
                note(kept)
            raise
    return done


def _conclude(opts: ScoreOptions, dist: Dist, report: Report, total: int, done: int) -> None:
    """The run's report; an empty result is an error (its output removed) unless ``--allow-empty``."""
    for line in report.lines():
        if dist.rank == 0:
            note(line)
    if total == 0 and not opts.allow_empty:
        if opts.out is not None and not is_stdio(opts.out) and dist.rank == 0:
            Path(opts.out).unlink(missing_ok=True)
        why = "; ".join(report.lines()) or "no example in the data"
        raise EmptyResultError(
            f"scored 0 examples ({why})", file=str(opts.data), hint="pass --allow-empty to accept an empty result"
        )
    note(f"scored {done} examples" + (f" on rank {dist.rank}" if dist.world > 1 else ""))
