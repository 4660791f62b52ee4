"""A compared method as a ``bridge select`` selector: per-token scores, declared budgets, top-b.

:class:`Baseline` is a :class:`bridgecli.hookspecs.Selector`: ``parse`` converts the ``--option``
values once (every other method takes what it returns); ``prepare`` is the first pass over the
stream for budgets that depend on the whole stream (the total-token matching rule, global or batch
ranking) and returns the :class:`~bridgecli.hookspecs.Plan`; ``budgets`` declares the per-example
budgets when there is no plan (the step checks the result against them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from ..core.budgets import budget
from ..core.select import SelectionResult
from ..core.topk import top_b, top_b_forced
from ..errors import FormatError, UsageError
from ..format.records import Example
from ..contracts import first_pass_sees
from ..hookspecs import Plan
from ..optionspec import switch
from .matching import MATCH_RULES, matched_budgets, rank_across

#: keys ``bridge select`` itself puts into ``options`` (not the user's)
STEP_KEYS = ("rounds",)

Score = Callable[[Example, dict], np.ndarray]


@dataclass(frozen=True)
class Opt:
    default: Any
    help: str
    choices: tuple[str, ...] | None = None


def convert_option(name: str, raw: Any, spec: Opt) -> Any:
    """The ``--option name=raw`` value as ``spec``'s type, checked against its choices (one-line UsageError)."""
    kind = type(spec.default)
    try:
        if kind is bool and isinstance(raw, str):
            value = switch(raw)
            if value is None:
                raise ValueError(raw)
        else:
            value = kind(raw)
    except (TypeError, ValueError):
        raise UsageError(f"--option {name}={raw}: expected a {kind.__name__}") from None
    if spec.choices is not None and value not in spec.choices:
        raise UsageError(f"--option {name}={raw}: choose one of {', '.join(spec.choices)}")
    return value


def parse_options(selector: str, options: dict | None, spec: dict[str, Opt], also: str = "") -> dict:
    """Every option of ``spec`` at its default, the user's ``--option`` values in ``options`` converted
    over them (:func:`convert_option`); the keys ``bridge select`` itself adds (:data:`STEP_KEYS`, and
    ``_``-prefixed ones of a first pass) are passed over. A key ``spec`` lacks is a one-line UsageError
    naming ``selector``'s options (``also``: what it takes besides them, e.g. ``", and -T"``)."""
    out = {k: s.default for k, s in spec.items()}
    for key, raw in (options or {}).items():
        if key in STEP_KEYS or key.startswith("_"):
            continue
        if key not in spec:
            known = ", ".join(spec) or "none"
            raise UsageError(f"selector '{selector}' has no option '{key}' (its options: {known}{also})")
        out[key] = convert_option(key, raw, spec[key])
    return out


