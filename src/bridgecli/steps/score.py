"""``bridge score``: tokenise the data and score every example with the warmup checkpoint."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import torch

from .. import PRODUCER
from ..data.examples import DataOptions, Report, file_digest, iter_examples
from ..data.sources import read_records
from ..errors import ModelError
from ..format.records import Header, ModelInfo
from ..format.writer import open_writer
from ..io import refuse_terminal
from ..modeling import direction as direction_mod
from ..modeling.loading import fingerprint, load_model, load_tokenizer, resolve, resolve_device, tokenizer_fingerprint
from ..modeling.scoring import ScoringContext
from ..progress import note, progress_bar
from ..registry import get
from ..runfolder import WarmupRun
from .common import now, step_record

@dataclass
class ScoreOptions:
    data: str
    out: str | None = None
    run: str | Path | None = None
    scorer: str = "bridge"
    batch_size: int = 8
    attention_layers: int = 4
    device: str = "auto"
    dtype: str = "float32"
    data_opts: DataOptions = field(default_factory=DataOptions)


def _count(path: str, opts: DataOptions) -> int:
    n = sum(1 for _ in read_records(path, opts.split))
    return min(n, opts.limit) if opts.limit is not None else n


def run_score(opts: ScoreOptions) -> int:
    refuse_terminal(opts.out)
    started = now()
    run = WarmupRun.open(opts.run)
    meta = run.meta()
    device = resolve_device(opts.device)
    scorer_entry = get("scorer", opts.scorer)
    note(f"scoring with checkpoint {run.checkpoint} on {device}")
    tokenizer = load_tokenizer(str(run.checkpoint))
    tok_fp = tokenizer_fingerprint(tokenizer)
    if meta.get("tokenizer_fingerprint") and meta["tokenizer_fingerprint"] != tok_fp:
        raise ModelError("the checkpoint's tokenizer differs from the one warmup recorded", file=str(run.root))
    model = load_model(str(run.checkpoint), dtype=getattr(torch, opts.dtype), device=device)
    model.eval()
    direction = direction_mod.load(run.root)
    params = dict(model.named_parameters())
    missing = [n for n in direction.v if n not in params]
    if missing:
        raise ModelError(f"direction parameter {missing[0]} is not in the checkpoint", file=str(run.root))
    ctx = ScoringContext(model=model, tokenizer=tokenizer, direction=direction.v,
                         attention_layers=opts.attention_layers, device=device)
    scorer = scorer_entry.obj(ctx)

    data_opts = opts.data_opts
    digest = file_digest(opts.data)
    if meta.get("data_digest") == digest:
        leave_out = set(meta.get("warm_ids") or []) | set(meta.get("val_ids") or [])
        data_opts = dataclasses.replace(data_opts, exclude_ids=frozenset(leave_out))
    base_ref = resolve(meta["base_model"])
    header = Header(
        stage="scores", producer=PRODUCER, created=now(),
        model=ModelInfo(source=meta["base_model"], fingerprint=meta.get("base_fingerprint") or fingerprint(base_ref),
                        tokenizer_fingerprint=tok_fp, chat_template=data_opts.chat_template),
        steps=[msgspec.structs.replace(step_record("score", {
            "scorer": opts.scorer, "from": str(run.root), "checkpoint_fingerprint": fingerprint(resolve(str(run.checkpoint))),
            "direction_layers": direction.meta.get("layers"), "lambda": direction.meta.get("lambda"),
            "attention_layers": opts.attention_layers, "batch_size": opts.batch_size, "dtype": opts.dtype,
            "device": device, "data": str(opts.data), "data_digest": digest,
            "chat_template": data_opts.chat_template, "max_length": data_opts.max_length,
            "prompt_field": data_opts.prompt_field, "response_field": data_opts.response_field,
            "excluded_warmup_ids": len(data_opts.exclude_ids),
        }), time=started)],
        source=str(opts.data),
    )
    report = Report()
    total = _count(opts.data, opts.data_opts)
    with open_writer(opts.out, header) as writer, progress_bar() as bar:
        task = bar.add_task("scoring", total=total)
        pending = []

        def flush():
            scores = scorer.score(pending)
            for ex, sc in zip(pending, scores):
                writer.write(msgspec.structs.replace(ex, scores=sc))
            writer.flush()
            bar.update(task, completed=report.read)
            pending.clear()

        for ex in iter_examples(opts.data, tokenizer, data_opts, report):
            pending.append(ex)
            if len(pending) >= opts.batch_size:
                flush()
        if pending:
            flush()
        bar.update(task, completed=total)
        written = writer.count
    for line in report.lines():
        note(line)
    note(f"scored {written} examples")
    return written
