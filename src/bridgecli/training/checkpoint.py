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

Room: before writing one, rank 0 compares the room left on the file system with what it will take
(the latest complete checkpoint's size on disk, or, for the first, the prepared models' parameters and
buffers and the optimizers' state tensors) and refuses at once, naming both (:func:`check_room`), rather
than fail halfway; every rank learns its decision. With ``--keep-checkpoints 1`` (the default) the
folder holds at most one complete checkpoint and the one being written: the older one is removed only
once the new one is complete, so a failed write leaves one to resume from. A write that fails anyway
says why (:func:`bridgecli.io.write_error`, found before its partial files are removed).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from pathlib import Path

import torch

from ..artifacts.train_run import CHECKPOINT_STATE as STATE
from ..artifacts.train_run import CHECKPOINTS
from ..artifacts.train_run import checkpoint_name as name
from ..artifacts.train_run import complete_checkpoints as complete
from ..errors import WriteError
from ..io import free_bytes, human_bytes, write_error

__all__ = [
    "CHECKPOINTS",
    "MARGIN",
    "STATE",
    "check_room",
    "complete",
    "estimate_bytes",
    "latest",
    "load",
    "name",
    "prune",
    "save",
    "size_on_disk",
]

#: room asked beyond a checkpoint's estimated size (file system blocks, the trainer state, RNG states)
MARGIN = 16 * 2**20


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
    check_room(accelerator, run_dir, step)
    if accelerator.is_main_process:
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
    except Exception as exc:
        err = write_error(exc, final)  # why, found before the partial files give their room back
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk: no partial checkpoint is left behind
        if err is not None:
            raise err from None
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        prune(run_dir, keep)
    accelerator.wait_for_everyone()
    return final


def estimate_bytes(accelerator) -> int:
    """About what a checkpoint of ``accelerator``'s prepared models and optimizers takes: their parameters
    and buffers and the optimizers' state tensors (AdamW's two moments), times the processes when FSDP
    shards them (each rank writes its own part)."""
    total = 0
    for model in getattr(accelerator, "_models", []):
        total += sum(t.numel() * t.element_size() for t in itertools.chain(model.parameters(), model.buffers()))
    for opt in getattr(accelerator, "_optimizers", []):
        for st in getattr(opt, "optimizer", opt).state.values():
            total += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
    if getattr(accelerator.distributed_type, "name", "") == "FSDP":
        total *= accelerator.num_processes
    return total


def size_on_disk(folder: Path) -> int:
    """The bytes of the files under ``folder``."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def check_room(accelerator, run_dir: str | Path, step: int) -> None:
    """Refuse (:class:`WriteError`, on every rank) to start the checkpoint of ``step`` when the file system
    holding ``run_dir`` has less room than it will take (see the module docstring): decided by rank 0."""
    decision: list = [None]
    if accelerator.is_main_process:
        found = latest(run_dir)
        needed = max(estimate_bytes(accelerator), size_on_disk(found[1]) if found else 0) + MARGIN
        free = free_bytes(Path(run_dir) / CHECKPOINTS)
        decision = [(needed, free) if free is not None and free < needed else None]
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(decision)
    if decision[0] is not None:
        needed, free = decision[0]
        raise WriteError(
            f"cannot write the checkpoint of step {step}: No space left on device (ENOSPC, "
            f"{human_bytes(free)} free there; it takes about {human_bytes(needed)})",
            file=str(Path(run_dir) / CHECKPOINTS / name(step)),
            hint="free some space, or checkpoint less often (--save-every); the run folder keeps its last "
            "complete checkpoint for --resume",
        )


def prune(run_dir: str | Path, keep: int | None) -> None:
    """Remove all but the newest ``keep`` complete checkpoints, and debris: stale partial ones, and
    ``step-NNNNNN`` folders without their state file. Each is renamed to a hidden ``.step-NNNNNN.removing``
    first, so that a run killed while it removes one leaves nothing that looks like a checkpoint (the next
    prune removes it)."""
    root = Path(run_dir) / CHECKPOINTS
    for p in [*root.glob(".step-*.partial"), *root.glob(".step-*.removing")]:
        shutil.rmtree(p, ignore_errors=True)
    kept = {p for _, p in complete(run_dir)}
    old = [p for _, p in complete(run_dir)[:-keep]] if keep is not None and keep > 0 else []
    debris = [p for p in root.glob("step-*") if p.is_dir() and p not in kept]
    for p in old + debris:
        hidden = root / f".{p.name}.removing"
        try:
            os.replace(p, hidden)
        except OSError:
            hidden = p
        shutil.rmtree(hidden, ignore_errors=True)


def load(accelerator, path: str | Path) -> dict:
    """Restore model, optimizer and RNG states in place; return the trainer state."""
    state = json.loads((Path(path) / STATE).read_text())
    accelerator.load_state(str(path))
    return state
