"""Exact perturbation scores against independent references on tiny random models: the ``mask``
perturbation against an eager HF model given an explicit 4-D mask, ``replace`` and the reduced
prompt against scoring the edited example directly."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bridgecli.analysis.exact import ExactScores, neutral_token_id, reduce_prompt, exact_base_scorer
from bridgecli.format.spec import PROMPT
from bridgecli.modeling.params import tail_parameters
from bridgecli.modeling.scoring import ScoringContext

from tiny import tiny_llama_config, tiny_model
from tiny import record_examples as examples

pytestmark = pytest.mark.integration  # exact references on a tiny model (seconds each)


@pytest.fixture(scope="module")
def setup(tokenizer):
    config = tiny_llama_config(len(tokenizer))
    model = tiny_model(config, dtype=torch.float64)
    torch.manual_seed(1)
    v = {n: torch.randn_like(p) for n, p in tail_parameters(model, 4).items()}
    scorer = exact_base_scorer(ScoringContext(model=model, tokenizer=tokenizer, direction=v, attention_layers=3))
    eager = tiny_model(tiny_llama_config(len(tokenizer)), dtype=torch.float64)  # its own config object:
    eager.load_state_dict(model.state_dict())
    eager.set_attn_implementation("eager")  # (a shared config would switch the scorer's model too)
    return scorer, eager, v, examples(tokenizer)


def eager_a(eager, ex, v, hide: int | None) -> np.ndarray:
    """a_j = v . grad l_j through the plain HF model (eager attention, the whole model under one
    ``torch.func.jvp``); key ``hide`` masked for every query at every layer by an explicit 4-D
    additive mask, positions unchanged."""
    ids = torch.tensor([ex.tokens.input_ids])
    L = ids.shape[1]
    mask = torch.full((L, L), float("-inf"), dtype=torch.float64).triu(1)
    if hide is not None:
        mask[:, hide] = float("-inf")
    resp = torch.as_tensor(ex.tokens.response_positions())

    def losses(params):
        logits = torch.func.functional_call(eager, params, (), {"input_ids": ids, "attention_mask": mask[None, None]},
                                            strict=False).logits[0]
        return F.cross_entropy(logits[resp - 1], ids[0, resp], reduction="none")

    params = dict(eager.named_parameters())
    with torch.no_grad():
        _, a = torch.func.jvp(losses, ({n: params[n].detach() for n in v},), (v,))
    return a.numpy()


def test_mask_perturbation_hides_the_key_at_every_layer(setup):
    scorer, eager, v, exs = setup
    ex = exs[0]
    ref = ExactScores(scorer, perturb="mask", batch_size=10)  # two chunks, the last one short
    a_full, beta = ref.prompt_matrix(ex)
    prompt = ex.tokens.prompt_positions()
    assert beta.shape == (len(ex.tokens.response_positions()), len(prompt))
    a_ref = eager_a(eager, ex, v, None)
    scale = np.abs(a_ref).max()
    np.testing.assert_allclose(a_full, a_ref, atol=1e-6 * scale)
    for k in (0, len(prompt) // 2, len(prompt) - 1):  # first, middle, last chunk
        diff = a_ref - eager_a(eager, ex, v, int(prompt[k]))
        assert np.abs(diff).max() > 1e-3 * scale  # the perturbation matters ...
        np.testing.assert_allclose(beta[:, k], diff, atol=2e-6 * scale)  # ... and is the one we meant


def test_replace_perturbation_and_reduced_prompt_are_the_edited_examples(setup, tokenizer):
    scorer, _, _, exs = setup
    ex = exs[1]
    nid = neutral_token_id(tokenizer)
    assert tokenizer.decode([nid]) == " "
    ref = ExactScores(scorer, perturb="replace", neutral_id=nid, batch_size=32)
    a_full, beta = ref.prompt_matrix(ex)
    prompt = ex.tokens.prompt_positions()
    k = 3
    ids = list(ex.tokens.input_ids)
    ids[int(prompt[k])] = nid
    edited = msgspec.structs.replace(ex, tokens=msgspec.structs.replace(ex.tokens, input_ids=ids))
    keep = np.arange(0, len(prompt), 3)
    red = reduce_prompt(ex, keep)
    direct, direct_red = (s.a.numpy().astype(np.float64) for s in scorer.score([edited, red]))
    np.testing.assert_allclose(beta[:, k], a_full - direct, atol=1e-5 * np.abs(a_full).max())

    kinds = np.frombuffer(red.tokens.kinds, dtype=np.uint8)
    assert (kinds == PROMPT).sum() == len(keep)
    assert len(red.tokens.input_ids) == len(ex.tokens.input_ids) - (len(prompt) - len(keep))
    assert len(red.tokens.response_positions()) == len(ex.tokens.response_positions())
    kept_text = "".join(red.text[s:e] for s, e in red.tokens.spans()[red.tokens.prompt_positions()])
    assert kept_text == "".join(ex.text[s:e] for s, e in ex.tokens.spans()[prompt[keep]])
    a_red = ref.reduced_utilities(ex, [keep, np.arange(len(prompt))])
    np.testing.assert_allclose(a_red[0], direct_red, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a_red[1], a_full, rtol=1e-5, atol=1e-5)  # keeping everything changes nothing
    assert np.abs(a_red[0] - a_full).max() > 1e-3 * np.abs(a_full).max()


def test_bad_arguments(setup, tokenizer):
    scorer = setup[0]
    with pytest.raises(ValueError):
        ExactScores(scorer, perturb="delete")
    with pytest.raises(ValueError):
        ExactScores(scorer, perturb="replace")
    with pytest.raises(ValueError):
        neutral_token_id(tokenizer, "two words")
