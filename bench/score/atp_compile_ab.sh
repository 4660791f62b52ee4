#!/usr/bin/env bash
# The atp scorer per batch (bench_atp.py --atp-compare) in a process that compiles into a new cache,
# then a later process that finds the cache: its warm-up round and compile report give what a later
# run of `bridge score --scorer atp --scorer-option fast=1` compiles. SRC_ROOT runs another checkout's
# src/ and bench/ (a before / after on one machine).
#   bash bench/score/atp_compile_ab.sh OUTDIR [CASES]
set -uo pipefail
OUT=$1 CASES=${2:-llama-3.2-1b/metamath,llama-3.2-3b/metamath}
ROOT=${SRC_ROOT:-.}
mkdir -p "$OUT"
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$(mktemp -d)}
B=(python3 "$ROOT/bench/score/bench_atp.py" --repeats 3)
"${B[@]}" --atp-compare --cases "$CASES" ${PROFILE:+--profile "$OUT/profile"} --out "$OUT/first.json" > "$OUT/first.log" 2>&1
"${B[@]}" --cases "${CASES%%,*}" --out "$OUT/later.json" > "$OUT/later.log" 2>&1
python3 - "$OUT" <<'PY'
import json, sys
for run in ("first", "later"):
    try:
        r = json.load(open(f"{sys.argv[1]}/{run}.json"))
    except (OSError, ValueError) as exc:
        print(run, "missing", exc)
        continue
    c = r["compile"]
    print(run, r["device"], "compile s", c["seconds"].get("_compile.compile_inner"), "aot", c["counters"]["aot_autograd"])
    for case in r["cases"]:
        print(" ", case["case"], "warmup", {k: round(v, 1) for k, v in case["warmup_s"].items()},
              "fast/bridge", round(case["ratio_atp_over_bridge"], 3),
              "generic/bridge", round(case.get("ratio_atp_generic_over_bridge", float("nan")), 3))
PY
