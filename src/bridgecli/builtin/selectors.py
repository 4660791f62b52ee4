"""Built-in selectors: the BRIDGE schedules over the attention-routed surrogate."""

from __future__ import annotations

from ..core.select import SelectionResult, Surrogate, select
from ..errors import FormatError, UsageError
from ..format.records import Example
from ..hookspecs import hookimpl


def surrogate_of(example: Example) -> Surrogate:
    s = example.scores
    if s is None:
        raise FormatError("the example has no scores", record=example.index, hint="run `bridge score` first")
    if s.B is not None:  # an interaction matrix from the scorer (e.g. ``atp``) replaces A x a
        return Surrogate.from_interactions(s.a.numpy("float64"), s.B.numpy("float64"))
    return Surrogate.from_scores(s.a.numpy("float64"), s.c.numpy("float64"), s.A.numpy("float64"))


def _schedule(name: str):
    def run(example: Example, b_p: int, b_r: int, options: dict) -> SelectionResult:
        return select(surrogate_of(example), b_p, b_r, name, int(options.get("rounds", 4)),
                      options.get("_protect_prompt"), options.get("_protect_response"))

    def parse(options: dict) -> dict:
        """Only -T (``rounds``) applies to the BRIDGE schedules: any other --option is a mistake."""
        for key in options:
            if key != "rounds" and not key.startswith("_"):
                raise UsageError(f"selector '{name}' has no option '{key}' (its only setting is -T/--rounds)")
        return options

    run.__name__ = f"select_{name.replace('-', '_')}"
    run.protects = True  # honours select --protect-prompt / --protect-response
    run.surrogate = True  # ranks by BRIDGE's surrogate: select --budget global can use it
    run.parse = parse
    return run


@hookimpl(trylast=True)
def register_selectors(register):
    register("bridge", _schedule("bridge"), "alternating coupled selection, T rounds (-T)")
    register("one-pass", _schedule("one-pass"), "one alternating round (T = 1)")
    register("independent", _schedule("independent"), "each side ranked by its full-state score")
