"""Trains a small LLTM sequence model on a synthetic task on the best device
available, after checking lltm_ffi against the reference there.

    python -m lltm_ffi.demo [--steps 300] [--device cuda|cpu] [--plot loss.png]
    torchrun --nproc-per-node N -m lltm_ffi.demo --distributed [--checkpoint PATH [--resume]]

The task: read a sequence of random vectors and report, at the end, a squashed
running sum of their first feature. The LLTM has no forget gate, so its cell
state can carry the sum; the loss should fall by well over an order of magnitude.
With --distributed, lltm_ffi/distributed.py trains on that task over several
processes (DistributedDataParallel), with checkpoints.
"""

import argparse
import os
import sys
import time

import torch

import lltm_ffi
from lltm_ffi import selfcheck


# The task's sequences and the model, for the single-process and the
# --distributed runs alike.
SEQUENCE_STEPS, BATCH_SIZE, INPUT_FEATURES, STATE_SIZE = 20, 64, 8, 64


class SequenceRegressor(torch.nn.Module):
    """The demo's model: LLTMSequence over the whole sequence, then a linear
    readout of the last hidden state. Takes (steps, batch, features), or
    (batch, steps, features) with batch_first."""

    def __init__(self, input_features, state_size, batch_first=False, device=None, dtype=None):
        super().__init__()
        self.rnn = lltm_ffi.LLTMSequence(input_features, state_size, batch_first=batch_first,
                                         device=device, dtype=dtype)
        self.readout = torch.nn.Linear(state_size, 1, device=device, dtype=dtype)

    def forward(self, sequence):
        _, (h, _) = self.rnn(sequence)
        return self.readout(h).squeeze(1)


def task_targets(sequences, steps_dim):
    """The squashed running sum of the first feature over the steps, which
    are dimension `steps_dim` of `sequences`."""
    return torch.tanh(sequences[..., 0].sum(dim=steps_dim) / sequences.shape[steps_dim] ** 0.5)


def make_batch(steps, batch_size, input_features, device, generator):
    sequence = torch.randn(steps, batch_size, input_features, generator=generator).to(device)
    return sequence, task_targets(sequence, 0)


