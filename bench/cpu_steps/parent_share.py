"""The parent's share of the CPU time of `select -T 4`, `close --segmenter math` and `compact` with
``--workers N``: what the parent spends per example bounds the rate any number of workers can give.

    python bench/cpu_steps/parent_share.py --stream /tmp/cpu_steps/scores.bridge
    python bench/cpu_steps/parent_share.py --make 3000             # a synthetic stream (synthetic.py)
    python bench/cpu_steps/parent_share.py --stream S --src /tmp/before/src --src src --repeat 3

Each ``--src`` (a folder holding ``bridgecli``; default this checkout's ``src``) runs in a process of its
own that imports the steps, runs each once on the first 128 examples (so one-time imports are not
counted), then runs select on the stream, close on select's output and compact on close's, each step's
function called in-process with ``--workers N``. Around each call it reads ``getrusage``: RUSAGE_SELF is
the parent (its threads included: the pool's pickling and result threads), RUSAGE_CHILDREN the workers
(counted once the pool has reaped them, which it does before the step returns). Several ``--src`` run
interleaved, ``--repeat`` times each, so a before/after pair on a busy machine is measured side by side;
the outputs of every ``--src`` are compared byte for byte (streams after their header frame). ``--pipe``
feeds each step its input on stdin through a pipe (``cat``, not counted) instead of naming the file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STEPS = ("select", "close", "compact")
OUTPUTS = {"select": "selected.bridge", "close": "closed.bridge", "compact": "rows.jsonl"}


def _run_step(step: str, inp: Path, out: Path, workers: int) -> None:
    if step == "select":
        from bridgecli.steps.select import SelectOptions, run_select

        run_select(SelectOptions(inp=str(inp), out=str(out), rounds=4, workers=workers))
    elif step == "close":
        from bridgecli.steps.close import CloseOptions, run_close

        run_close(CloseOptions(inp=str(inp), out=str(out), segmenter="math", workers=workers))
    else:
        from bridgecli.steps.compact import CompactOptions, run_compact

        run_compact(CompactOptions(inp=str(inp), out=str(out), workers=workers))


def _head(src: Path, dst: Path, n: int) -> None:
    """The first ``n`` examples of ``src`` as a stream of their own."""
    import itertools

    from bridgecli.format.reader import StreamReader
    from bridgecli.format.writer import open_writer

    with open(src, "rb") as fh:
        reader = StreamReader(fh, validate=False)
        with open_writer(dst, reader.header) as w:
            for ex in itertools.islice(reader, n):
                w.write(ex)


class _Piped:
    """``path`` on this process's stdin through a pipe (``cat``), for a step reading ``-``."""

    def __init__(self, path: Path):
        self.cat = subprocess.Popen(["cat", str(path)], stdout=subprocess.PIPE)
        self.saved = os.dup(0)
        assert self.cat.stdout is not None
        os.dup2(self.cat.stdout.fileno(), 0)
        self.cat.stdout.close()

    def close(self) -> None:
        os.dup2(self.saved, 0)
        os.close(self.saved)
        self.cat.wait()


def child(stream: Path, out: Path, workers: int, pipe: bool = False) -> dict:
    """Run in a process whose ``bridgecli`` is the one measured: the three steps, each timed."""
    import resource

    os.environ["BRIDGE_NO_PROGRESS"] = "1"
    warm = out / "warm"
    warm.mkdir(parents=True, exist_ok=True)
    _head(stream, warm / "scores.bridge", 128)
    res = {}
    for step in STEPS:
        inp = {"select": "scores.bridge", "close": OUTPUTS["select"], "compact": OUTPUTS["close"]}[step]
        _run_step(step, warm / inp, warm / OUTPUTS[step], workers)
        source = stream if step == "select" else out / inp
        piped = _Piped(source) if pipe else None
        me0, ch0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        _run_step(step, Path("-") if piped else source, out / OUTPUTS[step], workers)
        wall = time.perf_counter() - t0
        me1, ch1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        if piped:
            piped.close()  # cat is reaped after the measurement: its CPU time is not counted
        parent = (me1.ru_utime - me0.ru_utime) + (me1.ru_stime - me0.ru_stime)
        workers_cpu = (ch1.ru_utime - ch0.ru_utime) + (ch1.ru_stime - ch0.ru_stime)
        res[step] = {"wall_s": round(wall, 3), "parent_cpu_s": round(parent, 3), "workers_cpu_s": round(workers_cpu, 3)}
    return res


