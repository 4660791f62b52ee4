"""Length bucketing: batches of similar lengths under a padded-token budget (no quadratic
padding waste), in a deterministic order."""

from __future__ import annotations


def bucket(lengths: list[int], max_tokens: int, max_rows: int | None = None) -> list[list[int]]:
    """Group indices into batches: sorted by length (ties by index), a batch grows while
    ``rows x longest <= max_tokens`` (and ``rows <= max_rows``). A single example longer than
    ``max_tokens`` gets a batch of its own."""
    if max_tokens < 1:
        raise ValueError("max_tokens must be >= 1")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        grow = max(longest, lengths[i])
        if cur and (grow * (len(cur) + 1) > max_tokens or (max_rows is not None and len(cur) >= max_rows)):
            batches.append(cur)
            cur, grow = [], lengths[i]
        cur.append(i)
        longest = grow
    if cur:
        batches.append(cur)
    return batches
