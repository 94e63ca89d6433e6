"""Times the LLTM cell: lltm_ffi against the pure-PyTorch reference and
torch.compile of it, after the PyTorch C++/CUDA extension tutorial's benchmark.

One implementation, with the tutorial's command line and output (min/average):

    python benchmark.py {py,ffi,compile} [-c/--cuda] [-d/--double]
                        [-b BATCH] [-f FEATURES] [-s STATE] [-r RUNS]
    Forward: 177.860/196.116 us | Backward 430.584/461.504 us

All three side by side, taking turns run by run, at 16x32x128, 256x256x512
and (on CUDA only) 4096x1024x2048 (batch x features x state), once each has
been checked against the reference; prints a markdown table, writes it to
--output (default bench_out/compare_{cpu,cuda}.md) and, when matplotlib is
importable, a bar chart next to it (.png). A fourth cell, "floor", which does
no LLTM work, takes its turn with them: the least any cell costs under this
timing on the machine at hand.

    python benchmark.py --compare [-c] [-d] [-r RUNS] [--output PATH]

The two fused pointwise passes alone, as achieved GB/s next to a
device-to-device copy timed in the same run:

    python benchmark.py --kernels -c [-d] [-r RUNS]

Where the host's microseconds go in one call at 16x32x128: each piece of the
call path timed alone (host time per call, no synchronisation inside), the
registered operators against the direct calls, and the floor a single kernel
launch sets under this benchmark's synchronisation:

    python benchmark.py --overhead [-c]

The LLTM stepped over a (T, B, F) sequence, forward and backward, eager
against one CUDA graph of the whole step replayed (time per step):

    python benchmark.py --sequence -c

What float32 pointwise passes cost under bf16 autocast, next to the bf16
matrix product (GPU time by CUDA events):

    python benchmark.py --autocast -c

py is lltm_ffi.reference.lltm, ffi is lltm_ffi.lltm and compile is
torch.compile of lltm_ffi.reference.lltm, all three called with the parameters
of one lltm_ffi.LLTM module. -c runs on the GPU, -d in float64 (else float32).
-r overrides the number of timed runs (the kernels' repeats), at every size.
"""

import argparse
import contextlib
import math
import platform
import shlex
import statistics
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import torch

import lltm_ffi
from lltm_ffi import _extension, ops, reference, selfcheck

IMPLEMENTATIONS = ("py", "ffi", "compile")
# --compare also times "floor", a cell that does no LLTM work, in the same rotation.
FLOOR = "floor"
TIMED = IMPLEMENTATIONS + (FLOOR,)
DEFAULT_SIZE = (16, 32, 128)  # the tutorial's batch, features, state
DEFAULT_RUNS = 100  # the tutorial's, for one implementation
WARMUP_RUNS = 20
COMPILE_WARMUP_RUNS = 50  # its first calls compile the forward and the backward graph
KERNEL_REPEATS = 200
KERNEL_SIZES = ((4096, 2048), (16384, 4096), (65536, 2048))  # batch, state
FALLBACK_L2_BYTES = 50 * 2**20


@dataclass(frozen=True)
class Size:
    batch: int
    features: int
    state: int

    def __str__(self):
        return f"{self.batch}x{self.features}x{self.state}"


# Each --compare size with its default runs on the CPU and on CUDA; None: not run there.
COMPARE_SIZES = (
    (Size(16, 32, 128), {"cpu": 200, "cuda": 200}),
    (Size(256, 256, 512), {"cpu": 50, "cuda": 200}),
    (Size(4096, 1024, 2048), {"cpu": None, "cuda": 50}),
)


class Disagreement(Exception):
    """An implementation's outputs or gradients differ from the reference's beyond tolerance."""


# --- Command line -------------------------------------------------------------------------

def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def compare_runs_text(device_type):
    return "/".join(str(runs[device_type]) for _, runs in COMPARE_SIZES if runs[device_type])