def after_header(path: Path) -> bytes:
    """A stream's bytes after its header frame (the header holds timestamps); a JSONL file whole."""
    import zstandard

    raw = path.read_bytes()
    if path.suffix != ".bridge":
        return raw
    d = zstandard.ZstdDecompressor().decompressobj()
    d.decompress(raw[12:])  # after the preamble: 8 bytes of magic, 2 + 2 of version
    return d.unused_data


def count(stream: Path) -> int:
    sys.path.insert(0, str(ROOT / "src"))
    from bridgecli.format.reader import StreamReader

    with open(stream, "rb") as fh:
        return sum(1 for _ in StreamReader(fh, validate=False))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stream", type=Path, help="a scored stream (bench_steps.py make, or scaling.py --make)")
    ap.add_argument("--make", type=int, metavar="N", help="make a synthetic scored stream of N examples instead")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--src", action="append", type=Path, help="a folder holding bridgecli (repeatable)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--pipe", action="store_true", help="each step reads its input from stdin, a pipe")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", nargs=2, metavar=("STREAM", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(Path(a.child[0]), Path(a.child[1]), a.workers, a.pipe)))
        return 0
    with tempfile.TemporaryDirectory(prefix="parent_share.") as tmp:
        stream = a.stream
        if a.make:
            sys.path.insert(0, str(HERE))
            import synthetic

            stream = Path(tmp) / "scores.bridge"
            synthetic.make_stream(stream, a.make)
        if stream is None:
            ap.error("pass --stream or --make")
        n = count(stream)
        srcs = [s.resolve() for s in (a.src or [ROOT / "src"])]
        runs: dict[str, list] = {str(s): [] for s in srcs}
        for k in range(a.repeat):
            for i, src in enumerate(srcs):
                out = Path(tmp) / f"src{i}"
                env = dict(os.environ, PYTHONPATH=str(src))
                proc = subprocess.run(
                    [sys.executable, __file__, "--child", str(stream), str(out), "--workers", str(a.workers)]
                    + ["--pipe"] * a.pipe,
                    env=env,
                    capture_output=True,
                    text=True,
                )
                if proc.returncode:
                    raise SystemExit(f"{src}: the run failed:\n{proc.stderr}")
                got = json.loads(proc.stdout.splitlines()[-1])
                runs[str(src)].append(got)
                print(
                    f"{src} run {k + 1}:",
                    " ".join(
                        f"{s} parent {v['parent_cpu_s']:.2f} s workers {v['workers_cpu_s']:.2f} s;"
                        for s, v in got.items()
                    ),
                    flush=True,
                )
        summary: dict = {"examples": n, "workers": a.workers, "pipe": a.pipe, "load": os.getloadavg(), "src": {}}
        for src, rs in runs.items():
            entry = {}
            for step in STEPS:
                parent = min(r[step]["parent_cpu_s"] for r in rs)
                work = min(r[step]["workers_cpu_s"] for r in rs)
                entry[step] = {
                    "parent_cpu_s": parent,
                    "workers_cpu_s": work,
                    "parent_us_per_example": round(1e6 * parent / n, 1),
                    "parent_share": round(parent / (parent + work), 3),
                    "parent_ceiling_examples_per_s": round(n / parent) if parent else None,
                    "runs": [r[step] for r in rs],
                }
            summary["src"][src] = entry
        if len(srcs) > 1:
            base = Path(tmp) / "src0"
            summary["identical"] = {
                step: all(
                    after_header(base / OUTPUTS[step]) == after_header(Path(tmp) / f"src{i}" / OUTPUTS[step])
                    for i in range(1, len(srcs))
                )
                for step in STEPS
            }
    for src, entry in summary["src"].items():
        print(src)
        for step, e in entry.items():
            print(
                f"  {step:8s} parent {e['parent_cpu_s']:6.2f} s = {e['parent_us_per_example']:6.1f} us/example "
                f"({100 * e['parent_share']:.0f}% of the CPU time; ceiling {e['parent_ceiling_examples_per_s']} ex/s), "
                f"workers {e['workers_cpu_s']:.2f} s"
            )
    if "identical" in summary:
        print("outputs identical across --src:", summary["identical"])
    if a.json:
        a.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if all(summary.get("identical", {}).values()) else 1


if __name__ == "__main__":
    sys.exit(main())
