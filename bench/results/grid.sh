#!/usr/bin/env bash
# The held-out-loss grid of issue 11: every method x retention x seed, trained on one GSM8K + MATH
# train mix, scored by the held-out loss of GSM8K test and MATH-500. Results accumulate in ONE file.
#   bench/results/grid.sh DATA_DIR OUT_DIR
# DATA_DIR holds gsm8k/{train,test}.jsonl and math/{hendrycks_math_train,math500_test}.jsonl.
# Then: python3 bench/results/grid_table.py OUT_DIR/results.json   (markdown table + Finding-3 plot)
#
# Data: GSM8K train (question/answer) and MATH train (problem/solution) are converted to one
# prompt/response JSONL, shuffled together with DATA_SEED, and cut into disjoint slices: W warm-up
# examples, VAL for D_val, N scored/selected/trained. Held-out: GSM8K test and MATH-500.
# Shared work runs once: warmup, score (attention scorer), score --scorer atp (only when bridge-atp
# is in METHODS), the reference passes of the base model and of the warmup checkpoint.
# Then for every RHO (rho_p = rho_r), SEED and METHOD: select -> close (BRIDGE's schedules) ->
# compact -> train --seed SEED -> eval heldout-loss on both files (-> gsm8k accuracy if ACC_LIMIT>0),
# and one entry "METHOD/RHO/SEED" is merged (atomically, under a lock) into OUT_DIR/results.json.
# Every step skips finished work (train and eval continue with --resume), so a run that stops is
# rerun with the same command; runs that add SEEDS or METHODS may reuse OUT_DIR.
#
# Rows (METHODS): base (the untrained model, evaluated once), full (full SFT: `select --method random
# --rho-p 1 --rho-r 1`, every prompt token kept and every response token supervised; checked on the
# compacted rows), random, random-close (random's draw, then BRIDGE's closure: separates what the
# closure does to a budget from what the scores do), independent, one-pass, bridge (SCORER's scores), bridge-atp (the atp
# scorer's B), bridge-global (bridge --budget global), rho1, tokencleaning, llm+tc (LLMLingua-1
# prompt side + Token Cleaning). base and full do not depend on RHO (recorded with rho 1).
# Variants beyond the paper (issue 28; docs/method.md): bridge-fill (bridge, then close --fill: b_r spent
# exactly), bridge-global-fill (bridge --budget global, then close --fill: each example's b_r from the global
# allocation spent exactly), importance (select --method importance: BRIDGE's prompt side, response tokens
# sampled with probabilities rising with |Delta_r| and a uniform floor, inverse-probability loss weights; the draw
# follows the seed), tilt (the same draw without the weights: biased toward the tilt), bridge-answer
# (bridge with --protect-response answer, then close), stratified (select --method stratified: a
# response budget per token class, the best Delta_r within each; token level, not closed), random-resp and
# bridge-resp (random's draw and bridge with closure at rho_r = RHO but every prompt token kept, rho_p 1: does
# dropping prompt tokens cost the accuracy? At 0.5B every rho-0.5 row, random's too, fell below the untrained
# model while full SFT rose above it), bridge-digits (bridge with --protect-prompt digits: the question's numbers
# always kept, within b_p; at rho_p 0.5 the prompt side cut about half of the numbers an answer uses),
# importance-resp, tilt-resp and bridge-resp-answer (importance, tilt and bridge-answer with every prompt token
# kept, rho_p 1: at 0.5B random-resp kept the untrained model's accuracy where random fell 12 points below it,
# and bridge-resp's answers ran into the token limit 341 times in 1,319, most in loops that never reach `####`);
# importance-loss-resp (importance-resp tilted by the scoring checkpoint's per-token loss, --option by=loss,
# instead of |Delta_r|: added after importance-resp was the first row above random-resp at 0.5B, to ask whether
# BRIDGE's attribution adds anything over the loss, which |a_j| tracks and which needs no direction v).
# Rows of issue 39 (cost as users pay it; docs/results.md "What a user gains"): example-importance (whole
# examples drawn by the warm-up model's loss with inverse-probability weights: a share RHO of the examples, every
# token of each; it executes fewer tokens), rho-loss (RHO-LOSS: the share RHO of the examples with the largest
# reducible loss, base-model loss minus warm-up-model loss; needs the base model's reference pass), METHOD-trim
# (METHOD's selection, each compacted row cut after its last supervised token: importance-loss-resp-trim,
# bridge-resp-trim), bridge-debiased and bridge-resp-debiased (bridge and bridge-resp on a_j with the common
# direction removed: a second scoring pass, score-debiased), and the compute-matched controls full-match-METHOD
# (full SFT stopped by --max-steps where its training FLOPs reach METHOD's at the same RHO and seed:
# bench/results/grid_cost.py; METHOD's rows are made first if they are not there).
#
# Environment (defaults in brackets):
#   MODEL [empty: the embedded default]   the base model theta_old (a .gguf file, an HF folder)
#   MIX [gsm8k+math]   the train pool: gsm8k+math (GSM8K train and MATH train) or gsm8k (GSM8K train alone)
#   W [1000], VAL [200], N [8000], DATA_SEED [0]     slices of the shuffled train pool (N=rest: all that is left)
#   SCORER [bridge]   the scorer of the main scored stream that the BRIDGE rows (independent, one-pass,
#                     bridge, bridge-global and the variants) read: bridge (attention routing) or atp
#   RHOS ["0.5 0.75"], SEEDS ["42"] (later "42 3407 2027"), METHODS [all rows above]
#   EPOCHS [1], MAX_STEPS [empty: EPOCHS], BATCH_SIZE [16], GRAD_ACCUM [4] (64 rows a step), LR [2e-5]
#   WARMUP_EPOCHS [1], WARMUP_MAX_STEPS [empty]
#   GSM8K_LIMIT [1319], MATH_LIMIT [500]   held-out examples (the first N of each file)
#   ACC_LIMIT [0: skip]   GSM8K test items for accuracy (greedy generation, GEN_TOKENS [256] new tokens)
#   MATH_ACC_LIMIT [0: skip]   MATH-500 items for accuracy (greedy, MATH_GEN_TOKENS [512] new tokens)
#   ANSWER_LOSS [0]   1: the answer-span loss (`eval --task answer-loss`) on GSM8K test and MATH-500
#   GEN_BATCH [EVAL_BATCH]   generation batch size for the accuracy tasks
#   EVAL_LANES [1]   2: a row's GSM8K and MATH-500 evaluations (and with GENERAL, the log-likelihood tasks and
#                    humaneval) run as processes side by side on its device, one lane each (generation is
#                    host-bound: a 0.5B model's decoding step leaves an H200 mostly idle); the eval-* seconds
#                    recorded then overlap, and the results are the same as with 1
#   GENERAL [empty]   general-capability tasks run on every row (and base), the paper's retention claim:
#                     any of "arc_challenge hellaswag mmlu humaneval" (full test sets, zero-shot; each task in an eval
#                     process of its own, side by side with EVAL_LANES=2; humaneval sandboxed: --allow-code-execution); data
#                     under DATA_DIR/arc, hellaswag, mmlu, humaneval; CODE_ISOLATION [bwrap]: unsafe runs humaneval
#                     with --unsafe-code-execution (only on a machine lent for nothing else); GENERAL_LIMIT [empty:
#                     the full sets] the first N items of each (MMLU: of each subject), for smoke runs
#   IMPORTANCE_OPTIONS ["floor=0.5 by=abs"]   --option words of the importance and tilt rows
#   TRAIN_OPTIONS [empty]   more `bridge train` flags, e.g. --no-packing
#   PREPARE_ONLY [0]   1: every job stops after its compacted rows (no training, no evaluation, nothing
#                      recorded): selections made on one machine, carried to the next (device_grid.sh export)
#   EVAL_BATCH [32 on a GPU, 4 on CPU], EVAL_DTYPE [float32]   (eval and reference passes)
#   SCORE_DTYPE [auto], REF_BATCH [32 on a GPU, 8 on CPU]   (training runs bf16 on a GPU by itself)
#   SAVE_EVERY [20]   training checkpoint interval (optimizer steps) that --resume continues from
#   KEEP_CHECKPOINTS [0]  1: keep each run's training checkpoints once it is recorded (model + optimizer state, GBs a run)
#   DEADLINE_S [empty]  start no step after this many seconds; exit 75 ("rerun to continue"). For
#                       machines lent for a limited time per command: DEADLINE_S=540 under a 600 s cap
#                       (a step cut by the cap instead loses at most SAVE_EVERY steps, or the step)
#   ATP_OPTIONS [empty]  --scorer-option KEY=VALUE words for the atp scorer (e.g. "chunks=4")
#   REFS [1]   1: the reference passes of the base and warm-up models run with the shared steps (about 3 minutes
#              of the 0.5B's on an H200) and every row selects from the stream that holds them; 0: the rows
#              select from the scored stream itself, and the passes run only when a row first needs them
#              (rho1, tokencleaning, llm+tc: both; rho-loss: the base model's), on that row's GPU
#   WARMUP_OPTIONS, DEBIAS_OPTIONS ["debias=common"], TRIM_OPTIONS ["--trim-tail"], EXAMPLE_FLOOR [0.5]
#              more warmup flags; the --scorer-option words of score-debiased; the compact flags of the -trim
#              rows; the uniform floor of example-importance's draw
#   BRIDGE [bridge]   the command that runs the CLI, e.g. "python -m bridgecli"
#
#   GPUS [1]   after the shared steps (on GPU 0), deal the runs round-robin to GPUs 0..GPUS-1,
#              one grid.sh each (logs: OUT_DIR/gpuG.log); the results still go to one results.json.
#              With CUDA_VISIBLE_DEVICES given (e.g. "3" or "0,1,2"), GPU G is its G-th entry, so two
#              grids (two OUT_DIRs, two models) can share one machine's GPUs
#   GRID_JOBS [empty]  an explicit job list "SEED:METHOD:RHO ..." in place of SEEDS x METHODS x RHOS (base and
#              full take RHO 1; a word of another shape is refused before any work)
#              (METHODS still decides the shared steps: name bridge-atp there for score-atp)
#   PROCS_PER_GPU [1]  runs side by side on each GPU (the 135M model leaves an H100 mostly idle:
#              3 processes finish about twice the runs per hour of one); logs OUT_DIR/gpuG-P.log
#   The workers take the jobs in list order, each the next one no worker has claimed (OUT_DIR/claims), so the
#   list is a priority order and a worker that finishes early takes more. A row trained and evaluated beside
#   others on its GPU records how many shared it (cost.gpu_processes): its seconds are a shared GPU's wall
#   time, so grid_table.py leaves it out of the GPU-second ratios (its FLOPs and steps count as usual)
#
# A run whose METHOD/RHO/SEED key is already in OUT_DIR/results.json is skipped, so a results.json
# copied into a fresh OUT_DIR (a new machine) continues the table: only the shared steps rerun.
#
# Parallel by hand: once the shared steps are done, runs with disjoint METHODS may share OUT_DIR
# (results.json is merged under a lock), e.g. two processes on one GPU.
#
# CPU smoke test (every step but score-atp, tiny; about 9 minutes on 2 busy cores; adding
# bridge-atp to METHODS adds about 5 minutes of atp scoring):
#   W=16 VAL=8 N=24 RHOS=0.5 METHODS="full bridge" MAX_STEPS=1 WARMUP_MAX_STEPS=1 BATCH_SIZE=4 \
#   GRAD_ACCUM=1 GSM8K_LIMIT=8 MATH_LIMIT=4 bench/results/grid.sh data runs/grid-smoke
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data_dir=${1:?usage: grid.sh DATA_DIR OUT_DIR}
out=${2:?usage: grid.sh DATA_DIR OUT_DIR}
W=${W:-1000}
VAL=${VAL:-200}
N=${N:-8000}
DATA_SEED=${DATA_SEED:-0}
RHOS=${RHOS:-"0.5 0.75"}
SEEDS=${SEEDS:-42}
METHODS=${METHODS:-"base full random random-close independent one-pass bridge bridge-atp bridge-global rho1 tokencleaning llm+tc"}
MODEL=${MODEL:-}
MIX=${MIX:-gsm8k+math}
SCORER=${SCORER:-bridge}
MATH_ACC_LIMIT=${MATH_ACC_LIMIT:-0}
ANSWER_LOSS=${ANSWER_LOSS:-0}
EVAL_LANES=${EVAL_LANES:-1}
GENERAL=${GENERAL:-}
CODE_ISOLATION=${CODE_ISOLATION:-bwrap}
GENERAL_LIMIT=${GENERAL_LIMIT:-}
general_limit=(); [ -n "$GENERAL_LIMIT" ] && general_limit=(--limit "$GENERAL_LIMIT")
for task in $GENERAL; do
  case "$task" in arc_challenge|hellaswag|mmlu|humaneval) ;; *) echo "grid.sh: error: GENERAL: unknown task $task" >&2; exit 2 ;; esac
