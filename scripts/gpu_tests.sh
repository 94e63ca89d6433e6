#!/usr/bin/env bash
# The whole pytest suite on a GPU machine in three concurrent groups (the
# build and install tests spend most of their time compiling on the CPU);
# each group's log goes to $OUT/pytest_GROUP.log, a summary line per group last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
builds="tests/test_build.py tests/test_packaging.py"
sequence="tests/test_distributed.py tests/test_processes_and_builds.py tests/test_sequence.py tests/test_concurrency.py tests/test_streams_graphs_devices.py tests/test_benchmark.py"
rest=$(ls tests/test_*.py | grep -v -x -F -e tests/test_build.py -e tests/test_packaging.py \
       $(for f in $sequence; do printf -- '-e %s ' "$f"; done))
run_group() {
  TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_$1 python3 -m pytest -q -rfEs -p no:cacheprovider "${@:2}" \
    > "$OUT/pytest_$1.log" 2>&1
}
run_group builds $builds & run_group sequence $sequence & run_group rest $rest & wait
for group in builds sequence rest; do
  printf '%-9s %s\n' "$group" "$(tail -n 1 "$OUT/pytest_$group.log")"
done
