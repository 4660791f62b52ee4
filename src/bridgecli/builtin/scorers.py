"""Built-in scorers, registered through the same hook as third-party ones.

The factories import torch only when a scorer is built, so commands that never score stay light."""

from ..hookspecs import hookimpl


def bridge_scorer(ctx):
    from ..modeling.scoring import BridgeScorer

    return BridgeScorer(ctx)


def exact_scorer(ctx):
    from ..modeling.scoring import ExactScorer

    return ExactScorer(ctx)


def atp_scorer(ctx):
    from ..modeling.attribution import AttributionScorer

    return AttributionScorer(ctx)


@hookimpl(trylast=True)
def register_scorers(register):
    register("bridge", bridge_scorer, "a_j by one forward-mode JVP along v; A and c from the same pass")
    register(
        "atp",
        atp_scorer,
        "bridge's a, A, c plus B: each prompt token's effect on a_j by key-gate "
        "attribution (one reverse pass through the JVP; --scorer-option chunks=K for K passes, "
        "fast=1 for a compiled pass on Llama-family models)",
    )
    register("exact", exact_scorer, "diagnostic: a_j by one backward pass per response token (slow)")