done
case "$CODE_ISOLATION" in bwrap|unsafe) ;; *) echo "grid.sh: error: CODE_ISOLATION must be bwrap or unsafe" >&2; exit 2 ;; esac
case "$EVAL_LANES" in 1|2) ;; *) echo "grid.sh: error: EVAL_LANES=$EVAL_LANES: expected 1 or 2" >&2; exit 2 ;; esac
GEN_TOKENS=${GEN_TOKENS:-256}
MATH_GEN_TOKENS=${MATH_GEN_TOKENS:-512}
IMPORTANCE_OPTIONS=${IMPORTANCE_OPTIONS:-"floor=0.5 by=abs"}
PREPARE_ONLY=${PREPARE_ONLY:-0}
TRAIN_OPTIONS=${TRAIN_OPTIONS:-}
EPOCHS=${EPOCHS:-1}
MAX_STEPS=${MAX_STEPS:-}
BATCH_SIZE=${BATCH_SIZE:-16}
GRAD_ACCUM=${GRAD_ACCUM:-4}
LR=${LR:-2e-5}
WARMUP_EPOCHS=${WARMUP_EPOCHS:-1}
WARMUP_MAX_STEPS=${WARMUP_MAX_STEPS:-}
GSM8K_LIMIT=${GSM8K_LIMIT:-1319}
MATH_LIMIT=${MATH_LIMIT:-500}
ACC_LIMIT=${ACC_LIMIT:-0}
SAVE_EVERY=${SAVE_EVERY:-20}
KEEP_CHECKPOINTS=${KEEP_CHECKPOINTS:-0}
DEADLINE_S=${DEADLINE_S:-}
ATP_OPTIONS=${ATP_OPTIONS:-}
WARMUP_OPTIONS=${WARMUP_OPTIONS:-}
DEBIAS_OPTIONS=${DEBIAS_OPTIONS:-"debias=common"}
TRIM_OPTIONS=${TRIM_OPTIONS:-"--trim-tail"}
EXAMPLE_FLOOR=${EXAMPLE_FLOOR:-0.5}
REFS=${REFS:-1}
GPUS=${GPUS:-1}
PROCS_PER_GPU=${PROCS_PER_GPU:-1}
PYTHON=${PYTHON:-python3}
BRIDGE=${BRIDGE:-bridge}
read -r -a bridge_cmd <<< "$BRIDGE"
bridge() { command "${bridge_cmd[@]}" "$@"; }  # command: BRIDGE=bridge must not call this function again
export BRIDGE_NO_PROGRESS=${BRIDGE_NO_PROGRESS:-1}
if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then gpu=1; else gpu=0; fi
if [ "$gpu" = 1 ]; then
  EVAL_BATCH=${EVAL_BATCH:-32}; REF_BATCH=${REF_BATCH:-32}
