"""``bridge score``: tokenise the data and score every example with the warmup checkpoint.

This module orchestrates, each part handed over once: the options checked; the data scanned
(:class:`~bridgecli.data.source.DataSource`: one pass for its digest, its records and the check that it
holds some, stdin copied on the way; the examples are the second pass); the output prepared
(:class:`~bridgecli.runtime.stream_output.StreamOutput`: stdout, or a file committed window by window
that ``--resume`` continues, under ``torchrun`` this rank's shard, which rank 0 merges); the model and the
scorer (built through its plugin's factory and held to :class:`bridgecli.hookspecs.Scorer`); the stream's
header. Examples are scored in windows of ``window`` examples, one zstd frame per window, by the pipelined
loop of :mod:`bridgecli.modeling.score_loop` (on a GPU the data is read and tokenised by a child process once it has loaded
the tokenizer: :mod:`bridgecli.data.prefetch`). On a GPU's first run the fast tail's kernels compile in a
thread while the model loads (:mod:`bridgecli.modeling.kernel_warmup`), for a scorer whose factory
declares ``warm_kernels``. Under ``torchrun`` each rank scores the records whose index is congruent to its
rank (:mod:`.score_torchrun`). A resumed run writes the same records as an uninterrupted one. Scores holding
a NaN, an infinity or a number the format does not allow stop the run with one line naming the data's record
(:func:`bridgecli.modeling.score_loop.check_batch`); the windows committed before stay resumable. Stopped by SIGINT or
SIGTERM, the run keeps what it wrote, the window it was in too, and says how to resume.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import msgspec
import torch

from .. import PRODUCER
from ..artifacts.warmup_run import WarmupRun
from ..contracts import as_scorer_factory, build_scorer
from ..data import prefetch
from ..data.source import DataSource
from ..errors import EmptyResultError
from ..format.records import Header, ModelInfo
from ..hookspecs import Scorer
from ..modeling import kernel_warmup
from ..modeling.loading import cache_root
from ..modeling.scoring import ScoringCheckpoint, load_scoring_checkpoint
from ..optionspec import recorded
from ..progress import note
from ..registry import Entry, get
from ..runtime.precision import use_tf32
from ..runtime.stream_output import StreamOutput
from ..timings import mark
from . import score_torchrun as torchrun
from .common import now, step_record
from .options import ScoreOptions
from ..modeling.score_loop import run_windows, score_window, windows

__all__ = ["ScoreOptions", "check_score_options", "compile_caches", "run_score", "score_window", "windows"]

#: padded tokens of one pass when neither --max-tokens nor the scorer says: on a GPU, elsewhere
MAX_TOKENS_CUDA = 32768
MAX_TOKENS_CPU = 4096


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


def _start_kernel_warmup(opts: ScoreOptions, run: WarmupRun, device: str, entry: Entry) -> kernel_warmup.Warmup | None:
    """Compile the scorer's GPU kernels in a thread while the model loads (kernel_warmup.py), when its
    factory declares ``warm_kernels``."""
    if not device.startswith("cuda") or opts.dtype not in ("auto", "bfloat16", "float16"):
        return None
    if not as_scorer_factory(entry.obj).warm_kernels:
        return None
    config = kernel_warmup.read_config(run.checkpoint)
    if config is None or not kernel_warmup.wanted(device, config):
        return None
    dtype = torch.float16 if opts.dtype == "float16" else torch.bfloat16
    done = kernel_warmup.marker(cache_root(), config, device, dtype)
    if done.exists() and os.environ.get("BRIDGE_KERNEL_WARMUP") != "always":
        return None  # warmed on an earlier run of this machine
    return kernel_warmup.start(config, device, dtype, done)


def check_score_options(opts: ScoreOptions) -> None:
    """Every parameter in its range, the device present here (see :mod:`bridgecli.runtime.params`),
    before anything is read."""
    from ..runtime import params

    params.check_all(opts)


def run_score(opts: ScoreOptions) -> int:
    check_score_options(opts)
    output = StreamOutput(
        opts.out, resumable=True, resume=opts.resume, frame=opts.window, inputs_one_for_one=True, inputs=(opts.data,)
    )  # the output's checks, and the ranks'
    torchrun.check_data(output.dist, opts.data)
    # missing, unreadable or empty data, stdin copied: one line before any model loads
    source = DataSource.scan(opts.data, opts.data_opts, allow_empty=opts.allow_empty, name=opts.source)
    run = WarmupRun.open(opts.run)
    started = now()
    with torchrun.session(output.dist, opts.device, opts.out) as device:
        return _score(opts, run, source, output, device, started)


def _score(opts: ScoreOptions, run: WarmupRun, source: DataSource, output: StreamOutput, device, started) -> int:
    # the tokenising process (opt-in, see data/prefetch.py) starts first: its interpreter and
    # tokenizer load while the model does
    tokproc = None
    if prefetch.wanted(device):
        tokproc = prefetch.TokenizeProcess(str(run.checkpoint))
        mark("tokenising process started")
    try:
        return _score_with(opts, run, source, output, device, started, tokproc)
    finally:
        if tokproc is not None:
            tokproc.close()


def _build(opts: ScoreOptions, entry: Entry, ck: ScoringCheckpoint, device: str) -> Scorer:
    ctx = ck.context(opts.attention_layers, device, {"scorer_options": dict(opts.scorer_options)})
    return build_scorer(entry.obj, ctx, f"--scorer {opts.scorer}", entry.plugin)


def _score_with(
    opts: ScoreOptions,
    run: WarmupRun,
    source: DataSource,
    output: StreamOutput,
    device: str,
    started: str,
    tokproc: prefetch.TokenizeProcess | None,
) -> int:
    dist = output.dist
    entry = get("scorer", opts.scorer)
    if dist.rank == 0:
        note(f"scoring on {device}" + (f" with {dist.world} ranks" if dist.world > 1 else ""))
    mark("start of scoring")
    warmup = _start_kernel_warmup(opts, run, device, entry)
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
    identity = ck.identity()
    # --max-length defaults to the model's limit; the ids warmup used are left out when this is its data;
    # each rank reads and tokenises only its own records (index % world == rank)
    source = source.bound(ck.model, ck.meta, shard=(dist.rank, dist.world) if dist.world > 1 else None)
    header = _header(opts, run, source, identity, dtype, device, max_tokens, started, scorer.header_params)
    total = (source.total + dist.world - 1 - dist.rank) // dist.world
    with output.writing(header) as writer:
        if writer is None:  # --resume: this rank's shard was finished before another rank stopped
            done = output.finished or 0
        else:
            done = run_windows(
                scorer,
                source.examples(ck.tokenizer, tokproc),
                writer,
                window=opts.window,
                batch_size=opts.batch_size,
                max_tokens=max_tokens,
                total=total,
                skip=output.skip,
                commit=output.commit,
                rank=dist.rank if dist.world > 1 else None,
                source=source.name,
                hint=f"scorer '{opts.scorer}' with the checkpoint of {opts.run}: did its warmup diverge?",
            )
    # the run's report; an empty result is an error (its output removed) unless --allow-empty
    report, total = torchrun.finish(dist, source.report, done)
    for line in report.lines() if dist.rank == 0 else ():
        note(line)
    if total == 0 and not opts.allow_empty:
        if opts.out not in (None, "-") and dist.rank == 0:
            Path(opts.out).unlink(missing_ok=True)
        why = "; ".join(report.lines()) or "no example in the data"
        raise EmptyResultError(
            f"scored 0 examples ({why})", file=source.name, hint="pass --allow-empty to accept an empty result"
        )
    note(f"scored {done} examples" + (f" on rank {dist.rank}" if dist.world > 1 else ""))
    return done


def _header(
    opts: ScoreOptions,
    run: WarmupRun,
    source: DataSource,
    identity: dict,
    dtype: str,
    device: str,
    max_tokens: int,
    started: str,
    scorer_params: dict | None = None,
) -> Header:
    """The stream's header: the base model, and the ``score`` step with its parameters (every recorded
    field of its options, :func:`~bridgecli.optionspec.recorded`, as resolved here, and what identifies
    the checkpoint, the direction and the data; and the scorer's own parameters, e.g. debias=common's beta)."""
    params = recorded(
        dataclasses.replace(opts, data_opts=source.opts),
        data=source.name,
        run=str(run.root),
        dtype=dtype,
        tf32=opts.tf32 if device.startswith("cuda") and dtype == "float32" else False,
        device=device.split(":")[0],
        max_tokens=max_tokens,
        checkpoint_fingerprint=identity["checkpoint_fingerprint"],
        direction_layers=identity["direction_layers"],
        data_digest=source.digest,
        excluded_warmup_ids=len(source.opts.exclude_ids),
        **{"lambda": identity["lambda"]},
    )
    if scorer_params:  # e.g. debias=common's beta: a reader of the stream sees what a_j is
        params["scorer_params"] = scorer_params
    if source.opts.shard is not None:
        params["shard"] = list(source.opts.shard)
    return Header(
        stage="scores",
        producer=PRODUCER,
        created=started,
        model=ModelInfo(
            source=identity["base_model"],
            fingerprint=identity["base_fingerprint"],
            tokenizer_fingerprint=identity["tokenizer_fingerprint"],
            chat_template=source.opts.chat_template,
        ),
        steps=[msgspec.structs.replace(step_record("score", params), time=started)],
        source=source.name,
    )
