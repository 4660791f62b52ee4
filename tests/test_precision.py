"""TF32 for float32 matmuls on a GPU: one switch, used by score (--tf32) and train (--tf32)."""

import torch

from bridgecli.runtime.precision import use_tf32
from bridgecli.training.config import RESUMABLE_CHANGES, SFTConfig


def _flags():
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def test_use_tf32_sets_both_flags_on_cuda_and_nothing_elsewhere():
    before = _flags()
    try:
        use_tf32("cuda:0", True)
        assert _flags() == (True, True)
        use_tf32("cpu", False)  # no TF32 on the CPU: left as it was
        assert _flags() == (True, True)
        use_tf32("cuda", False)
        assert _flags() == (False, False)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_train_takes_tf32_by_default_and_a_resume_may_change_it():
    assert SFTConfig().tf32 is True
    assert "tf32" in RESUMABLE_CHANGES


def test_train_calls_the_switch_with_its_setting(monkeypatch, tmp_path):
    from bridgecli.training import sft

    seen = []
    monkeypatch.setattr(sft, "use_tf32", lambda device, on: seen.append((device, on)))
    sft.fit(torch.nn.Linear(1, 1), [], SFTConfig(tf32=False), pad_id=0)
    assert seen == [("cpu", False)]
