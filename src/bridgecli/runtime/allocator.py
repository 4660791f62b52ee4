"""The C allocator of a training process on the CPU, set in one place for warmup and train (with
gradient checkpointing, their default there: the memory-first setting).

A training step frees and makes again, every step, tensors of every size up to hundreds of megabytes
(activations, gradients, the loss's chunks). glibc's malloc serves a block of more than its mmap
threshold from the kernel and gives it back when freed; but each such free raises the threshold to
the block's size (up to 32 MiB), after which blocks that size come from its heaps, where freed space is
kept, fragmented, for later blocks that may not fit it. On SmolLM2-135M at batch 8 that grew the
resident memory of a step by about 0.7 GB (3.5 GB against 2.8 GB; bench/train/memory.py). Fixing the
threshold keeps every block above it in the kernel's hands: freed at once, never fragmenting a heap. The
price is a page fault for every page of such a block each time one is made: more system time, a step
about a third longer (docs/training.md has the figures). ``MALLOC_MMAP_THRESHOLD_`` in the environment, which
glibc reads when the process starts, is the user's choice and stays."""

from __future__ import annotations

import ctypes
import os

__all__ = ["MMAP_THRESHOLD", "fix_mmap_threshold"]

#: blocks larger than this many bytes come from the kernel (glibc's default starts at 128 KiB and rises)
MMAP_THRESHOLD = 1 << 20
#: mallopt's parameter number for the mmap threshold (malloc.h)
_M_MMAP_THRESHOLD = -3


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for this process (which also stops it from
    rising). False where the C library has no ``mallopt`` (musl, macOS), or where the environment sets
    ``MALLOC_MMAP_THRESHOLD_``: nothing changes there."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process already runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold))
