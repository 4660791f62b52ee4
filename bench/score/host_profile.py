"""The host side of `bridge score`, on CPU with a tiny random model: where the main thread spends
its time per example (reading and tokenising, building batches, cutting out rows and making records,
encoding, compressing and writing), measured with cProfile around the real ``run_score``.

    python bench/score/host_profile.py --data gsm8k/train.jsonl --n 500 [--tokenizer DIR] [--top 30]

cProfile sees the main thread only: work moved to the writer thread (encoding, compressing, writing,
committing) drops out of the table, which is the point. The tiny model's own arithmetic (the prefix blocks, the dual tail and the LM head, on CPU here, on the
GPU in a real run) is reported apart: the rest is what a GPU waits for when it runs on the main thread.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "src"))

#: cumulative time of these functions (file suffix, function name): the parts of one example's cost
PARTS = {
    "tokenise (iter_examples)": ("data/examples.py", "iter_examples"),
    "scorer.score (all)": ("modeling/scoring.py", "score"),
    "  make_batch": ("modeling/score_batch.py", "make_batch"),
    "  prefix blocks (compute)": ("modeling/scoring.py", "_prefix"),
    "  dual tail + head (compute)": ("modeling/scoring.py", "_fast_tail"),
    "  _pack (rows -> records)": ("modeling/scoring.py", "_pack"),
    "launch (queue a batch)": ("modeling/scoring.py", "_launch"),
    "PendingScores.result (rows -> records)": ("modeling/scoring.py", "result"),
    "score_window (the serial loop)": ("modeling/score_loop.py", "score_window"),
    "StreamWriter.write": ("format/writer.py", "write"),
    "encode_record": ("format/writer.py", "encode_record"),
    "commit (flush, fsync)": ("runtime/resumable.py", "commit"),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the embedded model's)")
    ap.add_argument("--work", default="/tmp/bridge-host-profile")
    ap.add_argument("--max-tokens", type=int, default=32768, help="as on a GPU")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--json", default=None)
    ap.add_argument("--stats", default=None, help="write the raw cProfile stats here")
    args = ap.parse_args(argv)
    os.environ.setdefault("BRIDGE_NO_PROGRESS", "1")
    import torch

    from e2e import build, head

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    tok = args.tokenizer
    if tok is None:
        from bridgecli.modeling.loading import load_tokenizer

        tok = str(work / "tok")
        if not (work / "tok" / "tokenizer_config.json").exists():
            load_tokenizer(None).save_pretrained(tok)
    run = build("tiny", tok, work / "tiny", "cpu")
    data = head(args.data, work / f"data_{args.n}.jsonl", args.n)

    from bridgecli.steps.score import ScoreOptions, run_score

    out = work / "out.bridge"
    opts = ScoreOptions(data=str(data), out=str(out), run=str(run), max_tokens=args.max_tokens, device="cpu")
    torch.set_num_threads(1)
    prof = cProfile.Profile()
    t0, c0 = time.perf_counter(), time.process_time()
    prof.enable()
    n = run_score(opts)
    prof.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    st = pstats.Stats(prof)
    if args.stats:
        st.dump_stats(args.stats)
    cum = {}
    for (file, _line, fn), (_cc, _nc, _tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        for part, (suffix, name) in PARTS.items():
            if fn == name and file.endswith(suffix):
                cum[part] = cum.get(part, 0.0) + ct
    compute = cum.get("  prefix blocks (compute)", 0) + cum.get("  dual tail + head (compute)", 0)
    res = {
        "examples": n,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "compute_s": round(compute, 3),
        "host_us_per_example": round((wall - compute) / n * 1e6),
        "parts_us_per_example": {k: round(v / n * 1e6) for k, v in cum.items()},
    }
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.top)
    print(buf.getvalue())
    print(json.dumps(res, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
