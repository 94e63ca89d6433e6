"""lltm_ffi against the pure-PyTorch reference: both outputs and all five
gradients on fresh random inputs (fixed shapes, seeded random shapes and
value scales, the kernel paths' edge shapes), and the two fused passes alone
(torch.ops.lltm_ffi.forward_pass and backward_pass) on every path the C and
CUDA code can take, against the cell's pointwise part in float64.

A failure prints the seed; LLTM_TEST_SEED=<seed> replays the same shapes,
scales and values. No hypothesis: the project depends on torch, cffi and
pytest only."""

import math
import random

import pytest
import torch

import builders
import lltm_ffi
from builders import random_grad_outputs, random_inputs, random_like
from conftest import (ARGUMENT_NAMES, PASS_NAMES, RESULT_NAMES, allowed_error,
                      assert_cell_agrees, cell_disagreements, outputs_and_gradients, shape_id)
from lltm_ffi import reference, selfcheck
from lltm_ffi.ops.lltm import cell

# (batch, input_features, state_size)
SHAPES = [
    (1, 4, 3),        # batch 1
    (3, 5, 7),        # odd sizes
    (13, 17, 19),
    (2, 3, 257),      # state sizes that are not a multiple of the CUDA block size (256)
    (5, 4, 300),
    (3, 8, 1000),
    (4, 2048, 33),    # large features
    (40, 16, 1000),   # 40000 elements: the CPU passes take their OpenMP path
    (7, 0, 5),        # no input features: the gates come from old_h alone
]


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_outputs_and_gradients_match_reference(shape, dtype, device, seed):
    assert_cell_agrees(shape, dtype, device, seed)


def test_state_depends_on_every_input(generator):
    """Guards the agreement tests against a cell that ignores an argument:
    changing any one input changes the outputs."""
    inputs = random_inputs(generator, (3, 5, 7))
    new_h, new_cell = lltm_ffi.lltm(*inputs)
    for index in range(len(inputs)):
        changed = list(inputs)
        changed[index] = random_like(inputs[index], generator)
        other_h, other_cell = lltm_ffi.lltm(*changed)
        assert not torch.allclose(other_h, new_h), f"new_h ignores argument {index}"
    assert not torch.allclose(new_cell, inputs[4])


def test_random_small_shapes_match_reference_on_cpu(generator):
    """25 shapes and dtypes drawn from the test's seed (replayable)."""
    for _ in range(25):
        batch, features, state = (int(torch.randint(1, high, (1,), generator=generator))
                                  for high in (10, 41, 71))
        dtype = (torch.float32, torch.float64)[int(torch.randint(2, (1,), generator=generator))]
        case_seed = int(torch.randint(2**62, (1,), generator=generator))
        assert_cell_agrees((batch, features, state), dtype, "cpu", case_seed)


# Seeded random shapes (batch 1..33, input_features 0..70, state_size
# 1..300) and value scales (each argument scaled by its own factor,
# log-uniform in 1e-3..30), within conftest.allowed_error: large scales
# saturate the gates and make the cell ill-conditioned.
CASES = 30  # per device and dtype
SCALE_RANGE = (1e-3, 30.0)


def _draw(seed):
    """(batch, input_features, state_size) and one scale per argument, from `seed`."""
    rng = random.Random(seed)
    shape = (rng.randint(1, 33), rng.randint(0, 70), rng.randint(1, 300))
    low, high = (math.log(bound) for bound in SCALE_RANGE)
    scales = [math.exp(rng.uniform(low, high)) for _ in range(5)]
    return shape, scales


def _scaled(scales, monkeypatch):
    """Makes compare_with_reference draw its inputs scaled by `scales`."""
    draw = selfcheck.random_inputs

    def scaled_inputs(*args, **kwargs):
        return tuple(tensor * scale for tensor, scale in zip(draw(*args, **kwargs), scales))

    monkeypatch.setattr(selfcheck, "random_inputs", scaled_inputs)


@pytest.mark.parametrize("case", range(CASES))
def test_random_shape_and_scales_agree_with_reference(case, dtype, device, seed, monkeypatch):
    shape, scales = _draw(seed)
    _scaled(scales, monkeypatch)
    failures = cell_disagreements(shape, dtype, device, seed)
    assert not failures, (f"shape {shape_id(shape)}, scales "
                          f"{', '.join(f'{scale:.3g}' for scale in scales)} (input, weights, "
                          f"bias, old_h, old_cell), seed {seed}: " + "; ".join(failures))


# Fixed shapes for both kernel paths and their edges (also what `make memcheck`
# runs the CUDA kernels on): batch 1, one state, no features, state a
# multiple of 4 (float32 16-byte packs) or of 2 (float64) or neither, the CUDA
# block size (256) and one past it.
EDGE_SHAPES = [(1, 1, 1), (1, 0, 4), (1, 3, 8), (2, 5, 3), (1, 2, 2), (4, 3, 12), (7, 9, 65),
               (5, 7, 256), (33, 1, 257), (3, 70, 300), (2, 4, 6), (9, 11, 1)]


