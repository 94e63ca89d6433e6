"""bfloat16 and float16 end to end: the cell, lltm_sequence, stacked and
bidirectional layers (dense and packed), round_ste and the modules take
either half dtype on the CPU and the GPU and return it. Outputs and every
gradient are compared with a float64 computation from the same values,
next to the same computation done by torch in the half dtype: lltm_ffi's
error may be at most ERROR_FACTOR times torch's plus SLACK_UNITS units of
roundoff of the dtype (times the square root of a recurrence's steps).
Then the refusals (mixed dtypes, an op whose passes take no half), the
operators (opcheck, torch.compile) and non-contiguous arguments. Autocast
is in test_autocast.py, a CUDA graph of a half training step in
test_layers.py."""

import copy
import itertools
import math

import pytest
import torch
from torch.library import opcheck
from torch.nn.utils.rnn import pack_sequence, pad_packed_sequence

import lltm_ffi
from builders import broadcast_rows, misaligned, odd_strides, transposed
from conftest import needs_amx, raises_with, reference_sequence
from layers_reference import reference_layers
from lltm_ffi import _extension, op, reference, selfcheck
from lltm_ffi.testing import compiled_capability

HALVES = [pytest.param(torch.bfloat16, id="bfloat16"), pytest.param(torch.float16, id="float16")]
# The unit roundoff u of each dtype: half the distance from 1 to the next number.
UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
# lltm_ffi's C computes in float32 and rounds each value it stores once
# (cuBLAS's 16-bit products and torch's own sum in float32 too); torch's
# loop rounds after every op. So lltm_ffi is usually the more accurate (its
# error about 0.8 of torch's on average over these tests), but where the
# two round differently either may be, and their errors are of one size:
# the factor 2. The few units of roundoff cover a tensor whose error torch
# happens to keep far below its usual size, where lltm_ffi's can be a few
# times torch's yet of the order of u (storing a result in the dtype alone
# can cost u). A recurrence of T steps rounds its state and its gradient
# once a step, and those errors add up like a random walk: the slack grows
# as sqrt(T). Over 4000 sequences of 6 steps at 1x7x5 on the CPU, the
# gradient at the end of that chain (d_h0, five elements) stayed below 0.93
# of the bound, where a slack of 2 units, not growing, failed 7 times.
ERROR_FACTOR = 2.0
SLACK_UNITS = 2.0
# Above this, torch's own error in the dtype says the inputs are too
# ill-conditioned for the comparison to mean anything: a test setup error.
MEANINGFUL = 0.1


def assert_as_accurate_as_torch(got, in_torch, exact, dtype, steps=1):
    """For each named result: lltm_ffi's (got) has `dtype` and a relative
    error against `exact` (float64) of at most ERROR_FACTOR times that of
    the same result computed by torch in `dtype` (in_torch), plus
    SLACK_UNITS units of roundoff times the square root of the recurrence's
    `steps`."""
    assert got.keys() == in_torch.keys() == exact.keys()
    failures = []
    for name, wanted in exact.items():
        value, same = got[name], in_torch[name]
        assert value is not None and same is not None, f"{name}: no gradient"
        assert value.dtype == dtype, f"{name} has dtype {value.dtype}, expected {dtype}"
        assert value.shape == wanted.shape, f"{name}: shape {tuple(value.shape)}"
        assert wanted.norm() > 0, f"{name}: the float64 result is zero, a vacuous comparison"
        error = selfcheck.relative_error(value.cpu(), wanted.cpu())
        torch_error = selfcheck.relative_error(same.cpu(), wanted.cpu())
        assert torch_error < MEANINGFUL, f"{name}: torch's own error {torch_error:.3g}"
        bound = ERROR_FACTOR * torch_error + SLACK_UNITS * math.sqrt(steps) * UNIT_ROUNDOFF[dtype]
        if not error <= bound:  # NaN fails
            failures.append(f"{name}: relative error {error:.3g} > {bound:.3g} "
                            f"(torch's in {dtype}: {torch_error:.3g})")
    assert not failures, "; ".join(failures)


def rounded(tensors, dtype, device):
    """Each tensor in `dtype` on `device`, and the same values in float64 on
    the CPU: both computations start from exactly the same numbers."""
    halves = [None if tensor is None else tensor.to(dtype).to(device) for tensor in tensors]
    return halves, [None if tensor is None else tensor.cpu().double() for tensor in halves]


