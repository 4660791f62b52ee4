"""How `select -T 4`, `close --segmenter math` and `compact` scale with ``--workers N``, run as a user runs them.

    python3 bench/cpu_steps/scaling.py --make 20000 --json scaling.json          # a synthetic stream
    python3 bench/cpu_steps/scaling.py --stream /tmp/cpu_steps/scores.bridge     # bench_steps.py make's
    python3 bench/cpu_steps/scaling.py --make 20000 --workers 1,4,16 --repeat 2

For each step and each N (default 1, 2, 4, ... up to the cores this process may use, and that count),
runs ``python -m bridgecli STEP ... --workers N`` as a process of its own, unpinned, and records its wall
time, its CPU time (user + system, its workers included: they are reaped by it) and examples/s. select
reads the scored stream; close reads select's N=1 output and compact close's, so every N of a step reads
the same file. Every output must be byte-identical to N=1's: the JSONL rows whole, a stream from the first
byte after its header's zstd frame (the header holds the step's timestamps). The process exits 1 if any
differs.

``--make N`` writes a synthetic scored stream of GSM8K-like sizes first (synthetic.py: no tokenizer or
data needed). The steps run with ``--python`` (default: the repository's .venv, else this interpreter),
which needs the project's dependencies; this script itself needs only the standard library.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT / "bench")]  # measured.py beside it, bench/provenance.py (also when loaded by path)
from measured import rounded, run_measured, step_env  # noqa: E402
from provenance import commit  # noqa: E402

PREAMBLE_SIZE = 12  # magic (8 bytes) and version (2 + 2) before a stream's first zstd frame
STEPS = {  # step -> (its input: the scored stream, or a step whose N=1 output it reads; output name; arguments)
    "select": (None, "selected.bridge", ["select", "-T", "4"]),
    "close": ("select", "closed.bridge", ["close", "--segmenter", "math"]),
    "compact": ("close", "rows.jsonl", ["compact"]),
}


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_workers() -> list[int]:
    n, out = cores(), [1]
    while out[-1] * 2 <= n:
        out.append(out[-1] * 2)
    return out if out[-1] == n else [*out, n]


def default_python() -> str:
    venv = ROOT / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _env() -> dict:
    return step_env(ROOT / "src")  # this checkout's src first


def run_step(python: str, step: str, inp: Path, out: Path, workers: int) -> dict:
    cmd = [python, "-m", "bridgecli", *STEPS[step][2], str(inp), "-o", str(out), "--workers", str(workers)]
    return rounded(run_measured(cmd, _env()))


def comparable(path: Path) -> str:
    """The sha256 of what must be identical across N: a stream's bytes after its header's frame, a JSONL
    file whole. The header's frame is walked by its block headers (no zstd module needed); the file is
    read in pieces (this process's peak memory is where a child's peak RSS starts from)."""
    with open(path, "rb") as fh:
        if path.suffix == ".bridge":
            head = fh.read(PREAMBLE_SIZE + 18)
            at = PREAMBLE_SIZE
            fhd = head[at + 4]
            single = fhd >> 5 & 1
            size = 5 + (1 - single) + (single, 2, 4, 8)[fhd >> 6]
            while True:
                fh.seek(at + size)
                block = int.from_bytes(fh.read(3), "little")
                size += 3 + (1 if (block >> 1 & 3) == 1 else block >> 3)
                if block & 1:
                    break
            size += 4 if fhd & 0x04 else 0
            fh.seek(at + size)
        digest = hashlib.sha256()
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def count_examples(python: str, stream: Path) -> int:
    code = (
        "import sys; from bridgecli.format.reader import StreamReader\n"
        "with open(sys.argv[1], 'rb') as fh: print(sum(1 for _ in StreamReader(fh, validate=False)))"
    )
    out = subprocess.run([python, "-c", code, str(stream)], env=_env(), capture_output=True, text=True, check=True)
    return int(out.stdout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--stream", type=Path, help="a scored stream (bench_steps.py make, bridge score)")
    src.add_argument("--make", type=int, metavar="N", help="make a synthetic scored stream of N examples")
    ap.add_argument("--workers", help="comma-separated N (default: 1, 2, 4, ... up to the cores, and the cores)")
    ap.add_argument("--steps", default="select,close,compact")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each step and N (the fastest is reported)")
    ap.add_argument("--python", default=default_python(), help="the interpreter that runs the steps")
    ap.add_argument("--keep", type=Path, help="a folder for the stream and outputs (default: a temporary one)")
    ap.add_argument("--json", type=Path, help="write the results here")
    a = ap.parse_args(argv)
    workers = [int(x) for x in a.workers.split(",")] if a.workers else default_workers()
    if workers[0] != 1:
        workers = [1, *workers]  # N=1's outputs are the reference
    steps = a.steps.split(",")

    with tempfile.TemporaryDirectory(prefix="scaling.") as tmp:
        folder = a.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        res: dict = {
            "machine": {
                "cores": cores(),
                "cpu_count": os.cpu_count(),
                "platform": platform.platform(),
                "python": a.python,
            },
            "commit": commit(),
            "load_before": os.getloadavg(),
        }
        if a.make:
            stream = folder / "scores.bridge"
            t0 = time.perf_counter()
            made = subprocess.run(
                [a.python, str(HERE / "synthetic.py"), str(stream), "-n", str(a.make)],
                env=_env(),
                capture_output=True,
                text=True,
            )
            if made.returncode:
                raise SystemExit(f"synthetic.py failed:\n{made.stderr}")
            print(made.stdout.strip(), f"({time.perf_counter() - t0:.0f} s)", flush=True)
            res["stream"] = {"synthetic": a.make, "made": made.stdout.strip()}
        else:
            stream = a.stream
            res["stream"] = {"path": str(stream)}
        n = count_examples(a.python, stream)
        res.update(examples=n, workers=workers, steps={})
        ok = True

        def input_of(step: str) -> Path:
            """The step's input; a step it reads that is not measured runs once with N=1 to make it."""
            reads = STEPS[step][0]
            if reads is None:
                return stream
            made = folder / f"{reads}.1.{STEPS[reads][1]}"
            if reads not in steps and not made.exists():
                run_step(a.python, reads, input_of(reads), made, 1)
            return made

        for step in steps:
            name = STEPS[step][1]
            inp = input_of(step)
            entry: dict = {"command": " ".join(["python -m bridgecli", *STEPS[step][2], "IN -o OUT --workers N"])}
            reference = None
            for w in workers:
                out = folder / f"{step}.{w}.{name}"
                runs = [run_step(a.python, step, inp, out, w) for _ in range(a.repeat)]
                best = min(runs, key=lambda r: r["wall_s"])
                got = comparable(out)
                if reference is None:
                    reference = got
                same = got == reference
                ok &= same
                entry[str(w)] = {
                    **best,
                    "examples_per_s": round(n / best["wall_s"]),
                    "walls_s": [r["wall_s"] for r in runs],
                    "identical_to_1": same,
                }
                base = entry["1"]["examples_per_s"]
                entry[str(w)]["speedup"] = round(entry[str(w)]["examples_per_s"] / base, 2)
                print(
                    f"{step:8s} N={w:<3d} {best['wall_s']:7.2f} s  {n / best['wall_s']:8.0f} ex/s  "
                    f"x{entry[str(w)]['speedup']:<5}  cpu {best['cpu_s']:7.2f} s  "
                    f"{'identical' if same else 'DIFFERENT'}",
                    flush=True,
                )
                if w != 1 and not a.keep:
                    out.unlink()
            res["steps"][step] = entry
        res["load_after"] = os.getloadavg()
        res["identical"] = ok
    print("outputs identical to N=1" if ok else "OUTPUTS DIFFER from N=1")
    if a.json:
        a.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
