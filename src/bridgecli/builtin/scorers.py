"""Built-in scorers, registered through the same hook as third-party ones.

Each factory imports its scorer only when it builds one, so commands that never score stay light;
``warm_kernels`` declares that the scorer runs the fast JVP tail, whose GPU kernels ``bridge score``
may compile while the model loads (:class:`bridgecli.hookspecs.ScorerFactory`)."""

from __future__ import annotations

import importlib

from ..hookspecs import hookimpl


class _Factory:
    """A :class:`~bridgecli.hookspecs.ScorerFactory` building ``bridgecli.modeling.<module>.<cls>``."""

    def __init__(self, module: str, cls: str, *, warm_kernels: bool = False) -> None:
        self.module = module
        self.cls = cls
        self.warm_kernels = warm_kernels
        self.__name__ = f"{cls}_factory"

    def __call__(self, ctx):
        return getattr(importlib.import_module(f"bridgecli.modeling.{self.module}"), self.cls)(ctx)


bridge_scorer = _Factory("scoring", "BridgeScorer", warm_kernels=True)
exact_scorer = _Factory("scoring", "ExactScorer")
atp_scorer = _Factory("attribution", "AttributionScorer")


@hookimpl(trylast=True)
def register_scorers(register):
    register(
        "bridge",
        bridge_scorer,
        "a_j by one forward-mode JVP along v; A and c from the same pass (--scorer-option debias=common: "
        "a_j - beta u_j, the warm-up's common direction removed)",
    )
    register(
        "atp",
        atp_scorer,
        "bridge's a, A, c plus B: each prompt token's effect on a_j by key-gate "
        "attribution (one reverse pass through the JVP; --scorer-option chunks=K for K passes, "
        "fast=1 for a compiled pass on Llama-family models)",
    )
    register("exact", exact_scorer, "diagnostic: a_j by one backward pass per response token (slow)")
