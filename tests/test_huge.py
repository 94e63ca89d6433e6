"""Past 2^31 elements (GPU only; run alone with `-k huge`):

    python -m pytest -q -s tests/test_huge.py

The CUDA passes index with 32-bit arithmetic only while every index fits;
these tests take them past that on both kernel paths (16-byte packs, state
1024; one element, state 1023), forward and backward through lltm_ffi.lltm,
with gates of 3 x batch x state = 2.169e9 > 2^31 elements (about 7000 rows
lie past 2^31), and check every row against the reference cell (float64),
computed in slices of rows. A third test hands backward output gradients of
2 rows whose second row starts 2^31 elements after the first: the gradient
strides alone must move the passes to 64-bit indices.

Peak GPU memory (torch.cuda.max_memory_allocated, float32, F = 16 features):
12 * B * S + 2 * B * (S + F) + B * F + 6 * S * (S + F) elements during
backward (inputs, X, gates, both outputs, one dense output gradient,
d_old_cell, d_gates, d_X, d_weights) = 40.6 GB (37.9 GiB) for B = 706042,
S = 1024; the reference slices need less (about 25 GB). The strided-gradient
test needs 8.6 GB. Each test skips unless torch.cuda.mem_get_info() shows its
peak plus 4 GiB free, so it cannot run out of memory on an 80 GB H100; each
frees what it allocated before the next starts. Running time on an H100:
a few seconds each, mostly the float64 reference.
"""

import gc
import math

import pytest
import torch

import lltm_ffi
from conftest import skip_without_gpu
from lltm_ffi import reference, selfcheck

pytestmark = [pytest.mark.gpu, pytest.mark.huge]

FEATURES = 16
GiB = 2 ** 30
MARGIN = 4 * GiB
# Rows of the reference per slice: float64 work of about 30 x rows x state x 8 bytes.
SLICE_ROWS = 16384
# Relative error (in norm) allowed for d_weights and d_bias, sums over ~7e5
# rows in float32 (about sqrt(7e5) roundings); the per-row results keep
# selfcheck.TOLERANCES (1e-5).
SUMMED_TOLERANCE = 1e-4


def _batch_past_2_31(state_size):
    """Rows enough for 3 x batch x state to pass 2^31 by 1%."""
    return math.ceil(2 ** 31 * 1.01 / (3 * state_size))


def peak_bytes(batch_size, input_features, state_size, element_size=4):
    """lltm_ffi.lltm forward and backward: see the module docstring."""
    E, X = batch_size * state_size, batch_size * (state_size + input_features)
    weights = 3 * state_size * (state_size + input_features)
    return element_size * (12 * E + 2 * X + batch_size * input_features + 2 * weights)


def _free_memory_or_skip(needed):
    skip_without_gpu()
    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    if free < needed + MARGIN:
        pytest.skip(f"needs {(needed + MARGIN) / GiB:.1f} GiB of free GPU memory, "
                    f"{free / GiB:.1f} GiB of {total / GiB:.1f} GiB free")
    torch.cuda.reset_peak_memory_stats()


@pytest.fixture
def full_precision_matmul():
    """float32 products in float32 (no TF32), whatever earlier tests set."""
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(saved)
    gc.collect()
    torch.cuda.empty_cache()


class _Errors:
    """Relative errors in norm, slice by slice and over whole tensors."""

    def __init__(self):
        self.squares = {}
        self.worst_slice = {}

    def add(self, name, value, expected, rows):
        error = selfcheck.relative_error(value, expected)
        tolerance = selfcheck.TOLERANCES[value.dtype]
        assert error <= tolerance, (f"{name}, rows {rows[0]}..{rows[1] - 1}: relative error "
                                    f"{error:.3g} exceeds {tolerance:g}")
        difference = (value.double() - expected).norm().item() ** 2
        scale = expected.norm().item() ** 2
        old = self.squares.get(name, (0.0, 0.0))
        self.squares[name] = (old[0] + difference, old[1] + scale)
        self.worst_slice[name] = max(self.worst_slice.get(name, 0.0), error)

    def whole(self, name):
        difference, scale = self.squares[name]
        return math.sqrt(difference / scale) if scale else (0.0 if not difference else math.inf)


