"""Generation's speed paths keep its outputs: the stop-string check that looks only at running rows
whose newest token can end a stop string (against decoding every row's window at every step), the
newest-token EOS check, batches capped by tokens, the static-cache path behind --compile (and its
fallbacks), and the per-item generation numbers. The tiny model and byte-level BPE tokenizer of
tests/test_eval_gsm8k.py, and the real SmolLM2 tokenizer."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st
from transformers import StoppingCriteria, StoppingCriteriaList

from bridgecli.evaluation import generate as gen, stopping
from bridgecli.evaluation.generate import StopOnStrings, cut_at_stop, generate, plan_batches

from test_eval_gsm8k import PROMPTS, tiny  # noqa: F401  (the module's tiny model fixture)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

STOPS = ["\nQ:", "\n\n\n", "Q", ":#", " a", "ab"]
TEXT = st.text(st.sampled_from(list("ab Q:\n#é1")), max_size=30)


def naive_hits(tokenizer, stop, ids, prompt_length, window):
    """The check as it was: every row's last ``window`` generated tokens decoded, at every step."""
    tail = ids[:, prompt_length:][:, -window:]
    return [any(s in t for s in stop) for t in tokenizer.batch_decode(tail, skip_special_tokens=True)]


def check_steps(tokenizer, texts, stop):
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] or [0] for t in texts]
    width = max(len(r) for r in rows)
    prompt = 3
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * prompt + r + [pad] * (width - len(r)) for r in rows])
    rule = StopOnStrings(tokenizer, stop, prompt)
    sticky = [False] * len(rows)
    for t in range(1, width + 1):
        now = ids[:, : prompt + t]
        got = rule.check(now).tolist()
        sticky = [a or b for a, b in zip(sticky, naive_hits(tokenizer, stop, now, prompt, rule.window))]
        assert got == sticky, (t, texts)


@settings(max_examples=40, deadline=None)
@given(st.lists(TEXT, min_size=1, max_size=6), st.lists(st.sampled_from(STOPS), min_size=1, max_size=3))
def test_stop_check_equals_decoding_every_row(tiny, texts, stop):  # noqa: F811
    _, tok = tiny
    check_steps(tok, texts, stop)


@settings(max_examples=25, deadline=None)
@given(st.lists(TEXT, min_size=1, max_size=6))
def test_stop_check_equals_decoding_every_row_real_tokenizer(tokenizer, texts):
    check_steps(tokenizer, texts, STOPS)  # one stop set: its table is built once


def test_ending_tokens(tokenizer):
    ends = stopping.ending_tokens(tokenizer, ["\nQ:", "\n\n\n"])
    colon = tokenizer(": :", add_special_tokens=False)["input_ids"]
    words = tokenizer(" apples and pears", add_special_tokens=False)["input_ids"]
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    assert ends(torch.tensor(colon + newline)).all() and not ends(torch.tensor(words)).any()
    assert ends(torch.tensor([[words[0], colon[0]]])).tolist() == [[False, True]]
    assert ends(torch.tensor([len(tokenizer) + 5, colon[0]])).all()  # an id past the tokenizer's is looked at
    sample = torch.arange(0, len(tokenizer), 97)
    assert 0.0 < ends(sample).float().mean() < 0.3  # most tokens cannot end these: their rows are not decoded
    assert stopping.ending_tokens(tokenizer, ["\nQ:", "\n\n\n"]) is ends  # kept per tokenizer and stop set


class NaiveStop(StoppingCriteria):
    """The reference: stop a row once its whole continuation holds a stop string."""

    def __init__(self, tokenizer, stop, prompt_length):
        self.tokenizer, self.stop, self.prompt_length = tokenizer, stop, prompt_length

    def __call__(self, input_ids, scores, **kwargs):
        texts = self.tokenizer.batch_decode(input_ids[:, self.prompt_length:], skip_special_tokens=True)
        return torch.tensor([any(s in t for s in self.stop) for t in texts])


def reference(model, tok, prompts, max_new_tokens, stop):
    out = []
    for p in prompts:
        ids = tok(p, return_tensors="pt")
        length = ids["input_ids"].shape[1]
        config = gen._greedy_config(model, max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                                    eos_ids=gen._eos_ids(model, tok))
        with torch.inference_mode():
            seq = model.generate(**ids, generation_config=config,
                                 stopping_criteria=StoppingCriteriaList([NaiveStop(tok, stop, length)]))
        out.append(cut_at_stop(tok.decode(seq[0, length:], skip_special_tokens=True), stop))
    return out


