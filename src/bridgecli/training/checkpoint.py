"""Checkpoints every N optimizer steps, written so that a killed run never leaves a half one behind.

    OUT/checkpoints/step-000120/     one complete checkpoint
        model.safetensors            (accelerate ``save_state``: model, optimizer.bin,
        optimizer.bin                 random_states_<rank>.pkl for every rank; sharded files
        random_states_0.pkl           under FSDP)
        trainer_state.json           step, plan digest, config, world size: written last
    OUT/checkpoints/.step-000130.partial/   being written; ignored, removed by the next save

Every rank writes into the ``.partial`` folder; when all are done, rank 0 writes
``trainer_state.json`` and renames the folder. A checkpoint is complete when its name is
``step-NNNNNN`` and it holds ``trainer_state.json``; ``--resume`` takes the latest complete one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..artifacts.train_run import CHECKPOINT_STATE as STATE
from ..artifacts.train_run import CHECKPOINTS
from ..artifacts.train_run import checkpoint_name as name
from ..artifacts.train_run import complete_checkpoints as complete

__all__ = ["STATE", "complete", "latest", "load", "name", "prune", "save"]


def latest(run_dir: str | Path) -> tuple[int, Path] | None:
    found = complete(run_dir)
    return found[-1] if found else None


def save(accelerator, run_dir: str | Path, step: int, state: dict, keep: int | None = None) -> Path:
    """Save the prepared model, optimizer and every rank's RNG state (all ranks call this)."""
    root = Path(run_dir) / CHECKPOINTS
    final = root / name(step)
    tmp = root / f".{name(step)}.partial"
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    accelerator.wait_for_everyone()
    try:
        accelerator.save_state(str(tmp))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            with open(tmp / STATE, "w") as fh:
                json.dump(state, fh, indent=2)
                fh.flush()
                os.fsync(fh.fileno())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk: no partial checkpoint is left behind
        raise
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        prune(run_dir, keep)
    accelerator.wait_for_everyone()
    return final


def prune(run_dir: str | Path, keep: int | None) -> None:
    """Remove all but the newest ``keep`` complete checkpoints, and stale partial ones."""
    root = Path(run_dir) / CHECKPOINTS
    for p in root.glob(".step-*.partial"):
        shutil.rmtree(p, ignore_errors=True)
    if keep is None or keep <= 0:
        return
    for _, p in complete(run_dir)[:-keep]:
        shutil.rmtree(p, ignore_errors=True)


def load(accelerator, path: str | Path) -> dict:
    """Restore model, optimizer and RNG states in place; return the trainer state."""
    state = json.loads((Path(path) / STATE).read_text())
    accelerator.load_state(str(path))
    return state
