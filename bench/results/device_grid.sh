#!/usr/bin/env bash
# Run the grid on a lent GPU machine whose commands are capped at 10 minutes and whose tree travels in
# pieces of at most 64 MiB. Phases (several may share one device command, joined with &&):
#   device_grid.sh setup            carry .whl .carry/data [.carry/deb]: wheels to /tmp/site, data to /tmp/data/
#                                   (gsm8k, math, and arc, hellaswag, mmlu, humaneval for GENERAL), Debian packages
#                                   (bubblewrap, for humaneval's sandbox) unpacked into /; says whether the sandbox works
#   device_grid.sh stash DIR...     carry DIR (a piece from bench/results/carry_file.py split): kept in /tmp/stash
#   device_grid.sh assemble         rebuild every file whose pieces are all stashed (sha256 checked)
#   device_grid.sh export           the grid's marks, results.json and compacted rows to $OUT/grid-carry.tar.zst.NN
#   device_grid.sh import DIR       a carried export unpacked into the grid folder: its shared steps and rows are
#                                   not redone (the model file must be at the same path)
#   device_grid.sh grid [PRESET]    (re)run bench/results/grid.sh until DEADLINE_S (rerun while it says exit 75),
#                                   with the settings of bench/results/presets/PRESET.env when given
#   device_grid.sh start [PRESET]   start grid.sh in its own process session, with no deadline: it runs on between
#                                   device calls for as long as the machine is held (a lent machine keeps such a
#                                   process), so no step is cut at a call's end; GRID_OUT and CUDA_VISIBLE_DEVICES
#                                   let two grids (two presets) share one machine's GPUs; nvidia-smi logs the GPUs'
#                                   memory and utilization every 5 s into the grid's gpu-smi.csv; MPS=1 runs the
#                                   grid's processes through an MPS daemon of its own (one such grid a machine;
#                                   2026-11-29: a pair's evaluation lanes 525-528 s against 629-675 s without)
#   device_grid.sh wait SECONDS     wait until every started grid has ended, then copy each one's results.json and
#                                   state (log tails, every small result file; the tables once it has ended) to
#                                   $OUT/NAME/ (NAME: its folder's name), all within SECONDS (the waiting keeps
#                                   time for the copying, as long as it took last); every call after a start is
#                                   one wait
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
# The 0.5B grid of docs/results.md (the model travels in pieces; split sizes them to fit beside the tree):
#   python3 bench/results/carry_file.py split qwen.gguf --name qwen --target /tmp/models/qwen.gguf
#   before a session:  python3 bench/results/carry_file.py fits .carry/qwen-01 (else: ... resplit --name qwen;
#                      12 pieces of 38 MiB since 2026-11-29, when 45 MiB pieces no longer fit beside the tree)
#   call 1:      carry .whl .carry/data .carry/deb   bash bench/results/device_grid.sh setup  (28 MB with them)
#   calls 2-12:  carry .carry/qwen-K          bash bench/results/device_grid.sh stash .carry/qwen-K  (K = 01..11)
#   call 13:     carry .carry/qwen-12         bash ... stash .carry/qwen-12 && bash ... assemble && bash ... start qwen05
#                                             && bash ... wait 530
#   then, back to back until it has ended:    bash bench/results/device_grid.sh wait 570 (a call's limit 600 s:
#                                             wait N ends within N, its copying included (the tables, 16 s
#                                             on a 2-core machine, once the grid has ended: hence 30 s spare);
#                                             the last call, with less device time left: that time less 30
# (a lent machine is given back 30 s after a call ends: have each call ready; docs/results.md "Run it" has the
# session of 2026-11-28, which ran the 135M grid on a fourth GPU beside three 0.5B rows)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export PYTHONPATH=/tmp/site:$root/src PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
usage="usage: device_grid.sh setup|stash DIR...|assemble|export|import DIR|grid [PRESET]|start [PRESET]|wait SECONDS"
phase=${1:?$usage}
shift
# collect GRID_DIR DEST: results.json, the table (table.md), log tails and grid-state.tar.gz (every small result
# file, also of rows not recorded yet: with it, grid_record.py records here what a lost machine had measured)
collect() {
  local dir=$1 dest=$2
  mkdir -p "$dest"
  python3 bench/results/grid_record.py --slim "$dir" 2>/dev/null  # HellaSwag's and MMLU's items, for the archive
  # the tables once the grid has ended (their bootstraps took 46 s at 16 rows, 16 s since 0abceb5: mid-grid, time;
  # results.json makes them anywhere: grid_table.py results.json)
  if [ -f "$dir/grid.rc" ]; then
    python3 bench/results/grid_table.py "$dir/results.json" --plot "$dest/finding3.png" > "$dir/table.md" 2>/dev/null
    cp "$dir/table.md" "$dest/"  # the tables even where the plot failed (no matplotlib)
  fi
  tail -n 40 "$dir"/gpu*.log "$dir"/grid.log > "$dir/workers.log" 2>/dev/null
  ls -l "$dir/done" > "$dir/done.txt" 2>/dev/null
  (cd "$dir" && { find done runs sel -type f \( -path 'done/*' -o -name '*.json' -o -name metrics.jsonl \) \
       -not -path '*/checkpoints/*' \( -not -path '*/losses-*' -o -name 'eval-*-loss.json' \) -not -name 'tokenizer*' -not -name 'eval-hellaswag.json' \
       -not -name 'eval-mmlu.json' -size -20M 2>/dev/null
     ls table.md workers.log done.txt grid.rc gpu-smi.csv 2>/dev/null; } | tar -czf "$dest/grid-state.tar.gz" -T -)
  # results.json last: a row recorded while the rest was collected is in it (2026-11-29: two rows were recorded
  # a second after an earlier copy, and the archive of that time left their HellaSwag and MMLU results out)
  cp "$dir/results.json" "$dest/" 2>/dev/null
}
grids=${GRIDS:-/tmp/grids}  # a link to each started grid (`wait` watches them; GRIDS: elsewhere, for tests)
case "$phase" in
  setup)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 \
      | grep -v WARNING | tail -2
    mkdir -p /tmp/data && cp -r .carry/data/. /tmp/data/
    # Debian packages the image lacks (bubblewrap, the sandbox of eval --task humaneval), unpacked into /
    for deb in .carry/deb/*.deb; do [ -f "$deb" ] && dpkg -x "$deb" / && echo "installed $(basename "$deb")"; done
    python3 -c "from bridgecli.evaluation.sandbox import bwrap_problem; p = bwrap_problem(); print('code sandbox:', p or 'bwrap works here')"
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
  wait)  # wait SECONDS: until every started grid has ended, then each one's results to $OUT/NAME/, all within
    # SECONDS: the waiting stops early enough for the copying, timed at the last wait of this machine (90 s before
    # any; 2026-11-29: 68 s after a 600 s call's `wait 545`, which its limit cut before anything came back)
    limit=${1:?usage: device_grid.sh wait SECONDS}
    t0=$SECONDS
    copy_s=$(cat "$grids/.copy-seconds" 2>/dev/null || echo 90)
    budget=$(( limit - copy_s - 10 ))
    running() { local f; for f in "$grids"/*; do [ -f "$f/grid.pid" ] && [ ! -f "$f/grid.rc" ] && return 0; done; return 1; }
    while running && [ $(( SECONDS - t0 )) -lt "$budget" ]; do sleep 1; done
    compgen -G "$grids/*" > /dev/null || { echo "device_grid.sh: no grid was started on this machine (start first)" >&2; exit 2; }
    c0=$SECONDS
    for dir in "$grids"/*; do
      name=$(basename "$(readlink -f "$dir")")
      state=running; [ -f "$dir/grid.rc" ] && state="ended, exit $(cat "$dir/grid.rc")"
      echo "== $name: $state; $(ls "$dir/done" 2>/dev/null | grep -c _recorded) rows recorded this machine"
      tail -n 3 "$dir/grid.log" "$dir"/gpu*.log 2>/dev/null | grep -v '^$'
      [ -n "${OUT:-}" ] && collect "$dir" "$OUT/$name"
    done
    echo $(( SECONDS - c0 )) > "$grids/.copy-seconds"
    echo "== waited $(( c0 - t0 )) s, copied in $(( SECONDS - c0 )) s"
    exit 0 ;;
  grid|start) ;;
  *) echo "$usage" >&2; exit 2 ;;
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
if [ "$phase" = start ]; then  # the grid in its own session, its exit status in grid.rc; `wait` watches it
  [ -f "$grid_out/grid.pid" ] && [ ! -f "$grid_out/grid.rc" ] && { echo "device_grid.sh: a grid runs in $grid_out already" >&2; exit 2; }
  rm -f "$grid_out/grid.rc"
  mkdir -p "$grids" && ln -sfn "$grid_out" "$grids/$(basename "$grid_out")"
  # MPS=1: the grid's processes share the GPU through NVIDIA's Multi-Process Service (a user-space daemon; the
  # card's compute mode stays as it is), so their kernels may run at once instead of in turns: in a pair of
  # rows twelve evaluation processes take turns on the GPU, and HellaSwag, 56 s alone (721 requests a second,
  # 2026-11-28), took 630-645 s (2026-11-29). The daemon is this grid's: it quits when the grid ends
  mps_quit=""
  if [ "${MPS:-0}" = 1 ]; then
    command -v nvidia-cuda-mps-control > /dev/null || { echo "device_grid.sh: MPS=1 but no nvidia-cuda-mps-control here" >&2; exit 2; }
    mps=/tmp/mps/$(basename "$grid_out")  # not in the grid's folder: its state archive would take the pipes
    export CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_LOG_DIRECTORY=$mps/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d || { echo "device_grid.sh: the MPS daemon did not start" >&2; exit 2; }
    mps_quit="echo quit | nvidia-cuda-mps-control"
    echo "device_grid.sh: MPS daemon started (pipes in $CUDA_MPS_PIPE_DIRECTORY)"
  fi
  BRIDGE="python3 -m bridgecli" PYTHON=python3 setsid bash -c \
    'bash bench/results/grid.sh /tmp/data "$1"; echo $? > "$1/grid.rc"; eval "$2"' grid "$grid_out" "$mps_quit" \
    > "$grid_out/grid.log" 2>&1 < /dev/null &
  echo $! > "$grid_out/grid.pid"
  echo "device_grid.sh: started the grid in $grid_out (pid $!, GPUs ${CUDA_VISIBLE_DEVICES:-all}); log $grid_out/grid.log"
  # the GPUs' memory and utilization every 5 s while the machine is held (gpu-smi.csv, in the state archive):
  # what rows side by side on a GPU leave free
  if command -v nvidia-smi > /dev/null; then
    setsid nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total,utilization.gpu --format=csv,noheader \
      -l 5 >> "$grid_out/gpu-smi.csv" 2> /dev/null < /dev/null &
  fi
  exit 0
fi
BRIDGE="python3 -m bridgecli" PYTHON=python3 DEADLINE_S=${DEADLINE_S:-540} \
  timeout "${HARD_S:-580}" bash bench/results/grid.sh /tmp/data "$grid_out"
rc=$?
if [ -n "${OUT:-}" ]; then
  collect "$grid_out" "$OUT"
fi
echo "device_grid.sh: grid exit $rc (75: rerun to continue)"
exit 0