def with_gradients(function, arguments, grads, names):
    """{name: result} of function(*leaves) (a flat tuple of tensors) and the
    gradients of every argument (d_ + its name) of the sum of each result
    times its gradient in `grads` (cast to the result's dtype)."""
    leaves = [argument.detach().clone().requires_grad_(True) for argument in arguments]
    results = function(*leaves)
    loss = sum((result * grad.to(result.device, result.dtype)).sum()
               for result, grad in zip(results, grads))
    gradients = torch.autograd.grad(loss, leaves)
    return {**dict(zip(names[0], results)),
            **{f"d_{name}": gradient for name, gradient in zip(names[1], gradients)}}


def random_grads(shapes, generator):
    return [torch.randn(shape, generator=generator, dtype=torch.float64) for shape in shapes]


# The cell ------------------------------------------------------------------------------

CELL_SHAPES = [(1, 7, 5), (3, 7, 33)]  # batch, input_features, state_size
CELL_NAMES = (("new_h", "new_cell"), ("input", "weights", "bias", "old_h", "old_cell"))


def cell_results(function, arguments, grads):
    return with_gradients(lambda *leaves: function(*leaves), arguments, grads, CELL_NAMES)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("shape", CELL_SHAPES, ids=lambda shape: "x".join(map(str, shape)))
def test_cell_is_as_accurate_as_torch_in_the_dtype(shape, dtype, device, generator):
    arguments = selfcheck.random_inputs(*shape, torch.float64, "cpu", generator)
    grads = random_grads([(shape[0], shape[2])] * 2, generator)
    halves, doubles = rounded(arguments, dtype, device)
    got = cell_results(lltm_ffi.lltm, halves, grads)
    assert_as_accurate_as_torch(got, cell_results(reference.lltm, halves, grads),
                                cell_results(reference.lltm, doubles, grads), dtype)


@pytest.mark.parametrize("dtype", HALVES)
def test_cell_module_converted_to_the_dtype(dtype, device, generator):
    """LLTM(...).to(dtype) runs in dtype, its gradients too."""
    rnn = lltm_ffi.LLTM(7, 5).to(device, dtype)
    X, h, C = (torch.randn(3, size, generator=generator).to(device, dtype) for size in (7, 5, 5))
    new_h, new_cell = rnn(X, (h, C))
    assert new_h.dtype == new_cell.dtype == dtype
    (new_h.float().sum() + new_cell.float().sum()).backward()
    assert rnn.weights.grad.dtype == rnn.bias.grad.dtype == dtype
    expected = lltm_ffi.lltm(X, rnn.weights.detach(), rnn.bias.detach(), h, C)
    torch.testing.assert_close((new_h, new_cell), expected, rtol=0, atol=0)


# Whole sequences -----------------------------------------------------------------------

SEQUENCE_NAMES = (("outputs", "h_n", "c_n"), ("inputs", "weights", "bias", "h0", "c0"))


def ffi_sequence(reverse):
    def run(*arguments):
        outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(*arguments, reverse=reverse)
        return outputs, h_n, c_n
    return run


def torch_sequence(reverse):
    """The tutorial's cell looped in torch, in the arguments' dtype."""
    def run(inputs, *rest):
        outputs, (h_n, c_n) = reference_sequence(inputs.flip(0) if reverse else inputs, *rest)
        return outputs.flip(0) if reverse else outputs, h_n, c_n
    return run


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("steps", [1, 6])
@pytest.mark.parametrize("shape", CELL_SHAPES, ids=lambda shape: "x".join(map(str, shape)))
def test_sequence_is_as_accurate_as_torch_in_the_dtype(shape, steps, reverse, dtype, device,
                                                       generator):
    batch, features, state = shape
    arguments = [torch.randn(steps, batch, features, generator=generator, dtype=torch.float64),
                 *selfcheck.random_inputs(*shape, torch.float64, "cpu", generator)[1:]]
    grads = random_grads([(steps, batch, state), (batch, state), (batch, state)], generator)
    halves, doubles = rounded(arguments, dtype, device)
    got = with_gradients(ffi_sequence(reverse), halves, grads, SEQUENCE_NAMES)
    assert_as_accurate_as_torch(
        got, with_gradients(torch_sequence(reverse), halves, grads, SEQUENCE_NAMES),
        with_gradients(torch_sequence(reverse), doubles, grads, SEQUENCE_NAMES), dtype, steps)


