"""Built-in selectors for the compared methods (docs/compared-methods.md), registered through the same hook a
third-party plugin uses. Each is a :class:`bridgecli.baselines.Baseline`: per-token scores from the
stream (``bridge score`` and ``bridge reference``), declared budgets, top-b.

Options come from ``bridge select --option key=value``; ``bridge plugins`` and docs/compared-methods.md list them.
"""

from __future__ import annotations

import numpy as np

from ..baselines import rules
from ..baselines.selector import Baseline, Opt
from ..baselines.quantities import WARMUP, attention_rows, losses, quantity
from ..errors import UsageError
from ..format.records import Example
from ..hookspecs import hookimpl

DEFAULT_SEED = 42


# -- random ---------------------------------------------------------------------------------------
def _draws(example: Example, o: dict, side: int, size: int) -> np.ndarray:
    # seeded by (seed, example index, side): deterministic and independent of batch/stream order
    return np.random.default_rng([o["seed"], example.index, side]).random(size)


def _seed_validate(o: dict) -> None:
    if o["seed"] < 0:  # numpy's seed sequences take non-negative integers only
        raise UsageError(f"--option seed must be a non-negative integer, got {o['seed']}")


RANDOM = Baseline(
    "random",
    "both",
    prompt_score=lambda ex, o: _draws(ex, o, 0, len(ex.tokens.prompt_positions())),
    response_score=lambda ex, o: _draws(ex, o, 1, len(ex.tokens.response_positions())),
    options={"seed": Opt(DEFAULT_SEED, "random seed; example k draws from the seed sequence (seed, index_k, side)")},
    validate=_seed_validate,
)


# -- RHO-1 (static) -------------------------------------------------------------------------------
def _rho1_validate(o: dict) -> None:
    if o["mode"] != "static":
        raise UsageError(
            "rho1 mode=online needs the current model's loss inside the training step, which "
            "`bridge train` does not compute (it trains on fixed labels); use mode=static"
        )


RHO1 = Baseline(
    "rho1",
    "response",
    response_score=lambda ex, o: rules.excess_loss(losses(ex, o["cur"], "response"), losses(ex, o["ref"], "response")),
    options={
        "cur": Opt("base", "the 'current' model's losses (static mode: the base model theta_old)"),
        "ref": Opt(WARMUP, "reference model's losses (default: the warmup checkpoint)"),
        "mode": Opt("static", "static: precomputed losses (online is not supported)", ("static", "online")),
    },
    rankings=("batch", "global", "sample"),
    validate=_rho1_validate,
)


# -- Token Cleaning -------------------------------------------------------------------------------
def _tc_score(ex: Example, o: dict) -> np.ndarray:
    return rules.token_cleaning(losses(ex, o["base"], "response"), losses(ex, o["ref"], "response"))


_TC_OPTIONS = {
    "base": Opt("base", "base model's losses"),
    "ref": Opt(WARMUP, "reference model's losses (default: the warmup checkpoint)"),
}

TOKEN_CLEANING = Baseline(
    "tokencleaning", "response", response_score=_tc_score, options=dict(_TC_OPTIONS), rankings=("global", "sample")
)


# -- ssToken (static) -----------------------------------------------------------------------------
def _sstoken_score(ex: Example, o: dict) -> np.ndarray:
    source = o["attention"] or o["cur"]
    attn = attention_rows(ex) if source == "scores" else quantity(ex, source, "response_attention")
    return rules.sstoken(losses(ex, o["hist"], "response"), losses(ex, o["cur"], "response"), attn, o["gamma"])


def _gamma_validate(o: dict) -> None:
    if not 0.0 <= o["gamma"] <= 1.0:
        raise UsageError(f"--option gamma must lie in [0, 1], got {o['gamma']}")


SSTOKEN = Baseline(
    "sstoken",
    "response",
    response_score=_sstoken_score,
    options={
        "gamma": Opt(0.5, "weight of the min-max loss difference (1 - gamma: attention)"),
        "hist": Opt("base", "history model's losses (the fixed base model, as the authors' code)"),
        "cur": Opt(WARMUP, "current model's losses (static: the warmup checkpoint)"),
        "attention": Opt(
            "",
            "model whose last-layer attention mass is used (default: cur); 'scores' uses the "
            "row sums of the stream's A instead",
        ),
    },
    validate=_gamma_validate,
)


