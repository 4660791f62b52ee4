"""The grids' statistics (bridgecli.analysis.grid_stats, which bench/results/grid_table.py prints): bootstrap
intervals and paired differences against direct computation on small synthetic results; the script's
tables and Finding-3 plot, run as a process."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bridgecli.analysis import grid_stats as gt

from tiny import results_script

ROOT = Path(__file__).resolve().parents[1]


def _tables(tmp_path: Path, runs: dict) -> subprocess.CompletedProcess:
    """grid_table.py on a results file of ``runs`` (100 resamples), as a process that must succeed."""
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"runs": runs}))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "results" / "grid_table.py"), str(path),
                           "--plot", str(tmp_path / "f3.png"), "--resamples", "100"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc


def _groups(results: dict) -> dict:
    """(method, rho) -> per-file [seeds, examples, 2] arrays, seeds in order (as grid_table groups them)."""
    by: dict = {}
    for run in sorted(results["runs"].values(), key=lambda r: r["seed"]):
        key = (run["method"], float(run["rho"]))
        for f, h in run["heldout"].items():
            by.setdefault(key, {}).setdefault(f, []).append(np.asarray(h["items"], dtype=np.float64))
    return {k: {f: np.stack(v) for f, v in files.items()} for k, files in by.items()}


def _results(rng, offsets):
    toks = {"gsm8k": rng.integers(5, 40, 12), "math500": rng.integers(5, 60, 9)}
    runs = {}
    for method, off in offsets.items():
        for rho in (0.5, 0.75):
            for seed in (42, 3407):
                held = {}
                for f, t in toks.items():
                    sums = (1.0 + off + rng.normal(0, 0.2, len(t))) * t
                    held[f] = {"loss": float(sums.sum() / t.sum()), "ci_low": 0.0, "ci_high": 0.0,
                               "tokens": int(t.sum()), "n": len(t),
                               "items": [[float(a), int(b)] for a, b in zip(sums, t)]}
                runs[f"{method}/{rho:g}/{seed}"] = {
                    "method": method, "rho": rho, "seed": seed, "heldout": held,
                    "tokens": {"executed": 100, "supervised": 50}, "seconds": {"total": 3}}
    return {"runs": runs}


def test_intervals_and_paired_differences():
    rng = np.random.default_rng(0)
    results = _results(rng, {"bridge": 0.0, "independent": 0.1})
    groups = _groups(results)
    a, b = groups[("bridge", 0.5)]["gsm8k"], groups[("independent", 0.5)]["gsm8k"]
    # the point estimate is the seed mean of the token-mean losses
    point, lo, hi = gt.interval(a, 200)
    direct = np.mean([r["heldout"]["gsm8k"]["loss"] for r in results["runs"].values()
                      if r["method"] == "bridge" and r["rho"] == 0.5])
    assert point == pytest.approx(direct) and lo <= point <= hi
    # one resample, by hand: the same example indices for every seed and both models
    idx = np.random.default_rng(0).integers(0, a.shape[1], size=(200, a.shape[1]))
    by_hand = np.mean([a[s, idx[0], 0].sum() / a[s, idx[0], 1].sum() for s in range(2)])
    assert gt.resampled(a, idx)[0] == pytest.approx(by_hand)
    d, dlo, dhi = gt.paired(a, b, 200)
    assert d == pytest.approx(point - gt.interval(b, 200)[0]) and dlo <= d <= dhi
    assert gt.paired(a, a, 200) == (0.0, 0.0, 0.0)  # a model against itself: no noise at all
    assert gt.paired(a, groups[("bridge", 0.5)]["math500"], 200) is None  # other examples


@pytest.mark.integration  # runs the script as a process
def test_table_and_plot(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_results(np.random.default_rng(1), {"bridge": 0.0, "independent": 0.1,
                                                                     "random": 0.2})))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "results" / "grid_table.py"), str(path),
                           "--plot", str(tmp_path / "f3.png"), "--resamples", "100"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    first = out.split("\n\n")[0]  # the held-out-loss table
    rows = [line for line in first.splitlines() if line.startswith("| bridge |")]
    assert len(rows) == 2 and "[" in rows[0]  # one per retention, with an interval
    assert "| independent | 0.5 |" in out and "| random | 0.75 |" in out  # the paired table
    assert (tmp_path / "f3.png").stat().st_size > 0
    # without --plot the tables alone: nothing is written beside the results (a default finding3.png there once
    # overwrote the committed plot of another grid in the same folder)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "results" / "grid_table.py"), str(path),
                           "--resamples", "100"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == out, proc.stderr
    assert sorted(f.name for f in tmp_path.iterdir()) == ["f3.png", "results.json"]
    (tmp_path / "cut.json").write_text(path.read_text()[:100])  # a copy cut short: one line, exit 2
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "results" / "grid_table.py"), str(tmp_path / "cut.json")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"grid_table.py: error: {tmp_path / 'cut.json'}: not JSON (line ")
    assert len(proc.stderr.splitlines()) == 1


def test_item_intervals_and_paired_differences_against_direct_computation():
    rng = np.random.default_rng(3)
    a = (rng.random((3, 40)) < 0.6).astype(float)  # 3 seeds x 40 items, 0/1
    b = (rng.random((3, 40)) < 0.4).astype(float)
    point, lo, hi = gt.item_interval(a, 500)
    assert point == pytest.approx(a.mean()) and lo <= point <= hi
    d, dlo, dhi = gt.item_paired(a, b, 500)
    assert d == pytest.approx(a.mean() - b.mean()) and dlo <= d <= dhi
    assert gt.item_paired(a, a, 200) == (0.0, 0.0, 0.0)
    # NaN items (an answer span not found) are left out of both sides
    c = a.copy()
    c[:, 0] = np.nan
    d2 = gt.item_paired(c, b, 200)
    assert d2[0] == pytest.approx(a[:, 1:].mean() - b[:, 1:].mean())
    assert gt.item_paired(a, b[:, :10], 200) is None


@pytest.mark.integration  # runs the script as a process
@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GRID_JOBS": "42:full"}, "GRID_JOBS: 42:full is not SEED:METHOD:RHO"),
        ({"GRID_JOBS": "42:bridge:0.5 x:bridge:0.5"}, "GRID_JOBS: x:bridge:0.5 is not"),
        ({"GRID_JOBS": "42:brdige:0.5"}, "GRID_JOBS: 42:brdige:0.5 is not"),
        ({"GRID_JOBS": "42:full:0.5"}, "GRID_JOBS: 42:full:0.5 is not"),
        ({"GRID_JOBS": "42:random:1.5"}, "GRID_JOBS: 42:random:1.5 is not"),
        ({"GRID_JOBS": "42:random:.5"}, "GRID_JOBS: 42:random:.5 is not"),
        ({"GRID_JOBS": "42:random:0.5:7"}, "GRID_JOBS: 42:random:0.5:7 is not"),
        ({"METHODS": "full randon"}, "METHODS: unknown row randon"),
        ({"EVAL_LANES": "3"}, "EVAL_LANES=3: expected 1 or 2"),
        # a compute-matched control names a trained row: not base, full or another control
        ({"GRID_JOBS": "42:full-match-base:0.5"}, "GRID_JOBS: 42:full-match-base:0.5 is not"),
        ({"GRID_JOBS": "42:full-match-full:0.5"}, "GRID_JOBS: 42:full-match-full:0.5 is not"),
        ({"GRID_JOBS": "42:full-match-full-match-random:0.5"}, "is not SEED:METHOD:RHO"),
        ({"METHODS": "full-match-randon"}, "METHODS: unknown row full-match-randon"),
        ({"GENERAL": "arc_challenge mmlux"}, "GENERAL: unknown task mmlux"),
        ({"REFS": "base"}, "REFS must be 0 or 1"),
        # two grids share a machine through CUDA_VISIBLE_DEVICES: the workers' GPUs are its entries
        ({"GPUS": "2", "CUDA_VISIBLE_DEVICES": "3"}, "GPUS=2 but CUDA_VISIBLE_DEVICES=3 names 1"),
        ({"GPUS": "2", "CUDA_VISIBLE_DEVICES": "0,2"}, "no such file"),
        # well-formed: refused only later, for the missing data folder
        ({"GRID_JOBS": "42:full:1 3407:random-resp:0.5 7:bridge-resp:0.75"}, "no such file"),
        ({"GRID_JOBS": "42:full-match-example-importance:0.5 42:rho-loss:0.5 42:bridge-resp-trim:0.5"}, "no such file"),
    ],
)
def test_grid_refuses_malformed_jobs_before_any_work(tmp_path, env, message):
    """A job word of the wrong shape once started three GPU workers that failed at once; grid.sh now refuses
    it (and an unknown METHODS row) before making any folder."""
    out = tmp_path / "grid"
    proc = subprocess.run(
        ["bash", str(ROOT / "bench/results/grid.sh"), str(tmp_path / "no-data"), str(out)],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert not out.exists()


@pytest.mark.integration  # runs bash
@pytest.mark.parametrize(
    ("key", "general", "expected"),
    [
        ("full/1/42", "arc_challenge hellaswag", 0),  # every GENERAL task in the entry: skipped
        ("full/1/42", "", 0),
        ("partial/0.5/42", "", 0),  # a grid without GENERAL takes the entry as it is
        ("partial/0.5/42", "arc_challenge hellaswag", 1),  # lacks hellaswag: redone
        ("absent/0.5/42", "", 1),
    ],
)
def test_a_row_recorded_without_a_general_task_is_redone(tmp_path, key, general, expected):
    """A row recorded from a lost machine's state (its evaluation lane cut) is in results.json without some
    GENERAL task; a later machine seeded with that file redoes it instead of skipping it."""
    script = (ROOT / "bench/results/grid.sh").read_text()
    start = script.index("recorded() {")
    function = script[start : script.index("\n}\n", start) + 3]
    (tmp_path / "results.json").write_text(json.dumps({"runs": {
        "full/1/42": {"general": {"arc_challenge": {}, "hellaswag": {}}},
        "partial/0.5/42": {"general": {"arc_challenge": {}}},
    }}))
    proc = subprocess.run(["bash", "-c", f'{function}\nrecorded "$1"', "-", key], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "out": str(tmp_path), "PYTHON": sys.executable,
                               "GENERAL": general}, timeout=60)
    assert proc.returncode == expected, proc.stderr


@pytest.mark.integration  # runs bash
def test_grid_workers_know_how_many_share_their_gpu(tmp_path):
    """grid.sh with PROCS_PER_GPU=2 starts two workers on one GPU, each told GRID_GPU_PROCS=2 (which
    grid_record.py keeps as cost.gpu_processes). Until 2026-11-29 the worker's command set PROCS_PER_GPU=1
    before GRID_GPU_PROCS=$PROCS_PER_GPU, and bash expands a command's assignments in order: every worker was
    told 1. Both jobs are recorded already, so each worker's Python calls are its checks of them (and the table)."""
    data, out = tmp_path / "data", tmp_path / "grid"
    for name in ("gsm8k/train.jsonl", "gsm8k/test.jsonl", "math/math500_test.jsonl"):
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_text("")
    (out / "done").mkdir(parents=True)
    (out / "done" / "data").write_text("0")
    (out / "results.json").write_text(json.dumps({"runs": {"random/0.5/42": {}, "full/1/42": {}}}))
    log = tmp_path / "python.log"
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/bash\necho "${{GRID_GPU_PROCS:-unset}} ${{GRID_CLAIM:-0}}" >> {log}\n'
                       f'exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    proc = subprocess.run(
        ["bash", str(ROOT / "bench/results/grid.sh"), str(data), str(out)],
        env={"PATH": "/usr/bin:/bin", "PYTHON": str(wrapper), "MIX": "gsm8k", "GPUS": "1", "PROCS_PER_GPU": "2",
             "CUDA_VISIBLE_DEVICES": "0", "REFS": "0", "GRID_JOBS": "42:random:0.5 42:full:1"},
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    workers = [line.split()[0] for line in log.read_text().splitlines() if line.endswith(" 1")]
    assert len(workers) >= 2 and set(workers) == {"2"}, log.read_text()


