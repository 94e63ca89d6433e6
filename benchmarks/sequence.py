"""--sequence: forward and backward of a loss over every step's output,
per time step: a Python loop of the reference cell, a loop of lltm_ffi.lltm,
that loop's training step captured as one CUDA graph and replayed,
lltm_sequence (the loop in C), cuDNN's nn.LSTM and nn.GRU, and a floor (an
autograd.Function that does no work), interleaved; on a GPU in full
precision the forward alone of the last four; then lltm_sequence's per-step
kernels alone. On the CPU (without -c): the same but the graph replay, the
forward alone and the kernels, at the CPU's own sizes. Then two
layers, bidirectional: LLTMSequence against nn.LSTM and nn.GRU of the same
configuration on the same batch, and on a packed batch against nn.GRU on
the same PackedSequence.

With --half or --autocast (benchmarks/precision.py) the models run in that
precision: lltm_sequence, nn.LSTM and nn.GRU, and lltm_sequence in float32
beside them, at more sizes on a GPU; the two-layer table likewise."""

import copy
import math
import statistics
from pathlib import Path

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

import lltm_ffi
from lltm_ffi import reference

from . import harness, precision as precisions

SEQUENCE_SHAPES = ((64, 16, 32, 128), (1024, 16, 32, 128), (64, 256, 256, 512),
                   (1024, 16, 768, 768), (16, 4096, 1024, 2048))
# --half and --autocast on a GPU: those and a layer of 1024.
REDUCED_SEQUENCE_SHAPES = ((64, 16, 32, 128), (1024, 16, 32, 128), (64, 256, 256, 512),
                           (32, 64, 512, 1024), (1024, 16, 768, 768), (16, 4096, 1024, 2048))
# An autograd.Function that does no work, timed beside the others in full
# precision: the least any implementation through autograd can take.
FLOOR = "floor: autograd.Function, no work"
FLOOR_NOTE = (
    f" {FLOOR}: the outputs allocated forward, the weights' and bias's gradients backward, "
    "nothing computed; no implementation that reaches autograd through an autograd.Function "
    "takes less.")
# Past this many steps the Python loops of the cell are left out: their host
# time per step is the same at every length.
LOOPED_STEPS = 64
DEFAULT_RUNS = {128: 100, 512: 50, 768: 10, 1024: 20, 2048: 5}  # by state size
# On the CPU: the demo's sequences and the smallest above; with --half and
# --autocast also a layer of 512, where torch's bfloat16 products run on
# AMX (lltm_sequence's too, where the CPU has it).
CPU_SEQUENCE_SHAPES = ((20, 64, 8, 64), (64, 16, 32, 128))
CPU_REDUCED_SEQUENCE_SHAPES = CPU_SEQUENCE_SHAPES + ((20, 128, 512, 512),)
CPU_DEFAULT_RUNS = 100


def cell_loop(cell, module, inputs):
    """Every step's output of `cell` run over `inputs` from a zero state."""
    h = c = inputs.new_zeros(inputs.shape[1], module.state_size)
    outputs = []
    for step in inputs:
        h, c = cell(step, module.weights_l0, module.bias_l0, h, c)
        outputs.append(h)
    return torch.stack(outputs)


