"""Training rows: ``input_ids`` plus unshifted ``labels`` (-100 where no loss is taken)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress

import numpy as np

from ..format.records import Tokens
from ..format.spec import EOS, PROMPT, RESPONSE

IGNORE = -100


@dataclass(frozen=True)
class Row:
    id: str
    input_ids: list[int]
    labels: list[int]
    #: per-token loss weights aligned with ``labels`` (read where a label is not -100); None: all 1
    weights: list[float] | None = None

    @property
    def supervised(self) -> int:
        """Positions that carry loss (position 0 has no preceding token, so it never does)."""
        return sum(1 for x in self.labels[1:] if x != IGNORE)

    @property
    def loss_weight(self) -> float:
        """What the row weighs in the loss: the sum of its loss weights over the positions that carry loss
        (their count when it has no weights). A row of weight 0 trains nothing."""
        if self.weights is None:
            return float(self.supervised)
        return float(sum(w for w, y in zip(self.weights[1:], self.labels[1:]) if y != IGNORE))


def full_response_row(id: str, tokens: Tokens) -> Row:
    """Standard SFT: loss on every response token and the EOS."""
    kinds = np.frombuffer(tokens.kinds, dtype=np.uint8)
    ids = list(tokens.input_ids)
    labels = [t if k in (RESPONSE, EOS) else IGNORE for t, k in zip(ids, kinds)]
    return Row(id, ids, labels)


def compact_row(id: str, tokens: Tokens, prompt_keep: list[int], supervise: list[int]) -> Row:
    """BRIDGE execution: template tokens + kept prompt tokens (original order) + the complete
    response; labels only on the final supervision set and the EOS. Positions outside the tokens select
    nothing; with fewer kinds than ids (or fewer ids than kinds) the row stops at the shorter.

    Bytes and list methods rather than numpy: the lists are a few hundred entries, where numpy's calls
    and conversions cost twice as much (``tests/test_training.py`` checks it against the numpy version)."""
    ids, kinds = tokens.input_ids, tokens.kinds
    t = min(len(ids), len(kinds))
    if len(ids) != t or len(kinds) != t:
        ids, kinds = ids[:t], kinds[:t]
    stay = bytearray(kinds.translate(_NOT_PROMPT))  # 1 where the token stays: every kind but PROMPT
    for p in prompt_keep:
        if 0 <= p < t:
            stay[p] = 1
    labels = [IGNORE] * t
    for p in supervise:
        if 0 <= p < t and kinds[p] == RESPONSE:
            labels[p] = ids[p]
    e = kinds.find(EOS)
    while e >= 0:
        labels[e] = ids[e]
        e = kinds.find(EOS, e + 1)
    return Row(id, list(compress(ids, stay)), list(compress(labels, stay)))


def weighted_row(row: Row, tokens: Tokens, prompt_keep: list[int], weights: dict[int, float]) -> Row:
    """``row`` (``compact_row``'s, from the same ``tokens`` and ``prompt_keep``) with loss weights: ``weights``
    maps a supervised position to its weight; every other position weighs 1 (the EOS included)."""
    ids, kinds = tokens.input_ids, tokens.kinds
    t = min(len(ids), len(kinds))
    keep = set(prompt_keep)
    out = [weights.get(p, 1.0) for p in range(t) if kinds[p] != PROMPT or p in keep]
    return Row(row.id, row.input_ids, row.labels, out)


_NOT_PROMPT = bytes(int(k != PROMPT) for k in range(256))
