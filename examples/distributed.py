"""The demo's training run over several processes: DistributedDataParallel,
one process a device, a DistributedSampler over a synthetic data set, and a
checkpoint that a later run resumes from, on as many processes or on others.

    torchrun --nproc-per-node N -m examples.demo --distributed [--steps 300]
             [--checkpoint PATH [--resume]] [--device cuda|cpu]

Each process joins the group torchrun describes in its environment: on GPUs
process LOCAL_RANK drives cuda:LOCAL_RANK (of the GPUs CUDA_VISIBLE_DEVICES
shows it) through NCCL, on the CPU the processes talk through gloo. lltm_ffi
itself knows nothing of this: its operators see one device and one stream,
and DDP averages the gradients of LLTMSequence's parameters like any others.
Rank 0 reports, writes the checkpoint and draws the loss curve. Each process
torchrun started ends when torchrun does, killed outright too
(end_with_the_launcher).

A run trains on global batches: step k takes the k-th slice of
`global_batch` sequences from its epoch's shuffle of the data set, whatever
the number of processes, and each process takes an equal share of it. A
fresh run's global batch is BATCH_SIZE a process; a resumed run keeps its
checkpoint's, so a run resumed on another number of processes (one that
divides the global batch) trains on the same batches, and differs from the
uninterrupted run by the rounding of sums split differently only.
"""

import contextlib
import fcntl
import gc
import glob
import os
import secrets
import signal
import socket
import sys
import threading
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
# A step number K: on torchrun's first attempt, the last rank kills itself
# (SIGKILL) as it begins step K, as a crashed machine would; the tests of
# torchrun's restarts (--max-restarts) set it.
CRASH_VARIABLE = "LLTM_DEMO_CRASH_AT_STEP"
CONFIG_KEYS = ("samples", "global_batch", "state_size")
# What a checkpoint holds (save_checkpoint), each of its type.
CHECKPOINT_TYPES = {"step": int, "losses": list, "config": dict, "model": dict, "optimizer": dict}
# How often a process looks whether torchrun is still there, and how long
# it gives itself to end on SIGTERM before SIGKILL.
LAUNCHER_POLL_S = 0.5
STOP_GRACE_S = 10
# In torchrun's environment, for restarts (--max-restarts) that rejoin reliably.
UNSHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"


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
    if restarts_share_the_agents_store():
        return (f"torchrun --max-restarts {os.environ['TORCHELASTIC_MAX_RESTARTS']}: a restarted "
                f"process group can fail or hang joining through the store torchrun's agent "
                f"shares with its processes; launch torchrun with {UNSHARED_STORE} in its "
                f"environment (and --standalone or --rdzv-backend c10d)")
    crash_step = os.environ.get(CRASH_VARIABLE)
    if crash_step is not None and not (crash_step.isdigit() and int(crash_step) >= 1):
        return f"{CRASH_VARIABLE} is {crash_step!r}: a step number, 1 or more"
    return None


