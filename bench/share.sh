# Sourced by the bench scripts that spread jobs over GPUs or processes (results/grid.sh, compare/real_subset.sh).
# share W N WORD...: share W (0-based) of N of the words, dealt round-robin (positions W, W+N, W+2N, ...), on
# one line, each word followed by a space; empty when there are fewer than W+1 words.
share() {
  local w=$1 n=$2 i out=""
  shift 2
  local all=("$@")
  for ((i = w; i < ${#all[@]}; i += n)); do out+="${all[i]} "; done
  printf '%s' "$out"
}
