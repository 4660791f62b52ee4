"""A stream-wide token budget spent where the per-token gains are highest, in bounded memory.

``select --budget global`` (docs/method.md, "Global budget") collects one gain per eligible token of
every example in a first pass, then gives each example as many tokens as it has among the ``B``
largest gains of the stream. The gains are spilled to temporary files (one for prompt tokens, one for
response tokens, in stream order) instead of being held in memory; the ``B``-th largest is found
exactly by a radix selection over the spill files (four passes, 16 bits each, over order-preserving
64-bit keys of the float64 gains), and the per-example counts by one more pass. Memory: a few
integers per example plus one chunk of the spill file.

Order among equal gains (so the result is deterministic): the earlier example first; within an
example, prompt tokens before response tokens, each side in position order. Only counts come out of
this module; which tokens an example then keeps is decided by the per-example selection.

Pure numpy, no torch.
"""

from __future__ import annotations

import os
import tempfile
from typing import Iterator

import numpy as np

SIDES = ("prompt", "response")
POOLS = ("shared", "sides")
CHUNK = 1 << 20  # keys per read


def order_keys(values: np.ndarray) -> np.ndarray:
    """uint64 keys that sort like the float64 ``values`` (-inf < ... < 0 < ... < +inf; -0.0 and 0.0 get
    the same key). NaN is not allowed."""
    v = np.ascontiguousarray(values, dtype=np.float64) + 0.0  # + 0.0 turns -0.0 into 0.0: one key for zero
    if np.isnan(v).any():
        raise ValueError("a gain is NaN")
    u = v.view(np.uint64)
    sign = (u >> np.uint64(63)).astype(bool)
    return np.where(sign, ~u, u | np.uint64(1 << 63))


def key_value(key: int) -> float:
    """The float64 whose :func:`order_keys` key is ``key``."""
    k = np.uint64(key)
    u = k & ~np.uint64(1 << 63) if k >> np.uint64(63) else ~k
    return float(np.array([u], dtype=np.uint64).view(np.float64)[0])


