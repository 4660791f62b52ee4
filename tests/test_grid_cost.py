"""bench/results/grid_cost.py, the cost of a grid row as a user pays it: the FLOPs formula it computes with
(the package's, tests/test_flops.py), the compute-matched step count against its definition on drawn row
lengths, the training log's sums (a resumed step counted once), and which shared steps a row's pipeline
needs."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgecli.training.flops import rows_flops, shape_of
from tiny import results_script

gc = results_script("grid_cost")

_CFG = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 96,
        "vocab_size": 500}


def test_the_grid_computes_with_the_packages_formula():
    """grid_cost.py's FLOPs are bridgecli.training.flops' (checked against torch's FLOP counter in
    tests/test_flops.py, and recorded by `bridge train`): one formula, and a shape it does not describe is an
    error here, not a guess."""
    shape = shape_of(_CFG)
    assert gc.matmul_params(_CFG) == tuple(shape)
    assert gc.train_flops([3, 40, 7], _CFG, 2) == pytest.approx(2 * rows_flops([3, 40, 7], shape))
    with pytest.raises(ValueError, match="dense decoder"):
        gc.matmul_params({**_CFG, "num_experts": 8})


@settings(max_examples=200, deadline=None)
@given(
    full=st.lists(st.integers(1, 300), min_size=1, max_size=40),
    keep=st.lists(st.floats(0.05, 1.0), min_size=40, max_size=40),
    epochs=st.integers(1, 4),
    per_step=st.integers(1, 16),
)
def test_matched_steps_spend_what_the_selection_spends(full, keep, epochs, per_step):
    """The control's --max-steps k: the step count whose share of full SFT's schedule is the FLOPs ratio, to the
    nearest step (brute force over every k: none is closer), and never 0."""
    selected = [max(1, round(s * f)) for s, f in zip(full, keep)]
    k = gc.matched_steps(full, selected, _CFG, epochs, per_step)
    schedule = epochs * gc.steps_per_epoch(len(full), per_step)
    target = gc.train_flops(selected, _CFG) / gc.train_flops(full, _CFG) * schedule
    best = min(range(1, schedule + 1), key=lambda j: (abs(j - target), j))
    assert k >= 1 and abs(k - target) <= abs(best - target) + 1e-9
    if selected == full:
        assert k == schedule
    assert gc.consumed_flops(full, _CFG, sum(full)) == pytest.approx(gc.train_flops(full, _CFG))
    assert gc.consumed_flops(full, _CFG, sum(full) * epochs) == pytest.approx(gc.train_flops(full, _CFG, epochs))


def test_training_log_counts_a_resumed_step_once(tmp_path):
    """A resumed run writes a step again: the last record wins, in tokens, rows, the steps' own seconds and the
    time between steps (each step's elapsed less the step before's and its own time: a checkpoint's)."""
    recs = [
        {"step": 1, "executed_tokens": 100, "computed_tokens": 120, "rows": 4, "step_time": 0.5, "elapsed": 0.5},
        {"step": 2, "executed_tokens": 90, "computed_tokens": 128, "rows": 4, "step_time": 0.25, "elapsed": 0.8},
        # resumed after a checkpoint at step 1 (its 9 s between the steps): step 2 again
        {"step": 2, "executed_tokens": 80, "computed_tokens": 96, "rows": 4, "step_time": 0.75, "elapsed": 10.25},
        {"step": 3, "executed_tokens": 40, "rows": 2},  # an older log: no padding count, no step time
        {"loss": 1.0},
    ]
    log = tmp_path / "metrics.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in recs) + "\n")
    assert gc.training_log(log) == {"steps": 3, "executed": 220, "computed": 256, "rows": 10, "step_seconds": 1.2,
                                    "between_steps_seconds": 9.0}
    assert gc.training_log(tmp_path / "absent.jsonl")["steps"] == 0


def test_what_each_rows_pipeline_needs():
    assert gc.needs("full") == gc.needs("random") == gc.needs("full-match-bridge") == ()
    assert gc.needs("bridge") == gc.needs("importance-loss-resp-trim") == ("warmup", "score")
    assert gc.needs("rho-loss-trim") == ("warmup", "score", "ref-base")