def restarts_share_the_agents_store():
    """Whether torchrun may restart this process's group while the processes
    join it through the store of torchrun's agent: that store outlives an
    attempt, and a restarted one can read the addresses the attempt before
    it left there (pytorch/pytorch#135712). With a store of its own, each
    attempt starts clean."""
    return (int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0
            and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True")


def end_with_the_launcher():
    """Ends this process, where torchrun started it, when torchrun is gone.
    torchrun starts its processes in sessions of their own, where a signal
    to torchrun's process group does not reach them, and stops them itself
    when it is stopped; killed outright (SIGKILL), it cannot, and they
    would train on, holding the checkpoint, with no one to stop them. A
    thread watches the parent process; when it changes, this process
    sends itself SIGTERM, what torchrun would have sent, then SIGKILL."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:  # not torchrun's: its parent may go
        return
    launcher = os.getppid()

    def watch():
        while os.getppid() == launcher:
            time.sleep(LAUNCHER_POLL_S)
        with contextlib.suppress(OSError):  # its output may have gone with it
            print(f"examples.demo: torchrun (pid {launcher}) is gone: ending process "
                  f"{os.getpid()} (rank {os.environ.get('RANK')})", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(STOP_GRACE_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="end_with_the_launcher", daemon=True).start()


def start(device_type):
    """Joins the process group the environment describes: NCCL on
    cuda:LOCAL_RANK, or gloo on the CPU, and ends this process with its
    launcher. Returns (rank, world_size, device)."""
    problem = launch_problem(device_type)
    if problem:
        raise RuntimeError(problem)
    end_with_the_launcher()
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


def fresh_config(samples, world_size):
    """The settings of a run that starts at step 0: a batch of BATCH_SIZE a process."""
    return {"samples": samples, "global_batch": BATCH_SIZE * world_size, "state_size": STATE_SIZE}


def resume_problem(checkpoint, path, samples, world_size):
    """Why `world_size` processes cannot go on from `checkpoint` (read from
    `path` by load_checkpoint), or None. `samples` is --samples, None where
    not given."""
    config = checkpoint["config"]
    if sorted(config) != sorted(CONFIG_KEYS) or config["state_size"] != STATE_SIZE:
        return (f"{path} holds a run with the settings {config}, not one of this demo's "
                f"(state size {STATE_SIZE}, settings {', '.join(CONFIG_KEYS)})")
    if samples is not None and samples != config["samples"]:
        return (f"--samples {samples}: {path} is of a run on {config['samples']} sequences; "
                f"leave --samples out to go on with it")
    if config["global_batch"] % world_size:
        return (f"{path} is of a run with a global batch of {config['global_batch']} sequences, "
                f"which {world_size} processes cannot share equally: resume on a number of "
                f"processes that divides {config['global_batch']}")
    return None


def synthetic_data(samples, seed=DATA_SEED):
    """The demo's task as a data set: `samples` random sequences and, for
    each, the squashed sum of its first feature. Every process draws the
    same one; the sampler gives each its share."""
    sequences = torch.randn(samples, SEQUENCE_STEPS, INPUT_FEATURES,
                            generator=torch.Generator().manual_seed(seed))
    return TensorDataset(sequences, task_targets(sequences, 1))


def share_sampler(data, rank, world_size):
    """Process `rank`'s share of each epoch's shuffle of `data`: every
    world_size-th index from the rank-th. The shuffle itself is the same
    for every world size."""
    return DistributedSampler(data, num_replicas=world_size, rank=rank, seed=DATA_SEED,
                              drop_last=True)


def batches(sampler, batch_size, first_step):
    """(step, indices) for every step from `first_step` on: step k is batch
    k % per_epoch of epoch k // per_epoch of this process's share, so a
    resumed run takes the batches the uninterrupted run would have. With
    share_sampler's shares, the processes' batches of a step together are
    the step's slice of batch_size x world_size indices of the epoch's
    shuffle, whatever the world size."""
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
    """Written whole or not at all: written under a name no other process
    or call shares (.NAME.RANDOM.partial, beside it), then renamed into
    place. A run stopped while saving leaves the previous checkpoint, and
    processes that save one checkpoint at once neither read nor rename
    each other's files: a reader finds one whole checkpoint or another."""
    state = {"step": step, "losses": losses, "config": config, "model": model.state_dict(),
             "optimizer": optimizer.state_dict()}
    partial = path.with_name(f".{path.name}.{secrets.token_hex(8)}.partial")
    try:
        # O_EXCL: never another's file, however unlikely the name's collision.
        with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666),
                       "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


class CheckpointError(ValueError):
    """A file that is not one of the demo's checkpoints, saying why."""


