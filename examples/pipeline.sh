#!/usr/bin/env bash
# The whole BRIDGE pipeline on the bundled sample with the embedded default model, on CPU.
#   examples/pipeline.sh [OUT_DIR]        (default: runs/example)
# Every step is a plain `bridge` command; the middle steps stream through a shell pipe.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data="$here/data"
out=${1:-runs/example}
mkdir -p "$out"

# 1. warmup: short SFT from theta_old on the warm split, then the scoring direction v
# (--overwrite here and in 6.: running the example again replaces its own earlier runs in OUT_DIR)
bridge warmup "$data/warm.jsonl" --val "$data/val.jsonl" -o "$out/warmup" --epochs 1 --batch-size 8 --overwrite

# 2-5. score -> select -> close -> compact, streamed
bridge score "$data/train.jsonl" --from "$out/warmup" \
  | bridge select --rho-p 0.75 --rho-r 0.75 -T 4 \
  | bridge close --segmenter math \
  | tee "$out/closed.bridge" \
  | bridge compact -o "$out/train.jsonl"
bridge inspect "$out/closed.bridge"
bridge compact "$out/closed.bridge" --format text -o "$out/train.txt"  # a human view of the selection
head -n 14 "$out/train.txt"

# 6. train from theta_old on the compacted rows (tiny CPU settings; the paper uses 3 epochs, batch 64)
bridge train "$out/train.jsonl" -o "$out/final" --epochs 1 --batch-size 8 --grad-accum 1 --overwrite

# 7. evaluate on the sample's held-out GSM8K-style test split
bridge eval "$out/final" --task gsm8k --data "$data/test.jsonl" --max-new-tokens 160 --batch-size 12

# 8. held-out loss of the reference answers of that split (24 examples no step trained on), for the
#    base model and the trained one, each with a 95% bootstrap interval: lower is better, and
#    intervals that do not overlap show an effect where accuracy at this size shows none
bridge eval smollm2 --task heldout-loss --data "$data/test.jsonl" -o "$out/base"
bridge eval "$out/final" --task heldout-loss --data "$data/test.jsonl"
bridge compare "$out/base" "$out/final"
