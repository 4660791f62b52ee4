"""The run folders and side files (bridgecli.artifacts): typed metadata that reads the files earlier
versions wrote, one writer and one reader each, and the rule that leaves warmup's ids out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridgecli.artifacts.rows_meta import RowsMeta, StepParams, read_rows_meta, rows_meta_path, write_rows_meta
from bridgecli.artifacts.train_run import (CLEAR, FINISHED, IN_PLACE, REPLACE, SUMMARY, TrainSummary, check_run_dir,
                                           read_summary, write_summary)
from bridgecli.artifacts.warmup_run import META, WarmupMeta, WarmupRun
from bridgecli.data.examples import file_digest
from bridgecli.errors import InputError, ModelError, UsageError

#: warmup.json as the untyped writer of earlier versions laid it out, key for key
OLD_WARMUP = {
    "producer": "bridgecli 0.9.0", "created": "2026-11-01T10:00:00Z", "base_model": "m",
    "base_fingerprint": "sha256:aa", "tokenizer_fingerprint": "sha256:bb", "chat_template": True,
    "data": "data.jsonl", "data_digest": "sha256:cc", "warm_ids": ["a", "b"], "val": None, "val_ids": ["c"],
    "warm_examples": 2, "val_examples": 1, "val_loss": 1.5, "val_tokens": 12, "direction_layers": 4,
    "direction": {"lambda": 0.2, "eps": 1e-08, "g_target_norm": 3.0, "g_anchor_norm": 0.5, "v_norm": 1.0},
    "sft": {"epochs": 1.0, "lr": 2e-05, "lora": None}, "steps": 3, "final_train_loss": 1.25,
}


def make_run(root, meta: dict):
    (root / "checkpoint").mkdir(parents=True)
    (root / META).write_text(json.dumps(meta, indent=2))
    return root


def test_warmup_meta_reads_the_old_layout_and_writes_it_back_unchanged(tmp_path):
    run = WarmupRun.open(make_run(tmp_path / "w", OLD_WARMUP))
    meta = run.meta()
    assert meta.direction.lam == 0.2 and meta.warm_ids == ["a", "b"] and meta.sft["lr"] == 2e-05
    assert json.dumps(meta.to_dict(), indent=2) == json.dumps(OLD_WARMUP, indent=2)


def test_a_record_with_only_the_base_model_reads(tmp_path):
    meta = WarmupRun.open(make_run(tmp_path / "w", {"base_model": "m", "extra": 1})).meta()
    assert meta.base_model == "m" and meta.warm_ids is None and meta.direction is None
    assert meta.leave_out("sha256:0") is None  # no digest recorded: nothing to compare


@pytest.mark.parametrize("text, why", [("{}", "base_model"), ("{nope", "JSON"),
                                       ('{"base_model": "m", "steps": "x"}', "steps")])
def test_a_bad_record_is_one_error_naming_the_file(tmp_path, text, why):
    root = make_run(tmp_path / "w", {})
    (root / META).write_text(text)
    with pytest.raises(ModelError, match=why) as err:
        WarmupRun.open(root).meta()
    assert str(root / META) in str(err.value) and "\n" not in str(err.value)


def test_open_names_what_is_missing(tmp_path):
    (tmp_path / "w").mkdir()
    with pytest.raises(ModelError, match="is not a warmup run folder"):
        WarmupRun.open(tmp_path / "w")
    with pytest.raises(ModelError, match=f"is not a warmup run folder \\(no {META}\\)"):
        WarmupRun(tmp_path / "w").meta()  # a folder open() did not check: one error line, no traceback
    assert not WarmupRun.is_run(tmp_path / "w")
    assert WarmupRun.is_run(make_run(tmp_path / "v", {"base_model": "m"}))


def test_leave_out_only_for_the_file_warmup_read(tmp_path):
    data, other = tmp_path / "d.jsonl", tmp_path / "e.jsonl"
    data.write_text('{"prompt": "p", "response": "r"}\n')
    other.write_text('{"prompt": "q", "response": "s"}\n')
    meta = WarmupMeta(base_model="m", data_digest=file_digest(data), warm_ids=["a"], val_ids=["b", "a"])
    assert meta.leave_out(file_digest(data)) == {"a", "b"}
    assert meta.leave_out(file_digest(other)) is None
    no_warm = WarmupMeta(base_model="m", data_digest=file_digest(data), val_ids=["b"])
    assert no_warm.leave_out(file_digest(data)) == {"b"}
    assert WarmupMeta(base_model="m", data_digest=file_digest(data)).leave_out(file_digest(data)) == frozenset()


def test_rows_meta_round_trip_and_absence(tmp_path):
    rows = tmp_path / "train.jsonl"
    assert read_rows_meta(rows) is None
    meta = RowsMeta(format="jsonl", columns=["id"], model="m", tokenizer_fingerprint="t",
                    steps=[StepParams("score", {"batch_size": 3})], rows=2, dropped=["x"])
    path = write_rows_meta(rows, meta)
    assert path == rows_meta_path(rows) == tmp_path / "train.jsonl.bridge.json"
    assert read_rows_meta(rows) == meta
    assert json.loads(path.read_text())["steps"] == [{"step": "score", "params": {"batch_size": 3}}]
    path.write_text('{"model": "m"}')  # a side file that records less
    assert read_rows_meta(rows).model == "m"
    path.write_text('{"rows": "many"}')
    with pytest.raises(InputError, match="side file"):
        read_rows_meta(rows)


def test_train_summary_round_trip_and_run_dir_rules(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    assert read_summary(out) is None
    assert check_run_dir(out, resume=False, overwrite=False) == IN_PLACE  # empty: nothing to clear
    (out / "metrics.jsonl").write_text("")  # what a killed run without checkpoints leaves: cleared
    assert check_run_dir(out, resume=False, overwrite=False) == CLEAR
    assert check_run_dir(out, resume=False, overwrite=True) == REPLACE
    summary = TrainSummary(base_model="m", rows=3, steps=2, final_loss=0.5, packing=False, adapter=None)
    write_summary(out, summary)
    assert read_summary(out) == summary and not list(out.glob(".*partial"))
    assert json.loads((out / SUMMARY).read_text())["adapter"] is None
    with pytest.raises(UsageError, match=f"{out} holds a finished training run.*--overwrite"):
        check_run_dir(out, resume=False, overwrite=False)  # a finished run: never cleared silently
    assert check_run_dir(out, resume=False, overwrite=True) == REPLACE
    assert check_run_dir(out, resume=True, overwrite=False) == FINISHED  # nothing to train when it is this run
    (out / SUMMARY).unlink()
    (out / "checkpoints" / "step-000001").mkdir(parents=True)
    (out / "checkpoints" / "step-000001" / "trainer_state.json").write_text("{}")
    with pytest.raises(UsageError, match="--resume"):
        check_run_dir(out, resume=False, overwrite=False)
    assert check_run_dir(out, resume=False, overwrite=True) == REPLACE
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="holds no training run"):
        check_run_dir(other, resume=False, overwrite=True)


def test_rows_meta_of_rows_named_through_a_link(tmp_path):
    """Beside the rows the link names; a side file beside the link itself is read only when they have none."""
    (tmp_path / "store").mkdir()
    real, link = tmp_path / "store" / "train.jsonl", tmp_path / "train.jsonl"
    real.write_text("")
    link.symlink_to(Path("store") / "train.jsonl")
    beside_link = Path(str(link) + ".bridge.json")
    beside_link.write_text('{"model": "by-the-link"}')
    assert read_rows_meta(link).model == "by-the-link" and read_rows_meta(real) is None
    assert write_rows_meta(link, RowsMeta(model="m")) == rows_meta_path(real) == Path(str(real) + ".bridge.json")
    assert read_rows_meta(link).model == read_rows_meta(real).model == "m"
