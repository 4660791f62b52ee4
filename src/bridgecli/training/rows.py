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
    keep = set(int(p) for p in prompt_keep)
    sup = set(int(p) for p in supervise)
    ids, labels = [], []
    for pos, (tid, kind) in enumerate(zip(tokens.input_ids, kinds)):
        if kind == 1 and pos not in keep:  # PROMPT token not selected
            continue
        ids.append(tid)
        labels.append(tid if (kind == EOS or (kind == RESPONSE and pos in sup)) else IGNORE)
    return Row(id, ids, labels)