def load_checkpoint(path):
    """The training state at `path`, on the CPU; CheckpointError, naming
    the file and what is wrong with it, where it is not one of the demo's
    checkpoints (cut short, damaged, or another file altogether)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as error:  # torch.load's errors for a damaged file are of many kinds
        # Its first sentence: torch's own can run on for several.
        reason = str(error).split("\n")[0].split(". ")[0] or type(error).__name__
        raise CheckpointError(f"--checkpoint {path} is not a checkpoint of this demo: torch "
                              f"cannot read it ({reason}); it is damaged, cut short or another "
                              f"kind of file. Start afresh without --resume, or name another "
                              f"--checkpoint") from error
    problem = _checkpoint_contents_problem(state)
    if problem:
        raise CheckpointError(f"--checkpoint {path} is not a checkpoint of this demo: {problem}. "
                              f"Start afresh without --resume, or name another --checkpoint")
    return state


def _checkpoint_contents_problem(state):
    """What in `state` (a file torch read) is not what save_checkpoint
    writes, or None."""
    if not isinstance(state, dict):
        return f"it holds a {type(state).__name__}, not the demo's dictionary"
    if set(state) != set(CHECKPOINT_TYPES):
        return (f"it holds {', '.join(map(str, sorted(state, key=str))) or 'nothing'}, where the "
                f"demo's hold {', '.join(CHECKPOINT_TYPES)}")
    for key, kind in CHECKPOINT_TYPES.items():
        if not isinstance(state[key], kind):
            return f"its {key} is a {type(state[key]).__name__}, not a {kind.__name__}"
    return None


@contextlib.contextmanager
def checkpoint_lock(path):
    """Yields None while this process holds PATH.lock, an flock (which ends
    with the process, however it ends): only one run writes a checkpoint.
    Where another process holds it, yields what it wrote there ("pid N on
    HOST"). Holding it, sweeps the partial files of runs killed while
    saving. The lock file goes when the run does (a killed run's stays,
    free)."""
    lock_path = path.with_name(path.name + ".lock")
    while True:
        lock = open(lock_path, "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "a process that has not said which"
            lock.close()
            yield holder
            return
        # The run before may have removed the file between our open and our
        # lock: a lock on a name no one else sees. Take the new one.
        with contextlib.suppress(FileNotFoundError):
            if os.stat(lock_path).st_ino == os.fstat(lock.fileno()).st_ino:
                break
        lock.close()
    try:
        lock.truncate(0)
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        lock.flush()
        for partial in path.parent.glob(f".{glob.escape(path.name)}.*.partial"):
            partial.unlink(missing_ok=True)
        yield None
    finally:
        lock_path.unlink(missing_ok=True)
        lock.close()


def all_agree(device):
    """selfcheck on every process's device; None when all agree, else the
    first disagreement this process saw (or that another process did)."""
    failure = selfcheck.disagreement(16, 32, 128, torch.float32, device)
    failed = torch.tensor([float(failure is not None)], device=device)
    dist.all_reduce(failed)
    if failed.item() and failure is None:
        return f"{int(failed.item())} other process(es) disagreed"
    return failure


def lowest_and_highest(value, device):
    """(lowest, highest) of the integer `value` over the processes."""
    negated_and_value = torch.tensor([-value, value], device=device)
    dist.all_reduce(negated_and_value, op=dist.ReduceOp.MAX)
    return -int(negated_and_value[0].item()), int(negated_and_value[1].item())


def crash_step(rank, world_size):
    """The step at which this process kills itself (CRASH_VARIABLE), or None."""
    step = os.environ.get(CRASH_VARIABLE)
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if step is None or rank != world_size - 1 or not first_attempt:
        return None
    return int(step)


def model_and_optimizer(device, checkpoint):
    """The DDP-wrapped model, its Adam and the losses so far: fresh, or as
    `checkpoint` left them."""
    torch.manual_seed(0)
    model = DistributedDataParallel(
        SequenceRegressor(INPUT_FEATURES, STATE_SIZE, batch_first=True, device=device),
        device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    if checkpoint is None:
        return model, optimizer, []
    model.module.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    return model, optimizer, list(checkpoint["losses"])


def run(args, config, checkpoint=None):
    """The demo's training run in this process (args: the demo's options;
    config: the run's settings; checkpoint: the state it resumes from).
    Returns the exit code. Rank 0, the writer, holds the checkpoint's lock
    while it runs."""
    rank, world_size, device = start(args.device)
    writes = rank == 0 and args.checkpoint
    with checkpoint_lock(Path(args.checkpoint)) if writes else contextlib.nullcontext() as other:
        code = train(args, config, checkpoint, rank, world_size, device, other)
    finish()
    return code


def train(args, config, checkpoint, rank, world_size, device, other_writer=None):
    """Trains from step 0, or from `checkpoint`'s step, to --steps; returns
    the exit code. other_writer: who holds the checkpoint's lock (rank 0
    knows), None where no one else does."""
    say = print if rank == 0 else (lambda *_: None)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    say(f"lltm_ffi {lltm_ffi.__version__} on {world_size} process(es), {device.type} ({name}) through "
        f"{dist.get_backend()}, torch {torch.__version__}")
    taken = torch.tensor([float(other_writer is not None)], device=device)
    dist.all_reduce(taken)
    if taken.item():
        say(f"another run is writing {args.checkpoint} ({other_writer}); two runs on one "
            f"checkpoint would overwrite each other's: let it end, or name another --checkpoint")
        return 1
    failure = all_agree(device)
    say("agreement with the PyTorch reference on every process (16x32x128, float32, outputs "
        "and 5 gradients): " + (f"FAILED: {failure}" if failure else "ok"))
    if failure:
        return 1
    # Each process reads the checkpoint itself: machines that do not share
    # its storage can each find another one, or none.
    first_step = checkpoint["step"] if checkpoint else 0
    lowest, highest = lowest_and_highest(first_step, device)
    if lowest != highest:
        say(f"the processes found different checkpoints at {args.checkpoint} (from step {lowest} "
            f"to {highest}; 0: none): on several machines it must be on storage they all share")
        return 1

    model, optimizer, losses = model_and_optimizer(device, checkpoint)
    if checkpoint:
        say(f"resumed from {args.checkpoint} at step {first_step}")
    elif args.resume:
        say(f"no checkpoint at {args.checkpoint} yet: starting at step 0")
    data = synthetic_data(config["samples"])
    sampler = share_sampler(data, rank, world_size)
    batch_size = config["global_batch"] // world_size
    batching = (f"a global batch of {config['global_batch']} ({batch_size} on each of "
                f"{world_size} process(es))")
    say(f"{config['samples']} synthetic sequences of {SEQUENCE_STEPS} steps, {batching}, "
        f"{len(sampler) // batch_size} steps an epoch")
    if first_step >= args.steps:
        say(f"the checkpoint is at step {first_step}, --steps is {args.steps}: nothing to train")
        return 0

    checkpoint_path = Path(args.checkpoint) if args.checkpoint else None
    crash_at = crash_step(rank, world_size)
    progress = Progress(args.steps, start=first_step) if rank == 0 else None
    start_time = time.perf_counter()
    for step, indices in batches(sampler, batch_size, first_step):
        if step + 1 == crash_at:
            os.kill(os.getpid(), signal.SIGKILL)
        sequences, targets = (tensor.to(device) for tensor in data[indices])
        loss = training_step(model, optimizer, sequences, targets).detach()
        dist.all_reduce(loss)
        losses.append(loss.item() / world_size)
        if progress:
            progress.update(losses[-1])
        done = step + 1
        if checkpoint_path and (done % args.checkpoint_every == 0 or done == args.steps):
            if rank == 0:
                save_checkpoint(checkpoint_path, model.module, optimizer, done, losses, config)
            dist.barrier()
        if done == args.steps:
            break
    if progress:
        progress.close()
    elapsed = time.perf_counter() - start_time

    trained = args.steps - first_step
    window, first, last = mean_losses(losses)
    say(f"trained steps {first_step + 1} to {args.steps} of a {SEQUENCE_STEPS}-step sequence, "
        f"{batching}, {elapsed / trained * 1e3:.2f} ms per step")
    say(f"mean loss of the first {window} steps {first:.4f} -> of the last {window} steps "
        f"{last:.4f} ({first / last:.1f}x lower)")
    if checkpoint_path:
        say(f"checkpoint written to {checkpoint_path} (step {args.steps})")
    if rank == 0:
        save_plot(losses, args.plot, resumed_at=first_step or None)
    return 0