@pytest.mark.integration  # runs bash
@pytest.mark.parametrize("lanes", ["1", "2"])
def test_each_general_log_likelihood_task_runs_in_its_own_eval_process(tmp_path, lanes):
    """grid.sh evaluates each log-likelihood task of GENERAL with a `bridge eval` of its own, marked done one
    by one (eval-TASK): side by side with EVAL_LANES=2 (until 2026-11-30 the three ran in one process, the
    longest lane of a pair of rows), one after another with EVAL_LANES=1. A logging `bridge` stands in; the
    base row's evaluation is the whole job."""
    data, out = tmp_path / "data", tmp_path / "grid"
    for name in ("gsm8k/train.jsonl", "gsm8k/test.jsonl", "math/math500_test.jsonl",
                 "arc/ARC-Challenge-Test.jsonl", "hellaswag/hellaswag_val_full.txt.bz2", "mmlu/test/x.csv"):
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        (data / name).write_text("")
    (out / "done").mkdir(parents=True)
    (out / "done" / "data").write_text("0")
    log = tmp_path / "bridge.log"
    fake = tmp_path / "bridge"
    fake.write_text(f'#!/bin/bash\ntask=$(echo "$*" | grep -o -- "--task [^ ]*")\necho "start $task" >> {log}\n'
                    f'sleep 1\necho "end $task" >> {log}\n')
    fake.chmod(0o755)
    python = tmp_path / "python"  # grid_record.py and grid_table.py have nothing to read: skipped
    python.write_text(f'#!/bin/bash\ncase "$1" in *grid_record.py|*grid_table.py) exit 0 ;; esac\n'
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    proc = subprocess.run(
        ["bash", str(ROOT / "bench/results/grid.sh"), str(data), str(out)],
        env={"PATH": "/usr/bin:/bin", "PYTHON": str(python), "BRIDGE": str(fake), "MIX": "gsm8k",
             "GENERAL": "arc_challenge hellaswag mmlu", "EVAL_LANES": lanes, "REFS": "0",
             "GRID_JOBS": "0:base:1", "METHODS": "base"},
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    events = log.read_text().splitlines()
    general = [e.split(" ", 1) for e in events if e.split()[-1] in ("arc_challenge", "hellaswag", "mmlu")]
    assert sorted(task for kind, task in general if kind == "start") == [
        "--task arc_challenge", "--task hellaswag", "--task mmlu"]
    kinds = [kind for kind, _ in general]
    assert kinds == (["start"] * 3 + ["end"] * 3 if lanes == "2" else ["start", "end"] * 3), events
    for task in ("arc_challenge", "hellaswag", "mmlu"):
        assert (out / "done" / f"runs_base_eval-{task}").is_file()
    assert not (out / "done" / "runs_base_eval-general").exists()


@pytest.mark.integration  # runs the script as a process
def test_rows_against_full_sft_and_rank_agreement(tmp_path):
    """Every row minus full SFT (rho 1, compared at each row's own retention), and how many pairs of trained
    rows each loss orders as accuracy does, counted by hand on four rows."""
    rng = np.random.default_rng(5)
    n = 40
    # accuracy (fraction correct) and answer loss per row
    rows = {"full": (1.0, 0.9, 0.10), "random": (0.5, 0.6, 0.30), "bridge": (0.5, 0.2, 0.20),
            "tilt": (0.5, 0.4, 0.40), "base": (1.0, 0.3, 2.00)}
    runs = {}
    for method, (rho, acc, loss) in rows.items():
        correct = np.zeros(n, dtype=int)
        correct[: round(acc * n)] = 1
        runs[f"{method}/{rho:g}/42"] = {
            "method": method, "rho": rho, "seed": 42,
            "gsm8k_accuracy": {"accuracy": float(correct.mean()), "n": n, "items": correct.tolist()},
            "answer_loss": {"gsm8k": {"loss": loss, "n": n, "items": (loss + rng.normal(0, 0.01, n)).tolist()}},
            "tokens": {"executed": 100, "supervised": 50}, "seconds": {"total": 3}}
    proc = _tables(tmp_path, runs)
    versus_full = proc.stdout.split("| minus full |")[1].split("\n\n")[0]
    lines = {line.split(" | ")[0].strip("| "): line for line in versus_full.splitlines()[2:]}
    assert sorted(lines) == ["base", "bridge", "random", "tilt"]  # base: what training adds; full is the reference
    assert lines["base"].startswith("| base | - | -60.0 [")
    assert lines["random"].startswith("| random | 0.5 | -30.0 [")  # 60% against 90%, at random's retention
    assert lines["bridge"].startswith("| bridge | 0.5 | -70.0 [")
    # (accuracy, loss): full .9/.1, random .6/.3, tilt .4/.4, bridge .2/.2: bridge's low loss puts it above
    # random and tilt, where accuracy puts it below both; the other 4 pairs agree
    assert "| GSM8K answer loss | 4 | 4 of 6 |" in proc.stdout


@pytest.mark.integration  # runs the script as a process
def test_rows_against_a_named_reference_row(tmp_path):
    """``--versus METHOD`` adds every row minus METHOD at the same retention (here random-resp, the response-only
    random draw), and refuses a METHOD the file has no row for."""
    n = 20
    rows = {"random-resp": 0.7, "bridge-resp": 0.4, "random": 0.5}
    runs = {}
    for method, acc in rows.items():
        correct = np.zeros(n, dtype=int)
        correct[: round(acc * n)] = 1
        runs[f"{method}/0.5/42"] = {
            "method": method, "rho": 0.5, "seed": 42,
            "gsm8k_accuracy": {"accuracy": float(correct.mean()), "n": n, "items": correct.tolist()},
            "tokens": {"executed": 100, "supervised": 50}, "seconds": {"total": 3}}
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"runs": runs}))
    script = [sys.executable, str(ROOT / "bench" / "results" / "grid_table.py"), str(path),
              "--plot", str(tmp_path / "f3.png"), "--resamples", "100"]
    proc = subprocess.run([*script, "--versus", "random-resp"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    table = proc.stdout.split("| minus random-resp |")[1].split("\n\n")[0]
    lines = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
    assert sorted(lines) == ["bridge-resp", "random"]
    assert lines["bridge-resp"].startswith("| bridge-resp | 0.5 | -30.0 [")
    assert lines["random"].startswith("| random | 0.5 | -20.0 [")
    bad = subprocess.run([*script, "--versus", "tilt-resp"], capture_output=True, text=True)
    assert bad.returncode == 2 and "no tilt-resp row to compare with" in bad.stderr


@pytest.mark.integration  # runs the script as a process
def test_seed_matched_rows(tmp_path):
    """``--seed S`` keeps only seed S's runs (and the untrained base row): the rows are that seed's accuracies,
    not the mean over seeds; a seed with no runs is refused."""
    n = 20
    rows = {("random-resp", 42): 0.5, ("random-resp", 3407): 0.7, ("importance-resp", 42): 0.6,
            ("importance-resp", 3407): 0.9, ("base", None): 0.3}
    runs = {}
    for (method, seed), acc in rows.items():
        correct = np.zeros(n, dtype=int)
        correct[: round(acc * n)] = 1
        runs[f"{method}/{seed}"] = {
            "method": method, "rho": 1.0 if seed is None else 0.5, "seed": seed,
            "gsm8k_accuracy": {"accuracy": float(correct.mean()), "n": n, "items": correct.tolist()},
            "tokens": {"executed": 100, "supervised": 50}, "seconds": {"total": 3}}
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"runs": runs}))
    script = [sys.executable, str(ROOT / "bench" / "results" / "grid_table.py"), str(path),
              "--plot", str(tmp_path / "f3.png"), "--resamples", "100", "--versus", "random-resp"]

    def versus(*extra):
        proc = subprocess.run([*script, *extra], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        table = proc.stdout.split("| minus random-resp |")[1].split("\n\n")[0]
        return {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}

    assert versus()["importance-resp"].startswith("| importance-resp | 0.5 | 15.0 [")  # 75% - 60%, seed means
    assert versus("--seed", "42")["importance-resp"].startswith("| importance-resp | 0.5 | 10.0 [")
    assert versus("--seed", "3407")["importance-resp"].startswith("| importance-resp | 0.5 | 20.0 [")
    bad = subprocess.run([*script, "--seed", "7"], capture_output=True, text=True)
    assert bad.returncode == 2 and "no random-resp row to compare with" in bad.stderr


def test_results_file_is_one_line_per_run_and_round_trips(tmp_path):
    """grid_record.py writes results.json with one compact line per run (the kept grids are carried to a
    lent GPU machine in every call, beside the model pieces); the kept files are in that form."""
    dumps = results_script("grid_record").dumps
    results = {
        "format": "bridge-grid/1",
        "runs": {"a/0.5/42": {"heldout": {"gsm8k": {"items": [[1.5, 3], [2.0, 4]]}}}, "base/1/-": {"x": None}},
        "note": "two machines",
    }
    text = dumps(results)
    assert json.loads(text) == results
    lines = text.splitlines()
    assert sum(line.startswith('  "a/0.5/42": {') for line in lines) == 1 and len(lines) == 8
    assert json.loads(dumps({"format": "x", "runs": {}})) == {"format": "x", "runs": {}}
    for kept in ("grid-h100.json", "grid-qwen05.json", "grid-qwen05-general.json"):
        text = (ROOT / "bench/results/results" / kept).read_text()
        assert text == dumps(json.loads(text)), kept


def test_task_mean_is_the_mean_of_task_scores_and_pairs_each_task_on_its_own():
    """The general average: the mean over tasks of each task's seed-mean score (tasks of any size weigh the
    same), a stratified bootstrap whose first resample matches a hand computation, and a paired difference
    whose point is the difference of the averages; NaN items are left out on both sides."""
    rng = np.random.default_rng(1)
    a = [rng.integers(0, 2, (2, n)).astype(float) for n in (7, 30, 3)]
    b = [rng.integers(0, 2, (2, n)).astype(float) for n in (7, 30, 3)]
    point, lo, hi = gt.task_mean(a, 300)
    assert point == pytest.approx(np.mean([t.mean() for t in a])) and lo <= point <= hi
    draw = np.random.default_rng(0)
    first = np.mean([t[:, draw.integers(0, t.shape[1], size=(300, t.shape[1]))[0]].mean() for t in a])
    again = np.random.default_rng(0)
    idx = [again.integers(0, t.shape[1], size=(300, t.shape[1])) for t in a]
    scores = np.mean([t[:, i].mean(-1).mean(0) for t, i in zip(a, idx)], axis=0)
    assert scores[0] == pytest.approx(first)
    d, dlo, dhi = gt.task_mean(a, 300, against=b)
    assert d == pytest.approx(np.mean([x.mean() for x in a]) - np.mean([y.mean() for y in b]))
    assert dlo <= d <= dhi
    assert gt.task_mean(a, 300, against=a)[0:3] == (0.0, 0.0, 0.0)
    a_nan = [t.copy() for t in a]
    a_nan[1][0, 4] = np.nan  # item 4 of task 1 dropped from both sides
    keep = np.ones(30, bool)
    keep[4] = False
    d2 = gt.task_mean(a_nan, 300, against=b)[0]
    expected = np.mean([a[0].mean() - b[0].mean(), a[1][:, keep].mean() - b[1][:, keep].mean(), a[2].mean() - b[2].mean()])
    assert d2 == pytest.approx(expected)
    assert gt.task_mean(a, 300, against=b[:2]) is None
    assert gt.task_mean(a, 300, against=[b[0], b[1][:, :5], b[2]]) is None


_GENERAL_SIZES = {"arc_challenge": 10, "hellaswag": 20, "mmlu": 40, "humaneval": 8}


def _general(scores) -> dict:
    """Each general task with hand-set items: a share ``s`` of its ``n`` items right, the first ones."""
    out = {}
    for (task, n), s in zip(_GENERAL_SIZES.items(), scores):
        items = [1] * round(s * n) + [0] * (n - round(s * n))
        out[task] = {"metric": "acc", "score": s, "n": n, "accuracy": s, "items": items}
    return out


@pytest.mark.integration  # runs the script as a process
def test_general_capability_cost_and_verdict_tables(tmp_path):
    """The retention columns (each task, General Avg. as the mean of the task scores, minus full SFT and minus
    base, paired), each task minus full SFT, the cost table against full SFT's FLOPs and pipeline seconds, and
    the verdict table, on three rows whose scores are set by hand."""
    share = {"base": (0.5, 0.5, 0.5, 0.5), "full": (0.6, 0.5, 0.25, 0.25), "example-importance": (0.6, 0.5, 0.5, 0.5)}
    cost = {"base": None, "full": (4e15, 400, 100), "example-importance": (2e15, 250, 150)}
    runs = {}
    for method, scores in share.items():
        general = _general(scores)
        correct = [1] * (30 if method == "full" else 20) + [0] * (50 if method == "full" else 60)
        rho = 0.5 if method == "example-importance" else 1.0
        run = {"method": method, "rho": rho, "seed": None if method == "base" else 42, "general": general,
               "gsm8k_accuracy": {"accuracy": sum(correct) / 80, "n": 80, "items": correct},
               "tokens": {"executed": 100, "supervised": 50}, "seconds": {"total": 3}}
        if cost[method]:
            flops, train_s, shared_s = cost[method]
            run["cost"] = {"train_steps": 10, "train_executed": 1000, "train_computed": 1200, "train_flops": flops,
                           "pipeline_seconds": {"warmup": shared_s, "select": 5, "close": 0, "compact": 5,
                                                "train": train_s},
                           "pipeline_total": shared_s + 10 + train_s, "train_step_seconds": train_s - 20.4,
                           "train_between_steps_seconds": 10.0}
        runs[f"{method}/{rho:g}/{run['seed'] or '-'}"] = run
    proc = _tables(tmp_path, runs)
    general = proc.stdout.split("| method | rho | seeds | ARC-C % |")[1].split("\n\n")[0]
    lines = {line.split(" | ")[0].strip("| "): line for line in general.splitlines()[2:]}
    # General Avg.: the tasks' mean, each task weighing the same whatever its size
    assert " | 50.0 [" in lines["base"] and " | 40.0 [" in lines["full"] and " | 52.5 [" in lines["example-importance"]
    assert lines["example-importance"].endswith(" | 12.5 [" + lines["example-importance"].split(" | 12.5 [")[1])
    per_task = proc.stdout.split("| minus full | rho | seeds | ARC-C (paired) |")[1].split("\n\n")[0]
    assert "| example-importance | 0.5 | 1 | 0.0 [0.0, 0.0] | 0.0 [0.0, 0.0] | 25.0 [" in per_task
    costs = proc.stdout.split("| method | rho | seeds | train steps |")[1].split("\n\n")[0]
    # less the time between training steps (10 s each): 400 / 500
    assert "| example-importance | 0.5 | 1 | 10 | 1,000 | 1,200 | 2e+15 | 0.50 | 410 | 150 | 0.80 | 230 | 10 | 0.80 |" in costs
    verdict = proc.stdout.split("| method | rho | seeds | GSM8K acc minus full SFT |")[1].split("\n\n")[0]
    assert "| example-importance | 0.5 | 1 | -12.5 [" in verdict and " | 0.50 | 0.80 |" in verdict
    base = next(line for line in verdict.splitlines() if line.startswith("| base |"))
    assert base.startswith("| base | - | 1 | -12.5 [") and " | 10.0 [" in base and base.endswith("| 0 | 0 |")


@pytest.mark.integration  # runs the script as a process
def test_general_tasks_against_a_named_reference_row_at_its_retention(tmp_path):
    """``--versus METHOD`` also gives each general task and the General Avg. minus METHOD's, paired, for the rows
    at METHOD's retention (random's table is always there); full SFT, at another retention, is left out."""
    share = {"full": (1.0, 0.5, 0.5, 0.5), "random-resp": (0.5, 0.5, 0.5, 0.25),
             "bridge-resp": (0.5, 0.5, 0.75, 0.75), "random": (0.2, 0.5, 0.5, 0.5)}
    runs = {}
    for method, scores in share.items():
        general = _general(scores)
        rho = 1.0 if method == "full" else 0.5
        runs[f"{method}/{rho:g}/42"] = {"method": method, "rho": rho, "seed": 42, "general": general,
                                        "tokens": {"executed": 100, "supervised": 50}, "seconds": {"total": 3}}
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"runs": runs}))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "results" / "grid_table.py"), str(path), "--plot",
                           str(tmp_path / "f3.png"), "--resamples", "100", "--versus", "random-resp"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr

    def rows(ref: str) -> dict:
        table = proc.stdout.split(f"| minus {ref} | rho | seeds | ARC-C (paired) |")[1].split("\n\n")[0]
        assert table.splitlines()[0].endswith("| HumanEval (paired) | General Avg. (paired) |")
        return {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}

    def points(line: str) -> list[float]:  # each cell's difference, its interval left out
        return [float(cell.split(" [")[0]) for cell in line.strip("| ").split(" | ")[3:]]

    resp = rows("random-resp")
    assert sorted(resp) == ["bridge-resp", "random"]
    # each task's difference in points, and the average's: the mean of the four, each task weighing the same
    assert points(resp["bridge-resp"]) == [0.0, 0.0, 25.0, 50.0, 18.8]
    assert points(resp["random"]) == [-30.0, 0.0, 0.0, 25.0, -1.2]
    assert sorted(rows("random")) == ["bridge-resp", "random-resp"]
    # against full SFT (no retention) every row, at its own rho
    assert points(rows("full")["random"]) == [-80.0, 0.0, 0.0, 0.0, -20.0]


