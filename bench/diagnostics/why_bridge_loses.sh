#!/usr/bin/env bash
# Issue 28, item 2: why BRIDGE's selection loses to random. From a data file to the diagnostics
# (supervision_compare.py: what BRIDGE supervises against random at the same budget; prompt_numbers.py:
# which of the question's numbers the prompt side keeps;
# marginal_check.py: how much of a_j a bag-of-tokens term explains; aj_check.py: a_j's sign and
# scale end to end), every step resumable (a finished step or result is skipped).
#
#   bench/diagnostics/why_bridge_loses.sh DATA.jsonl OUT_DIR
#
# DATA is cut into disjoint slices by record: the first WARM_N records warm up, the next VAL_N are
# D_val, the next SCORE_N are scored, the next POOL_N (if any) are marginal_check's --pool (slices
# written under OUT_DIR/data, never into the checkout).
# Environment (defaults: the CPU run of bench/diagnostics/README.md, the default model):
#   MODEL=             --model of the warm-up (a .gguf file, HF folder or id; empty: the default)
#   WARM_N=200 VAL_N=16 SCORE_N=120 POOL_N=0 MAX_STEPS=6 WARM_BATCH=8 WARM_LR=5e-5
#   MARGINAL_ARGS=""   (e.g. "--limit 40 --pool-sizes 8,16,32,48" with POOL_N=96)
#   RHOS="0.5 0.75"    SEED=42 (random's draw)    DEVICE=auto
#   AJ_ARGS="--examples 30 --tokens 200 --actual-tokens 32 --etas 1e-1,1e-2,1e-3,1e-4,1e-5 --eval-dtype float32
#            --dtype-check 32"   (float32 steps with the smallest eta again in float64: CPU time)
#   RESULTS=bench/diagnostics/results   TAG=cpu-smollm2
#   SCORE_ARGS=""      more `bridge score` flags, e.g. "--scorer atp" (the 0.5B grid's scorer)
#   PARTS="supervision numbers marginal aj"   which diagnostics run after the shared steps; also "resp":
#                      supervision_compare.py on the whole-prompt rows of the 0.5B grid (rho_p 1: random-resp,
#                      importance-resp, importance-loss-resp, and bridge-resp closed),
#                      RESULTS/supervision-resp-TAG.{json,md}
#   (result files: RESULTS/{supervision,marginal,aj_check}-TAG.{json,md})
#   BRIDGE="bridge"    PYTHON="python3"  (on a machine without the package installed:
#                      PYTHONPATH=$PWD/src BRIDGE="python3 -m bridgecli")
# On a GPU with the 0.5B model, for example:
#   MODEL=/work/qwen/qwen.gguf VAL_N=64 SCORE_N=400 POOL_N=256 MAX_STEPS=30 TAG=h100-qwen05b \
#   MARGINAL_ARGS="--pool-sizes 8,16,32,64,128" \
#   AJ_ARGS="--examples 30 --tokens 200 --etas 1e-1,1e-2,1e-3,1e-4,1e-5" bench/diagnostics/why_bridge_loses.sh DATA OUT
# (every sampled token stepped, everything in float64)
set -euo pipefail
DATA=$1; OUT=$2
MODEL=${MODEL:-}; WARM_N=${WARM_N:-200}; VAL_N=${VAL_N:-16}; SCORE_N=${SCORE_N:-120}; POOL_N=${POOL_N:-0}
MARGINAL_ARGS=${MARGINAL_ARGS:-}
MAX_STEPS=${MAX_STEPS:-6}; WARM_BATCH=${WARM_BATCH:-8}; WARM_LR=${WARM_LR:-5e-5}
RHOS=${RHOS:-"0.5 0.75"}; SEED=${SEED:-42}; DEVICE=${DEVICE:-auto}
AJ_ARGS=${AJ_ARGS:-"--examples 30 --tokens 200 --actual-tokens 32 --etas 1e-1,1e-2,1e-3,1e-4,1e-5 --eval-dtype float32 --dtype-check 32"}
HERE=$(cd "$(dirname "$0")" && pwd)
RESULTS=${RESULTS:-$HERE/results}; TAG=${TAG:-cpu-smollm2}
BRIDGE=${BRIDGE:-bridge}; PYTHON=${PYTHON:-python3}
SCORE_ARGS=${SCORE_ARGS:-}; PARTS=" ${PARTS:-supervision numbers marginal aj} "
for part in $PARTS; do
  case "$part" in supervision|numbers|marginal|aj|resp) ;; *) echo "why_bridge_loses.sh: error: PARTS: unknown part $part" >&2; exit 2 ;; esac