def build_parser():
    parser = argparse.ArgumentParser(
        description="Times the LLTM cell: lltm_ffi, the PyTorch reference and torch.compile of it.")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("implementation", nargs="?", choices=IMPLEMENTATIONS,
                      help="time one implementation, as the tutorial's benchmark.py")
    mode.add_argument("--compare", action="store_true",
                      help="all implementations side by side, at two sizes on CPU, three on CUDA")
    mode.add_argument("--kernels", action="store_true",
                      help="the two fused CUDA passes alone, in GB/s against a copy (needs -c)")
    mode.add_argument("--overhead", action="store_true",
                      help="host time of each piece of one call at 16x32x128")
    mode.add_argument("--autocast", action="store_true",
                      help="the pieces of a forward under bf16 autocast, by CUDA events (needs -c)")
    mode.add_argument("--sequence", action="store_true",
                      help="a sequence of LLTM steps, eager vs CUDA graph replay (needs -c)")
    parser.add_argument("-c", "--cuda", action="store_true", help="run on the GPU")
    parser.add_argument("-d", "--double", action="store_true", help="float64 instead of float32")
    parser.add_argument("-b", "--batch-size", dest="batch", type=positive_int,
                        help=f"batch size (default {DEFAULT_SIZE[0]})")
    parser.add_argument("-f", "--features", type=positive_int,
                        help=f"input features (default {DEFAULT_SIZE[1]})")
    parser.add_argument("-s", "--state-size", dest="state", type=positive_int,
                        help=f"state size (default {DEFAULT_SIZE[2]})")
    parser.add_argument("-r", "--runs", type=positive_int,
                        help=f"timed runs, at every size (default {DEFAULT_RUNS}; --compare: "
                             f"{compare_runs_text('cpu')} on CPU, {compare_runs_text('cuda')} "
                             f"on CUDA, by size; --kernels: {KERNEL_REPEATS})")
    parser.add_argument("-o", "--output", type=Path,
                        help="--compare's markdown file (default bench_out/compare_{cpu,cuda}.md)")
    return parser


def check_arguments(parser, args):
    """parser.error (exit code 2) for combinations that cannot run here."""
    if not args.implementation and any(value is not None for value in (args.batch, args.features,
                                                                        args.state)):
        parser.error("-b/-f/-s set the size for one implementation; "
                     "--compare and --kernels use their own sizes")
    if args.output is not None and not args.compare:
        parser.error("-o/--output is for --compare only")
    if args.kernels and not args.cuda:
        parser.error("--kernels times the CUDA passes alone: it needs -c/--cuda and a GPU")
    if args.autocast and not args.cuda:
        parser.error("--autocast times CUDA kernels: it needs -c/--cuda")
    if args.sequence and not args.cuda:
        parser.error("--sequence compares eager calls with CUDA graph replay: it needs -c/--cuda")
    if args.cuda and not torch.cuda.is_available():
        why = ("is built without CUDA" if torch.version.cuda is None
               else "finds no usable CUDA GPU (torch.cuda.is_available() is False)")
        parser.error(f"-c/--cuda: this torch ({torch.__version__}) {why}; "
                     "run without -c for the CPU")
    if args.cuda and args.implementation not in ("py", "compile") and not lltm_ffi.CUDA_COMPILED:
        parser.error("-c/--cuda: lltm_ffi was built without its CUDA kernels (make found no nvcc); "
                     "rebuild it with `make` where nvcc is")


# --- Timing the cell ------------------------------------------------------------------------

@dataclass
class CellInputs:
    """The tutorial's setup: the parameters of an LLTM module (which require
    grad) and input, h and C (which do not)."""
    module: lltm_ffi.LLTM
    input: torch.Tensor
    h: torch.Tensor
    cell: torch.Tensor

    @classmethod
    def random(cls, size, dtype, device):
        def normal(*shape):
            return torch.randn(*shape, dtype=dtype, device=device)

        module = lltm_ffi.LLTM(size.features, size.state, device=device, dtype=dtype)
        return cls(module, normal(size.batch, size.features), normal(size.batch, size.state),
                   normal(size.batch, size.state))

    def arguments(self):
        return self.input, self.module.weights, self.module.bias, self.h, self.cell


@dataclass
class Timings:
    """Seconds of each timed forward and backward."""
    forward: list = field(default_factory=list)
    backward: list = field(default_factory=list)


def make_implementation(name):
    """The cell function (input, weights, bias, old_h, old_cell) -> (new_h, new_cell)
    called `name`. All three are called the same way, without nn.Module's call
    overhead, so that it does not blur the small sizes."""
    if name == "py":
        return reference.lltm
    if name == "ffi":
        return lltm_ffi.lltm
    return torch.compile(reference.lltm, dynamic=False, fullgraph=True)


def floor_cell(input, weights, bias, old_h, old_cell):
    """No LLTM work at all: one reduction per parameter forward, the loss's own
    nodes and one gradient kernel per parameter backward. Timed like the
    implementations, it is the least any cell can take under this timing, and
    floor/py the smallest ratio any implementation can reach on the machine."""
    return weights.sum(), bias.sum()


def synchronizer(device):
    return torch.cuda.synchronize if device.type == "cuda" else lambda: None


def timed(function, synchronize):
    """function()'s result and the seconds it took, between two device synchronisations."""
    synchronize()
    start = time.perf_counter()
    result = function()
    synchronize()
    return result, time.perf_counter() - start


def backpropagate(new_h, new_cell):
    """The tutorial's backward: (new_h.sum() + new_cell.sum()).backward()."""
    (new_h.sum() + new_cell.sum()).backward()


def forward_and_backward(lltm, inputs, synchronize):
    """Seconds of one forward and of one backward, as the tutorial times them."""
    inputs.module.zero_grad()
    (new_h, new_cell), forward = timed(lambda: lltm(*inputs.arguments()), synchronize)
    _, backward = timed(lambda: backpropagate(new_h, new_cell), synchronize)
    return forward, backward