else
  EVAL_BATCH=${EVAL_BATCH:-4}; REF_BATCH=${REF_BATCH:-8}
fi
EVAL_DTYPE=${EVAL_DTYPE:-float32}  # float32 even on a GPU: the 135M forward is cheap, bf16 rounds the losses
GEN_BATCH=${GEN_BATCH:-$EVAL_BATCH}
GEN_DTYPE=${GEN_DTYPE:-$EVAL_DTYPE}   # generation for the accuracy tasks
model_args=(); [ -n "$MODEL" ] && model_args=(--model "$MODEL")
case "$SCORER" in bridge|atp) ;; *) echo "grid.sh: error: SCORER must be bridge or atp, not $SCORER" >&2; exit 2 ;; esac
case "$MIX" in gsm8k|gsm8k+math) ;; *) echo "grid.sh: error: MIX must be gsm8k or gsm8k+math, not $MIX" >&2; exit 2 ;; esac
case "$REFS" in 0|1) ;; *) echo "grid.sh: error: REFS must be 0 or 1, not $REFS" >&2; exit 2 ;; esac
methods_known=" base full random random-close random-resp independent one-pass bridge bridge-atp bridge-global bridge-fill bridge-global-fill bridge-answer bridge-resp bridge-resp-answer bridge-digits importance importance-resp importance-loss-resp tilt tilt-resp stratified rho1 tokencleaning llm+tc example-importance rho-loss importance-loss-resp-trim bridge-resp-trim bridge-debiased bridge-resp-debiased "
known() {  # known NAME: a row of the list above, or full-match-ROW (the compute-matched control of a trained row)
  local name=$1
  if [[ $name == full-match-* ]]; then
    name=${name#full-match-}
    case "$name" in base|full|full-match-*) return 1 ;; esac
  fi
  case "$methods_known" in *" $name "*) return 0 ;; *) return 1 ;; esac
}
for name in $METHODS; do
  known "$name" || { echo "grid.sh: error: METHODS: unknown row $name" >&2; exit 2; }
