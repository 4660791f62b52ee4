"""How much of `bridge score`'s host work the pipelined loop hides behind the GPU, measured without
a GPU: a simulated device (a thread that takes ``tokens / --rate`` seconds a batch, sleeping, so
the GIL is free as during a real kernel wait) behind the real loop, with real reading, tokenising,
bucketing, record making, encoding, compressing and writing of GSM8K records.

    python bench/score/overlap_sim.py --data gsm8k/train.jsonl --n 2048 --rate 99000 [--tokenizer DIR]

It runs the loop as it was (``score_window``: each batch scored then collected, the window written
on the main thread, the next window read after it), the pipelined ``run_windows`` tokenising on the
main thread, and ``run_windows`` fed by the tokenising child process (``process``), alternating,
and reports each one's wall time against the simulated device's busy time, and whether both wrote
the same bytes. The scores are random but fixed per example (seeded by its index), with the real
shapes (a, c, loss [n]; A [n, m] float16 rows that sum to at most 1).
"""

from __future__ import annotations

import argparse
import itertools
import json
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))
sys.path.insert(0, str(HERE))

from bridgecli.data.examples import DataOptions, iter_examples  # noqa: E402
from bridgecli.data.prefetch import prefetch_examples  # noqa: E402
from bridgecli.format.records import Array, Header, ModelInfo, Scores  # noqa: E402
from bridgecli.runtime.resumable import ResumableOutput  # noqa: E402
from bridgecli.modeling import score_loop as step  # noqa: E402
from bridgecli.steps.options import ScoreOptions  # noqa: E402


def fake_scores(ex) -> Scores:
    rng = np.random.default_rng(ex.index)
    m, n = len(ex.tokens.prompt_positions()), len(ex.tokens.response_positions())
    A = (rng.random((n, m)) / max(m, 1)).astype(np.float16)
    return Scores(
        scorer="bridge",
        a=Array.of(rng.normal(size=n).astype(np.float32)),
        c=Array.of(rng.random(n).astype(np.float32)),
        A=Array.of(A, "float16"),
        loss=Array.of(rng.random(n).astype(np.float32)),
    )


class SimDevice:
    """Batches run one after another on a thread; each takes tokens / rate seconds (asleep)."""

    def __init__(self, rate: float):
        self.rate = rate
        self.jobs: queue.Queue = queue.Queue()
        self.busy = 0.0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            examples, box, done = self.jobs.get()
            t = sum(len(e.tokens.input_ids) for e in examples) / self.rate
            time.sleep(t)
            self.busy += t
            box.extend(fake_scores(e) for e in examples)  # stands for the device's results
            done.set()


class Pending:
    def __init__(self, box, done):
        self.box, self.done = box, done

    def result(self):
        self.done.wait()
        return self.box


class SimScorer:
    def __init__(self, device: SimDevice):
        self.device = device

    def launch(self, examples):
        box, done = [], threading.Event()
        self.device.jobs.put((examples, box, done))
        return Pending(box, done)

    def score(self, examples):
        return self.launch(examples).result()


def serial_loop(scorer, examples, opts, max_tokens, writer, commit):
    """The loop before pipelining (as in the checkout this branch started from)."""
    position = 0
    for window in step.windows(examples, opts.window):
        for ex in step.score_window(scorer, window, max_tokens, opts.batch_size):
            writer.write(ex)
        position += len(window)
        commit(writer, position)
    return writer.count


def run_once(kind: str, data: str, tokenizer, n: int, rate: float, out: Path, tokenizer_source: str) -> dict:
    opts = ScoreOptions(data=data)
    device = SimDevice(rate)
    scorer = SimScorer(device)
    header = Header(stage="scores", producer="sim", created="", model=ModelInfo("sim", "", ""))
    startup = None
    if kind == "process":  # read and tokenise in a child process (data/prefetch.py), as on CUDA
        t = time.perf_counter()
        examples = prefetch_examples(data, tokenizer_source, DataOptions(limit=n))
        first = next(examples)  # the child's start (interpreter, tokenizer) is timed apart: in
        startup = time.perf_counter() - t  # `bridge score` it overlaps the model's loading
        examples = itertools.chain([first], examples)
    else:
        examples = iter_examples(data, tokenizer, DataOptions(limit=n))
    output = ResumableOutput(out)
    writer, _ = output.open(header, resume=False)
    t0 = time.perf_counter()
    if kind == "serial":
        serial_loop(scorer, examples, opts, 32768, writer, output.commit)
    else:
        step.run_windows(
            scorer,
            examples,
            writer,
            window=opts.window,
            batch_size=opts.batch_size,
            max_tokens=32768,
            total=n,
            skip=0,
            commit=output.commit,
        )
    wall = time.perf_counter() - t0
    output.finish(writer)
    res = {
        "loop": kind,
        "wall_s": round(wall, 3),
        "device_busy_s": round(device.busy, 3),
        "device_idle_fraction": round(1 - device.busy / wall, 3),
    }
    if startup is not None:
        res["child_start_s"] = round(startup, 3)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--rate", type=float, default=99000, help="simulated device tokens/s (kernel bench, 1B: 99K)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import os

    os.environ.setdefault("BRIDGE_NO_PROGRESS", "1")
    from transformers import AutoTokenizer

    from bridgecli.modeling.loading import load_tokenizer
    from e2e import after_header

    from bridgecli.modeling.loading import local_path, resolve

    tok = AutoTokenizer.from_pretrained(args.tokenizer) if args.tokenizer else load_tokenizer(None)
    source = args.tokenizer or str(local_path(resolve(None)))
    kinds = ("serial", "pipelined", "process")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        outs = {}
        for r in range(args.repeat):
            for kind in kinds:
                outs[kind] = Path(tmp) / f"{kind}.bridge"
                res = run_once(kind, args.data, tok, args.n, args.rate, outs[kind], source)
                res["repeat"] = r
                rows.append(res)
                print(json.dumps(res), flush=True)
        same = all(after_header(outs["serial"]) == after_header(outs[k]) for k in kinds)
    best = {k: min(x["wall_s"] for x in rows if x["loop"] == k) for k in kinds}
    summary = {
        "examples": args.n,
        "rate": args.rate,
        "best_wall_s": best,
        "same_bytes_after_header": same,
        "runs": rows,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