def captured(train_step, device):
    """train_step as one CUDA graph (after warm-up on a side stream); its replay."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            train_step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        train_step()
    return graph.replay


def training_step(outputs_of, precision, device, backward=True):
    """Every implementation's training step: the same loss, the sum of every
    step's output (what nn.GRU and nn.LSTM return as their outputs), in
    float32 for a half output; the forward in `precision`'s context.
    backward=False: the forward and the loss alone, the graph recorded and
    dropped."""
    def step():
        with precision.forward(device):
            outputs = outputs_of()
        loss = precisions.loss(outputs)
        if backward:
            loss.backward()
    return step


def candidates(shape, device, precision):
    """{name: training step} at `shape`: in full precision the cell's loops
    too; in a reduced one lltm_sequence in float32 beside the others, and on
    the CPU the reference's loop in that precision; then peers() of the same
    module and inputs."""
    steps, batch, features, state = shape
    inputs = torch.randn(steps, batch, features, device=device, dtype=precision.dtype)
    module = lltm_ffi.LLTMSequence(features, state, device=device, dtype=precision.dtype)
    cuda = device.type == "cuda"
    if precision.kind == "full" and steps > LOOPED_STEPS:
        functions = {}
    elif precision.kind == "full":
        loop = training_step(lambda: cell_loop(lltm_ffi.lltm, module, inputs), precision, device)
        functions = {"reference, Python loop": training_step(
                         lambda: cell_loop(reference.lltm, module, inputs), precision, device),
                     "lltm_ffi.lltm, Python loop": loop}
        if cuda:
            functions["lltm_ffi.lltm loop, CUDA graph replay"] = captured(loop, device)
    else:
        float32 = copy.deepcopy(module).float()
        float32_inputs = inputs.float()
        functions = {"lltm_sequence, float32": training_step(
            lambda: float32(float32_inputs)[0], precisions.Precision.full(torch.float32), device)}
        if not cuda and steps <= LOOPED_STEPS:
            functions["reference, Python loop"] = training_step(
                lambda: cell_loop(reference.lltm, module, inputs), precision, device)
    return {**functions, **peers(module, inputs, precision)}


def peers(module, inputs, precision, backward=True):
    """{name: training step (backward=False: its forward alone)} of the
    LLTMSequence `module`, nn.LSTM and nn.GRU of its sizes and, in full
    precision, the floor, on `inputs`."""
    device, dtype = inputs.device, inputs.dtype
    lstm = torch.nn.LSTM(module.input_features, module.state_size, device=device, dtype=dtype)
    gru = torch.nn.GRU(module.input_features, module.state_size, device=device, dtype=dtype)
    cuda = device.type == "cuda"
    functions = {}
    for name, model in (("lltm_sequence", module), ("nn.LSTM", lstm), ("nn.GRU", gru)):
        functions[f"{name} (cuDNN)" if cuda and model is not module else name] = training_step(
            lambda model=model: model(inputs)[0], precision, device, backward)
    if precision.kind == "full":
        # Parameters of its own, whose gradients (never written) no other row reads.
        weights, bias = (torch.nn.Parameter(parameter.detach().clone())
                         for parameter in (module.weights_l0, module.bias_l0))
        functions[FLOOR] = training_step(lambda: harness.floor_sequence(inputs, weights, bias),
                                         precision, device, backward)
    return functions


# Two layers, both directions, on the CPU and the GPU alike.
LAYERED_SHAPES = ((64, 16, 32, 128), (64, 256, 256, 512))
LAYERED_RUNS = {"cuda": {128: 100, 512: 50}, "cpu": {128: 20, 512: 3}}  # by state size
LAYERED_HEADING = "Two layers, bidirectional"


def spread_lengths(steps, batch):
    """`batch` lengths spread evenly over [steps / 2, steps], longest first."""
    return [round(steps - steps / 2 * index / max(batch - 1, 1)) for index in range(batch)]


def layered_candidates(shape, device, precision):
    """{name: training step} of a two-layer bidirectional LLTMSequence,
    nn.LSTM and nn.GRU on one dense batch, and of LLTMSequence and nn.GRU on
    that batch packed, its lengths spread over [T/2, T]: the loss the sum of
    every output, in `precision`."""
    steps, batch, features, state = shape
    dtype = precision.dtype
    configuration = {"num_layers": 2, "bidirectional": True, "device": device, "dtype": dtype}
    models = {"LLTMSequence": lltm_ffi.LLTMSequence(features, state, **configuration),
              "nn.LSTM": torch.nn.LSTM(features, state, **configuration),
              "nn.GRU": torch.nn.GRU(features, state, **configuration)}
    inputs = torch.randn(steps, batch, features, device=device, dtype=dtype)
    packed = pack_padded_sequence(inputs, torch.tensor(spread_lengths(steps, batch)))

    def step(model, batch_input):
        def outputs():
            output = model(batch_input)[0]
            return output.data if isinstance(output, PackedSequence) else output
        return training_step(outputs, precision, device)

    cudnn = " (cuDNN)" if device.type == "cuda" else ""
    functions = {name + ("" if name == "LLTMSequence" else cudnn): step(model, inputs)
                 for name, model in models.items()}
    for name in ("LLTMSequence", "nn.GRU"):
        label = name + ("" if name == "LLTMSequence" else cudnn)
        functions[f"{label}, packed"] = step(models[name], packed)
    return functions


def time_candidates(shape, functions, runs, warm_up_runs, synchronize, failures, table=""):
    """Each candidate's training step at `shape`, interleaved after
    `warm_up_runs` untimed ones: its rows [size, name, median, min] of
    microseconds per time step, its median ({name: us}) and its seconds.
    A peer of torch's (nn.LSTM, nn.GRU) that raises in its warm-up (one torch
    cannot run in this precision on this device, say) is not timed: its row
    says failed, its median is NaN, and `failures` gets a line saying why
    (`table` after its name)."""
    size, steps = "x".join(map(str, shape)), shape[0]
    working = {}
    for name, function in functions.items():
        try:
            harness.warm_up(function, warm_up_runs)
        except Exception as error:
            if not name.startswith("nn."):
                raise
            failures.append(f"- {name}{table} at {size} FAILED, marked failed below: "
                            f"{type(error).__name__}: {str(error).splitlines()[0]}")
            continue
        working[name] = function
    seconds = harness.interleaved(
        working, runs, lambda function: harness.wall_clock(function, synchronize)[1])
    medians = {name: harness.microseconds(statistics.median(seconds[name])) / steps
               if name in seconds else math.nan for name in functions}
    rows = [[size, name, *((f"{harness.microseconds(statistic(seconds[name])) / steps:.1f}"
                            for statistic in (statistics.median, min)) if name in seconds
                           else ("failed", "failed"))]
            for name in functions]
    return rows, medians, seconds


FORWARD_HEADING = "The forward alone"


def forward_rows(args, device, precision, synchronize, failures):
    """The forward-alone table's rows: lltm_sequence, nn.LSTM, nn.GRU and
    the floor at every size of the one-layer table, interleaved."""
    rows = []
    for shape in shapes_of(device, precision):
        steps, batch, features, state = shape
        inputs = torch.randn(steps, batch, features, device=device, dtype=precision.dtype)
        module = lltm_ffi.LLTMSequence(features, state, device=device, dtype=precision.dtype)
        rows += time_candidates(shape, peers(module, inputs, precision, backward=False),
                                args.runs or DEFAULT_RUNS[state], 3, synchronize, failures,
                                f" ({FORWARD_HEADING.lower()})")[0]
    return rows


def layered_rows(args, device, precision, synchronize, failures):
    """The two-layer bidirectional table's rows: microseconds per time step,
    median and minimum, each shape's candidates interleaved."""
    rows = []
    for shape in LAYERED_SHAPES:
        state = shape[3]
        runs = args.runs or LAYERED_RUNS[device.type].get(state, CPU_DEFAULT_RUNS)
        rows += time_candidates(shape, layered_candidates(shape, device, precision), runs, 2,
                                synchronize, failures, f" ({LAYERED_HEADING.lower()})")[0]
    return rows


