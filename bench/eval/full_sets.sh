#!/usr/bin/env bash
# Every built-in eval task on its full set, bfloat16 on the GPU(s), then the paper's Table 1.
#   bench/eval/full_sets.sh DATA_DIR [OUT_DIR] [MODEL]     (DATA_DIR holding gsm8k/, math/, ... as below;
#                                                           OUT default runs/eval-full; MODEL default smollm2)
# The multiple-choice tasks run on GPU 0 and the generation tasks on the last GPU, at the same time
# (on one GPU, both share it). Each writes OUT/eval-TASK.json; --resume keeps finished tasks, and the
# generation tasks resume per item, so rerunning continues an interrupted run.
# env: LIMIT (items per task, MMLU: per subject; default all), DEVICE (cuda), DTYPE (bfloat16)
set -euo pipefail
data=${1:?usage: full_sets.sh DATA_DIR [OUT_DIR] [MODEL]}
out=${2:-runs/eval-full}
model=${3:-smollm2}
last=$(( $(python3 -c "import torch; print(max(1, torch.cuda.device_count()))") - 1 ))
mkdir -p "$out"
opts=(--data-dir "$data" --dtype "${DTYPE:-bfloat16}" --device "${DEVICE:-cuda}" --resume -o "$out" ${LIMIT:+--limit "$LIMIT"})
start=$(date +%s)
CUDA_VISIBLE_DEVICES=0 bridge eval "$model" --task arc_challenge,arc_easy,hellaswag,mmlu "${opts[@]}" \
  --batch-size 64 > "$out/mc.out" 2> "$out/mc.log" &
mc=$!
CUDA_VISIBLE_DEVICES=$last bridge eval "$model" --task gsm8k,math,humaneval,mbpp "${opts[@]}" --allow-code-execution \
  --batch-size 128 > "$out/gen.out" 2> "$out/gen.log" &
gen=$!
status=0
wait $mc || status=1
wait $gen || status=1
[ "$status" = 0 ] || { tail -n 20 "$out/mc.log" "$out/gen.log" >&2; exit 1; }
cat "$out/mc.out" "$out/gen.out"
bridge compare "$out" --target math
echo "full_sets.sh: $(( $(date +%s) - start )) s" >&2
