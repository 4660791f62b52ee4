"""The folder ``bridge warmup`` writes, which ``bridge score --from`` reads.

    <run>/checkpoint/            theta_bar as an HF model folder (+ tokenizer)
    <run>/direction.safetensors  v over the final K blocks, with its metadata
    <run>/warmup.json            parameters, base model, warm/val ids, losses
    <run>/metrics.jsonl          one line per optimizer step
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelError

DEFAULT_WARMUP_DIR = Path("runs") / "warmup"
META = "warmup.json"


@dataclass(frozen=True)
class WarmupRun:
    root: Path

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint"

    @property
    def meta_path(self) -> Path:
        return self.root / META

    def meta(self) -> dict:
        return json.loads(self.meta_path.read_text())

    @classmethod
    def open(cls, path: str | Path | None) -> "WarmupRun":
        default = path is None
        root = Path(path) if path is not None else DEFAULT_WARMUP_DIR
        run = cls(root)
        if not run.meta_path.exists() or not run.checkpoint.is_dir():
            if default:
                raise ModelError(
                    f"no warmup run at {root} (the folder `bridge warmup` writes by default)",
                    hint="run `bridge warmup WARM.jsonl --val VAL.jsonl` first, or pass --from RUN_DIR",
                )
            raise ModelError(f"{root} is not a warmup run folder (no {META} or checkpoint/)",
                             hint="pass the folder `bridge warmup -o` wrote")
        return run
