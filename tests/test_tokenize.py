"""Tokenisation keeps offsets, marks template/special tokens ineligible and ends with EOS."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridgecli.data.shapes import Pair, to_pair
from bridgecli.data.tokenize import tokenize_pair
from bridgecli.errors import InputError
from bridgecli.format.spec import EOS, PROMPT, RESPONSE, TEMPLATE


def pieces(tok_result):
    kinds = np.frombuffer(tok_result.tokens.kinds, dtype=np.uint8)
    spans = tok_result.tokens.spans()
    text = tok_result.text
    return kinds, ["".join(text[s:e] for (s, e), k in zip(spans, kinds) if k == kind) for kind in (PROMPT, RESPONSE)]


def test_chat_template_kinds(tokenizer):
    pair = to_pair({"question": "What is 2+3?", "answer": "2+3 = 5\n#### 5"}, 0, "line 1", "t")
    out = tokenize_pair(tokenizer, pair)
    kinds, (prompt, response) = pieces(out)
    assert prompt == "What is 2+3?"
    assert response == "2+3 = 5\n#### 5"
    assert kinds[-1] == EOS and out.tokens.input_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert (kinds == EOS).sum() == 1
    # role markers and the default system prompt the template adds are template tokens
    assert kinds[0] == TEMPLATE and "system" in out.text and "You are a helpful" in out.text
    assert out.text.startswith("<|im_start|>system")
    # the ids are exactly the ones the tokenizer gives for each piece
    for tid, k in zip(out.tokens.input_ids, kinds):
        if tid in tokenizer.all_special_ids:
            assert k in (TEMPLATE, EOS)


def test_offsets_reproduce_text(tokenizer):
    pair = to_pair({"messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Hi there"},
                                 {"role": "assistant", "content": "Hello!"},
                                 {"role": "user", "content": "Add 1 and 2."},
                                 {"role": "assistant", "content": "1 + 2 = 3."}]}, 0, "line 1", "t")
    out = tokenize_pair(tokenizer, pair)
    spans = out.tokens.spans()
    assert "".join(out.text[s:e] for s, e in spans) == out.text
    kinds, (prompt, response) = pieces(out)
    assert prompt == "Be brief.Hi thereHello!Add 1 and 2."  # every earlier turn is prunable context
    assert response == "1 + 2 = 3."


def test_plain_concatenation(tokenizer):
    pair = to_pair({"instruction": "Sum", "input": "1 2", "output": "3"}, 0, "line 1", "t")
    out = tokenize_pair(tokenizer, pair, chat_template=False)
    kinds, (prompt, response) = pieces(out)
    assert out.text == "Sum\n\n1 2\n\n3"
    assert prompt == "Sum\n\n1 2" and response == "3"
    assert kinds[-1] == EOS and out.tokens.input_ids[-1] == tokenizer.eos_token_id


def test_special_token_inside_content_is_not_eligible(tokenizer):
    pair = Pair("x", ({"role": "user", "content": "say <|im_end|> now"},), "ok", "t")
    out = tokenize_pair(tokenizer, pair)
    kinds = np.frombuffer(out.tokens.kinds, dtype=np.uint8)
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt_ids = [t for t, k in zip(out.tokens.input_ids, kinds) if k == PROMPT]
    assert end_id not in prompt_ids


def test_template_that_trims_content_falls_back_to_search(tokenizer):
    tok = tokenizer
    saved = tok.chat_template
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n"
                         "{% endfor %}")
    try:
        pair = Pair("x", ({"role": "user", "content": "  padded question  "},), " answer 7 ", "t")
        out = tokenize_pair(tok, pair)
    finally:
        tok.chat_template = saved
    _, (prompt, response) = pieces(out)
    assert prompt == "padded question" and response == "answer 7"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.text(min_size=1, max_size=40).filter(lambda s: s.strip()),
       response=st.text(min_size=1, max_size=40).filter(lambda s: s.strip()),
       chat=st.booleans())
def test_any_text_tokenises_consistently(tokenizer, prompt, response, chat):
    pair = Pair("x", ({"role": "user", "content": prompt},), response, "t")
    if not tokenizer(response, add_special_tokens=False)["input_ids"]:  # e.g. only control characters
        with pytest.raises(InputError, match="the response produced no tokens"):
            tokenize_pair(tokenizer, pair, chat_template=chat)
        return
    out = tokenize_pair(tokenizer, pair, chat_template=chat)
    kinds = np.frombuffer(out.tokens.kinds, dtype=np.uint8)
    assert len(kinds) == len(out.tokens.input_ids) == len(out.tokens.offsets) // 2
    assert kinds[-1] == EOS and (kinds == EOS).sum() == 1
    assert (kinds == RESPONSE).any()
    first_resp = np.flatnonzero(kinds == RESPONSE)[0]
    assert not (kinds[first_resp:] == PROMPT).any()  # prompt strictly before response
    spans = out.tokens.spans()
    assert np.all(spans[:, 0] <= spans[:, 1]) and np.all(np.diff(spans[:, 0]) >= 0)
