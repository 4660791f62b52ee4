"""Parameter validation in the step layer (Python callers get it too) and one-line errors for bad
paths and encodings: every numeric option has its range, NaN and infinity are refused."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from bridgecli.data.sources import jsonl_objects, read_records
from bridgecli.errors import FormatError, InputError, UsageError
from bridgecli.format import read_all
from bridgecli.format.reader import open_reader
from bridgecli.format.spec import MAGIC, PREAMBLE
from bridgecli.io import check_output_file, open_binary_input, open_binary_output
from bridgecli.runtime import params
from bridgecli.steps.close import CloseOptions, run_close
from bridgecli.steps.score import ScoreOptions, run_score
from bridgecli.steps.select import SelectOptions, run_select
from bridgecli.steps.train import TrainOptions, read_rows, run_train
from bridgecli.steps.warmup import WarmupOptions, run_warmup
from bridgecli.data.examples import DataOptions
from bridgecli.training.config import SFTConfig

GOLDEN = Path(__file__).parent / "golden"
NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("run, opts, flag", [
    (run_warmup, WarmupOptions(data="x.jsonl", val="v.jsonl", lam=NAN), "--lambda"),
    (run_warmup, WarmupOptions(data="x.jsonl", val="v.jsonl", lam=-1), "--lambda"),
    (run_warmup, WarmupOptions(data="x.jsonl", val="v.jsonl", sft=SFTConfig(batch_size=-4)), "--batch-size"),
    (run_warmup, WarmupOptions(data="x.jsonl", val="v.jsonl", sft=SFTConfig(batch_size=0)), "--batch-size"),
    (run_warmup, WarmupOptions(data="x.jsonl", warm_fraction=1.0, val_fraction=0.1), "--warm-fraction"),
    (run_warmup, WarmupOptions(data="x.jsonl", val_fraction=NAN), "--val-fraction"),
    (run_warmup, WarmupOptions(data="x.jsonl", val="v.jsonl", direction_layers=0), "--direction-layers"),
    (run_train, TrainOptions(data="x.jsonl", sft=SFTConfig(epochs=-1)), "--epochs"),
    (run_train, TrainOptions(data="x.jsonl", sft=SFTConfig(epochs=INF)), "--epochs"),
    (run_train, TrainOptions(data="x.jsonl", sft=SFTConfig(lr=-1)), "--lr"),
    (run_train, TrainOptions(data="x.jsonl", sft=SFTConfig(lr=NAN)), "--lr"),
    (run_train, TrainOptions(data="x.jsonl", sft=SFTConfig(warmup_ratio=2)), "--warmup-ratio"),
    (run_train, TrainOptions(data="x.jsonl", sft=SFTConfig(max_grad_norm=NAN)), "--max-grad-norm"),
    (run_train, TrainOptions(data="x.jsonl", sft=SFTConfig(max_steps=0)), "--max-steps"),
    (run_train, TrainOptions(data="x.jsonl", sft=SFTConfig(seed=-1)), "--seed"),
    (run_score, ScoreOptions(data="x.jsonl", window=0), "--window"),
    (run_score, ScoreOptions(data="x.jsonl", batch_size=0), "--batch-size"),
    (run_score, ScoreOptions(data="x.jsonl", batch_size=-1), "--batch-size"),
    (run_score, ScoreOptions(data="x.jsonl", max_tokens=-5), "--max-tokens"),
    (run_score, ScoreOptions(data="x.jsonl", data_opts=DataOptions(limit=-1)), "--limit"),
    (run_score, ScoreOptions(data="x.jsonl", data_opts=DataOptions(max_length=0)), "--max-length"),
    (run_score, ScoreOptions(data="x.jsonl", attention_layers=0), "--attention-layers"),
    (run_select, SelectOptions(inp="x.bridge", rounds=99999999999999999999), "-T/--rounds"),
    (run_select, SelectOptions(inp="x.bridge", rounds=0), "-T/--rounds"),
    (run_select, SelectOptions(inp="x.bridge", rho_p=NAN), "--rho-p"),
    (run_select, SelectOptions(inp="x.bridge", rho_r=INF), "--rho-r"),
    (run_close, CloseOptions(inp="x.bridge", alpha=NAN), "--alpha"),
])
def test_out_of_range_parameters_are_refused_before_anything_is_read(run, opts, flag):
    with pytest.raises(UsageError) as info:
        run(opts)
    message = str(info.value)
    assert message.startswith(flag + " must be") and "\n" not in message
    assert info.value.exit_code == 2


@pytest.mark.parametrize("value", [True, 1.5, "3", None])
def test_integer_checks_refuse_other_types(value):
    with pytest.raises(UsageError):
        params.integer("--n", value)


def test_real_checks_bounds():
    params.real("--x", 0.0, low=0, high=1)
    params.real("--x", 1, low=0, high=1)
    for bad in (NAN, INF, -INF, -0.1, 1.1, "0.5", True):
        with pytest.raises(UsageError):
            params.real("--x", bad, low=0, high=1)
    with pytest.raises(UsageError, match=r"in \(0, 1\)"):
        params.real("--x", 0, low=0, high=1, low_open=True, high_open=True)


@pytest.mark.parametrize("method", ["bridge", "one-pass", "independent"])
def test_unknown_select_options_are_refused(method):
    with pytest.raises(UsageError, match="has no option 'foo'"):
        run_select(SelectOptions(inp=str(GOLDEN / "v1.1-scores.bridge"), method=method, options={"foo": "bar"}))


@pytest.mark.parametrize("device, message", [("bogus", "not a device"), ("cuda:99", None), ("cuda", None),
                                             ("meta", "not supported")])
def test_devices_are_checked(device, message):
    import torch

    if device.startswith("cuda") and torch.cuda.is_available() and device == "cuda":
        params.check_device(device)
        return
    with pytest.raises(UsageError) as info:
        params.check_device(device)
    assert str(info.value).startswith(f"--device {device}: ")
    if message:
        assert message in str(info.value)


def test_format_major_version_zero_is_refused(tmp_path):
    path = tmp_path / "v0.bridge"
    path.write_bytes(PREAMBLE.pack(MAGIC, 0, 1) + b"\0" * 64)
    with pytest.raises(FormatError, match="format 0.1 does not exist"):
        with open_reader(path):
            pass


def test_non_utf8_jsonl_names_file_and_line(tmp_path):
    plain = tmp_path / "bad.jsonl"
    plain.write_bytes(b'{"prompt": "a", "response": "b"}\n\n{"prompt": "\xff", "response": "b"}\n')
    with pytest.raises(InputError) as info:
        list(jsonl_objects(plain))
    assert str(info.value) == f"{plain}, line 3: not UTF-8 text (byte 0xff at column 13)"
    packed = tmp_path / "bad.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    with pytest.raises(InputError, match="line 3: not UTF-8"):
        list(read_records(packed))
    whole = tmp_path / "bad.json"
    whole.write_bytes(b'[{"prompt": "\xff"}]')
    with pytest.raises(InputError, match="not UTF-8"):
        list(read_records(whole))


def test_bridge_stream_or_folder_given_to_train(tmp_path):
    with pytest.raises(InputError, match="a bridge stream, not a file of training rows"):
        read_rows(GOLDEN / "v1.1-closure.bridge", 50000)
    with pytest.raises(InputError, match="a folder"):
        read_rows(tmp_path, 50000)


def test_folders_and_unwritable_outputs(tmp_path):
    with pytest.raises(UsageError, match="a folder, not a file"):
        with open_binary_input(tmp_path):
            pass
    for bad in (tmp_path, tmp_path / "file" / "x.bridge", Path("/proc/no/such.bridge")):
        if bad.name == "x.bridge":
            (tmp_path / "file").write_text("")
        with pytest.raises(UsageError) as info:
            check_output_file(bad)
        assert "\n" not in str(info.value)
    with pytest.raises(UsageError, match="a folder"):
        with open_binary_output(tmp_path):
            pass
    check_output_file(tmp_path / "new" / "out.bridge")  # a folder that does not exist yet is fine
    assert not (tmp_path / "new").exists()


@pytest.mark.integration  # starts a `bridge` process (a forked child: tests/forked_cli.py)
def test_cli_reports_one_line(forked_bridge):
    done = forked_bridge.run(["score", "x.jsonl", "--max-tokens", "-5"])
    assert done.returncode == 2
    assert done.stderr.decode().strip() == "bridge score: error: --max-tokens must be an integer >= 1, got -5"


@pytest.mark.parametrize("changes, flag", [
    ({"batch_size": 0}, "--batch-size"), ({"max_new_tokens": -5}, "--max-new-tokens"),
    ({"code_timeout": NAN}, "--code-timeout"), ({"few_shot": -1}, "--few-shot"), ({"limit": 0}, "--limit"),
])
def test_eval_numbers(changes, flag):
    from bridgecli.evaluation.run import evaluate

    with pytest.raises(UsageError, match=f"^{flag} must be"):
        evaluate(None, None, "gsm8k", "x.jsonl", **changes)


def test_max_length_defaults_to_the_model_limit():
    from types import SimpleNamespace

    from bridgecli.data.examples import Report, with_model_limit

    model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=8192))
    assert with_model_limit(DataOptions(), model).max_length == 8192
    assert with_model_limit(DataOptions(max_length=100), model).max_length == 100
    with pytest.raises(UsageError, match="beyond the model's limit of 8192"):
        with_model_limit(DataOptions(max_length=100_000), model)
    assert with_model_limit(DataOptions(), SimpleNamespace(config=SimpleNamespace())).max_length is None
    report = Report(too_long=["a", "b"], max_length=8192)
    assert report.lines() == ["skipped 2 examples longer than --max-length 8192 (a, b)"]


@pytest.mark.integration  # loads the default model's tokenizer (seconds)
def test_long_examples_are_skipped_and_reported(tmp_path):
    from types import SimpleNamespace

    from bridgecli.data.examples import Report, iter_examples, with_model_limit
    from bridgecli.modeling.loading import load_tokenizer, resolve

    tokenizer = load_tokenizer(resolve(None))
    data = tmp_path / "d.jsonl"
    data.write_text('{"id": "short", "prompt": "hi", "response": "ok"}\n'
                    '{"id": "long", "prompt": "' + "word " * 400 + '", "response": "ok"}\n')
    opts = with_model_limit(DataOptions(), SimpleNamespace(config=SimpleNamespace(max_position_embeddings=64)))
    report = Report()
    kept = [e.id for e in iter_examples(data, tokenizer, opts, report)]
    assert kept == ["short"] and report.too_long == ["long"]
    assert "longer than --max-length 64" in report.lines()[0]


def test_rows_carry_their_tokenizer_and_train_checks_it(tmp_path):
    import json

    from bridgecli.errors import ModelError
    from bridgecli.steps.compact import CompactOptions, run_compact

    out = tmp_path / "train.jsonl"
    run_compact(CompactOptions(inp=str(GOLDEN / "v1.1-closure.bridge"), out=str(out)))
    header, _ = read_all(GOLDEN / "v1.1-closure.bridge")
    fp = header.model.tokenizer_fingerprint
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(r["tokenizer_fingerprint"] == fp for r in rows)
    renamed = tmp_path / "renamed.jsonl"  # no side file next to it
    renamed.write_text(out.read_text())
    assert len(read_rows(renamed, 50000, fp)) == len(rows)
    with pytest.raises(ModelError) as info:
        read_rows(renamed, 50000, "sha256:other", "smollm2")
    assert str(info.value).startswith(f"{renamed}, line 1, field 'tokenizer_fingerprint': this row was tokenised")
    assert info.value.exit_code == 5
