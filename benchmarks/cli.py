"""benchmark.py's command line: the tutorial's `py|ffi|compile [-c]` and one
flag per other mode."""

import argparse
from collections import namedtuple
from pathlib import Path

import torch

import lltm_ffi

from . import (accuracy, compare, cpu_sweep, distributed, harness, kernels, overhead, precision,
               sequence, sweep, tutorial, word_language_model)

# needs_cuda: why the mode refuses to run without -c (None: it runs on the CPU too).
Mode = namedtuple("Mode", "help run needs_cuda")
# The flag of each mode; with none, the tutorial's one implementation runs.
MODES = {
    "compare": Mode("all implementations side by side, at two sizes on CPU, three on CUDA",
                    compare.run, None),
    "kernels": Mode("the two fused CUDA passes alone, in GB/s against a copy (needs -c)",
                    kernels.run,
                    "--kernels times the CUDA passes alone: it needs -c/--cuda and a GPU"),
    "overhead": Mode(f"host time of each piece of one call at {harness.TUTORIAL_SIZE}",
                     overhead.run, None),
    "sequence": Mode("whole sequences: cell loops, lltm_sequence, nn.LSTM, nn.GRU and a "
                     "no-work floor (with -c: cuDNN, CUDA graph replay, the forward alone and "
                     "the per-step kernels too); with --half or --autocast in that precision",
                     sequence.run, None),
    "accuracy": Mode("the relative error against float64 of lltm_sequence's and nn.GRU's "
                     "outputs and gradients under --half or --autocast", accuracy.run, None),
    "distributed": Mode("training steps/s with DDP on 1 and more GPUs (-c), or a gloo smoke run "
                        "on 2 CPU processes", distributed.run, None),
    "sweep": Mode("lltm_sequence on each of its paths beside nn.GRU and nn.LSTM over a grid of "
                  "sizes (--states, --batches, --steps, --layers), strict float32 and bf16 "
                  "autocast, training and inference; a table, its JSON and a chart",
                  sweep.run, None),
    "word-language-model": Mode("pytorch/examples' word language model trained with nn.LSTM, "
                                "nn.GRU and LLTMSequence: ms a batch and losses, at its small "
                                "and medium sizes", word_language_model.run, None),
    "cpu-sweep": Mode("lltm_sequence, nn.LSTM and nn.GRU on the CPU over states 128 to 1024 and "
                      "batches 1, 16, 64, float32 and bfloat16, training and inference, on 1, 2 "
                      "and all threads (minutes)", cpu_sweep.run, None),
}
# The modes that time the CPU alone, whatever -c says.
CPU_ONLY = {"cpu-sweep": "--cpu-sweep times the CPU passes: run it without -c/--cuda"}
# The options that pick --sweep's grid.
SWEEP_OPTIONS = ("states", "batches", "steps", "layers", "packed")


def chosen(args, name):
    """Whether the mode `name` (a flag's name, dashes and all) was chosen."""
    return getattr(args, name.replace("-", "_"))


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def positive_ints(text):
    """A comma-separated list of positive integers, as a tuple."""
    return tuple(positive_int(item) for item in text.split(","))


