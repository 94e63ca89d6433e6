"""The plan's table walked row by row (src/plan.c, docs/ARCHITECTURE.md):
each path forced with LLTM_PATH, on every dtype its passes take, against
the float64 CPU pass: both directions, dense and packed steps (where the
path takes packed ones; where not, its refusal), odd sizes (batch 1, states
off every tile, one step, a thousand steps), and gradcheck in float64; on
each GPU path the forward alone (torch.inference_mode) gives the training
forward's bits and allocates no cells. The GPU rows skip without a GPU;
recurrence_path must name the path forced, and the refusals name the path
and why."""

import importlib.util
import os
from pathlib import Path

import pytest
import torch

import lltm_ffi
from lltm_ffi import selfcheck
from lltm_ffi.reference import lltm as reference_lltm
from lltm_ffi.ops.lltm import plan
from lltm_ffi.ops.lltm.cell import step_forward
from lltm_ffi.ops.lltm.sequence import packed_forward, packed_in_torch
from lltm_ffi.testing import compiled_capability

from conftest import set_or_unset

# The relative errors allowed against float64, by dtype: float64's and
# float32's as the other sequence tests allow them (over a thousand steps
# float64's own rounding grows, test_cluster.py); the 16-bit types' about
# ten times the CPU pass's own over these cases (7e-4 in float16, 5e-3 in
# bfloat16, with two cores of this machine's CPU), for the GPU paths' other
# orders of summation. Where the same computation in torch ops in that dtype
# errs more, four times its error is allowed instead: over a thousand steps
# some inputs make float32's gradients err by up to 1e-3 in any order of
# summation, and one order by ten times another (on the H200, on one input,
# d_inputs erred 6.9e-5 through packed_in_torch, 2.6e-4 a cell at a time in
# torch ops, 4.4e-4 through the cluster and persistent paths, 6.8e-4
# through the steps path; each path the same bits on every run).
TOLERANCES = {torch.float64: 1e-10, torch.float32: 3e-5, torch.float16: 1e-2,
              torch.bfloat16: 5e-2}
LONG_TOLERANCES = {torch.float64: 1e-9, torch.float32: 1e-4}
LONG_STEPS = 1000

# (steps, batch, input_features, state): one step of one row, an odd batch,
# a state off every tile, and a thousand steps (float32 and float64 only).
GPU_SHAPES = {"cluster": [(1, 1, 3, 37), (6, 17, 5, 37), (LONG_STEPS, 3, 4, 130)],
              "persistent": [(2, 1, 3, 37), (6, 17, 5, 300), (LONG_STEPS, 3, 4, 130)],
              "cublas": [(1, 1, 3, 650), (6, 17, 5, 37), (LONG_STEPS, 3, 4, 130)],
              "steps": [(1, 1, 3, 650), (6, 17, 5, 37), (LONG_STEPS, 3, 4, 130)]}
CPU_SHAPES = [(1, 1, 3, 37), (6, 17, 5, 37), (3, 2, 3, 650), (LONG_STEPS, 1, 2, 9)]
# The paths that take dense steps only.
DENSE_ONLY = ("cluster", "persistent")
# The paths whose states the plan pads to rows of whole 16 bytes, on long
# sequences: they also run padded at every size (LLTM_PAD=1).
PADDED = ("persistent", "cublas")


def _sequence_cases():
    cases = [pytest.param("cpu", shape, None, id=f"cpu-{'x'.join(map(str, shape))}")
             for shape in CPU_SHAPES]
    for path, shapes in GPU_SHAPES.items():
        for pad in (None, "1") if path in PADDED else (None,):
            cases += [pytest.param(path, shape, pad, marks=pytest.mark.gpu,
                                   id=f"{path}-{'x'.join(map(str, shape))}"
                                      f"{'-padded' if pad else ''}")
                      for shape in shapes if not (pad and shape[0] >= LONG_STEPS)]
    return cases


def _device_of(path):
    if path == "cpu" or path == "cell-torch-cpu":
        return torch.device("cpu")
    lltm_ffi.testing.skip_without_gpu()
    return torch.device("cuda")


def _dtypes_of(path):
    """The dtypes the path's passes take on its device, from the registry."""
    return packed_forward.cpu_dtypes if path == "cpu" else packed_forward.cuda_dtypes


