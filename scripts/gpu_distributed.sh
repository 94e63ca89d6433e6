#!/usr/bin/env bash
# The distributed checks on a machine with 2 GPUs or more, in one call:
# `make`, then tests/test_distributed.py and the --distributed benchmark test
# (NCCL) and the one-process tests on a second GPU while the first is current
# (names with second_gpu; pytest's log), the demo's --distributed run stopped at step 150 and
# resumed to 300, the same run as two torchrun nodes of a GPU each resumed by
# one node of two (scripts/multinode_demo.sh), and `benchmark.py --distributed
# -c` (its table also in $OUT/dist_bench.md). NVLink multicast is off (NCCL_NVLS_ENABLE=0). Each
# step's log goes to $OUT/STEP.log (OUT defaults to ./gpu_out); a table of
# steps, results and times is printed last. An existing PYTHONPATH (a
# --target directory with cffi, say) is kept.
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())') || exit 1
if [ "$gpus" -lt 2 ]; then
  echo "gpu_distributed.sh: needs 2 GPUs or more; torch sees $gpus" >&2
  exit 2
fi
exec "$(dirname "$0")/gpu_session.sh" build dist-pytest dist-demo dist-multinode dist-bench