def build_parser():
    size = harness.TUTORIAL_SIZE
    parser = argparse.ArgumentParser(
        description="Times the LLTM cell: lltm_ffi, the PyTorch reference and torch.compile of it.")
    modes = parser.add_mutually_exclusive_group(required=True)
    modes.add_argument("implementation", nargs="?", choices=harness.IMPLEMENTATIONS,
                       help="time one implementation, as the tutorial's benchmark.py")
    for name, mode in MODES.items():
        modes.add_argument(f"--{name}", action="store_true", help=mode.help)
    parser.add_argument("-c", "--cuda", action="store_true", help="run on the GPU")
    parser.add_argument("-d", "--double", action="store_true", help="float64 instead of float32")
    parser.add_argument("-b", "--batch-size", dest="batch", type=positive_int,
                        help=f"batch size (default {size.batch})")
    parser.add_argument("-f", "--features", type=positive_int,
                        help=f"input features (default {size.features})")
    parser.add_argument("-s", "--state-size", dest="state", type=positive_int,
                        help=f"state size (default {size.state})")
    parser.add_argument("-r", "--runs", type=positive_int,
                        help=f"timed runs, at every size (default {tutorial.DEFAULT_RUNS}; "
                             f"--compare: {compare.default_runs_text('cpu')} on CPU, "
                             f"{compare.default_runs_text('cuda')} on CUDA, by size; --kernels: "
                             f"{kernels.KERNEL_REPEATS}; --distributed: steps a round, "
                             f"{distributed.DEFAULT_RUNS['cuda']} on CUDA, "
                             f"{distributed.DEFAULT_RUNS['cpu']} on CPU; --sweep: at every "
                             f"point, default as many as fit in {sweep.POINT_SECONDS} s, "
                             f"{sweep.MIN_RUNS} to {sweep.MAX_RUNS}; --cpu-sweep: at every "
                             f"size, default as many as fit in {cpu_sweep.SIZE_SECONDS} s, "
                             f"{cpu_sweep.MIN_RUNS} to {cpu_sweep.MAX_RUNS}, and at least "
                             f"{cpu_sweep.MIN_RUNS} where a size takes long)")
    for option, what, gpu, cpu in (
            ("states", "state sizes (= features)", sweep.GPU_STATES, sweep.CPU_STATES),
            ("batches", "batch sizes", sweep.GPU_BATCHES, sweep.CPU_BATCHES),
            ("steps", "sequence lengths", sweep.GPU_STEPS, sweep.CPU_STEPS)):
        parser.add_argument(f"--{option}", type=positive_ints, metavar="N,N,...",
                            help=f"--sweep: the {what} (default {','.join(map(str, gpu))} with -c, "
                                 f"{','.join(map(str, cpu))} on the CPU)")
    parser.add_argument("--layers", type=positive_int,
                        help="--sweep: stacked layers (default 1); without --steps, --batches, "
                             "--layers and --packed, -c adds 1024 steps of batch 16, "
                             "word_language_model's two-layer shapes and packed batches")
    parser.add_argument("--packed", action="store_const", const=True,
                        help="--sweep: each batch packed (a PackedSequence of lengths from the "
                             "steps down to a quarter of them); -c's default grid adds packed "
                             f"batches of 16 and 64 at 64 steps, states "
                             f"{','.join(map(str, sweep.PACKED_STATES))}")
    parser.add_argument("--timed-batches", type=positive_int,
                        help="--word-language-model: timed batches of each model, after "
                             f"{word_language_model.WARMUP_BATCHES} untimed ones (default "
                             f"{word_language_model.DEFAULT_BATCHES['cuda']} on CUDA, "
                             f"{word_language_model.DEFAULT_BATCHES['cpu']} on CPU)")
    reduced = parser.add_mutually_exclusive_group()
    for flag, what in (("half", "the modules and the data in DTYPE"),
                       ("autocast", "float32 modules and data, each forward under "
                                    "torch.autocast(dtype=DTYPE)")):
        reduced.add_argument(f"--{flag}", choices=precision.HALF_DTYPES, metavar="DTYPE",
                             help=f"--sequence and --accuracy: {what} (bf16 or fp16), the loss "
                                  "in float32")
    parser.add_argument("--tf32", action="store_true",
                        help="--sequence: allow TF32 in cuBLAS and cuDNN alike (default strict "
                             "float32)")
    parser.add_argument("-o", "--output", type=Path,
                        help="--compare's, --sequence's, --sweep's and --cpu-sweep's markdown "
                             "file, a PNG chart beside it (--sweep: a JSON too) (default "
                             "bench_out/compare_{cpu,cuda}.md, "
                             "bench_out/sequence_{cpu,cuda,cuda_tf32}.md, with _half_DTYPE or "
                             "_autocast_DTYPE before .md, bench_out/sweep_{cpu,cuda}.md, "
                             "bench_out/cpu_sweep.md)")
    return parser


def check_arguments(parser, args):
    """parser.error (exit code 2) for combinations that cannot run here."""
    if not args.implementation and any(value is not None for value in (args.batch, args.features,
                                                                        args.state)):
        parser.error("-b/-f/-s set the size for one implementation; "
                     "--compare and --kernels use their own sizes")
    if args.output is not None and not (args.compare or args.sequence or args.sweep
                                        or args.cpu_sweep):
        parser.error("-o/--output is for --compare, --sequence, --sweep and --cpu-sweep only")
    given = [f"--{option}" for option in SWEEP_OPTIONS if getattr(args, option) is not None]
    if given and not args.sweep:
        parser.error(f"{', '.join(given)}: for --sweep only")
    if args.sweep and args.double:
        parser.error("--sweep times strict float32 and bf16 autocast: -d/--double goes without it")
    if args.timed_batches is not None and not args.word_language_model:
        parser.error("--timed-batches is for --word-language-model only")
    if args.tf32 and not (args.sequence and args.cuda):
        parser.error("--tf32 is for --sequence -c only (TF32 is a CUDA setting)")
    reduced = "--half" if args.half else "--autocast" if args.autocast else None
    if reduced and not (args.sequence or args.accuracy):
        parser.error(f"{reduced} is for --sequence and --accuracy only")
    if args.accuracy and not reduced:
        parser.error("--accuracy measures a reduced precision: give --half or --autocast "
                     "(bf16 or fp16)")
    if reduced and (args.double or args.tf32):
        parser.error(f"{reduced} sets the precision: -d/--double and --tf32 go without it")
    for name, mode in MODES.items():
        if chosen(args, name) and mode.needs_cuda and not args.cuda:
            parser.error(mode.needs_cuda)
        if chosen(args, name) and name in CPU_ONLY and args.cuda:
            parser.error(CPU_ONLY[name])
    if args.cuda and not torch.cuda.is_available():
        why = ("is built without CUDA" if torch.version.cuda is None
               else "finds no usable CUDA GPU (torch.cuda.is_available() is False)")
        parser.error(f"-c/--cuda: this torch ({torch.__version__}) {why}; "
                     "run without -c for the CPU")
    if args.cuda and args.implementation not in ("py", "compile") and not lltm_ffi.CUDA_COMPILED:
        parser.error("-c/--cuda: lltm_ffi was built without its CUDA kernels (make found no nvcc); "
                     "rebuild it with `make` where nvcc is")


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    device = torch.device("cuda" if args.cuda else "cpu")
    dtype = torch.float64 if args.double else torch.float32
    run = next((mode.run for name, mode in MODES.items() if chosen(args, name)), tutorial.run)
    run(args, device, dtype)
    return 0