def training_step(model, optimizer, sequences, targets):
    """One optimizer step on the mean squared error; returns the loss."""
    loss = torch.nn.functional.mse_loss(model(sequences), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def best_device():
    if torch.cuda.is_available() and lltm_ffi.CUDA_COMPILED:
        return "cuda"
    return "cpu"


class Progress:
    """tqdm when it is installed, a plain updating line otherwise."""

    def __init__(self, total, start=0):
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        if not sys.stderr.isatty():  # a log file gets a line every tenth of the run
            tqdm = None
        self.bar = tqdm(total=total, initial=start, unit="step") if tqdm else None
        self.total = total
        self.done = start

    def update(self, loss):
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}")
        elif sys.stderr.isatty():
            print(f"\r  step {self.done}/{self.total}  loss {loss:.4f}", end="", file=sys.stderr,
                  flush=True)
        elif self.done % max(1, self.total // 10) == 0 or self.done == self.total:
            print(f"  step {self.done}/{self.total}  loss {loss:.4f}", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif sys.stderr.isatty():
            print(file=sys.stderr)


def mean_losses(losses, window=10):
    """(window, mean loss of the first `window` steps, of the last `window`):
    the demo's summary, less noisy than single steps."""
    window = min(window, len(losses))
    return window, sum(losses[:window]) / window, sum(losses[-window:]) / window


def save_plot(losses, path, resumed_at=None):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed, so no loss curve was written to {path} "
              f"(`make demo` installs it: requirements-demo.txt)")
        return
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(losses, linewidth=1, label="loss of each step")
    window, first, last = mean_losses(losses)
    for start, label, mean in ((0, "first", first), (len(losses) - window, "last", last)):
        axes.plot([start, start + window - 1], [mean, mean], linewidth=3,
                  label=f"mean of the {label} {window} steps: {mean:.4f}")
    if resumed_at is not None:
        axes.axvline(resumed_at, color="gray", linestyle=":", label=f"resumed at step {resumed_at}")
    axes.legend()
    axes.set_yscale("log")
    axes.set_xlabel("step")
    axes.set_ylabel("training loss (MSE)")
    axes.set_title("LLTM sequence model (lltm_ffi)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    print(f"loss curve written to {path}")


DISTRIBUTED_SAMPLES = 65536


def run_distributed(parser, args, device):
    """parser.error for what cannot run, before any process group is joined."""
    from . import distributed  # it imports this module's reporting

    args.device = device
    if args.samples is None:
        args.samples = DISTRIBUTED_SAMPLES
    if args.resume and not args.checkpoint:
        parser.error("--resume needs --checkpoint PATH, the checkpoint to go on from")
    if args.resume and not os.path.isfile(args.checkpoint):
        parser.error(f"--resume: no checkpoint at {args.checkpoint}")
    if args.checkpoint_every < 1:
        parser.error("--checkpoint-every must be at least 1")
    if device == "cuda" and not lltm_ffi.CUDA_COMPILED:
        parser.error("--device cuda: lltm_ffi was built without its CUDA kernels")
    problem = distributed.launch_problem(device)
    if problem:
        parser.error(problem)
    world_size = int(os.environ["WORLD_SIZE"])
    if args.samples < world_size * BATCH_SIZE:
        parser.error(f"--samples {args.samples}: each of the {world_size} processes needs at "
                     f"least a batch ({BATCH_SIZE})")
    return distributed.run(args)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None,
                        help="default: cuda when a GPU is present and CUDA is compiled in")
    parser.add_argument("--plot", default="lltm_demo_loss.png",
                        help="where to save the loss curve when matplotlib is installed")
    parser.add_argument("--distributed", action="store_true",
                        help="train with DistributedDataParallel, one process a device; launch "
                             "with torchrun (README, \"Training on several GPUs\")")
    parser.add_argument("--checkpoint", help="--distributed: save the training state here")
    parser.add_argument("--checkpoint-every", type=int, default=100,
                        help="--distributed: steps between checkpoints (default 100), and one last")
    parser.add_argument("--resume", action="store_true",
                        help="--distributed: go on from --checkpoint up to --steps in all")
    parser.add_argument("--samples", type=int, default=None,
                        help=f"--distributed: sequences in the synthetic data set "
                             f"(default {DISTRIBUTED_SAMPLES})")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    device = args.device or best_device()
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no GPU")
    if args.distributed:
        return run_distributed(parser, args, device)
    for option in ("checkpoint", "resume", "samples"):
        if getattr(args, option) not in (None, False):
            parser.error(f"--{option} is for --distributed runs only")

    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"lltm_ffi {lltm_ffi.__version__} on {device} ({name}), torch {torch.__version__}")
    failure = selfcheck.disagreement(16, 32, 128, torch.float32, device)
    print("agreement with the PyTorch reference (16x32x128, float32, outputs and 5 gradients): "
          + (f"FAILED: {failure}" if failure else "ok"))
    if failure:
        return 1

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    model = SequenceRegressor(INPUT_FEATURES, STATE_SIZE).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    progress = Progress(args.steps)
    start = time.perf_counter()
    for _ in range(args.steps):
        sequence, target = make_batch(SEQUENCE_STEPS, BATCH_SIZE, INPUT_FEATURES, device,
                                      generator)
        losses.append(training_step(model, optimizer, sequence, target).item())
        progress.update(losses[-1])
    progress.close()
    elapsed = time.perf_counter() - start

    window, first, last = mean_losses(losses)
    print(f"trained {args.steps} steps of a {SEQUENCE_STEPS}-step sequence, batch {BATCH_SIZE}, "
          f"{elapsed / args.steps * 1e3:.2f} ms per step")
    print(f"mean loss of the first {window} steps {first:.4f} -> of the last {window} steps "
          f"{last:.4f} ({first / last:.1f}x lower)")
    save_plot(losses, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
