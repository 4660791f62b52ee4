"""BRIDGE's budgeted alternating selection (paper Algorithm 1; docs/method.md, "Selection").

All quantities are per example, over eligible positions only:

- ``a``  [n]     response utility a_j
- ``c``  [n]     history mass c_j
- ``A``  [n, m]  response-to-prompt attention rows A[j, i]

beta[j, i] = A[j, i] * a_j and gamma_j = a_j * c_j (stored transposed relative to the paper's
beta[i, j], so rows are response tokens like ``A``).

Delta_p(i | S_r) = sum_{j in S_r} beta[j, i]
Delta_r(j | S_p) = gamma_j + sum_{i in S_p} beta[j, i]
U_sur(S_p, S_r)  = sum_{j in S_r} Delta_r(j | S_p)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..errors import FormatError
from .stratify import top_b_stratified
from .topk import top_b_forced

if TYPE_CHECKING:
    from ..format.records import Example

SCHEDULES = ("bridge", "one-pass", "independent")


@dataclass(frozen=True)
class Surrogate:
    """The precomputed interaction surrogate of one example."""

    beta: np.ndarray  # [n, m]
    gamma: np.ndarray  # [n]

    @classmethod
    def from_interactions(cls, a: np.ndarray, B: np.ndarray) -> "Surrogate":
        """The surrogate of an interaction matrix B [n, m] (B[j, i]: the effect of prompt token i on
        a_j): beta = B and gamma_j = a_j - sum_i B[j, i], so Delta_r(j | S_p) = a_j - sum_{i not in
        S_p} B[j, i] (a_j under the reduced prompt, to first order) and Delta_p(i | S_r) = sum_{j in
        S_r} B[j, i]."""
        a = np.asarray(a, dtype=np.float64)
        B = np.asarray(B, dtype=np.float64)
        if B.ndim != 2:
            B = B.reshape(a.shape[0], -1)
        if B.shape[0] != a.shape[0]:
            raise ValueError(f"B has shape {B.shape}, expected [{a.shape[0]}, m]")
        return cls(beta=B, gamma=a - B.sum(axis=1))

    @classmethod
    def from_scores(cls, a: np.ndarray, c: np.ndarray, A: np.ndarray) -> "Surrogate":
        a = np.asarray(a, dtype=np.float64)
        c = np.asarray(c, dtype=np.float64)
        A = np.asarray(A, dtype=np.float64)
        if A.ndim != 2:  # a 2-D [n, m] A is used as is: reshape(n, -1) fails when n == 0
            A = A.reshape(a.shape[0], -1)
        if c.shape != a.shape:
            raise ValueError(f"c has shape {c.shape}, a has {a.shape}")
        if A.shape[0] != a.shape[0]:
            raise ValueError(f"A has shape {A.shape}, expected [{a.shape[0]}, m]")
        return cls(beta=A * a[:, None], gamma=a * c)

    @property
    def n(self) -> int:
        return self.beta.shape[0]

    @property
    def m(self) -> int:
        return self.beta.shape[1]

    def delta_p(self, s_r: np.ndarray) -> np.ndarray:
        """Delta_p(. | S_r) for every eligible prompt position."""
        return self.beta[np.asarray(s_r, dtype=np.int64)].sum(axis=0)

    def delta_r(self, s_p: np.ndarray) -> np.ndarray:
        """Delta_r(. | S_p) for every eligible response position."""
        return self.gamma + self.beta[:, np.asarray(s_p, dtype=np.int64)].sum(axis=1)

    def u_sur(self, s_p: np.ndarray, s_r: np.ndarray) -> float:
        return float(self.delta_r(s_p)[np.asarray(s_r, dtype=np.int64)].sum())


def surrogate_of(example: Example) -> Surrogate:
    """The surrogate of a scored example: from the scorer's interaction matrix B when it gave one
    (e.g. ``atp``), else from a, c and A."""
    s = example.scores
    if s is None:
        raise FormatError("the example has no scores", record=example.index, hint="run `bridge score` first")
    if s.B is not None:  # an interaction matrix from the scorer replaces A x a
        return Surrogate.from_interactions(s.a.numpy("float64"), s.B.numpy("float64"))
    return Surrogate.from_scores(s.a.numpy("float64"), s.c.numpy("float64"), s.A.numpy("float64"))


@dataclass
class SelectionResult:
    """Indices into the eligible prompt / response positions (sorted), the response scores the
    closure step projects, U_sur after every update, and (a sampled selection) the loss weight of
    each chosen response token, in ``response``'s order."""

    prompt: np.ndarray
    response: np.ndarray
    response_scores: np.ndarray
    u_sur: list[float] = field(default_factory=list)
    response_weights: np.ndarray | None = None


