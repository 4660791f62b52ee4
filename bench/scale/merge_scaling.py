#!/usr/bin/env python3
"""How rank 0's merge of the ranks' shards scales with the processes that compress its frames.

    python3 bench/scale/merge_scaling.py --json bench/scale/results/merge_scaling.json
    python3 bench/scale/merge_scaling.py --make 4000 --shards 4 --workers 1,2     # a quick look

Makes ``--shards`` synthetic scored shards of ``--make`` examples in all (bench/cpu_steps/synthetic.py:
GSM8K-like sizes, index ``rank`` modulo ``--shards`` each, a zstd frame per ``--window`` of its examples, as
the ranks of `bridge score` under torchrun write them), then merges them with ``merge_streams(...,
frame=--window, workers=N)`` in this process for each N (default 1, 2, 4, ... up to the cores this process
may use, and that count), two ways: copying the records as written (``as_written``: what rank 0 runs after
`bridge score`) and decoding + validating them (``validated``: what `bridge merge` runs). Each merge's
wall time, this process's CPU time (the workers' is not in it: with N > 1 they compress, and as written
they also decompress the shards' frames) and examples/s are recorded, and the merged file must be
byte-identical to N=1's (the process exits 1 if one is not). 1 / this process's CPU time per example is
the most that any N can give. ``read_only``: only reading the shards in index order in this process (what
``validated`` still does here for any N, before decoding).

Needs the project's dependencies in this interpreter; this checkout's src comes first on the path (then
the caller's PYTHONPATH). Say which machine ran it, and how busy it was (load average in the JSON).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _cpu_steps(name: str):
    """bench/cpu_steps/NAME.py as a module (synthetic.py's streams, scaling.py's helpers)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "cpu_steps" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SCALING = _cpu_steps("scaling")
cores, default_workers = _SCALING.cores, _SCALING.default_workers  # the cores present; N = 1, 2, 4, ..., cores


def _make_shard(job: tuple) -> dict:
    path, n, rank, shards, window = job
    return _cpu_steps("synthetic").make_stream(Path(path), n, seed=0, frame=window, shard=(rank, shards))


def make_shards(folder: Path, n: int, shards: int, window: int) -> list[Path]:
    paths = [folder / f"scores.bridge.shard-{r:05d}-of-{shards:05d}" for r in range(shards)]
    jobs = [(str(p), n, r, shards, window) for r, p in enumerate(paths)]
    with multiprocessing.get_context("fork").Pool(min(shards, cores())) as pool:
        made = pool.map(_make_shard, jobs)
    assert sum(m["examples"] for m in made) == n
    return paths


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--make", type=int, default=40000, metavar="N", help="examples in all the shards")
    ap.add_argument("--shards", type=int, default=16, help="shards (ranks)")
    ap.add_argument("--window", type=int, default=256, help="bridge score's --window: the merged frames")
    ap.add_argument("--workers", help="comma-separated N (default: 1, 2, 4, ... up to the cores, and the cores)")
    ap.add_argument("--modes", default="as_written,validated")
    ap.add_argument("--repeat", type=int, default=1, help="merges of each mode and N (the fastest is reported)")
    ap.add_argument("--keep", type=Path, help="a folder for the shards and outputs (default: a temporary one)")
    ap.add_argument("--json", type=Path, help="write the results here")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from bridgecli.runtime.merge import _as_is, _in_order, merge_streams
    from bridgecli.format.reader import open_reader

    workers = [int(x) for x in a.workers.split(",")] if a.workers else default_workers()
    if workers[0] != 1:
        workers = [1, *workers]  # N=1's output is the reference
    modes = {"as_written": False, "validated": True}
    res: dict = {
        "machine": {
            "cores": cores(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "cpu": platform.processor() or platform.machine(),
            "python": sys.executable,
        },
        "commit": _SCALING.commit(),
        "load_before": os.getloadavg(),
        "examples": a.make,
        "shards": a.shards,
        "window": a.window,
        "workers": workers,
        "modes": {},
    }
    ok = True
    with tempfile.TemporaryDirectory(prefix="merge_scaling.") as tmp:
        folder = a.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        paths = make_shards(folder, a.make, a.shards, a.window)
        res["shard_bytes"] = sum(p.stat().st_size for p in paths)
        print(
            f"made {a.shards} shards of {a.make} examples in all, {res['shard_bytes'] / 1e6:.0f} MB "
            f"({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )

        t0, c0 = time.perf_counter(), time.process_time()
        with contextlib.ExitStack() as stack:
            readers = [stack.enter_context(open_reader(p)) for p in paths]
            assert sum(1 for _ in _in_order([_as_is(r) for r in readers], readers)) == a.make
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        res["read_only"] = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "examples_per_s": round(a.make / wall)}
        print(f"read_only: {a.make / wall:,.0f} examples/s", flush=True)

        for mode in a.modes.split(","):
            entry: dict = {}
            reference = None
            for w in workers:
                out = folder / f"merged.{mode}.{w}.bridge"
                runs = []
                for _ in range(a.repeat):
                    t0, c0 = time.perf_counter(), time.process_time()
                    count = merge_streams(paths, out, frame=a.window, validate=modes[mode], workers=w)
                    runs.append((time.perf_counter() - t0, time.process_time() - c0))
                    assert count == a.make
                wall, cpu = min(runs)
                got = digest(out)
                reference = reference or got
                res.setdefault("merged_bytes", out.stat().st_size)
                if a.keep is None or w != 1:
                    out.unlink()
                same = got == reference
                ok &= same
                entry[str(w)] = {
                    "wall_s": round(wall, 3),
                    "parent_cpu_s": round(cpu, 3),
                    "examples_per_s": round(a.make / wall),
                    "speedup": round(entry["1"]["wall_s"] / wall, 2) if "1" in entry else 1.0,
                    "identical_to_1": same,
                }
                print(
                    f"{mode} N={w}: {a.make / wall:,.0f} examples/s ({wall:.2f} s, this process {cpu:.2f} s CPU)"
                    f"{'' if same else ' DIFFERENT BYTES'}",
                    flush=True,
                )
            res["modes"][mode] = entry
    res["identical"] = ok
    res["load_after"] = os.getloadavg()
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