PROFILED_STEPS = 5


# Words in the names of cuBLAS's matrix-product kernels (its split-K
# reductions aside).
PRODUCT_KERNELS = ("gemm", "nvjet", "xmma", "cutlass")
# The recurrence's path, by the name of the kernel that runs it.
PATHS = (("cluster_kernel", "cluster"), ("cluster_mma_kernel", "cluster"),
         ("persistent_kernel", "persistent"))


def profile_kernels(train_step, steps):
    """{kernel name: (GPU microseconds, launches)} over PROFILED_STEPS
    training steps, by torch.profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
        for _ in range(PROFILED_STEPS):
            train_step()
        torch.cuda.synchronize()
    kernels = {}
    for event in profiler.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            microseconds, launches = kernels.get(event.name, (0.0, 0))
            kernels[event.name] = (microseconds + event.device_time, launches + 1)
    return kernels


def lltm_training_step(shape, device, precision):
    """A training step of an LLTMSequence of `shape`, warmed up, for kernel_row."""
    steps, batch, features, state = shape
    inputs = torch.randn(steps, batch, features, device=device, dtype=precision.dtype)
    module = lltm_ffi.LLTMSequence(features, state, device=device, dtype=precision.dtype)
    function = training_step(lambda: module(inputs)[0], precision, device)
    harness.warm_up(function, 3)
    return function


def kernel_row(shape, function, step_microseconds):
    """The recurrence's path; the GPU time per time step of the kernels
    lltm_sequence runs for it (its own, named lltm_sequence..., and any
    launched at least once a time step: the cuBLAS products of its C loops),
    their share of a step and the FLOP rate of the recurrent products they
    compute (forward h W^T and backward d_gates W: 12 * batch * state^2 a
    time step); and where cuBLAS computes every product, the rate of all of
    them (3 products each way of 2 * batch * 3 * state * (state + features)
    a time step) over their kernels' time."""
    steps, batch, features, state = shape
    kernels = profile_kernels(function, steps)
    per_step = sum(microseconds for name, (microseconds, launches) in kernels.items()
                   if "lltm_sequence" in name or launches >= steps * PROFILED_STEPS) / (
        PROFILED_STEPS * steps)
    path = next((label for word, label in PATHS if any(word in name for name in kernels)),
                "cuBLAS loop")
    products = "–"
    if path == "cuBLAS loop":
        product_microseconds = sum(
            microseconds for name, (microseconds, _) in kernels.items()
            if any(word in name for word in PRODUCT_KERNELS) and "splitK" not in name)
        flops = 18 * steps * batch * state * (state + features) * PROFILED_STEPS
        products = f"{flops / product_microseconds / 1e6:.1f}"
    return ["x".join(map(str, shape)), path, f"{per_step:.1f}",
            f"{per_step / step_microseconds:.0%}",
            f"{12 * batch * state ** 2 / per_step / 1e6:.2f}", products]


