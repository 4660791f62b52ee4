"""Compile the scorer's Triton kernels in a thread while the model loads.

A new machine's first ``bridge score`` compiles the fast tail's kernels (RMSNorm, RoPE and SwiGLU
tangents, the attention tangent, the LM-head cross-entropy) on its first batch, seconds of the first
window with the GPU idle (``bench/score/kernel_compile.py``; docs/benchmarks.md has the figures).
Loading the model takes longer than that and mostly waits on the disk and on copies, so
:func:`start` compiles the same kernel variants meanwhile, in a thread of the same process (a second
process was tried and lost more to its own start than it hid: docs/benchmarks.md's changelog). Each
kernel is called once on a tiny batch laid out as the scorer lays out its tensors (the fused q|k|v projection
viewed per head, RoPE's [B, L, H, D] outputs, FlashAttention's LSE), so Triton compiles the variants
the scoring batches then find in its cache. The attention tangent is compiled for every block
configuration pinned for the model's head dimension (jvp_attention.PINNED).

The thread only warms caches: anything it raises is dropped (the first batch then compiles what is
missing, as without it), and the scoring loop joins it before its first batch, so no kernel is ever
compiled by two threads at once. It runs once per machine: after a warm-up that went through, a
marker in bridgecli's cache folder (keyed by the GPU, the torch and Triton versions, the kernels'
source, the model's widths and the dtype) makes later runs skip it, since even with Triton's cache
warm the thread takes seconds of Python work that slows the load it overlaps (docs/benchmarks.md).
``BRIDGE_KERNEL_WARMUP=0`` turns it off, ``=always`` runs it whatever the marker says.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Callable

import torch

from . import ce_kernel, dual_kernels, dual_llama, jvp_attention


class Warmup:
    """A running (or finished) warm-up thread; :meth:`join` waits for it."""

    def __init__(self, target: Callable[[], None]):
        self.error: BaseException | None = None
        self.seconds: float | None = None

        def run() -> None:
            import time

            t0 = time.perf_counter()
            try:
                target()
            except BaseException as exc:  # noqa: BLE001 - a cache warm-up must never fail a run
                self.error = exc
            self.seconds = time.perf_counter() - t0

        self.thread = threading.Thread(target=run, name="bridge-kernel-warmup", daemon=True)
        self.thread.start()

    def join(self) -> None:
        self.thread.join()


def wanted(device: str, config: dict | None) -> bool:
    """Whether a warm-up applies: a CUDA device, Triton, the dual kernels on, a Llama-family config."""
    if os.environ.get("BRIDGE_KERNEL_WARMUP", "1") == "0" or not device.startswith("cuda"):
        return False
    if not (dual_kernels.HAVE_TRITON and jvp_attention.HAVE_TRITON and torch.cuda.is_available()):
        return False
    if os.environ.get("BRIDGE_DUAL_KERNELS", "1") == "0" or config is None:
        return False
    return config.get("model_type") in dual_llama.FAMILIES and config.get("hidden_act", "silu") == "silu"


def read_config(checkpoint: str | Path) -> dict | None:
    """The checkpoint folder's config.json, or None (a GGUF file, an unreadable config)."""
    path = Path(checkpoint) / "config.json"
    try:
        out = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None


def marker(cache: Path, config: dict, device: str, dtype: torch.dtype) -> Path:
    """The file that says this machine's caches hold the kernels for ``config`` in ``dtype``."""
    import triton

    dev = torch.device(device)
    widths = [config.get(k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                      "intermediate_size", "vocab_size")]  # fmt: skip
    h = hashlib.sha256()
    for part in (torch.cuda.get_device_name(dev), torch.__version__, triton.__version__, str(dtype), str(widths),
                 os.environ.get("TRITON_CACHE_DIR", "")):  # fmt: skip
        h.update(part.encode() + b"\0")
    for mod in (dual_kernels, jvp_attention, ce_kernel):
        h.update(Path(mod.__file__ or "").read_bytes())
    return cache / "kernel-warmup" / f"{h.hexdigest()[:24]}.done"


def start(config: dict, device: str, dtype: torch.dtype, done: Path | None = None) -> Warmup:
    """Start compiling the kernels for a model of ``config`` in ``dtype`` on ``device``; on success
    write the marker ``done`` (if given)."""

    def target() -> None:
        warm(config, torch.device(device), dtype)
        if done is not None:
            done.parent.mkdir(parents=True, exist_ok=True)
            done.write_text(json.dumps({"config": {k: config.get(k) for k in sorted(config) if k != "architectures"}},
                                       default=str))  # fmt: skip

    return Warmup(target)


def warm(config: dict, device: torch.device, dtype: torch.dtype) -> None:
    """Call every kernel of the fast tail once on a tiny batch shaped like the model's."""
    if device.index is not None:
        torch.cuda.set_device(device)
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    inter = int(config["intermediate_size"])
    vocab = int(config["vocab_size"])
    eps = float(config.get("rms_norm_eps", 1e-6))
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, device=device, dtype=dtype, generator=gen)

    with torch.no_grad():
        for L in (16, 17):  # should a variant depend on whether the length is a multiple of 16 (Triton's
            # specialisation of integer arguments), both are compiled; the second pass is mostly cache hits
            B = 1
            h, dh, w, dw = rand(B, L, hidden), rand(B, L, hidden), rand(hidden), rand(hidden)
            dual_kernels.rmsnorm_dual(h, dh, w, dw, eps)
            dual_kernels.rmsnorm_dual(h, dh, w, None, eps)
            q_size, kv_size = heads * head_dim, kv_heads * head_dim
            qkv, dqkv = rand(B, L, q_size + 2 * kv_size), rand(B, L, q_size + 2 * kv_size)
            q, k, v = qkv.split([q_size, kv_size, kv_size], -1)
            dq, dk, dv = dqkv.split([q_size, kv_size, kv_size], -1)

            def per_head(t, n):
                return t.view(B, L, n, head_dim).transpose(1, 2)

            q, dq = per_head(q, heads), per_head(dq, heads)
            k, dk = per_head(k, kv_heads), per_head(dk, kv_heads)
            v, dv = per_head(v, kv_heads), per_head(dv, kv_heads)
            cos, sin = rand(B, 1, L, head_dim), rand(B, 1, L, head_dim)
            q, dq, k, dk = dual_kernels.rope_dual(q, dq, k, dk, cos, sin)
            scale = head_dim**-0.5
            o, lse = jvp_attention.attention_with_lse(q, k, v, scale)
            configs = sorted(
                {c for c in jvp_attention.PINNED.get(torch.cuda.get_device_capability(device)[0], {})
                 .get(head_dim, {}).values()}
            )  # fmt: skip
            for bm, bn, nw, ns in configs:
                jvp_attention.attention_tangent(
                    q, k, v, dq, dk, dv, o, lse, scale, block_m=bm, block_n=bn, num_warps=nw, num_stages=ns
                )
            gu, dgu = rand(B, L, 2 * inter), rand(B, L, 2 * inter)
            dual_kernels.swiglu_dual(gu, dgu)
        z = rand(4, vocab)
        ce_kernel.ce_loss_and_q(z, torch.zeros(4, dtype=torch.long, device=device))
    torch.cuda.synchronize(device)
