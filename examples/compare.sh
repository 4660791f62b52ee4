#!/usr/bin/env bash
# Every compared method through the same pipeline on the bundled sample, budgets matched, then a table.
#   examples/compare.sh [OUT_DIR]        (default: runs/compare)
#
# Shared work runs once: warmup, score, and the reference pass of each model (base theta_old with
# gradient norms for tokenseek-approx; the warmup checkpoint, for ssToken's current-model attention).
# Then, per method: select -> close (BRIDGE's schedules only; see below) -> compact -> train -> eval.
#
# Tiny CPU settings by default (a smoke comparison, not the paper's numbers); override with env vars:
#   RHO_P, RHO_R (0.75)        retention ratios (single-side methods get the matched total: docs/compared-methods.md;
#                              example-importance and rho-loss keep the share RHO_R of whole examples, RHO_P 1)
#   LIMIT (16)                 training examples scored and selected
#   MAX_STEPS (2)              optimizer steps per method (`bridge train --max-steps`; empty: EPOCHS epochs)
#   EPOCHS (3), BATCH_SIZE (4), GRAD_ACCUM (1)   the rest of `bridge train`'s schedule
#   WARMUP_EPOCHS (1)          `bridge warmup --epochs`
#   EVAL_LIMIT (4)             GSM8K-style test items per method; MAX_NEW_TOKENS (96); EVAL_BATCH (4);
#   EVAL_DTYPE (float32)       `bridge eval --dtype` (bfloat16 on a GPU)
#   METHODS                    space-separated list (default: all of them)
#   CLOSE_ALL (0)              1: run `bridge close --segmenter math` for every method, not only BRIDGE's
#   WARM, VAL, TRAIN, TEST     data files (default: the bundled sample in examples/data; any GSM8K-shaped
#                              JSONL works, e.g. slices of your GSM8K files: bench/compare/real_subset.sh)
# Every step skips work whose output exists, so an interrupted run continues where it stopped, and
# runs with disjoint METHODS may share OUT_DIR (in parallel, once the shared steps are done).
# The closure projection is part of BRIDGE, so by default the compared methods are trained on their
# own token-level selections (`bridge compact` accepts a selection stream directly).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data="$here/data"
out=${1:-runs/compare}
RHO_P=${RHO_P:-0.75}
RHO_R=${RHO_R:-0.75}
LIMIT=${LIMIT:-16}
MAX_STEPS=${MAX_STEPS-2}
EPOCHS=${EPOCHS:-3}
BATCH_SIZE=${BATCH_SIZE:-4}
GRAD_ACCUM=${GRAD_ACCUM:-1}
WARMUP_EPOCHS=${WARMUP_EPOCHS:-1}
EVAL_LIMIT=${EVAL_LIMIT:-4}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-96}
EVAL_BATCH=${EVAL_BATCH:-4}
EVAL_DTYPE=${EVAL_DTYPE:-float32}
WARM=${WARM:-$data/warm.jsonl}
VAL=${VAL:-$data/val.jsonl}
TRAIN=${TRAIN:-$data/train.jsonl}
TEST=${TEST:-$data/test.jsonl}
METHODS=${METHODS-"bridge one-pass independent importance stratified random rho1 tokencleaning sstoken llmlingua1 llm+tc tokenseek-approx example-importance rho-loss"}
CLOSE_ALL=${CLOSE_ALL:-0}
mkdir -p "$out"
start=$(date +%s)

# 1-3. once: warmup (theta_bar, v), score (a, A, c and the warmup losses), reference passes
[ -f "$out/warmup/warmup.json" ] || \
  bridge warmup "$WARM" --val "$VAL" -o "$out/warmup" --epochs "$WARMUP_EPOCHS" --batch-size 8
[ -f "$out/scores.bridge" ] || bridge score "$TRAIN" --from "$out/warmup" --limit "$LIMIT" -o "$out/scores.bridge"
[ -f "$out/refs.bridge" ] || bridge reference "$out/scores.bridge" --grad-norms \
  | bridge reference --model "$out/warmup" -o "$out/refs.bridge"   # stored as 'base', then 'warmup'
if [ -n "$MAX_STEPS" ]; then schedule=(--max-steps "$MAX_STEPS"); else schedule=(--epochs "$EPOCHS"); fi

# 4. every method, same budgets, same training and evaluation
for method in $METHODS; do
  d="$out/methods/$method"
  mkdir -p "$d"
  [ -f "$d/eval.json" ] && { echo "== $method: done (remove $d/eval.json to redo)" >&2; continue; }
  echo "== $method" >&2
  rho_p=$RHO_P
  case "$method" in example-importance|rho-loss) rho_p=1 ;; esac  # whole examples: RHO_R is the share kept
  bridge select "$out/refs.bridge" --method "$method" --rho-p "$rho_p" --rho-r "$RHO_R" -o "$d/selected.bridge"
  final="$d/selected.bridge"
  case "$method" in
    bridge|one-pass|independent) close=1 ;;
    importance) close=0 ;;  # a weighted draw: closing it would drop the loss weights (close refuses)
    stratified) close=0 ;;  # per-class budgets: closing onto whole units would undo them
    *) close=$CLOSE_ALL ;;
  esac
  if [ "$close" = 1 ]; then
    bridge close --segmenter math "$d/selected.bridge" -o "$d/closed.bridge"
    final="$d/closed.bridge"
  fi
  bridge inspect --json "$final" > "$d/inspect.json"
  bridge compact "$final" -o "$d/train.jsonl"
  [ -f "$d/model/bridge_train.json" ] || bridge train "$d/train.jsonl" -o "$d/model" "${schedule[@]}" \
    --batch-size "$BATCH_SIZE" --grad-accum "$GRAD_ACCUM" --save-every 50 --resume
  bridge eval "$d/model" --task gsm8k --data "$TEST" --limit "$EVAL_LIMIT" --resume \
    --max-new-tokens "$MAX_NEW_TOKENS" --batch-size "$EVAL_BATCH" --dtype "$EVAL_DTYPE" -o "$d/eval.json"
done

# 5. the table: achieved ratios per side, retained and executed tokens, accuracy
python3 - "$out" $METHODS <<'EOF'
import json, sys
from pathlib import Path

out, methods = Path(sys.argv[1]), sys.argv[2:]
rows = []
for m in methods:
    d = out / "methods" / m
    info = json.loads((d / "inspect.json").read_text())
    sel = info.get("selection", {})
    meta = json.loads((d / "train.jsonl.bridge.json").read_text())
    acc = json.loads((d / "eval.json").read_text())["summary"]["accuracy"]
    sup = info["closure"]["supervised"] if "closure" in info else sel["response_kept"]
    rows.append((m, sel["achieved_rho_p"], sel["achieved_rho_r"], sel["prompt_kept"] + sup,
                 meta["tokens_executed"], meta["tokens_original"], meta["supervised"], acc))
head = ("method", "rho_p", "rho_r", "retained", "executed", "of", "supervised", "accuracy")
print(f"{head[0]:<17}{head[1]:>7}{head[2]:>7}{head[3]:>10}{head[4]:>10}{head[5]:>7}{head[6]:>12}{head[7]:>10}")
for m, rp, rr, ret, ex, orig, sup, acc in rows:
    print(f"{m:<17}{rp:>7.3f}{rr:>7.3f}{ret:>10}{ex:>10}{orig:>7}{sup:>12}{100 * acc:>9.1f}%")
EOF
echo "compare.sh: $(( $(date +%s) - start )) s" >&2