# Each GPU path of the recurrence (ARCHITECTURE.md, "The sequence's paths"): the
# step kernels (one step), the cluster kernels (compute capability 9.0 and
# newer), the persistent kernels on tensor cores (8.0 and newer; on 9.0 for
# states past the cluster kernels', or LLTM_CLUSTER=0), cuBLAS's products
# (run, then recorded, then replayed: three calls), and with LLTM_CUBLAS=0 the
# step-by-step kernels. The persistent kernels' shapes: batches of 1, 16 and
# 17 rows (one mma tile of rows, and two), states off every tile (9, 37, 300)
# and the benchmark's 768, either direction; 40 steps of 768, on 9.0 with
# the clusters' shared staging and without (LLTM_CLUSTER=0, as on 8.x); and
# the clusters' bulk copies (states of multiples of 8) at 17 rows with a
# state of 264 (a grid of whole clusters, its last blocks owning no column),
# at one row, and over two steps; a state of 650, whose rows (1,300 bytes,
# the backward's 3,900) the kernels stage in 4-byte copies.
GPU_PATHS = [((1, 16, 32, 128), ""), ((5, 3, 4, 9), ""), ((5, 33, 7, 520), ""),
             ((5, 33, 7, 520), "LLTM_CUBLAS=0"), ((5, 3, 4, 9), "LLTM_CLUSTER=0"),
             ((7, 1, 5, 37), "LLTM_CLUSTER=0"), ((6, 17, 5, 300), ""),
             ((40, 16, 8, 768), ""), ((40, 16, 8, 768), "LLTM_CLUSTER=0"),
             ((9, 17, 6, 264), ""), ((5, 1, 3, 520), ""), ((2, 3, 4, 304), ""),
             ((6, 16, 5, 650), ""), ((6, 16, 5, 650), "LLTM_CLUSTER=0")]


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("shape, setting", GPU_PATHS,
                         ids=["-".join(filter(None, ["x".join(map(str, shape)), setting]))
                              for shape, setting in GPU_PATHS])
def test_every_gpu_path_is_as_accurate_as_torch(shape, setting, reverse, dtype, cuda_device,
                                                generator, monkeypatch):
    for variable in ("LLTM_CUBLAS", "LLTM_CLUSTER"):
        monkeypatch.delenv(variable, raising=False)
    if setting:
        monkeypatch.setenv(*setting.split("="))
    steps, batch, features, state = shape
    arguments = [torch.randn(steps, batch, features, generator=generator, dtype=torch.float64),
                 *selfcheck.random_inputs(batch, features, state, torch.float64, "cpu",
                                          generator)[1:]]
    grads = random_grads([(steps, batch, state), (batch, state), (batch, state)], generator)
    halves, doubles = rounded(arguments, dtype, cuda_device)
    in_torch = with_gradients(torch_sequence(reverse), halves, grads, SEQUENCE_NAMES)
    exact = with_gradients(torch_sequence(reverse), doubles, grads, SEQUENCE_NAMES)
    for _ in range(3):
        got = with_gradients(ffi_sequence(reverse), halves, grads, SEQUENCE_NAMES)
        assert_as_accurate_as_torch(got, in_torch, exact, dtype, steps)


@pytest.mark.parametrize("dtype", HALVES)
def test_the_persistent_kernels_run_on_tensor_cores_from_8_0(dtype, cuda_device, generator,
                                                             monkeypatch):
    """A 16-bit sequence past the cluster kernels' states (768 for a 16-bit
    forward) runs the persistent kernels both ways on compute capability 8.0
    and newer, and never on an older GPU (whose tensor cores lack the mma
    they take): the path the plan gives (lltm_ffi.recurrence_path)."""
    monkeypatch.delenv("LLTM_PATH", raising=False)
    arguments = [torch.randn(6, 16, 8, generator=generator).to(cuda_device, dtype),
                 *(argument.to(cuda_device, dtype) for argument in
                   selfcheck.random_inputs(16, 8, 800, torch.float32, "cpu", generator)[1:])]
    ran = {way for way in ("forward", "backward")
           if lltm_ffi.recurrence_path(*arguments, backward=way == "backward") == "persistent"}
    expected = {"forward", "backward"} if compiled_capability(cuda_device) >= (8, 0) else set()
    assert ran == expected


# Stacked, bidirectional, packed ----------------------------------------------------------

