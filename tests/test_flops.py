"""bridgecli.training.flops, the training FLOPs formula, and what a training run records of it: the model shapes
it reads (every Linear weight, tied head or not, head_dim apart from hidden/heads, a multimodal config's text
part), the shapes it refuses (experts, missing fields), the value against torch's FLOP counter, and each step's
and the run's figure (the step's own rows; a resumed step once; none for LoRA)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from bridgecli.steps.train import _train_flops
from bridgecli.training.flops import FORMULA, Shape, row_flops, rows_flops, shape_of, steps_for_flops
from bridgecli.training.rows import IGNORE, Row
from bridgecli.training.sft import SFTConfig, fit, training_plan
from tiny import tiny_llama_config, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

_SHAPE = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
              num_key_value_heads=2, max_position_embeddings=64)


def _linear_weights(model) -> int:
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("make", [
    lambda: (LlamaConfig(**_SHAPE, head_dim=12, tie_word_embeddings=False), LlamaForCausalLM),
    lambda: (Qwen2Config(**_SHAPE, tie_word_embeddings=True), Qwen2ForCausalLM),
])
def test_the_shape_counts_every_matrix_product_and_the_formula_matches_torchs_counter(make):
    """N_mm is the Linear weights (the head too, tied or not; no embedding lookup); torch counts a forward as
    2 N_mm s for the weights and 4 L d s^2 for QK^T and AV over the whole square (the formula keeps the causal
    half, 2 L d s^2), and forward plus backward as three forwards."""
    cfg, cls = make()
    cfg._attn_implementation = "eager"  # QK^T and AV as matmuls the counter sees
    torch.manual_seed(0)
    model = cls(cfg).float()
    shape = shape_of(cfg.to_dict())
    assert shape is not None and shape.n_mm == _linear_weights(model)
    assert shape.layers == 3 and shape.d_attn == cfg.num_attention_heads * (getattr(cfg, "head_dim", None) or 8)
    for seq in (1, 9):
        ids = torch.randint(0, cfg.vocab_size, (1, seq))
        with FlopCounterMode(display=False) as fwd:
            model(ids)
        assert fwd.get_total_flops() == 2 * shape.n_mm * seq + 4 * shape.layers * shape.d_attn * seq * seq
        with FlopCounterMode(display=False) as both:
            model(ids, labels=ids).loss.backward()
        assert row_flops(seq, shape) == 3 * (fwd.get_total_flops() - 2 * shape.layers * shape.d_attn * seq * seq)
        assert both.get_total_flops() == 3 * fwd.get_total_flops()


def test_shapes_the_formula_does_not_describe_get_no_figure():
    base = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 96,
            "vocab_size": 500}
    assert shape_of(base) == Shape(2 * (64 * 64 * 4 + 3 * 64 * 96) + 64 * 500, 2, 64)
    assert shape_of({"text_config": base, "vision_config": {"hidden_size": 8}}) == shape_of(base)  # multimodal
    for experts in ("num_experts", "num_local_experts", "n_routed_experts"):
        assert shape_of({**base, experts: 8}) is None  # a mixture of experts uses a share of its weights
    assert shape_of({**base, "num_local_experts": 1}) == shape_of(base)  # one expert is a dense MLP
    for key in base:
        assert shape_of({k: v for k, v in base.items() if k != key}) is None
    assert shape_of(None) is None and shape_of({}) is None


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(1, 400), max_size=30))
def test_rows_flops_is_the_sum_of_its_rows(lengths):
    shape = Shape(1000, 3, 16)
    assert rows_flops(lengths, shape) == pytest.approx(sum(3 * (2000 * s + 96 * s * s) for s in lengths))


def _rows(n: int) -> list[Row]:
    g = torch.Generator().manual_seed(1)
    rows = []
    for k in range(n):
        length = int(torch.randint(5, 30, (1,), generator=g))
        ids = torch.randint(1, 97, (length,), generator=g).tolist()
        rows.append(Row(f"r{k}", ids, [IGNORE] * 3 + ids[3:]))
    return rows


def test_a_run_records_each_steps_flops_and_their_sum():
    """Two epochs over 9 rows: the steps' figures sum to two passes of the formula over the rows, each step's is
    its own rows' (the run's plan), and the summary's figure is the steps' sum (none from a log with a step
    that lacks it)."""
    rows = _rows(9)
    model = tiny_model(tiny_llama_config(97, layers=2))
    shape = shape_of(model.config.to_dict())
    res = fit(model, rows, SFTConfig(epochs=2, lr=1e-3, batch_size=4, grad_accum=1), pad_id=0, live=False)
    steps = res.history
    assert len(steps) == 5 and all(h["flops"] > 0 for h in steps)  # 18 rows, 4 a step
    assert sum(h["flops"] for h in steps) == pytest.approx(2 * rows_flops([len(r.input_ids) for r in rows], shape))
    planned, plan, _ = training_plan(rows, SFTConfig(epochs=2, lr=1e-3, batch_size=4, grad_accum=1))
    for h, idx in zip(steps, plan, strict=True):  # each step's figure is its own rows' (the plan the run followed)
        assert h["flops"] == pytest.approx(rows_flops([len(planned[i].input_ids) for i in idx], shape))
        assert h["executed_tokens"] == sum(len(planned[i].input_ids) for i in idx)
    assert _train_flops(steps) == pytest.approx(sum(h["flops"] for h in steps))
    assert _train_flops(steps[:2] + [{k: v for k, v in steps[2].items() if k != "flops"}]) is None  # an older log
    assert _train_flops([]) is None
    assert "N_mm" in FORMULA


def test_lora_runs_record_no_flops():
    from bridgecli.training.config import lora_settings

    rows = _rows(4)
    cfg = SFTConfig(epochs=1, lr=1e-3, batch_size=4, grad_accum=1,
                    lora=lora_settings("q_proj,v_proj", r=2, alpha=4, dropout=0.0))
    from bridgecli.training import lora as lora_mod

    model = lora_mod.wrap(tiny_model(tiny_llama_config(97, layers=2)), cfg.lora)
    res = fit(model, rows, cfg, pad_id=0, live=False)
    assert res.history and all("flops" not in h for h in res.history)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(st.lists(st.integers(1, 60), min_size=1, max_size=5), min_size=1, max_size=12),
    share=st.floats(0.0, 1.3),
)
def test_steps_for_flops_is_the_nearest_step_count(steps, share):
    """Brute force over every step count: none comes nearer the target, a tie goes to fewer steps, and the
    FLOPs returned are that count's."""
    shape = Shape(500, 2, 8)
    cumulative = [sum(rows_flops(s, shape) for s in steps[:k]) for k in range(1, len(steps) + 1)]
    target = share * cumulative[-1]
    k, flops = steps_for_flops(steps, shape, target)
    best = min(range(1, len(steps) + 1), key=lambda j: (abs(cumulative[j - 1] - target), j))
    assert k == best and flops == pytest.approx(cumulative[k - 1])