done
for word in ${GRID_JOBS:-}; do  # SEED:METHOD:RHO, checked before any work (a malformed word once cost a GPU call)
  IFS=: read -r seed method rho extra <<< "$word"
  known "$method" || method=
  if [ -n "$extra" ] || ! [[ $seed =~ ^[0-9]+$ ]] || [ -z "$method" ] || ! [[ $rho =~ ^(0\.[0-9]*[1-9]|1)$ ]] \
     || { [[ $method == base || $method == full ]] && [ "$rho" != 1 ]; }; then
    echo "grid.sh: error: GRID_JOBS: $word is not SEED:METHOD:RHO (a whole seed, a known row, RHO in (0, 1]; base and full: 1)" >&2
    exit 2
  fi
done
# the workers' GPUs: GPU g is the g-th device CUDA_VISIBLE_DEVICES names, else g
IFS=, read -r -a devices <<< "${CUDA_VISIBLE_DEVICES:-$(seq -s, 0 $(( GPUS - 1 )))}"
if [ "${#devices[@]}" -lt "$GPUS" ]; then
  echo "grid.sh: error: GPUS=$GPUS but CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES names ${#devices[@]}" >&2; exit 2
fi
SCORE_DTYPE=${SCORE_DTYPE:-auto}
gsm_test=$data_dir/gsm8k/test.jsonl
math_test=$data_dir/math/math500_test.jsonl
train_files=("$data_dir/gsm8k/train.jsonl"); [ "$MIX" = gsm8k+math ] && train_files+=("$data_dir/math/hendrycks_math_train.jsonl")
general_files=()
for task in $GENERAL; do
  case "$task" in
    arc_challenge) general_files+=("$data_dir/arc/ARC-Challenge-Test.jsonl") ;;
    hellaswag) general_files+=("$data_dir/hellaswag/hellaswag_val_full.txt.bz2") ;;
    mmlu) general_files+=("$data_dir/mmlu/test") ;;
    humaneval) general_files+=("$data_dir/humaneval/HumanEval.jsonl.gz") ;;
  esac
done
for f in "${train_files[@]}" "$gsm_test" "$math_test" "${general_files[@]}"; do
  [ -e "$f" ] || { echo "grid.sh: error: $f: no such file" >&2; exit 2; }
done
mkdir -p "$out/data" "$out/done"
start=$(date +%s)
# one deadline for this script and the per-GPU scripts it starts (they inherit DEADLINE_AT)
if [ -n "$DEADLINE_S" ] && [ -z "${DEADLINE_AT:-}" ]; then export DEADLINE_AT=$(( start + DEADLINE_S )); fi

# step NAME CMD...: run CMD unless OUT/done/NAME exists; then mark it done and keep its seconds
step() {
  local name=$1; shift
  local mark="$out/done/${name//\//_}"
  [ -f "$mark" ] && return 0
  if [ -n "${DEADLINE_AT:-}" ] && [ "$(date +%s)" -ge "$DEADLINE_AT" ]; then
    echo "grid.sh: DEADLINE_S=$DEADLINE_S reached before $name: rerun the same command to continue" >&2
    exit 75
  fi
  echo "== $name" >&2
  local t0=$SECONDS
  "$@"
  echo $(( SECONDS - t0 )) > "$mark.tmp" && mv "$mark.tmp" "$mark"
}
# score continues only from a committed partial output (and refuses --resume without one)
resumable() { if [ -f "$1.partial" ] && [ -f "$1.partial.idx" ]; then echo --resume; fi; }

# 0. the data: one prompt/response JSONL mix, shuffled with DATA_SEED, disjoint slices
make_data() {
  "$PYTHON" - "$data_dir" "$out/data" "$W" "$VAL" "$N" "$DATA_SEED" "$MIX" <<'EOF'
import json, os, random, sys
from pathlib import Path
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
w, val, seed = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[6])
sources = [("gsm8k", src / "gsm8k/train.jsonl", "question", "answer")]
if sys.argv[7] == "gsm8k+math":
    sources.append(("math", src / "math/hendrycks_math_train.jsonl", "problem", "solution"))
pool = []
for name, path, p, r in sources:
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            rec = json.loads(line)
            if not isinstance(rec.get(p), str) or not isinstance(rec.get(r), str):
                sys.exit(f"grid.sh: error: {path}, line {i + 1}: expected string fields {p!r} and {r!r}")
            pool.append({"id": f"{name}-{i}", "prompt": rec[p], "response": rec[r]})
n = len(pool) - w - val if sys.argv[5] == "rest" else int(sys.argv[5])
if w + val + n > len(pool):
    sys.exit(f"grid.sh: error: W + VAL + N = {w + val + n} is more than the {len(pool)} train examples")
random.Random(seed).shuffle(pool)
cuts = {"warm": pool[:w], "val": pool[w:w + val], "train": pool[w + val:w + val + n]}
for name, rows in cuts.items():
    tmp = dst / f".{name}.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    os.replace(tmp, dst / f"{name}.jsonl")
mix = {k: sum(r["id"].startswith("gsm8k") for r in v) for k, v in cuts.items()}
print(json.dumps({"seed": seed, "warm": w, "val": val, "train": n, "gsm8k_share": mix}))
EOF
}
data_key="W=$W VAL=$VAL N=$N DATA_SEED=$DATA_SEED"
[ "$MIX" = gsm8k+math ] || data_key+=" MIX=$MIX"
if [ -f "$out/data/key" ] && [ "$(cat "$out/data/key")" != "$data_key" ]; then
  echo "grid.sh: error: $out was made with $(cat "$out/data/key"), not $data_key (use another OUT_DIR)" >&2
  exit 2
fi
step data make_data
# written once and atomically: the workers of a multi-process grid all pass the check above at their start, and
# one that read the key while another rewrote it saw it empty and stopped (2026-11-28, one worker of seven)
if [ ! -f "$out/data/key" ]; then echo "$data_key" > "$out/data/key.$$" && mv "$out/data/key.$$" "$out/data/key"; fi

