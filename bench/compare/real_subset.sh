#!/usr/bin/env bash
# examples/compare.sh on a real GSM8K subset, every method, spread over the GPUs of one machine.
#   bench/compare/real_subset.sh GSM8K_DIR [OUT_DIR]      (GSM8K_DIR holds train.jsonl and test.jsonl,
#                                                          e.g. data/gsm8k; OUT default runs/compare-gsm8k)
# Slices of GSM8K's train split (disjoint): WARM_N for the warmup, VAL_N for D_val, TRAIN_N scored and
# selected. Each method trains with the paper's schedule (EPOCHS, 8 x 8 = 64 rows a step, lr 2e-5) and
# is evaluated on the first EVAL_N test items. The shared steps run once on GPU 0, then the methods are
# dealt round-robin to the GPUs (CUDA_VISIBLE_DEVICES, one compare.sh per GPU, same OUT), then the
# table. Rerunning continues an interrupted run (compare.sh skips finished work).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${1:?usage: real_subset.sh GSM8K_DIR [OUT_DIR]}
out=${2:-runs/compare-gsm8k}
WARM_N=${WARM_N:-1000}
VAL_N=${VAL_N:-200}
TRAIN_N=${TRAIN_N:-1500}
EVAL_N=${EVAL_N:-250}
GPUS=${GPUS:-$(python3 -c "import torch; print(max(1, torch.cuda.device_count()))")}
compare=$here/../../examples/compare.sh
METHODS=${METHODS:-$(sed -n 's/^METHODS=${METHODS-"\(.*\)"}$/\1/p' "$compare")}   # compare.sh's: all
mkdir -p "$out/data"
sed -n "1,${WARM_N}p" "$src/train.jsonl" > "$out/data/warm.jsonl"
sed -n "$((WARM_N + 1)),$((WARM_N + VAL_N))p" "$src/train.jsonl" > "$out/data/val.jsonl"
sed -n "$((WARM_N + VAL_N + 1)),$((WARM_N + VAL_N + TRAIN_N))p" "$src/train.jsonl" > "$out/data/train.jsonl"
cp "$src/test.jsonl" "$out/data/test.jsonl"
export WARM=$out/data/warm.jsonl VAL=$out/data/val.jsonl TRAIN=$out/data/train.jsonl TEST=$out/data/test.jsonl
export LIMIT=$TRAIN_N MAX_STEPS= EPOCHS=${EPOCHS:-3} BATCH_SIZE=8 GRAD_ACCUM=8 EVAL_LIMIT=$EVAL_N \
  MAX_NEW_TOKENS=256 EVAL_BATCH=${EVAL_BATCH:-64} EVAL_DTYPE=bfloat16 BRIDGE_NO_PROGRESS=1
start=$(date +%s)
CUDA_VISIBLE_DEVICES=0 METHODS="" "$compare" "$out" > /dev/null  # the shared steps
echo "shared steps: $(( $(date +%s) - start )) s" >&2
# shellcheck source=../share.sh
. "$here/../share.sh"
pids=()
for ((g = 0; g < GPUS; g++)); do
  # shellcheck disable=SC2086  # the method words, split on purpose
  mine=$(share "$g" "$GPUS" $METHODS)
  [ -n "$mine" ] || continue
  CUDA_VISIBLE_DEVICES=$g METHODS="$mine" "$compare" "$out" > "$out/gpu$g.out" 2> "$out/gpu$g.log" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
[ "$status" = 0 ] || { tail -n 30 "$out"/gpu*.log >&2; exit 1; }
METHODS="$METHODS" "$compare" "$out" | tee "$out/table.txt"   # all done: the table
echo "real_subset.sh: $(( $(date +%s) - start )) s on $GPUS GPU(s)" >&2
