"""--sequence: forward and backward of a loss over every step of a sequence,
per time step: a Python loop of the reference cell, a loop of lltm_ffi.lltm,
that loop's training step captured as one CUDA graph and replayed,
lltm_sequence (the loop in C), and cuDNN's nn.LSTM and nn.GRU, interleaved."""

import statistics

import torch

import lltm_ffi
from lltm_ffi import reference

from . import harness

SEQUENCE_SHAPES = ((64, 16, 32, 128), (64, 256, 256, 512), (16, 4096, 1024, 2048))
DEFAULT_RUNS = {128: 100, 512: 50, 2048: 5}  # by state size


def cell_loop(cell, module, inputs):
    h = c = inputs.new_zeros(inputs.shape[1], module.state_size)
    outputs = []
    for step in inputs:
        h, c = cell(step, module.weights, module.bias, h, c)
        outputs.append(h)
    return torch.stack(outputs), c


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


def candidates(shape, device, dtype):
    steps, batch, features, state = shape
    inputs = torch.randn(steps, batch, features, device=device, dtype=dtype)
    module = lltm_ffi.LLTMSequence(features, state, device=device, dtype=dtype)
    lstm = torch.nn.LSTM(features, state, device=device, dtype=dtype)
    gru = torch.nn.GRU(features, state, device=device, dtype=dtype)

    def lltm_step(run):
        return lambda: (lambda outputs, c_n: (outputs.sum() + c_n.sum()).backward())(*run())

    def cudnn_step(rnn):
        return lambda: rnn(inputs)[0].sum().backward()

    loop = lltm_step(lambda: cell_loop(lltm_ffi.lltm, module, inputs))
    return {"reference, Python loop": lltm_step(lambda: cell_loop(reference.lltm, module,
                                                                   inputs)),
            "lltm_ffi.lltm, Python loop": loop,
            "lltm_ffi.lltm loop, CUDA graph replay": captured(loop, device),
            "lltm_sequence": lltm_step(lambda: (lambda o, s: (o, s[1]))(*module(inputs))),
            "nn.LSTM (cuDNN)": cudnn_step(lstm),
            "nn.GRU (cuDNN)": cudnn_step(gru)}


def run(args, device, dtype):
    """The table at the chosen precision; the caller's TF32 settings come back after."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32
    try:
        return _run(args, device, dtype)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _run(args, device, dtype):
    synchronize = harness.synchronizer(device)
    rows = []
    for shape in SEQUENCE_SHAPES:
        steps, state = shape[0], shape[3]
        runs = args.runs or DEFAULT_RUNS[state]
        functions = candidates(shape, device, dtype)
        for function in functions.values():
            harness.warm_up(function, 3)
        seconds = harness.interleaved(
            functions, runs, lambda function: harness.wall_clock(function, synchronize)[1])
        size = "x".join(map(str, shape))
        rows += [[size, name, *(f"{harness.microseconds(statistic(values)) / steps:.1f}"
                                for statistic in (statistics.median, min))]
                 for name, values in seconds.items()]
    precision = ("TF32 allowed for cuBLAS and cuDNN" if args.tf32
                 else "strict float32 (TF32 off for cuBLAS and cuDNN)")
    print(harness.report(
        "LLTM over a sequence against cuDNN's LSTM and GRU: forward and backward of a loss "
        "over every step", device, dtype,
        f"Microseconds per time step ({precision}; the whole training step timed between "
        f"synchronisations and divided by the steps; interleaved runs).",
        harness.markdown_table(["T x B x F x S", "implementation", "median us/step",
                                "min us/step"], rows, text_columns=2)))
