"""--sequence: an LLTM stepped over a (steps, batch, features) sequence,
forward and backward of the whole sequence, eager against one CUDA graph of
that training step replayed."""

import statistics

import torch

import lltm_ffi
from lltm_ffi import reference

from . import harness

SEQUENCE_SHAPE = (16, 16, 32, 128)  # steps, batch, features, state
DEFAULT_RUNS = 200


def run(args, device, dtype):
    steps, batch, features, state = SEQUENCE_SHAPE
    runs = args.runs or DEFAULT_RUNS
    model = lltm_ffi.LLTM(features, state, device=device, dtype=dtype)
    sequence = torch.randn(steps, batch, features, device=device, dtype=dtype)
    h0 = torch.zeros(batch, state, device=device, dtype=dtype)

    def train_step(cell):
        h, c = h0, h0
        for step in range(steps):
            h, c = cell(sequence[step], model.weights, model.bias, h, c)
        harness.loss(h, c).backward()

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

    candidates = {"reference, eager": lambda: train_step(reference.lltm),
                  "lltm_ffi, eager": lambda: train_step(lltm_ffi.lltm),
                  "lltm_ffi, CUDA graph replay": graph.replay}
    for function in candidates.values():
        harness.warm_up(function)
    synchronize = harness.synchronizer(device)
    seconds = harness.interleaved(
        candidates, runs, lambda function: harness.wall_clock(function, synchronize)[1])
    rows = [[name, *(f"{harness.microseconds(statistic(values)) / steps:.1f}"
                     for statistic in (statistics.median, min))]
            for name, values in seconds.items()]
    print(harness.report(f"LLTM over a sequence: {steps} steps of batch {batch}, {features} "
                         f"features, state {state}, forward and backward", device, dtype,
                         f"Microseconds per step (whole sequence timed between "
                         f"synchronisations, divided by {steps}; {runs} runs, interleaved).",
                         harness.markdown_table(["implementation", "median us/step",
                                                 "min us/step"], rows)))
