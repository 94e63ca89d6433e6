#!/usr/bin/env bash
# The demo's --distributed run launched as two torchrun nodes on this
# machine, then resumed by one node of two processes:
#
#   [DEVICE=cuda|cpu] [STOP=150] [STEPS=300] [OUT=gpu_out] [PYTHON=python3] \
#     scripts/multinode_demo.sh [DEMO OPTION...]
#
# 1. Two torchrun agents (--nnodes 2, one process each) meet at a c10d
#    rendezvous on 127.0.0.1 (a port free now) and train to step STOP, rank 0
#    checkpointing to $OUT/multinode.pt (kept as $OUT/multinode_stopped.pt).
#    With DEVICE=cuda each node sees one GPU (CUDA_VISIBLE_DEVICES=0, =1), as
#    each of two one-GPU machines would; its process, LOCAL_RANK 0, takes it.
# 2. One node of two processes (--standalone) resumes from the checkpoint to
#    step STEPS.
#
# Each launch runs under `timeout` (LAUNCH_TIMEOUT, 600 s); the logs are
# $OUT/multinode_node0.log, _node1.log and _resumed.log. Prints each phase's
# progress and loss lines; exits non-zero if a phase fails. NVLink multicast
# stays off.
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda} STOP=${STOP:-150} STEPS=${STEPS:-300} OUT=${OUT:-gpu_out}
LAUNCH_TIMEOUT=${LAUNCH_TIMEOUT:-600} PYTHON=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# One thread a process, as torchrun gives several processes of one node: the
# two nodes share this machine's cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$OUT"
checkpoint=$OUT/multinode.pt
rm -f "$checkpoint" "$OUT/multinode_stopped.pt"
free_port='import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
port=$("$PYTHON" -c "$free_port") || exit 1
demo=(-m examples.demo --distributed --device "$DEVICE" --checkpoint "$checkpoint" "$@")
# --foreground: the launch stays in this script's process group, which a
# caller's own timeout kills whole; torchrun stops its workers on SIGTERM.
launch=(timeout --foreground --kill-after 30 "$LAUNCH_TIMEOUT" "$PYTHON" -m torch.distributed.run)

# node NUMBER: one of the two agents; a node that finds no partner in 60 s gives up.
node() (
  [ "$DEVICE" = cuda ] && export CUDA_VISIBLE_DEVICES=$1
  exec "${launch[@]}" --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d \
    --rdzv-endpoint "127.0.0.1:$port" --rdzv-id lltm-multinode --rdzv-conf join_timeout=60 \
    "${demo[@]}" --steps "$STOP" --plot "$OUT/multinode_first.png" \
    > "$OUT/multinode_node$1.log" 2>&1
)

# errors LOG...: the workers' error lines, then where the whole logs are.
errors() {
  grep -h -i "error" "$@" \
    | grep -v -e ChildFailedError -e "elastic/errors" -e "multiprocessing/errors" -e error_file \
    | head -n 12 >&2
  echo "(logs: $*)" >&2
}

# loss_lines LOG...: rank 0's progress and summary, from whichever log holds them.
loss_lines() {
  grep -h -e "^resumed from" -e "^  step [0-9]*/" -e "^mean loss" "$@" || echo "(no loss line: see $*)"
}

node 0 & first=$!
node 1 & second=$!
wait $first; status0=$?
wait $second; status1=$?
echo "== 2 nodes x 1 process, steps 1-$STOP"
loss_lines "$OUT"/multinode_node[01].log
if [ $status0 -ne 0 ] || [ $status1 -ne 0 ]; then
  echo "the two-node launch failed (exit status $status0 and $status1):" >&2
  errors "$OUT"/multinode_node[01].log
  exit 1
fi
cp "$checkpoint" "$OUT/multinode_stopped.pt"

"${launch[@]}" --standalone --nproc-per-node 2 "${demo[@]}" --steps "$STEPS" --resume \
  --plot "$OUT/multinode_loss.png" > "$OUT/multinode_resumed.log" 2>&1
status=$?
echo "== 1 node x 2 processes, steps $((STOP + 1))-$STEPS"
loss_lines "$OUT/multinode_resumed.log"
if [ $status -ne 0 ]; then
  echo "the resumed launch failed (exit status $status):" >&2
  errors "$OUT/multinode_resumed.log"
  exit 1
fi
