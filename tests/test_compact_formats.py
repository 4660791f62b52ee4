"""bridge compact --format jsonl|parquet|hf with --columns trl|axolotl|torchtune|loss-mask: each
output loads the way its trainer loads it and carries exactly the rows of the default JSONL."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.errors import UsageError
from bridgecli.steps import compact as compact_mod
from bridgecli.steps.compact import CompactOptions, run_compact
from bridgecli.steps.train import read_rows
from bridgecli.training.layouts import LAYOUTS, Layout, register
from bridgecli.training.rows import Row

from tiny import interrupting

datasets = pytest.importorskip("datasets")

STREAM = Path(__file__).parent / "golden" / "v1.1-closure.bridge"
IGNORE = -100


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The rows of the default output (JSONL, trl columns)."""
    out = tmp_path_factory.mktemp("ref") / "train.jsonl"
    run_compact(CompactOptions(inp=str(STREAM), out=str(out)))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(set(r) == {"id", "input_ids", "labels", "tokenizer_fingerprint"} for r in rows)
    return rows


def write(tmp_path, fmt, columns):
    out = tmp_path / {"jsonl": "rows.jsonl", "parquet": "rows.parquet", "hf": "rows"}[fmt]
    run_compact(CompactOptions(inp=str(STREAM), out=str(out), format=fmt, columns=columns))
    return out


def load(out: Path, fmt: str):
    """As the trainers load them: datasets' json/parquet builders, or load_from_disk (LLaMA-Factory's
    tokenized_path, TRL with a saved dataset)."""
    if fmt == "hf":
        return datasets.load_from_disk(str(out))
    return datasets.load_dataset("json" if fmt == "jsonl" else "parquet", data_files=str(out), split="train",
                                 cache_dir=str(out.parent / "cache"))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "hf"])
@pytest.mark.parametrize("columns", list(LAYOUTS))
def test_every_layout_and_format_carries_the_same_rows(tmp_path, reference, fmt, columns):
    """Every registered layout, in every format: exactly its columns, and its trainer's reading of each
    row (``Layout.read``) gives back the token ids and labels of the default rows."""
    layout = LAYOUTS[columns]
    ds = load(write(tmp_path, fmt, columns), fmt)
    assert sorted(ds.column_names) == sorted(layout.columns) and len(ds) == len(reference)
    for got, ref in zip(ds, reference):
        assert layout.read(got) == (ref["input_ids"], ref["labels"])
        assert got == layout.record(Row(ref["id"], ref["input_ids"], ref["labels"]), ref["tokenizer_fingerprint"])
    meta = json.loads(Path(str(tmp_path / {"jsonl": "rows.jsonl", "parquet": "rows.parquet", "hf": "rows"}[fmt])
                           + ".bridge.json").read_text())
    assert meta["format"] == fmt and meta["columns"] == list(layout.columns) and meta["rows"] == 3
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file or folder left


def test_the_layouts_conventions(reference):
    """What each trainer expects, as its documentation states it: TRL the labels as given; axolotl
    exactly input_ids, attention_mask (all 1), labels; torchtune a boolean mask, True where no loss is
    taken (its SFTTransform: labels = np.where(mask, CROSS_ENTROPY_IGNORE_IDX, tokens)); a 0/1 loss mask,
    1 where the token is a target. The command line's choices and help come from the same entries."""
    from bridgecli.steps.options import CompactOptions as Options
    from bridgecli.optionspec import field_of

    assert list(LAYOUTS) == ["trl", "axolotl", "torchtune", "loss-mask"]
    for ref in reference:
        row = Row(ref["id"], ref["input_ids"], ref["labels"])
        ids, labels = ref["input_ids"], ref["labels"]
        assert LAYOUTS["trl"].record(row, ref["tokenizer_fingerprint"]) == ref
        assert LAYOUTS["axolotl"].record(row, "") == {"input_ids": ids, "attention_mask": [1] * len(ids),
                                                     "labels": labels}
        tune = LAYOUTS["torchtune"].record(row, "")
        assert tune["tokens"] == ids and all(isinstance(m, bool) for m in tune["mask"])
        assert list(np.where(tune["mask"], IGNORE, tune["tokens"])) == labels
        mask = LAYOUTS["loss-mask"].record(row, "")["loss_mask"]
        assert set(mask) <= {0, 1} and [t if m else IGNORE for t, m in zip(ids, mask)] == labels
    spec, default = field_of(Options, "columns")
    assert spec.choices == tuple(LAYOUTS) and default == "trl"
    assert all(f"{name}: {layout.summary}" in spec.help for name, layout in LAYOUTS.items())
    assert [name for name, layout in LAYOUTS.items() if layout.weights] == ["trl"]


