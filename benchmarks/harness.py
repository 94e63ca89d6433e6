"""What the benchmark modes share: sizes, inputs and cells, one wall-clock timer,
one CUDA-event timer, the interleaved runs, tables, charts and the
environment lines each report opens with."""

import platform
import random
import shlex
import statistics
import sys
import time
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path

import torch

import lltm_ffi
from lltm_ffi import reference

WARMUP_RUNS = 20
COMPILE_WARMUP_RUNS = 50  # its first calls compile the forward and the backward graph


@dataclass(frozen=True)
class Size:
    batch: int
    features: int
    state: int

    def __str__(self):
        return f"{self.batch}x{self.features}x{self.state}"


TUTORIAL_SIZE = Size(16, 32, 128)


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
        module = lltm_ffi.LLTM(size.features, size.state, device=device, dtype=dtype)
        return cls(module, *(torch.randn(size.batch, columns, dtype=dtype, device=device)
                             for columns in (size.features, size.state, size.state)))

    def arguments(self):
        return self.input, self.module.weights, self.module.bias, self.h, self.cell


# --- The cells ----------------------------------------------------------------------------

IMPLEMENTATIONS = ("py", "ffi", "compile")


def make_implementation(name):
    """The cell function called `name`; all three are called without nn.Module's
    call overhead, so that it does not blur the small sizes."""
    if name == "py":
        return reference.lltm
    if name == "ffi":
        return lltm_ffi.lltm
    return torch.compile(reference.lltm, dynamic=False, fullgraph=True)


def floor_cell(input, weights, bias, old_h, old_cell):
    """No LLTM work at all: timed like the implementations, it is the least any
    cell can take under this timing, and floor/py the smallest ratio any
    implementation can reach on the machine."""
    return weights.sum(), bias.sum()