done
mkdir -p "$OUT/data" "$RESULTS"
T0=$SECONDS
stamp() { echo "[why_bridge_loses $((SECONDS - T0)) s] $*" >&2; }

if [ ! -s "$OUT/data/scored.jsonl" ]; then
  sed -n "1,${WARM_N}p" "$DATA" > "$OUT/data/warm.jsonl"
  sed -n "$((WARM_N + 1)),$((WARM_N + VAL_N))p" "$DATA" > "$OUT/data/val.jsonl"
  if [ "$POOL_N" -gt 0 ]; then
    sed -n "$((WARM_N + VAL_N + SCORE_N + 1)),$((WARM_N + VAL_N + SCORE_N + POOL_N))p" "$DATA" > "$OUT/data/pool.jsonl"
  fi
  sed -n "$((WARM_N + VAL_N + 1)),$((WARM_N + VAL_N + SCORE_N))p" "$DATA" > "$OUT/data/scored.jsonl.tmp"
  mv "$OUT/data/scored.jsonl.tmp" "$OUT/data/scored.jsonl"
fi
if [ ! -f "$OUT/warm/warmup.json" ]; then
  stamp "warmup"
  $BRIDGE warmup "$OUT/data/warm.jsonl" --val "$OUT/data/val.jsonl" ${MODEL:+--model "$MODEL"} \
    --max-steps "$MAX_STEPS" --batch-size "$WARM_BATCH" --lr "$WARM_LR" --device "$DEVICE" -o "$OUT/warm"
fi
if [ ! -s "$OUT/scored.bridge" ]; then
  stamp "score"
  # shellcheck disable=SC2086  # SCORE_ARGS: words on purpose
  $BRIDGE score "$OUT/data/scored.jsonl" --from "$OUT/warm" --device "$DEVICE" $SCORE_ARGS -o "$OUT/scored.tmp.bridge"
  mv "$OUT/scored.tmp.bridge" "$OUT/scored.bridge"
fi
if [ ! -s "$OUT/ref.bridge" ]; then
  stamp "reference (theta_old)"
  $BRIDGE reference "$OUT/scored.bridge" --no-attention --device "$DEVICE" -o "$OUT/ref.tmp.bridge"
  mv "$OUT/ref.tmp.bridge" "$OUT/ref.bridge"
fi
STREAMS=()
for rho in $RHOS; do
  [ -s "$OUT/closed-$rho.bridge" ] || {
    $BRIDGE select "$OUT/ref.bridge" --rho-p "$rho" --rho-r "$rho" -o "$OUT/sel-$rho.bridge"
    $BRIDGE close "$OUT/sel-$rho.bridge" --segmenter math -o "$OUT/closed-$rho.bridge"
  }
  [ -s "$OUT/random-$rho.bridge" ] || \
    $BRIDGE select "$OUT/ref.bridge" --method random --option seed="$SEED" --rho-p "$rho" --rho-r "$rho" \
      -o "$OUT/random-$rho.bridge"
  STREAMS+=(--stream "bridge:$rho=$OUT/closed-$rho.bridge" --stream "random:$rho=$OUT/random-$rho.bridge")