recorded() {  # recorded KEY: is METHOD/RHO/SEED in results.json already, with every GENERAL task? (an entry
  # recorded from a lost machine's state without some task is redone, and its new entry replaces it)
  [ -f "$out/results.json" ] && "$PYTHON" -c '
import json, sys
entry = json.load(open(sys.argv[1])).get("runs", {}).get(sys.argv[2])
sys.exit(entry is None or any(t not in entry.get("general", {}) for t in sys.argv[3].split()))' \
    "$out/results.json" "$1" "$GENERAL"
}

# 1. the jobs SEED:METHOD:RHO, in priority order (GRID_JOBS as given, else SEEDS x METHODS x RHOS); recorded ones out
if [ -z "${GRID_JOBS:-}" ]; then
  GRID_JOBS=""
  for seed in $SEEDS; do
    for method in $METHODS; do
      case "$method" in base|full) rhos=1 ;; *) rhos=$RHOS ;; esac
      for rho in $rhos; do
        [ "$method" = base ] && [ "$seed" != "${SEEDS%% *}" ] && continue  # base: once
        key="$method/$rho/$seed"; [ "$method" = base ] && key="base/1/-"
        recorded "$key" && continue  # in results.json already (e.g. from an earlier machine)
        GRID_JOBS+="$seed:$method:$rho "
      done
    done
  done
fi
names=" $METHODS "; for word in $GRID_JOBS; do name=${word#*:}; names+="${name%:*} "; done  # every row asked for
asks() { case "$names" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }  # asks NAME: is NAME a row here?
asks_like() { [[ $names =~ $1 ]]; }  # asks_like REGEX: a row name matching REGEX

# 2. shared steps (the warm-up, the scoring passes, the reference passes) run when a row first needs them, on that
# row's GPU, once: the first worker to need one makes it while the others wait for it (so the untrained model's
# evaluation, which needs none, starts at once). With REFS=1 every row selects from the stream that holds the
# reference losses.
atp_opts=(); for o in $ATP_OPTIONS; do atp_opts+=(--scorer-option "$o"); done
main_scorer=(); [ "$SCORER" = atp ] && main_scorer=(--scorer atp "${atp_opts[@]}")
debias_opts=(); for o in $DEBIAS_OPTIONS; do debias_opts+=(--scorer-option "$o"); done
shared() {  # shared NAME: make the shared pass NAME (and what it reads) unless done; one worker at a time
  local name=$1 fd
  [ -f "$out/done/$name" ] && return 0
  case "$name" in  # what it reads
    score|score-atp|score-debiased) shared warmup ;;
    ref-base) shared score ;;
    ref-warmup) shared ref-base ;;
  esac
  exec {fd}> "$out/done/.$name.lock"; flock "$fd"
  case "$name" in
    warmup)
      local warm_steps=(--epochs "$WARMUP_EPOCHS"); [ -n "$WARMUP_MAX_STEPS" ] && warm_steps+=(--max-steps "$WARMUP_MAX_STEPS")
      step warmup bridge warmup "$out/data/warm.jsonl" --val "$out/data/val.jsonl" -o "$out/warmup" \
        "${warm_steps[@]}" --batch-size 8 "${model_args[@]}" $WARMUP_OPTIONS ;;
    score)
      step score bridge score "$out/data/train.jsonl" --from "$out/warmup" --dtype "$SCORE_DTYPE" "${main_scorer[@]}" \
        -o "$out/scores.bridge" $(resumable "$out/scores.bridge") ;;
    ref-base)
      step ref-base bridge reference "$out/scores.bridge" --batch-size "$REF_BATCH" --dtype "$EVAL_DTYPE" \
        -o "$out/refs-base.bridge" ;;
    ref-warmup)
      step ref-warmup bridge reference "$out/refs-base.bridge" --model "$out/warmup" --batch-size "$REF_BATCH" \
        --dtype "$EVAL_DTYPE" -o "$out/refs.bridge" ;;
    score-atp)
      step score-atp bridge score "$out/data/train.jsonl" --from "$out/warmup" --scorer atp "${atp_opts[@]}" \
        --dtype "$SCORE_DTYPE" -o "$out/scores-atp.bridge" $(resumable "$out/scores-atp.bridge") ;;
    score-debiased)  # the main scorer with the common direction removed from a_j
      step score-debiased bridge score "$out/data/train.jsonl" --from "$out/warmup" --dtype "$SCORE_DTYPE" \
        "${main_scorer[@]}" "${debias_opts[@]}" -o "$out/scores-debiased.bridge" \
        $(resumable "$out/scores-debiased.bridge") ;;
  esac
  exec {fd}>&-
}
selectable=score; [ "$REFS" = 1 ] && selectable=ref-warmup  # the shared pass whose stream the rows select from
# input_of METHOD: the stream METHOD selects from, made first if it is not there
input_of() {  # (in a command substitution: the passes' own output goes to stderr, a deadline's exit 75 passes on)
  case "$1" in
    rho1|tokencleaning|llm+tc) shared ref-warmup >&2; echo "$out/refs.bridge" ;;
    rho-loss) if [ "$REFS" = 1 ]; then echo "$out/refs.bridge"; else shared ref-base >&2; echo "$out/refs-base.bridge"; fi ;;
    bridge-atp) shared score-atp >&2; echo "$out/scores-atp.bridge" ;;
    bridge-debiased|bridge-resp-debiased) shared score-debiased >&2; echo "$out/scores-debiased.bridge" ;;
    *) shared "$selectable" >&2
       if [ "$REFS" = 1 ]; then echo "$out/refs.bridge"; else echo "$out/scores.bridge"; fi ;;
  esac
}

# losses NAME FILE LIMIT MODEL DIR: the held-out loss of FILE into DIR/heldout-NAME.json, and with ANSWER_LOSS=1
# the answer-span loss into DIR/answer-NAME.json too, from one model load
losses() {
  local name=$1 file=$2 limit=$3 model=$4 d=$5
  if [ "$ANSWER_LOSS" = 1 ]; then
    bridge eval "$model" --task heldout-loss,answer-loss --data "heldout-loss=$file" --data "answer-loss=$file" \
      --limit "$limit" --batch-size "$EVAL_BATCH" --dtype "$EVAL_DTYPE" --resume -o "$out/$d/losses-$name" &&
      mv "$out/$d/losses-$name/eval-answer-loss.json" "$out/$d/answer-$name.json" &&
      mv "$out/$d/losses-$name/eval-heldout-loss.json" "$out/$d/heldout-$name.json"
  else
    bridge eval "$model" --task heldout-loss --data "$file" --limit "$limit" \
      --batch-size "$EVAL_BATCH" --dtype "$EVAL_DTYPE" --resume -o "$out/$d/heldout-$name.json"
  fi
}

