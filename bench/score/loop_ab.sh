#!/usr/bin/env bash
# The scoring loop against the kernel rate on one GPU machine, for one shape: the scorer alone on
# GSM8K-sized batches (bench_score.py), then `bridge score` end to end (e2e.py) with a baseline
# checkout's src and with this checkout's, the latter with torch.profiler over windows after the
# first (GPU idle share, what the host did in each gap).
#   bash bench/score/loop_ab.sh DATA TOKENIZER SHAPE BASE_SRC OUTDIR
set -uo pipefail
DATA=$1 TOK=$2 SHAPE=$3 BASE=$4 OUT=$5
mkdir -p "$OUT"
python3 bench/score/bench_score.py --cases "$SHAPE/gsm8k" --examples 1024 --timing-only \
    --out "$OUT/kernel_rate.json" > "$OUT/kernel_rate.log" 2>&1
E=(python3 bench/score/e2e.py --data "$DATA" --tokenizer "$TOK" --shapes "$SHAPE" --timeout 300)
"${E[@]}" --src "$BASE" --out "$OUT/base.json" > "$OUT/base.log" 2>&1
"${E[@]}" --runs score_first,score_second --profile --profile-dir "$OUT/profile" --out "$OUT/new.json" \
    > "$OUT/new.log" 2>&1
for f in "$OUT"/profile/*/*; do mv "$f" "$OUT/profile_$(basename "$f")"; done  # flat: the device tool's limit
rm -rf "$OUT/profile"
python3 bench/score/e2e_summary.py "$OUT" base new
