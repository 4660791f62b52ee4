"""The kernel warm-up thread of `bridge score` (modeling/kernel_warmup.py): when it applies, and that
it never fails a run. Its compiling is measured on a GPU (bench/score/e2e.py, docs/benchmarks.md)."""

from __future__ import annotations

import json

import pytest

from bridgecli.modeling import kernel_warmup

LLAMA = {"model_type": "llama", "hidden_act": "silu", "hidden_size": 64, "num_attention_heads": 4,
         "intermediate_size": 128, "vocab_size": 100}  # fmt: skip


def test_read_config(tmp_path):
    assert kernel_warmup.read_config(tmp_path) is None  # no config.json (a GGUF checkpoint, say)
    (tmp_path / "config.json").write_text("{not json")
    assert kernel_warmup.read_config(tmp_path) is None
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    assert kernel_warmup.read_config(tmp_path) == LLAMA


def test_wanted_only_for_llama_family_on_cuda(monkeypatch):
    monkeypatch.delenv("BRIDGE_KERNEL_WARMUP", raising=False)
    assert not kernel_warmup.wanted("cpu", LLAMA)
    assert not kernel_warmup.wanted("cuda", None)
    monkeypatch.setattr(kernel_warmup.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(kernel_warmup.dual_kernels, "HAVE_TRITON", True)
    monkeypatch.setattr(kernel_warmup.jvp_attention, "HAVE_TRITON", True)
    assert kernel_warmup.wanted("cuda:0", LLAMA)
    assert not kernel_warmup.wanted("cuda:0", {**LLAMA, "model_type": "gemma3_text"})
    assert not kernel_warmup.wanted("cuda:0", {**LLAMA, "hidden_act": "gelu"})
    monkeypatch.setenv("BRIDGE_DUAL_KERNELS", "0")
    assert not kernel_warmup.wanted("cuda:0", LLAMA)
    monkeypatch.delenv("BRIDGE_DUAL_KERNELS")
    monkeypatch.setenv("BRIDGE_KERNEL_WARMUP", "0")
    assert not kernel_warmup.wanted("cuda:0", LLAMA)


@pytest.mark.parametrize("fails", [False, True])
def test_warmup_thread_never_raises(fails):
    ran = []

    def target():
        ran.append(1)
        if fails:
            raise RuntimeError("no GPU here")

    w = kernel_warmup.Warmup(target)
    w.join()
    assert ran == [1] and w.seconds is not None and w.seconds >= 0
    assert (w.error is not None) == fails


def test_marker_changes_with_what_the_kernels_depend_on(tmp_path, monkeypatch):
    """Once per machine: the marker names the GPU, versions, kernels' source, widths and dtype, so a
    change to any of them warms again; start() writes it only after a warm-up that went through."""
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "GPU A")
    m = kernel_warmup.marker(tmp_path, LLAMA, "cuda:0", torch.bfloat16)
    assert m.parent == tmp_path / "kernel-warmup"
    assert m == kernel_warmup.marker(tmp_path, dict(LLAMA), "cuda:0", torch.bfloat16)
    assert m != kernel_warmup.marker(tmp_path, {**LLAMA, "hidden_size": 128}, "cuda:0", torch.bfloat16)
    assert m != kernel_warmup.marker(tmp_path, LLAMA, "cuda:0", torch.float16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "GPU B")
    assert m != kernel_warmup.marker(tmp_path, LLAMA, "cuda:0", torch.bfloat16)

    calls = []
    monkeypatch.setattr(kernel_warmup, "warm", lambda *a: calls.append(a))
    w = kernel_warmup.start(LLAMA, "cuda:0", torch.bfloat16, m)
    w.join()
    assert calls and w.error is None and m.exists()

    def broken(*a):
        raise RuntimeError("out of resources")

    other = tmp_path / "other.done"
    monkeypatch.setattr(kernel_warmup, "warm", broken)
    w = kernel_warmup.start(LLAMA, "cuda:0", torch.bfloat16, other)
    w.join()
    assert isinstance(w.error, RuntimeError) and not other.exists()
