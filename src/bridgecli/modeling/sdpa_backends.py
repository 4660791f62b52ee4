"""Which fused attention kernels a scoring batch (``BRIDGE_SDPA_CUDNN``), training and the other backward
passes through attention may use.

On recent GPUs PyTorch prefers cuDNN's attention kernel. cuDNN builds an execution plan for every
new (batch, heads, length) shape: tens of milliseconds of host time in the first call of each new
shape, while the GPU waits. Scoring data of varying lengths gives almost every batch a new shape, so
below :data:`CUDNN_MIN_LEN` padded tokens the scorer leaves cuDNN out (FlashAttention, the
memory-efficient kernel or the math path, as PyTorch picks among them); from there on shapes are few
and cuDNN's kernel is the faster one (docs/benchmarks.md, "What the scoring switches cost", has the
measurements on both kinds of data).

``BRIDGE_SDPA_CUDNN=1`` keeps cuDNN allowed at every length, ``=0`` leaves it out at every length,
unset (``auto``) applies the rule above.

The scorers never run a backward through scaled_dot_product_attention, so the rule above weighs speed
only: ``bridge`` scores under no_grad; ``exact`` and ``atp`` differentiate only through the attention of
layers they run by hand (explicit math, or FlashAttention and the memory-efficient kernel called directly,
never cuDNN's), and nothing upstream of their scaled_dot_product_attention calls requires grad. A backward through
scaled_dot_product_attention (``bridge train`` and ``warmup``, ``bridge reference --grad-norms``) runs under
:func:`training_backends`, which never uses cuDNN's attention: its backward on H100/H200 (sm90) returns
NaN gradients for a key length of 64 (mod 128) with an explicit mask when some query row's logsumexp is
below -ln(FLT_MAX) = -88.7 (pytorch/pytorch#196678; reported fixed in the cuDNN 9.26 backend). Both
hold in our training: every packed micro-batch and nearly every padded one carries a mask, and the
attention heads of Qwen2.5-0.5B with huge key biases give query rows a logsumexp below -300
(docs/results.md, "The 0.5B grid").
"""

from __future__ import annotations

import contextlib
import os
from typing import ContextManager

#: padded sequence length from which cuDNN's attention stays allowed (``auto``)
CUDNN_MIN_LEN = 1024


def cudnn_allowed(seq_len: int) -> bool:
    """Whether a batch padded to ``seq_len`` tokens may use cuDNN's attention kernel."""
    mode = os.environ.get("BRIDGE_SDPA_CUDNN", "auto")
    if mode == "1":
        return True
    if mode == "0":
        return False
    return seq_len >= CUDNN_MIN_LEN


def batch_backends(seq_len: int) -> ContextManager:
    """A context in which scaled_dot_product_attention may pick its kernel as :func:`cudnn_allowed`
    says (a nested ``sdpa_kernel``, e.g. the math path forward-mode AD needs, still wins)."""
    if cudnn_allowed(seq_len):
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def training_backends() -> ContextManager:
    """A context for forwards whose backward runs, and for those backwards (training, where gradient
    checkpointing recomputes inside the backward; ``bridge reference --grad-norms``): scaled_dot_product_attention
    picks among FlashAttention, the memory-efficient kernel and the math path, never cuDNN's (see the module
    docstring). On the CPU nothing changes."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
