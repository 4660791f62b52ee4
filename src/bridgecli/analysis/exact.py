"""Exact state-conditioned scores by perturbation, on the scoring machinery of ``bridge score``.

- Prompt side (paper eq. "exact_interaction_reference"): beta_exact[j, i] = a_j(P) - a_j(P
  perturbed at i), by a length-preserving perturbation of each eligible prompt token i:
  ``mask``: its key is hidden from every query at every layer, positions unchanged
  (:func:`bridgecli.modeling.attention.hidden_keys`, applied inside the registered attention
  function on both its SDPA and its math path);
  ``replace``: its input id is replaced by a neutral token's (so its embedding is that token's).
  The perturbed copies of one example are batched, ``batch_size`` copies per scoring pass.
- Response side: a_j(S_p), a_j recomputed on the example with the eligible prompt tokens outside
  S_p removed (length-changing: the paper's "a_j recomputed with the prompt reduced to S_p", and
  what ``bridge compact`` executes).

Every a_j comes from the scorer's public ``score`` (for BRIDGE: one forward-mode JVP along v), so
the exact scores and the surrogate share one definition of a_j.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np
import torch

from ..format.records import Example, Tokens
from ..hookspecs import Scorer
from ..modeling.attention import hidden_keys

PERTURBATIONS = ("mask", "replace")


def exact_base_scorer(ctx):
    """The BRIDGE scorer the exact scores use: the generic forward-mode path, whose attention
    goes through the registered ``bridge`` attention function (where :func:`hidden_keys` acts);
    fused tails with attention of their own (``fast_tail``) are turned off."""
    import dataclasses

    from ..modeling.scoring import BridgeScorer

    options = {k: v for k, v in ctx.options.items() if k != "scorer_options"}  # another scorer's
    return BridgeScorer(dataclasses.replace(ctx, options={**options, "fast_tail": False}))


def neutral_token_id(tokenizer, text: str | None = None) -> int:
    """The id used by the ``replace`` perturbation: ``text`` when it is one token; by default a
    single space (one token in byte-level BPE vocabularies), else the pad token."""
    candidates = [text] if text is not None else [" "]
    for t in candidates:
        ids = tokenizer.encode(t, add_special_tokens=False)
        if len(ids) == 1:
            return int(ids[0])
    if text is not None:
        raise ValueError(
            f"the neutral token {text!r} is {len(tokenizer.encode(text, add_special_tokens=False))} "
            "tokens; pass text that is exactly one token"
        )
    return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)


def reduce_prompt(example: Example, keep: np.ndarray) -> Example:
    """The example with every eligible prompt token outside ``keep`` removed (``keep`` indexes the
    eligible prompt positions). Template tokens, the response and EOS stay; offsets still point
    into the unchanged text."""
    prompt = example.tokens.prompt_positions()
    drop = np.setdiff1d(prompt, prompt[np.asarray(keep, dtype=np.int64)])
    n = len(example.tokens.input_ids)
    kept = np.setdiff1d(np.arange(n), drop)
    kinds = np.frombuffer(example.tokens.kinds, dtype=np.uint8)[kept]
    spans = example.tokens.spans()[kept]
    tokens = Tokens(
        input_ids=[example.tokens.input_ids[t] for t in kept.tolist()],
        kinds=kinds.tobytes(),
        offsets=spans.reshape(-1).tolist(),
    )
    return msgspec.structs.replace(example, tokens=tokens, scores=None, selection=None, closure=None)


@dataclass
class ExactScores:
    """Exact state-conditioned scores for one scoring checkpoint. ``scorer`` is a BRIDGE scorer (anything with
    ``score(list[Example]) -> list[Scores]`` whose ``a`` is v . grad l_j); ``neutral_id`` is needed
    for ``replace``."""

    scorer: Scorer
    perturb: str = "mask"
    neutral_id: int | None = None
    batch_size: int = 16

    def __post_init__(self):
        if self.perturb not in PERTURBATIONS:
            raise ValueError(f"unknown perturbation {self.perturb!r}; choose one of {', '.join(PERTURBATIONS)}")
        if self.perturb == "replace" and self.neutral_id is None:
            raise ValueError("the replace perturbation needs a neutral token id")
        if self.batch_size < 1:
            raise ValueError("batch_size must be >= 1")

    def utilities(self, examples: list[Example]) -> list[np.ndarray]:
        """a_j for each example (its eligible response tokens, in order), ``batch_size`` at a time."""
        out: list[np.ndarray] = []
        for start in range(0, len(examples), self.batch_size):
            for sc in self.scorer.score(examples[start : start + self.batch_size]):
                out.append(sc.a.numpy().astype(np.float64))
        return out

    def prompt_matrix(self, example: Example) -> tuple[np.ndarray, np.ndarray]:
        """(a_full [n], beta_exact [n, m]) with beta_exact[j, i] = a_j(P) - a_j(P perturbed at i)."""
        a_full = self.utilities([example])[0]
        prompt = example.tokens.prompt_positions()
        n, m = len(example.tokens.response_positions()), len(prompt)
        beta = np.zeros((n, m), dtype=np.float64)
        if m == 0 or n == 0:
            return a_full, beta
        length = len(example.tokens.input_ids)
        for start in range(0, m, self.batch_size):
            cols = np.arange(start, min(m, start + self.batch_size))
            if self.perturb == "mask":
                hide = torch.zeros((len(cols), length), dtype=torch.bool)
                hide[torch.arange(len(cols)), torch.as_tensor(prompt[cols])] = True
                with hidden_keys(hide):
                    scores = self.scorer.score([example] * len(cols))
            else:
                assert self.neutral_id is not None  # checked in __post_init__ for "replace"
                copies = []
                for i in prompt[cols]:
                    ids = list(example.tokens.input_ids)
                    ids[int(i)] = int(self.neutral_id)
                    copies.append(
                        msgspec.structs.replace(example, tokens=msgspec.structs.replace(example.tokens, input_ids=ids))
                    )
                scores = self.scorer.score(copies)
            a_pert = np.stack([sc.a.numpy().astype(np.float64) for sc in scores], axis=1)  # [n, k]
            beta[:, cols] = a_full[:, None] - a_pert
        return a_full, beta

    def reduced_utilities(self, example: Example, keeps: list[np.ndarray]) -> list[np.ndarray]:
        """a_j(S_p) for each S_p in ``keeps`` (indices into the eligible prompt positions)."""
        return self.utilities([reduce_prompt(example, keep) for keep in keeps])
