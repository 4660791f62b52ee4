"""`bridge train` as a run: SIGKILL + --resume, two processes vs one, LoRA outputs, the run folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bridgecli.errors import UsageError
from bridgecli.steps.train import TrainOptions, run_train
from bridgecli.training.config import SFTConfig, lora_settings

from tiny import tiny_llama_config, tiny_model

IGNORE = -100
ENV = {**os.environ, "BRIDGE_NO_PROGRESS": "1", "OMP_NUM_THREADS": "1"}


# integration: train runs, two with processes of their own; one_thread: tests/conftest.py
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory, tokenizer):
    """A very small random Llama with the real tokenizer (so steps take milliseconds)."""
    folder = tmp_path_factory.mktemp("small-llama")
    tiny_model(tiny_llama_config(len(tokenizer), layers=2, hidden=16, heads=2, kv_heads=1)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(0)
    lines = []
    for i in range(16):
        n = int(rng.integers(8, 30))
        ids = rng.integers(5, 3000, size=n).tolist()
        start = int(rng.integers(2, n - 3))
        labels = [IGNORE] * start + [t if rng.random() < 0.7 else IGNORE for t in ids[start:]]
        labels[-1] = ids[-1]
        lines.append(json.dumps({"id": f"r{i}", "input_ids": ids, "labels": labels}))
    path = tmp_path_factory.mktemp("rows") / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def assert_same_weights(a: Path, b: Path, atol: float) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=atol, msg=k)


def losses(folder: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()]


def train_args(data, out, model, *extra):
    return ["train", str(data), "-o", str(out), "--model", str(model), "--lr", "1e-3", "--seed", "3", *map(str, extra)]


def test_sigkill_then_resume_ends_with_the_uninterrupted_weights(tmp_path, data, small_dir, forked_bridge):
    flags = ["--max-steps", 24, "--batch-size", 2, "--grad-accum", 2, "--epochs", 8]
    out = tmp_path / "killed"
    # a process of its own (a forked child: tests/forked_cli.py), on one thread as this one
    proc = forked_bridge.start(train_args(data, out, small_dir, *flags, "--save-every", 2), env=ENV)
    mark = out / "checkpoints" / "step-000004" / "trainer_state.json"
    deadline = time.monotonic() + 240
    while not mark.exists():
        assert proc.poll() is None, proc.stderr.decode()
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "bridge_train.json").exists()  # killed mid-run, not after
    # debris a kill can leave: a half-written checkpoint, and one without its state file
    (out / "checkpoints" / ".step-000022.partial").mkdir(exist_ok=True)
    (out / "checkpoints" / "step-000022").mkdir(exist_ok=True)

    cfg = lambda: SFTConfig(lr=1e-3, seed=3, max_steps=24, batch_size=2, grad_accum=2, epochs=8, save_every=2)  # noqa: E731
    with pytest.raises(UsageError, match="--resume"):  # a fresh run never clobbers checkpoints
        run_train(TrainOptions(data=str(data), out=out, model=str(small_dir), sft=cfg()))
    with pytest.raises(UsageError, match="lr"):  # nor does a resume with other settings
        run_train(TrainOptions(data=str(data), out=out, model=str(small_dir), resume=True,
                               sft=SFTConfig(**{**cfg().__dict__, "lr": 2e-3})))
    resumed = run_train(TrainOptions(data=str(data), out=out, model=str(small_dir), sft=cfg(), resume=True))
    assert 4 <= resumed["resumed_from_step"] < 24 and resumed["steps"] == 24
    ref = tmp_path / "ref"
    full = run_train(TrainOptions(data=str(data), out=ref, model=str(small_dir),
                                  sft=SFTConfig(lr=1e-3, seed=3, max_steps=24, batch_size=2, grad_accum=2, epochs=8)))
    assert full["resumed_from_step"] == 0
    assert_same_weights(out, ref, atol=1e-6)
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 25))
    np.testing.assert_allclose(losses(out), losses(ref), rtol=1e-6)
    kept = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert kept == ["step-000022"]  # --keep-checkpoints 1 (the default); the debris is gone


def test_two_processes_give_the_one_process_result(tmp_path, data, small_dir):
    """torchrun with 2 CPU processes (gloo, DDP through accelerate): each rank takes a share of every
    step (3 rows: one rank runs a no-loss micro-batch to join the sync), loss scaled by world / Z."""
    flags = ["--max-steps", 4, "--batch-size", 1, "--grad-accum", 3, "--epochs", 2]
    two = tmp_path / "two"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "bridgecli", *train_args(data, two, small_dir, *flags)],
                          env=ENV, capture_output=True, timeout=400)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    one = tmp_path / "one"
    run_train(TrainOptions(data=str(data), out=one, model=str(small_dir),
                           sft=SFTConfig(lr=1e-3, seed=3, max_steps=4, batch_size=1, grad_accum=3, epochs=2)))
    summary = json.loads((two / "bridge_train.json").read_text())
    assert summary["processes"] == 2 and summary["steps"] == 4
    np.testing.assert_allclose(losses(two), losses(one), rtol=1e-5)
    assert_same_weights(two, one, atol=1e-5)
    assert proc.stderr.decode().count("train: ") == 1  # rank 0 reports


def test_lora_saves_adapter_and_a_merged_model_eval_can_load(tmp_path, data, small_dir):
    from peft import PeftModel

    from bridgecli.modeling.loading import load_model

    out = tmp_path / "lora"
    summary = run_train(TrainOptions(data=str(data), out=out, model=str(small_dir), sft=SFTConfig(
        lr=1e-2, max_steps=3, batch_size=4, grad_accum=1,
        lora=lora_settings("q_proj,v_proj", r=4, alpha=8, dropout=0.0))))
    assert summary["adapter"] == "adapter" and summary["lora"]["targets"] == ["q_proj", "v_proj"]
    assert summary["train_flops"] is None and summary["flops_formula"] is None  # the formula's factor 3 needs every weight
    assert (out / "adapter" / "adapter_config.json").exists() and (out / "config.json").exists()
    merged = load_model(str(out))
    assert not any("lora" in n for n, _ in merged.named_parameters())
    base = load_model(str(small_dir))
    adapted = PeftModel.from_pretrained(load_model(str(small_dir)), str(out / "adapter")).eval()
    ids = torch.tensor([[5, 17, 300, 42, 9, 1000]])
    with torch.no_grad():
        m, a, b = (x(input_ids=ids).logits for x in (merged, adapted, base))
    torch.testing.assert_close(m, a, rtol=1e-4, atol=1e-4)
    assert (m - b).abs().max() > 1e-4  # the adapter learned something
    # only the adapters trained: the merged weights differ from the base only where LoRA sat
    wb, wm = dict(base.named_parameters()), dict(merged.named_parameters())
    changed = {n for n in wb if not torch.equal(wb[n], wm[n])}
    assert changed and all(n.endswith(("q_proj.weight", "v_proj.weight")) for n in changed)


def test_cli_flags_reach_the_run(tmp_path, data, small_dir):
    from typer.testing import CliRunner

    from bridgecli.cli.app import app

    runner = CliRunner()
    res = runner.invoke(app, train_args(data, tmp_path / "o", small_dir, "--max-steps", 1, "--no-packing",
                                        "--max-tokens-per-batch", 40, "--batch-size", 4, "--grad-accum", 2))
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "o" / "bridge_train.json").read_text())
    assert summary["packing"] is False and summary["sft"]["max_tokens_per_batch"] == 40
    rec = json.loads((tmp_path / "o" / "metrics.jsonl").read_text().splitlines()[0])
    assert rec["rows"] == 8 and rec["micro_batches"] > 1 and rec["computed_tokens"] > rec["executed_tokens"]
    assert {"loss", "lr", "grad_norm", "tokens", "tokens_per_s", "elapsed", "flops"} <= rec.keys()
    # the run's training FLOPs (bridgecli.training.flops): its one step's, with the formula beside them
    assert summary["train_flops"] == pytest.approx(rec["flops"]) and "N_mm" in summary["flops_formula"]
    for bad, flag in ((["--save-every", 0], "--save-every"), (["--resume", "--overwrite"], "--resume")):
        res = runner.invoke(app, train_args(data, tmp_path / "x", small_dir, *bad))
        assert res.exit_code == 2 and flag in res.output
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not a run")
    res = runner.invoke(app, train_args(data, tmp_path / "mine", small_dir, "--max-steps", 1))
    assert res.exit_code == 2 and "holds no training run" in res.output
    assert (tmp_path / "mine" / "notes.txt").exists()
    res = runner.invoke(app, train_args(data, tmp_path / "o", small_dir, "--max-steps", 1))  # a finished run: kept
    assert res.exit_code == 2 and "holds a finished training run" in res.output and "--overwrite" in res.output
    res = runner.invoke(app, train_args(data, tmp_path / "o", small_dir, "--max-steps", 1, "--overwrite"))  # replaced
    assert res.exit_code == 0, res.output


# -- a full disk during a checkpoint (issue 40) ------------------------------------------------------


def _small_disk(monkeypatch, free: int) -> None:
    """statvfs reports ``free`` bytes left everywhere (what `check_room` and the write errors read)."""
    real = os.statvfs

    def statvfs(path):
        st = real(path)
        return os.statvfs_result((st.f_bsize, 1, st.f_blocks, free, free, *st[5:]))

    monkeypatch.setattr(os, "statvfs", statvfs)


def test_a_checkpoint_that_would_not_fit_is_refused_naming_enospc(tmp_path, data, small_dir, monkeypatch):
    # a train ended with ".../model: cannot write: the write failed": 18 GB checkpoints had filled the disk
    from bridgecli.errors import WriteError
    from bridgecli.training.checkpoint import MARGIN, estimate_bytes  # noqa: F401  (what the check adds)

    _small_disk(monkeypatch, free=2 * 2**20)
    out = tmp_path / "run"
    sft = SFTConfig(lr=1e-3, seed=3, max_steps=4, batch_size=2, grad_accum=1, epochs=4, save_every=2)
    with pytest.raises(WriteError) as info:
        run_train(TrainOptions(data=str(data), out=out, model=str(small_dir), sft=sft))
    text = str(info.value)
    assert "cannot write the checkpoint of step 2: No space left on device (ENOSPC, 2.1 MB free there" in text
    assert "it takes about" in text and str(out / "checkpoints" / "step-000002") in text
    assert not out.exists()  # nothing --resume could continue: the run leaves no folder


def test_a_checkpoint_write_that_loses_its_errno_names_the_cause(tmp_path, data, small_dir, monkeypatch):
    # torch.save writing a file it opened itself loses the errno; a probe write next to it finds it
    import accelerate

    from bridgecli import io as bio
    from bridgecli.errors import WriteError

    real_save, calls = accelerate.Accelerator.save_state, []

    def save_state(self, output_dir=None, **kwargs):
        calls.append(output_dir)
        if len(calls) == 2:  # the second checkpoint meets a full disk, as torch reports it
            Path(output_dir, "optimizer.bin").write_bytes(b"x" * 1000)
            raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 704 vs 598")
        return real_save(self, output_dir, **kwargs)

    monkeypatch.setattr(accelerate.Accelerator, "save_state", save_state)
    monkeypatch.setattr(bio, "probe_errno", lambda path: 28)  # ENOSPC, as the probe write would fail
    out = tmp_path / "run"
    sft = SFTConfig(lr=1e-3, seed=3, max_steps=6, batch_size=2, grad_accum=1, epochs=4, save_every=2)
    with pytest.raises(WriteError) as info:
        run_train(TrainOptions(data=str(data), out=out, model=str(small_dir), sft=sft))
    assert "cannot write: No space left on device (ENOSPC, " in str(info.value) and "free there" in str(info.value)
    assert str(out / "checkpoints" / "step-000004") in str(info.value)
    # the run keeps what --resume continues: its complete checkpoint, not the partial one
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000002"]
    monkeypatch.setattr(accelerate.Accelerator, "save_state", real_save)
    resumed = run_train(TrainOptions(data=str(data), out=out, model=str(small_dir), sft=sft, resume=True))
    assert resumed["resumed_from_step"] == 2 and resumed["steps"] == 6


def test_full_sft_at_another_runs_compute_with_max_flops(tmp_path, data, small_dir):
    """The compute-matched control a user runs: train a share of the rows, then full SFT with --max-flops of
    its bridge_train.json's train_flops. The control stops at the step nearest those FLOPs (recorded as its
    max_steps), says so, and a --resume of it finished is this same run: nothing trained."""
    from typer.testing import CliRunner

    from bridgecli.cli.app import app

    lines = Path(data).read_text().splitlines()
    half = tmp_path / "half.jsonl"
    half.write_text("\n".join(lines[::2]) + "\n")  # 8 of the 16 rows
    runner = CliRunner()
    flags = ["--batch-size", 2, "--grad-accum", 2, "--epochs", 2]
    res = runner.invoke(app, train_args(half, tmp_path / "sel", small_dir, *flags))
    assert res.exit_code == 0, res.output
    target = json.loads((tmp_path / "sel" / "bridge_train.json").read_text())["train_flops"]
    control = [*flags, "--max-flops", repr(target)]
    res = runner.invoke(app, train_args(data, tmp_path / "ctl", small_dir, *control))
    assert res.exit_code == 0, res.output
    assert f"--max-flops {target:.4g}: " in res.output and "of 8 steps" in res.output
    summary = json.loads((tmp_path / "ctl" / "bridge_train.json").read_text())
    assert summary["sft"]["max_flops"] == target and summary["steps"] == summary["sft"]["max_steps"] < 8
    steps = [json.loads(x) for x in (tmp_path / "ctl" / "metrics.jsonl").read_text().splitlines()]
    # the nearest step count: one step more or less is no nearer
    total = sum(h["flops"] for h in steps)
    assert summary["train_flops"] == pytest.approx(total)
    assert abs(total - target) <= abs(total - steps[-1]["flops"] - target)
    res = runner.invoke(app, train_args(data, tmp_path / "ctl", small_dir, *control, "--resume"))
    assert res.exit_code == 0 and "already finished" in res.output, res.output


def test_max_flops_with_lora_is_refused_before_the_model_loads(tmp_path, data, small_dir, monkeypatch):
    """The FLOPs formula has no figure for LoRA (frozen weights): --max-flops with --lora is one error line
    and exit 2 before any model loads (a real model takes seconds to minutes to load), and no run folder."""
    from typer.testing import CliRunner

    import bridgecli.steps.train as train_step
    from bridgecli.cli.app import app

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(train_step, "load_model", no_load)
    res = CliRunner().invoke(app, train_args(data, tmp_path / "run", small_dir, "--lora", "--max-flops", "1e9"))
    assert res.exit_code == 2, res.output
    assert "--max-flops: the FLOPs formula has no figure for a LoRA run" in res.output
    assert not (tmp_path / "run").exists()
