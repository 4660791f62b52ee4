"""The scorer's per-batch choice of attention kernels (modeling/sdpa_backends.py)."""

import pytest
import torch

from bridgecli.modeling import sdpa_backends
from bridgecli.modeling.sdpa_backends import CUDNN_MIN_LEN, batch_backends, cudnn_allowed


@pytest.mark.parametrize(
    "mode, seq_len, allowed",
    [
        (None, CUDNN_MIN_LEN - 1, False),
        (None, CUDNN_MIN_LEN, True),
        ("auto", 200, False),
        ("1", 200, True),
        ("0", 4096, False),
    ],
)
def test_cudnn_allowed(monkeypatch, mode, seq_len, allowed):
    if mode is None:
        monkeypatch.delenv("BRIDGE_SDPA_CUDNN", raising=False)
    else:
        monkeypatch.setenv("BRIDGE_SDPA_CUDNN", mode)
    assert cudnn_allowed(seq_len) is allowed


def test_batch_backends_leaves_cudnn_out_then_restores(monkeypatch):
    monkeypatch.delenv("BRIDGE_SDPA_CUDNN", raising=False)
    before = (torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled())
    with batch_backends(128):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
    assert (torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()) == before
    with batch_backends(CUDNN_MIN_LEN):
        assert torch.backends.cuda.cudnn_sdp_enabled() == before[0]


def test_attention_output_unchanged_on_cpu(monkeypatch):
    """Leaving cuDNN out changes which kernel runs on a GPU, not what attention computes."""
    monkeypatch.setattr(sdpa_backends, "CUDNN_MIN_LEN", 10**9)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 17, 8, generator=g) for _ in range(3))
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    with batch_backends(17):
        chosen = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(chosen, plain)


def test_training_backends_leave_cudnn_out_then_restore():
    """The one context every backward through attention runs in (bridge train, warmup, reference --grad-norms):
    cuDNN's kernel left out (its backward gave NaN gradients for masked bf16 shapes), the others kept."""
    from bridgecli.modeling.sdpa_backends import training_backends

    before = torch.backends.cuda.cudnn_sdp_enabled()
    with training_backends():
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
        assert torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
