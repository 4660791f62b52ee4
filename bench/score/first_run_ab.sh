#!/usr/bin/env bash
# Side by side on one GPU machine for one shape (bench/score/e2e.py): the forward process, a first
# run (empty caches) and a later run of `bridge score` as it is; a first and a later run with the
# kernel warm-up thread off; with TOKPROC=1 also a later run tokenising in the main process (the
# tokenising process off, BRIDGE_TOKENIZE_PROCESS=0) and one more later run as it is.
#   [TOKPROC=1] [N=512] bash bench/score/first_run_ab.sh DATA TOKENIZER SHAPE OUTDIR
set -euo pipefail
DATA=$1 TOK=$2 SHAPE=$3 OUT=$4
mkdir -p "$OUT"
E=(python3 bench/score/e2e.py --data "$DATA" --tokenizer "$TOK" --shapes "$SHAPE" --n "${N:-2048}")
"${E[@]}" --out "$OUT/base.json" > "$OUT/base.txt" 2>&1
"${E[@]}" --runs score_first,score_second --score-env BRIDGE_KERNEL_WARMUP=0 --out "$OUT/nowarm.json" > "$OUT/nowarm.txt" 2>&1
NAMES="base nowarm"
if [ "${TOKPROC:-0}" = 1 ]; then
  "${E[@]}" --runs score_second --score-env BRIDGE_TOKENIZE_PROCESS=0 --out "$OUT/tokproc.json" > "$OUT/tokproc.txt" 2>&1
  "${E[@]}" --runs score_second --out "$OUT/second2.json" > "$OUT/second2.txt" 2>&1
  NAMES="$NAMES tokproc second2"
fi
python3 bench/score/e2e_summary.py "$OUT" $NAMES
