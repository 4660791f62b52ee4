"""The folder ``bridge warmup`` writes, which ``bridge score --from``, ``bridge analyze --from`` and
``bridge reference --model`` read.

    <run>/checkpoint/            theta_bar as an HF model folder (+ tokenizer)
    <run>/direction.safetensors  v over the final K blocks, with its metadata (:mod:`.direction_file`)
    <run>/common_direction.safetensors  D_val's mean output residual d and the slope beta of a_j on
                                 u_j = d . (w_y - W^T p) (:mod:`.common_file`; runs made before it lack it)
    <run>/warmup.json            parameters, base model, warm/val ids, losses (:class:`WarmupMeta`)
    <run>/metrics.jsonl          one line per optimizer step

:func:`write_warmup_run` is the one writer (:func:`check_warmup_dir` says, before a run starts, whether
it may replace what is there), :meth:`WarmupRun.open` the one reader, and
:meth:`WarmupMeta.leave_out` the one rule for the examples warmup used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Any


from ..errors import ModelError, UsageError
from .common_file import CommonDirection, CommonFit, common_path, load_common, save_common
from .direction_file import Direction, DirectionStats, direction_path, load_direction, save_direction
from .json_file import RunRecord, read_struct

DEFAULT_WARMUP_DIR = Path("runs") / "warmup"
META = "warmup.json"
CHECKPOINT = "checkpoint"
METRICS = "metrics.jsonl"


class WarmupMeta(RunRecord, kw_only=True):
    """``warmup.json``. Only ``base_model`` is required: a file that records less (an older version,
    a hand-made run folder) still reads, the missing fields None."""

    tokenizer_fingerprint: str | None = None
    chat_template: bool | None = None
    data: str | None = None
    data_digest: str | None = None
    #: the ids warmup trained on, when it split DATA itself (--warm-fraction); None: all of DATA
    #: that is not validation, or a separate warm file
    warm_ids: list[str] | None = None
    val: str | None = None
    val_ids: list[str] | None = None
    warm_examples: int | None = None
    val_examples: int | None = None
    val_loss: float | None = None
    val_tokens: int | None = None
    direction_layers: int | None = None
    direction: DirectionStats | None = None
    #: the common direction's fit on D_val (``common_direction.safetensors`` holds d itself)
    common_direction: CommonFit | None = None
    sft: dict[str, Any] | None = None
    steps: int | None = None
    final_train_loss: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON values; without ``common_direction`` when there is none, so that a
        record of an earlier version is written back as it was."""
        out = super().to_dict()
        if out.get("common_direction") is None:
            out.pop("common_direction", None)
        return out

    def leave_out(self, digest: str) -> frozenset[str] | None:
        """The ids that warmup used (warm and validation) of the data whose content digest is ``digest``
        (:func:`bridgecli.data.examples.file_digest`), to leave out of what is scored or analysed; None
        when that data is not the file warmup read."""
        if not self.data_digest or digest != self.data_digest:
            return None
        return frozenset(self.warm_ids or ()) | frozenset(self.val_ids or ())


@dataclass(frozen=True)
class WarmupRun:
    root: Path

    @property
    def checkpoint(self) -> Path:
        return self.root / CHECKPOINT

    @property
    def meta_path(self) -> Path:
        return self.root / META

    @property
    def direction_path(self) -> Path:
        return direction_path(self.root)

    @property
    def metrics_path(self) -> Path:
        return self.root / METRICS

    def meta(self) -> WarmupMeta:
        meta = read_struct(self.meta_path, WarmupMeta, "a warmup record", ModelError)
        if meta is None:
            raise ModelError(
                f"{self.root} is not a warmup run folder (no {META})", hint="pass the folder `bridge warmup -o` wrote"
            )
        return meta

    @property
    def common_path(self) -> Path:
        return common_path(self.root)

    def direction(self) -> Direction:
        return load_direction(self.root)

    def common_direction(self) -> CommonDirection | None:
        """D_val's mean residual and beta (:mod:`.common_file`); None for a run made before warmup
        stored them."""
        return load_common(self.root)

    @staticmethod
    def is_run(path: str | Path) -> bool:
        """Whether ``path`` looks like a warmup run folder (its record and its checkpoint)."""
        p = Path(path)
        return (p / META).is_file() and (p / CHECKPOINT).is_dir()

    @classmethod
    def open(cls, path: str | Path | None) -> "WarmupRun":
        """The run at ``path`` (None: the default folder), or one error line saying what is missing."""
        default = path is None
        root = Path(path) if path is not None else DEFAULT_WARMUP_DIR
        if not cls.is_run(root):
            if default:
                raise ModelError(
                    f"no warmup run at {root} (the folder `bridge warmup` writes by default)",
                    hint="run `bridge warmup WARM.jsonl --val VAL.jsonl` first, or pass --from RUN_DIR",
                )
            raise ModelError(
                f"{root} is not a warmup run folder (no {META} or {CHECKPOINT}/)",
                hint="pass the folder `bridge warmup -o` wrote",
            )
        return cls(root)


def check_warmup_dir(out: str | Path, *, overwrite: bool) -> None:
    """Refuse, before anything loads, an ``out`` that :func:`write_warmup_run` must not replace: a
    finished warmup run (unless ``overwrite``), a non-empty folder that holds none, or a file."""
    p = Path(out)
    if not p.exists():
        return
    if not p.is_dir():
        raise UsageError(f"{p} exists and is not a folder", hint="pass another -o")
    if WarmupRun.is_run(p):
        if not overwrite:
            raise UsageError(
                f"{p} holds a finished warmup run",
                hint="pass another -o, or --overwrite to replace it once the new run is written",
            )
    elif any(p.iterdir()):
        raise UsageError(f"{p} is not empty and holds no warmup run", hint="pass another -o, or empty it")


def write_warmup_run(
    out: str | Path,
    *,
    model,
    tokenizer,
    meta: WarmupMeta,
    direction: Direction,
    history: list[dict],
    common: CommonDirection | None = None,
    fingerprint: Callable[[Path], str] | None = None,
) -> WarmupRun:
    """Write the whole run folder ``out``: it appears complete, or not at all (an earlier run there
    is replaced only once the new one is written). ``common`` is bound to the checkpoint written here
    before it is saved: ``fingerprint`` (the model loader's, which this layer does not import) maps the
    written checkpoint folder to its fingerprint."""
    import msgspec

    from ..io import atomic_dir

    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp / CHECKPOINT)
        tokenizer.save_pretrained(tmp / CHECKPOINT)
        save_direction(direction, tmp)
        if common is not None:
            if fingerprint is None:
                raise ValueError("a common direction is bound to its checkpoint: pass fingerprint")
            bound = msgspec.structs.replace(common.meta, checkpoint_fingerprint=fingerprint(tmp / CHECKPOINT))
            save_common(CommonDirection(common.d, bound), tmp)
        (tmp / META).write_text(json.dumps(meta.to_dict(), indent=2))
        with open(tmp / METRICS, "w") as fh:
            for rec in history:
                fh.write(json.dumps(rec) + "\n")
    return WarmupRun(Path(out))
