"""Training rows: ``input_ids`` plus unshifted ``labels`` (-100 where no loss is taken)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..format.records import Tokens
from ..format.spec import EOS, RESPONSE

IGNORE = -100


@dataclass(frozen=True)
class Row:
    id: str
    input_ids: list[int]
    labels: list[int]

    @property
    def supervised(self) -> int:
        """Positions that carry loss (position 0 has no preceding token, so it never does)."""
        return sum(1 for x in self.labels[1:] if x != IGNORE)


def full_response_row(id: str, tokens: Tokens) -> Row:
    """Standard SFT: loss on every response token and the EOS."""
    kinds = np.frombuffer(tokens.kinds, dtype=np.uint8)
    ids = list(tokens.input_ids)
    labels = [t if k in (RESPONSE, EOS) else IGNORE for t, k in zip(ids, kinds)]
    return Row(id, ids, labels)


def compact_row(id: str, tokens: Tokens, prompt_keep: list[int], supervise: list[int]) -> Row:
    """BRIDGE execution: template tokens + kept prompt tokens (original order) + the complete
    response; labels only on the final supervision set and the EOS."""
    kinds = np.frombuffer(tokens.kinds, dtype=np.uint8)
    t = len(kinds)
    ids = np.asarray(tokens.input_ids, dtype=np.int64)[:t]  # zip() stops at the shorter of the two
    kinds = kinds[: len(ids)]
    keep = np.zeros(len(ids), dtype=bool)
    sup = np.zeros(len(ids), dtype=bool)
    for positions, mask in ((prompt_keep, keep), (supervise, sup)):
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        pos = pos[(pos >= 0) & (pos < len(ids))]  # positions past the tokens select nothing
        mask[pos] = True
    stay = (kinds != 1) | keep  # PROMPT tokens not selected are left out
    target = (kinds == EOS) | ((kinds == RESPONSE) & sup)
    labels = np.where(target, ids, IGNORE)
    return Row(id, ids[stay].tolist(), labels[stay].tolist())