def alternate(
    sur: Surrogate,
    b_p: int,
    b_r: int,
    rounds: int,
    forced_p: np.ndarray | None = None,
    forced_r: np.ndarray | None = None,
    strata: np.ndarray | None = None,
) -> SelectionResult:
    """S_r(0) = Top_{b_r}(gamma); then ``rounds`` times: S_p = Top_{b_p} Delta_p(.|S_r),
    S_r = Top_{b_r} Delta_r(.|S_p). Each update maximises U_sur exactly over one side, so the
    recorded U_sur values never decrease.

    ``forced_p`` / ``forced_r`` (indices into the eligible positions) are protected tokens: every
    update keeps them and fills the rest of the budget by the same ranking (they count against the
    budget; when they alone exceed it, the side holds exactly them). Each update is then the exact
    maximiser of U_sur over the sets that contain them, so U_sur still never decreases.

    ``strata`` (a stratum index per response position) makes every response update keep each stratum's
    share of b_r (:func:`~bridgecli.core.stratify.top_b_stratified`): the exact maximiser of U_sur over the
    sets with those per-stratum sizes, so U_sur never decreases either (not with ``forced_r``)."""
    if rounds < 1:
        raise ValueError("the alternating schedule needs at least one round (T >= 1)")
    if strata is not None and forced_r is not None and len(forced_r):
        raise ValueError("protected response tokens and strata do not combine")
    beta, gamma = sur.beta, sur.gamma
    if strata is None:
        pick_r = lambda scores: top_b_forced(scores, b_r, forced_r)  # noqa: E731
    else:
        pick_r = lambda scores: top_b_stratified(scores, strata, b_r)  # noqa: E731
    s_r = pick_r(gamma)
    history: list[float] = []
    for done in range(1, rounds + 1):
        # Delta_p(. | S_r) and Delta_r(. | S_p): the very expressions of Surrogate.delta_p / delta_r
        s_p = top_b_forced(beta[s_r].sum(axis=0), b_p, forced_p)
        delta_r = gamma + beta[:, s_p].sum(axis=1)
        before = float(delta_r[s_r].sum())  # U_sur(s_p, s_r)
        new_r = pick_r(delta_r)
        after = float(delta_r[new_r].sum())
        history += (before, after)
        if new_r.tobytes() == s_r.tobytes():
            # a fixed point: every later round starts from this S_r again, so it computes the same S_p,
            # Delta_r and U_sur values as this one
            history += (before, after) * (rounds - done)
            break
        s_r = new_r
    return SelectionResult(prompt=s_p, response=new_r, response_scores=delta_r, u_sur=history)


def independent(
    sur: Surrogate, b_p: int, b_r: int, forced_p: np.ndarray | None = None, forced_r: np.ndarray | None = None
) -> SelectionResult:
    """Each side ranked by its full-state score: Delta_p(. | all R), Delta_r(. | all P)."""
    s_p = top_b_forced(sur.delta_p(np.arange(sur.n)), b_p, forced_p)
    delta_full = sur.delta_r(np.arange(sur.m))
    s_r = top_b_forced(delta_full, b_r, forced_r)
    return SelectionResult(prompt=s_p, response=s_r, response_scores=delta_full, u_sur=[sur.u_sur(s_p, s_r)])


def select(
    sur: Surrogate,
    b_p: int,
    b_r: int,
    schedule: str = "bridge",
    rounds: int = 4,
    forced_p: np.ndarray | None = None,
    forced_r: np.ndarray | None = None,
) -> SelectionResult:
    if schedule == "bridge":
        return alternate(sur, b_p, b_r, rounds, forced_p, forced_r)
    if schedule == "one-pass":
        return alternate(sur, b_p, b_r, 1, forced_p, forced_r)
    if schedule == "independent":
        return independent(sur, b_p, b_r, forced_p, forced_r)
    raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
