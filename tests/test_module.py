"""lltm_ffi.LLTM, the nn.Module: parameters, initialisation, forward, dtype
conversion and training."""

import math

import pytest
import torch

import lltm_ffi
from builders import random_like
from conftest import raises_with


def _state(batch_size, rnn, generator):
    """Random (h, C) matching `rnn`'s state size, dtype and device."""
    weights = rnn.weights
    return tuple(torch.randn(batch_size, rnn.state_size, generator=generator,
                             dtype=weights.dtype).to(weights.device) for _ in range(2))


def _input(batch_size, rnn, generator):
    weights = rnn.weights
    return torch.randn(batch_size, rnn.input_features, generator=generator,
                       dtype=weights.dtype).to(weights.device)


def test_parameter_shapes_dtype_and_device(device):
    rnn = lltm_ffi.LLTM(5, 7, device=device)
    parameters = dict(rnn.named_parameters())
    assert set(parameters) == {"weights", "bias"}
    assert rnn.weights.shape == (21, 12)
    assert rnn.bias.shape == (21,)
    for parameter in parameters.values():
        assert parameter.dtype == torch.float32 and parameter.device.type == device.type
        assert parameter.requires_grad
    assert "input_features=5, state_size=7" in repr(rnn)


@pytest.mark.parametrize("state_size", [4, 100])
def test_reset_parameters_draws_within_one_over_sqrt_state_size(state_size):
    rnn = lltm_ffi.LLTM(30, state_size, dtype=torch.float64)
    bound = 1 / math.sqrt(state_size)
    for name, parameter in rnn.named_parameters():
        magnitude = parameter.detach().abs()
        assert magnitude.max() <= bound, name
        assert torch.unique(parameter.detach()).numel() == parameter.numel(), name
    # The weights (thousands of draws) fill the interval: some lie near each end.
    weights = rnn.weights.detach()
    assert weights.max() > 0.9 * bound and weights.min() < -0.9 * bound

    before = [parameter.detach().clone() for parameter in rnn.parameters()]
    rnn.reset_parameters()
    for old, new in zip(before, rnn.parameters()):
        assert not torch.equal(old, new)
        assert new.abs().max() <= bound


def test_construction_does_not_reseed_the_global_generator():
    first, second = lltm_ffi.LLTM(3, 4), lltm_ffi.LLTM(3, 4)
    assert not torch.equal(first.weights, second.weights)
    assert not torch.equal(first.bias, second.bias)


def test_manual_seed_before_construction_reproduces_the_parameters(seed):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        first = lltm_ffi.LLTM(3, 4)
        after_first = torch.rand(3)
        torch.manual_seed(seed)
        second = lltm_ffi.LLTM(3, 4)
        after_second = torch.rand(3)
    assert torch.equal(first.weights, second.weights)
    assert torch.equal(first.bias, second.bias)
    # Construction draws from the global generator and leaves it where the draws end.
    assert torch.equal(after_first, after_second)


def test_forward_equals_lltm_with_the_module_parameters(dtype, device, generator):
    rnn = lltm_ffi.LLTM(6, 9, device=device, dtype=dtype)
    input = _input(4, rnn, generator)
    state = _state(4, rnn, generator)
    new_h, new_cell = rnn(input, state)
    expected_h, expected_cell = lltm_ffi.lltm(input, rnn.weights, rnn.bias, *state)
    assert torch.equal(new_h, expected_h) and torch.equal(new_cell, expected_cell)
    assert new_h.requires_grad and new_h.dtype == dtype


def test_to_float64_converts_parameters_and_outputs(device, generator):
    rnn = lltm_ffi.LLTM(6, 9, device=device)
    weights32 = rnn.weights.detach().clone()
    rnn = rnn.to(torch.float64)
    assert rnn.weights.dtype == rnn.bias.dtype == torch.float64
    assert torch.equal(rnn.weights.detach(), weights32.double())

    input, state = _input(4, rnn, generator), _state(4, rnn, generator)
    new_h, new_cell = rnn(input, state)
    assert new_h.dtype == new_cell.dtype == torch.float64
    expected = lltm_ffi.reference.lltm(input, rnn.weights, rnn.bias, *state)
    torch.testing.assert_close((new_h, new_cell), expected)


