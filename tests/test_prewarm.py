"""The prewarm process of bridge score (modeling/prewarm.py): what it builds and scores, and when it
does not start. Its effect (a first run's kernels compiled while the model loads) needs a GPU and
an empty Triton cache: docs/benchmarks.md measures it."""

import torch
from transformers import AutoConfig

from bridgecli.modeling import prewarm
from tiny import tiny_llama_config


def _folder(tmp_path, tie_word_embeddings=False):
    cfg = tiny_llama_config(300, layers=5, hidden=48)
    cfg.tie_word_embeddings = tie_word_embeddings
    cfg.save_pretrained(tmp_path)
    return tmp_path


def test_main_scores_random_blocks_of_the_checkpoints_config(tmp_path, monkeypatch):
    folder = _folder(tmp_path)
    built = {}
    original = prewarm.examples

    def spy(lengths, vocab):
        built.setdefault("lengths", []).append(lengths)
        return original(lengths, vocab)

    monkeypatch.setattr(prewarm, "examples", spy)
    assert prewarm.main([str(folder), "float32", "cpu", "2"]) == 0
    assert built["lengths"] == [(256, 216), (203,)]
    assert 256 % 16 == 0 and 203 % 16 != 0  # both of Triton's specialisations of a length


def test_examples_have_the_asked_lengths_and_every_kind():
    exs = prewarm.examples((256, 203, 40), vocab=300)
    assert [len(e.tokens.input_ids) for e in exs] == [256, 203, 40]
    for e in exs:
        assert set(e.tokens.kinds) == {0, 1, 2, 3} and max(e.tokens.input_ids) < 300


def test_config_bytes_counts_what_main_builds(tmp_path):
    from transformers import AutoModelForCausalLM

    for tied in (True, False):
        folder = _folder(tmp_path / str(tied), tie_word_embeddings=tied)
        cfg = AutoConfig.from_pretrained(folder)
        cfg.num_hidden_layers = 3
        model = AutoModelForCausalLM.from_config(cfg)
        norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
        params = sum(p.numel() for p in model.parameters()) - norms  # the estimate leaves norms out
        assert prewarm._config_bytes(cfg, 3, 2) == 2 * params


def test_start_does_nothing_off_a_gpu_or_when_turned_off(tmp_path, monkeypatch):
    folder = _folder(tmp_path)
    assert prewarm.start(str(folder), "bfloat16", "cpu", 4) is None
    monkeypatch.setenv("BRIDGE_PREWARM", "0")
    assert prewarm.start(str(folder), "bfloat16", "cuda:0", 4) is None
    monkeypatch.delenv("BRIDGE_PREWARM")
    if not torch.cuda.is_available():  # no GPU to ask about: still nothing, and no process
        assert prewarm.start(str(folder), "bfloat16", "cuda:0", 4) is None
