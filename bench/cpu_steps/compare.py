"""A "before" checkout's code against this checkout's on the same inputs, interleaved. ``--main`` is any
folder holding ``src/bridgecli``: main's checkout, or a commit unpacked with
``git archive COMMIT src | tar -x -C DIR``. Each step runs as a user runs it (a ``bridge`` process over a
file, pinned with ``taskset -c``), before and new alternating, every process given the same input file
(close and compact read the before side's select and close outputs). Records each process's wall time,
CPU time (user + system) and peak RSS, and checks that the outputs are byte-identical: the JSONL rows with
``cmp``, the streams from the first byte after the header (the header holds timestamps) with ``cmp`` and
by bench_steps.py's digests.

    python bench/cpu_steps/compare.py --main /tmp/before --out /tmp/cpu_steps --cpu 0 --repeat 3 \\
        --json bench/cpu_steps/results/one_core.json

On a shared machine the CPU time is the steadier measure: wall time also counts the time other
processes held the core.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import bench_steps  # noqa: E402
from measured import rounded, run_measured, step_env  # noqa: E402

STEPS = {  # step -> (input made by main's code, output name, arguments)
    "select": ("scores.bridge", "selected.bridge", ["select", "-T", "4"]),
    "close": ("main.selected.bridge", "closed.bridge", ["close", "--segmenter", "math"]),
    "compact": ("main.closed.bridge", "rows.jsonl", ["compact"]),
}


def one(src: Path, python: str, step: str, out: Path, tag: str, cpu: str | None) -> dict:
    inp, dst, args = STEPS[step]
    cmd = [python, "-m", "bridgecli", *args, str(out / inp), "-o", str(out / f"{tag}.{dst}")]
    if cpu:
        cmd = ["taskset", "-c", cpu, *cmd]
    return rounded(run_measured(cmd, step_env(src)))  # the side's src/ first


def after_header(path: Path) -> bytes:
    """The file's bytes after the header's zstd frame (the header holds the step's timestamps)."""
    import zstandard

    raw = path.read_bytes()
    body = raw[bench_steps_preamble() :]
    dobj = zstandard.ZstdDecompressor().decompressobj()
    dobj.decompress(body)
    return dobj.unused_data


def bench_steps_preamble() -> int:
    sys.path.insert(0, str(ROOT / "src"))
    from bridgecli.format.spec import PREAMBLE

    return PREAMBLE.size


def identical(out: Path, step: str) -> dict:
    _, dst, _ = STEPS[step]
    old, new = out / f"main.{dst}", out / f"new.{dst}"
    if dst.endswith(".jsonl"):
        same = subprocess.run(["cmp", str(old), str(new)], capture_output=True).returncode == 0
        return {"cmp": same}
    same = after_header(old) == after_header(new)
    return {"cmp_after_header": same, "digests": bench_steps.digest_stream(old) == bench_steps.digest_stream(new)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--main", type=Path, required=True, help="a checkout of main (its src/ is used)")
    ap.add_argument("--out", type=Path, required=True, help="folder holding scores.bridge (bench_steps.py make)")
    ap.add_argument("--cpu", default="0", help="taskset -c CPUS ('' for no pinning)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", default="select,close,compact")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    n = bench_steps.count(a.out)
    res: dict = {"examples": n, "cpu": a.cpu, "load_before": os.getloadavg(), "steps": {}}
    for step in a.steps.split(","):
        runs: dict = {"main": [], "new": []}
        for _ in range(a.repeat):
            for tag, src in (("main", a.main / "src"), ("new", ROOT / "src")):
                runs[tag].append(one(src, a.python, step, a.out, tag, a.cpu or None))
        entry = {"load": os.getloadavg()}
        for tag, rs in runs.items():
            entry[tag] = {
                "runs": rs,
                "ex_per_s_wall": round(n / min(r["wall_s"] for r in rs)),
                "ex_per_s_cpu": round(n / min(r["cpu_s"] for r in rs)),
                "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
            }
        entry["speedup_cpu"] = round(entry["new"]["ex_per_s_cpu"] / entry["main"]["ex_per_s_cpu"], 2)
        entry["speedup_wall"] = round(entry["new"]["ex_per_s_wall"] / entry["main"]["ex_per_s_wall"], 2)
        res["steps"][step] = entry
        print(step, json.dumps({k: v for k, v in entry.items()}), flush=True)
    res["load_after"] = os.getloadavg()
    for step, entry in res["steps"].items():  # after every run: reading the files grows this process, and
        entry["identical"] = identical(a.out, step)  # a child's peak RSS starts from its parent's at fork
        print(step, "identical:", entry["identical"])
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2) + "\n")
    ok = all(all(v for v in e["identical"].values()) for e in res["steps"].values())
    print("outputs identical" if ok else "OUTPUTS DIFFER")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
