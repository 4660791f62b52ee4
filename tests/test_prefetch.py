"""Reading and tokenising in a child process (data/prefetch.py) gives the examples, the report and
the errors of doing it in process, and `bridge score` writes the same bytes either way."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from bridgecli.data.examples import DataOptions, Report, iter_examples
from bridgecli.data.prefetch import TokenizeProcess, handover, prefetch_examples, wanted
from bridgecli.errors import BridgeError

pytestmark = pytest.mark.integration  # tokenises in a child process

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "data" / "train.jsonl"


def encoded(examples) -> list[bytes]:
    return [msgspec.msgpack.encode(ex) for ex in examples]


def test_the_child_yields_the_in_process_examples_and_report(tokenizer, tiny_model_dir):
    opts = DataOptions(limit=40, max_length=180, shard=(1, 2), exclude_ids=frozenset({"3"}))
    mine, theirs = Report(), Report()
    got = list(prefetch_examples(str(SAMPLE), str(tiny_model_dir), opts, mine))
    want = list(iter_examples(str(SAMPLE), tokenizer, opts, theirs))
    assert got and encoded(got) == encoded(want)
    assert mine == theirs and mine.lines() == theirs.lines()


@pytest.mark.parametrize("first", [0, 7, 500, None])
def test_handover_yields_the_in_process_examples_and_report(tokenizer, tiny_model_dir, tmp_path, first):
    """Records tokenised here until the child is ready (and at least those before ``first``), the rest
    in the child: the same examples in the same order and the same report as one in-process pass,
    wherever the handover falls (at 0, inside the limit, past the end; None: a child whose tokenizer
    does not load is never ready, and everything is tokenised here)."""
    opts = DataOptions(limit=60, max_length=180, shard=(1, 2), exclude_ids=frozenset({"train-0002", "train-0008"}))
    mine, theirs = Report(), Report()
    proc = TokenizeProcess(str(tiny_model_dir) if first is not None else str(tmp_path / "missing"))
    try:
        if first is not None:
            assert proc.ready.wait(timeout=120)
        else:
            proc.proc.wait(timeout=120)  # it failed to load its tokenizer and ended
            assert not proc.ready.is_set()
        got = list(handover(str(SAMPLE), tokenizer, opts, mine, proc, first=first or 0))
        assert proc.used == (first in (0, 7))  # the child took over (not past the end, not when never ready)
    finally:
        proc.close()
    want = list(iter_examples(str(SAMPLE), tokenizer, opts, theirs))
    assert got and encoded(got) == encoded(want)
    assert mine == theirs and mine.lines() == theirs.lines() and theirs.too_long and theirs.excluded


def test_an_error_in_the_child_comes_after_the_examples_before_it(tokenizer, tiny_model_dir, tmp_path):
    lines = SAMPLE.read_text().splitlines()
    lines[40] = '{"question": 3}'  # no response: a one-line InputError naming the file and line
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")

    def run(examples):
        ids = []
        with pytest.raises(BridgeError) as info:
            for ex in examples:
                ids.append(ex.id)
        return ids, type(info.value), str(info.value)

    got = run(prefetch_examples(str(bad), str(tiny_model_dir), DataOptions()))
    want = run(iter_examples(str(bad), tokenizer, DataOptions()))
    assert got == want and len(got[0]) == 40 and "line 41" in got[2]


def test_a_tokenizer_that_does_not_load_is_the_in_process_error(tmp_path):
    from bridgecli.errors import ModelError
    from bridgecli.modeling.loading import load_tokenizer

    missing = str(tmp_path / "nothing")
    with pytest.raises(ModelError) as want:
        load_tokenizer(missing)
    with pytest.raises(ModelError) as got:
        list(prefetch_examples(str(SAMPLE), missing, DataOptions()))
    assert str(got.value) == str(want.value)


def test_stopping_early_ends_the_child(tiny_model_dir):
    proc = TokenizeProcess(str(tiny_model_dir))
    examples = proc.examples(str(SAMPLE), DataOptions())
    next(examples)
    examples.close()
    assert proc.proc.poll() is not None


def test_wanted_follows_the_environment(monkeypatch):
    monkeypatch.delenv("BRIDGE_TOKENIZE_PROCESS", raising=False)
    assert wanted("cuda:0") and not wanted("cpu")  # auto: on a GPU only
    monkeypatch.setenv("BRIDGE_TOKENIZE_PROCESS", "auto")
    assert wanted("cuda:0") and not wanted("cpu")
    monkeypatch.setenv("BRIDGE_TOKENIZE_PROCESS", "0")
    assert not wanted("cuda")
    monkeypatch.setenv("BRIDGE_TOKENIZE_PROCESS", "1")
    assert wanted("cpu")


def test_the_child_loads_a_fast_tokenizer_without_torch(tiny_model_dir, monkeypatch, capfd):
    """A folder with tokenizer.json: the child imports transformers with torch hidden (its CUDA
    libraries are most of its start on a GPU host) and still yields the in-process examples (above)."""
    monkeypatch.setenv("BRIDGE_TIMINGS", "1")
    assert list(prefetch_examples(str(SAMPLE), str(tiny_model_dir), DataOptions(limit=3)))
    assert "tokenising process: transformers imported (without torch)" in capfd.readouterr().err


def test_which_tokenizers_load_without_torch(tiny_model_dir, tmp_path):
    import json
    import shutil

    from bridgecli.modeling.loading import tokenizer_loads_without_torch

    assert tokenizer_loads_without_torch(str(tiny_model_dir))
    remote = tmp_path / "remote"
    shutil.copytree(tiny_model_dir, remote)
    config = json.loads((remote / "tokenizer_config.json").read_text())
    (remote / "tokenizer_config.json").write_text(json.dumps({**config, "auto_map": {"AutoTokenizer": ["x.T", None]}}))
    assert not tokenizer_loads_without_torch(str(remote))  # remote code may import torch
    (remote / "tokenizer.json").unlink()
    (remote / "tokenizer_config.json").unlink()
    assert not tokenizer_loads_without_torch(str(remote))  # no fast tokenizer file
    assert not tokenizer_loads_without_torch(str(tmp_path / "missing"))
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert not tokenizer_loads_without_torch(str(tmp_path / "m.gguf"))  # not converted yet
