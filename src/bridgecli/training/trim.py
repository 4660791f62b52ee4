"""``bridge compact --trim-tail``: a training row cut after its last supervised response token.

The tokens after the last supervised response token carry no loss of their own, and under causal
attention they change nothing for the tokens before them: executing them costs compute and trains
nothing, except the EOS, whose loss teaches the model to stop. Where the last response token is
supervised, the EOS follows a supervised token and the row stays whole (it ends as full SFT's does).
Elsewhere the row ends at its last supervised response token: the rest of the response and the EOS
are neither executed nor supervised (there is no end of the response in the row to predict).
"""

from __future__ import annotations

from ..format.records import Tokens
from ..format.spec import PROMPT, RESPONSE
from .rows import Row


def tail_cut(tokens: Tokens, supervise: list[int]) -> int | None:
    """The position (into ``tokens``) of the last supervised response token when the row is to be cut
    after it, or None when nothing is cut: no supervised response token, or the last response token
    is supervised. ``supervise``: the final supervision set (positions outside the tokens, or not of
    a response token, supervise nothing, as in :func:`~bridgecli.training.rows.compact_row`)."""
    kinds = tokens.kinds
    t = min(len(tokens.input_ids), len(kinds))
    last_response = kinds.rfind(bytes([RESPONSE]), 0, t)
    last = max((p for p in supervise if 0 <= p < t and kinds[p] == RESPONSE), default=-1)
    if last < 0 or last == last_response:
        return None
    return last


def trim_row(row: Row, tokens: Tokens, prompt_keep: list[int], last: int) -> Row:
    """``row`` (:func:`~bridgecli.training.rows.compact_row`'s, from the same ``tokens`` and
    ``prompt_keep``, weighted or not) without the tokens after position ``last``."""
    kinds = tokens.kinds
    dropped = kinds.count(PROMPT, 0, last + 1) - len({p for p in prompt_keep if 0 <= p <= last and kinds[p] == PROMPT})
    end = last + 1 - dropped
    return Row(
        row.id,
        row.input_ids[:end],
        row.labels[:end],
        None if row.weights is None else row.weights[:end],
    )
