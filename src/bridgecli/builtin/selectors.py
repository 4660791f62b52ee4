"""Built-in selectors: the BRIDGE schedules over the attention-routed surrogate."""

from __future__ import annotations

from ..core.select import SelectionResult, Surrogate, select
from ..errors import FormatError, UsageError
from ..format.records import Example
from ..hookspecs import Plan, default_budgets, hookimpl


def surrogate_of(example: Example) -> Surrogate:
    s = example.scores
    if s is None:
        raise FormatError("the example has no scores", record=example.index, hint="run `bridge score` first")
    if s.B is not None:  # an interaction matrix from the scorer (e.g. ``atp``) replaces A x a
        return Surrogate.from_interactions(s.a.numpy("float64"), s.B.numpy("float64"))
    return Surrogate.from_scores(s.a.numpy("float64"), s.c.numpy("float64"), s.A.numpy("float64"))


class Schedule:
    """One of BRIDGE's schedules as a :class:`~bridgecli.hookspecs.Selector`: the default budgets,
    no first pass, protected tokens honoured, ranked by the surrogate (``--budget global`` can use it)."""

    protects = True
    surrogate = True
    #: its indices come from core.topk (top_b, top_b_forced): ascending and distinct, so select need not check them
    ascending_indices = True

    def __init__(self, name: str):
        self.name = name
        self.__name__ = f"select_{name.replace('-', '_')}"

    def parse(self, options: dict) -> dict:
        """Only -T (``rounds``) applies to the BRIDGE schedules: any other --option is a mistake."""
        for key in options:
            if key != "rounds" and not key.startswith("_"):
                raise UsageError(f"selector '{self.name}' has no option '{key}' (its only setting is -T/--rounds)")
        return {**options, "rounds": int(options.get("rounds", 4))}

    def needs_plan(self, options: dict) -> bool:
        return False

    def prepare(self, examples, rho_p: float, rho_r: float, options: dict) -> Plan:
        raise NotImplementedError("the BRIDGE schedules have no first pass (--budget global plans in the step)")

    def budgets(self, example: Example, rho_p: float, rho_r: float, options: dict) -> tuple[int, int]:
        return default_budgets(example, rho_p, rho_r)

    def __call__(self, example: Example, b_p: int, b_r: int, options: dict) -> SelectionResult:
        return select(
            surrogate_of(example),
            b_p,
            b_r,
            self.name,
            int(options.get("rounds", 4)),
            options.get("_protect_prompt"),
            options.get("_protect_response"),
        )


@hookimpl(trylast=True)
def register_selectors(register):
    register("bridge", Schedule("bridge"), "alternating coupled selection, T rounds (-T)")
    register("one-pass", Schedule("one-pass"), "one alternating round (T = 1)")
    register("independent", Schedule("independent"), "each side ranked by its full-state score")
