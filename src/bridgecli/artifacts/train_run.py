"""The folder ``bridge train`` writes:

    OUT/config.json, model.safetensors, tokenizer files   the trained model (merged, with --lora)
    OUT/adapter/                                          the LoRA adapter alone (--lora)
    OUT/metrics.jsonl                                     one line per optimizer step, as it runs
    OUT/checkpoints/step-NNNNNN/                          every --save-every steps (training/checkpoint.py
                                                          writes them; :func:`complete_checkpoints` finds them)
    OUT/bridge_train.json                                 the summary, written last (the run is complete)
    .OUT.overwrite/                                       beside OUT: an --overwrite run, until it replaces OUT

:func:`write_summary` is the summary's one writer and :func:`read_summary` its one reader;
:func:`check_run_dir` decides what a fresh run does with the folder: a finished run or checkpoints
are only replaced on request (``--overwrite``), once the new run is written. What a killed
``--overwrite`` left beside OUT is put right by the next run into OUT (:func:`settle_killed_overwrite`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any


from ..errors import UsageError
from ..io import moved_aside, real_path
from .json_file import RunRecord, read_struct

DEFAULT_TRAIN_DIR = Path("runs") / "final"
SUMMARY = "bridge_train.json"
METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
ADAPTER = "adapter"
#: what a folder may hold for a fresh run to clear it (anything else: refuse, it is not ours)
RUN_MARKERS = (SUMMARY, METRICS, CHECKPOINTS)
#: the file a checkpoint's writer puts in it last: a checkpoint without it is not complete
CHECKPOINT_STATE = "trainer_state.json"
_CHECKPOINT_NAME = re.compile(r"^step-(\d{6,})$")


def checkpoint_name(step: int) -> str:
    """The folder name of the checkpoint after optimizer step ``step``, under ``OUT/checkpoints``."""
    return f"step-{step:06d}"


def complete_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint of a run folder (named ``step-NNNNNN`` and holding
    :data:`CHECKPOINT_STATE`), oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _CHECKPOINT_NAME.match(p.name)
        if m and p.is_dir() and (p / CHECKPOINT_STATE).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


class TrainSummary(RunRecord, kw_only=True):
    """``bridge_train.json``. Only ``base_model`` is required, so that a file that records less reads."""

    data: str | None = None
    rows: int | None = None
    sft: dict[str, Any] | None = None
    steps: int | None = None
    final_loss: float | None = None
    supervised_tokens: int | None = None
    executed_tokens: int | None = None
    packing: bool | None = None
    batching: str | None = None
    processes: int | None = None
    resumed_from_step: int | None = None
    plan_digest: str | None = None
    train_seconds: float | None = None
    #: training FLOPs of the steps run, by the stated formula (bridgecli.training.flops; None where it does not
    #: apply: LoRA, a mixture of experts, a model without a config), and the formula
    train_flops: float | None = None
    flops_formula: str | None = None
    lora: dict[str, Any] | None = None
    #: the adapter's folder inside OUT (--lora), else None
    adapter: str | None = None


def write_summary(out: str | Path, summary: TrainSummary) -> Path:
    """Write the summary last, in one rename: its presence marks a complete run."""
    path = Path(out) / SUMMARY
    part = Path(out) / f".{SUMMARY}.partial"
    try:
        part.write_text(json.dumps(summary.to_dict(), indent=2))
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)  # a full disk: no partial summary is left behind
        raise
    return path


def read_summary(out: str | Path) -> TrainSummary | None:
    """The summary of the run in ``out``, or None when the run is not complete (or not a run)."""
    return read_struct(Path(out) / SUMMARY, TrainSummary, "a `bridge train` summary")


#: what a run does with its folder before it trains (:func:`check_run_dir`): train in it as it is (none
#: there, empty, or --resume), empty it first (what an unfinished run left: no checkpoint, no model),
#: train beside it and replace it once the new run is written (--overwrite of a finished run or of
#: checkpoints), or nothing (--resume of a finished run: the same run is done, another is refused)
IN_PLACE, CLEAR, REPLACE, FINISHED = "in-place", "clear", "replace", "finished"


def check_run_dir(out: Path, *, resume: bool, overwrite: bool) -> str:
    """What a run must do with ``out`` first: :data:`IN_PLACE`, :data:`CLEAR`, :data:`REPLACE` or
    :data:`FINISHED` (every rank checks, so every rank raises alike). A folder holding a finished run or
    checkpoints is only continued (--resume; a finished run has nothing left to continue) or replaced on
    request (--overwrite), never cleared; a non-empty folder that is not a training run is never touched."""
    if resume:
        return FINISHED if (out / SUMMARY).is_file() else IN_PLACE
    if not out.exists():
        return IN_PLACE
    if not out.is_dir():
        raise UsageError(f"{out} exists and is not a folder", hint="pass another -o")
    if not any(out.iterdir()):
        return IN_PLACE
    if not any((out / m).exists() for m in RUN_MARKERS):
        raise UsageError(f"{out} is not empty and holds no training run", hint="pass another -o, or empty it")
    finished = (out / SUMMARY).is_file()
    if not overwrite and finished:
        raise UsageError(
            f"{out} holds a finished training run",
            hint="pass another -o, or --overwrite to replace it once the new run is written",
        )
    if not overwrite and complete_checkpoints(out):
        raise UsageError(
            f"{out} holds checkpoints of an earlier run",
            hint="pass --resume to continue it, or --overwrite to start over",
        )
    return REPLACE if overwrite else CLEAR


def overwrite_dir(out: str | Path) -> Path:
    """The hidden folder beside ``out`` that an ``--overwrite`` run trains in, ``.NAME.overwrite``, named
    after the real folder (a run folder given as a symbolic link stays one); it replaces ``out`` once the
    new run is written (:func:`bridgecli.io.replace_dir`)."""
    real = real_path(out)
    return real.with_name(f".{real.name}.overwrite")


def settle_killed_overwrite(out: str | Path) -> list[str]:
    """Put right what a killed ``--overwrite`` run left beside ``out``; the lines saying what was done.
    Called by the process that holds the run folder's lock before the run looks at the folder:

    - killed between :func:`bridgecli.io.replace_dir`'s two renames (OUT gone, the old run moved aside to
      ``.NAME.old``): the new run goes in place when it is complete (its summary is written only once its
      model is), else the old run goes back: the old run is never lost before the new one is whole;
    - killed while it trained: its unfinished ``.NAME.overwrite`` is removed (its checkpoints are not what
      ``--resume`` continues, which is OUT's run);
    - killed while removing the old run after the renames: what is left of ``.NAME.old`` is removed."""
    real = real_path(out)
    new, old = overwrite_dir(out), moved_aside(real)
    done = []
    if not real.exists() and old.is_dir():
        if (new / SUMMARY).is_file():
            os.replace(new, real)
            done.append(f"{out}: the --overwrite run that was killed while replacing it is finished and now in place")
        else:
            os.replace(old, real)
            done.append(f"{out}: put back as it was before an --overwrite run that was killed")
    if new.exists():
        shutil.rmtree(new)
        done.append(f"removed {new}, what a killed --overwrite run into {out} left unfinished")
    if old.is_dir() and real.exists():
        shutil.rmtree(old)
    return done
