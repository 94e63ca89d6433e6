"""--distributed: how training scales over processes. Steps per second of
the --distributed demo's model (LLTMSequence and a linear readout, Adam)
under DistributedDataParallel on 1, 2, 4, ... and all the GPUs (-c: NCCL,
one process a GPU), or on 1 and 2 CPU processes (gloo: a smoke run at a
tiny size, one torch thread a process).

Weak scaling: each process trains on a batch of its own, so N processes
train N times the sequences in a step. The scaling efficiency is the
sequences per second of N processes over N times those of one process
without DDP. Each process count is a fresh spawn of that many processes,
which join their group as torchrun's would (examples/distributed.py's start);
a step's time is the slowest process's.
"""

import os
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from examples import distributed, training

from . import harness


@dataclass(frozen=True)
class Workload:
    name: str
    steps: int  # of each sequence
    batch: int  # sequences a process trains on in a step
    features: int
    state: int

    def __str__(self):
        return f"{self.steps}x{self.batch}x{self.features}x{self.state}"


WORKLOADS = {
    "cuda": (Workload("compute-bound", 50, 256, 256, 1024),
             Workload("the demo's", training.SEQUENCE_STEPS, training.BATCH_SIZE,
                      training.INPUT_FEATURES, training.STATE_SIZE)),
    "cpu": (Workload("tiny (smoke run)", 4, 8, 5, 7),),
}
CPU_PROCESSES = 2
DEFAULT_RUNS = {"cuda": 50, "cpu": 5}  # timed steps in each of REPEATS rounds
REPEATS = 3
SPAWN_TIMEOUT_S = 600  # for all the sizes at one process count: a hung group fails


def process_counts(available):
    """1, 2, 4, ... up to `available`, and `available` itself."""
    counts = [1]
    while counts[-1] * 2 <= available:
        counts.append(counts[-1] * 2)
    return counts if counts[-1] == available else counts + [available]


def free_port():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        return listener.getsockname()[1]


def steps_per_second(workload, wrapped, device, dtype, warmup, runs):
    """Training steps per second of the slowest process, median of REPEATS rounds."""
    model = training.SequenceRegressor(workload.features, workload.state, batch_first=True,
                                   device=device, dtype=dtype)
    if wrapped:
        model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    sequences = torch.randn(workload.batch, workload.steps, workload.features, device=device,
                            dtype=dtype)
    targets = torch.randn(workload.batch, device=device, dtype=dtype)

    def step():
        training.training_step(model, optimizer, sequences, targets)

    synchronize = harness.synchronizer(device)
    harness.warm_up(step, warmup)
    rounds = []
    for _ in range(REPEATS):
        dist.barrier()
        _, seconds = harness.wall_clock(step, synchronize, runs)
        slowest = torch.tensor([seconds], device=device, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        rounds.append(slowest.item())
    return 1 / statistics.median(rounds)


def worker(rank, world_size, port, device_type, dtype, workloads, warmup, runs, result_path):
    """One of mp.spawn's processes: [(workload name, DDP or not, steps/s)] to
    result_path from rank 0."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device_type == "cpu":
        torch.set_num_threads(1)
    rank, world_size, device = distributed.start(device_type)
    torch.manual_seed(0)
    results = [(workload.name, wrapped,
                steps_per_second(workload, wrapped, device, dtype, warmup, runs))
               for workload in workloads
               for wrapped in ((False, True) if world_size == 1 else (True,))]
    if rank == 0:
        torch.save(results, result_path)
    distributed.finish()


def measure(device_type, dtype, workloads, runs):
    """{(workload name, processes, DDP or not): steps/s} for every process count."""
    available = torch.cuda.device_count() if device_type == "cuda" else CPU_PROCESSES
    measured = {}
    with tempfile.TemporaryDirectory() as directory:
        for count in process_counts(available):
            harness.note(f"--distributed: {count} process(es)")
            path = Path(directory) / f"{count}.pt"
            spawned = mp.start_processes(
                worker, args=(count, free_port(), device_type, dtype, workloads,
                              harness.WARMUP_RUNS, runs, str(path)),
                nprocs=count, join=False, start_method="spawn")
            deadline = time.monotonic() + SPAWN_TIMEOUT_S
            while not spawned.join(timeout=max(0.0, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    for process in spawned.processes:
                        process.kill()
                    raise SystemExit(f"benchmark.py: --distributed: {count} process(es) still "
                                     f"running after {SPAWN_TIMEOUT_S} s; stopped them")
            for name, wrapped, rate in torch.load(path, weights_only=True):
                measured[name, count, wrapped] = rate
    return measured


def table(workloads, measured):
    rows = []
    for workload in workloads:
        alone = measured[workload.name, 1, False]
        for (name, count, wrapped), rate in measured.items():
            if name == workload.name:
                rows.append([workload.name, str(workload), str(count), "yes" if wrapped else "no",
                             f"{rate:.1f}", f"{rate * count * workload.batch:.0f}",
                             f"{rate / alone:.2f}"])
    return harness.markdown_table(["workload", "steps x batch x features x state, a process",
                                   "processes", "DDP", "steps/s", "sequences/s",
                                   "scaling efficiency"], rows, text_columns=4)


def run(args, device, dtype):
    if device.type == "cuda" and torch.cuda.device_count() < 2:
        raise SystemExit(f"benchmark.py: --distributed -c needs 2 GPUs or more; torch sees "
                         f"{torch.cuda.device_count()}")
    workloads = WORKLOADS[device.type]
    runs = args.runs or DEFAULT_RUNS[device.type]
    measured = measure(device.type, dtype, workloads, runs)
    backend = ("NCCL, one process a GPU" if device.type == "cuda"
               else "gloo, one torch thread a process")
    print(harness.report(
        "Training steps per second over processes (DistributedDataParallel)", device, dtype,
        table(workloads, measured),
        notes=[f"- processes: torch.multiprocessing.spawn, {backend}",
               f"- timing: median of {REPEATS} rounds of {runs} steps of the slowest process, "
               f"after {harness.WARMUP_RUNS} untimed",
               "- scaling efficiency: sequences/s over (processes x sequences/s of one process "
               "without DDP); each process trains its own batch"]))