def _check_full_cell(batch_size, state_size, seed, device, slice_rows=SLICE_ROWS):
    generator = torch.Generator(device=device).manual_seed(seed)
    dtype = torch.float32

    def normal(*shape):
        return torch.randn(*shape, device=device, dtype=dtype, generator=generator)

    bound = 1 / math.sqrt(state_size)
    input = normal(batch_size, FEATURES)
    weights = (torch.rand(3 * state_size, state_size + FEATURES, device=device, dtype=dtype,
                          generator=generator) * 2 - 1) * bound
    bias = (torch.rand(3 * state_size, device=device, dtype=dtype, generator=generator) * 2 - 1) * bound
    old_h, old_cell = normal(batch_size, state_size), normal(batch_size, state_size)
    grad_h = normal(batch_size, state_size)
    # Broadcast rows (stride 0): the backward pass reads it through its strides.
    grad_cell = normal(1, state_size).expand(batch_size, state_size)

    leaves = [tensor.requires_grad_(True) for tensor in (input, weights, bias, old_h, old_cell)]
    new_h, new_cell = lltm_ffi.lltm(*leaves)
    gradients = torch.autograd.grad((new_h, new_cell), leaves, (grad_h, grad_cell))
    new_h, new_cell = new_h.detach(), new_cell.detach()
    for leaf in leaves:
        leaf.requires_grad_(False)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        estimate = peak_bytes(batch_size, FEATURES, state_size)
        print(f"\nlltm_ffi.lltm B={batch_size} F={FEATURES} S={state_size}: peak "
              f"{peak / GiB:.1f} GiB (estimate {estimate / GiB:.1f} GiB)")
        assert peak <= 1.1 * estimate, (f"peak {peak / GiB:.1f} GiB is over the documented "
                                        f"estimate {estimate / GiB:.1f} GiB: update test_huge.py")

    # The reference in float64, slice by slice; the weights are shared, so
    # d_weights and d_bias are the sums of the slices' contributions.
    weights64 = weights.double().requires_grad_(True)
    bias64 = bias.double().requires_grad_(True)
    d_weights = torch.zeros_like(weights64)
    d_bias = torch.zeros_like(bias64)
    errors = _Errors()
    d_input, _, _, d_old_h, d_old_cell = gradients
    for start in range(0, batch_size, slice_rows):
        rows = (start, min(start + slice_rows, batch_size))
        part = slice(*rows)
        slice_leaves = [tensor[part].double().requires_grad_(True)
                        for tensor in (input, old_h, old_cell)]
        expected_h, expected_cell = reference.lltm(slice_leaves[0], weights64, bias64,
                                                   slice_leaves[1], slice_leaves[2])
        expected = torch.autograd.grad(
            (expected_h, expected_cell), (slice_leaves[0], weights64, bias64, *slice_leaves[1:]),
            (grad_h[part].double(), grad_cell[part].double()))
        d_weights += expected[1]
        d_bias += expected[2]
        for name, value, wanted in (("new_h", new_h, expected_h), ("new_cell", new_cell, expected_cell),
                                    ("d_input", d_input, expected[0]),
                                    ("d_old_h", d_old_h, expected[3]),
                                    ("d_old_cell", d_old_cell, expected[4])):
            errors.add(name, value[part], wanted.detach(), rows)
        del slice_leaves, expected_h, expected_cell, expected
    del weights64, bias64
    for name in ("new_h", "new_cell", "d_input", "d_old_h", "d_old_cell"):
        assert errors.whole(name) <= selfcheck.TOLERANCES[dtype], \
            f"{name}: relative error {errors.whole(name):.3g} over all rows"
    for name, value, wanted in (("d_weights", gradients[1], d_weights),
                                ("d_bias", gradients[2], d_bias)):
        error = selfcheck.relative_error(value, wanted)
        assert error <= SUMMED_TOLERANCE, f"{name}: relative error {error:.3g}"
        print(f"  {name}: relative error {error:.3g}")
    for name, worst in errors.worst_slice.items():
        print(f"  {name}: relative error {errors.whole(name):.3g} (worst slice {worst:.3g})")
    if device.type == "cuda":
        print(f"  peak with the reference: {torch.cuda.max_memory_allocated(device) / GiB:.1f} GiB")


@pytest.mark.parametrize("state_size", [1024, 1023], ids=["wide_path", "one_element_path"])
def test_huge_forward_and_backward_past_2_31_elements(state_size, seed, full_precision_matmul):
    batch_size = _batch_past_2_31(state_size)
    assert 3 * batch_size * state_size > 2 ** 31
    _free_memory_or_skip(peak_bytes(batch_size, FEATURES, state_size))
    _check_full_cell(batch_size, state_size, seed, torch.device("cuda", torch.cuda.current_device()))


def test_huge_machinery_on_a_small_cpu_case(seed):
    """The same checks on a CPU-sized case cut into uneven slices, so that the
    slicing and the summing of d_weights and d_bias run in CI too."""
    _check_full_cell(37, 9, seed, torch.device("cpu"), slice_rows=8)


@pytest.mark.parametrize("state_size", [8, 7], ids=["wide_path", "one_element_path"])
def test_huge_gradient_stride_past_2_31_elements(state_size, seed, full_precision_matmul):
    """Output gradients of 2 x S elements whose second row starts 2^31
    elements after the first: few elements, but indices past 2^31."""
    row_stride, offset = 2 ** 31, 8  # grad_cell starts 8 elements (32 bytes) after grad_h
    batch_size, input_features = 2, 3
    span = row_stride + offset + state_size
    _free_memory_or_skip(span * 4)
    device = torch.device("cuda", torch.cuda.current_device())
    generator = torch.Generator(device=device).manual_seed(seed)
    buffer = torch.empty(span, device=device)
    for start in (0, row_stride):  # only the elements the views reach are written
        buffer[start:start + offset + state_size] = torch.randn(
            offset + state_size, device=device, generator=generator)
    views = [buffer.as_strided((batch_size, state_size), (row_stride, 1), storage_offset)
             for storage_offset in (0, offset)]
    inputs = selfcheck.random_inputs(batch_size, input_features, state_size, torch.float32,
                                     device, torch.Generator().manual_seed(seed))

    def gradients(function, grad_outputs):
        leaves = [tensor.detach().clone().requires_grad_(True) for tensor in inputs]
        return torch.autograd.grad(function(*leaves), leaves, grad_outputs)

    got = gradients(lltm_ffi.lltm, views)
    expected = gradients(reference.lltm, views)
    from_dense = gradients(lltm_ffi.lltm, [view.contiguous() for view in views])
    del buffer, views
    for name, value, wanted, dense in zip(selfcheck.GRADIENT_NAMES, got, expected, from_dense):
        torch.testing.assert_close(value, wanted, msg=lambda message, name=name: f"{name}: {message}")
        torch.testing.assert_close(value, dense, msg=lambda message, name=name: f"{name}: {message}")
