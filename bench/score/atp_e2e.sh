#!/usr/bin/env bash
# The whole `bridge score` command with the atp scorer beside the default one, on one GPU machine
# (bench/score/e2e.py): the forward process and the bridge scorer's first and later runs; the atp
# scorer's hand-written pass (fast=1), first and later run; its generic path (fast=0), a later run.
#   bash bench/score/atp_e2e.sh DATA TOKENIZER SHAPE OUTDIR
set -uo pipefail
DATA=$1 TOK=$2 SHAPE=$3 OUT=$4
mkdir -p "$OUT"
E=(python3 bench/score/e2e.py --data "$DATA" --tokenizer "$TOK" --shapes "$SHAPE" --timeout 200)
"${E[@]}" --out "$OUT/bridge.json" > "$OUT/bridge.log" 2>&1
"${E[@]}" --runs score_first,score_second --score-args "--scorer atp --scorer-option fast=1" \
    --out "$OUT/atp_fast.json" > "$OUT/atp_fast.log" 2>&1
"${E[@]}" --runs score_second --score-args "--scorer atp --scorer-option fast=0" \
    --out "$OUT/atp_generic.json" > "$OUT/atp_generic.log" 2>&1
python3 bench/score/e2e_summary.py "$OUT" bridge atp_fast atp_generic
