"""Exact prompt perturbation matrices on disk, so that ``analyze fidelity`` and ``analyze shift``
(and reruns) compute each once.

A matrix is stored as ``<sha256[:32]>.npz`` (``a_full``, ``beta``) under the cache folder. The name
hashes what the matrix depends on beyond the example (``key``: the checkpoint, v, the
perturbation, the dtype, as the caller lists them) and the example's token ids and kinds.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Protocol

import numpy as np

from ..format.records import Example
from ..io import atomic_path


class PromptMatrices(Protocol):
    def prompt_matrix(self, ex: Example) -> tuple[np.ndarray, np.ndarray]: ...


class MatrixCache:
    """``folder`` None: no cache, every matrix computed. ``key``: JSON-serialisable values that
    identify everything the matrices depend on besides the example."""

    def __init__(self, folder: str | Path | None, key: list | None = None):
        self.folder = Path(folder) if folder is not None else None
        self.hits = 0
        self.base = json.dumps(key if key is not None else [])
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)

    def path(self, ex: Example) -> Path:
        assert self.folder is not None
        h = hashlib.sha256(self.base.encode())
        h.update(json.dumps(ex.tokens.input_ids).encode())
        h.update(ex.tokens.kinds)
        return self.folder / f"{h.hexdigest()[:32]}.npz"

    def prompt_matrix(self, exact: PromptMatrices, ex: Example) -> tuple[np.ndarray, np.ndarray]:
        """(a_full, beta) of ``ex`` from the cache, or computed by ``exact`` and stored."""
        if self.folder is None:
            return exact.prompt_matrix(ex)
        path = self.path(ex)
        if path.exists():
            with np.load(path) as z:
                self.hits += 1
                return z["a_full"], z["beta"]
        a_full, beta = exact.prompt_matrix(ex)
        with atomic_path(path, suffix=".npz") as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, a_full=a_full, beta=beta)
        return a_full, beta
