#!/usr/bin/env bash
# The tokenising process (the default on CUDA, BRIDGE_TOKENIZE_PROCESS=auto) side by side with
# tokenising in the main process (BRIDGE_TOKENIZE_PROCESS=0) on one GPU machine (bench/score/e2e.py):
# forward process, first and later run in process; first and later run with the child; a later run
# in process again (bracketing the later runs).
#   bash bench/score/tokenise_ab.sh DATA TOKENIZER SHAPE OUTDIR
set -euo pipefail
DATA=$1 TOK=$2 SHAPE=$3 OUT=$4
mkdir -p "$OUT"
E=(python3 bench/score/e2e.py --data "$DATA" --tokenizer "$TOK" --shapes "$SHAPE")
"${E[@]}" --score-env BRIDGE_TOKENIZE_PROCESS=0 --out "$OUT/base.json" > "$OUT/base.txt" 2>&1
"${E[@]}" --runs score_first,score_second --out "$OUT/tokproc.json" > "$OUT/tokproc.txt" 2>&1
"${E[@]}" --runs score_second --score-env BRIDGE_TOKENIZE_PROCESS=0 --out "$OUT/again.json" > "$OUT/again.txt" 2>&1
python3 bench/score/e2e_summary.py "$OUT" base tokproc again
