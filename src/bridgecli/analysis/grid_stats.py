"""Bootstrap intervals for grids of runs with several seeds (``bench/results/grid_table.py``): pure numpy.

Per-example values come as arrays with a leading seed axis. A resample draws one set of example (or
item) indices, with replacement, and applies it to every seed; the statistic is the mean over seeds.
A difference between two rows is bootstrapped *paired*: both on the same resampled examples.

- held-out loss: ``items`` [seeds, examples, 2] of (loss sum, tokens); the statistic is the token mean;
- per-item measures (accuracy 0/1, an answer-span loss): [seeds, items], NaN where an item has no value
  (left out of every mean, on both sides of a difference). Draws use ``numpy.random.default_rng(0)``.

A difference can be drawn *unpaired* where one side's items are not the items themselves (a task recorded from
its summary alone, its per-item results lost): each side then resamples its items on its own draws, which
leaves out the two sides' correlation over items: a wider interval wherever the two rows agree on items more
than chance would have them (two fine-tunings of one model do), a narrower one only where they agree less.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from typing import Any

import numpy as np

#: the index draws already made, by (resamples, the sizes drawn so far from default_rng(0)): the draw and
#: the generator's state after it. Every statistic below draws from a fresh default_rng(0), so a table's hundreds
#: of intervals repeat a few streams; drawing them once takes most of the time off a table of many rows
#: (bit-identical results: the same draws, read again). Bounded by _DRAWS_BYTES, the oldest dropped first.
_DRAWS: OrderedDict[tuple[int, tuple[int, ...]], tuple[np.ndarray, Any]] = OrderedDict()
_DRAWS_BYTES = 1 << 30


class _Draws:
    """The successive draws ``rng.integers(0, n, size=(resamples, n))`` of one ``numpy.random.default_rng(0)``,
    each taken from the cache where an earlier stream made it: shared by every caller, read only by convention
    (a read-only flag would double numpy's take over them: it copies such indices each call)."""

    def __init__(self, resamples: int):
        self.resamples = resamples
        self.sizes: tuple[int, ...] = ()

    def next(self, n: int) -> np.ndarray:
        key = (self.resamples, (*self.sizes, n))
        self.sizes = key[1]
        if key in _DRAWS:
            _DRAWS.move_to_end(key)
            return _DRAWS[key][0]
        rng = np.random.default_rng(0)
        before = _DRAWS.get((self.resamples, key[1][:-1])) if len(key[1]) > 1 else None
        if before is not None:
            rng.bit_generator.state = before[1]
        else:  # the stream's earlier draws, dropped or never made: drawn again in order
            for m in key[1][:-1]:
                rng.integers(0, m, size=(self.resamples, m))
        idx = rng.integers(0, n, size=(self.resamples, n))
        _DRAWS[key] = (idx, rng.bit_generator.state)
        while sum(v[0].nbytes for v in _DRAWS.values()) > _DRAWS_BYTES and len(_DRAWS) > 1:
            _DRAWS.popitem(last=False)
        return idx


def _resample_means(v: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Each seed's mean over each resample of items: [seeds, resamples]; where every value is 0 or 1, counted
    as bytes (the same numbers: a sum of 0/1 values is exact either way)."""
    if ((v == 0) | (v == 1)).all():
        return np.take(v.astype(np.int8), idx, axis=1).sum(-1, dtype=np.int64) / idx.shape[-1]
    return v[:, idx].mean(-1)


def resampled(items: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Seed-mean token-mean loss for each resample of example indices: [resamples]."""
    sums = items[:, :, 0][:, idx].sum(-1)  # [seeds, resamples]
    toks = items[:, :, 1][:, idx].sum(-1)
    return (sums / toks).mean(0)


def interval(items: np.ndarray | None, resamples: int, fallback: tuple | None = None):
    if items is None:
        return fallback
    idx = _Draws(resamples).next(items.shape[1])
    point = float((items[:, :, 0].sum(1) / items[:, :, 1].sum(1)).mean())
    lo, hi = np.percentile(resampled(items, idx), [2.5, 97.5])
    return point, float(lo), float(hi)


def paired(a: np.ndarray | None, b: np.ndarray | None, resamples: int):
    """(a - b, low, high): both seed-mean losses on the same resampled examples; None when the two
    were not scored on the same examples."""
    if a is None or b is None or a.shape[1] != b.shape[1] or not np.array_equal(a[0, :, 1], b[0, :, 1]):
        return None
    idx = _Draws(resamples).next(a.shape[1])
    point = float((a[:, :, 0].sum(1) / a[:, :, 1].sum(1)).mean() - (b[:, :, 0].sum(1) / b[:, :, 1].sum(1)).mean())
    lo, hi = np.percentile(resampled(a, idx) - resampled(b, idx), [2.5, 97.5])
    return point, float(lo), float(hi)


def item_interval(values: np.ndarray | None, resamples: int):
    """(seed-mean of the per-item mean, low, high): percentile bootstrap over items (NaN items left out
    of every mean)."""
    if values is None:
        return None
    keep = ~np.isnan(values).any(axis=0)
    v = values[:, keep]
    if v.shape[1] == 0:
        return None
    idx = _Draws(resamples).next(v.shape[1])
    lo, hi = np.percentile(_resample_means(v, idx).mean(0), [2.5, 97.5])
    return float(v.mean()), float(lo), float(hi)


def item_paired(a: np.ndarray | None, b: np.ndarray | None, resamples: int, unpaired: bool = False):
    """(a - b, low, high) on the same resampled items, both seed-means; None when the items differ. ``unpaired``:
    ``b`` resamples its items on draws of its own (one side's items stand for its summary alone)."""
    if a is None or b is None or a.shape[1] != b.shape[1]:
        return None
    keep = ~(np.isnan(a).any(axis=0) | np.isnan(b).any(axis=0))
    a, b = a[:, keep], b[:, keep]
    if a.shape[1] == 0:
        return None
    draws = _Draws(resamples)
    idx = draws.next(a.shape[1])
    idx_b = draws.next(a.shape[1]) if unpaired else idx
    diff = _resample_means(a, idx).mean(0) - _resample_means(b, idx_b).mean(0)
    lo, hi = np.percentile(diff, [2.5, 97.5])
    return float(a.mean(1).mean() - b.mean(1).mean()), float(lo), float(hi)


def task_mean(
    tasks: list[np.ndarray], resamples: int, against: list[np.ndarray] | None = None, unpaired: Collection[int] = ()
):
    """The mean over tasks of each task's seed-mean item score (the paper's "General Avg."), or its paired
    difference from ``against`` (the same tasks), with a percentile bootstrap that resamples each task's items
    on its own (a stratified bootstrap: a task keeps its size, so its weight in the mean). Each element of
    ``tasks`` is [seeds, items] with NaN where an item has no value (left out, on both sides). None when a
    task's items differ in number between the two sides or no item is left. ``unpaired``: the indices of the tasks
    whose two sides resample their items on draws of their own (see the module's note)."""
    if against is not None and len(against) != len(tasks):
        return None
    stream = _Draws(resamples)
    points, draws = [], []
    for k, a in enumerate(tasks):
        b = against[k] if against is not None else None
        if b is not None and a.shape[1] != b.shape[1]:
            return None
        keep = ~np.isnan(a).any(axis=0)
        if b is not None:
            keep &= ~np.isnan(b).any(axis=0)
        a = a[:, keep]
        if a.shape[1] == 0:
            return None
        idx = stream.next(a.shape[1])
        score = _resample_means(a, idx).mean(0)
        point = a.mean(1).mean()
        if b is not None:
            b = b[:, keep]
            idx_b = stream.next(a.shape[1]) if k in unpaired else idx
            score = score - _resample_means(b, idx_b).mean(0)
            point -= b.mean(1).mean()
        points.append(point)
        draws.append(score)
    lo, hi = np.percentile(np.mean(draws, axis=0), [2.5, 97.5])
    return float(np.mean(points)), float(lo), float(hi)
