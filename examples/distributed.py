"""The demo's training run over several processes: DistributedDataParallel,
one process a device, a DistributedSampler over a synthetic data set, and a
checkpoint that a later run resumes from.

    torchrun --nproc-per-node N -m examples.demo --distributed [--steps 300]
             [--checkpoint PATH [--resume]] [--device cuda|cpu]

Each process joins the group torchrun describes in its environment: on GPUs
process LOCAL_RANK drives cuda:LOCAL_RANK through NCCL, on the CPU the
processes talk through gloo. lltm_ffi itself knows nothing of this: its
operators see one device and one stream, and DDP averages the gradients of
LLTMSequence's parameters like any others. Rank 0 reports, writes the
checkpoint and draws the loss curve.
"""

import gc
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler, TensorDataset

import lltm_ffi
from lltm_ffi import selfcheck

from .training import (BATCH_SIZE, INPUT_FEATURES, SEQUENCE_STEPS, STATE_SIZE, Progress,
                       SequenceRegressor, mean_losses, save_plot, task_targets, training_step)

# What torchrun (and any launcher of torch.distributed) sets for each process.
ENVIRONMENT = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
DATA_SEED = 1


def launch_problem(device_type):
    """Why this process cannot join a process group on `device_type`, or None."""
    missing = [name for name in ENVIRONMENT if name not in os.environ]
    if missing:
        return (f"--distributed needs the environment torchrun gives each process "
                f"({', '.join(missing)} not set): launch it as "
                f"`torchrun --nproc-per-node N -m examples.demo --distributed`")
    local_rank = int(os.environ["LOCAL_RANK"])
    if device_type == "cuda" and local_rank >= torch.cuda.device_count():
        return (f"LOCAL_RANK is {local_rank} but torch sees {torch.cuda.device_count()} GPU(s): "
                f"start at most one process a GPU (--nproc-per-node), or use --device cpu")
    return None


def start(device_type):
    """Joins the process group the environment describes: NCCL on
    cuda:LOCAL_RANK, or gloo on the CPU. Returns (rank, world_size, device)."""
    problem = launch_problem(device_type)
    if problem:
        raise RuntimeError(problem)
    if device_type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), device


def finish():
    """Leaves the process group once every process is done with it (a gloo
    process that tears its group down while another still uses it can
    abort). Not after an error: the others may never come to the barrier,
    and torchrun stops them."""
    # The DistributedDataParallel model is in a reference cycle that keeps
    # its reducer, and with it the group's gloo threads, alive until the
    # collector runs; at interpreter exit that can abort the process
    # ("terminate called without an active exception"). Collect it now.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def synthetic_data(samples, seed=DATA_SEED):
    """The demo's task as a data set: `samples` random sequences and, for
    each, the squashed sum of its first feature. Every process draws the
    same one; the sampler gives each its share."""
    sequences = torch.randn(samples, SEQUENCE_STEPS, INPUT_FEATURES,
                            generator=torch.Generator().manual_seed(seed))
    return TensorDataset(sequences, task_targets(sequences, 1))


def batches(sampler, batch_size, first_step):
    """(step, indices) for every step from `first_step` on: step k is batch
    k % per_epoch of epoch k // per_epoch of this process's share, so a
    resumed run takes the batches the uninterrupted run would have."""
    per_epoch = len(sampler) // batch_size
    step = first_step
    while True:
        epoch, first_batch = divmod(step, per_epoch)
        sampler.set_epoch(epoch)
        indices = list(sampler)
        for batch in range(first_batch, per_epoch):
            yield step, indices[batch * batch_size:(batch + 1) * batch_size]
            step += 1


def save_checkpoint(path, model, optimizer, step, losses, config):
    """Written whole or not at all: a run stopped while saving leaves the
    previous checkpoint."""
    state = {"step": step, "losses": losses, "config": config, "model": model.state_dict(),
             "optimizer": optimizer.state_dict()}
    partial = path.with_name(path.name + ".partial")
    torch.save(state, partial)
    os.replace(partial, path)


