#!/usr/bin/env bash
# Everything that needs the GPU, in one call: build, test, benchmark.
#
#   scripts/gpu_session.sh [STEP...]   steps: build ptx nogpu diag test pytest gpu-tests bench kernels overhead sequence sweep
#                                      cpusweep half accuracy wordlm demo sanitizers compare (BASE=tree.tar),
#                                      and the distributed ones:
#                                      dist-pytest dist-demo dist-multinode dist-bench (default:
#                                      all but sanitizers, compare and dist-*)
#
# Each step's full log goes to $OUT/STEP.log (OUT defaults to ./gpu_out); a
# table of steps, results and times is printed last. Wheels in .whl/ (cffi and
# pycparser for a machine without them or a network) are installed first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# NVLink multicast stays off for the NCCL runs of the dist-* steps.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(build diag test pytest bench kernels overhead sequence half accuracy wordlm demo)

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, cffi; print("torch", torch.__version__, "CUDA", torch.version.cuda, "cffi", cffi.__version__, "GPUs", torch.cuda.device_count())'
  nvcc --version | tail -1
} > "$OUT/environment.log" 2>&1
cat "$OUT/environment.log"

# One process a GPU; --standalone finds a free port.
torchrun="python3 -m torch.distributed.run --standalone --nproc-per-node $(python3 -c 'import torch; print(torch.cuda.device_count())')"

command_for() {
  case "$1" in
    build)   echo "make clean && make" ;;
    ptx)     echo "make clean && make CUDA_ARCH=ptx && python3 -m lltm_ffi && python3 test.py && python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_sequence.py tests/test_packed.py -x" ;;
    # What a machine without a GPU builds (compute_75 PTX alone), on this GPU:
    # the plan must keep off the kernels that code leaves empty.
    nogpu)   echo "make clean && make CUDA_ARCH='-gencode arch=compute_75,code=compute_75' && python3 -m lltm_ffi && python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_paths.py tests/test_cluster.py tests/test_packed.py -k 'not 1000x' -x" ;;
    # GPU_TESTS (pytest paths) runs part of the group; the slowest 30 tests
    # are listed, to see where the time goes.
    gpu-tests) echo "python3 -m pytest -q -rfEs -p no:cacheprovider -n 12 --durations=30 -m 'gpu and not slow' ${GPU_TESTS:-}" ;;
    diag)    echo "python3 -m lltm_ffi" ;;
    test)    echo "python3 test.py" ;;
    pytest)  echo "OUT=$OUT scripts/gpu_tests.sh" ;;
    bench)   echo "python3 benchmark.py --compare -c --output $OUT/compare_cuda.md" ;;
    kernels) echo "python3 benchmark.py --kernels -c" ;;
    overhead) echo "python3 benchmark.py --overhead -c" ;;
    sequence) echo "python3 benchmark.py --sequence -c" ;;
    sweep)   echo "python3 benchmark.py --sweep -c -o $OUT/sweep.md" ;;
    # The host's CPU on 1, 2 and all of torch's threads, about half a second
    # a size and 4 seconds more for a close call, at most 5 minutes (2.5 on
    # the H200 machine's Xeon): the table is rewritten after each size, so
    # that a run cut short keeps what it measured (the picture comes at the
    # end). Its products take OpenBLAS where scipy-openblas32 is installed (on
    # a host without a network, its wheel in .whl/); the table's header says
    # which.
    cpusweep) echo "timeout 300 python3 benchmark.py --cpu-sweep -o $OUT/cpu_sweep.md" ;;
    half)    echo "set -e; for p in '--half bf16' '--half fp16' '--autocast bf16' '--autocast fp16'; do python3 benchmark.py --sequence -c \$p; done" ;;
    accuracy) echo "set -e; for p in '--half bf16' '--half fp16' '--autocast bf16' '--autocast fp16'; do python3 benchmark.py --accuracy -c \$p; done" ;;
    wordlm)  echo "python3 benchmark.py --word-language-model -c" ;;
    sanitizers) echo "set -e; for tool in memcheck racecheck synccheck initcheck; do make \$tool PYTEST_ARGS='-n 8'; done; make racecheck-tensor-cores" ;;
    demo)    echo "python3 -m examples.demo --plot $OUT/demo_loss.png" ;;
    # This tree against BASE, a git archive of another, taking turns.
    compare) echo "OUT=$OUT scripts/compare_trees.sh" ;;
    dist-pytest) echo "TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_dist python3 -m pytest -q -rfEs -p no:cacheprovider -m multi_gpu" ;;
    dist-demo) echo "$torchrun -m examples.demo --distributed --steps 150 --checkpoint $OUT/dist_demo.pt --plot $OUT/dist_demo_first.png && $torchrun -m examples.demo --distributed --steps 300 --checkpoint $OUT/dist_demo.pt --resume --plot $OUT/dist_demo_loss.png" ;;
    dist-multinode) echo "OUT=$OUT scripts/multinode_demo.sh" ;;
    dist-bench) echo "set -o pipefail; python3 benchmark.py --distributed -c | tee $OUT/dist_bench.md" ;;
    *)       echo "" ;;
  esac
}

table=()
for step in "${steps[@]}"; do
  command=$(command_for "$step")
  if [ -z "$command" ]; then echo "unknown step: $step" >&2; exit 2; fi
  echo "=== $step: $command"
  start=$(date +%s.%N)
  bash -c "$command" > "$OUT/$step.log" 2>&1
  status=$?
  seconds=$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")
  tail -n 25 "$OUT/$step.log"
  table+=("$(printf '%-11s %-5s %7ss  %s' "$step" "$([ $status -eq 0 ] && echo ok || echo FAIL)" "$seconds" "$(grep -v '^\s*$' "$OUT/$step.log" | tail -n 1 | cut -c1-90)")")
done

echo
echo "step        result    time  last line"
printf '%s\n' "${table[@]}"
