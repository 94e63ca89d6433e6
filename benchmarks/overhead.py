"""--overhead: where the host's microseconds go in one call at 16x32x128: the
pieces of the path that public names reach (torch, the registered operators,
lltm_ffi.lltm, the reference), called back to back; then single calls timed
between synchronisations, as --compare times them."""

import torch
import torch.nn.functional as F

import lltm_ffi
from lltm_ffi import reference
from lltm_ffi.ops.lltm.cell import backward_pass, forward_pass

from . import harness

PIECE_CALLS = 2000
STEP_CALLS = 300
BATCHES = 7
SYNCHRONIZED_RUNS = 300


class NoOpFunction(torch.autograd.Function):
    """An autograd.Function that does nothing: the cost of .apply itself."""

    @staticmethod
    def forward(ctx, input, weights, bias, old_h, old_cell):
        return old_h, old_cell

    @staticmethod
    def backward(ctx, grad_h, grad_cell):
        return None, None, None, grad_h, grad_cell


def through_operator(input, weights, bias, old_h, old_cell):
    """The forward as torch.compile sees it: cat, the gate product, the operator."""
    gates = F.linear(torch.cat((old_h, input), dim=1), weights, bias)
    return torch.ops.lltm_ffi.forward_pass(gates, old_cell)


def host_microseconds(function, calls, synchronize):
    """Median over BATCHES of the time per call of `calls` calls back to back."""
    return harness.median_us([harness.wall_clock(function, synchronize, calls)[1]
                              for _ in range(BATCHES)])


def back_to_back(inputs):
    """({piece: function}, {step: function}), timed by PIECE_CALLS and STEP_CALLS
    calls back to back."""
    arguments = inputs.arguments()
    input, weights, bias, h, cell = (tensor.detach() for tensor in arguments)
    X = torch.cat((h, input), dim=1)
    gates = F.linear(X, weights, bias)
    new_h, new_cell = torch.ops.lltm_ffi.forward_pass(gates, cell)
    grad_h, grad_cell = torch.randn_like(new_h), torch.randn_like(new_cell)
    parameters = tuple(inputs.module.parameters())

    def forward(lltm):
        return lambda: lltm(*arguments)

    def backward(lltm):
        """autograd.grad of one forward's loss, its graph kept for the next call."""
        loss = harness.loss(*lltm(*arguments))
        return lambda: torch.autograd.grad(loss, parameters, retain_graph=True)

    def step(lltm):
        return lambda: harness.loss(*lltm(*arguments)).backward()

    pieces = {
        "torch.cat((old_h, input))": lambda: torch.cat((h, input), dim=1),
        "F.linear(X, weights, bias) (addmm)": lambda: F.linear(X, weights, bias),
        "2 x torch.empty_like (outputs)": lambda: (torch.empty_like(cell), torch.empty_like(cell)),
        "forward_pass.run (allocate, call C)": lambda: forward_pass.run(gates, cell),
        "torch.ops.lltm_ffi.forward_pass (registered op)":
            lambda: torch.ops.lltm_ffi.forward_pass(gates, cell),
        "autograd.Function.apply of a no-op": forward(NoOpFunction.apply),
        "lltm_ffi.lltm forward": forward(lltm_ffi.lltm),
        "reference forward": forward(reference.lltm),
        "forward through torch.ops.lltm_ffi.forward_pass (cat, F.linear, op)":
            forward(through_operator),
        "backward_pass.run (allocate, call C)":
            lambda: backward_pass.run(grad_h, grad_cell, new_cell, gates),
        "torch.ops.lltm_ffi.backward_pass (registered op)":
            lambda: torch.ops.lltm_ffi.backward_pass(grad_h, grad_cell, new_cell, gates),
        "lltm_ffi backward (torch.autograd.grad of the loss)": backward(lltm_ffi.lltm),
        "reference backward (torch.autograd.grad of the loss)": backward(reference.lltm),
    }
    steps = {
        "lltm_ffi forward + backward step": step(lltm_ffi.lltm),
        "reference forward + backward step": step(reference.lltm),
        "floor cell forward + backward step (no LLTM work)": step(harness.floor_cell),
    }
    return pieces, steps


def synchronized_rows(inputs, synchronize):
    """A tiny op timed alone, with and without a backward before it, then the
    cells' forward and backward as --compare times them, taking turns."""
    ones = torch.ones((), device=inputs.cell.device)
    tiny_leaf = ones.clone().requires_grad_(True)
    tiny_op = {"one tiny op, timed between synchronisations": lambda: None,
               "the same, right after a tiny backward": lambda: (tiny_leaf * 2).backward()}
    rows = []
    for name, before in tiny_op.items():
        times = []
        for _ in range(SYNCHRONIZED_RUNS):
            harness.wall_clock(before, synchronize)
            times.append(harness.wall_clock(lambda: ones * 2, synchronize)[1])
        rows.append((name, times))
    cells = {"lltm_ffi": lltm_ffi.lltm, "reference": reference.lltm,
             "floor cell": harness.floor_cell}
    timings = harness.time_cells(cells, inputs, SYNCHRONIZED_RUNS, synchronize, None)
    rows += [(f"{name} {pass_name}, timed as --compare does", getattr(timings[name], pass_name))
             for pass_name in ("forward", "backward") for name in cells]
    return [[name, f"{harness.median_us(times):.2f}"] for name, times in rows]


def run(args, device, dtype):
    harness.note("timing the pieces of one call...")
    synchronize = harness.synchronizer(device)
    inputs = harness.CellInputs.random(harness.TUTORIAL_SIZE, dtype, device)
    rows = [[name, f"{host_microseconds(function, calls, synchronize):.2f}"]
            for group, calls in zip(back_to_back(inputs), (PIECE_CALLS, STEP_CALLS))
            for name, function in group.items()]
    synchronized = synchronized_rows(inputs, synchronize)
    print(harness.report(f"Where the host time of one LLTM call goes ({harness.TUTORIAL_SIZE})",
                         device, dtype,
                         f"Host microseconds per call (median of {BATCHES} batches of "
                         f"back-to-back calls; the last {len(synchronized)} rows: median of "
                         f"{SYNCHRONIZED_RUNS} calls each timed alone between two "
                         "synchronisations, the cells taking turns as in --compare).",
                         harness.markdown_table(["piece", "us"], rows + synchronized)))