def test_a_layout_is_checked_when_registered():
    with pytest.raises(ValueError, match="already registered"):
        register(LAYOUTS["trl"])
    bad = Layout("x", {"input_ids": "int32"}, lambda row, fp: {}, lambda record: ([], []), "input_ids")
    with pytest.raises(ValueError, match="unknown column types"):
        register(bad)
    assert "x" not in LAYOUTS


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "hf"])
def test_bridge_train_reads_the_trl_rows_in_every_format(tmp_path, reference, fmt):
    rows = read_rows(write(tmp_path, fmt, "trl"), vocab_size=49152)
    assert [(r.id, r.input_ids, r.labels) for r in rows] == [(r["id"], r["input_ids"], r["labels"]) for r in reference]


@pytest.mark.integration  # builds TRL's SFTTrainer (seconds)
def test_trl_sft_trainer_takes_the_labels_as_given(tmp_path, reference, tokenizer):
    pytest.importorskip("trl")
    from trl import SFTConfig, SFTTrainer

    from tiny import tiny_llama_config, tiny_model

    for fmt in ("jsonl", "hf"):
        ds = load(write(tmp_path / fmt, fmt, "trl"), fmt)
        args = SFTConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=3, report_to=[], use_cpu=True,
                         max_length=None, save_strategy="no", max_steps=1)
        model = tiny_model(tiny_llama_config(len(tokenizer), layers=1, hidden=16, heads=2, kv_heads=1))
        trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tokenizer)
        ours = {tuple(r["input_ids"]): r["labels"][1:] for r in reference}
        seen = 0
        for batch in trainer.get_train_dataloader():
            keep = batch["attention_mask"].bool()
            for i in range(batch["input_ids"].shape[0]):
                ids = batch["input_ids"][i][keep[i]].tolist()
                assert batch["labels"][i][keep[i]].tolist()[1:] == ours[tuple(ids)]
                seen += 1
        assert seen == 3


def test_axolotl_rows_collate_as_seq2seq_rows(tmp_path, reference, tokenizer):
    """axolotl (and LLaMA-Factory) pad pre-tokenised rows with transformers' DataCollatorForSeq2Seq:
    labels padded with -100, the attention mask with 0."""
    from transformers import DataCollatorForSeq2Seq

    ds = load(write(tmp_path, "hf", "axolotl"), "hf")
    batch = DataCollatorForSeq2Seq(tokenizer, padding=True)([ds[i] for i in range(len(ds))])
    for i, ref in enumerate(reference):
        n = len(ref["input_ids"])
        assert batch["labels"][i].tolist()[:n] == ref["labels"]
        assert set(batch["labels"][i].tolist()[n:]) <= {IGNORE}
        assert batch["attention_mask"][i].sum() == n


def test_stdout_errors_and_atomic_output(tmp_path, reference, monkeypatch):
    piped = CliRunner().invoke(app, ["compact", str(STREAM)])
    assert piped.exit_code == 0
    assert [json.loads(line) for line in piped.stdout.splitlines()] == reference
    piped = CliRunner().invoke(app, ["compact", str(STREAM), "--columns", "loss-mask"])
    assert piped.exit_code == 0 and "loss_mask" in piped.stdout
    for args, message in ((["--format", "parquet"], "needs a path"), (["--format", "hf"], "needs a path"),
                          (["--columns", "nope"], "--columns must be one of trl, axolotl, torchtune, loss-mask"),
                          (["--format", "text", "--columns", "axolotl"], "--columns applies to")):
        bad = CliRunner().invoke(app, ["compact", str(STREAM), *args])
        assert bad.exit_code == UsageError.exit_code and message in bad.output, bad.output

    calls = []
    monkeypatch.setattr(compact_mod, "columns_of", interrupting(compact_mod.columns_of, calls, at=3))
    for fmt, name in (("hf", "rows"), ("parquet", "rows.parquet")):
        calls.clear()
        with pytest.raises(KeyboardInterrupt):
            run_compact(CompactOptions(inp=str(STREAM), out=str(tmp_path / name), format=fmt))
    assert list(tmp_path.iterdir()) == []  # nothing half-written, no temporary left


def _with_model(tmp_path, source: str) -> Path:
    """The golden stream with another model source in its header."""
    import msgspec

    from bridgecli.format.reader import open_reader
    from bridgecli.format.writer import open_writer

    out = tmp_path / "relabelled.bridge"
    with open_reader(STREAM) as reader:
        header = msgspec.structs.replace(reader.header, model=msgspec.structs.replace(reader.header.model,
                                                                                      source=source))
        with open_writer(out, header) as writer:
            for ex in reader:
                writer.write(ex)
    return out