# -- LLMLingua-1 / LLMLingua-2 (prompt side) ------------------------------------------------------
def _lingua1(ex: Example, o: dict) -> np.ndarray:
    return rules.self_information(losses(ex, o["lm"], "prompt"))


def _lingua2(ex: Example, o: dict) -> np.ndarray:
    from ..baselines.lingua2 import HOW_TO_GET, prompt_token_probabilities

    if not o["classifier"]:
        raise UsageError("llmlingua2 needs --option classifier=PATH", hint=HOW_TO_GET)
    return prompt_token_probabilities(ex, o["classifier"])


LLMLINGUA1 = Baseline(
    "llmlingua1",
    "prompt",
    prompt_score=_lingua1,
    options={"lm": Opt("base", "causal LM whose prompt losses give the self-information")},
)

LLMLINGUA2 = Baseline(
    "llmlingua2",
    "prompt",
    prompt_score=_lingua2,
    options={"classifier": Opt("", "local LLMLingua-2 token-classifier folder (required)")},
)


# -- LLM+TC ---------------------------------------------------------------------------------------
def _llm_tc_prompt(ex: Example, o: dict) -> np.ndarray:
    return _lingua2(ex, o) if o["classifier"] else _lingua1(ex, o)


LLM_TC = Baseline(
    "llm+tc",
    "both",
    prompt_score=_llm_tc_prompt,
    response_score=_tc_score,
    options={
        **_TC_OPTIONS,
        "lm": Opt("base", "prompt side without a classifier: LLMLingua-1 self-information under this model"),
        "classifier": Opt("", "prompt side with LLMLingua-2: a local token-classifier folder"),
    },
    rankings=("global", "sample"),
)


# -- tokenseek-approx -----------------------------------------------------------------------------
def _tokenseek(ex: Example, o: dict) -> tuple[np.ndarray, np.ndarray]:
    src = o["model"]
    received = np.concatenate([quantity(ex, src, "prompt_received"), quantity(ex, src, "response_received")])
    grad = np.concatenate([quantity(ex, src, "prompt_grad"), quantity(ex, src, "response_grad")])
    score = rules.tokenseek(received, grad)
    m = len(ex.tokens.prompt_positions())
    return score[:m], score[m:]


TOKENSEEK = Baseline(
    "tokenseek-approx",
    "both",
    joint=_tokenseek,
    options={
        "model": Opt("base", "model whose attention received and embedding-gradient norms are used"),
        "joint": Opt(True, "rank prompt and response tokens together under b_p + b_r (false: per side)"),
    },
)

BASELINES = (RANDOM, RHO1, TOKEN_CLEANING, SSTOKEN, LLMLINGUA1, LLMLINGUA2, LLM_TC, TOKENSEEK)

_DESCRIPTIONS = {
    "random": "budget-matched uniform random tokens on both sides (seeded per example)",
    "rho1": "RHO-1, static: top excess loss L_cur - L_ref on the response (cur=base, ref=warmup)",
    "tokencleaning": "Token Cleaning, fixed model: top L_base - L_ref on the response (global ranking)",
    "sstoken": "ssToken, static: gamma*minmax(L_hist - L_cur) + (1-gamma)*last-layer prompt attention",
    "llmlingua1": "LLMLingua-1: top self-information prompt tokens under a local causal LM",
    "llmlingua2": "LLMLingua-2 with a local token classifier (--option classifier=PATH)",
    "llm+tc": "LLMLingua prompt side + Token Cleaning response side, independent",
    "tokenseek-approx": "approximation of TokenSeek: attention received + embedding-gradient norm",
}


@hookimpl(trylast=True)
def register_selectors(register):
    for b in BASELINES:
        register(b.name, b, f"{_DESCRIPTIONS[b.name]} [options: {b.describe_options()}]")
