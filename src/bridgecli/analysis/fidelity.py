"""Selection-level fidelity of the interaction surrogate (paper section "Selection-Level Fidelity",
Table 2): proxies of the state-conditioned scores against exact references, per side.

Everything here is over eligible positions (rows: response tokens, columns: prompt tokens, as in
the stream format). For one example at retained states S_p (prompt) and S_r (response):

prompt side, over every eligible prompt token i:
    exact          sum_{j in S_r} [a_j(P) - a_j(P without i)]   (length-preserving perturbation)
    attention      sum_{j in S_r} A[j, i]
    attention x a  sum_{j in S_r} A[j, i] a_j                   = Delta_p(i | S_r), BRIDGE
response side, over every eligible response token j:
    exact          a_j(S_p)   (a_j recomputed with the prompt reduced to S_p)
    attention      c_j + sum_{i in S_p} A[j, i]
    attention x a  a_j (c_j + sum_{i in S_p} A[j, i])           = Delta_r(j | S_p), BRIDGE

A scorer plugin passed as an extra proxy contributes its own (a, c, A) through the BRIDGE formula, or,
when it writes an interaction matrix B (the ``atp`` scorer), B as ``select`` uses it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .metrics import Agreement, agreement, summary

SIDES = ("prompt", "response")
ATTENTION = "attention"
BRIDGE = "attention x a"
METRICS = ("spearman", "overlap", "jaccard", "regret")
METRIC_TITLES = {"spearman": "Spearman", "overlap": "Top-b overlap", "jaccard": "Jaccard", "regret": "Norm. regret"}

#: Table 2 of the paper: 200 MetaMathQA examples, Llama-3.2-3B warmup checkpoint, rho_p = rho_r = 0.75.
#: (mean, std) pairs where the paper gives a std, else (value, None).
_PAPER_ROWS = {
    # side and proxy: Spearman (mean, std), top-b overlap (mean, std), Jaccard, normalised regret
    ("prompt", ATTENTION): ((-0.0528, 0.1830), (0.7094, 0.0353), 0.5509, 0.5905),
    ("prompt", BRIDGE): ((0.9123, 0.1922), (0.9462, 0.0372), 0.9192, 0.0347),
    ("response", ATTENTION): ((-0.0409, 0.1170), (0.7639, 0.0262), 0.6187, 0.5182),
    ("response", BRIDGE): ((0.9463, 0.0376), (0.9667, 0.0188), 0.9362, 0.0251),
}
PAPER_TABLE2 = {
    key: {"spearman": spearman, "overlap": overlap, "jaccard": (jaccard, None), "regret": (regret, None)}
    for key, (spearman, overlap, jaccard, regret) in _PAPER_ROWS.items()
}
PAPER_SETTING = "paper Table 2: 200 MetaMathQA examples, Llama-3.2-3B warmup checkpoint, rho_p = rho_r = 0.75"


def prompt_proxies(a: np.ndarray, A: np.ndarray, s_r: np.ndarray) -> dict[str, np.ndarray]:
    """The built-in prompt-side proxies at retained responses ``s_r`` (indices into rows of A)."""
    a = np.asarray(a, dtype=np.float64)
    A = np.asarray(A, dtype=np.float64)
    s_r = np.asarray(s_r, dtype=np.int64)
    return {ATTENTION: A[s_r].sum(axis=0), BRIDGE: (A[s_r] * a[s_r, None]).sum(axis=0)}


def response_proxies(a: np.ndarray, c: np.ndarray, A: np.ndarray, s_p: np.ndarray) -> dict[str, np.ndarray]:
    """The built-in response-side proxies at retained prompt ``s_p`` (indices into columns of A)."""
    a = np.asarray(a, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    A = np.asarray(A, dtype=np.float64)
    routed = c + A[:, np.asarray(s_p, dtype=np.int64)].sum(axis=1)
    return {ATTENTION: routed, BRIDGE: a * routed}


def interaction_proxies(
    a: np.ndarray, B: np.ndarray, s_r: np.ndarray, s_p: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A scorer's interaction matrix B [n, m] as ``select`` uses it: (Delta_p(. | S_r), Delta_r(. | S_p))
    with beta = B and gamma = a - B.sum(1)."""
    from ..core.select import Surrogate

    sur = Surrogate.from_interactions(a, B)
    return sur.delta_p(s_r), sur.delta_r(s_p)


def exact_prompt(beta_exact: np.ndarray, s_r: np.ndarray) -> np.ndarray:
    """sum_{j in S_r} beta_exact[j, i], with beta_exact[j, i] = a_j(P) - a_j(P without i)."""
    return np.asarray(beta_exact, dtype=np.float64)[np.asarray(s_r, dtype=np.int64)].sum(axis=0)


@dataclass
class ExampleFidelity:
    """The per-example result: agreement of every proxy with the exact reference, per side."""

    id: str
    index: int
    m: int
    n: int
    b_p: int
    b_r: int
    sides: dict[str, dict[str, Agreement]] = field(default_factory=dict)
    seconds: float | None = None

    def as_dict(self) -> dict:
        return {
            "id": self.id,
            "index": self.index,
            "m": self.m,
            "n": self.n,
            "b_p": self.b_p,
            "b_r": self.b_r,
            "seconds": self.seconds,
            "sides": {
                side: {proxy: ag.as_dict() for proxy, ag in proxies.items()} for side, proxies in self.sides.items()
            },
        }


def evaluate(proxies: dict[str, np.ndarray], exact: np.ndarray, b: int) -> dict[str, Agreement]:
    return {name: agreement(p, exact, b) for name, p in proxies.items()}


def aggregate(results: list[ExampleFidelity]) -> list[dict]:
    """One row per (side, proxy): every metric summarised over examples (mean, std, median, count)."""
    rows = []
    for side in SIDES:
        names: list[str] = []
        for r in results:
            for name in r.sides.get(side, {}):
                if name not in names:
                    names.append(name)
        for name in names:
            ags = [r.sides[side][name] for r in results if name in r.sides.get(side, {})]
            row = {"side": side, "proxy": name, "examples": len(ags)}
            for metric in METRICS:
                row[metric] = summary([getattr(ag, metric) for ag in ags])
            paper = PAPER_TABLE2.get((side, name))
            if paper is not None:
                row["paper"] = {k: {"mean": v[0], "std": v[1]} for k, v in paper.items()}
            rows.append(row)
    return rows


def fmt(stat: dict | None, with_std: bool = True, digits: int = 4) -> str:
    """'0.9123 ± 0.1922' from a summary (or a paper entry); '—' when undefined."""
    if not stat or stat.get("mean") is None or (isinstance(stat["mean"], float) and math.isnan(stat["mean"])):
        return "—"
    text = f"{stat['mean']:.{digits}f}"
    if with_std and stat.get("std") is not None:
        text += f" ± {stat['std']:.{digits}f}"
    return text