def test_a_row_lost_before_its_losses_were_renamed_is_recorded_from_the_evals_folder(tmp_path):
    """grid.sh's losses() renames the eval's files (losses-NAME/eval-heldout-loss.json -> heldout-NAME.json) after
    the eval ends; a lost machine's last state archive can fall between the two (bridge-resp's GSM8K losses,
    2026-11-29). grid_record.py reads the eval's file then, the renamed one where it is there."""
    entry = results_script("grid_record").entry
    run = tmp_path / "runs/m/rho0.5/seed42"

    def heldout(loss: float) -> dict:
        return {"summary": {"loss": loss, "ci_low": loss - 0.1, "ci_high": loss + 0.1, "tokens": 7, "n": 2},
                "items": [{"loss_sum": 3 * loss, "tokens": 3}, {"loss_sum": 4 * loss, "tokens": 4}]}

    def answer(loss: float) -> dict:
        return {"summary": {"loss": loss, "ci_low": 0, "ci_high": 1, "n": 2, "no_answer": 0},
                "items": [{"index": 1, "loss": loss}, {"index": 0, "loss": None}]}

    (run / "losses-gsm8k").mkdir(parents=True)
    (run / "losses-gsm8k/eval-heldout-loss.json").write_text(json.dumps(heldout(0.5)))
    (run / "losses-gsm8k/eval-answer-loss.json").write_text(json.dumps(answer(0.25)))
    (run / "heldout-math500.json").write_text(json.dumps(heldout(1.5)))
    (run / "losses-math500").mkdir()
    (run / "losses-math500/eval-heldout-loss.json").write_text(json.dumps(heldout(9.0)))  # the renamed one wins
    e = entry(tmp_path, "m", "0.5", "42", "runs/m/rho0.5/seed42", "", "epochs=3")
    assert e["heldout"]["gsm8k"]["loss"] == 0.5 and e["heldout"]["gsm8k"]["items"] == [[1.5, 3], [2.0, 4]]
    assert e["heldout"]["math500"]["loss"] == 1.5
    assert e["answer_loss"]["gsm8k"]["items"] == [None, 0.25] and e["answer_loss"]["math500"] is None


