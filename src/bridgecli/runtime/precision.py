"""Matmul precision on a GPU, set in one place for the steps that run float32 there (score's
``--dtype float32``, train's ``--no-bf16``)."""

from __future__ import annotations

__all__ = ["use_tf32"]


def use_tf32(device: str, on: bool) -> None:
    """TensorFloat-32 for float32 matmuls and convolutions on ``device`` (``on``) or IEEE float32.
    Nothing changes off CUDA: the CPU has no TF32. The setting is process-wide, as torch keeps it."""
    if not str(device).startswith("cuda"):
        return
    import torch

    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
