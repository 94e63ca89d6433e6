#!/usr/bin/env bash
# The whole pytest suite on a GPU machine in three concurrent groups, picked
# by marker (pyproject.toml): the builds, installs and process launches
# (`slow`, most of their time compiling on the CPU), the GPU tests, and the
# rest; each group's log goes to $OUT/pytest_GROUP.log, a summary line per
# group last.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
run_group() {
  TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_$1 python3 -m pytest -q -rfEs -p no:cacheprovider \
    -m "$2" > "$OUT/pytest_$1.log" 2>&1
}
run_group slow "slow" & run_group gpu "gpu and not slow" & run_group rest "not gpu and not slow" &
wait
for group in slow gpu rest; do
  printf '%-5s %s\n' "$group" "$(tail -n 1 "$OUT/pytest_$group.log")"
done
