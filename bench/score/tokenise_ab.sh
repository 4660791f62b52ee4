#!/usr/bin/env bash
# The tokenising process (BRIDGE_TOKENIZE_PROCESS=1) side by side with the default on one GPU machine
# (bench/score/e2e.py): forward process, first and later run as is; first and later run with the
# child; a later run as is again (bracketing the later runs).
#   bash bench/score/tokenise_ab.sh DATA TOKENIZER SHAPE OUTDIR
set -euo pipefail
DATA=$1 TOK=$2 SHAPE=$3 OUT=$4
mkdir -p "$OUT"
E=(python3 bench/score/e2e.py --data "$DATA" --tokenizer "$TOK" --shapes "$SHAPE")
"${E[@]}" --out "$OUT/base.json" > "$OUT/base.txt" 2>&1
"${E[@]}" --runs score_first,score_second --score-env BRIDGE_TOKENIZE_PROCESS=1 --out "$OUT/tokproc.json" > "$OUT/tokproc.txt" 2>&1
"${E[@]}" --runs score_second --out "$OUT/again.json" > "$OUT/again.txt" 2>&1
python3 bench/score/e2e_summary.py "$OUT" base tokproc again