@pytest.mark.integration  # runs the script as a process
def test_rows_that_shared_a_gpu_keep_their_flops_but_enter_no_gpu_second_ratio(tmp_path):
    """Two rows trained side by side on one GPU (grid.sh PROCS_PER_GPU=2, cost.gpu_processes 2): the cost table
    shows their seconds as a shared GPU's wall time, and neither it nor the verdict puts them against full SFT's
    GPU-seconds; their FLOPs ratio stays. A row that ran alone is unchanged."""
    share = {"full": (0.5, 0.5, 0.5, 0.5), "example-importance": (0.5, 0.5, 0.5, 0.25),
             "full-match-example-importance": (0.5, 0.5, 0.25, 0.5)}
    runs = {}
    for method, scores in share.items():
        rho = 1.0 if method == "full" else 0.5
        flops = 4e15 if method == "full" else 2e15
        cost = {"train_steps": 10, "train_executed": 1000, "train_computed": 1200, "train_flops": flops,
                "pipeline_seconds": {"warmup": 100, "train": 300}, "pipeline_total": 400,
                "train_step_seconds": 250.0, "train_between_steps_seconds": 20.0}
        if method != "full":
            cost["gpu_processes"] = 2
        runs[f"{method}/{rho:g}/42"] = {"method": method, "rho": rho, "seed": 42, "general": _general(scores),
                                        "tokens": {"executed": 100, "supervised": 50}, "seconds": {"total": 3},
                                        "cost": cost}
    proc = _tables(tmp_path, runs)
    costs = proc.stdout.split("| method | rho | seeds | train steps |")[1].split("\n\n")[0]
    lines = {line.split(" | ")[0].strip("| "): line for line in costs.splitlines()[2:]}
    assert "| full | - | 1 | 10 | 1,000 | 1,200 | 4e+15 | 1.00 | 400 | 100 | 1.00 | 250 | 20 | 1.00 |" in lines["full"]
    for method in ("example-importance", "full-match-example-importance"):
        assert f"| {method} | 0.5 | 1 | 10 | 1,000 | 1,200 | 2e+15 | 0.50 | 400 (wall, 2 rows on one GPU) | 100 |  | 250 | 20 |  |" in lines[method]
    verdict = proc.stdout.split("| method | rho | seeds | GSM8K acc minus full SFT |")[1].split("\n\n")[0]
    rows = {line.split(" | ")[0].strip("| "): line for line in verdict.splitlines()[2:]}
    assert rows["example-importance"].endswith("| 0.50 | shared GPU |")