def run(args, device, dtype):
    """The table at the chosen precision (-d, --half, --autocast); the
    caller's TF32 settings come back after."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32
    try:
        return _run(args, device, precisions.Precision.of(args, dtype))
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def shapes_of(device, precision):
    """The sizes of the one-layer table."""
    if device.type != "cuda":
        return CPU_SEQUENCE_SHAPES if precision.kind == "full" else CPU_REDUCED_SEQUENCE_SHAPES
    return SEQUENCE_SHAPES if precision.kind == "full" else REDUCED_SEQUENCE_SHAPES


def _run(args, device, precision):
    synchronize = harness.synchronizer(device)
    cuda = device.type == "cuda"
    rows, medians, failures, lltm_medians = [], {}, [], []
    shapes = shapes_of(device, precision)
    for shape in shapes:
        state = shape[3]
        runs = args.runs or (DEFAULT_RUNS[state] if cuda else CPU_DEFAULT_RUNS)
        functions = candidates(shape, device, precision)
        shape_rows, shape_medians, _ = time_candidates(shape, functions, runs, 3, synchronize,
                                                       failures)
        rows += shape_rows
        for name, median in shape_medians.items():
            medians.setdefault(name, []).append(median)
        if "lltm_sequence" in shape_medians:
            lltm_medians.append((shape, shape_medians["lltm_sequence"]))
        del functions
    full_cuda = cuda and precision.kind == "full"
    forward = forward_rows(args, device, precision, synchronize, failures) if full_cuda else []
    layered = layered_rows(args, device, precision, synchronize, failures)
    # Profiled after every timed run: a profiling session leaves CUPTI
    # attached, and the host's launches after it take longer.
    kernel_rows = [kernel_row(shape, lltm_training_step(shape, device, precision), median)
                   for shape, median in lltm_medians] if cuda else []
    owner = "cuDNN's" if cuda else "PyTorch's"
    setting = (f"{precision.describe()}; " if precision.kind != "full"
               else "TF32 allowed for cuBLAS and cuDNN; " if args.tf32
               else "strict float32 (TF32 off for cuBLAS and cuDNN); " if cuda else "")
    paragraphs = [
        f"Microseconds per time step ({setting}the whole training step timed"
        f"{' between synchronisations' if cuda else ''} and divided by the steps; interleaved "
        f"runs).{FLOOR_NOTE if precision.kind == 'full' else ''}",
        harness.markdown_table(["T x B x F x S", "implementation", "median us/step",
                                "min us/step"], rows, text_columns=2)]
    if full_cuda:
        paragraphs += [
            f"{FORWARD_HEADING}: the same training step's forward and loss, no backward (the "
            "graph autograd records is dropped), timed as above:",
            harness.markdown_table(["T x B x F x S", "implementation", "median us/step",
                                    "min us/step"], forward, text_columns=2)]
    if cuda:
        paragraphs += kernel_paragraphs(kernel_rows)
    suffix = precision.flag.removeprefix("--").replace(" ", "_")
    output = args.output or Path("bench_out") / (
        f"sequence_{device.type}{'_tf32' if args.tf32 else ''}{'_' + suffix if suffix else ''}.md")
    output.parent.mkdir(parents=True, exist_ok=True)
    plot = output.with_suffix(".png")
    if harness.write_bar_chart(
            plot, f"LLTM over a sequence, {harness.device_description(device)}, "
                  f"{'TF32' if args.tf32 else precision.name}",
            ["x".join(map(str, shape)) for shape in shapes],
            {"training step per time step": {name: values for name, values in medians.items()
                                             if len(values) == len(shapes)}},
            "steps x batch x features x state",
            "median us per time step"):
        paragraphs.append(f"![median us per time step]({plot.name})")
    else:
        plot = None
        harness.note("matplotlib is not importable: no plot written")
    paragraphs += [
        f"{LAYERED_HEADING} (num_layers=2, bidirectional=True): LLTMSequence against {owner} "
        "nn.LSTM and nn.GRU of the same configuration on one batch, then on that batch packed "
        "(pack_padded_sequence, lengths spread evenly over [T/2, T]) against nn.GRU on the same "
        "PackedSequence; the loss the sum of every output, microseconds per time step (of T) "
        "as above.",
        harness.markdown_table(["T x B x F x S", "implementation", "median us/step",
                                "min us/step"], layered, text_columns=2)]
    text = harness.report(
        f"LLTM over a sequence against {owner} LSTM and GRU: forward and backward of the sum "
        "of every step's output", device, precision.name, *paragraphs, notes=failures)
    print(text)
    output.write_text(text + "\n")
    harness.note(f"wrote {output}" + (f" and {plot}" if plot else ""))


def kernel_paragraphs(kernel_rows):
    return [
        "lltm_sequence's recurrence: its path (the cluster kernels, the persistent kernels or "
        "the cuBLAS loop), its per-step kernels (the recurrence's own kernels and the cuBLAS "
        f"products its C loops launch each step; GPU time by torch.profiler over {PROFILED_STEPS} "
        "training steps), their share of the median step above, and the FLOP rate of the "
        "recurrent products they compute (12 x batch x state^2 a step, forward and backward); "
        "where cuBLAS computes every product, the rate of all of them (18 x batch x state x "
        "(state + features) a step) over its kernels' time:",
        harness.markdown_table(["T x B x F x S", "path", "per-step kernels us/step",
                                "share of the step", "recurrent products TFLOP/s",
                                "all products TFLOP/s"],
                               kernel_rows, text_columns=2)]
