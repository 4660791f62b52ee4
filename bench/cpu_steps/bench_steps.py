"""Speed of the CPU steps (`select -T 4`, `close --segmenter math`, `compact`) at GSM8K sizes.

    python bench/cpu_steps/bench_steps.py make  --data GSM8K_TRAIN.jsonl -n 20000 --out /tmp/cpu_steps
    python bench/cpu_steps/bench_steps.py run   --out /tmp/cpu_steps [--cpu 0] [--workers 1] [--repeat 3]
    python bench/cpu_steps/bench_steps.py check --out /tmp/cpu_steps [--save-reference]

``make`` writes a scored stream like the scorer's: real GSM8K text (records cycled with fresh ids when
``-n`` exceeds the file; the project's generated sample when ``--data`` is left out) tokenised with the
default model's tokenizer and chat template, with ``a`` (float32), ``c`` (float32 in [0, 1]) and ``A``
(float16 rows of head-averaged attention, summing to at most 1) drawn from a seeded generator.

``run`` times each step as a user runs it (a ``bridge`` process over a file, pinned to one core with
``taskset -c``), reading the previous step's output, and in-process (the step's function called on the
file, no process start), and records examples/s and the peak RSS of each process in ``results.json``.

``check`` hashes the outputs (the records of each stream with the header's timestamps blanked, and the
compressed bytes after the header frame; the JSONL rows) and compares them with ``reference.json``
(``--save-reference`` writes it: run it once with the code on main).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from measured import run_measured, step_env

ROOT = Path(__file__).resolve().parents[2]
STEPS = {
    "select": ("scores.bridge", "selected.bridge", ["select", "-T", "4"]),
    "close": ("selected.bridge", "closed.bridge", ["close", "--segmenter", "math"]),
    "compact": ("closed.bridge", "rows.jsonl", ["compact"]),
}


# ------------------------------------------------------------------------------------------- make


def make(data: str | None, n: int, out: Path, seed: int) -> None:
    import msgspec
    import numpy as np

    sys.path.insert(0, str(ROOT / "src"))
    from bridgecli import PRODUCER
    from bridgecli.data.examples import DataOptions, iter_examples
    from bridgecli.format.records import Array, Header, ModelInfo, Scores
    from bridgecli.format.writer import open_writer
    from bridgecli.modeling.loading import load_tokenizer
    from bridgecli.steps.common import now, step_record

    out.mkdir(parents=True, exist_ok=True)
    if data:
        records = [json.loads(line) for line in open(data) if line.strip()]
    else:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "make_sample", Path(__file__).resolve().parents[2] / "examples" / "make_sample.py"
        )
        make_sample = importlib.util.module_from_spec(spec)
        sys.modules["make_sample"] = make_sample  # (its dataclasses look their module up)
        spec.loader.exec_module(make_sample)
        records = [{"question": r["question"], "answer": r["answer"]} for r in make_sample.generate(2000, seed=seed)]
    tok = load_tokenizer(None)
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "data.jsonl"
        with open(src, "w") as fh:
            for i in range(n):
                r = records[i % len(records)]
                fh.write(json.dumps({"id": f"ex-{i:07d}", "question": r["question"], "answer": r["answer"]}) + "\n")
        header = Header(
            stage="scores",
            producer=PRODUCER,
            created=now(),
            model=ModelInfo(source="bench", fingerprint="bench", tokenizer_fingerprint="bench"),
            steps=[step_record("score", {"bench": True})],
            source="bench",
        )
        m_sum = n_sum = 0
        with open_writer(out / "scores.bridge", header) as w:
            for ex in iter_examples(src, tok, DataOptions()):
                kinds = np.frombuffer(ex.tokens.kinds, dtype=np.uint8)
                m, k = int((kinds == 1).sum()), int((kinds == 2).sum())
                m_sum += m
                n_sum += k
                a = rng.normal(0, 1e-3, k).astype(np.float32)
                c = rng.uniform(0, 1, k).astype(np.float32)
                A = rng.dirichlet(np.ones(m + 8), size=k)[:, :m].astype(np.float16) if m else np.zeros((k, 0))
                scores = Scores(
                    scorer="bench",
                    a=Array.of(a),
                    c=Array.of(c),
                    A=Array.of(A, "float16"),
                    loss=Array.of(rng.uniform(0, 4, k).astype(np.float32)),
                )
                w.write(msgspec.structs.replace(ex, scores=scores))
    size = (out / "scores.bridge").stat().st_size
    print(
        f"wrote {n} examples, {m_sum / n:.1f} prompt and {n_sum / n:.1f} response tokens each on average, "
        f"{size / 1e6:.1f} MB: {out / 'scores.bridge'}"
    )


# -------------------------------------------------------------------------------------------- run


def _cli(step: str, out: Path, cpu: str | None, workers: int, tag: str) -> dict:
    src, dst, args = STEPS[step]
    dst_path = out / (dst if not tag else f"{tag}.{dst}")
    cmd = [sys.executable, "-m", "bridgecli", *args, str(out / src)]
    cmd += ["-o", str(dst_path)]
    if workers != 1:
        cmd += ["--workers", str(workers)]
    if cpu is not None:
        cmd = ["taskset", "-c", cpu, *cmd]
    cost = run_measured(cmd, step_env(ROOT / "src"))
    return {"command": " ".join(cmd[cmd.index("-m") - 1 :]).replace(sys.executable, "python"), **cost}


def _inproc(step: str, out: Path) -> float:
    """Seconds for the step's function over the file (no process start, imports already done)."""
    sys.path.insert(0, str(ROOT / "src"))
    os.environ["BRIDGE_NO_PROGRESS"] = "1"
    src, dst, _ = STEPS[step]
    dst_path = out / f"inproc.{dst}"
    t0 = time.perf_counter()
    if step == "select":
        from bridgecli.steps.select import SelectOptions, run_select

        run_select(SelectOptions(inp=str(out / src), out=str(dst_path), rounds=4))
    elif step == "close":
        from bridgecli.steps.close import CloseOptions, run_close

        run_close(CloseOptions(inp=str(out / src), out=str(dst_path), segmenter="math"))
    else:
        from bridgecli.steps.compact import CompactOptions, run_compact

        run_compact(CompactOptions(inp=str(out / src), out=str(dst_path)))
    return time.perf_counter() - t0