def _skip_where_the_gpu_lacks(path, dtype, device):
    """Skips a path this GPU, or the module's code for it, cannot run at
    all: the cluster kernels before compute capability 9.0, the persistent
    kernels' 16-bit types before 8.0."""
    capability = compiled_capability(device)
    if path == "cluster" and capability < (9, 0):
        pytest.skip("the cluster kernels need compute capability 9.0")
    if path == "persistent" and dtype in (torch.float16, torch.bfloat16) and capability < (8, 0):
        pytest.skip("the persistent kernels' 16-bit types need compute capability 8.0")


def _lengths(steps, batch_size):
    """Each sequence's length, longest first: the first `steps`, the last
    shortest (at least 1)."""
    return [max(1, steps - (index * steps) // batch_size) for index in range(batch_size)]


def _arguments(shape, packed, generator):
    """float64 CPU arguments (inputs, weights, bias, h0, c0), batch_sizes
    (None for dense steps) and the gradients of outputs, h_n and c_n."""
    steps, batch_size, features, state = shape
    _, weights, bias, h0, c0 = selfcheck.random_inputs(batch_size, features, state,
                                                       torch.float64, "cpu", generator)
    if packed:
        lengths = _lengths(steps, batch_size)
        batch_sizes = torch.tensor([sum(length > t for length in lengths) for t in range(steps)])
        rows = (int(batch_sizes.sum()),)
    else:
        batch_sizes, rows = None, (steps, batch_size)
    inputs = torch.randn(*rows, features, generator=generator, dtype=torch.float64)
    grads = [torch.randn(*rows, state, generator=generator, dtype=torch.float64),
             torch.randn(batch_size, state, generator=generator, dtype=torch.float64),
             torch.randn(batch_size, state, generator=generator, dtype=torch.float64)]
    return (inputs, weights, bias, h0, c0), batch_sizes, grads


def _with_gradients(results, leaves, grads):
    """`results`, then the gradients of `leaves` of the sum of each result
    times its gradient in `grads`."""
    loss = sum((result * grad.to(result.device, result.dtype)).sum()
               for result, grad in zip(results, grads))
    return (*results, *torch.autograd.grad(loss, leaves))


def _results(arguments, batch_sizes, reverse, grads):
    """outputs, h_n, c_n and the five arguments' gradients of the sum of
    each result times its gradient, all in float64 on the CPU."""
    leaves = [argument.detach().clone().requires_grad_(True) for argument in arguments]
    outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(*leaves, batch_sizes=batch_sizes,
                                                 reverse=reverse)
    return [tensor.detach().cpu().double()
            for tensor in _with_gradients((outputs, h_n, c_n), leaves, grads)]


NAMES = ("outputs", "h_n", "c_n", "d_inputs", "d_weights", "d_bias", "d_h0", "d_c0")


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("path, shape, pad", _sequence_cases())
def test_each_sequence_path_agrees_with_the_float64_cpu_pass(path, shape, pad, reverse, packed,
                                                             generator, monkeypatch):
    device = _device_of(path)
    arguments, batch_sizes, grads = _arguments(shape, packed, generator)
    monkeypatch.delenv("LLTM_PATH", raising=False)
    monkeypatch.delenv("LLTM_PAD", raising=False)
    expected = _results(arguments, batch_sizes, reverse, grads)
    monkeypatch.setenv("LLTM_PATH", path)
    set_or_unset(monkeypatch, "LLTM_PAD", pad)
    long = shape[0] >= LONG_STEPS
    for dtype in _dtypes_of(path):
        if long and dtype not in LONG_TOLERANCES:
            continue
        if device.type == "cuda":
            _skip_where_the_gpu_lacks(path, dtype, device)
        given = [argument.to(dtype).to(device) for argument in arguments]
        if packed and path in DENSE_ONLY:
            with pytest.raises(ValueError, match=f"LLTM_PATH={path} cannot take packed steps"):
                lltm_ffi.lltm_sequence(*given, batch_sizes=batch_sizes, reverse=reverse)
            continue
        for backward in (False, True):
            assert lltm_ffi.recurrence_path(*given, batch_sizes=batch_sizes, reverse=reverse,
                                            backward=backward) == path
        # The reference from the very numbers the path is given.
        reference = (expected if dtype == torch.float64 else _reference_of(
            given, batch_sizes, reverse, grads, monkeypatch))
        got = _results(given, batch_sizes, reverse, grads)
        floor = (LONG_TOLERANCES if long else TOLERANCES)[dtype]
        torch_errors = ([0.0] * len(NAMES) if dtype == torch.float64
                        else _errors_in_torch_ops(given, batch_sizes, reverse, grads, reference))
        for name, value, wanted, torch_error in zip(NAMES, got, reference, torch_errors,
                                                     strict=True):
            assert value.shape == wanted.shape, name
            error = selfcheck.relative_error(value, wanted)
            tolerance = max(floor, 4 * torch_error)
            assert error <= tolerance, (f"{dtype} {name}: relative error {error:.3g} > {tolerance:g}"
                                        f" (torch ops in {dtype}: {torch_error:.3g})")


def _reference_of(given, batch_sizes, reverse, grads, monkeypatch):
    """The float64 CPU pass on `given` rounded as the path gets them, with
    none of the path's environment (LLTM_PATH, LLTM_PAD)."""
    with monkeypatch.context() as unset:
        for name in ("LLTM_PATH", "LLTM_PAD"):
            unset.delenv(name, raising=False)
        return _results([argument.cpu().double() for argument in given], batch_sizes, reverse,
                        grads)


def _errors_in_torch_ops(given, batch_sizes, reverse, grads, reference):
    """The relative errors, result by result, of the sequence in torch ops on
    the CPU in the dtype of `given` against `reference`: the larger of two
    orders of summation, packed_in_torch's (all steps' input products at
    once) and, for dense steps, a cell at a time (lltm_ffi.reference.lltm)."""
    leaves = [argument.detach().cpu().requires_grad_(True) for argument in given]
    inputs, weights, bias, h0, c0 = leaves
    outputs, _, h_n, c_n = packed_in_torch(inputs.reshape(-1, inputs.shape[-1]), weights, bias,
                                           h0, c0, batch_sizes, reverse)
    orders = [(outputs.reshape(*inputs.shape[:-1], -1), h_n, c_n)]
    if batch_sizes is None:
        h, c, outputs = h0, c0, [None] * inputs.shape[0]
        for t in reversed(range(inputs.shape[0])) if reverse else range(inputs.shape[0]):
            h, c = reference_lltm(inputs[t], weights, bias, h, c)
            outputs[t] = h
        orders.append((torch.stack(outputs), h, c))
    errors = [0.0] * len(reference)
    for results in orders:
        got = _with_gradients(results, leaves, grads)
        errors = [max(error, selfcheck.relative_error(value.detach(), wanted))
                  for error, value, wanted in zip(errors, got, reference, strict=True)]
    return errors


# The cluster row's tensor-core forward (cluster_mma_kernel.cu): float16 and
# bfloat16 states past 256, to 768, its backward on a row below. One row of
# one cluster's 16, rows past one cluster, states off every tile, from two
# steps to a hundred. Past 512 a training forward takes the persistent row
# where that takes it (src/plan.c): there the batch x state is past its
# 16384, so that the kernel's training forward runs too.
MMA_SHAPES = [(2, 1, 3, 257), (6, 17, 5, 300), (100, 16, 7, 512), (5, 33, 4, 500),
              (3, 33, 6, 513), (7, 26, 9, 650), (60, 22, 11, 768)]


@pytest.mark.gpu
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("shape", MMA_SHAPES, ids=lambda shape: "x".join(map(str, shape)))
def test_the_cluster_rows_tensor_core_forward_agrees_with_the_float64_cpu_pass(
        shape, reverse, generator, monkeypatch):
    device = _device_of("cluster")
    arguments, _, grads = _arguments(shape, False, generator)
    for name in ("LLTM_PATH", "LLTM_PAD", "LLTM_CLUSTER"):
        monkeypatch.delenv(name, raising=False)
    for dtype in (torch.float16, torch.bfloat16):
        _skip_where_the_gpu_lacks("cluster", dtype, device)
        given = [argument.to(dtype).to(device) for argument in arguments]
        assert lltm_ffi.recurrence_path(*given, reverse=reverse) == "cluster"
        trained = [argument.detach().requires_grad_(True) for argument in given]
        assert lltm_ffi.recurrence_path(*trained, reverse=reverse) == "cluster"
        assert lltm_ffi.recurrence_path(*given, reverse=reverse, backward=True) != "cluster"
        reference = _reference_of(given, None, reverse, grads, monkeypatch)
        got = _results(given, None, reverse, grads)
        torch_errors = _errors_in_torch_ops(given, None, reverse, grads, reference)
        for name, value, wanted, torch_error in zip(NAMES, got, reference, torch_errors,
                                                     strict=True):
            error = selfcheck.relative_error(value, wanted)
            tolerance = max(TOLERANCES[dtype], 4 * torch_error)
            assert error <= tolerance, (f"{dtype} {name}: relative error {error:.3g} > {tolerance:g}"
                                        f" (torch ops in {dtype}: {torch_error:.3g})")
        with torch.inference_mode():
            outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(*given, reverse=reverse)
        for name, alone, trained in (("outputs", outputs, got[0]), ("h_n", h_n, got[1]),
                                     ("c_n", c_n, got[2])):
            assert torch.equal(alone.cpu().double(), trained), (
                f"{dtype} {name}: the forward alone differs from the training forward")


def test_the_tensor_core_racecheck_runs_the_tables_shapes():
    """make racecheck-tensor-cores (scripts/race_tensor_cores.py) races
    the kernel at the shapes this table checks it at."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "race_tensor_cores.py"
    spec = importlib.util.spec_from_file_location("race_tensor_cores", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.SHAPES == MMA_SHAPES
    assert script.shapes_of([]) == MMA_SHAPES
    assert script.shapes_of(["3", "0"]) == [MMA_SHAPES[3], MMA_SHAPES[0]]
    assert script.shapes_of(["--steps", "4", "6", "0"]) == [(4, *MMA_SHAPES[6][1:]),
                                                             MMA_SHAPES[0]]
    with pytest.raises(SystemExit, match="indices from 0 to 6, got 7"):
        script.shapes_of(["7"])
    with pytest.raises(SystemExit, match="--steps takes a whole number of at least 1"):
        script.shapes_of(["--steps", "0", "6"])


@pytest.mark.gpu
@pytest.mark.parametrize("state", [513, 650, 768])
def test_a_training_forward_past_512_takes_the_persistent_row_where_it_can(state, generator,
                                                                          monkeypatch):
    """A bfloat16 forward that keeps its gates and cells for a backward:
    the persistent row where it takes the call, else the tensor-core
    kernel; a forward alone: the tensor-core kernel (src/plan.c)."""
    device = _device_of("cluster")
    _skip_where_the_gpu_lacks("cluster", torch.bfloat16, device)
    for name in ("LLTM_PATH", "LLTM_PAD", "LLTM_CLUSTER"):
        monkeypatch.delenv(name, raising=False)
    for batch_size, trained_path in ((16, "persistent"), (64, "cluster")):
        arguments, _, _ = _arguments((300, batch_size, 8, state), False, generator)
        given = [argument.to(torch.bfloat16).to(device) for argument in arguments]
        assert lltm_ffi.recurrence_path(*given) == "cluster"
        trained = [argument.detach().requires_grad_(True) for argument in given]
        assert lltm_ffi.recurrence_path(*trained) == trained_path
        with torch.no_grad():
            assert lltm_ffi.recurrence_path(*trained) == "cluster"


@pytest.mark.gpu
def test_the_cluster_row_forced_refuses_a_backward_it_cannot_take(generator, monkeypatch):
    """LLTM_PATH=cluster at a bfloat16 state the tensor-core forward takes
    and no cluster backward does: the forward runs, the backward is refused
    naming the path and the pass."""
    device = _device_of("cluster")
    _skip_where_the_gpu_lacks("cluster", torch.bfloat16, device)
    arguments, _, _ = _arguments((3, 2, 4, 300), False, generator)
    inputs, weights, *rest = [argument.to(torch.bfloat16).to(device) for argument in arguments]
    weights.requires_grad_(True)
    monkeypatch.setenv("LLTM_PATH", "cluster")
    outputs, _ = lltm_ffi.lltm_sequence(inputs, weights, *rest)
    with pytest.raises(ValueError, match=r"LLTM_PATH=cluster cannot take dense steps .*backward"):
        outputs.float().sum().backward()


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("path", ["cpu", *(pytest.param(path, marks=pytest.mark.gpu)
                                           for path in GPU_SHAPES)])
def test_each_sequence_path_passes_gradcheck_in_float64(path, reverse, packed, generator,
                                                        monkeypatch):
    device = _device_of(path)
    if device.type == "cuda":
        _skip_where_the_gpu_lacks(path, torch.float64, device)
    if packed and path in DENSE_ONLY:
        pytest.skip("the path takes dense steps only (its refusal: the test above)")
    arguments, batch_sizes, _ = _arguments((3, 2, 3, 5), packed, generator)
    leaves = [argument.to(device).requires_grad_(True) for argument in arguments]
    monkeypatch.setenv("LLTM_PATH", path)
    assert lltm_ffi.recurrence_path(*leaves, batch_sizes=batch_sizes, reverse=reverse) == path

    def flat(*tensors):
        outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(*tensors, batch_sizes=batch_sizes,
                                                     reverse=reverse)
        return outputs, h_n, c_n

    assert torch.autograd.gradcheck(flat, leaves)


# The forward alone (torch.inference_mode): nothing kept for a backward -------------

# (steps, batch, input_features, state): one shape every GPU path takes.
FORWARD_ALONE_SHAPE = (7, 17, 5, 37)


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("path", list(GPU_SHAPES))
def test_each_gpu_paths_forward_alone_gives_the_training_forwards_bits(path, reverse, packed,
                                                                       generator, monkeypatch):
    """The forward no backward follows stores no cells and no gates, and its
    outputs, h_n and c_n are the training forward's, bit for bit, in every
    dtype the path takes."""
    device = _device_of(path)
    if packed and path in DENSE_ONLY:
        pytest.skip("the path takes dense steps only (its refusal: the tests above)")
    arguments, batch_sizes, _ = _arguments(FORWARD_ALONE_SHAPE, packed, generator)
    monkeypatch.setenv("LLTM_PATH", path)
    for dtype in _dtypes_of(path):
        _skip_where_the_gpu_lacks(path, dtype, device)
        inputs, weights, *rest = [argument.to(dtype).to(device) for argument in arguments]
        assert lltm_ffi.recurrence_path(inputs, weights, *rest, batch_sizes=batch_sizes,
                                        reverse=reverse) == path
        trained, (trained_h, trained_c) = lltm_ffi.lltm_sequence(
            inputs, weights.clone().requires_grad_(True), *rest, batch_sizes=batch_sizes,
            reverse=reverse)
        assert trained.requires_grad, "the training forward took the forward alone"
        with torch.inference_mode():
            outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(inputs, weights, *rest,
                                                         batch_sizes=batch_sizes,
                                                         reverse=reverse)
        for name, got, wanted in (("outputs", outputs, trained), ("h_n", h_n, trained_h),
                                  ("c_n", c_n, trained_c)):
            assert torch.equal(got, wanted.detach()), (
                f"{dtype} {name}: the forward alone differs from the training forward")


@pytest.mark.gpu
@pytest.mark.parametrize("path", list(GPU_SHAPES))
def test_each_gpu_paths_forward_alone_allocates_no_cells(path, generator, monkeypatch):
    """Under torch.inference_mode the forward allocates its outputs, the
    gates' workspace and the final states, and no cells: at least the cells'
    bytes less than a training forward at its peak."""
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1":
        pytest.skip("PYTORCH_NO_CUDA_MEMORY_CACHING=1 (the sanitizers' runs): torch counts "
                    "allocated bytes in its caching allocator only")
    device = _device_of(path)
    _skip_where_the_gpu_lacks(path, torch.float32, device)
    # Each tensor a whole number of the caching allocator's 512-byte blocks.
    steps, batch_size, _, state_size = shape = (8, 16, 5, 128)
    arguments, _, _ = _arguments(shape, False, generator)
    inputs, weights, *rest = [argument.float().to(device) for argument in arguments]
    trained_weights = weights.clone().requires_grad_(True)
    monkeypatch.setenv("LLTM_PATH", path)
    assert lltm_ffi.recurrence_path(inputs, weights, *rest) == path

    def peak_allocated(forward):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        forward()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before

    trained = peak_allocated(lambda: lltm_ffi.lltm_sequence(inputs, trained_weights, *rest))
    with torch.inference_mode():
        alone = peak_allocated(lambda: lltm_ffi.lltm_sequence(inputs, weights, *rest))
    element = torch.float32.itemsize
    cells = steps * batch_size * state_size * element
    outputs_gates_and_states = 4 * cells + 2 * batch_size * state_size * element
    assert alone <= outputs_gates_and_states, (alone, outputs_gates_and_states)
    assert trained - alone >= cells, (trained, alone, cells)


# The cell's rows ----------------------------------------------------------------

CELL_SHAPES = [(1, 3, 37), (17, 5, 650)]  # batch, input_features, state
CELL_CASES = ([pytest.param("cell-torch", "cpu", id="cell-torch-cpu")]
              + [pytest.param(path, "cuda", id=f"{path}-cuda", marks=pytest.mark.gpu)
                 for path in ("cell-steps", "cell-torch")])


def _cell_results(arguments, grads):
    leaves = [argument.detach().clone().requires_grad_(True) for argument in arguments]
    return [tensor.detach().cpu().double()
            for tensor in _with_gradients(lltm_ffi.lltm(*leaves), leaves, grads)]


@pytest.mark.parametrize("shape", CELL_SHAPES, ids=lambda shape: "x".join(map(str, shape)))
@pytest.mark.parametrize("path, device_type", CELL_CASES)
def test_each_cell_path_agrees_with_the_float64_cpu_cell(path, device_type, shape, generator,
                                                         monkeypatch):
    device = _device_of("cpu" if device_type == "cpu" else path)
    arguments = selfcheck.random_inputs(*shape, torch.float64, "cpu", generator)
    grads = [torch.randn(shape[0], shape[2], generator=generator, dtype=torch.float64)
             for _ in range(2)]
    dtypes = (step_forward.cuda_dtypes if path == "cell-steps"
              else packed_forward.cpu_dtypes if device.type == "cpu"
              else packed_forward.cuda_dtypes)
    for dtype in dtypes:
        given = [argument.to(dtype).to(device) for argument in arguments]
        monkeypatch.delenv("LLTM_PATH", raising=False)
        expected = _cell_results([argument.cpu().double() for argument in given], grads)
        monkeypatch.setenv("LLTM_PATH", path)
        assert plan.cell_path("lltm", dtype, device, *shape) == path
        got = _cell_results(given, grads)
        for name, value, wanted in zip(("new_h", "new_cell", "d_input", "d_weights", "d_bias",
                                        "d_old_h", "d_old_cell"), got, expected, strict=True):
            error = selfcheck.relative_error(value, wanted)
            assert error <= TOLERANCES[dtype], (
                f"{dtype} {name}: relative error {error:.3g} > {TOLERANCES[dtype]:g}")
    if torch.float64 in dtypes:
        small = [argument.to(device).requires_grad_(True) for argument in
                 selfcheck.random_inputs(2, 3, 5, torch.float64, "cpu", generator)]
        assert plan.cell_path("lltm", torch.float64, device, 2, 3, 5) == path
        assert torch.autograd.gradcheck(lltm_ffi.lltm, small)


# What the plan answers, and its refusals ------------------------------------------

def test_the_table_names_every_path_once():
    assert plan.PATHS == ("cluster", "persistent", "cublas", "steps", "cpu", "cell-steps",
                          "cell-torch")
    assert plan.SEQUENCE_PATHS + plan.CELL_PATHS == plan.PATHS


def _small(device="cpu", steps=3, dtype=torch.float64, generator=None):
    generator = generator or torch.Generator().manual_seed(0)
    inputs, weights, bias, h0, c0 = selfcheck.random_inputs(2, 3, 5, dtype, device, generator)
    sequence = torch.randn(steps, 2, 3, generator=generator, dtype=dtype).to(device)
    return sequence, weights, bias, h0, c0


def test_the_cpu_takes_its_one_path_unless_forced(monkeypatch):
    monkeypatch.delenv("LLTM_PATH", raising=False)
    arguments = _small()
    assert lltm_ffi.recurrence_path(*arguments) == "cpu"
    assert lltm_ffi.recurrence_path(*arguments, backward=True) == "cpu"
    assert lltm_ffi.recurrence_path(arguments[0][:0], *arguments[1:]) is None
    # A cell's path leaves the sequence to its plan.
    monkeypatch.setenv("LLTM_PATH", "cell-torch")
    assert lltm_ffi.recurrence_path(*arguments) == "cpu"


@pytest.mark.parametrize("path", list(GPU_SHAPES))
def test_a_gpu_path_forced_on_the_cpu_is_refused_naming_it(path, monkeypatch):
    monkeypatch.setenv("LLTM_PATH", path)
    arguments = _small()
    for call in (lambda: lltm_ffi.lltm_sequence(*arguments),
                 lambda: lltm_ffi.recurrence_path(*arguments)):
        with pytest.raises(ValueError, match=f"LLTM_PATH={path} cannot take .* another device"):
            call()


def test_cell_steps_forced_on_the_cpu_is_refused(monkeypatch):
    monkeypatch.setenv("LLTM_PATH", "cell-steps")
    sequence, *rest = _small()
    with pytest.raises(ValueError, match="lltm: LLTM_PATH=cell-steps cannot take a cell"):
        lltm_ffi.lltm(sequence[0], *rest)


def test_an_unknown_path_is_refused_listing_the_table(monkeypatch):
    monkeypatch.setenv("LLTM_PATH", "fastest")
    arguments = _small()
    for call in (lambda: lltm_ffi.lltm_sequence(*arguments),
                 lambda: lltm_ffi.lltm(arguments[0][0], *arguments[1:])):
        with pytest.raises(ValueError, match="LLTM_PATH='fastest' names no path; the paths are "
                                             "cluster, persistent, cublas, steps, cpu"):
            call()


@pytest.mark.gpu
def test_gpu_refusals_name_the_path_and_why(cuda_device, monkeypatch):
    arguments = _small(cuda_device, steps=1, dtype=torch.float32)
    batch_sizes = torch.tensor([2])
    rows = arguments[0][0]
    for path in DENSE_ONLY:
        monkeypatch.setenv("LLTM_PATH", path)
        with pytest.raises(ValueError, match=f"LLTM_PATH={path} cannot take packed steps"):
            lltm_ffi.lltm_sequence(rows, *arguments[1:], batch_sizes=batch_sizes)
    monkeypatch.setenv("LLTM_PATH", "persistent")
    with pytest.raises(ValueError, match="persistent kernels need at least 2 steps"):
        lltm_ffi.lltm_sequence(*arguments)
    monkeypatch.setenv("LLTM_CLUSTER", "0")
    monkeypatch.setenv("LLTM_PATH", "cluster")
    with pytest.raises(ValueError, match="LLTM_CLUSTER=0 turns them off|LLTM_CLUSTER=0 turns "
                                         "it off|thread-block clusters"):
        lltm_ffi.lltm_sequence(*arguments)
    monkeypatch.delenv("LLTM_CLUSTER")
    monkeypatch.setenv("LLTM_CUBLAS", "0")
    monkeypatch.setenv("LLTM_PATH", "cublas")
    with pytest.raises(ValueError, match="LLTM_PATH=cublas cannot take .*LLTM_CUBLAS=0"):
        lltm_ffi.lltm_sequence(*arguments)
    monkeypatch.setenv("LLTM_PATH", "cpu")
    with pytest.raises(ValueError, match="LLTM_PATH=cpu cannot take .* another device"):
        lltm_ffi.lltm_sequence(*arguments)


@pytest.mark.gpu
def test_one_planned_step_runs_as_the_cell(cuda_device, monkeypatch):
    """One dense forward step with a bias is a call of the cell's step
    kernels, as planned; a forced sequence path runs itself instead."""
    monkeypatch.delenv("LLTM_PATH", raising=False)
    arguments = _small(cuda_device, steps=1, dtype=torch.float32)
    assert lltm_ffi.recurrence_path(*arguments) == "cell-steps"
    assert lltm_ffi.recurrence_path(*arguments, reverse=True) != "cell-steps"
    monkeypatch.setenv("LLTM_PATH", "steps")
    assert lltm_ffi.recurrence_path(*arguments) == "steps"


@pytest.mark.gpu
@pytest.mark.parametrize("batch, state, trained_path", [
    (20, 650, "cublas"), (24, 512, "cublas"), (16, 650, "persistent"), (20, 300, "persistent")])
def test_float32_training_of_more_than_16_rows_from_512_takes_the_cublas_loop(
        batch, state, trained_path, generator, monkeypatch):
    """A float32 call whose backward will run, of more than 16 rows at a
    state of 512 or more, goes from the persistent row to the cuBLAS loop
    both ways, where it measured faster (src/plan.c,
    LLTM_PERSISTENT_TRAINING_ROWS); a forward alone stays on the
    persistent row, and so does every pass with LLTM_CUBLAS=0."""
    device = _device_of("persistent")
    for name in ("LLTM_PATH", "LLTM_PAD", "LLTM_CUBLAS"):
        monkeypatch.delenv(name, raising=False)
    arguments, _, _ = _arguments((35, batch, 8, state), False, generator)
    given = [argument.float().to(device) for argument in arguments]
    trained = [argument.detach().requires_grad_(True) for argument in given]
    monkeypatch.setenv("LLTM_PATH", "persistent")
    try:
        lltm_ffi.recurrence_path(*given, backward=True)
    except ValueError as refusal:
        pytest.skip(f"the persistent row does not take this call here: {refusal}")
    monkeypatch.delenv("LLTM_PATH")
    assert lltm_ffi.recurrence_path(*given) == "persistent"
    assert lltm_ffi.recurrence_path(*trained) == trained_path
    assert lltm_ffi.recurrence_path(*given, backward=True) == trained_path
    monkeypatch.setenv("LLTM_CUBLAS", "0")
    assert lltm_ffi.recurrence_path(*trained) == "persistent"
    assert lltm_ffi.recurrence_path(*given, backward=True) == "persistent"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, batch, state, path", [
    (torch.float32, 64, 128, "steps"), (torch.float64, 64, 37, "steps"),
    (torch.float32, 64, 129, "cublas"), (torch.float32, 16, 200, "steps"),
    (torch.float32, 16, 255, "steps"), (torch.float32, 16, 256, "cublas"),
    (torch.float32, 17, 200, "cublas"), (torch.bfloat16, 16, 64, "cublas"),
    (torch.float16, 16, 128, "cublas")])
def test_packed_steps_take_the_step_kernels_only_where_they_measured_faster(
        cuda_device, dtype, batch, state, path, monkeypatch):
    """Packed steps go to the cuBLAS loop but small float32 and float64
    states, a little larger in a batch of 16 sequences or fewer (src/plan.c,
    LLTM_PACKED_STEPS_STATE and LLTM_PACKED_STEPS_ROWS_STATE), at the state
    as given (LLTM_PAD=0: test_padded_state.py has the plan padding those
    of 16 rows past 128 to 256, which the cuBLAS loop takes)."""
    for name in ("LLTM_PATH", "LLTM_CUBLAS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LLTM_PAD", "0")
    generator = torch.Generator().manual_seed(0)
    batch_sizes = torch.tensor([batch, 12, 9, 4])
    inputs = torch.randn(int(batch_sizes.sum()), 8, generator=generator).to(cuda_device, dtype)
    weights = torch.randn(3 * state, state + 8, generator=generator).to(cuda_device, dtype)
    bias = torch.randn(3 * state, generator=generator).to(cuda_device, dtype)
    h0, c0 = (torch.zeros(batch, state, device=cuda_device, dtype=dtype) for _ in range(2))
    for backward in (False, True):
        assert lltm_ffi.recurrence_path(inputs, weights, bias, h0, c0, batch_sizes=batch_sizes,
                                        backward=backward) == path
    monkeypatch.delenv("LLTM_PAD")
    padded = "cublas" if dtype == torch.float32 and batch <= 16 and 128 < state < 256 else path
    for backward in (False, True):
        assert lltm_ffi.recurrence_path(inputs, weights, bias, h0, c0, batch_sizes=batch_sizes,
                                        backward=backward) == padded