LENGTHS = [5, 2, 4]  # unsorted: the packed batch's own order differs


def layers_results(module, sequences, h0, c0, grads, packed, by_lltm_ffi):
    """Every sequence's outputs (concatenated), h_n and c_n of `module` over
    `sequences` from (h0, c0), and the gradients of the sequences, h0, c0
    and every parameter of the sum of each result times its gradient in
    `grads` ((each sequence's output gradient, h_n's, c_n's)). by_lltm_ffi:
    the module's own call on the batch (packed, or dense steps); otherwise
    the reference loop over its parameters, one sequence at a time."""
    sequences = [sequence.detach().clone().requires_grad_(True) for sequence in sequences]
    h0, c0 = (state.detach().clone().requires_grad_(True) for state in (h0, c0))
    if by_lltm_ffi and packed:
        output, (h_n, c_n) = module(pack_sequence(sequences, enforce_sorted=False), (h0, c0))
        padded, _ = pad_packed_sequence(output)
        outputs = [padded[:len(sequence), index] for index, sequence in enumerate(sequences)]
    elif by_lltm_ffi:
        output, (h_n, c_n) = module(torch.stack(sequences, dim=1), (h0, c0))
        outputs = list(output.unbind(1))
    else:
        outputs, h_n, c_n = reference_layers(module, sequences, h0, c0)
    output_grads, h_grad, c_grad = grads
    results = {"outputs": torch.cat(outputs), "h_n": h_n, "c_n": c_n}
    loss = sum((result * grad.to(result.device, result.dtype)).sum()
               for result, grad in zip(results.values(),
                                       (torch.cat(output_grads), h_grad, c_grad)))
    names, parameters = zip(*module.named_parameters())
    gradients = torch.autograd.grad(loss, [h0, c0, *parameters, *sequences])
    return {**results, "d_h0": gradients[0], "d_c0": gradients[1],
            **{f"d_{name}": gradient for name, gradient in zip(names, gradients[2:])},
            "d_inputs": torch.cat(gradients[2 + len(names):])}


LAYERS = [pytest.param((1, False, False), id="1-layer-no-bias"),
          pytest.param((2, True, True), id="2-layer-bidirectional")]


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("layers", LAYERS)
def test_layers_are_as_accurate_as_torch_in_the_dtype(layers, packed, dtype, device, generator):
    num_layers, bidirectional, bias = layers
    module = lltm_ffi.LLTMSequence(7, 5, num_layers=num_layers, bias=bias,
                                   bidirectional=bidirectional, dtype=torch.float64)
    # The test's seeded values, not the initialiser's (torch's global generator).
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_((torch.rand(parameter.shape, generator=generator,
                                        dtype=torch.float64) * 2 - 1) / 5 ** 0.5)
    lengths = LENGTHS if packed else [4] * len(LENGTHS)
    directions = 2 if bidirectional else 1
    sequences = [torch.randn(length, 7, generator=generator, dtype=torch.float64)
                 for length in lengths]
    state_shape = (num_layers * directions, len(lengths), 5)
    h0, c0 = random_grads([state_shape] * 2, generator)
    grads = ([torch.randn(length, directions * 5, generator=generator, dtype=torch.float64)
              for length in lengths], *random_grads([state_shape] * 2, generator))
    half_module = copy.deepcopy(module).to(device, dtype)
    (*sequences, h0, c0), _ = rounded([*sequences, h0, c0], dtype, device)
    exact_module = copy.deepcopy(half_module).cpu().double()
    got = layers_results(half_module, sequences, h0, c0, grads, packed, by_lltm_ffi=True)
    in_torch = layers_results(half_module, sequences, h0, c0, grads, packed, by_lltm_ffi=False)
    exact = layers_results(exact_module, [sequence.cpu().double() for sequence in sequences],
                           h0.cpu().double(), c0.cpu().double(), grads, packed,
                           by_lltm_ffi=False)
    assert_as_accurate_as_torch(got, in_torch, exact, dtype, num_layers * max(lengths))