@pytest.mark.parametrize(("batch_size", "batch_tokens"), [(2, None), (5, 70), (64, 1)])
def test_generate_equals_an_unbatched_naive_reference(tiny, batch_size, batch_tokens):  # noqa: F811
    model, tok = tiny
    free = generate(model, tok, PROMPTS, max_new_tokens=16, chat_template=False, progress=False)
    stop = ["never-there", free[1][4:6], free[3][2:4]]
    stats: dict = {}
    got = generate(model, tok, PROMPTS, max_new_tokens=16, batch_size=batch_size, batch_tokens=batch_tokens,
                   stop=stop, chat_template=False, progress=False, stats=stats)
    assert got == reference(model, tok, PROMPTS, 16, stop)
    assert sum(b["rows"] for b in stats["batches"]) == len(PROMPTS)
    if batch_tokens is not None:
        assert all(b["rows"] == 1 or b["rows"] * (b["prompt_tokens"] + 16) <= batch_tokens
                   for b in stats["batches"])
    for i, text in enumerate(got):
        item = stats["items"][i]
        stopped = text != free[i][: len(text)] or len(cut_at_stop(free[i], stop)) < len(free[i])
        assert item["hit_limit"] == (not stopped or item["new_tokens"] == 16)
        assert 1 <= item["new_tokens"] <= 16
    assert stats["compiled"] is False


def test_item_numbers_without_stops(tiny):  # noqa: F811
    model, tok = tiny
    stats: dict = {}
    generate(model, tok, PROMPTS[:3], max_new_tokens=7, batch_size=2, chat_template=False, progress=False,
             stats=stats)
    # the tiny model never says EOS: every item runs to the limit
    assert stats["items"] == {i: {"new_tokens": 7, "hit_limit": True} for i in range(3)}
    assert [b["rows"] for b in stats["batches"]] == [2, 1] and all(b["steps"] == 7 for b in stats["batches"])
    records = [{} for _ in range(3)]
    summary = gen.add_generation_stats(records, stats)
    assert summary["hit_limit"] == 3 and summary["new_tokens"] == 21 and records[0]["new_tokens"] == 7


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 300), max_size=40), st.integers(1, 50), st.one_of(st.none(), st.integers(1, 5000)),
       st.integers(1, 64))
def test_plan_batches(lengths, batch_size, batch_tokens, max_new):
    lengths = sorted(lengths, reverse=True)
    plan = plan_batches(lengths, batch_size=batch_size, batch_tokens=batch_tokens, max_new_tokens=max_new)
    assert [i for a, b in plan for i in range(a, b)] == list(range(len(lengths)))  # every prompt once, in order

    def fits(a, b):
        return b - a <= batch_size and (batch_tokens is None or b - a == 1
                                        or (b - a) * (max(lengths[a:b]) + max_new) <= batch_tokens)

    for k, (a, b) in enumerate(plan):
        assert b > a and fits(a, b)
        if k < len(plan) - 1:
            assert not fits(a, b + 1)  # greedy: the next prompt would not fit


def test_compile_is_ignored_on_cpu(tiny, capsys):  # noqa: F811
    model, tok = tiny
    plain = generate(model, tok, PROMPTS, max_new_tokens=6, batch_size=2, chat_template=False, progress=False)
    stats: dict = {}
    again = generate(model, tok, PROMPTS, max_new_tokens=6, batch_size=2, chat_template=False, progress=False,
                     compile=True, stats=stats)
    assert again == plain and stats["compiled"] is False
    assert "--compile: generating on cpu without" in capsys.readouterr().err


def test_static_cache_path_and_fallback(tiny, monkeypatch, capsys):  # noqa: F811
    """What --compile does on CUDA, on the CPU: the static cache sized once, every batch the same row
    count (the last filled up); transformers compiles nothing here (CPU), so this checks the rest."""
    model, tok = tiny
    plain = generate(model, tok, PROMPTS, max_new_tokens=6, batch_size=2, chat_template=False, progress=False)
    monkeypatch.setattr(gen, "COMPILE_DEVICES", ("cpu",))
    seen = []
    real = model.generate

    def spy(*args, **kwargs):
        seen.append((kwargs["input_ids"].shape[0], kwargs["generation_config"].cache_implementation))
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "generate", spy)
    stats: dict = {}
    static = generate(model, tok, PROMPTS, max_new_tokens=6, batch_size=2, chat_template=False, progress=False,
                      compile=True, stats=stats)
    assert static == plain and stats["compiled"] is True
    assert seen == [(2, "static")] * 3  # 5 prompts: the last batch holds one copy
    assert [b["rows"] for b in stats["batches"]] == [2, 2, 1]

    calls = []

    def broken(*args, **kwargs):
        calls.append(kwargs["generation_config"].cache_implementation)
        if kwargs["generation_config"].cache_implementation == "static":
            raise RuntimeError("inductor failed\nlong trace")
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "generate", broken)
    stats = {}
    fallen = generate(model, tok, PROMPTS, max_new_tokens=6, batch_size=2, chat_template=False, progress=False,
                      compile=True, stats=stats)
    assert fallen == plain and stats["compiled"] is False and calls == ["static", None, None, None]
    assert "--compile failed (RuntimeError: inductor failed); generating without it" in capsys.readouterr().err