# eval_gsm8k and eval_math: the accuracy first, then the losses (the same commands in either order, so the same
# results): a machine lost inside a row's evaluation lanes leaves the target's accuracy in the state archive
# sooner (since 2026-11-29: two rows recorded partial that session had their losses and no accuracy)
eval_gsm8k() {  # eval_gsm8k MODEL DIR: GSM8K test's accuracy (when ACC_LIMIT > 0) and losses
  local model=$1 d=$2
  if [ "$ACC_LIMIT" -gt 0 ]; then
    step "$d/eval-acc" bridge eval "$model" --task gsm8k --data "$gsm_test" --limit "$ACC_LIMIT" \
      --max-new-tokens "$GEN_TOKENS" --batch-size "$GEN_BATCH" --dtype "$GEN_DTYPE" --resume -o "$out/$d/acc-gsm8k.json"
  fi
  step "$d/eval-gsm8k" losses gsm8k "$gsm_test" "$GSM8K_LIMIT" "$model" "$d"
}

eval_math() {  # eval_math MODEL DIR: MATH-500's accuracy (when MATH_ACC_LIMIT > 0) and losses
  local model=$1 d=$2
  if [ "$MATH_ACC_LIMIT" -gt 0 ]; then
    step "$d/eval-acc-math" bridge eval "$model" --task math --data "$math_test" --limit "$MATH_ACC_LIMIT" \
      --max-new-tokens "$MATH_GEN_TOKENS" --batch-size "$GEN_BATCH" --dtype "$GEN_DTYPE" --resume \
      -o "$out/$d/acc-math500.json"
  fi
  step "$d/eval-math500" losses math500 "$math_test" "$MATH_LIMIT" "$model" "$d"
}

# eval_general MODEL DIR: the log-likelihood tasks of GENERAL into DIR/general/eval-TASK.json, one process (and
# model load) a task, side by side unless EVAL_LANES=1. Each task is scored on its own either way (the same
# results); until 2026-11-30 the three ran in one process, the longest lane of a pair of rows (640-675 s, where
# the GSM8K and MATH-500 lanes end by about 500 s)
eval_general() {
  local model=$1 d=$2 t pids=() status=0 p
  for t in $GENERAL; do
    [ "$t" = humaneval ] && continue
    mkdir -p "$out/$d/general"
    if [ "$EVAL_LANES" = 1 ]; then general_task "$t" "$model" "$d" || return
    else general_task "$t" "$model" "$d" & pids+=($!); fi
  done
  for p in "${pids[@]}"; do wait "$p" || { [ "$status" != 0 ] || status=$?; }; done
  return "$status"
}

general_task() {  # general_task TASK MODEL DIR: one log-likelihood task of GENERAL
  local t=$1 model=$2 d=$3
  step "$d/eval-$t" bridge eval "$model" --task "$t" --data-dir "$data_dir" --batch-size "$EVAL_BATCH" \
    --dtype "$EVAL_DTYPE" "${general_limit[@]}" --resume -o "$out/$d/general"
}

eval_code() {  # eval_code MODEL DIR: HumanEval pass@1 (greedy, sandboxed) into DIR/general/eval-humaneval.json
  local model=$1 d=$2
  case " $GENERAL " in *" humaneval "*) ;; *) return 0 ;; esac
  mkdir -p "$out/$d/general"
  local isolation=(--allow-code-execution); [ "$CODE_ISOLATION" = unsafe ] && isolation+=(--unsafe-code-execution)
  step "$d/eval-humaneval" bridge eval "$model" --task humaneval --data "$data_dir/humaneval/HumanEval.jsonl.gz" \
    --max-new-tokens 512 --batch-size "$GEN_BATCH" --dtype "$GEN_DTYPE" "${isolation[@]}" "${general_limit[@]}" --resume \
    -o "$out/$d/general/eval-humaneval.json"
}

evaluate() {  # evaluate MODEL DIR: held-out losses, accuracy and the GENERAL tasks into DIR
  local model=$1 d=$2
  local lanes=(eval_gsm8k eval_math eval_general eval_code)
  if [ "$EVAL_LANES" = 1 ]; then
    local lane; for lane in "${lanes[@]}"; do "$lane" "$model" "$d"; done
    return
  fi
  # one process per lane on the row's device at once; every lane is waited for (none outlives the row, at
  # DEADLINE_S too), then the first failure is passed on. The lanes' wall time (grid_record.py's seconds.eval),
  # summed over the calls that ran them: a row stopped at DEADLINE_S goes on in the next call, so $part keeps
  # the seconds so far; eval marks without it (a row imported from another machine) give no wall time, and a
  # call killed at HARD_S adds none
  local t0=$SECONDS before=0 known=1 pids=() status=0 p lane
  local wall="$out/done/${d//\//_}_eval-wall" part="$out/$d/eval-wall.part"
  if [ -f "$part" ]; then before=$(cat "$part")
  elif compgen -G "$out/done/${d//\//_}_eval-*" > /dev/null; then known=0; fi
  for lane in "${lanes[@]}"; do ( "$lane" "$model" "$d" ) & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || { [ "$status" != 0 ] || status=$?; }; done
  if [ "$known" = 1 ]; then echo $(( before + SECONDS - t0 )) > "$part.tmp" && mv "$part.tmp" "$part"; fi
  if [ "$status" != 0 ]; then exit "$status"; fi
  if [ "$known" = 1 ]; then cp "$part" "$wall.tmp" && mv "$wall.tmp" "$wall"; fi
}

