#!/usr/bin/env python3
"""What a real scored stream weighs per example, and how fast rank 0 merges shards.

1. A one-step warmup of the default model (SmolLM2-135M, real weights) on a few GSM8K train
   records, then `bridge score` (in this process, on the CPU) over the next ``--n`` records:
   the stream's bytes per example and per response token, with the real scorer's A (float16,
   zstd) rather than the random rows of docs/benchmarks.md's CPU-step stream.
2. The merge that rank 0 runs after a multi-rank `bridge score`: the scored examples cycled to
   ``--merge-examples`` with fresh indices, split into ``--shards`` shards by index (as ranks
   write them), merged with ``merge_streams`` in this process, in frames of at most ``--n``
   examples (so that no frame holds a copy: it would compress too well). Timed three ways: copying
   the records as written (what rank 0 does after `bridge score`); decoding + validating them
   (what `bridge merge` does); and only reading the shards in index order, without writing: the
   floor that compressing frames in parallel could not go below.

    OMP_NUM_THREADS=1 python bench/scale/stream_bytes.py --data data/gsm8k/train.jsonl \
        --out bench/scale/results/stream_bytes_cpu.json

The merge is timed by the wall clock and by the process's CPU time; on a busy machine the CPU
time's rate is the closer one to what a core of its own would do. Say which machine ran it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: provenance
import provenance  # noqa: E402


def main() -> None:
    ap = provenance.result_parser(__doc__, out=None)
    ap.add_argument("--data", required=True, help="GSM8K-shaped JSONL (question, answer)")
    ap.add_argument("--n", type=int, default=256, help="records to score")
    ap.add_argument("--warm", type=int, default=8, help="records for the one-step warmup (and as many for validation)")
    ap.add_argument("--merge-examples", type=int, default=4096)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--window", type=int, default=256, help="bridge score's --window (the merged frames)")
    args = ap.parse_args()

    from bridgecli.runtime.merge import _as_is, _in_order, merge_streams
    from bridgecli.format.reader import open_reader, read_all
    from bridgecli.format.writer import open_writer
    from bridgecli.steps.score import ScoreOptions, run_score
    from bridgecli.steps.warmup import WarmupOptions, run_warmup
    from bridgecli.training.config import SFTConfig

    lines = Path(args.data).read_text().splitlines(keepends=True)
    need = 2 * args.warm + args.n
    if len(lines) < need:
        raise SystemExit(f"{args.data} has {len(lines)} records, {need} needed")
    with tempfile.TemporaryDirectory(prefix="bridge-scale-") as tmp:
        tmp = Path(tmp)
        (tmp / "warm.jsonl").write_text("".join(lines[: args.warm]))
        (tmp / "val.jsonl").write_text("".join(lines[args.warm : 2 * args.warm]))
        (tmp / "data.jsonl").write_text("".join(lines[2 * args.warm : need]))
        sft = SFTConfig(epochs=1, batch_size=4, grad_accum=1, max_steps=1)
        # WarmupOptions(data, val, out), ScoreOptions(data, out, run): the first fields, in order
        run_warmup(
            WarmupOptions(str(tmp / "warm.jsonl"), str(tmp / "val.jsonl"), tmp / "warmup", device="cpu", sft=sft)
        )
        t0 = time.perf_counter()
        data, scores = str(tmp / "data.jsonl"), str(tmp / "s.bridge")
        run_score(ScoreOptions(data, scores, tmp / "warmup", device="cpu", window=args.window))
        score_s = time.perf_counter() - t0
        header, examples = read_all(tmp / "s.bridge")
        size = (tmp / "s.bridge").stat().st_size
        with open_writer(tmp / "h.bridge", header):  # the same header, no example: its share of the size
            pass
        overhead = (tmp / "h.bridge").stat().st_size
        tokens = sum(len(e.tokens.input_ids) for e in examples)
        response = sum(len(e.tokens.response_positions()) for e in examples)
        prompt_cols = sum(e.scores.A.numpy().size for e in examples)

        # shards as ranks write them: index % shards == rank, each in index order, one frame per window.
        # A merged frame holds no example twice (zstd would find the copy), so frames are at most
        # as long as the scored examples are many
        frame = min(args.window, len(examples))
        per = [[] for _ in range(args.shards)]
        for i in range(args.merge_examples):
            ex = examples[i % len(examples)]
            per[i % args.shards].append(msgspec.structs.replace(ex, id=f"{ex.id}-{i}", index=i))
        paths = []
        for r, exs in enumerate(per):
            p = tmp / f"m.shard-{r}"
            with open_writer(p, header, records_per_frame=None) as w:
                for k, ex in enumerate(exs, 1):
                    w.write(ex)
                    if k % max(1, frame // args.shards) == 0:
                        w.flush()
            paths.append(p)
        merge_s, merge_cpu_s = {}, {}
        hows = (("as_written", False), ("validated", True))
        for how, validate in hows:
            t0, c0 = time.perf_counter(), time.process_time()
            merged = merge_streams(paths, tmp / f"merged-{how}.bridge", frame=frame, validate=validate)
            merge_s[how], merge_cpu_s[how] = time.perf_counter() - t0, time.process_time() - c0
            assert merged == args.merge_examples
        t0, c0 = time.perf_counter(), time.process_time()
        with contextlib.ExitStack() as stack:
            readers = [stack.enter_context(open_reader(p)) for p in paths]
            assert sum(1 for _ in _in_order([_as_is(r) for r in readers], readers)) == args.merge_examples
        merge_s["read_only"], merge_cpu_s["read_only"] = time.perf_counter() - t0, time.process_time() - c0
        same = all(
            (tmp / f"merged-{h}.bridge").read_bytes() == (tmp / "merged-validated.bridge").read_bytes() for h, _ in hows
        )
        merged_size = (tmp / "merged-validated.bridge").stat().st_size

    result = {
        **provenance.header("cpu"),
        "data": args.data,
        "model": header.model.source,
        "scored_examples": len(examples),
        "tokens": tokens,
        "response_tokens": response,
        "tokens_per_example": round(tokens / len(examples), 1),
        "response_tokens_per_example": round(response / len(examples), 1),
        "A_entries_per_example": round(prompt_cols / len(examples), 1),
        "stream_bytes": size,
        "header_and_end_bytes": overhead,
        "bytes_per_example": round((size - overhead) / len(examples), 1),
        "bytes_per_response_token": round((size - overhead) / max(response, 1), 1),
        "score_s_cpu": round(score_s, 2),
        "merge_examples": args.merge_examples,
        "merge_shards": args.shards,
        "merged_bytes": merged_size,
        "merge_s": {k: round(v, 3) for k, v in merge_s.items()},
        "merge_examples_per_s": {k: round(args.merge_examples / v) for k, v in merge_s.items()},
        # the rate of one core of its own: on a busy machine the wall-clock rate is lower
        "merge_cpu_s": {k: round(v, 3) for k, v in merge_cpu_s.items()},
        "merge_examples_per_cpu_s": {k: round(args.merge_examples / v) for k, v in merge_cpu_s.items()},
        "merge_mb_per_s": {k: round(merged_size / v / 1e6, 1) for k, v in merge_s.items()},
        "merges_identical": same,
        "merged_bytes_per_example": round(merged_size / args.merge_examples, 1),
        "merge_frame": frame,
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "load_after": list(os.getloadavg()),
    }
    print(json.dumps(result, indent=2))
    provenance.write_json(args.out, result)


if __name__ == "__main__":
    main()
