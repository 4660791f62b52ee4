"""``bridge train``: SFT from theta_old on compacted rows (or any input_ids/labels JSONL)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import PRODUCER
from ..data.sources import read_jsonl
from ..errors import InputError, ModelError
from ..io import atomic_dir
from ..modeling.loading import fingerprint, load_model, load_tokenizer, resolve, resolve_device, tokenizer_fingerprint
from ..progress import note, progress_bar
from ..training.rows import IGNORE, Row
from ..training.config import SFTConfig, config_dict
from ..training.sft import train
from .common import now
from .compact import meta_path


@dataclass
class TrainOptions:
    data: str
    out: str | Path = Path("runs") / "final"
    model: str | None = None
    device: str = "auto"
    sft: SFTConfig = field(default_factory=SFTConfig)


def read_rows(path: str | Path, vocab_size: int) -> list[Row]:
    rows = []
    p = Path(path)
    for where, rec in read_jsonl(p):
        ids, labels = rec.get("input_ids"), rec.get("labels")
        for name, val in (("input_ids", ids), ("labels", labels)):
            if not isinstance(val, list) or not all(isinstance(x, int) for x in val):
                raise InputError("expected a list of integers", file=str(p), record=where, field=name)
        if len(ids) != len(labels):
            raise InputError(f"labels has {len(labels)} entries, input_ids {len(ids)}", file=str(p), record=where,
                             field="labels")
        bad = next((x for x in ids if not 0 <= x < vocab_size), None)
        if bad is not None:
            raise InputError(f"token id {bad} is outside the model's vocabulary ({vocab_size})", file=str(p),
                             record=where, field="input_ids", hint="was it made with another tokenizer?")
        if any(y != IGNORE and y != x for x, y in zip(ids, labels)):
            raise InputError("labels must be -100 or equal input_ids (unshifted)", file=str(p), record=where,
                             field="labels")
        rows.append(Row(str(rec.get("id", where)), ids, labels))
    return rows


def run_train(opts: TrainOptions) -> dict:
    device = resolve_device(opts.device)
    side = {}
    mp = meta_path(opts.data)
    if mp.exists():
        side = json.loads(mp.read_text())
    model_spec = opts.model or side.get("model")
    ref = resolve(model_spec)
    note(f"training {ref.spec} (theta_old) on {opts.data} on {device}")
    tokenizer = load_tokenizer(ref)
    if side.get("tokenizer_fingerprint") and side["tokenizer_fingerprint"] != tokenizer_fingerprint(tokenizer):
        raise ModelError(f"{opts.data} was tokenised with another tokenizer than {ref.spec}'s",
                         hint="train the model the data was scored for, or re-run the pipeline")
    model = load_model(ref, device=device)
    rows = read_rows(opts.data, model.get_input_embeddings().weight.shape[0])
    empty = [r.id for r in rows if r.supervised == 0]
    if empty:
        note(f"skipping {len(empty)} rows with no supervised token")
    cfg = opts.sft
    cfg.bf16 = cfg.bf16 or device.startswith("cuda")
    with atomic_dir(opts.out) as tmp:
        with open(tmp / "metrics.jsonl", "w") as metrics, progress_bar() as bar:
            history = train(model, rows, cfg, pad_id=tokenizer.pad_token_id, device=device, progress=bar,
                            on_step=lambda rec: metrics.write(json.dumps(rec) + "\n"))
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        summary = {
            "producer": PRODUCER, "created": now(), "base_model": ref.spec, "base_fingerprint": fingerprint(ref),
            "data": str(opts.data), "rows": len(rows) - len(empty), "sft": config_dict(cfg),
            "steps": len(history), "final_loss": history[-1]["loss"] if history else None,
            "supervised_tokens": sum(r.supervised for r in rows),
            "executed_tokens": sum(len(r.input_ids) for r in rows),
        }
        (tmp / "bridge_train.json").write_text(json.dumps(summary, indent=2))
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return summary
