#!/usr/bin/env bash
# Prompt-side fidelity of the `atp` scorer next to the paper's attention surrogate, on GSM8K and MATH
# with the default model (docs/diagnostics.md, "The atp prompt scorer"). Same settings as the
# documented GSM8K table: a 9-step warmup on the first 64 records, rho 0.75, T 4, mask perturbation.
#
#   bench/diagnostics/prompt_scorer.sh GSM8K_TRAIN.jsonl MATH_TRAIN.jsonl OUT_DIR [N]
#
# Environment: PROXY_LIST="--proxy atp --proxy atp:ig=4" replaces the list below; ONLY=gsm8k or
# ONLY=math runs one data set (a GPU command capped in time can take them one at a time).
#
# Runs on CPU or a GPU (`--device auto`); on a GPU it takes a few minutes.
set -euo pipefail
GSM8K=$1; MATH=$2; OUT=$3; N=${4:-40}
mkdir -p "$OUT"
BRIDGE=${BRIDGE:-bridge}
# ig=4: integrated gradients over a key gate along the joint path (5 passes), ig_rule=avg: the
# key-gate estimate averaged over 4 joint states (4 passes); see src/bridgecli/modeling/attribution.py
PROXIES=(--proxy atp --proxy atp:chunks=4 --proxy atp:chunks=100000 --proxy atp:ig=4 --proxy atp:ig=4,ig_rule=avg)
if [ -n "${PROXY_LIST:-}" ]; then read -ra PROXIES <<< "$PROXY_LIST"; fi
ONLY=${ONLY:-}
if [ "$ONLY" != math ]; then
[ -f "$OUT/warm-gsm8k/warmup.json" ] || $BRIDGE warmup "$GSM8K" --limit 64 --val-fraction 0.25 --warm-fraction 0.75 \
    --batch-size 4 --lr 5e-5 -o "$OUT/warm-gsm8k"
$BRIDGE analyze fidelity "$GSM8K" --from "$OUT/warm-gsm8k" --n "$N" --max-length 200 --batch-size 32 \
    --cache "$OUT/cache" "${PROXIES[@]}" -o "$OUT/fidelity-gsm8k-atp.json"
fi
[ "$ONLY" = gsm8k ] && exit 0
[ -f "$OUT/warm-math/warmup.json" ] || $BRIDGE warmup "$MATH" --limit 64 --val-fraction 0.25 --warm-fraction 0.75 \
    --batch-size 4 --lr 5e-5 -o "$OUT/warm-math"
$BRIDGE analyze fidelity "$MATH" --from "$OUT/warm-math" --n "$N" --max-length 320 --batch-size 32 \
    --cache "$OUT/cache" "${PROXIES[@]}" -o "$OUT/fidelity-math-atp.json"
