#!/usr/bin/env bash
# The atp scorer's hand-written pass per batch with the compiled core's gate softmax in plain ops
# (as shipped) and as the autograd.Function, each in a process that compiles into its own new cache,
# alternated twice; then a later process of each, which finds its cache (first batch = what a later
# run compiles). One machine, one call.
#   bash bench/score/gate_softmax_ab.sh OUTDIR [CASES]
set -uo pipefail
OUT=$1 CASES=${2:-llama-3.2-1b/metamath,llama-3.2-3b/metamath}
mkdir -p "$OUT"
for v in traced function; do mkdir -p "/tmp/gsab_cache_$v"; done
for run in first later; do
  for v in traced function; do
    TORCHINDUCTOR_CACHE_DIR=/tmp/gsab_cache_$v python3 bench/score/bench_atp.py --repeats 3 --cases "$CASES" \
      --gate-softmax $v --out "$OUT/${v}_$run.json" > "$OUT/${v}_$run.log" 2>&1
  done
done
python3 - "$OUT" <<'PY'
import json, sys
for run in ("first", "later"):
    for v in ("traced", "function"):
        try:
            r = json.load(open(f"{sys.argv[1]}/{v}_{run}.json"))
        except (OSError, ValueError) as exc:
            print(v, run, "missing", exc)
            continue
        c = r["compile"]
        print(v, run, r["device"], "compile s", c["seconds"].get("_compile.compile_inner"), "aot", c["counters"]["aot_autograd"])
        for case in r["cases"]:
            print(" ", case["case"], "warmup", {k: round(x, 1) for k, x in case["warmup_s"].items()},
                  "atp s", round(case["atp_s"], 3), "bridge s", round(case["bridge_s"], 3),
                  "fast/bridge", round(case["ratio_atp_over_bridge"], 3))
PY
