"""Built-in selectors that keep or leave out whole examples (docs/method.md, "Whole examples"):
``example-importance`` (a share of examples drawn leaning on their loss, with inverse-probability
loss weights) and ``rho-loss`` (the share of largest reducible loss, Mindermann et al. 2022).

Both save executed tokens, where the token-level selections with every prompt token kept do not: an
example left out has no training row. ``--rho-r`` is the share of examples kept (``ceil(rho_r * N)``
of the ``N`` examples with a response, :mod:`bridgecli.core.whole_examples`) and ``--rho-p`` must
be 1 (a kept example executes its whole prompt). The choice needs the whole stream, so both make it
in their first pass (:meth:`WholeExamples.prepare`), which the step records; each example then gets
budgets ``(m, n)`` (kept) or ``(0, 0)`` (left out).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from ..baselines.quantities import WARMUP, losses
from ..baselines.selector import Opt, parse_options
from ..core.select import SelectionResult
from ..core.whole_examples import draw_examples, kept_count, top_share
from ..core.sampling import ipw_weights
from ..errors import FormatError, UsageError
from ..format.records import Example
from ..contracts import first_pass_sees
from ..hookspecs import Plan, hookimpl
from .selectors import checkpoint_loss

#: the tag of the example-level draw's seed sequences: example k's sort key comes from ``(seed, index_k, 3)``
#: (``random`` uses sides 0 and 1, ``importance`` 2), the start from ``SeedSequence(seed, spawn_key=(3,))``
DRAW_TAG = 3
#: keys of the options the first pass adds for the per-example calls (``Plan.options``)
_WEIGHT_INDEX, _WEIGHT_VALUE = "_weight_index", "_weight_value"


class WholeExamples:
    """What both selectors share: options, the first pass, the per-example result. A subclass gives
    ``name``, ``OPTIONS``, :meth:`score` (one example's number, read in the first pass) and
    :meth:`choose` (the positions kept among the eligible examples, and what the plan adds)."""

    name = ""
    protects = False
    surrogate = False
    OPTIONS: dict[str, Opt] = {}

    def __init__(self) -> None:
        self.__name__ = f"select_{self.name.replace('-', '_')}"

    # -- options -------------------------------------------------------------------------------------
    def parse(self, options: dict) -> dict:
        out = parse_options(self.name, options, self.OPTIONS)
        self.validate(out)
        return out

    def validate(self, options: dict) -> None:
        """Refuse values the option types allow but the method does not (a one-line UsageError)."""

    def describe_options(self) -> str:
        return ", ".join(f"{k}={v.default}" for k, v in self.OPTIONS.items())

    # -- the first pass ------------------------------------------------------------------------------
    def needs_plan(self, options: dict) -> bool:
        return True

    def prepare(self, examples: Iterable[Example], rho_p: float, rho_r: float, options: dict) -> Plan:
        """Read every example once: its sizes and its score (examples with a response only), then keep
        ``ceil(rho_r * N)`` of the ``N`` with a response by :meth:`choose`."""
        if rho_p != 1.0:
            raise UsageError(
                f"--method {self.name} keeps or leaves out whole examples: pass --rho-p 1 (a kept example "
                f"executes its whole prompt); --rho-r is the share of examples kept"
            )
        seen: set[int] = set()
        index, sizes, scores, eligible = [], [], [], []
        for ex in examples:
            first_pass_sees(seen, ex)
            m, n = len(ex.tokens.prompt_positions()), len(ex.tokens.response_positions())
            index.append(ex.index)
            sizes.append((m, n, len(ex.tokens.input_ids), len(ex.tokens.eos_positions())))
            if n:
                eligible.append(len(index) - 1)
                scores.append(self.score(ex, options))
        k = kept_count(rho_r, len(eligible))
        idx = np.asarray(index, dtype=np.int64)
        elig = np.asarray(eligible, dtype=np.int64)
        chosen, extra, summary = self.choose(np.asarray(scores, dtype=np.float64), idx[elig], k, options)
        kept = np.zeros(len(index), dtype=bool)
        kept[elig[chosen]] = True
        budgets = {int(i): ((m, n) if keep else (0, 0)) for i, (m, n, _, _), keep in zip(index, sizes, kept)}
        table = np.asarray(sizes, dtype=np.int64).reshape(-1, 4)
        tokens, supervised = table[:, 2], table[:, 1] + table[:, 3]
        head = {
            "unit": "example",
            "examples": len(index),
            "with_response": len(eligible),
            "kept": int(kept.sum()),
            "count_rule": "ceil(rho_r x examples with a response)",
            "executed_tokens": int(tokens[kept].sum()),
            "tokens": int(tokens.sum()),
            "supervised_tokens": int(supervised[kept].sum()),
            "response_and_eos_tokens": int(supervised.sum()),
        }
        return Plan(budgets, {**head, **summary}, options=extra)

    def score(self, example: Example, options: dict) -> float:
        raise NotImplementedError

    def choose(
        self, scores: np.ndarray, indices: np.ndarray, k: int, options: dict
    ) -> tuple[np.ndarray, dict[str, Any], dict[str, Any]]:
        """``(positions kept among the eligible examples, options for the per-example calls, summary)``."""
        raise NotImplementedError

    def budgets(self, example: Example, rho_p: float, rho_r: float, options: dict) -> tuple[int, int]:
        raise UsageError(
            f"selector '{self.name}' chooses among all the stream's examples: its budgets come from its "
            "first pass (prepare), not from one example"
        )

    # -- one example ---------------------------------------------------------------------------------
    def __call__(self, example: Example, b_p: int, b_r: int, options: dict) -> SelectionResult:
        """The whole example (budgets ``(m, n)``) or nothing of it (``(0, 0)``). The response scores are
        1, so that ``bridge close`` (b_r = n, every unit's q(u) > 0) keeps every unit of a kept example
        and none of an example left out."""
        m, n = len(example.tokens.prompt_positions()), len(example.tokens.response_positions())
        ones = np.ones(n)
        if (b_p, b_r) == (0, 0):
            return SelectionResult(prompt=np.zeros(0, np.int64), response=np.zeros(0, np.int64), response_scores=ones)
        if (b_p, b_r) != (m, n):
            raise FormatError(
                f"selector '{self.name}' keeps whole examples: budgets {b_p}/{b_r} are neither {m}/{n} nor 0/0",
                record=example.index,
            )
        weights = None
        where = options.get(_WEIGHT_INDEX)
        if where is not None:
            at = int(np.searchsorted(where, example.index))
            if at == len(where) or where[at] != example.index:
                raise FormatError(f"selector '{self.name}': this example was not drawn", record=example.index)
            weights = np.full(n, float(options[_WEIGHT_VALUE][at]))
        return SelectionResult(
            prompt=np.arange(m, dtype=np.int64),
            response=np.arange(n, dtype=np.int64),
            response_scores=ones,
            response_weights=weights,
        )


def _mean_loss(example: Example) -> float:
    """The scoring checkpoint's mean per-token loss over the example's response (``scores.loss``)."""
    hint = "score the data with `bridge score`, which stores it, or pass --option by=uniform"
    value = float(checkpoint_loss(example, hint).mean())
    if not np.isfinite(value):
        raise FormatError("the per-token loss is not finite", record=example.index, field="scores.loss")
    return max(value, 0.0)


class ExampleImportance(WholeExamples):
    """Whole examples drawn with inclusion probabilities that lean on a per-example tilt (by=loss: the
    scoring checkpoint's mean response loss; by=uniform: none) and keep a uniform ``floor`` share;
    with ``weights=ipw`` every supervised token of a kept example weighs ``(k / N) / pi_i``, so the
    expected weighted loss of a kept example is full SFT's mean over all examples."""

    name = "example-importance"
    OPTIONS = {
        "by": Opt(
            "loss",
            "tilt per example: loss (the scoring checkpoint's mean response loss, scores.loss) or uniform",
            ("loss", "uniform"),
        ),
        "floor": Opt(0.5, "uniform share of the inclusion probabilities, in [0, 1] (1: a uniform draw)"),
        "weights": Opt("ipw", "ipw: loss weights (k/N)/pi (unbiased for full SFT); none: no weights", ("ipw", "none")),
        "seed": Opt(42, "random seed of the draw (sort keys from (seed, index, 3), the start from the seed)"),
    }

    def validate(self, options: dict) -> None:
        if not 0.0 <= options["floor"] <= 1.0:
            raise UsageError(f"--option floor must lie in [0, 1], got {options['floor']}")
        if not 0 <= options["seed"] < 2**32:
            raise UsageError(f"--option seed must lie in [0, 2^32), got {options['seed']}")

    def score(self, example: Example, options: dict) -> float:
        return _mean_loss(example) if options["by"] == "loss" else 0.0

    def choose(
        self, scores: np.ndarray, indices: np.ndarray, k: int, options: dict
    ) -> tuple[np.ndarray, dict[str, Any], dict[str, Any]]:
        seed = options["seed"]
        keys = np.array([np.random.default_rng([seed, int(i), DRAW_TAG]).random() for i in indices])
        u = float(np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(DRAW_TAG,))).random())
        floor = 1.0 if options["by"] == "uniform" else options["floor"]
        pi, chosen = draw_examples(scores, k, floor, keys, u)
        summary: dict[str, Any] = {"by": options["by"], "floor": floor, "seed": seed, "weights": options["weights"]}
        extra: dict[str, Any] = {}
        if len(pi):
            summary["inclusion_range"] = [float(pi.min()), float(pi.max())]
        # equal probabilities (by=uniform, floor 1, every example kept, equal tilts) weigh every example
        # (k / N) / (k / N) = 1: no weights to write
        if options["weights"] == "ipw" and len(chosen) and pi.max() > pi.min():
            w = ipw_weights(pi, chosen, len(chosen))
            order = np.argsort(indices[chosen], kind="stable")  # by example index, for the lookup per example
            extra = {_WEIGHT_INDEX: indices[chosen][order], _WEIGHT_VALUE: w[order]}
            summary["weight_range"] = [float(w.min()), float(w.max())]
        return chosen, extra, summary


class RhoLoss(WholeExamples):
    """The examples of largest reducible loss: the mean response loss under the base model theta_old
    (``cur``) minus that under the warm-up checkpoint (``ref``, the irreducible-loss model of RHO-LOSS).
    Deterministic, no weights; ties go to the smaller example index."""

    name = "rho-loss"
    OPTIONS = {
        "cur": Opt("base", "the training loss's model: the base model theta_old (bridge reference --as base)"),
        "ref": Opt(WARMUP, "the irreducible-loss model (default: the warm-up checkpoint, else scores.loss)"),
    }

    def score(self, example: Example, options: dict) -> float:
        cur = losses(example, options["cur"], "response").mean()
        ref = losses(example, options["ref"], "response").mean()
        value = float(cur - ref)
        if not np.isfinite(value):
            raise FormatError("the reducible loss is not finite", record=example.index, field="references")
        return value

    def prepare(self, examples: Iterable[Example], rho_p: float, rho_r: float, options: dict) -> Plan:
        sources: dict[str, int] = {}

        def counted(stream: Iterable[Example]) -> Iterable[Example]:
            for ex in stream:
                ref = ex.references.get(options["ref"])
                where = f"references.{options['ref']}" if ref is not None and ref.response_loss is not None else None
                if where is None and options["ref"] == WARMUP:
                    where = "scores.loss"
                if where is not None and len(ex.tokens.response_positions()):
                    sources[where] = sources.get(where, 0) + 1
                yield ex

        plan = super().prepare(counted(examples), rho_p, rho_r, options)
        plan.summary["ref_losses_from"] = sources
        return plan

    def choose(
        self, scores: np.ndarray, indices: np.ndarray, k: int, options: dict
    ) -> tuple[np.ndarray, dict[str, Any], dict[str, Any]]:
        chosen = top_share(scores, indices, k)
        summary: dict[str, Any] = {"cur": options["cur"], "ref": options["ref"]}
        if len(scores):
            summary["reducible_loss_mean"] = float(scores.mean())
        if len(chosen):
            summary["reducible_loss_kept_mean"] = float(scores[chosen].mean())
            summary["threshold"] = float(scores[chosen].min())
        return chosen, {}, summary


@hookimpl(trylast=True)
def register_selectors(register):
    imp, rho = ExampleImportance(), RhoLoss()
    register(
        "example-importance",
        imp,
        "whole examples: a share (--rho-r, with --rho-p 1) drawn leaning on each example's mean response loss, "
        f"with a uniform floor, loss weights (k/N)/pi (unbiased) [options: {imp.describe_options()}]",
    )
    register(
        "rho-loss",
        rho,
        "whole examples: RHO-LOSS, the share (--rho-r, with --rho-p 1) of largest reducible loss, the mean "
        f"response loss under the base model minus under the warm-up checkpoint [options: {rho.describe_options()}]",
    )