def load_checkpoint(path, device, config):
    state = torch.load(path, map_location=device, weights_only=True)
    if state["config"] != config:
        raise ValueError(f"{path} was written by a run with {state['config']}, "
                         f"this run has {config}: resume with the same --samples")
    return state


def all_agree(device):
    """selfcheck on every process's device; None when all agree, else the
    first disagreement this process saw (or that another process did)."""
    failure = selfcheck.disagreement(16, 32, 128, torch.float32, device)
    failed = torch.tensor([float(failure is not None)], device=device)
    dist.all_reduce(failed)
    if failed.item() and failure is None:
        return f"{int(failed.item())} other process(es) disagreed"
    return failure


def run(args):
    """The demo's training run in this process (args: the demo's options).
    Returns the exit code."""
    rank, world_size, device = start(args.device)
    code = train(args, rank, world_size, device)
    finish()
    return code


def train(args, rank, world_size, device):
    say = print if rank == 0 else (lambda *_: None)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    say(f"lltm_ffi {lltm_ffi.__version__} on {world_size} process(es), {device.type} ({name}) through "
        f"{dist.get_backend()}, torch {torch.__version__}")
    failure = all_agree(device)
    say("agreement with the PyTorch reference on every process (16x32x128, float32, outputs "
        "and 5 gradients): " + (f"FAILED: {failure}" if failure else "ok"))
    if failure:
        return 1

    torch.manual_seed(0)
    model = DistributedDataParallel(
        SequenceRegressor(INPUT_FEATURES, STATE_SIZE, batch_first=True, device=device),
        device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    data = synthetic_data(args.samples)
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, seed=DATA_SEED,
                                 drop_last=True)
    config = {"samples": args.samples, "batch_size": BATCH_SIZE, "state_size": STATE_SIZE}
    checkpoint = Path(args.checkpoint) if args.checkpoint else None
    first_step, losses = 0, []
    if args.resume:
        state = load_checkpoint(checkpoint, device, config)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first_step, losses = state["step"], state["losses"]
        say(f"resumed from {checkpoint} at step {first_step}")
    say(f"{args.samples} synthetic sequences of {SEQUENCE_STEPS} steps, {world_size} process(es) "
        f"x batch {BATCH_SIZE}, {len(sampler) // BATCH_SIZE} steps an epoch")
    if first_step >= args.steps:
        say(f"the checkpoint is at step {first_step}, --steps is {args.steps}: nothing to train")
        return 0

    progress = Progress(args.steps, start=first_step) if rank == 0 else None
    start_time = time.perf_counter()
    for step, indices in batches(sampler, BATCH_SIZE, first_step):
        sequences, targets = (tensor.to(device) for tensor in data[indices])
        loss = training_step(model, optimizer, sequences, targets).detach()
        dist.all_reduce(loss)
        losses.append(loss.item() / world_size)
        if progress:
            progress.update(losses[-1])
        done = step + 1
        if checkpoint and (done % args.checkpoint_every == 0 or done == args.steps):
            if rank == 0:
                save_checkpoint(checkpoint, model.module, optimizer, done, losses, config)
            dist.barrier()
        if done == args.steps:
            break
    if progress:
        progress.close()
    elapsed = time.perf_counter() - start_time

    trained = args.steps - first_step
    window, first, last = mean_losses(losses)
    say(f"trained steps {first_step + 1} to {args.steps} of a {SEQUENCE_STEPS}-step sequence, "
        f"batch {BATCH_SIZE} on each of {world_size} process(es), "
        f"{elapsed / trained * 1e3:.2f} ms per step")
    say(f"mean loss of the first {window} steps {first:.4f} -> of the last {window} steps "
        f"{last:.4f} ({first / last:.1f}x lower)")
    if checkpoint:
        say(f"checkpoint written to {checkpoint} (step {args.steps})")
    if rank == 0:
        save_plot(losses, args.plot, resumed_at=first_step or None)
    return 0