done
if [[ $PARTS == *" supervision "* ]]; then
  stamp "supervision_compare"
  $PYTHON "$HERE/supervision_compare.py" "${STREAMS[@]}" \
    --json "$RESULTS/supervision-$TAG.json" --md "$RESULTS/supervision-$TAG.md" > /dev/null
fi
if [[ $PARTS == *" resp "* ]]; then  # every prompt token kept, half (RHOS) of the response: the grid's -resp rows
  RESP=()
  for rho in $RHOS; do
    [ -s "$OUT/random-resp-$rho.bridge" ] || $BRIDGE select "$OUT/ref.bridge" --method random --option seed="$SEED" \
      --rho-p 1 --rho-r "$rho" -o "$OUT/random-resp-$rho.bridge"
    [ -s "$OUT/importance-resp-$rho.bridge" ] || $BRIDGE select "$OUT/ref.bridge" --method importance \
      --option seed="$SEED" --rho-p 1 --rho-r "$rho" -o "$OUT/importance-resp-$rho.bridge"
    [ -s "$OUT/importance-loss-resp-$rho.bridge" ] || $BRIDGE select "$OUT/ref.bridge" --method importance \
      --option seed="$SEED" --option by=loss --rho-p 1 --rho-r "$rho" -o "$OUT/importance-loss-resp-$rho.bridge"
    [ -s "$OUT/bridge-resp-$rho.bridge" ] || {
      $BRIDGE select "$OUT/ref.bridge" --rho-p 1 --rho-r "$rho" -o "$OUT/bridge-resp-sel-$rho.bridge"
      $BRIDGE close "$OUT/bridge-resp-sel-$rho.bridge" --segmenter math -o "$OUT/bridge-resp-$rho.bridge"
    }
    RESP+=(--stream "random-resp:$rho=$OUT/random-resp-$rho.bridge"
           --stream "importance-resp:$rho=$OUT/importance-resp-$rho.bridge"
           --stream "importance-loss-resp:$rho=$OUT/importance-loss-resp-$rho.bridge"
           --stream "bridge-resp:$rho=$OUT/bridge-resp-$rho.bridge")
  done
  stamp "supervision_compare (whole prompts)"
  $PYTHON "$HERE/supervision_compare.py" "${RESP[@]}" \
    --json "$RESULTS/supervision-resp-$TAG.json" --md "$RESULTS/supervision-resp-$TAG.md" > /dev/null
fi
if [[ $PARTS == *" numbers "* ]]; then
  stamp "prompt_numbers"
  NUMS=(); for rho in $RHOS; do NUMS+=("bridge:$rho=$OUT/closed-$rho.bridge" "random:$rho=$OUT/random-$rho.bridge"); done
  $PYTHON "$HERE/prompt_numbers.py" "${NUMS[@]}" --json "$RESULTS/prompt-numbers-$TAG.json" \
    --md "$RESULTS/prompt-numbers-$TAG.md" > /dev/null
fi
if [[ $PARTS == *" marginal "* ]] && [ ! -s "$RESULTS/marginal-$TAG.json" ]; then
  stamp "marginal_check"
  POOL=(); [ "$POOL_N" -gt 0 ] && POOL=(--pool "$OUT/data/pool.jsonl")
  # shellcheck disable=SC2086
  $PYTHON "$HERE/marginal_check.py" "$OUT/scored.bridge" --from "$OUT/warm" --device "$DEVICE" "${POOL[@]}" $MARGINAL_ARGS \
    --json "$RESULTS/marginal-$TAG.json" --md "$RESULTS/marginal-$TAG.md" > /dev/null
fi
if [[ $PARTS == *" aj "* ]] && [ ! -s "$RESULTS/aj_check-$TAG.json" ]; then
  stamp "aj_check"
  # shellcheck disable=SC2086
  $PYTHON "$HERE/aj_check.py" "$OUT/scored.bridge" --from "$OUT/warm" --device "$DEVICE" $AJ_ARGS \
    --json "$RESULTS/aj_check-$TAG.json" --md "$RESULTS/aj_check-$TAG.md"
fi
stamp "done"