# The CPU's two paths for the 16-bit products (ARCHITECTURE.md, "The
# sequence's paths"): AMX's tiles where the CPU has them (LLTM_AMX=1: at
# every size, float16's too), and the portable products (LLTM_AMX=0), which
# every other CPU takes. Their products differ only in the order of
# float32's sums (the C checks hold each sum to that), so their results only
# where such a sum rounds to the dtype on the other side of a boundary, a
# unit of the dtype (two of roundoff) in a few elements, carried through
# steps and layers: PATHS_APART units of roundoff bound them over a tensor
# (over 60 seeds of these tests the largest was 1.03). Sizes no multiple of
# a tile (16 or 32), batch 1, one step; dense, reverse and packed steps.
CPU_PATH_SHAPES = [(1, 1, 3, 5), (6, 1, 7, 33), (5, 17, 40, 130), (3, 33, 9, 70)]
PATHS_APART = 4.0


def on_both_cpu_paths(function, monkeypatch, variable="LLTM_AMX", names=("AMX", "portable")):
    """{path: function()} with the products on AMX, then the portable ones
    (or, with variable LLTM_BLAS, on the BLAS, then the own tiles)."""
    results = {}
    for path, setting in zip(names, ("1", "0")):
        monkeypatch.setenv(variable, setting)
        results[path] = function()
    return results


def assert_paths_agree(paths, dtype):
    """Each result of the first path within PATHS_APART units of roundoff of the second one's."""
    first, second = paths
    failures = [f"{name}: {error:.3g}" for name, value in paths[first].items()
                if not (error := selfcheck.relative_error(value, paths[second][name]))
                <= PATHS_APART * UNIT_ROUNDOFF[dtype]]
    assert not failures, f"{first} against {second}: {'; '.join(failures)}"


def assert_sequence_paths_agree(shape, reverse, dtype, generator, on_paths):
    """lltm_sequence at `shape` on two CPU paths (on_paths(run): {path:
    run()}, run on each): each as accurate as torch in the dtype, and the
    two within PATHS_APART units of roundoff of each other."""
    steps, batch, features, state = shape
    arguments = [torch.randn(steps, batch, features, generator=generator, dtype=torch.float64),
                 *selfcheck.random_inputs(batch, features, state, torch.float64, "cpu",
                                          generator)[1:]]
    grads = random_grads([(steps, batch, state), (batch, state), (batch, state)], generator)
    halves, doubles = rounded(arguments, dtype, "cpu")
    paths = on_paths(lambda: with_gradients(ffi_sequence(reverse), halves, grads, SEQUENCE_NAMES))
    in_torch = with_gradients(torch_sequence(reverse), halves, grads, SEQUENCE_NAMES)
    exact = with_gradients(torch_sequence(reverse), doubles, grads, SEQUENCE_NAMES)
    for got in paths.values():
        assert_as_accurate_as_torch(got, in_torch, exact, dtype, steps)
    assert_paths_agree(paths, dtype)


@needs_amx
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("shape", CPU_PATH_SHAPES, ids=lambda shape: "x".join(map(str, shape)))
def test_the_cpu_product_paths_agree(shape, reverse, dtype, monkeypatch, generator):
    assert_sequence_paths_agree(shape, reverse, dtype, generator,
                                lambda run: on_both_cpu_paths(run, monkeypatch))


@needs_amx
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_a_bfloat16_row_takes_the_dot_products_beside_amx_on_four_threads(reverse, generator):
    """A bfloat16 pass of one row (src/cpu/lltm_amx.c, product_tiles): where
    the CPU has AMX, AMX's tiles on 1 thread and AVX512-BF16's dot products,
    where it has them too, on 4; where it has the dot products alone, those
    on both. The recurrence each pass reports says which; the two agree as
    the CPU's paths do."""
    saved = torch.get_num_threads()
    recurrences = {}

    def on_threads(run):
        results = {}
        try:
            for threads in (1, 4):
                torch.set_num_threads(threads)
                results[threads] = run()
                recurrence = _extension.lib.lltm_cpu_recurrence()
                recurrences[threads] = _extension.ffi.string(recurrence).decode()
        finally:
            torch.set_num_threads(saved)
        return results

    assert_sequence_paths_agree((6, 1, 7, 33), reverse, torch.bfloat16, generator, on_threads)
    with open("/proc/cpuinfo") as cpuinfo:
        dots = "avx512_bf16" in cpuinfo.read()
    amx = bool(_extension.lib.lltm_amx_tiles())
    assert recurrences == {1: "amx" if amx else "avx512-bf16",
                           4: "avx512-bf16" if dots else "amx"}


