"""What keeps a CPU warmup or train of the default model at batch 8 under 3 GB (issue 41; measured by
bench/train/memory.py): gradient checkpointing by default on the CPU (and undone after the fit), the
fused AdamW, glibc's mmap threshold fixed. The chunked loss is tests/test_training_loss.py's."""

from __future__ import annotations

import pytest
import torch

from bridgecli.runtime import allocator
from bridgecli.training.config import SFTConfig, on_device
from bridgecli.training.rows import Row
from bridgecli.training.sft import fit

from tiny import tiny_llama_config, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

ROWS = [Row(f"r{i}", [1, 2, 3, 4, 5 + i], [-100, -100, 3, 4, 5 + i]) for i in range(4)]


def _model():
    return tiny_model(tiny_llama_config(97, layers=2))


@pytest.mark.parametrize("device, checkpointing, bf16", [("cpu", True, False), ("cuda", False, True),
                                                          ("cuda:1", False, True), ("mps", True, False)])
def test_device_defaults_are_settled_and_recorded(device, checkpointing, bf16):
    cfg = on_device(SFTConfig(), device)
    assert (cfg.gradient_checkpointing, cfg.bf16) == (checkpointing, bf16)
    given = on_device(SFTConfig(gradient_checkpointing=False, bf16=True), device)
    assert given.gradient_checkpointing is False and given.bf16 is (bf16 and True)


def test_cpu_fit_checkpoints_and_leaves_the_model_as_it_was():
    """Checkpointing is on while it trains (the decoder layers recompute in the backward), off after, and the
    input embeddings' hook is gone: warmup's validation gradient, of the tail's parameters only, would
    otherwise keep every layer's activations (it peaked at 3.07 GB before)."""
    model = _model()
    seen = []
    fit(model, ROWS, SFTConfig(epochs=1, batch_size=2, grad_accum=1, max_steps=1), pad_id=0, live=False,
        on_step=lambda rec: seen.append(model.model.gradient_checkpointing))
    assert seen == [True]  # on while it trained
    assert not model.model.gradient_checkpointing
    for p in model.parameters():
        p.requires_grad_(False)
    assert not model.get_input_embeddings()(torch.tensor([[1, 2]])).requires_grad
    model2 = _model()
    seen.clear()
    fit(model2, ROWS, SFTConfig(epochs=1, batch_size=2, grad_accum=1, max_steps=1, gradient_checkpointing=False),
        pad_id=0, live=False, on_step=lambda rec: seen.append(model2.model.gradient_checkpointing))
    assert seen == [False]


def test_checkpointing_changes_no_number():
    """The same steps with and without checkpointing: the same losses and weights (float64)."""
    runs = []
    for on in (True, False):
        model = _model().double()
        res = fit(model, ROWS, SFTConfig(epochs=2, lr=1e-3, batch_size=2, grad_accum=1, gradient_checkpointing=on),
                  pad_id=0, live=False)
        runs.append(([h["loss"] for h in res.history], [p.detach().clone() for p in model.parameters()]))
    assert runs[0][0] == pytest.approx(runs[1][0], rel=1e-12)
    for a, b in zip(runs[0][1], runs[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_adamw_is_the_fused_one_on_the_cpu(monkeypatch):
    made = []
    real = torch.optim.AdamW

    def recording(params, **kwargs):
        made.append(kwargs.get("fused"))
        return real(params, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", recording)
    fit(_model(), ROWS, SFTConfig(epochs=1, batch_size=2, grad_accum=1, max_steps=1), pad_id=0, live=False)
    assert made == [True]


def test_the_mmap_threshold_is_fixed_through_mallopt(monkeypatch):
    calls = []

    class Mallopt:  # a C function: argtypes and restype may be set on it
        def __call__(self, param, value):
            calls.append((param, value))
            return 1

    class Libc:
        mallopt = Mallopt()

    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: Libc())
    assert allocator.fix_mmap_threshold() is True
    assert calls == [(-3, 1 << 20)]  # M_MMAP_THRESHOLD (malloc.h), 1 MiB
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "33554432")  # the user's choice stays
    assert allocator.fix_mmap_threshold() is False and len(calls) == 1

    class Musl:
        pass

    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: Musl())
    assert allocator.fix_mmap_threshold() is False  # no mallopt: nothing changes


@pytest.mark.parametrize("checkpointing, fixed", [(None, True), (True, True), (False, False)])
def test_train_fixes_the_threshold_on_the_cpu_with_checkpointing(monkeypatch, tmp_path, tiny_model_dir, checkpointing,
                                                                  fixed):
    """Through the step (a tiny model: the call is what is checked, bench/train/memory.py measures it): the
    memory-first setting goes with checkpointing, the CPU's default; --no-gradient-checkpointing is for speed."""
    from bridgecli.steps import train as train_step
    from bridgecli.steps.options import TrainOptions

    calls = []
    monkeypatch.setattr(train_step, "fix_mmap_threshold", lambda: calls.append("train"))
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"input_ids": [1, 2, 3, 4], "labels": [-100, 2, 3, 4]}\n' * 2)
    cfg = SFTConfig(epochs=1, batch_size=2, grad_accum=1, max_steps=1, gradient_checkpointing=checkpointing)
    train_step.run_train(TrainOptions(data=str(rows), out=tmp_path / "t", model=str(tiny_model_dir), device="cpu",
                                      sft=cfg))
    assert calls == (["train"] if fixed else [])