@dataclass
class Baseline:
    """One compared method. ``prompt_score``/``response_score`` give the per-token scores of the side(s)
    the method selects (None: that side is kept whole); the top-b tokens by score are kept (ties: the
    earlier position). ``joint`` methods rank both sides together under the total b_p + b_r."""

    name: str
    scope: str  # "both", "prompt" or "response"
    prompt_score: Score | None = None
    response_score: Score | None = None
    options: dict[str, Opt] = field(default_factory=dict)
    rankings: tuple[str, ...] = ("sample",)
    joint: Callable[[Example, dict], tuple[np.ndarray, np.ndarray]] | None = None
    validate: Callable[[dict], None] | None = None

    def __post_init__(self):
        spec = dict(self.options)
        if self.scope != "both":
            spec.setdefault("match", Opt("tokens", "budget matching rule for the side kept whole", MATCH_RULES))
        if len(self.rankings) > 1:
            spec.setdefault(
                "ranking",
                Opt(
                    self.rankings[0],
                    "rank response tokens per sample, over the whole stream, or per batch of consecutive examples",
                    self.rankings,
                ),
            )
            if "batch" in self.rankings:
                spec.setdefault("batch", Opt(64, "examples per batch for ranking=batch"))
        self.options = spec
        self.__name__ = f"select_{self.name.replace('-', '_').replace('+', '_')}"

    # -- options -------------------------------------------------------------------------------
    def parse(self, options: dict) -> dict:
        out = parse_options(self.name, options, self.options)
        if out.get("ranking") == "batch" and out["batch"] < 1:
            raise UsageError(f"--option batch must be >= 1, got {out['batch']}")
        if self.validate is not None:
            self.validate(out)
        return out

    # -- budgets -------------------------------------------------------------------------------
    surrogate = False  # ranks by its own scores, not BRIDGE's surrogate

    def needs_plan(self, o: dict) -> bool:
        """Whether the budgets depend on the whole stream (``o``: what :meth:`parse` returned)."""
        return (self.scope != "both" and o.get("match") == "tokens") or o.get("ranking", "sample") != "sample"

    def prepare(self, examples: Iterable[Example], rho_p: float, rho_r: float, o: dict) -> Plan:
        """The first pass: every example's budgets under the matching rule and the ranking."""
        indices, sizes, scores = [], [], []
        seen: set[int] = set()
        for ex in examples:
            first_pass_sees(seen, ex)
            indices.append(ex.index)
            sizes.append((len(ex.tokens.prompt_positions()), len(ex.tokens.response_positions())))
            if o.get("ranking", "sample") != "sample":
                scores.append(self._response_scores(ex, o))
        plan = matched_budgets(sizes, rho_p, rho_r, self.scope, o.get("match", "tokens"))
        budgets = plan.budgets
        summary = dict(plan.summary)
        ranking = o.get("ranking", "sample")
        if ranking != "sample":
            group = o["batch"] if ranking == "batch" else None
            counts = rank_across(scores, [b for _, b in budgets], group)
            budgets = [(bp, c) for (bp, _), c in zip(budgets, counts)]
            summary["ranking"] = ranking
            if group is not None:
                summary["batch"] = group
        return Plan(dict(zip(indices, budgets)), summary)

    def budgets(self, example: Example, rho_p: float, rho_r: float, o: dict) -> tuple[int, int]:
        """The budgets without a first pass (a direct call, or options that need none)."""
        m, n = len(example.tokens.prompt_positions()), len(example.tokens.response_positions())
        if self.joint is not None and o.get("joint", True):
            p, r = self._joint_pick(example, o, budget(rho_p, m) + budget(rho_r, n))
            return len(p), len(r)
        if self.scope != "both":
            # without a first pass (a direct call): the total-token rule over this one example
            return matched_budgets([(m, n)], rho_p, rho_r, self.scope, o.get("match", "tokens")).budgets[0]
        return budget(rho_p, m), budget(rho_r, n)

    # -- selection -----------------------------------------------------------------------------
    def _response_scores(self, example: Example, o: dict) -> np.ndarray:
        """Response scores rounded to float32 (as stored in the stream), so that the first pass of a
        cross-example ranking and the per-example selection rank exactly the same values."""
        n = len(example.tokens.response_positions())
        if self.response_score is None:
            return np.ones(n)
        return np.asarray(self.response_score(example, o), dtype=np.float32).astype(np.float64)

    def _joint_pick(self, example: Example, o: dict, total: int, scores=None) -> tuple[np.ndarray, np.ndarray]:
        if scores is None:
            assert self.joint is not None  # callers check
            scores = self.joint(example, o)
        p_scores, r_scores = scores
        m = len(p_scores)
        picked = top_b(np.concatenate([p_scores, r_scores]), total)
        return picked[picked < m], picked[picked >= m] - m

    def __call__(self, example: Example, b_p: int, b_r: int, o: dict) -> SelectionResult:
        m = len(example.tokens.prompt_positions())
        if self.joint is not None:
            p_scores, r_scores = self.joint(example, o)
            if o.get("joint", True):
                prompt, response = self._joint_pick(example, o, b_p + b_r, (p_scores, r_scores))
                if len(prompt) != b_p or len(response) != b_r:
                    raise FormatError(
                        f"selector '{self.name}': joint ranking gave {len(prompt)}/{len(response)} "
                        f"tokens for declared budgets {b_p}/{b_r}",
                        record=example.index,
                    )
            else:
                prompt, response = top_b(p_scores, b_p), top_b(r_scores, b_r)
            return SelectionResult(prompt=prompt, response=response, response_scores=r_scores)
        p_scores = self.prompt_score(example, o) if self.prompt_score is not None else np.ones(m)
        r_scores = self._response_scores(example, o)
        # protected tokens (select --protect-*): kept / supervised always, the rest by the method's ranking
        return SelectionResult(
            prompt=top_b_forced(p_scores, b_p, o.get("_protect_prompt")),
            response=top_b_forced(r_scores, b_r, o.get("_protect_response")),
            response_scores=r_scores,
        )

    @property
    def protects(self) -> bool:
        """Whether ``select --protect-prompt/--protect-response`` can be honoured (not by a joint ranking,
        whose split between the sides is part of the method)."""
        return self.joint is None

    def describe_options(self) -> str:
        return ", ".join(f"{k}={v.default}" for k, v in self.options.items())