@needs_amx
@pytest.mark.parametrize("dtype", HALVES)
def test_the_cpu_product_paths_agree_on_packed_layers(dtype, monkeypatch, generator):
    module = lltm_ffi.LLTMSequence(9, 70, num_layers=2, bidirectional=True, dtype=dtype)
    lengths = [7, 1, 4, 3]
    sequences = [torch.randn(length, 9, generator=generator).to(dtype) for length in lengths]
    h0, c0 = (torch.randn(4, len(lengths), 70, generator=generator).to(dtype) for _ in range(2))
    grads = ([torch.randn(length, 140, generator=generator, dtype=torch.float64)
              for length in lengths], *random_grads([(4, len(lengths), 70)] * 2, generator))
    paths = on_both_cpu_paths(
        lambda: layers_results(module, sequences, h0, c0, grads, True, by_lltm_ffi=True),
        monkeypatch)
    assert_paths_agree(paths, dtype)


# The portable products' two paths (LLTM_AMX=0): the BLAS's on float32
# copies of the factors (LLTM_BLAS=1, every product it takes) and the own
# tiles (LLTM_BLAS=0). Again their products differ only in the order of
# float32's sums. Without a BLAS both are the own tiles.
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("shape", CPU_PATH_SHAPES + [(4, 2, 6, 300), (3, 9, 5, 40)],
                         ids=lambda shape: "x".join(map(str, shape)))
def test_the_blas_and_the_own_products_agree(shape, reverse, dtype, monkeypatch):
    monkeypatch.setenv("LLTM_AMX", "0")
    assert_sequence_paths_agree(
        shape, reverse, dtype, torch.Generator().manual_seed(20240531),
        lambda run: on_both_cpu_paths(run, monkeypatch, "LLTM_BLAS", ("BLAS", "own tiles")))


@needs_amx
def test_a_float16_product_amx_declines_takes_the_portable_products(monkeypatch, generator):
    """A float16 factor that is inf or NaN is no tile product's (its pieces'
    products would make inf times zero): those products run the portable
    way, and give what the portable path gives, inf and NaN where it has
    them."""
    steps, batch, features, state = 4, 3, 5, 40
    inputs = torch.randn(steps, batch, features, generator=generator).half()
    inputs[2, 1, 3] = float("inf")
    arguments = [inputs, *(tensor.half() for tensor in selfcheck.random_inputs(
        batch, features, state, torch.float64, "cpu", generator)[1:])]
    paths = on_both_cpu_paths(lambda: lltm_ffi.lltm_sequence(*arguments)[0], monkeypatch)
    amx, portable = paths["AMX"], paths["portable"]
    finite = amx.isfinite()
    assert not finite.all()
    assert torch.equal(amx.isnan(), portable.isnan())
    assert torch.equal(amx[amx.isinf()], portable[portable.isinf()])
    assert (selfcheck.relative_error(amx[finite], portable[finite])
            <= PATHS_APART * UNIT_ROUNDOFF[torch.float16])


@pytest.mark.parametrize("dtype", HALVES)
def test_sequence_module_converted_to_the_dtype(dtype, device, generator):
    """LLTMSequence(...).to(dtype): the zero initial state, batch_first and
    unbatched inputs in dtype; its outputs and gradients in dtype."""
    module = lltm_ffi.LLTMSequence(7, 5, num_layers=2, bidirectional=True,
                                   batch_first=True).to(device, dtype)
    inputs = torch.randn(3, 4, 7, generator=generator).to(device, dtype)
    output, (h_n, c_n) = module(inputs)
    assert output.dtype == h_n.dtype == c_n.dtype == dtype
    assert output.shape == (3, 4, 10) and h_n.shape == (4, 3, 5)
    output.float().square().sum().backward()
    assert all(parameter.grad.dtype == dtype and parameter.grad.abs().sum() > 0
               for parameter in module.parameters())
    single, (h_single, _) = module(inputs[1])
    assert single.dtype == h_single.dtype == dtype
    torch.testing.assert_close(single, output[1])


# round_ste -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALVES)
def test_round_ste(dtype, device, generator):
    x = (torch.rand(5, 33, generator=generator) * 2 - 0.5).to(device, dtype)
    half, zero, one = (torch.tensor(value, dtype=dtype) for value in (0.5, 0.0, 1.0))
    # 0.5 and its neighbours in the dtype
    x[0, :3] = torch.stack((half, torch.nextafter(half, zero), torch.nextafter(half, one)))
    leaf = x.clone().requires_grad_(True)
    y = lltm_ffi.round_ste(leaf)
    assert y.dtype == dtype
    assert torch.equal(y, (x >= 0.5).to(dtype))
    assert y[0, :3].tolist() == [1, 0, 1]
    assert 0 < y.sum() < y.numel()
    grad = torch.randn(x.shape, generator=generator).to(device, dtype)
    y.backward(grad)
    assert torch.equal(leaf.grad, grad)