def _lrs_and_losses(res) -> list[tuple[float, float]]:
    return [(h["lr"], h["loss"]) for h in res.history]


def test_max_flops_trains_the_steps_that_reach_them_as_max_steps_would():
    """--max-flops F is --max-steps k, k the plan's step count nearest F (the schedule ends there: the same lr
    and losses as --max-steps k); the config records k; --max-steps beside it must agree; LoRA is refused."""
    from bridgecli.errors import UsageError
    from bridgecli.training.config import lora_settings
    from bridgecli.training.sft import resolve_max_flops

    rows = _rows(10)
    model = tiny_model(tiny_llama_config(97, layers=2))
    shape = shape_of(model.config.to_dict())
    base = dict(epochs=3, lr=1e-3, batch_size=2, grad_accum=2)
    planned, plan, _ = training_plan(rows, SFTConfig(**base))
    cumulative = [sum(rows_flops([len(planned[i].input_ids) for i in idx], shape) for idx in plan[:k])
                  for k in range(1, len(plan) + 1)]
    target = (cumulative[3] + cumulative[4]) / 2 + 1.0  # just past halfway between 4 and 5 steps: 5 is nearer
    cfg = SFTConfig(**base, max_flops=target)
    line = resolve_max_flops(model, rows, cfg)
    assert cfg.max_steps == 5 and line.startswith(f"--max-flops {target:.4g}: 5 of {len(plan)} steps")
    with pytest.raises(ValueError, match="resolve_max_flops"):  # fit trains max_steps: the flops resolved first
        fit(tiny_model(tiny_llama_config(97, layers=2)), rows, SFTConfig(**base, max_flops=target), pad_id=0)
    by_flops = fit(tiny_model(tiny_llama_config(97, layers=2)), rows, cfg, pad_id=0, live=False)
    by_steps = fit(tiny_model(tiny_llama_config(97, layers=2)), rows, SFTConfig(**base, max_steps=5),
                   pad_id=0, live=False)
    assert _lrs_and_losses(by_flops) == _lrs_and_losses(by_steps) and len(by_flops.history) == 5
    assert sum(h["flops"] for h in by_flops.history) == pytest.approx(cumulative[4])
    resolve_max_flops(model, rows, SFTConfig(**base, max_flops=target, max_steps=5))  # agreeing: a recorded run
    with pytest.raises(UsageError, match="--max-steps says 3"):
        resolve_max_flops(model, rows, SFTConfig(**base, max_flops=target, max_steps=3))
    with pytest.raises(UsageError, match="LoRA"):
        resolve_max_flops(model, rows, SFTConfig(**base, max_flops=target, lora=lora_settings("q_proj", r=2)))
    assert resolve_max_flops(model, rows, SFTConfig(**base)) is None
