from __future__ import annotations

from ..steps.options import ScoreOptions
from .build import command


@command(ScoreOptions)
def score(opts: ScoreOptions) -> None:
    """Score every example: a_j (one JVP along v), attention rows A and history mass c.

    Several GPUs: torchrun --nproc-per-node N -m bridgecli score DATA -o OUT (ranks shard the
    examples; rank 0 merges the shards into OUT)."""
    from ..steps.score import run_score

    run_score(opts)
