"""Trains a small LLTM sequence model on a synthetic task (training.py) on
the best device available, after checking lltm_ffi against the reference
there. Run from the repository's root:

    python -m examples.demo [--steps 300] [--device cuda|cpu] [--plot loss.png]
    torchrun --nproc-per-node N -m examples.demo --distributed [--checkpoint PATH [--resume]]

With --distributed, distributed.py trains on that task over several
processes (DistributedDataParallel), with checkpoints.
"""

import argparse
import os
import sys
import time

import torch

import lltm_ffi
from lltm_ffi import selfcheck

from .training import (BATCH_SIZE, INPUT_FEATURES, SEQUENCE_STEPS, STATE_SIZE, Progress,
                       SequenceRegressor, best_device, make_batch, mean_losses, save_plot,
                       training_step)


DISTRIBUTED_SAMPLES = 65536


def checkpoint_problem(args):
    """Why --resume and --checkpoint cannot be used as given, or None."""
    if args.resume and not args.checkpoint:
        return "--resume needs --checkpoint PATH, the checkpoint to go on from"
    if not args.checkpoint:
        return None
    directory = os.path.dirname(args.checkpoint) or "."
    if os.path.isdir(args.checkpoint):
        return f"--checkpoint {args.checkpoint} is a directory: name the file to write"
    if not os.path.isdir(directory):
        return f"--checkpoint {args.checkpoint}: there is no directory {directory} to write it in"
    return None


def run_distributed(parser, args, device):
    """parser.error for what cannot run, before any process group is joined."""
    from . import distributed

    args.device = device
    problem = checkpoint_problem(args)
    if problem:
        parser.error(problem)
    if args.checkpoint_every < 1:
        parser.error("--checkpoint-every must be at least 1")
    if device == "cuda" and not lltm_ffi.CUDA_COMPILED:
        parser.error("--device cuda: lltm_ffi was built without its CUDA kernels")
    problem = distributed.launch_problem(device)
    if problem:
        parser.error(problem)
    world_size = int(os.environ["WORLD_SIZE"])
    if args.resume and os.path.isfile(args.checkpoint):
        try:
            checkpoint = distributed.load_checkpoint(args.checkpoint)
        except distributed.CheckpointError as error:
            parser.error(str(error))
        problem = distributed.resume_problem(checkpoint, args.checkpoint, args.samples, world_size)
        if problem:
            parser.error(problem)
        return distributed.run(args, checkpoint["config"], checkpoint)
    config = distributed.fresh_config(args.samples or DISTRIBUTED_SAMPLES, world_size)
    if config["samples"] < config["global_batch"]:
        parser.error(f"--samples {config['samples']}: fewer than one global batch of "
                     f"{config['global_batch']} sequences ({BATCH_SIZE} for each of the "
                     f"{world_size} processes)")
    return distributed.run(args, config)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None,
                        help="default: cuda when a GPU is present and CUDA is compiled in")
    parser.add_argument("--plot", default="lltm_demo_loss.png",
                        help="where to save the loss curve when matplotlib is installed")
    parser.add_argument("--distributed", action="store_true",
                        help="train with DistributedDataParallel, one process a device; launch "
                             "with torchrun (docs/DISTRIBUTED.md)")
    parser.add_argument("--checkpoint", help="--distributed: save the training state here")
    parser.add_argument("--checkpoint-every", type=int, default=100,
                        help="--distributed: steps between checkpoints (default 100), and one last")
    parser.add_argument("--resume", action="store_true",
                        help="--distributed: go on from --checkpoint, where it exists, up to "
                             "--steps in all (where it does not: start at step 0)")
    parser.add_argument("--samples", type=int, default=None,
                        help=f"--distributed: sequences in the synthetic data set (default "
                             f"{DISTRIBUTED_SAMPLES}; a resumed run: its checkpoint's)")
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