record() {  # record METHOD RHO SEED RUN_DIR SEL_DIR [MAX_STEPS [BASE_SEL]]: merge one entry into results.json
  "$PYTHON" "$here/grid_record.py" "$out" "$1" "$2" "$3" "$4" "$5" \
    "epochs=$EPOCHS max_steps=${6:-$MAX_STEPS} batch_size=$BATCH_SIZE grad_accum=$GRAD_ACCUM lr=$LR model=${MODEL:-default} mix=$MIX scorer=$SCORER importance_options=${IMPORTANCE_OPTIONS// /,}" \
    "${7:-}"
}

# prepare METHOD RHO SEED: METHOD's compacted rows (select, close, inspect, compact; each step once); sets sel (the
# selection's folder under OUT) and base_sel (for a -trim row: the folder of the selection its rows were cut from)
prepare() {
  local method=$1 rho=$2 seed=$3
  base_sel=""
  if [[ $method == *-trim ]]; then  # the selection of METHOD, its rows cut after their last supervised token
    prepare "${method%-trim}" "$rho" "$seed"
    local from=$sel
    sel="sel/$method/rho$rho"; [[ $from == */seed* ]] && sel+="/seed$seed"
    mkdir -p "$out/$sel"
    local fd; exec {fd}> "$out/$sel/.prepare.lock"; flock "$fd"
    step "$sel/inspect" cp "$out/$from/inspect.json" "$out/$sel/inspect.json"
    step "$sel/compact" bridge compact "$(final_of "$from")" $TRIM_OPTIONS -o "$out/$sel/train.jsonl"
    exec {fd}>&-
    base_sel=$from
    return
  fi
  sel="sel/$method/rho$rho"
  case "$method" in  # the draw follows the seed
    random|random-close|random-resp|importance|importance-resp|importance-loss-resp|tilt|tilt-resp|example-importance)
      sel="sel/$method/rho$rho/seed$seed" ;;
  esac
  mkdir -p "$out/$sel"
  # one worker at a time makes a selection (a control full-match-X makes X's rows, maybe while X's own job does)
  local fd; exec {fd}> "$out/$sel/.prepare.lock"; flock "$fd"
  local input close=0 close_args=() imp_opts=() o
  input=$(input_of "$method")
  local args=(--method "$method" --rho-p "$rho" --rho-r "$rho")
  for o in $IMPORTANCE_OPTIONS; do imp_opts+=(--option "$o"); done
  # importance-loss-resp tilts by=loss: IMPORTANCE_OPTIONS' own by= is left out (select refuses a key given twice)
  local loss_opts=(); for o in $IMPORTANCE_OPTIONS; do [[ $o == by=* ]] || loss_opts+=(--option "$o"); done
  case "$method" in
    full) args=(--method random --rho-p 1 --rho-r 1) ;;
    random) args+=(--option "seed=$seed") ;;
    random-close) args=(--method random --rho-p "$rho" --rho-r "$rho" --option "seed=$seed"); close=1 ;;
    random-resp) args=(--method random --rho-p 1 --rho-r "$rho" --option "seed=$seed") ;;
    bridge-resp) args=(--method bridge --rho-p 1 --rho-r "$rho"); close=1 ;;
    bridge-resp-answer) args=(--method bridge --rho-p 1 --rho-r "$rho" --protect-response answer); close=1 ;;
    bridge-digits) args=(--method bridge --rho-p "$rho" --rho-r "$rho" --protect-prompt digits); close=1 ;;
    bridge|one-pass|independent) close=1 ;;
    bridge-atp|bridge-debiased) args=(--method bridge --rho-p "$rho" --rho-r "$rho"); close=1 ;;
    bridge-resp-debiased) args=(--method bridge --rho-p 1 --rho-r "$rho"); close=1 ;;
    bridge-global) args=(--method bridge --rho-p "$rho" --rho-r "$rho" --budget global); close=1 ;;
    bridge-fill) args=(--method bridge --rho-p "$rho" --rho-r "$rho"); close=1 close_args=(--fill) ;;
    bridge-global-fill) args=(--method bridge --rho-p "$rho" --rho-r "$rho" --budget global); close=1 close_args=(--fill) ;;
    bridge-answer) args=(--method bridge --rho-p "$rho" --rho-r "$rho" --protect-response answer); close=1 ;;
    importance) args=(--method importance --rho-p "$rho" --rho-r "$rho" "${imp_opts[@]}" --option "seed=$seed") ;;
    tilt) args=(--method importance --rho-p "$rho" --rho-r "$rho" "${imp_opts[@]}" --option weights=none
                --option "seed=$seed") ;;
    importance-resp) args=(--method importance --rho-p 1 --rho-r "$rho" "${imp_opts[@]}" --option "seed=$seed") ;;
    importance-loss-resp) args=(--method importance --rho-p 1 --rho-r "$rho" "${loss_opts[@]}" --option by=loss
                                --option "seed=$seed") ;;
    tilt-resp) args=(--method importance --rho-p 1 --rho-r "$rho" "${imp_opts[@]}" --option weights=none
                     --option "seed=$seed") ;;
    stratified) args=(--method stratified --rho-p "$rho" --rho-r "$rho") ;;
    example-importance) args=(--method example-importance --rho-p 1 --rho-r "$rho" --option by=loss
                              --option "floor=$EXAMPLE_FLOOR" --option "seed=$seed") ;;
    rho-loss) args=(--method rho-loss --rho-p 1 --rho-r "$rho") ;;
  esac
  step "$sel/select" bridge select "$input" "${args[@]}" -o "$out/$sel/selected.bridge"
  if [ "$close" = 1 ]; then
    step "$sel/close" bridge close --segmenter math "${close_args[@]}" "$out/$sel/selected.bridge" \
      -o "$out/$sel/closed.bridge"
  fi
  local final; final=$(final_of "$sel")
  step "$sel/inspect" sh -c '"$@" > "$0.tmp" && mv "$0.tmp" "$0"' "$out/$sel/inspect.json" \
    "${bridge_cmd[@]}" inspect --json "$final"
  step "$sel/compact" bridge compact "$final" -o "$out/$sel/train.jsonl"
  if [ "$method" = full ]; then  # rho 1 keeps everything: check the rows are standard SFT
    step "$sel/check" "$PYTHON" "$here/grid_check_full.py" "$final" "$out/$sel/train.jsonl"
  fi
  exec {fd}>&-
}
final_of() {  # final_of SEL: the selection's last stream (closed when the row closes, else selected)
  if [ -f "$out/$1/closed.bridge" ]; then echo "$out/$1/closed.bridge"; else echo "$out/$1/selected.bridge"; fi
}