def test_a_row_records_how_many_rows_shared_its_gpu(tmp_path, monkeypatch):
    """grid.sh gives each worker GRID_GPU_PROCS (its GPU's PROCS_PER_GPU); grid_record.py keeps a value above 1
    in the row's cost, and nothing for a row that ran alone."""
    cost = results_script("grid_record").cost
    model = tmp_path / "runs/m/rho0.5/seed42/model"
    model.mkdir(parents=True)
    steps = [{"step": s, "executed_tokens": 10, "computed_tokens": 12, "rows": 2, "step_time": 1.0, "elapsed": 1.5 * s}
             for s in (1, 2)]
    (model / "metrics.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    monkeypatch.delenv("GRID_GPU_PROCS", raising=False)
    alone = cost(tmp_path, "random", "runs/m/rho0.5/seed42", "sel/m", "")
    assert "gpu_processes" not in alone and alone["train_steps"] == 2 and alone["train_executed"] == 20
    monkeypatch.setenv("GRID_GPU_PROCS", "1")
    assert "gpu_processes" not in cost(tmp_path, "random", "runs/m/rho0.5/seed42", "sel/m", "")
    monkeypatch.setenv("GRID_GPU_PROCS", "2")
    assert cost(tmp_path, "random", "runs/m/rho0.5/seed42", "sel/m", "")["gpu_processes"] == 2


def test_a_rows_flops_come_from_bridge_trains_record_where_it_has_one(tmp_path):
    """grid_record.py takes a row's training FLOPs from its bridge_train.json (summed over the rows each step
    ran) where it is there, else from the compacted rows and the executed tokens (a run from before `bridge
    train` recorded them), and names which."""
    cost = results_script("grid_record").cost
    model = tmp_path / "runs/m/rho0.5/seed42/model"
    model.mkdir(parents=True)
    config = {"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16,
              "vocab_size": 10}
    (model / "config.json").write_text(json.dumps(config))
    (model / "metrics.jsonl").write_text(json.dumps({"step": 1, "executed_tokens": 5, "rows": 2}) + "\n")
    (tmp_path / "sel/m").mkdir(parents=True)
    (tmp_path / "sel/m/train.jsonl").write_text("".join(json.dumps({"input_ids": [1] * n}) + "\n" for n in (2, 3)))
    n_mm = 1 * (8 * 8 * 4 + 3 * 8 * 16) + 8 * 10
    from_rows = cost(tmp_path, "random", "runs/m/rho0.5/seed42", "sel/m", "")
    assert from_rows["train_flops"] == pytest.approx(3 * sum(2 * n_mm * s + 2 * 8 * s * s for s in (2, 3)))
    assert "train_flops_from" not in from_rows and from_rows["matmul_params"] == n_mm
    (model / "bridge_train.json").write_text(json.dumps({"base_model": "x", "train_flops": 1234.0}))
    recorded = cost(tmp_path, "random", "runs/m/rho0.5/seed42", "sel/m", "")
    assert recorded["train_flops"] == 1234.0 and "bridge_train.json" in recorded["train_flops_from"]


def test_an_unpaired_difference_keeps_its_point_and_is_wider_than_the_paired_one_on_rows_that_agree():
    """``unpaired``: the two sides resample their items on draws of their own. The point is the same difference;
    on two rows that agree on most items (the usual case: one base model fine-tuned two ways) the interval is
    wider, since pairing cancels the items' shared difficulty; a task of ``task_mean`` drawn unpaired widens the
    average's interval the same way, and the other tasks' draws are the paired ones."""
    rng = np.random.default_rng(3)
    hard = rng.random(400) < 0.5
    a = (hard ^ (rng.random(400) < 0.1)).astype(float)[None]  # agrees with b on about 80% of the items
    b = (hard ^ (rng.random(400) < 0.1)).astype(float)[None]
    paired_ci = gt.item_paired(a, b, 2000)
    unpaired_ci = gt.item_paired(a, b, 2000, unpaired=True)
    assert unpaired_ci[0] == paired_ci[0] == pytest.approx(a.mean() - b.mean())
    assert unpaired_ci[2] - unpaired_ci[1] > 1.5 * (paired_ci[2] - paired_ci[1])
    # the unpaired interval is that of two independent proportions: about 1.96 sqrt(pa qa / n + pb qb / n) each side
    pa, pb = a.mean(), b.mean()
    half = 1.96 * np.sqrt(pa * (1 - pa) / 400 + pb * (1 - pb) / 400)
    assert (unpaired_ci[2] - unpaired_ci[1]) / 2 == pytest.approx(half, rel=0.15)
    tasks, against = [a, a[:, :50]], [b, b[:, :50]]
    both = gt.task_mean(tasks, 2000, against=against)
    first = gt.task_mean(tasks, 2000, against=against, unpaired=[0])
    assert first[0] == both[0] and first[2] - first[1] > both[2] - both[1]
    assert gt.task_mean(tasks, 2000, against=against, unpaired=()) == both


@pytest.mark.integration  # runs the script as a process
def test_a_general_task_recorded_from_its_summary_alone_enters_the_average_unpaired_and_marked(tmp_path):
    """A task whose per-item results were lost is recorded from its summary (``items`` null, its score and n):
    the retention table shows its score and a General Avg. with it, every cell it enters is marked (†) with a
    footnote, and its differences are drawn unpaired; the rows with every item stay unmarked."""
    share = {"full": (0.6, 0.5, 0.25, 0.25), "importance-loss-resp": (0.6, 0.5, 0.5, 0.5)}
    runs = {}
    for method, scores in share.items():
        general = _general(scores)
        if method == "importance-loss-resp":
            general["hellaswag"]["items"] = None
            general["hellaswag"]["from"] = "the run's log"
        rho = 1.0 if method == "full" else 0.5
        runs[f"{method}/{rho:g}/42"] = {"method": method, "rho": rho, "seed": 42, "general": general,
                                        "tokens": {"executed": 100, "supervised": 50}, "seconds": {"total": 3}}
    out = _tables(tmp_path, runs).stdout
    general = out.split("| method | rho | seeds | ARC-C % |")[1].split("\n\n")[0]
    lines = {line.split(" | ")[0].strip("| "): line for line in general.splitlines()[2:]}
    cells = lines["importance-loss-resp"].strip("| ").split(" | ")
    assert cells[4].startswith("50.0 [") and cells[4].endswith("] †")  # HellaSwag: its summary's share
    assert cells[3].endswith("]") and cells[7].startswith("52.5 [")  # ARC-C unmarked; the average with it
    assert cells[8].startswith("12.5 [") and cells[8].endswith(" †")  # minus full SFT: drawn unpaired
    assert "†" not in lines["full"]
    assert "\n†: a task recorded from its run's summary alone" in out
    per_task = out.split("| minus full | rho | seeds | ARC-C (paired) |")[1].split("\n\n")[0]
    assert "| importance-loss-resp | 0.5 | 1 | 0.0 [0.0, 0.0] | 0.0 [" in per_task and "] † | 25.0 [" in per_task


def test_the_state_archive_carries_hellaswag_and_mmlu_items_and_a_row_is_recorded_from_them(tmp_path):
    """grid_record.py --slim writes beside each HellaSwag and MMLU result its entry (eval-TASK.items.json), which
    device_grid.sh's state archive carries while it leaves the results out (MBs each): a row lost before its
    record is then recorded from the archive with every general task, the same entry as from the results."""
    rec = results_script("grid_record")
    general = tmp_path / "runs/m/rho0.5/seed42/general"
    general.mkdir(parents=True)
    items = [{"index": i, "correct": i % 2 == 0, "correct_norm": i % 3 == 0} for i in range(6)]
    result = {"summary": {"n": 6, "accuracy": 0.5, "acc": 0.5, "acc_norm": 1 / 3}, "items": items}
    (general / "eval-hellaswag.json").write_text(json.dumps(result))
    (general / "eval-mmlu.json").write_text("{\"summary\": {")  # still being written: left for the next call
    assert rec.slim(tmp_path) == [general / "eval-hellaswag.items.json"]
    direct = rec.general_task(general / "eval-hellaswag.json", "hellaswag")
    assert direct["items"] == [1, 0, 0, 1, 0, 0] and direct["items_acc"] == [1, 0, 1, 0, 1, 0]
    assert rec.slim(tmp_path) == []  # up to date
    for name in ("eval-hellaswag.json", "eval-mmlu.json"):  # the archive leaves them out
        (general / name).unlink()
    e = rec.entry(tmp_path, "m", "0.5", "42", "runs/m/rho0.5/seed42", "", "epochs=3")
    assert e["general"] == {"hellaswag": direct}
    script = (ROOT / "bench/results/device_grid.sh").read_text()
    collect = script.split("collect() {")[1].split("\n}\n")[0]
    # the items are written before the archive is made, and results.json is copied after it
    assert collect.index("grid_record.py --slim") < collect.index("tar -czf") < collect.index('cp "$dir/results.json"')


@pytest.mark.integration  # runs bash and waits for a background grid
@pytest.mark.parametrize("mps", ["0", "1"])
def test_device_grid_start_runs_the_grid_through_an_mps_daemon_of_its_own(tmp_path, mps):
    """device_grid.sh start with MPS=1 starts nvidia-cuda-mps-control -d (pipes outside the grid's folder, so
    the state archive never takes them), the grid's processes see its pipe directory, and the daemon is told to
    quit when the grid ends; without MPS none of it. A stand-in daemon logs its calls; the grid fails its job
    list at once (its exit status is recorded as usual)."""
    import time

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "mps.log"
    fake = bin_dir / "nvidia-cuda-mps-control"
    fake.write_text(f'#!/bin/bash\nif [ "$1" = -d ]; then echo "daemon $CUDA_MPS_PIPE_DIRECTORY" >> {log}\n'
                    f'else echo "stdin $(cat)" >> {log}; fi\n')
    fake.chmod(0o755)
    grid_out = tmp_path / f"grid-mps-test-{os.getpid()}-{mps}"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "GRID_OUT": str(grid_out), "MPS": mps, "GRID_JOBS": "not-a-job"}
    try:
        proc = subprocess.run(["bash", str(ROOT / "bench/results/device_grid.sh"), "start"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        for _ in range(200):  # the grid runs in its own session: wait for its exit status
            if (grid_out / "grid.rc").is_file() and (mps == "0" or "stdin" in log.read_text()):
                break
            time.sleep(0.1)
        assert (grid_out / "grid.rc").read_text().strip() == "2"  # GRID_JOBS refused
        assert "not SEED:METHOD:RHO" in (grid_out / "grid.log").read_text()
        if mps == "0":
            assert not log.exists()
        else:
            pipes = f"/tmp/mps/{grid_out.name}/pipe"
            assert log.read_text().splitlines() == [f"daemon {pipes}", "stdin quit"]
            assert not (grid_out / "mps").exists()
    finally:
        link = Path("/tmp/grids") / grid_out.name
        if link.is_symlink():
            link.unlink()
        shutil.rmtree(f"/tmp/mps/{grid_out.name}", ignore_errors=True)
        for folder in ("/tmp/mps", "/tmp/grids"):  # where this test made them
            try:
                os.rmdir(folder)
            except OSError:
                pass


@pytest.mark.integration  # runs bash, which waits on a grid for seconds
def test_device_grid_wait_keeps_time_for_its_copying_within_its_limit(tmp_path):
    """`device_grid.sh wait N` ends within N, its copying included: it stops waiting on a running grid N less the
    last copy's seconds less 10 s after it began (a call's limit cut the copy of `wait 545` under 600 s once),
    copies the grid's state to $OUT/NAME/ (no tables while the grid runs: their bootstraps take 40-50 s), and
    keeps the copy's seconds for the next wait."""
    import time

    grids, out = tmp_path / "grids", tmp_path / "out"
    grid = tmp_path / "grid-wait-test"
    (grid / "done").mkdir(parents=True)
    (grid / "grid.pid").write_text("1\n")  # started, no exit status yet: running
    (grid / "results.json").write_text("{}")
    grids.mkdir()
    (grids / grid.name).symlink_to(grid)
    (grids / ".copy-seconds").write_text("1\n")
    env = {**os.environ, "GRIDS": str(grids), "OUT": str(out)}
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(ROOT / "bench/results/device_grid.sh"), "wait", "14"], env=env,
                          capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert "== grid-wait-test: running; 0 rows recorded this machine" in proc.stdout
    waited = int(re.search(r"== waited (\d+) s, copied in \d+ s", proc.stdout).group(1))
    assert 3 <= waited <= 5 and 2.5 < took < 14  # 14 less the last copy's 1 s less 10 s (a loaded machine: later)
    assert (out / grid.name / "results.json").read_text() == "{}"
    assert (out / grid.name / "grid-state.tar.gz").is_file() and not (out / grid.name / "table.md").exists()
    assert int((grids / ".copy-seconds").read_text()) <= 10
    (grid / "grid.rc").write_text("0\n")  # ended: no waiting, and its tables come along
    proc = subprocess.run(["bash", str(ROOT / "bench/results/device_grid.sh"), "wait", "600"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert "== grid-wait-test: ended, exit 0" in proc.stdout and "== waited 0 s" in proc.stdout
    assert (out / grid.name / "table.md").is_file()


def test_the_memoised_draws_are_the_generator_s_own_in_order_even_after_the_cache_drops_them(monkeypatch):
    """grid_stats draws each stream of resample indices once (a table repeats a few streams hundreds of times):
    a stream read from the cache, from a cached prefix's state, or drawn again after its prefix was dropped
    gives the draws of a fresh default_rng(0), in order; and resample means of 0/1 items counted as bytes equal
    the float means bit for bit."""
    monkeypatch.setattr(gt, "_DRAWS", type(gt._DRAWS)())
    sizes = (5, 7, 5, 3)
    rng = np.random.default_rng(0)
    expected = [rng.integers(0, n, size=(40, n)) for n in sizes]

    def stream():
        draws = gt._Draws(40)
        return [draws.next(n) for n in sizes]

    for got in (stream(), stream()):  # drawn, then read from the cache
        assert all(np.array_equal(g, e) for g, e in zip(got, expected, strict=True))
    gt._DRAWS.pop((40, sizes[:2]))  # a prefix dropped: the stream beyond it is still the generator's
    del gt._DRAWS[(40, sizes)]
    assert np.array_equal(stream()[-1], expected[-1])
    gt._DRAWS.clear()
    monkeypatch.setattr(gt, "_DRAWS_BYTES", expected[0].nbytes)  # room for one draw: the oldest go first
    assert all(np.array_equal(g, e) for g, e in zip(stream(), expected, strict=True)) and len(gt._DRAWS) == 1
    values = (np.random.default_rng(1).random((3, 50)) < 0.4).astype(float)
    idx = np.random.default_rng(2).integers(0, 50, size=(40, 50))
    assert np.array_equal(gt._resample_means(values, idx), values[:, idx].mean(-1))
    values[0, 0] = 0.5  # not 0/1: the float path
    assert np.array_equal(gt._resample_means(values, idx), values[:, idx].mean(-1))
