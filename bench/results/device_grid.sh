#!/usr/bin/env bash
# Run part of the grid on a lent GPU machine whose commands are capped at 10 minutes and whose tree
# travels in pieces of at most 64 MiB (the default GGUF goes in two halves, see
# bench/diagnostics/device_stash.sh). Phases, one device command each, back to back:
#   device_grid.sh setup1     carry .carry/p1 .whl         first half of the GGUF; wheels to /tmp/site
#   device_grid.sh setup2     carry .carry/p2 .carry/data .carry/data2
#                             second half; /tmp/data/{gsm8k,math}; seeds /tmp/grid/results.json from
#                             $SEED_RESULTS (the table so far), then runs the grid like `grid`
#   device_grid.sh grid       (re)run the grid until DEADLINE_S; rerun while it exits 75
# The grid's settings come from the environment (METHODS, RHOS, SEEDS, PROCS_PER_GPU, ... see
# grid.sh); results.json and the logs are copied to $OUT after every phase.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export PYTHONPATH=/tmp/site:$root/src PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
case "$1" in
  setup1)
    bash bench/diagnostics/device_stash.sh stash .carry/p1
    source bench/score/device_setup.sh
    exit 0 ;;
  setup2)
    bash bench/diagnostics/device_stash.sh stash .carry/p2
    bash bench/diagnostics/device_stash.sh assemble
    mkdir -p /tmp/data/gsm8k /tmp/data/math /tmp/grid
    cp .carry/data/*.jsonl /tmp/data/gsm8k/ && cp .carry/data2/*.jsonl /tmp/data/math/
    if [ -n "${SEED_RESULTS:-}" ] && [ ! -f /tmp/grid/results.json ]; then cp "$SEED_RESULTS" /tmp/grid/results.json; fi ;;
  grid) ;;
  *) echo "usage: device_grid.sh setup1|setup2|grid" >&2; exit 2 ;;
esac
BRIDGE="python3 -m bridgecli" PYTHON=python3 DEADLINE_S=${DEADLINE_S:-540} \
  timeout "${HARD_S:-575}" bash bench/results/grid.sh /tmp/data /tmp/grid
rc=$?
if [ -n "${OUT:-}" ]; then
  cp /tmp/grid/results.json "$OUT/" 2>/dev/null
  tail -n 30 /tmp/grid/gpu*.log > "$OUT/workers.log" 2>/dev/null
  ls /tmp/grid/done > "$OUT/done.txt" 2>/dev/null
fi
echo "device_grid.sh: grid exit $rc (75: rerun to continue)"
exit 0