@pytest.mark.parametrize("shape", EDGE_SHAPES, ids=shape_id)
def test_edge_shapes_agree_with_reference(shape, dtype, device, seed):
    assert_cell_agrees(shape, dtype, device, seed)


# On a GPU an eager step runs as a sequence of length 1 in lltm_ffi's own
# kernels (src/cuda/step_kernel.cu) while its gate product takes at most
# LLTM_STEP_MULTIPLY_ADDS (src/plan.c) multiply-adds, in torch's products
# past that; which kernels a backward pass launches depends on the gradients wanted,
# and the product kernel's tiles (64 or 32 rows) on the sizes.
STEP_SHAPES = [
    (3, 7, 512),       # the weights' gradient in tiles of 64 rows
    (1300, 30, 200),   # the gate product in tiles of 64 rows, 1300 rows not a multiple of 64
    (300, 20, 100),    # every product in tiles of 32 rows
    (1100, 256, 512),  # past LLTM_STEP_MULTIPLY_ADDS (src/plan.c): torch's products
]
WANTED = [("input", "weights", "bias", "old_h", "old_cell"), ("weights", "bias"), ("weights",),
          ("bias",), ("input",), ("old_h",), ("old_cell",), ("input", "old_cell")]


def _assert_step_results_agree(values, expected, dtype):
    """new_h, new_cell and the five gradients against the float64 reference's
    (None for a gradient not wanted, which must be None too)."""
    for name, value, wanted in zip(RESULT_NAMES, values, expected):
        if wanted is None:
            assert value is None, f"{name}: a gradient that was not wanted"
            continue
        assert value.shape == wanted.shape, name
        error = selfcheck.relative_error(value, wanted)
        assert error <= selfcheck.TOLERANCES[dtype], f"{name}: relative error {error:.3g}"


@pytest.mark.parametrize("wanted", WANTED, ids="+".join)
@pytest.mark.parametrize("shape", STEP_SHAPES, ids=shape_id)
def test_gpu_step_paths_agree_with_reference(shape, wanted, dtype, cuda_device, generator):
    assert cell.uses_step_kernels(*shape, dtype) == (shape != STEP_SHAPES[-1])
    inputs = random_inputs(generator, shape, dtype, cuda_device)
    grads = random_grad_outputs(inputs, generator)
    outputs, gradients = outputs_and_gradients(inputs, grads, requires_grad=wanted)
    expected_outputs, expected_gradients = outputs_and_gradients(
        [tensor.double() for tensor in inputs], [grad.double() for grad in grads],
        function=reference.lltm, requires_grad=wanted)
    _assert_step_results_agree(outputs + gradients, expected_outputs + expected_gradients, dtype)


# The step passes called directly: sizes with no element (every gradient
# zeros) and an output gradient broadcast along the batch.
STEP_PASS_SHAPES = [(1, 4, 3), (5, 0, 9), (37, 13, 33), (0, 3, 4), (4, 3, 0)]


@pytest.mark.parametrize("wanted", WANTED[:3] + WANTED[4:], ids="+".join)
@pytest.mark.parametrize("shape", STEP_PASS_SHAPES, ids=shape_id)
def test_step_passes_agree_with_reference(shape, wanted, dtype, cuda_device, generator):
    inputs = random_inputs(generator, shape, dtype, cuda_device)
    grad_h, grad_cell = random_grad_outputs(inputs, generator)
    grad_h = grad_h[:1].expand_as(grad_h)
    new_h, new_cell, gates = cell.step_forward(*inputs)
    gradients = cell.step_backward.run(
        *inputs[:4], new_cell, gates, grad_h, grad_cell,
        wanted=tuple(name in wanted for name in ARGUMENT_NAMES))
    expected_outputs, expected_gradients = outputs_and_gradients(
        [tensor.double() for tensor in inputs], [grad_h.double(), grad_cell.double()],
        function=reference.lltm, requires_grad=wanted)
    _assert_step_results_agree([new_h, new_cell, *gradients],
                               expected_outputs + expected_gradients, dtype)


# Relative error (in norm) of the fused passes alone, against float64 on the
# same values: a few rounding errors per element, with no matrix product in
# the way. selfcheck.TOLERANCES also budgets for long matrix-product sums, so
# it would let a float32 exp that is off by 1e-5 pass.
POINTWISE_TOLERANCES = {torch.float32: 1e-6, torch.float64: 1e-14}


