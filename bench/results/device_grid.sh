#!/usr/bin/env bash
# Run the grid on a lent GPU machine whose commands are capped at 10 minutes and whose tree travels in
# pieces of at most 64 MiB. Phases (several may share one device command, joined with &&):
#   device_grid.sh setup            carry .whl .carry/data: wheels to /tmp/site, data to /tmp/data/{gsm8k,math}
#   device_grid.sh stash DIR...     carry DIR (a piece from bench/results/carry_file.py split): kept in /tmp/stash
#   device_grid.sh assemble         rebuild every file whose pieces are all stashed (sha256 checked)
#   device_grid.sh export           the grid's marks, results.json and compacted rows to $OUT/grid-carry.tar.zst.NN
#   device_grid.sh import DIR       a carried export unpacked into the grid folder: its shared steps and rows are
#                                   not redone (the model file must be at the same path)
#   device_grid.sh grid [PRESET]    (re)run bench/results/grid.sh until DEADLINE_S (rerun while it says exit 75),
#                                   with the settings of bench/results/presets/PRESET.env when given
# The grid's settings come from the preset and the environment (METHODS, SEEDS, PROCS_PER_GPU, ...; see
# grid.sh); a variable set in the environment wins over the preset's. $SEED_RESULTS (a results.json carried
# along) seeds /tmp/grid/results.json on a fresh machine, so
# the rows recorded on an earlier machine are skipped. After the grid phase, results.json, the table, the
# workers' log tails and grid-state.tar.gz (every small result file, rows not yet recorded included) are
# copied to $OUT. A row whose evaluations ran but which was not recorded (the lent time ended first) is
# recorded here from that archive: tar -xzf grid-state.tar.gz -C DIR, then
#   python3 bench/results/grid_record.py DIR METHOD RHO SEED runs/METHOD/rhoRHO/seedSEED sel/... "SETTINGS"
# (what is missing stays out of its entry; grid.sh's record() shows the SETTINGS words).
#
# The 0.5B grid of docs/results.md (the model travels in ten pieces; split sizes them to fit beside the tree):
#   python3 bench/results/carry_file.py split qwen.gguf --name qwen --target /tmp/models/qwen.gguf
#   call 1:    carry .whl .carry/data .carry/qwen-10  bash bench/results/device_grid.sh setup && bash ... stash .carry/qwen-10
#   calls 2-10: carry .carry/qwen-0K                 bash bench/results/device_grid.sh stash .carry/qwen-0K
#   then:                                            bash bench/results/device_grid.sh assemble && bash ... grid qwen05
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export PYTHONPATH=/tmp/site:$root/src PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
phase=${1:?usage: device_grid.sh setup|stash DIR...|assemble|export|import DIR|grid [PRESET]}
shift
case "$phase" in
  setup)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 \
      | grep -v WARNING | tail -2
    mkdir -p /tmp/data && cp -r .carry/data/. /tmp/data/
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
    python3 -m bridgecli --version
    for cmd in warmup score select close compact train eval reference inspect; do  # every import path, before any work
      python3 -m bridgecli "$cmd" --help > /dev/null || { echo "device_grid.sh: bridge $cmd --help failed" >&2; exit 1; }
    done
    exit 0 ;;
  stash) python3 bench/results/carry_file.py stash "$@"; exit $? ;;
  export)  # the grid's shared marks, results and compacted rows, for a later machine ($OUT/grid-carry.tar.zst*)
    cd "${GRID_OUT:-/tmp/grid}" || exit 1
    find data/key done results.json sel -name 'train.jsonl' -o -name 'train.jsonl.bridge.json' -o -name 'inspect.json' \
      -o -path 'done/*' -o -name key -o -name results.json 2>/dev/null \
      | grep -v -E '^done/runs_.*[^d]$|^done/runs_.*[^_]recorde$' | grep -v -E '^done/runs_' | sort > /tmp/export.list
    ls done | grep -E '^runs_.*_recorded$' | sed 's|^|done/|' >> /tmp/export.list  # a run's marks only once recorded
    tar -cf - -T /tmp/export.list | python3 -c "import sys, zstandard; zstandard.ZstdCompressor(level=19, threads=-1).copy_stream(sys.stdin.buffer, sys.stdout.buffer)" \
      | split -b 15m -d - "${OUT:-/tmp}/grid-carry.tar.zst."
    ls -l "${OUT:-/tmp}"/grid-carry.tar.zst.*; exit 0 ;;
  import)  # import DIR: the export's pieces, unpacked into the grid folder
    mkdir -p "${GRID_OUT:-/tmp/grid}"
    cat "$1"/grid-carry.tar.zst.* | python3 -c "import sys, zstandard; zstandard.ZstdDecompressor().copy_stream(sys.stdin.buffer, sys.stdout.buffer)" \
      | tar -xf - -C "${GRID_OUT:-/tmp/grid}" && echo "imported: $(ls "${GRID_OUT:-/tmp/grid}"/done | wc -l) marks"
    exit 0 ;;
  assemble) python3 bench/results/carry_file.py assemble; exit $? ;;
  grid) ;;
  *) echo "usage: device_grid.sh setup|stash DIR...|assemble|grid [PRESET]" >&2; exit 2 ;;
esac
if [ -n "${1:-}" ]; then  # the preset's settings; a variable given in the environment wins over the preset's
  given=$(export -p)
  set -a
  # shellcheck disable=SC1090
  source "bench/results/presets/$1.env"
  set +a
  eval "$given" 2> /dev/null
fi
grid_out=${GRID_OUT:-/tmp/grid}
mkdir -p "$grid_out"
if [ -n "${SEED_RESULTS:-}" ] && [ ! -f "$grid_out/results.json" ]; then cp "$SEED_RESULTS" "$grid_out/results.json"; fi
BRIDGE="python3 -m bridgecli" PYTHON=python3 DEADLINE_S=${DEADLINE_S:-540} \
  timeout "${HARD_S:-580}" bash bench/results/grid.sh /tmp/data "$grid_out"
rc=$?
if [ -n "${OUT:-}" ]; then
  cp "$grid_out/results.json" "$OUT/" 2>/dev/null
  python3 bench/results/grid_table.py "$grid_out/results.json" --plot "$OUT/finding3.png" > "$OUT/table.md" 2>/dev/null
  tail -n 40 "$grid_out"/gpu*.log > "$OUT/workers.log" 2>/dev/null
  for d in "$grid_out"/done; do ls -l "$d" > "$OUT/done.txt" 2>/dev/null; done
  # every small result file, also of rows not recorded yet (an evaluation finished before the call or the lent
  # time ended): with it, grid_record.py records here what a lost machine had measured
  (cd "$grid_out" && find done runs sel -type f \( -path 'done/*' -o -name '*.json' -o -name metrics.jsonl \) \
     -not -path '*/checkpoints/*' -not -path '*/losses-*' -not -name 'tokenizer*' -size -20M 2>/dev/null | tar -czf "$OUT/grid-state.tar.gz" -T -)
fi
echo "device_grid.sh: grid exit $rc (75: rerun to continue)"
exit 0