def test_rows_over_the_model_limit_are_reported(tmp_path, reference):
    """compact knows the model from the stream's header and reads its limit from the model's files."""
    lengths = sorted(len(r["input_ids"]) for r in reference)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": lengths[1] - 1}))
    result = CliRunner().invoke(app, ["compact", str(_with_model(tmp_path, str(model))), "-o",
                                      str(tmp_path / "rows.jsonl")])
    assert result.exit_code == 0, result.output
    longest = max(reference, key=lambda r: len(r["input_ids"]))
    warning = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert warning == [f"warning: 2 of 3 rows are longer than {lengths[1] - 1:,} tokens, the model's limit "
                       f"(max_position_embeddings of {model}) (the longest, {longest['id']}, has {lengths[2]:,}): "
                       "`bridge train` refuses them, or clips them with `bridge train --clip-long-rows`"]
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == 3  # written all the same
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": lengths[2]}))
    quiet = CliRunner().invoke(app, ["compact", str(_with_model(tmp_path, str(model))), "-o",
                                     str(tmp_path / "rows.jsonl")])
    assert quiet.exit_code == 0 and "warning" not in quiet.stderr
    gone = CliRunner().invoke(app, ["compact", str(_with_model(tmp_path, str(tmp_path / "moved"))), "-o",
                                    str(tmp_path / "rows.jsonl")])
    assert gone.exit_code == 0 and "warning" not in gone.stderr  # no model files here: nothing to say


@pytest.mark.integration  # starts Python processes
def test_hf_sweeps_the_scratch_folders_of_killed_runs_only(tmp_path):
    """`--format hf` works in a `.bridge-compact.*` folder next to the output; a SIGKILL leaves it. The
    next run removes those that no process holds, never a running one's (held by its lock)."""
    import fcntl
    import os

    old = 3600
    stale = tmp_path / ".bridge-compact.abcd_123"
    stale.mkdir()
    (stale / "rows.parquet").write_bytes(b"x" * 100)
    live = tmp_path / ".bridge-compact.live0001"
    live.mkdir()
    other = tmp_path / ".bridge-compactor.zzzz9999"  # not one of ours
    other.mkdir()
    for p in (stale, live, other):
        os.utime(p, (p.stat().st_atime - old, p.stat().st_mtime - old))
    held = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        run_compact(CompactOptions(inp=str(STREAM), out=str(tmp_path / "rows"), format="hf"))
        assert not stale.exists() and live.exists() and other.exists()
        leftover = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".bridge-compact."))
        assert leftover == [live.name]
        _killed_run_is_swept(tmp_path, live)
    finally:
        os.close(held)
    run_compact(CompactOptions(inp=str(STREAM), out=str(tmp_path / "rows"), format="hf"))
    assert not live.exists()  # its holder is gone


def _killed_run_is_swept(tmp_path, live):
    import os
    import subprocess
    import sys


    # a run killed mid-write leaves its folder; the next run sweeps it once it is older than a few seconds
    code = ("import os, sys\nfrom bridgecli.steps import compact as c\nfrom bridgecli.steps.compact import *\n"
            "real = c.columns_of\n"
            "def kill(*a, **k):\n    os.kill(os.getpid(), 9)\n"
            "c.columns_of = kill\n"
            f"run_compact(CompactOptions(inp={str(STREAM)!r}, out={str(tmp_path / 'k')!r}, format='hf'))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True)
    assert done.returncode == -9
    killed = [p for p in tmp_path.iterdir() if p.name.startswith(".bridge-compact.") and p != live]
    assert len(killed) == 1
    os.utime(killed[0], (killed[0].stat().st_atime - 3600, killed[0].stat().st_mtime - 3600))
    run_compact(CompactOptions(inp=str(STREAM), out=str(tmp_path / "k"), format="hf"))
    assert not killed[0].exists() and live.exists()


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "hf"])
@pytest.mark.parametrize("existing", [True, False])
def test_an_output_given_as_a_symbolic_link_gets_its_side_file_beside_the_rows(tmp_path, reference, fmt, existing):
    """`-o link`: the rows replace the file (or folder) the link names and the link stays; the side
    file lands beside those rows, named after them, as every step's temporary files and locks do, so
    `bridge train` finds it through either name. Nothing lands beside the link."""
    from bridgecli.artifacts.rows_meta import read_rows_meta

    from bridgecli.io import real_path

    name = {"jsonl": "rows.jsonl", "parquet": "rows.parquet", "hf": "rows"}[fmt]
    store = tmp_path / "store"
    store.mkdir()
    real = store / name
    link = tmp_path / "link"
    link.symlink_to(Path("store") / name)
    if not existing:  # a link to nothing: refused, and nothing made where it points (issue 40)
        result = CliRunner().invoke(app, ["compact", str(STREAM), "--format", fmt, "-o", str(link)])
        assert result.exit_code == 2 and "a link to nothing" in result.output, result.output
        assert list(store.iterdir()) == []
        return
    # an earlier output of compact's there
    assert CliRunner().invoke(app, ["compact", str(STREAM), "--format", fmt, "-o", str(real)]).exit_code == 0
    result = CliRunner().invoke(app, ["compact", str(STREAM), "--format", fmt, "-o", str(link)])
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and real_path(link) == real
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "store"]
    assert sorted(p.name for p in store.iterdir()) == [name, f"{name}.bridge.json"]
    assert [(r["input_ids"], r["labels"]) for r in load(link, fmt)] == [
        (r["input_ids"], r["labels"]) for r in reference]
    meta = json.loads((store / f"{name}.bridge.json").read_text())
    assert meta["format"] == fmt and meta["rows"] == 3
    assert read_rows_meta(link) == read_rows_meta(real) and read_rows_meta(link).rows == 3
