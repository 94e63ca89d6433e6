#!/usr/bin/env bash
# This tree against another on a GPU machine: `python3 benchmark.py
# --sequence -c`, strict float32 and then --autocast bf16, run in each tree,
# taking turns (base, this, then this, base, ...), one process a run; each
# precision's reports go to $OUT/compare_PRECISION.log and
# scripts/compare_reports.py prints every row's medians and this tree's over
# the base's.
#
#   BASE=base.tar scripts/compare_trees.sh [TURNS]
#
# BASE: a git archive of the other tree (`git archive da6eb12 -o base.tar`,
# carried to the machine beside this tree). TURNS: pairs of runs a
# precision (default 2). Both trees are built with CUDA_ARCH (default:
# sm_90 alone). About 50 s a strict run and 30 s a bf16 run on an H200.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${BASE:?BASE names a git archive (.tar) of the tree to compare with}"
OUT=${OUT:-gpu_out}
TURNS=${1:-2}
arch=${CUDA_ARCH:--gencode arch=compute_90,code=sm_90}
mkdir -p "$OUT"
base=$(mktemp -d)
trap 'rm -rf "$base"' EXIT
tar -xf "$BASE" -C "$base" || exit 1
(cd "$base" && make CUDA_ARCH="$arch" -j8 > "$OUT/compare_build_base.log" 2>&1) &
building=$!
make CUDA_ARCH="$arch" -j8 > "$OUT/compare_build.log" 2>&1 || exit 1
wait "$building" || { tail -n 20 "$OUT/compare_build_base.log"; exit 1; }

for precision in strict bf16; do
  log="$OUT/compare_$precision.log"
  : > "$log"
  options=()
  [ "$precision" = bf16 ] && options=(--autocast bf16)
  for ((turn = 0; turn < TURNS; turn++)); do
    order="base this"
    ((turn % 2)) && order="this base"
    for tree in $order; do
      directory=$PWD
      [ "$tree" = base ] && directory=$base
      echo "=== $tree" >> "$log"
      (cd "$directory" && python3 benchmark.py --sequence -c "${options[@]}") >> "$log" 2>&1 ||
        { tail -n 20 "$log"; exit 1; }
      echo "=== end" >> "$log"
    done
  done
  echo "== $precision"
  python3 scripts/compare_reports.py "$log"
done
