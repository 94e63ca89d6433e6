"""Agreement of the LLTM cell with the pure-PyTorch reference on seeded
random inputs: outputs and all five gradients, as relative errors against
the reference computed in float64. Used by test.py, the LLTM's self-check
(`python -m lltm_ffi`), the test suite, the demo and the benchmark's
agreement check. Without a seed the inputs are DEFAULT_SEED's, the same in
every run, so a check that passes once passes every time."""

import torch

from . import reference
from .ops.lltm.cell import lltm

OUTPUT_NAMES = ("new_h", "new_cell")
GRADIENT_NAMES = ("d_input", "d_weights", "d_bias", "d_old_h", "d_old_cell")

# Largest relative error (in norm) accepted for each element type: float32
# carries ~6e-8 per operation and the matrix products sum over thousands of terms.
TOLERANCES = {torch.float32: 1e-5, torch.float64: 1e-12}
DEFAULT_SEED = 0


def random_inputs(batch_size, input_features, state_size, dtype, device, generator=None):
    """(input, weights, bias, old_h, old_cell) drawn like real use: unit
    normal activations and states, weights and bias as LLTM initialises them."""
    def normal(*shape):
        return torch.randn(*shape, generator=generator, dtype=dtype).to(device)

    bound = 1.0 / max(state_size, 1) ** 0.5
    weights = (torch.rand(3 * state_size, state_size + input_features, generator=generator,
                          dtype=dtype) * 2 - 1) * bound
    bias = (torch.rand(3 * state_size, generator=generator, dtype=dtype) * 2 - 1) * bound
    return (normal(batch_size, input_features), weights.to(device), bias.to(device),
            normal(batch_size, state_size), normal(batch_size, state_size))


def relative_error(value, expected):
    """||value - expected|| / ||expected||, in float64; 0 for two empty tensors."""
    expected = expected.double()
    difference = (value.double() - expected).norm().item()
    scale = expected.norm().item()
    if difference == 0.0:
        return 0.0
    return difference / scale if scale > 0 else float("inf")


def _outputs_and_gradients(function, inputs, grad_h, grad_cell):
    leaves = [tensor.detach().clone().requires_grad_(True) for tensor in inputs]
    new_h, new_cell = function(*leaves)
    torch.autograd.backward((new_h, new_cell), (grad_h, grad_cell))
    # Gradients in the tutorial's order: input, weights, bias, old_h, old_cell.
    return (new_h.detach(), new_cell.detach()), tuple(leaf.grad for leaf in leaves)


def compare_with_reference(batch_size, input_features, state_size, dtype, device,
                           seed=DEFAULT_SEED, function=lltm):
    """Runs `function` and the reference on the same random inputs and output
    gradients, drawn from `seed`; returns {name: relative error} for both
    outputs and all five gradients, plus the seed (so a failure can be
    replayed)."""
    generator = torch.Generator().manual_seed(seed)
    inputs = random_inputs(batch_size, input_features, state_size, dtype, device, generator)
    grad_h = torch.randn(batch_size, state_size, generator=generator, dtype=dtype).to(device)
    grad_cell = torch.randn(batch_size, state_size, generator=generator, dtype=dtype).to(device)

    outputs, gradients = _outputs_and_gradients(function, inputs, grad_h, grad_cell)
    inputs64 = [tensor.double() for tensor in inputs]
    expected_outputs, expected_gradients = _outputs_and_gradients(
        reference.lltm, inputs64, grad_h.double(), grad_cell.double())

    errors = {"seed": seed}
    for names, values, expected in ((OUTPUT_NAMES, outputs, expected_outputs),
                                    (GRADIENT_NAMES, gradients, expected_gradients)):
        for name, value, reference_value in zip(names, values, expected):
            if value.shape != reference_value.shape:
                raise AssertionError(f"{name} has shape {tuple(value.shape)}, "
                                     f"reference {tuple(reference_value.shape)}")
            errors[name] = relative_error(value, reference_value)
    return errors


def worst(errors):
    """The largest error in a compare_with_reference result and its name."""
    name = max((key for key in errors if key != "seed"), key=lambda key: errors[key])
    return name, errors[name]


def disagreement(batch_size, input_features, state_size, dtype, device, seed=DEFAULT_SEED,
                 function=lltm, tolerance=None):
    """The one agreement check: None when `function` agrees with the reference
    on random inputs from `seed` (outputs and all five gradients within
    `tolerance`, TOLERANCES[dtype] by default); else a sentence naming the
    worst tensor, its relative error, the tolerance and how to replay the
    inputs."""
    errors = compare_with_reference(batch_size, input_features, state_size, dtype, device,
                                    seed=seed, function=function)
    name, error = worst(errors)
    tolerance = TOLERANCES[dtype] if tolerance is None else tolerance
    if error <= tolerance:
        return None
    return (f"{name} has relative error {error:.3g}, tolerance {tolerance:g} at "
            f"{batch_size}x{input_features}x{state_size} ({str(dtype).replace('torch.', '')}, "
            f"{device}; replay with seed={errors['seed']})")