# Refusals -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("name", CELL_NAMES[1])
def test_a_half_argument_among_float32_ones_is_refused_naming_it(name, dtype, device,
                                                                  generator):
    arguments = list(selfcheck.random_inputs(3, 7, 5, torch.float32, device, generator))
    index = CELL_NAMES[1].index(name)
    arguments[index] = arguments[index].to(dtype)
    # Each argument is compared with the input: a half input makes weights the odd one.
    message = (f"lltm: weights has dtype torch.float32 but input has {dtype}" if name == "input"
               else f"lltm: {name} has dtype {dtype} but input has torch.float32")
    with raises_with(TypeError, message, "same dtype"):
        lltm_ffi.lltm(*arguments)


@pytest.mark.parametrize("dtype", HALVES)
def test_mixed_half_dtypes_are_refused_naming_the_argument(dtype, device, generator):
    other = torch.float16 if dtype == torch.bfloat16 else torch.bfloat16
    arguments = [torch.randn(4, 3, 7, generator=generator),
                 *selfcheck.random_inputs(3, 7, 5, torch.float32, "cpu", generator)[1:]]
    arguments = [argument.to(device, dtype) for argument in arguments]
    arguments[4] = arguments[4].to(other)
    with raises_with(TypeError, f"lltm_sequence: c0 has dtype {other} but inputs has {dtype}",
                     "same dtype"):
        lltm_ffi.lltm_sequence(*arguments)
    module = lltm_ffi.LLTMSequence(7, 5).to(device, dtype)
    with raises_with(TypeError, f"LLTMSequence: input has dtype {other}", str(dtype)):
        module(arguments[0].to(other))


@pytest.mark.parametrize("dtype", HALVES)
def test_an_op_whose_passes_take_no_half_refuses_it_naming_the_argument(dtype, device):
    """roi_pool's C passes take float32 and float64 only: the refusal names
    the argument and lists what the op takes on the device, as the
    registry says."""
    taken = _extension.pass_dtypes("roi_pool_forward", device.type)
    assert taken == (torch.float32, torch.float64)
    input = torch.rand(1, 2, 6, 6, device=device, dtype=dtype)
    rois = torch.tensor([[0, 0, 0, 4, 4]], device=device, dtype=dtype)
    with raises_with(TypeError, f"roi_pool: input has dtype {dtype}; on {device.type} roi_pool "
                     "takes torch.float32 and torch.float64"):
        lltm_ffi.roi_pool(input, rois, 2, 2, 1.0)
    with raises_with(TypeError, f"lltm_ffi::roi_pool_forward: input has dtype {dtype}; on "
                     f"{device.type} lltm_ffi::roi_pool_forward takes torch.float32 and "
                     "torch.float64"):
        torch.ops.lltm_ffi.roi_pool_forward(input, rois, 2, 2, 1.0)


def test_the_lltm_passes_take_both_halves_on_every_device_they_run_on():
    """The registry the checks read: every pass of the LLTM and round_ste,
    forward and backward alike, takes the four dtypes wherever it runs;
    roi_pool's take two. (Other ops' dtypes are their own tests'.)"""
    expected_by_folder = {"lltm": _extension.DTYPES, "round_ste": _extension.DTYPES,
                          "roi_pool": _extension.FULL_PRECISION_DTYPES}
    checked = set()
    for name, declared in op.PASSES.items():
        folder = declared.body.__module__.split(".")[2]
        if folder not in expected_by_folder:
            continue
        checked.add(folder)
        for device_type in declared.devices:
            if device_type == "cuda" and not lltm_ffi.CUDA_COMPILED:
                continue
            assert _extension.pass_dtypes(name, device_type) == expected_by_folder[folder], (
                name, device_type)
    assert checked == set(expected_by_folder)


