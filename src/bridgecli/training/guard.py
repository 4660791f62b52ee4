"""What ``fit`` does with a NaN or infinite gradient: the step's update is skipped (``sft._one_step``), and a
run of them stops training in one line."""

from __future__ import annotations

from .config import SFTConfig

#: non-finite gradients in a row after which training stops (a skipped step leaves the weights as they were)
MAX_NONFINITE_RUN = 3


def check_finite(rec: dict, history: list[dict], cfg: SFTConfig) -> None:
    """Stop with one line when the gradients keep coming out NaN or infinite: ``_one_step`` skips the update
    of such a step (the weights stay finite), and a few in a row, or more than 5% of the steps so far (from
    the 20th on), mean the run cannot train. In bf16 mixed precision the usual way out is float32."""
    if not rec.get("skipped"):
        return
    from ..errors import ModelError
    from ..progress import note

    run = 1
    for past in reversed(history):
        if not past.get("skipped"):
            break
        run += 1
    skipped = run + sum(1 for past in history[: len(history) - run + 1] if past.get("skipped"))
    done = len(history) + 1
    precision = "bf16 mixed precision" if cfg.bf16 else "float32"
    if run >= MAX_NONFINITE_RUN or (done >= 20 and skipped > 0.05 * done):
        raise ModelError(
            f"training stopped at step {rec['step']}: the gradient was NaN or infinite in {skipped} of {done} steps "
            f"({run} in a row) in {precision}",
            hint="rerun with --no-bf16 (float32)" if cfg.bf16 else "lower --lr or --max-grad-norm",
        )
    note(f"step {rec['step']}: the gradient is NaN or infinite ({precision}): the update is skipped")