def test_fused_passes_are_accurate_over_a_wide_range_of_gates(dtype, device, generator):
    batch_size, state_size = 64, 300

    def normal(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=generator, dtype=dtype)).to(device)

    gates = normal(batch_size, 3 * state_size, scale=4.0)
    gates[:, ::17] *= 30  # deep in saturation, past where exp overflows in float32
    old_cell, grad_h, grad_cell = (normal(batch_size, state_size, scale=2.0) for _ in range(3))

    new_h, new_cell = cell.forward_pass.run(gates, old_cell)
    d_old_cell, d_gates = cell.backward_pass.run(grad_h, grad_cell, new_cell, gates)

    gates64, old_cell64 = (tensor.double().requires_grad_(True) for tensor in (gates, old_cell))
    expected_h, expected_cell = reference.pointwise(gates64, old_cell64)
    torch.autograd.backward((expected_h, expected_cell), (grad_h.double(), grad_cell.double()))

    results = {"new_h": (new_h, expected_h), "new_cell": (new_cell, expected_cell),
               "d_old_cell": (d_old_cell, old_cell64.grad), "d_gates": (d_gates, gates64.grad)}
    errors = {name: selfcheck.relative_error(value, expected.detach())
              for name, (value, expected) in results.items()}
    for name, (value, _) in results.items():
        assert torch.isfinite(value).all(), f"{name} has non-finite values"
    assert max(errors.values()) <= POINTWISE_TOLERANCES[dtype], errors


# (batch, state) of the fused passes: state % 4 == 0 (float32 16-byte packs),
# % 2 (float64) or neither, batch 1, one state, the CUDA block size and one past it.
PASS_SHAPES = [(1, 1), (1, 4), (1, 8), (2, 2), (2, 3), (3, 7), (4, 8), (6, 6), (7, 65), (5, 256),
               (33, 257), (3, 12)]


def _dense(tensor):
    return tensor


GRADIENT_LAYOUTS = {"dense": _dense, "misaligned": builders.misaligned,
                    "transposed": builders.transposed, "every_other": builders.every_other,
                    "broadcast_rows": builders.broadcast_rows,
                    "broadcast_all": builders.broadcast_all}


def _on_device(tensor, layout, device):
    return builders.copied_to(layout(tensor), device)


def _expected(gates, old_cell, grad_h, grad_cell, dtype=torch.float64):
    """new_h, new_cell, d_old_cell, d_gates from the cell's definition, in `dtype`."""
    gates = gates.to(dtype).requires_grad_(True)
    old_cell = old_cell.to(dtype).requires_grad_(True)
    new_h, new_cell = reference.pointwise(gates, old_cell)
    d_gates, d_old_cell = torch.autograd.grad((new_h, new_cell), (gates, old_cell),
                                              (grad_h.to(dtype), grad_cell.to(dtype)))
    return new_h.detach(), new_cell.detach(), d_old_cell, d_gates


def _check(got, expected, float32_expected, dtype):
    """Each result within allowed_error of `expected` (float64), given the
    error of `float32_expected` (the same computed in float32): a result of
    one or a few elements can cancel (new_cell = old_cell + candidate *
    input_gate, say)."""
    for name, value, wanted, conditioning in zip(PASS_NAMES, got, expected, float32_expected):
        assert value.shape == wanted.shape and value.dtype == dtype, \
            f"{name}: {value.dtype} {tuple(value.shape)}"
        error = selfcheck.relative_error(value.cpu(), wanted)
        allowed = allowed_error(dtype, selfcheck.relative_error(conditioning, wanted))
        assert error <= allowed, f"{name}: relative error {error:.3g} > {allowed:.3g}"


@pytest.mark.parametrize("layout", GRADIENT_LAYOUTS)
@pytest.mark.parametrize("shape", PASS_SHAPES, ids=shape_id)
def test_fused_passes(shape, layout, dtype, device, generator):
    """Pointers one element off 16-byte alignment, and output gradients that
    are broadcast, transposed, every other element or misaligned. Every
    device tensor is a copy of a CPU tensor (or a view of one), and results
    come back with .cpu(): nothing the passes read was written by another
    kernel, which is what `make initcheck` needs (it instruments the lltm
    kernels only)."""
    batch_size, state_size = shape

    def normal(*size, scale=1.0):
        return torch.randn(*size, generator=generator, dtype=dtype) * scale

    gates, old_cell = normal(batch_size, 3 * state_size, scale=3.0), normal(batch_size, state_size)
    grad_h, grad_cell = normal(batch_size, state_size), normal(batch_size, state_size)
    expected_grads = []
    device_grads = []
    for grad in (grad_h, grad_cell):
        view = _on_device(grad, GRADIENT_LAYOUTS[layout], device)
        device_grads.append(view)
        expected_grads.append(view.cpu())  # the values the view holds (broadcast ones repeat)

    # The pass inputs misaligned too when the gradients are.
    inputs_layout = builders.misaligned if layout == "misaligned" else _dense
    device_gates = _on_device(gates, inputs_layout, device)
    device_old_cell = _on_device(old_cell, inputs_layout, device)
    new_h, new_cell = torch.ops.lltm_ffi.forward_pass(device_gates, device_old_cell)
    d_old_cell, d_gates = torch.ops.lltm_ffi.backward_pass(
        device_grads[0], device_grads[1], _on_device(new_cell.cpu(), inputs_layout, device),
        device_gates)
    _check((new_h, new_cell, d_old_cell, d_gates), _expected(gates, old_cell, *expected_grads),
           _expected(gates, old_cell, *expected_grads, torch.float32), dtype)