# The operators ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALVES)
def test_the_operators_pass_opcheck(dtype, device, generator):
    def normal(*shape):
        return torch.randn(*shape, generator=generator).to(device, dtype)

    gates, old_cell, grad_h, grad_cell = normal(3, 15), normal(3, 5), normal(3, 5), normal(3, 5)
    opcheck(torch.ops.lltm_ffi.forward_pass.default,
            (gates.requires_grad_(True), old_cell.requires_grad_(True)))
    new_h, new_cell = torch.ops.lltm_ffi.forward_pass(gates.detach(), old_cell.detach())
    opcheck(torch.ops.lltm_ffi.backward_pass.default,
            (grad_h, grad_cell, new_cell, gates.detach()))
    arguments = [normal(4, 3, 7), *(tensor.to(device, dtype) for tensor in selfcheck.random_inputs(
        3, 7, 5, torch.float32, "cpu", generator)[1:])]
    # Dense steps (batch_sizes None), then packed ones.
    rows, batch_sizes = arguments[0][:, :2].reshape(-1, 7)[:7], torch.tensor([2, 2, 2, 1])
    dense = (arguments[0].reshape(-1, 7), *arguments[1:], None)
    packed = (rows, arguments[1], arguments[2], arguments[3][:2], arguments[4][:2], batch_sizes)
    for (*tensors, sizes), reverse in itertools.product((dense, packed), (False, True)):
        opcheck(torch.ops.lltm_ffi.packed_forward.default,
                (*[tensor.clone().requires_grad_(True) for tensor in tensors], sizes, reverse))
        outputs, cells, gates, h_n, c_n = torch.ops.lltm_ffi.packed_forward(*tensors, sizes,
                                                                            reverse)
        opcheck(torch.ops.lltm_ffi.packed_backward.default,
                (*tensors[:4], sizes, reverse, outputs, cells, gates,
                 torch.randn_like(outputs), None, torch.randn_like(h_n), torch.randn_like(c_n)))
    opcheck(torch.ops.lltm_ffi.round_forward.default, (normal(2, 9),))


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.slow
def test_compile_fullgraph_of_a_half_sequence_matches_eager(dtype, device, generator):
    torch._dynamo.reset()
    module = lltm_ffi.LLTMSequence(7, 5, num_layers=2, bidirectional=True,
                                   batch_first=True).to(device, dtype)
    inputs = torch.randn(3, 6, 7, generator=generator).to(device, dtype)

    def loss(inputs):
        output, (h_n, c_n) = module(inputs)
        return output.float().square().mean() + c_n.float().sum()

    eager = loss(inputs)
    eager_grads = torch.autograd.grad(eager, list(module.parameters()))
    explanation = torch._dynamo.explain(loss)(inputs)
    assert explanation.graph_break_count == 0
    assert "lltm_ffi.packed_forward" in "\n".join(graph.code for graph in explanation.graphs)
    compiled = torch.compile(loss, fullgraph=True)(inputs)
    compiled_grads = torch.autograd.grad(compiled, list(module.parameters()))
    torch.testing.assert_close(compiled, eager)
    for value, expected in zip(compiled_grads, eager_grads):
        assert value.dtype == dtype
        torch.testing.assert_close(value, expected)


# Layouts --------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("layout", [misaligned, odd_strides, transposed],
                         ids=lambda layout: layout.__name__)
def test_non_contiguous_half_arguments_give_the_contiguous_results(layout, dtype, device,
                                                                   generator):
    """Every argument of the cell in `layout`, and the gradients of the
    outputs broadcast: the results of dense ones (exactly on the CPU: the
    same computation)."""
    arguments = [tensor.to(dtype) for tensor in
                 selfcheck.random_inputs(3, 7, 9, torch.float32, device, generator)]
    grads = [broadcast_rows(torch.randn(3, 9, generator=generator).to(device, dtype))
             for _ in range(2)]
    dense = cell_results(lltm_ffi.lltm, arguments, grads)
    views = [layout(argument) for argument in arguments]
    assert all(not view.is_contiguous() or view.data_ptr() % 16 for view in views)
    leaves = [view.detach().requires_grad_(True) for view in views]
    new_h, new_cell = lltm_ffi.lltm(*leaves)
    torch.autograd.backward((new_h, new_cell), grads)
    got = {"new_h": new_h, "new_cell": new_cell,
           **{f"d_{name}": leaf.grad for name, leaf in zip(CELL_NAMES[1], leaves)}}
    exact = {"rtol": 0, "atol": 0} if device.type == "cpu" else {}
    for name, value in got.items():
        torch.testing.assert_close(value, dense[name], **exact,
                                   msg=lambda message, name=name: f"{name}: {message}")