def test_float64_module_rejects_float32_input(generator):
    rnn = lltm_ffi.LLTM(6, 9, dtype=torch.float64)
    state = _state(2, rnn, generator)
    with pytest.raises(TypeError, match="float32"):
        rnn(_input(2, rnn, generator).float(), state)


def test_training_reduces_the_loss(device, generator):
    """Regress a target from a random sequence, unrolled over 4 steps, with Adam."""
    steps, batch_size, features, state_size = 4, 16, 3, 8
    sequence = torch.randn(steps, batch_size, features, generator=generator).to(device)
    mixing = torch.randn(features, state_size, generator=generator).to(device)
    target = torch.tanh(sequence.sum(0) @ mixing)
    rnn = lltm_ffi.LLTM(features, state_size, device=device)
    initial_state = _state(batch_size, rnn, generator)
    initial_state = tuple(0.1 * tensor for tensor in initial_state)
    optimizer = torch.optim.Adam(rnn.parameters(), lr=0.05)

    losses = []
    for _ in range(30):
        h, cell = initial_state
        for input in sequence:
            h, cell = rnn(input, (h, cell))
        loss = torch.nn.functional.mse_loss(h, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < 0.5 * losses[0], f"losses: {[round(loss, 4) for loss in losses]}"


def test_gradients_through_an_unrolled_sequence_match_reference(generator):
    """The output state fed back in as the next old state, over three steps."""
    rnn = lltm_ffi.LLTM(3, 5, dtype=torch.float64)
    inputs = [_input(2, rnn, generator) for _ in range(3)]
    initial_state = _state(2, rnn, generator)
    grad_h = random_like(initial_state[0], generator)
    gradients = []
    for function in (lltm_ffi.lltm, lltm_ffi.reference.lltm):
        rnn.zero_grad()
        leaves = [input.detach().requires_grad_(True) for input in inputs]
        h, cell = initial_state
        for input in leaves:
            h, cell = function(input, rnn.weights, rnn.bias, h, cell)
        h.backward(grad_h)
        gradients.append([rnn.weights.grad, rnn.bias.grad] + [leaf.grad for leaf in leaves])
    torch.testing.assert_close(gradients[0], gradients[1])


# Sizes that cannot work are refused at construction, as nn.GRU refuses them:
# (input_features, state_size, exception, what the message names).
BAD_SIZES = [
    (-1, 5, ValueError, ("input_features must be at least 1", "-1")),
    (4, -2, ValueError, ("state_size must be at least 1", "-2")),
    (0, 5, ValueError, ("input_features must be at least 1", "0")),
    (4, 0, ValueError, ("state_size must be at least 1", "0")),
    (4.0, 5, TypeError, ("input_features must be an int", "float")),
    (4, 2.5, TypeError, ("state_size must be an int", "float")),
    (True, 5, TypeError, ("input_features must be an int", "bool")),
    (4, False, TypeError, ("state_size must be an int", "bool")),
    ("4", 5, TypeError, ("input_features must be an int", "str")),
    (4, None, TypeError, ("state_size must be an int", "NoneType")),
]


@pytest.mark.parametrize("module", ["LLTM", "LLTMSequence"])
@pytest.mark.parametrize("input_features, state_size, exception, fragments", BAD_SIZES,
                         ids=[f"{features!r}-{size!r}" for features, size, *_ in BAD_SIZES])
def test_construction_refuses_sizes_that_cannot_work(module, input_features, state_size,
                                                     exception, fragments):
    with raises_with(exception, f"{module}: ", *fragments):
        getattr(lltm_ffi, module)(input_features, state_size)


@pytest.mark.parametrize("module", ["LLTM", "LLTMSequence"])
def test_construction_takes_any_integral_size_as_an_int(module):
    import numpy
    rnn = getattr(lltm_ffi, module)(numpy.int64(3), torch.tensor(4).item())
    assert type(rnn.input_features) is int and type(rnn.state_size) is int
    assert (rnn.input_features, rnn.state_size) == (3, 4)