def warm_up(name, lltm, inputs, synchronize):
    for _ in range(COMPILE_WARMUP_RUNS if name == "compile" else WARMUP_RUNS):
        forward_and_backward(lltm, inputs, synchronize)


def time_interleaved(implementations, inputs, runs, synchronize, label):
    """{name: Timings} over `runs` iterations. Each iteration runs every
    implementation once, starting one further along the list each time, so
    that drift (clocks, temperature, other load) hits all of them alike."""
    names = list(implementations)
    timings = {name: Timings() for name in names}
    progress = Progress(label, runs)
    for iteration in range(runs):
        first = iteration % len(names)
        for name in names[first:] + names[:first]:
            forward, backward = forward_and_backward(implementations[name], inputs, synchronize)
            timings[name].forward.append(forward)
            timings[name].backward.append(backward)
        progress.update(iteration + 1)
    progress.close()
    return timings


class Progress:
    """'label: done/total' redrawn in place on stderr about every 5%, when stderr
    is a terminal (in a captured log it would only be clutter)."""

    def __init__(self, label, total):
        self.label = label
        self.total = total
        self.every = max(1, total // 20)
        self.shown = sys.stderr.isatty()

    def update(self, done):
        if self.shown and (done % self.every == 0 or done == self.total):
            sys.stderr.write(f"\r{self.label}: {done}/{self.total}")
            sys.stderr.flush()

    def close(self):
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def note(message):
    print(message, file=sys.stderr, flush=True)


def microseconds(seconds):
    return seconds * 1e6


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def describe(error):
    """The exception's type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


# --- One implementation ---------------------------------------------------------------------

def run_single(args, device, dtype):
    batch, features, state = DEFAULT_SIZE
    size = Size(args.batch or batch, args.features or features, args.state or state)
    runs = args.runs or DEFAULT_RUNS
    name = args.implementation
    synchronize = synchronizer(device)
    inputs = CellInputs.random(size, dtype, device)
    try:
        implementation = make_implementation(name)
        warm_up(name, implementation, inputs, synchronize)
    except Exception as error:
        if name != "compile":
            raise
        sys.exit(f"benchmark.py: torch.compile of the reference failed: "
                 f"{type(error).__name__}: {error}")
    timings = time_interleaved({name: implementation}, inputs, runs, synchronize,
                               f"{name} {size}")[name]
    print("Forward: {:.3f}/{:.3f} us | Backward {:.3f}/{:.3f} us".format(
        microseconds(min(timings.forward)), microseconds(statistics.fmean(timings.forward)),
        microseconds(min(timings.backward)), microseconds(statistics.fmean(timings.backward))))


# --- All implementations side by side -------------------------------------------------------

@dataclass
class SizeResult:
    size: Size
    runs: int
    timings: dict  # implementation name -> Timings; a failed torch.compile is absent


@dataclass
class WorstError:
    implementation: str
    quantity: str
    error: float
    size: Size


def compare_sizes(device_type, runs):
    """[(Size, runs)] of --compare on this device; -r overrides every size's default."""
    return [(size, runs or defaults[device_type])
            for size, defaults in COMPARE_SIZES if defaults[device_type] is not None]


@contextlib.contextmanager
def tolerating_compile_failure(name, implementations, failures):
    """Drops the compiled implementation, and records why, when the block raises
    for it: torch.compile is the peer compared against, so its failure is
    reported, not fatal. A Disagreement, or any other implementation's error,
    goes through."""
    try:
        yield
    except Disagreement:
        raise
    except Exception as error:
        if name != "compile":
            raise
        implementations.pop(name, None)
        failures[name] = describe(error)
        note(f"torch.compile of the reference failed; its column is marked failed:\n"
             f"{type(error).__name__}: {error}")


def check_agreement(name, lltm, size, dtype, device):
    """The worst relative error of lltm's outputs and gradients against the
    float64 reference at `size`; raises Disagreement beyond selfcheck's tolerance."""
    errors = selfcheck.compare_with_reference(size.batch, size.features, size.state, dtype, device,
                                              function=lltm)
    quantity, error = selfcheck.worst(errors)
    tolerance = selfcheck.TOLERANCES[dtype]
    if not error <= tolerance:  # a NaN fails too
        raise Disagreement(
            f"{name} disagrees with the reference at {size} ({dtype_name(dtype)}): {quantity} has "
            f"relative error {error:.3g}, tolerance {tolerance:g} (replay: selfcheck."
            f"compare_with_reference({size.batch}, {size.features}, {size.state}, {dtype}, "
            f"'{device}', seed={errors['seed']}, function=...))")
    return WorstError(name, quantity, error, size)


def check_all_agree(implementations, failures, sizes, dtype, device):
    """Checks every implementation at every size, at full size, before anything
    is timed; returns the worst error seen."""
    worst = None
    for size, _ in sizes:
        note(f"checking agreement with the reference at {size}...")
        for name, lltm in list(implementations.items()):
            with tolerating_compile_failure(name, implementations, failures):
                result = check_agreement(name, lltm, size, dtype, device)
                if worst is None or result.error > worst.error:
                    worst = result
    return worst


def run_compare(args, device, dtype):
    sizes = compare_sizes(device.type, args.runs)
    synchronize = synchronizer(device)
    implementations, failures = {}, {}
    for name in IMPLEMENTATIONS:
        with tolerating_compile_failure(name, implementations, failures):
            implementations[name] = make_implementation(name)
    worst = check_all_agree(implementations, failures, sizes, dtype, device)

    results = []
    for size, runs in sizes:
        if "compile" in implementations:
            # Each size compiles its own graphs. Dropping the previous ones keeps
            # torch.compile under its recompile limit, past which it runs eagerly.
            torch._dynamo.reset()
        inputs = CellInputs.random(size, dtype, device)
        note(f"{size}: warming up, then {runs} runs of {', '.join(implementations)} and {FLOOR}...")
        for name, lltm in list(implementations.items()):
            with tolerating_compile_failure(name, implementations, failures):
                warm_up(name, lltm, inputs, synchronize)
        warm_up(FLOOR, floor_cell, inputs, synchronize)
        timings = time_interleaved({**implementations, FLOOR: floor_cell}, inputs, runs,
                                   synchronize, str(size))
        results.append(SizeResult(size, runs, timings))

    output = args.output or Path("bench_out") / f"compare_{device.type}.md"
    output.parent.mkdir(parents=True, exist_ok=True)
    plot = output.with_suffix(".png")
    title = f"LLTM cell, {device_description(device)}, {dtype_name(dtype)}"
    if not write_plot(results, plot, title):
        plot = None
        note("matplotlib is not importable: no plot written")
    report = compare_report(results, failures, worst, device, dtype, plot)
    print(report)
    output.write_text(report + "\n")
    note(f"wrote {output}" + (f" and {plot}" if plot else ""))


def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_description(device):
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}"
    return f"CPU {cpu_model()}, {torch.get_num_threads()} torch threads"


