"""lltm_ffi against the pure-PyTorch reference: both outputs and all five
gradients, on fresh random inputs, within selfcheck.TOLERANCES."""

import pytest
import torch
import torch.nn.functional as F
import lltm_ffi
from conftest import assert_agrees_with_reference, random_inputs, random_like, shape_id
from lltm_ffi import ops, selfcheck

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
    errors = selfcheck.compare_with_reference(*shape, dtype, device, seed=seed)
    assert errors["seed"] == seed
    assert_agrees_with_reference(errors, dtype)


def test_batch_zero_gives_empty_outputs_and_gradients_of_input_shapes(dtype, device, generator):
    inputs = [tensor.requires_grad_(True) for tensor in
              random_inputs(generator, (0, 5, 7), dtype, device)]
    new_h, new_cell = lltm_ffi.lltm(*inputs)
    assert new_h.shape == new_cell.shape == (0, 7)
    assert (new_h.dtype, new_h.device) == (dtype, inputs[0].device)
    torch.autograd.backward((new_h, new_cell), (torch.ones_like(new_h), torch.ones_like(new_cell)))
    for tensor in inputs:
        assert tensor.grad is not None and tensor.grad.shape == tensor.shape
    # With no rows, nothing flows into the parameters.
    assert torch.count_nonzero(inputs[1].grad) == 0 and torch.count_nonzero(inputs[2].grad) == 0


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
        errors = selfcheck.compare_with_reference(batch, features, state, dtype, "cpu",
                                                  seed=case_seed)
        assert_agrees_with_reference(errors, dtype)


def _reference_pointwise(gates, old_cell):
    input_gate, output_gate, candidate = gates.chunk(3, dim=1)
    new_cell = old_cell + F.elu(candidate) * torch.sigmoid(input_gate)
    return torch.tanh(new_cell) * torch.sigmoid(output_gate), new_cell


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

    new_h, new_cell = ops.forward(gates, old_cell)
    d_old_cell, d_gates = ops.backward(grad_h, grad_cell, new_cell, gates)

    gates64, old_cell64 = (tensor.double().requires_grad_(True) for tensor in (gates, old_cell))
    expected_h, expected_cell = _reference_pointwise(gates64, old_cell64)
    torch.autograd.backward((expected_h, expected_cell), (grad_h.double(), grad_cell.double()))

    results = {"new_h": (new_h, expected_h), "new_cell": (new_cell, expected_cell),
               "d_old_cell": (d_old_cell, old_cell64.grad), "d_gates": (d_gates, gates64.grad)}
    errors = {name: selfcheck.relative_error(value, expected.detach())
              for name, (value, expected) in results.items()}
    for name, (value, _) in results.items():
        assert torch.isfinite(value).all(), f"{name} has non-finite values"
    assert max(errors.values()) <= POINTWISE_TOLERANCES[dtype], errors
