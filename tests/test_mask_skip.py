"""transformers' SDPA causal-mask check answered from host-side lengths (modeling/mask_skip.py): the
same prefix outputs as transformers' own check, with the padding mask never reduced on the device."""

from __future__ import annotations

import pytest
import torch

from bridgecli.modeling.mask_skip import known_padding
from bridgecli.modeling.score_batch import make_batch
from bridgecli.modeling.tail import Tail
from tiny import tiny_llama_config, tiny_model


@pytest.fixture(scope="module")
def model():
    m = tiny_model(tiny_llama_config(97, layers=4), seed=3)
    m.config._attn_implementation = "sdpa"
    return m


def batch_of(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    L = max(lengths)
    ids = torch.randint(1, 97, (len(lengths), L), generator=g)
    mask = torch.zeros(len(lengths), L, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        ids[b, n:] = 0
    return ids, mask


@pytest.fixture
def device_reads(monkeypatch):
    """How many times transformers reduced a padding mask to read it back (fast_all)."""
    from transformers import masking_utils

    calls = []
    original = masking_utils.fast_all
    monkeypatch.setattr(masking_utils, "fast_all", lambda t: calls.append(1) or original(t))
    return calls


@pytest.mark.parametrize("lengths", [[9, 9, 9], [9, 4, 7], [1, 6], [5]])
def test_the_prefix_is_the_same_without_reading_the_mask(model, lengths, device_reads):
    tail = Tail(model, [2, 3])
    ids, mask = batch_of(lengths)
    want_hidden, want_calls = tail.prefix(ids, mask)
    assert device_reads  # transformers' own check reads the mask (so the count below can fail)
    device_reads.clear()
    hidden, calls = tail.prefix(ids, mask, padded=min(lengths) < max(lengths))
    assert not device_reads
    assert torch.equal(hidden, want_hidden)
    for got, want in zip(calls, want_calls):
        got_mask, want_mask = got.kwargs.get("attention_mask"), want.kwargs.get("attention_mask")
        assert (got_mask is None) == (want_mask is None)  # skipped (causal SDPA) exactly when transformers skips
        if want_mask is not None:
            assert torch.equal(got_mask, want_mask)


def test_the_original_check_is_back_afterwards(device_reads):
    from transformers import masking_utils

    before = masking_utils._ignore_causal_mask_sdpa
    with known_padding(True):
        assert masking_utils._ignore_causal_mask_sdpa is not before
        # a cached prefix (one query after five cached keys) is left to transformers, which reads the mask
        assert masking_utils._ignore_causal_mask_sdpa(torch.ones(1, 6, dtype=torch.bool), 1, 6, 5, 0) is True
    assert masking_utils._ignore_causal_mask_sdpa is before
    assert device_reads
    with known_padding(None):
        assert masking_utils._ignore_causal_mask_sdpa is before


def test_a_batch_knows_whether_it_is_padded(tokenizer):
    from pathlib import Path

    from bridgecli.data.examples import DataOptions, iter_examples

    sample = Path(__file__).resolve().parents[1] / "examples" / "data" / "train.jsonl"
    exs = list(iter_examples(str(sample), tokenizer, DataOptions(limit=6)))
    lengths = [len(ex.tokens.input_ids) for ex in exs]
    assert len(set(lengths)) > 1
    assert make_batch(exs, 0).padded
    assert not make_batch(exs[:1], 0).padded
    assert make_batch(exs[:1], 0, multiple=max(lengths) + 1).padded  # rounded up: padded
