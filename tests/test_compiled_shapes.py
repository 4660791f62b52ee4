"""The fused tangents compile once for every batch shape (dual_llama._Compiled).

On CPU with dynamo's "eager" backend (no code generation), so the guards and recompiles are the
same as on a GPU while the test stays fast.
"""

import pytest
import torch
from torch._dynamo.utils import counters

from bridgecli.modeling import dual_llama


@pytest.fixture
def compiled(monkeypatch):
    monkeypatch.delenv("BRIDGE_COMPILE", raising=False)
    made = []

    def make(fn, size_oblivious=True):
        c = dual_llama._Compiled(fn, size_oblivious)
        c.device_types = ("cpu",)
        c.backend = "eager"
        made.append(c)
        return c

    torch._dynamo.reset()
    yield make
    torch._dynamo.reset()


# (batch, length) pairs chosen to break the old graphs: a batch equal to the head dim (duck
# sizing), a batch of one example (0/1 specialisation)
SHAPES = [(4, 7), (16, 16), (1, 9), (3, 16), (5, 3), (1, 2)]


@pytest.mark.integration  # torch.compile (seconds)
def test_fused_tangents_compile_once_for_every_shape(compiled):
    torch.manual_seed(0)
    norm = compiled(dual_llama._rmsnorm_dual)
    glu = compiled(dual_llama._swiglu_dual)
    rope = compiled(dual_llama._rope_dual, size_oblivious=False)
    w_param = torch.nn.Parameter(torch.randn(16))
    counters.clear()
    for b, length in SHAPES:
        x, dx = torch.randn(b, length, 16), torch.randn(b, length, 16)
        for w in (w_param, w_param.detach() * 1.0):  # a Parameter and a plain tensor
            y, dy = norm(x, dx, w, None, 1e-6)
            ey, edy = dual_llama._rmsnorm_dual(x, dx, w, None, 1e-6)
            assert y.shape == x.shape and torch.allclose(y, ey) and torch.allclose(dy, edy)
        gu, dgu = torch.randn(b, length, 32), torch.randn(b, length, 32)
        m, dm = glu(gu, dgu)
        em, edm = dual_llama._swiglu_dual(gu, dgu)
        assert m.shape == (b, length, 16) and torch.allclose(m, em) and torch.allclose(dm, edm)
        q, k = torch.randn(b, 4, length, 8), torch.randn(b, 2, length, 8)  # 4 query heads, 2 kv heads
        cos, sin = torch.randn(b, 1, length, 8), torch.randn(b, 1, length, 8)
        got, want = rope(q, q * 2, k, k * 2, cos, sin), dual_llama._rope_dual(q, q * 2, k, k * 2, cos, sin)
        assert all(torch.allclose(g, w) for g, w in zip(got, want))
    # one graph per function across shapes, batch sizes and weight types; RoPE (which broadcasts
    # cos/sin over heads, so keeps dynamo's size-1 rule) one more for the batches of one example
    assert counters["stats"]["unique_graphs"] == 4, dict(counters["stats"])
    assert not any(c.failed for c in (norm, glu, rope))


def test_off_switch_runs_eagerly(compiled, monkeypatch):
    norm = compiled(dual_llama._rmsnorm_dual)
    monkeypatch.setenv("BRIDGE_COMPILE", "0")
    counters.clear()
    x = torch.randn(2, 3, 8)
    norm(x, x, torch.ones(8), None, 1e-6)
    assert counters["stats"]["unique_graphs"] == 0


@pytest.mark.integration  # torch.compile (seconds)
def test_float_arguments_are_constants_of_the_graph(compiled):
    """An RMSNorm's eps and attention's scale reach the graph as constants: unspecialised, dynamo
    passed them in as 0-d float64 CPU tensors, for which inductor wrote a C++ kernel, and every
    process compiled C++ test programs before its first batch (dual_llama._DYNAMO_CONFIG)."""
    inputs = []

    def backend(gm, example_inputs):
        inputs.extend(example_inputs)
        return gm.forward

    norm = compiled(dual_llama._rmsnorm_dual)
    norm.backend = backend
    x, w = torch.randn(2, 5, 16), torch.randn(16)
    for eps in (1e-6, 1e-2):  # a new value compiles again (a value guard), and is used
        got, want = norm(x, x * 2, w, None, eps), dual_llama._rmsnorm_dual(x, x * 2, w, None, eps)
        assert all(torch.allclose(g, e) for g, e in zip(got, want))
    assert inputs
    assert not any(isinstance(i, (float, torch.SymFloat)) or (isinstance(i, torch.Tensor) and i.dim() == 0)
                   for i in inputs), [type(i) for i in inputs]