def environment_lines(device, dtype):
    return [f"- device: {device_description(device)}",
            f"- torch {torch.__version__}, lltm_ffi {lltm_ffi.__version__}, "
            f"Python {platform.python_version()}",
            f"- dtype: {dtype_name(dtype)}",
            f"- command: `{command_line()}`"]


def command_line():
    """The command as typed: the interpreter's name (not the path a shim
    resolved it to) with its own options, the script and its arguments."""
    interpreter, *arguments = sys.orig_argv
    return shlex.join([Path(interpreter).name, *arguments])


def markdown_table(header, alignments, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(alignments) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def median_us(timings, pass_name):
    return microseconds(statistics.median(getattr(timings, pass_name)))


def min_us(timings, pass_name):
    return microseconds(min(getattr(timings, pass_name)))


def timing_rows(results):
    for result in results:
        for name in TIMED:
            timings = result.timings.get(name)
            if timings is None:
                cells = ["failed"] * 4
            else:
                cells = [f"{statistic(timings, pass_name):.1f}"
                         for pass_name in ("forward", "backward")
                         for statistic in (median_us, min_us)]
            yield [str(result.size), name, str(result.runs), *cells]


RATIOS = (("ffi", "py"), ("ffi", "compile"), (FLOOR, "py"))


def ratio_rows(results):
    for result in results:
        cells = []
        for numerator, denominator in RATIOS:
            for pass_name in ("forward", "backward"):
                if numerator in result.timings and denominator in result.timings:
                    ratio = (median_us(result.timings[numerator], pass_name)
                             / median_us(result.timings[denominator], pass_name))
                    cells.append(f"{ratio:.2f}")
                else:
                    cells.append("failed")
        yield [str(result.size), *cells]


def compare_report(results, failures, worst, device, dtype, plot):
    lines = ["# LLTM cell: lltm_ffi (ffi) vs the PyTorch reference (py) vs torch.compile (compile)",
             "", *environment_lines(device, dtype)]
    lines.append(
        "- runs: " + ", ".join(f"{result.runs} at {result.size}" for result in results)
        + f"; interleaved (each run times every implementation once, in rotating order), after "
        f"{WARMUP_RUNS} warm-up runs each ({COMPILE_WARMUP_RUNS} for compile)")
    if worst is not None:
        lines.append(
            f"- agreement: the outputs and five gradients of every implementation run are within "
            f"{selfcheck.TOLERANCES[dtype]:g} (relative) of the float64 reference at every size, "
            f"checked at full size; worst: {worst.implementation} {worst.quantity} "
            f"{worst.error:.2g} at {worst.size}")
    for name, failure in failures.items():
        lines.append(f"- {name} FAILED, marked failed below: {failure}")
    lines += [
        "",
        "Microseconds per call, each forward and each backward "
        "((new_h.sum() + new_C.sum()).backward()) timed alone with time.perf_counter"
        + (", between torch.cuda.synchronize() calls" if device.type == "cuda" else "") + ".",
        "",
        markdown_table(["size (BxFxS)", "implementation", "runs", "forward median",
                        "forward min", "backward median", "backward min"],
                       [":---", ":---", "---:", "---:", "---:", "---:", "---:"],
                       timing_rows(results)),
        "",
        f"{FLOOR}: a cell that does no LLTM work (returns weights.sum() and bias.sum()), timed "
        "in the same rotation: no implementation can take less here, and floor/py is the "
        "smallest ratio any implementation can reach on this machine.",
        "",
        "Ratios of medians (below 1: the first is faster):",
        "",
        markdown_table(["size (BxFxS)"] + [f"{pass_name} {numerator}/{denominator}"
                                           for numerator, denominator in RATIOS
                                           for pass_name in ("forward", "backward")],
                       [":---"] + ["---:"] * (2 * len(RATIOS)), ratio_rows(results)),
    ]
    if plot is not None:
        lines += ["", f"![median times]({plot.name})"]
    return "\n".join(lines)


def write_plot(results, path, title):
    """A bar chart of the median forward and backward times per size and
    implementation; False when matplotlib is not importable."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError:
        return False
    figure, axes = pyplot.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(TIMED)
    for axis, pass_name in zip(axes, ("forward", "backward")):
        for index, name in enumerate(TIMED):
            positions = [position + (index - (len(TIMED) - 1) / 2) * width
                         for position in range(len(results))]
            medians = [median_us(result.timings[name], pass_name) if name in result.timings
                       else math.nan for result in results]
            axis.bar(positions, medians, width, label=name)
        axis.set_xticks(range(len(results)), [str(result.size) for result in results])
        axis.set_yscale("log")
        axis.set_xlabel("batch x features x state")
        axis.set_ylabel("median time (us)")
        axis.set_title(pass_name)
    axes[0].legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    pyplot.close(figure)
    return True


# --- The fused passes alone -----------------------------------------------------------------

@dataclass
class PassInputs:
    """What the two passes read, and a copy's buffers moving as many bytes as
    backward; forward, backward and copy run the three timed steps on them."""
    gates: torch.Tensor
    old_cell: torch.Tensor
    grad_h: torch.Tensor
    grad_cell: torch.Tensor
    new_cell: torch.Tensor
    copy_source: torch.Tensor
    copy_target: torch.Tensor

    @classmethod
    def random(cls, batch, state, dtype, device):
        def normal(columns):
            return torch.randn(batch, columns, dtype=dtype, device=device)

        copy_source = torch.randn(5 * batch * state, dtype=dtype, device=device)
        return cls(normal(3 * state), normal(state), normal(state), normal(state), normal(state),
                   copy_source, torch.empty_like(copy_source))

    def forward(self):
        return ops.forward(self.gates, self.old_cell)

    def backward(self):
        return ops.backward(self.grad_h, self.grad_cell, self.new_cell, self.gates)

    def copy(self):
        return self.copy_target.copy_(self.copy_source)


KERNEL_STEPS = {"forward": PassInputs.forward, "backward": PassInputs.backward,
                "copy": PassInputs.copy}
# Elements each step must read and write per batch row and state column, counted once.
ELEMENTS_MOVED = {"forward": 6, "backward": 10, "copy": 10}
INPUT_SET_ELEMENTS = 7 + 10  # the passes' inputs and the copy's two buffers, per row and column
OUTPUT_ELEMENTS = 2 + 4  # allocated by forward and backward while they run


def input_set_count(bytes_per_iteration, l2_bytes):
    """How many input sets to rotate through so that a set is out of L2 by the
    time it comes back: one when an iteration alone moves twice L2's size."""
    if bytes_per_iteration >= 2 * l2_bytes:
        return 1
    return 1 + math.ceil(2 * l2_bytes / bytes_per_iteration)


def median_kernel_milliseconds(input_sets, repeats):
    """{step: median milliseconds} by CUDA events around each call. The steps
    take turns in rotating order; the input sets are used in rotation."""
    names = list(KERNEL_STEPS)
    for iteration in range(WARMUP_RUNS):
        for name in names:
            KERNEL_STEPS[name](input_sets[iteration % len(input_sets)])
    events = {name: [] for name in names}
    for iteration in range(repeats):
        inputs = input_sets[iteration % len(input_sets)]
        first = iteration % len(names)
        for name in names[first:] + names[:first]:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            KERNEL_STEPS[name](inputs)
            end.record()
            events[name].append((start, end))
    torch.cuda.synchronize()
    return {name: statistics.median(start.elapsed_time(end) for start, end in pairs)
            for name, pairs in events.items()}


def kernel_rows(batch, state, dtype, device, repeats):
    """The table rows of one size, or None when it does not fit in free GPU memory."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    elements = batch * state
    l2_bytes = (getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
                or FALLBACK_L2_BYTES)
    set_count = input_set_count(sum(ELEMENTS_MOVED.values()) * elements * itemsize, l2_bytes)
    needed = (set_count * INPUT_SET_ELEMENTS + OUTPUT_ELEMENTS) * elements * itemsize
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    if needed > 0.9 * free:
        note(f"{batch}x{state}: skipped, needs {needed / 1e9:.1f} GB of GPU memory, "
             f"{free / 1e9:.1f} GB free")
        return None
    note(f"{batch}x{state}: {set_count} input set(s) (L2 {l2_bytes / 1e6:.0f} MB), "
         f"{WARMUP_RUNS} warm-up, {repeats} repeats...")
    input_sets = [PassInputs.random(batch, state, dtype, device) for _ in range(set_count)]
    milliseconds = median_kernel_milliseconds(input_sets, repeats)
    bytes_moved = {name: ELEMENTS_MOVED[name] * elements * itemsize for name in KERNEL_STEPS}
    bandwidth = {name: bytes_moved[name] / (milliseconds[name] * 1e-3) for name in KERNEL_STEPS}
    return [[f"{batch}x{state}", name, f"{bytes_moved[name] / 1e6:.1f}",
             f"{milliseconds[name] * 1e3:.1f}", f"{bandwidth[name] / 1e9:.0f}",
             f"{100 * bandwidth[name] / bandwidth['copy']:.1f}"]
            for name in KERNEL_STEPS]


def run_kernels(args, device, dtype):
    repeats = args.runs or KERNEL_REPEATS
    rows = []
    for batch, state in KERNEL_SIZES:
        rows += kernel_rows(batch, state, dtype, device, repeats) or []
    lines = [
        "# LLTM fused passes alone (lltm_ffi.ops.forward / backward)", "",
        *environment_lines(device, dtype),
        f"- median of {repeats} repeats after {WARMUP_RUNS} warm-up, CUDA events around each "
        "call; forward, backward and the copy take turns in rotating order",
        "- the passes allocate their outputs (torch.empty_like, served by the caching allocator "
        "after warm-up), as lltm_ffi.lltm does, and are timed as they are, host-side call "
        "included where the GPU waits for it",
        "- bytes each step must read and write, counted once: forward 6*B*S, backward 10*B*S "
        "elements; copy: dst.copy_(src) moving as many bytes as backward (read + write)",
        "- one input set per size when an iteration moves more than twice the L2 cache, else "
        "enough sets, used in turn, that each is out of L2 when it comes back",
        "",
        markdown_table(["batch x state", "step", "MB moved", "median (us)", "GB/s", "% of copy"],
                       [":---", ":---", "---:", "---:", "---:", "---:"], rows),
    ]
    print("\n".join(lines))


# --- Where the microseconds go ----------------------------------------------------------------

class _Identity(torch.autograd.Function):
    """An autograd.Function that does nothing: the cost of .apply itself."""

    @staticmethod
    def forward(ctx, input, weights, bias, old_h, old_cell):
        return old_h, old_cell

    @staticmethod
    def backward(ctx, grad_h, grad_cell):
        return None, None, None, grad_h, grad_cell


def host_microseconds(function, calls=2000, batches=7):
    """Median over `batches` of the host time per call of `function`, called
    `calls` times back to back; the device catches up between batches."""
    synchronize = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    medians = []
    for _ in range(batches):
        synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            function()
        medians.append((time.perf_counter() - start) / calls * 1e6)
        synchronize()
    return statistics.median(medians)


def synchronized_microseconds(steps, runs=300):
    """Median microseconds of steps[0], with steps[1:] run (untimed) between
    runs, each between two synchronisations, as the benchmark times a call."""
    synchronize = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    times = []
    for _ in range(runs):
        for step in steps[1:]:
            synchronize()
            step()
        times.append(microseconds(timed(steps[0], synchronize)[1]))
    return statistics.median(times)


def overhead_rows(device, dtype):
    from lltm_ffi import function
    size = Size(*DEFAULT_SIZE)
    inputs = CellInputs.random(size, dtype, device)
    input, weights, bias, h, cell = inputs.arguments()
    X = torch.cat((h, input), dim=1)
    gates = torch.nn.functional.linear(X, weights.detach(), bias.detach())
    new_h, new_cell = ops.forward(gates, cell)
    grad_h, grad_cell = torch.randn_like(new_h), torch.randn_like(new_cell)
    ffi, lib = _extension.ffi, _extension.lib
    pointers = [ffi.cast("void *", tensor.data_ptr()) for tensor in (gates, cell, new_h, new_cell)]
    device = cell.device  # with its index
    if device.type == "cuda":
        stream = ffi.cast("void *", torch.cuda.current_stream(device).cuda_stream)
        index = device.index
    else:
        stream, index = ffi.NULL, lib.LLTM_CPU
    dtype_code = _extension._DTYPE_CODES[dtype]
    c_pass = lambda: lib.lltm_forward(dtype_code, index, stream, *size_args, *pointers)
    size_args = (size.batch, size.state)
    ones = torch.ones((), device=device)

    def step(lltm):
        return lambda: backpropagate(*lltm(*inputs.arguments()))

    def tiny_forward():
        return ones * 2

    def backward_steps(lltm):
        """[timed backward, untimed forward before it]."""
        outputs = []

        def forward():
            inputs.module.zero_grad()
            outputs[:] = lltm(*inputs.arguments())

        return [lambda: backpropagate(*outputs), forward]

    tiny_leaf = ones.clone().requires_grad_(True)
    # What autograd hands LLTMFunction.backward, without autograd around it.
    saved = types.SimpleNamespace(
        saved_tensors=(X, weights.detach(), gates, new_cell), bias_shape=bias.shape,
        needs_input_grad=tuple(tensor.requires_grad for tensor in inputs.arguments()))
    rows = [
        ("check_arguments (validation)", lambda: function.check_arguments(*inputs.arguments())),
        ("torch.cat((old_h, input))", lambda: torch.cat((h, input), dim=1)),
        ("F.linear(X, weights, bias) (addmm)",
         lambda: torch.nn.functional.linear(X, weights.detach(), bias.detach())),
        ("2 x torch.empty_like (outputs)", lambda: (torch.empty_like(cell), torch.empty_like(cell))),
        ("4 x ffi.cast(data_ptr())",
         lambda: [ffi.cast("void *", t.data_ptr()) for t in (gates, cell, new_h, new_cell)]),
        ("C forward pass alone (shim + launch)", c_pass),
        ("ops.forward (allocate, cast, call)", lambda: ops.forward(gates, cell)),
        ("torch.ops.lltm_ffi.forward_pass (registered op)",
         lambda: torch.ops.lltm_ffi.forward_pass(gates, cell)),
        ("autograd.Function.apply of a no-op", lambda: _Identity.apply(*inputs.arguments())),
        ("lltm_ffi.lltm forward", lambda: lltm_ffi.lltm(*inputs.arguments())),
        ("reference forward", lambda: reference.lltm(*inputs.arguments())),
        ("ops.backward (allocate, cast, call)",
         lambda: ops.backward(grad_h, grad_cell, new_cell, gates)),
        ("torch.ops.lltm_ffi.backward_pass (registered op)",
         lambda: torch.ops.lltm_ffi.backward_pass(grad_h, grad_cell, new_cell, gates)),
        ("LLTMFunction.backward body (pass, 2 x mm, sum)",
         lambda: function.LLTMFunction.backward.__wrapped__(saved, grad_h, grad_cell)),
        ("lltm_ffi forward + backward step", step(lltm_ffi.lltm)),
        ("reference forward + backward step", step(reference.lltm)),
        ("floor cell forward + backward step (no LLTM work)", step(floor_cell)),
    ]
    if device.type == "cuda":
        rows.insert(5, ("current stream lookup", lambda: _extension._current_raw_stream(device.index)))
    table = [[name, f"{host_microseconds(function_, calls=300 if 'step' in name else 2000):.2f}"]
             for name, function_ in rows]
    synchronized = [
        ("one tiny op, timed between synchronisations", [tiny_forward]),
        ("the same, right after a tiny backward",
         [tiny_forward, lambda: (tiny_leaf * 2).backward()]),
        ("lltm_ffi forward, timed as --compare does", [lambda: lltm_ffi.lltm(*inputs.arguments()),
                                                        step(lltm_ffi.lltm)]),
        ("reference forward, timed as --compare does", [lambda: reference.lltm(*inputs.arguments()),
                                                         step(reference.lltm)]),
        ("floor cell forward, timed as --compare does", [lambda: floor_cell(*inputs.arguments()),
                                                          step(floor_cell)]),
        ("lltm_ffi backward, timed as --compare does", backward_steps(lltm_ffi.lltm)),
        ("reference backward, timed as --compare does", backward_steps(reference.lltm)),
        ("floor cell backward, timed as --compare does", backward_steps(floor_cell)),
    ]
    table += [[name, f"{synchronized_microseconds(steps):.2f}"] for name, steps in synchronized]
    return table, len(synchronized)


def run_overhead(args, device, dtype):
    note("timing the pieces of one call...")
    rows, synchronized_count = overhead_rows(device, dtype)
    lines = ["# Where the host time of one LLTM call goes (16x32x128)", ""]
    lines += environment_lines(device, dtype)
    lines += ["", "Host microseconds per call (median of 7 batches of back-to-back calls; "
              f"the last {synchronized_count} rows: median of 300 calls each timed between two "
              "synchronisations, after the untimed steps --compare runs between them).",
              ""]
    lines.append(markdown_table(["piece", "us"], [":---", "---:"], rows))
    print("\n".join(lines))


# --- Under autocast ------------------------------------------------------------------------------

AUTOCAST_SIZES = (Size(256, 256, 512), Size(4096, 1024, 2048))


def event_microseconds(function, repeats=100):
    """Median GPU microseconds of function() by CUDA events, after a warm-up."""
    for _ in range(WARMUP_RUNS):
        function()
    pairs = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in pairs) * 1e3


def run_autocast(args, device):
    rows = []
    for size in AUTOCAST_SIZES:
        inputs = CellInputs.random(size, torch.float32, device)
        input, weights, bias, h, cell = (tensor.detach() for tensor in inputs.arguments())
        X16 = torch.cat((h, input), dim=1).bfloat16()
        weights16, bias16 = weights.bfloat16(), bias.bfloat16()
        gates16 = torch.nn.functional.linear(X16, weights16, bias16)
        gates32 = gates16.float()
        pieces = {
            "bf16 matrix product (F.linear)":
                lambda: torch.nn.functional.linear(X16, weights16, bias16),
            "gates bf16 -> float32 (the cast)": lambda: gates16.float(),
            "float32 forward pass": lambda: ops.forward(gates32, cell),
        }
        with torch.no_grad():
            def under_autocast():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    return lltm_ffi.lltm(input, weights, bias, h, cell)
            pieces["whole forward under autocast"] = under_autocast
            pieces["whole forward, float32"] = lambda: lltm_ffi.lltm(input, weights, bias, h, cell)
            for name, function_ in pieces.items():
                rows.append([f"{size.batch}x{size.features}x{size.state}", name,
                             f"{event_microseconds(function_):.1f}"])
    lines = ["# The LLTM forward under bf16 autocast: where the GPU time goes", ""]
    lines += environment_lines(device, torch.bfloat16)
    lines += ["", "GPU microseconds (CUDA events, median of 100 after warm-up), no autograd.", ""]
    lines.append(markdown_table(["size (BxFxS)", "piece", "us"], [":---", ":---", "---:"], rows))
    print("\n".join(lines))


# --- A sequence of steps, eager and as one CUDA graph ----------------------------------------

SEQUENCE_SHAPE = (16, 16, 32, 128)  # steps, batch, features, state


def run_sequence(args, device, dtype):
    steps, batch, features, state = SEQUENCE_SHAPE
    runs = args.runs or 200
    model = lltm_ffi.LLTM(features, state, device=device, dtype=dtype)
    sequence = torch.randn(steps, batch, features, device=device, dtype=dtype)
    h0 = torch.zeros(batch, state, device=device, dtype=dtype)

    def train_step(cell):
        h, c = h0, h0
        for step in range(steps):
            h, c = cell(sequence[step], model.weights, model.bias, h, c)
        backpropagate(h, c)

    def eager(cell):
        return lambda: train_step(cell)

    # Capture one whole forward and backward over the sequence; replay it.
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            train_step(lltm_ffi.lltm)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    model.zero_grad(set_to_none=False)
    with torch.cuda.graph(graph):
        train_step(lltm_ffi.lltm)

    candidates = {"reference, eager": eager(reference.lltm), "lltm_ffi, eager": eager(lltm_ffi.lltm),
                  "lltm_ffi, CUDA graph replay": graph.replay}
    for function_ in candidates.values():
        for _ in range(WARMUP_RUNS):
            function_()
    times = {name: [] for name in candidates}
    synchronize = torch.cuda.synchronize
    for _ in range(runs):
        for name, function_ in candidates.items():
            times[name].append(timed(function_, synchronize)[1])
    rows = [[name, f"{statistics.median(values) * 1e6 / steps:.1f}",
             f"{min(values) * 1e6 / steps:.1f}"] for name, values in times.items()]
    lines = [f"# LLTM over a sequence: {steps} steps of batch {batch}, {features} features, "
             f"state {state}, forward and backward", ""]
    lines += environment_lines(device, dtype)
    lines += ["", f"Microseconds per step (whole sequence timed between synchronisations, "
              f"divided by {steps}; {runs} runs, interleaved).", ""]
    lines.append(markdown_table(["implementation", "median us/step", "min us/step"],
                                [":---", "---:", "---:"], rows))
    print("\n".join(lines))


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    device = torch.device("cuda" if args.cuda else "cpu")
    dtype = torch.float64 if args.double else torch.float32
    try:
        if args.compare:
            run_compare(args, device, dtype)
        elif args.kernels:
            run_kernels(args, device, dtype)
        elif args.overhead:
            run_overhead(args, device, dtype)
        elif args.sequence:
            run_sequence(args, device, dtype)
        elif args.autocast:
            run_autocast(args, device)
        else:
            run_single(args, device, dtype)
    except Disagreement as error:
        print(f"benchmark.py: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
