"""--kernels: the two fused CUDA passes alone (the cell's forward_pass and
backward_pass, called directly as the eager cell calls them), as GB/s of
the bytes each must move, next to a device-to-device copy timed in the same
run."""

import itertools
import math

import torch

from lltm_ffi.ops.lltm.cell import backward_pass, forward_pass

from . import harness

KERNEL_REPEATS = 200
KERNEL_SIZES = ((4096, 2048), (16384, 4096), (65536, 2048))  # batch, state
FALLBACK_L2_BYTES = 50 * 2**20


def kernel_steps(batch, state, dtype, device):
    """{step: function} on one set of inputs: the two passes, and a copy moving
    as many bytes as backward."""
    gates, old_cell, grad_h, grad_cell, new_cell = (
        torch.randn(batch, columns, dtype=dtype, device=device)
        for columns in (3 * state, state, state, state, state))
    copy_source = torch.randn(5 * batch * state, dtype=dtype, device=device)
    copy_target = torch.empty_like(copy_source)
    return {"forward": lambda: forward_pass.run(gates, old_cell),
            "backward": lambda: backward_pass.run(grad_h, grad_cell, new_cell, gates),
            "copy": lambda: copy_target.copy_(copy_source)}


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


def in_turn(functions):
    """A function that calls the next of `functions` at each call, cycling."""
    functions = itertools.cycle(functions)
    return lambda: next(functions)()


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
        harness.note(f"{batch}x{state}: skipped, needs {needed / 1e9:.1f} GB of GPU memory, "
                     f"{free / 1e9:.1f} GB free")
        return None
    harness.note(f"{batch}x{state}: {set_count} input set(s) (L2 {l2_bytes / 1e6:.0f} MB), "
                 f"{harness.WARMUP_RUNS} warm-up, {repeats} repeats...")
    input_sets = [kernel_steps(batch, state, dtype, device) for _ in range(set_count)]
    times = harness.cuda_event_microseconds(
        {name: in_turn([steps[name] for steps in input_sets]) for name in ELEMENTS_MOVED},
        repeats)
    bytes_moved = {name: ELEMENTS_MOVED[name] * elements * itemsize for name in ELEMENTS_MOVED}
    bandwidth = {name: bytes_moved[name] / (times[name] * 1e-6) for name in ELEMENTS_MOVED}
    return [[f"{batch}x{state}", name, f"{bytes_moved[name] / 1e6:.1f}", f"{times[name]:.1f}",
             f"{bandwidth[name] / 1e9:.0f}", f"{100 * bandwidth[name] / bandwidth['copy']:.1f}"]
            for name in ELEMENTS_MOVED]


def run(args, device, dtype):
    repeats = args.runs or KERNEL_REPEATS
    rows = []
    for batch, state in KERNEL_SIZES:
        rows += kernel_rows(batch, state, dtype, device, repeats) or []
    notes = [
        f"- median of {repeats} repeats after {harness.WARMUP_RUNS} warm-up, CUDA events around "
        "each call; forward, backward and the copy take turns in a shuffled order",
        "- the passes allocate their outputs (torch.empty_like, served by the caching allocator "
        "after warm-up), as lltm_ffi.lltm does, and are timed as they are, host-side call "
        "included where the GPU waits for it",
        "- bytes each step must read and write, counted once: forward 6*B*S, backward 10*B*S "
        "elements; copy: dst.copy_(src) moving as many bytes as backward (read + write)",
        "- one input set per size when an iteration moves more than twice the L2 cache, else "
        "enough sets, used in turn, that each is out of L2 when it comes back",
    ]
    print(harness.report(
        "LLTM fused passes alone (forward_pass / backward_pass, called directly)", device,
        dtype, harness.markdown_table(["batch x state", "step", "MB moved", "median (us)",
                                       "GB/s", "% of copy"], rows, text_columns=2),
        notes=notes))