class GainSpill:
    """Per-token gains of a stream, spilled to two temporary files. Use as a context manager (the
    files are removed on exit); ``add`` the examples in stream order, then ``allocate``."""

    def __init__(self, directory: str | None = None, chunk: int = CHUNK):
        self.chunk = int(chunk)
        self.paths: list[str] = []
        self.files = []
        for side in SIDES:
            fd, path = tempfile.mkstemp(prefix=f"bridge-gains-{side}-", suffix=".u64", dir=directory)
            self.paths.append(path)
            self.files.append(os.fdopen(fd, "wb"))
        self.lengths: list[list[int]] = [[], []]

    def __enter__(self) -> "GainSpill":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for fh in self.files:
            if not fh.closed:
                fh.close()
        for path in self.paths:
            try:
                os.unlink(path)
            except OSError:
                pass

    def add(self, prompt_gains: np.ndarray, response_gains: np.ndarray) -> None:
        """One example's gains: ``[m]`` over its eligible prompt positions, ``[n]`` over its response ones."""
        for side, gains in enumerate((prompt_gains, response_gains)):
            keys = order_keys(np.asarray(gains, dtype=np.float64).reshape(-1))
            self.files[side].write(keys.astype("<u8").tobytes())
            self.lengths[side].append(int(keys.size))

    # -- reading -----------------------------------------------------------------------------------
    def _chunks(self, side: int) -> Iterator[np.ndarray]:
        self.files[side].flush()
        with open(self.paths[side], "rb") as fh:
            while True:
                data = fh.read(8 * self.chunk)
                if not data:
                    return
                yield np.frombuffer(data, dtype="<u8").astype(np.uint64)

    def _pool_chunks(self, sides: tuple[int, ...]) -> Iterator[np.ndarray]:
        for side in sides:
            yield from self._chunks(side)

    def _threshold(self, sides: tuple[int, ...], rank: int) -> tuple[int, int]:
        """(K, G): the ``rank``-th largest key of the pool and how many keys are strictly larger.
        ``1 <= rank <=`` the pool's size."""
        prefix, greater = 0, 0
        for level, shift in enumerate((48, 32, 16, 0)):
            hist = np.zeros(1 << 16, dtype=np.int64)
            for keys in self._pool_chunks(sides):
                if level:
                    keys = keys[(keys >> np.uint64(shift + 16)) == np.uint64(prefix)]
                digits = ((keys >> np.uint64(shift)) & np.uint64(0xFFFF)).astype(np.int64)
                hist += np.bincount(digits, minlength=1 << 16)
            from_top = np.cumsum(hist[::-1])  # from_top[t]: keys whose digit is >= 65535 - t
            t = int(np.searchsorted(from_top, rank - greater, side="left"))
            digit = 65535 - t
            greater += int(from_top[t] - hist[digit])
            prefix = (prefix << 16) | digit
        return prefix, greater

    def _counts(self, side: int, key: int) -> tuple[np.ndarray, np.ndarray]:
        """Per example: how many of its keys on ``side`` are > ``key`` and == ``key``."""
        lengths = np.asarray(self.lengths[side], dtype=np.int64)
        ends = np.cumsum(lengths)
        at_gt = np.zeros(len(ends), dtype=np.int64)  # cumulative counts at each example's end
        at_eq = np.zeros(len(ends), dtype=np.int64)
        carry_gt = carry_eq = 0
        pos, k0 = 0, 0
        k = np.uint64(key)
        for keys in self._chunks(side):
            cg = np.cumsum(keys > k) + carry_gt
            ce = np.cumsum(keys == k) + carry_eq
            hi = pos + len(keys)
            k1 = int(np.searchsorted(ends, hi, side="right"))
            idx = ends[k0:k1] - pos - 1
            inside = idx >= 0
            at_gt[k0:k1] = np.where(inside, cg[np.clip(idx, 0, None)], carry_gt)
            at_eq[k0:k1] = np.where(inside, ce[np.clip(idx, 0, None)], carry_eq)
            carry_gt, carry_eq = int(cg[-1]), int(ce[-1])
            pos, k0 = hi, k1
        at_gt[k0:] = carry_gt  # examples after the last chunk: empty ones
        at_eq[k0:] = carry_eq
        return np.diff(at_gt, prepend=0), np.diff(at_eq, prepend=0)

    # -- allocation --------------------------------------------------------------------------------
    def _allocate_pool(self, sides: tuple[int, ...], total: int) -> tuple[list[np.ndarray], float | None]:
        sizes = [np.asarray(self.lengths[s], dtype=np.int64) for s in sides]
        size = int(sum(int(x.sum()) for x in sizes))
        if total >= size:
            return sizes, None
        if total <= 0:
            return [np.zeros_like(x) for x in sizes], None
        key, greater = self._threshold(sides, total)
        ties = total - greater  # equal keys to hand out in stream order
        counts = [self._counts(s, key) for s in sides]
        out = [gt.copy() for gt, _ in counts]
        n_examples = len(sizes[0])
        for k in range(n_examples):  # example order, then prompt before response
            if ties <= 0:
                break
            for i in range(len(sides)):
                take = min(int(counts[i][1][k]), ties)
                out[i][k] += take
                ties -= take
        return out, key_value(key)

    def allocate(self, pool: str, total: int | None = None, totals: tuple[int, int] | None = None) -> dict:
        """Per-example budgets. ``pool='shared'``: one ``total`` over both sides' gains;
        ``pool='sides'``: ``totals = (B_p, B_r)``, each side its own pool. Returns ``{"budgets": [(b_p,
        b_r), ...] in stream order, "threshold": ...}`` (threshold: the gain of the last token taken per
        pool, None where every token or none was taken)."""
        if pool == "shared":
            assert total is not None, "pool='shared' needs total"
            (bp, br), thr = self._allocate_pool((0, 1), int(total))
            thresholds = {"shared": thr}
        elif pool == "sides":
            assert totals is not None, "pool='sides' needs totals"
            (bp,), thr_p = self._allocate_pool((0,), int(totals[0]))
            (br,), thr_r = self._allocate_pool((1,), int(totals[1]))
            thresholds = {"prompt": thr_p, "response": thr_r}
        else:
            raise ValueError(f"unknown pool {pool!r}; choose one of {', '.join(POOLS)}")
        return {"budgets": [(int(p), int(r)) for p, r in zip(bp, br)], "threshold": thresholds}