# 3. more than one worker: each takes the next job no worker has claimed yet, in list order
workers=$(( GPUS * PROCS_PER_GPU ))
if [ "$workers" -gt 1 ]; then
  mkdir -p "$out/claims"
  pids=()
  for ((w = 0; w < workers; w++)); do
    g=$(( w % GPUS )) log="$out/gpu$(( w % GPUS )).log"
    [ "$PROCS_PER_GPU" -gt 1 ] && log="$out/gpu$g-$(( w / GPUS )).log"
    # GRID_GPU_PROCS: how many workers share this worker's GPU (grid_record.py keeps it in each row's cost: the
    # seconds of a row that shared its GPU are not GPU-seconds of its own). Named before PROCS_PER_GPU=1: bash
    # expands a command's assignments in order, so after it $PROCS_PER_GPU is 1 (until 2026-11-29 every worker
    # was given 1, and rows recorded on the machine lacked cost.gpu_processes)
    CUDA_VISIBLE_DEVICES=${devices[$g]} GRID_JOBS="$GRID_JOBS" GRID_CLAIM=1 GRID_GPU_PROCS=$PROCS_PER_GPU GPUS=1 PROCS_PER_GPU=1 \
      "$0" "$data_dir" "$out" > "$log" 2>&1 &
    pids+=($!)
  done
  status=0
  for p in "${pids[@]}"; do wait "$p" || status=$?; done
  [ "$status" = 0 ] || { tail -n 5 "$out"/gpu*.log >&2; echo "grid.sh: a worker's share failed (exit $status): see $out/gpu*.log; rerun to continue" >&2; exit "$status"; }
  "$PYTHON" "$here/grid_table.py" "$out/results.json" --plot "$out/finding3.png" || true
  echo "grid.sh: $(( $(date +%s) - start )) s on $GPUS GPUs x $PROCS_PER_GPU processes; results in $out/results.json" >&2
  exit 0
fi
# claim KEY: with GRID_CLAIM=1 (a worker of a multi-worker grid), take the job unless a live worker holds it; a
# claim is a folder (mkdir is atomic) holding its worker's pid, so a claim of a worker that died is taken over
claim() {
  [ "${GRID_CLAIM:-0}" = 1 ] || return 0
  local c="$out/claims/${1//\//_}"
  if mkdir "$c" 2> /dev/null; then echo $$ > "$c/pid"; return 0; fi
  local owner; owner=$(cat "$c/pid" 2> /dev/null) || return 1
  [ "$owner" != $$ ] && kill -0 "$owner" 2> /dev/null && return 1
  echo $$ > "$c/pid"
}
for job in $GRID_JOBS; do
  IFS=: read -r seed method rho <<< "$job"
  {
      run="runs/$method/rho$rho/seed$seed"
      [ "$method" = base ] && run="runs/base"
      key="$method/$rho/$seed"; [ "$method" = base ] && key="base/1/-"
      if [ -f "$out/done/${run//\//_}_recorded" ] || recorded "$key"; then
        echo "== $method rho=$rho seed=$seed: recorded" >&2; continue
      fi
      claim "$key" || { echo "== $method rho=$rho seed=$seed: another worker has it" >&2; continue; }
      mkdir -p "$out/$run"
      if [ "$method" = base ]; then
        [ "$PREPARE_ONLY" = 1 ] && continue
        evaluate "${MODEL:-smollm2}" "$run"
        record base 1 - "$run" ""
        touch "$out/done/${run//\//_}_recorded"
        continue
      fi
      schedule=(--epochs "$EPOCHS"); [ -n "$MAX_STEPS" ] && schedule=(--max-steps "$MAX_STEPS")
      row_steps=$MAX_STEPS
      if [[ $method == full-match-* ]]; then  # full SFT stopped where its training FLOPs reach the row's
        prepare "${method#full-match-}" "$rho" "$seed"
        matched=$sel
        prepare full 1 "$seed"
        row_steps=$("$PYTHON" "$here/grid_cost.py" match "$out/$sel/train.jsonl" "$out/$matched/train.jsonl" \
          "$out/warmup/checkpoint/config.json" "$EPOCHS" $(( BATCH_SIZE * GRAD_ACCUM )))
        schedule=(--epochs "$EPOCHS" --max-steps "$row_steps")
        echo "== $method: full SFT for $row_steps steps (the training FLOPs of ${method#full-match-})" >&2
      else
        prepare "$method" "$rho" "$seed"
      fi
      [ "$PREPARE_ONLY" = 1 ] && continue  # the selection and its rows only (carried to a later machine)
      step "$run/train" bridge train "$out/$sel/train.jsonl" -o "$out/$run/model" "${schedule[@]}" \
        --batch-size "$BATCH_SIZE" --grad-accum "$GRAD_ACCUM" --lr "$LR" --seed "$seed" \
        --save-every "$SAVE_EVERY" --resume $TRAIN_OPTIONS
      evaluate "$out/$run/model" "$run"
      record "$method" "$rho" "$seed" "$run" "$sel" "$row_steps" "$base_sel"
      [ "$KEEP_CHECKPOINTS" = 1 ] || rm -rf "$out/$run/model/checkpoints"  # the final model stays
      touch "$out/done/${run//\//_}_recorded"
  } < /dev/null
done
echo "grid.sh: $(( $(date +%s) - start )) s; results in $out/results.json" >&2
"$PYTHON" "$here/grid_table.py" "$out/results.json" --plot "$out/finding3.png" || true