def count(out: Path) -> int:
    sys.path.insert(0, str(ROOT / "src"))
    from bridgecli.format.reader import StreamReader

    with open(out / "scores.bridge", "rb") as fh:
        r = StreamReader(fh, validate=False)
        return sum(1 for _ in r)


def run(out: Path, cpu: str | None, workers: int, repeat: int, inproc: bool, steps: list[str]) -> dict:
    n = count(out)
    res: dict = {"examples": n, "cpu": cpu, "workers": workers, "load_before": os.getloadavg(), "steps": {}}
    for step in steps:
        runs = [_cli(step, out, cpu, workers, "") for _ in range(repeat)]
        best = min(runs, key=lambda r: r["wall_s"])
        entry = {
            "command": best["command"],
            "cli_wall_s": [round(r["wall_s"], 3) for r in runs],
            "cli_examples_per_s": round(n / best["wall_s"]),
            "cpu_s": round(best["cpu_s"], 3),
            "peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs), 1),
        }
        if inproc and workers == 1:
            if cpu is not None:
                os.sched_setaffinity(0, {int(c) for c in cpu.split(",")})
            times = [_inproc(step, out) for _ in range(repeat)]
            entry["inproc_s"] = [round(t, 3) for t in times]
            entry["inproc_examples_per_s"] = round(n / min(times))
        res["steps"][step] = entry
        print(step, json.dumps(entry), flush=True)
    res["load_after"] = os.getloadavg()
    return res


# ------------------------------------------------------------------------------------------ check


def digest_stream(path: Path) -> dict:
    import msgspec
    import zstandard

    sys.path.insert(0, str(ROOT / "src"))
    from bridgecli.format.spec import PREAMBLE, RECORD_PREFIX

    raw = path.read_bytes()
    body = raw[PREAMBLE.size :]
    dobj = zstandard.ZstdDecompressor().decompressobj()
    head_frame = dobj.decompress(body)
    tail = dobj.unused_data  # every frame after the header's
    length, _ = RECORD_PREFIX.unpack(head_frame[: RECORD_PREFIX.size])
    header = msgspec.msgpack.decode(head_frame[RECORD_PREFIX.size : RECORD_PREFIX.size + length])
    header["created"] = ""
    for s in header.get("steps", []):
        s["time"] = ""
    content = zstandard.ZstdDecompressor().stream_reader(tail, read_across_frames=True).read()
    return {
        "header": hashlib.sha256(msgspec.json.encode(header)).hexdigest(),
        "records": hashlib.sha256(content).hexdigest(),
        "compressed_after_header": hashlib.sha256(tail).hexdigest(),
    }


def digests(out: Path, tag: str = "") -> dict:
    res = {}
    for step, (_, dst, _) in STEPS.items():
        p = out / (f"{tag}.{dst}" if tag else dst)
        if not p.exists():
            continue
        res[step] = (
            digest_stream(p) if dst.endswith(".bridge") else {"rows": hashlib.sha256(p.read_bytes()).hexdigest()}
        )
    return res


def check(out: Path, save: bool, tag: str = "") -> bool:
    got = digests(out, tag)
    if save:  # kept next to the stream, and a copy beside this script for the record
        for ref in (out / "reference.json", Path(__file__).with_name("reference.json")):
            ref.write_text(json.dumps(got, indent=2) + "\n")
        print(json.dumps(got, indent=2))
        return True
    want = json.loads((out / "reference.json").read_text())
    ok = True
    for step, d in got.items():
        same = d == want.get(step)
        ok &= same
        print(f"{step}: {'identical' if same else 'DIFFERENT'} {d}")
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--data", help="GSM8K-shaped JSONL (question, answer); default: the generated sample")
    m.add_argument("-n", type=int, default=20000)
    m.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("run")
    r.add_argument("--cpu", default="0", help="taskset -c CPUS ('' for no pinning)")
    r.add_argument("--workers", type=int, default=1)
    r.add_argument("--repeat", type=int, default=3)
    r.add_argument("--no-inproc", action="store_true")
    r.add_argument("--steps", default="select,close,compact")
    r.add_argument("--json", help="results file (default OUT/results.json)")
    c = sub.add_parser("check")
    c.add_argument("--save-reference", action="store_true")
    c.add_argument("--tag", default="")
    for p in (m, r, c):
        p.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "make":
        make(a.data, a.n, a.out, a.seed)
    elif a.cmd == "run":
        res = run(a.out, a.cpu or None, a.workers, a.repeat, not a.no_inproc, a.steps.split(","))
        res["same_as_reference"] = check(a.out, False) if (a.out / "reference.json").exists() else None
        Path(a.json or a.out / "results.json").write_text(json.dumps(res, indent=2))
    else:
        return 0 if check(a.out, a.save_reference, a.tag) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
