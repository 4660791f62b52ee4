"""Built-in selectors: the BRIDGE schedules over the attention-routed surrogate."""

from __future__ import annotations

import numpy as np

from ..baselines.selector import Opt, parse_options
from ..contracts import default_budgets
from ..core.sampling import inclusion_probabilities, ipw_weights, systematic_sample
from ..core.select import SelectionResult, alternate, select, surrogate_of
from ..core.stratify import strata_of
from ..errors import FormatError, UsageError
from ..format.records import Example
from ..hookspecs import Plan, hookimpl


def checkpoint_loss(example: Example, hint: str | None = None) -> np.ndarray:
    """The scoring checkpoint's per-token loss over ``example``'s response (``scores.loss``), as float64,
    what ``--option by=loss`` tilts by; a FormatError naming the record and the field where the stream
    holds none (``hint``: what to do about it)."""
    loss = example.scores.loss if example.scores is not None else None
    if loss is None:
        raise FormatError(
            "--option by=loss needs the scoring checkpoint's per-token loss (scores.loss)",
            record=example.index,
            field="scores.loss",
            hint=hint,
        )
    return loss.numpy("float64")


class Schedule:
    """One of BRIDGE's schedules as a :class:`~bridgecli.hookspecs.Selector`: the default budgets,
    no first pass, protected tokens honoured, ranked by the surrogate (``--budget global`` can use it)."""

    protects = True
    surrogate = True

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


class Importance(Schedule):
    """BRIDGE's prompt side with a sampled response side (docs/method.md, "Importance sampling").

    The prompt keeps S_p of the alternating schedule (T rounds); the response draws exactly
    ``min(b_r, n)`` tokens by systematic sampling with inclusion probabilities that rise with a tilt
    score and keep a uniform ``floor`` share (:mod:`bridgecli.core.sampling`). With ``weights=ipw`` each
    drawn token's loss is weighted by ``(b_r / n) / pi_j``: the expected weighted gradient is that of a
    uniform random draw of the same size (unbiased for full SFT), while the draw leans toward the tokens
    the tilt ranks high. ``weights=none`` keeps the tilt in the expectation instead."""

    protects = False
    surrogate = False
    OPTIONS = {
        "by": Opt(
            "abs",
            "tilt score: abs |Delta_r|, pos max(Delta_r, 0), loss (the scoring checkpoint's loss)",
            ("abs", "pos", "loss"),
        ),
        "floor": Opt(0.5, "uniform share of the inclusion probabilities, in [0, 1] (1: uniform random)"),
        "weights": Opt(
            "ipw", "ipw: loss weights 1/pi (unbiased); none: no weights (biased toward the tilt)", ("ipw", "none")
        ),
        "seed": Opt(42, "random seed; example k draws from the seed sequence (seed, index_k, 2)"),
    }

    def __init__(self) -> None:
        super().__init__("importance")
        self.__name__ = "select_importance"

    def parse(self, options: dict) -> dict:
        out = parse_options(self.name, options, self.OPTIONS, also=", and -T")
        if not 0.0 <= out["floor"] <= 1.0:
            raise UsageError(f"--option floor must lie in [0, 1], got {out['floor']}")
        if not 0 <= out["seed"] < 2**32:
            raise UsageError(f"--option seed must lie in [0, 2^32), got {out['seed']}")
        return {**out, "rounds": int(options.get("rounds", 4))}

    def describe_options(self) -> str:
        return ", ".join(f"{k}={v.default}" for k, v in self.OPTIONS.items())

    def __call__(self, example: Example, b_p: int, b_r: int, options: dict) -> SelectionResult:
        sur = surrogate_of(example)
        res = select(sur, b_p, b_r, "bridge", int(options.get("rounds", 4)))
        delta_r = res.response_scores
        by = options.get("by", "abs")
        if by == "loss":
            tilt = checkpoint_loss(example)
        else:
            tilt = np.abs(delta_r) if by == "abs" else np.maximum(delta_r, 0.0)
        if not np.isfinite(tilt).all():
            raise FormatError("the tilt scores are not finite", record=example.index, field="scores")
        n = sur.n
        b = min(b_r, n)
        pi = inclusion_probabilities(tilt, b, float(options.get("floor", 0.5)))
        u = float(np.random.default_rng([int(options.get("seed", 42)), example.index, 2]).random())
        chosen = systematic_sample(pi, u)
        weights = ipw_weights(pi, chosen, b) if options.get("weights", "ipw") == "ipw" else None
        return SelectionResult(
            prompt=res.prompt,
            response=chosen,
            response_scores=delta_r,
            u_sur=[sur.u_sur(res.prompt, chosen)],
            response_weights=weights,
        )


class Stratified(Schedule):
    """BRIDGE's alternating schedule with a response budget per token class (docs/method.md,
    "Stratified budget"): every response update keeps each class's share of b_r (answer, digits, math,
    words, newline, other space/punct; shares in proportion to the class's tokens in the example, by
    largest remainder), the best Delta_r within each. The classes keep the coverage of a uniform draw,
    which BRIDGE's top-b loses (it keeps or drops whole token types), while a_j ranks within each."""

    protects = False
    surrogate = False

    def __init__(self) -> None:
        super().__init__("stratified")

    def __call__(self, example: Example, b_p: int, b_r: int, options: dict) -> SelectionResult:
        from ..analysis.tokenclass import response_strata

        sur = surrogate_of(example)
        spans = example.tokens.spans()[example.tokens.response_positions()]
        _, strata = strata_of(response_strata(example.text, spans))
        return alternate(sur, b_p, b_r, int(options.get("rounds", 4)), strata=strata)


@hookimpl(trylast=True)
def register_selectors(register):
    register("bridge", Schedule("bridge"), "alternating coupled selection, T rounds (-T)")
    register("one-pass", Schedule("one-pass"), "one alternating round (T = 1)")
    register("independent", Schedule("independent"), "each side ranked by its full-state score")
    register(
        "stratified",
        Stratified(),
        "BRIDGE's schedule with a response budget per token class (answer, digits, math, words, newline, "
        "other), the best Delta_r within each (-T)",
    )
    imp = Importance()
    register(
        "importance",
        imp,
        "BRIDGE's prompt side; response tokens sampled with probabilities rising with |Delta_r| and a uniform "
        f"floor, loss weights 1/pi (unbiased) [options: {imp.describe_options()}]",
    )
