"""analysis/report.py (JSON-safe values, the readable layout) and analysis/matrix_cache.py."""

from __future__ import annotations

import json
import math

import numpy as np

from bridgecli.analysis.matrix_cache import MatrixCache
from bridgecli.analysis.report import clean, dumps
from bridgecli.format.records import Example, Tokens


def test_clean_makes_every_value_json_safe():
    raw = {"a": math.nan, "b": [np.float32(1.5), (np.int64(2), math.inf)], "c": {"d": -math.inf, "e": "x"}}
    assert clean(raw) == {"a": None, "b": [1.5, [2, None]], "c": {"d": None, "e": "x"}}
    assert type(clean(np.int64(3))) is int


def test_dumps_is_json_with_scalar_lists_on_one_line():
    obj = {"table": [{"side": "prompt", "kappa": [1.0, -0.5]}], "n": 3, "empty": {}}
    text = dumps(obj)
    assert json.loads(text) == obj
    assert '"kappa": [1.0,-0.5]' in text and text.count("\n") == 9


class Counting:
    def __init__(self):
        self.calls = 0

    def prompt_matrix(self, ex):
        self.calls += 1
        n = len(ex.tokens.input_ids)
        return np.arange(n, dtype=np.float32), np.full((2, n), float(n))


def example(ids):
    kinds = bytes([1] * (len(ids) - 2) + [2, 2])
    return Example(id="x", index=0, text="", tokens=Tokens(input_ids=list(ids), kinds=kinds, offsets=[0] * (2 * len(ids))))


def test_matrix_cache_computes_each_matrix_once_per_key(tmp_path):
    ref = Counting()
    a, b = example([1, 2, 3, 4]), example([1, 2, 3, 5])
    cache = MatrixCache(tmp_path / "c", ["ckpt", "v", "mask", None, "float32"])
    first = cache.prompt_matrix(ref, a)
    cache.prompt_matrix(ref, b)
    again = MatrixCache(tmp_path / "c", ["ckpt", "v", "mask", None, "float32"])
    hit = again.prompt_matrix(ref, a)
    assert ref.calls == 2 and again.hits == 1
    np.testing.assert_array_equal(hit[0], first[0]) and np.testing.assert_array_equal(hit[1], first[1])
    other = MatrixCache(tmp_path / "c", ["ckpt", "v", "replace", 7, "float32"])  # another perturbation
    other.prompt_matrix(ref, a)
    assert ref.calls == 3 and other.hits == 0 and len(list((tmp_path / "c").glob("*.npz"))) == 3
    none = MatrixCache(None)
    none.prompt_matrix(ref, a)
    assert ref.calls == 4 and none.hits == 0