class _SequenceFloor(torch.autograd.Function):
    """A sequence that does no LLTM work: its forward allocates the outputs,
    its backward the weights' and the bias's gradients, and nothing else.
    Timed like lltm_sequence, it is the least that any op reaching autograd
    through an autograd.Function can take: the module call, the Function,
    the loss, autograd's engine and the synchronisations."""

    @staticmethod
    def forward(inputs, weights, bias):
        return inputs.new_empty(inputs.shape[0], inputs.shape[1], weights.shape[0] // 3)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[1:])

    @staticmethod
    def backward(ctx, grad_outputs):
        weights, bias = ctx.saved_tensors
        return None, torch.empty_like(weights), torch.empty_like(bias)


def floor_sequence(inputs, weights, bias):
    """Outputs (steps, batch, state) of no work (_SequenceFloor)."""
    return _SequenceFloor.apply(inputs, weights, bias)


def loss(new_h, new_cell):
    """The tutorial's loss: its backward is the one every mode times."""
    return new_h.sum() + new_cell.sum()


# --- Timing -------------------------------------------------------------------------------

def synchronizer(device):
    return torch.cuda.synchronize if device.type == "cuda" else lambda: None


def wall_clock(function, synchronize, calls=1):
    """function()'s last result and the seconds per call of `calls` calls back
    to back, timed with time.perf_counter between two device synchronisations."""
    synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        result = function()
    synchronize()
    return result, (time.perf_counter() - start) / calls


def cuda_event_microseconds(functions, runs):
    """{name: median GPU microseconds of functions[name]()} by CUDA events around
    each call, after WARMUP_RUNS untimed rounds; the functions take turns."""
    def recorded(function):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        return start, end

    warm_up(lambda: [function() for function in functions.values()])
    events = interleaved(functions, runs, recorded)
    torch.cuda.synchronize()
    return {name: statistics.median(start.elapsed_time(end) for start, end in pairs) * 1e3
            for name, pairs in events.items()}


def warm_up(function, runs=None):
    """function() called WARMUP_RUNS times (or `runs`), untimed."""
    for _ in range(WARMUP_RUNS if runs is None else runs):
        function()


def interleaved(functions, runs, measure, label=None):
    """{name: [measure(functions[name]) for each run]}. Each run measures every
    function once, in an order of its own (shuffled, the same every time the
    benchmark runs), so that drift (clocks, temperature, other load) hits all
    of them alike and no function always follows the same one: what runs
    just before a call can slow it (on the lent H100, a call right after a
    replayed CUDA graph of a whole training step ran its host work up to 60%
    slower). With a label, 'label: done/total' is redrawn on stderr when it
    is a terminal."""
    names = list(functions)
    order = random.Random(0)
    results = {name: [] for name in names}
    progress = label is not None and sys.stderr.isatty()
    for run in range(runs):
        order.shuffle(names)
        for name in names:
            results[name].append(measure(functions[name]))
        if progress and ((run + 1) % max(1, runs // 20) == 0 or run + 1 == runs):
            sys.stderr.write(f"\r{label}: {run + 1}/{runs}")
    if progress:
        sys.stderr.write("\r\033[K")
    return results


Timings = namedtuple("Timings", "forward backward")  # the seconds of each timed call


def forward_and_backward(lltm, inputs, synchronize):
    """Seconds of one forward and of one backward, as the tutorial times them."""
    inputs.module.zero_grad()
    (new_h, new_cell), forward = wall_clock(lambda: lltm(*inputs.arguments()), synchronize)
    _, backward = wall_clock(lambda: loss(new_h, new_cell).backward(), synchronize)
    return forward, backward


def warm_up_cell(name, cell, inputs, synchronize):
    warm_up(lambda: forward_and_backward(cell, inputs, synchronize),
            COMPILE_WARMUP_RUNS if name == "compile" else None)


def time_cells(cells, inputs, runs, synchronize, label):
    """{name: Timings} of each cell's forward and backward, interleaved."""
    pairs = interleaved(cells, runs, lambda cell: forward_and_backward(cell, inputs, synchronize),
                        label)
    return {name: Timings(*zip(*timed)) for name, timed in pairs.items()}


# --- Reports ------------------------------------------------------------------------------

def note(message):
    print(message, file=sys.stderr, flush=True)


def microseconds(seconds):
    return seconds * 1e6


def median_us(seconds):
    return microseconds(statistics.median(seconds))


def dtype_name(dtype):
    """float32 for torch.float32; a name given as text stays as it is."""
    return str(dtype).removeprefix("torch.")


def markdown_table(header, rows, text_columns=1):
    """Text in the first `text_columns` columns, left-aligned; numbers after."""
    alignments = [":---"] * text_columns + ["---:"] * (len(header) - text_columns)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(alignments) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def pyplot_or_none():
    """matplotlib.pyplot, drawing into files (Agg); None where matplotlib is
    not importable."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as pyplot
    except ImportError:
        return None
    return pyplot


def write_bar_chart(path, title, group_labels, panels, xlabel, ylabel):
    """One panel of grouped bars (log scale) per {panel title: {series: [value
    per group]}}; False when matplotlib is not importable."""
    pyplot = pyplot_or_none()
    if pyplot is None:
        return False
    figure, axes = pyplot.subplots(1, len(panels), figsize=(6 * len(panels), 4.5),
                                   squeeze=False)
    axes = axes[0]
    for axis, (panel_title, series) in zip(axes, panels.items()):
        width = 0.8 / len(series)
        for index, (name, values) in enumerate(series.items()):
            offset = (index - (len(series) - 1) / 2) * width
            axis.bar([group + offset for group in range(len(group_labels))], values, width,
                     label=name)
        axis.set_xticks(range(len(group_labels)), group_labels)
        label_log_axis(axis, xlabel, ylabel, panel_title)
    axes[0].legend()
    return save_figure(pyplot, figure, path, title, dpi=120)


def label_log_axis(axis, xlabel, ylabel, title):
    """A panel's labels and title, its y axis on a log scale."""
    axis.set_yscale("log")
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title)


def save_figure(pyplot, figure, path, title, dpi):
    """Titles `figure`, lays it out, writes it to `path` and closes it; True."""
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=dpi)
    pyplot.close(figure)
    return True


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


def command_line():
    """The command as typed: the interpreter's name (not the path a shim
    resolved it to) with its own options, the script and its arguments."""
    interpreter, *arguments = sys.orig_argv
    return shlex.join([Path(interpreter).name, *arguments])


def environment_lines(device, dtype):
    return [f"- device: {device_description(device)}",
            f"- torch {torch.__version__}, lltm_ffi {lltm_ffi.__version__}, "
            f"Python {platform.python_version()}",
            f"- dtype: {dtype_name(dtype)}",
            f"- command: `{command_line()}`"]


def report(title, device, dtype, *paragraphs, notes=()):
    """Markdown: the title, the environment lines and `notes` as one list, then
    the paragraphs."""
    header = "\n".join([f"# {title}", "", *environment_lines(device, dtype), *notes])
    return "\n\n".join([header, *paragraphs])
