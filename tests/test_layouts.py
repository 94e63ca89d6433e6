"""Argument layouts and autograd plumbing: bias of shape (3S,) or (1, 3S),
non-contiguous arguments and upstream gradients, and inputs of which only
some require grad."""

import pytest
import torch

import lltm_ffi
from conftest import (ARGUMENT_NAMES, as_leaves, assert_tensors_close, outputs_and_gradients,
                      random_inputs, random_like)
from lltm_ffi import selfcheck

SHAPE = (3, 5, 7)
RESULT_NAMES = selfcheck.OUTPUT_NAMES + selfcheck.GRADIENT_NAMES


def random_grad_outputs(inputs, generator):
    old_h = inputs[3]
    return random_like(old_h, generator), random_like(old_h, generator)


def test_bias_1x3S_gives_the_same_results_as_bias_3S(dtype, device, generator):
    inputs = random_inputs(generator, SHAPE, dtype, device)
    grad_outputs = random_grad_outputs(inputs, generator)
    outputs, gradients = outputs_and_gradients(inputs, grad_outputs)

    bias_2d = inputs[2].unsqueeze(0)
    outputs_2d, gradients_2d = outputs_and_gradients(inputs[:2] + [bias_2d] + inputs[3:],
                                                     grad_outputs)
    assert gradients_2d[2].shape == bias_2d.shape == (1, 3 * SHAPE[2])
    gradients_2d[2] = gradients_2d[2].squeeze(0)
    assert_tensors_close(outputs_2d + gradients_2d, outputs + gradients, RESULT_NAMES)


def _interleaved_with_nan(tensor):
    """The same values at every other element of a buffer whose other elements are NaN."""
    buffer = torch.stack((tensor, torch.full_like(tensor, float("nan"))), dim=-1)
    return buffer[..., 0]


LAYOUTS = {
    # Same values, column-major strides.
    "transposed": lambda tensor: tensor.t().contiguous().t(),
    # Same values, stride 2 in the last dimension; a read of a gap gives NaN.
    "sliced": _interleaved_with_nan,
    # The first row (element) repeated with stride 0.
    "expanded": lambda tensor: tensor[:1].expand_as(tensor),
}
NONCONTIGUOUS_CASES = [(name, layout) for name in ARGUMENT_NAMES for layout in LAYOUTS
                       if not (name == "bias" and layout == "transposed")]  # bias is 1-D


@pytest.mark.parametrize("argument, layout", NONCONTIGUOUS_CASES,
                         ids=[f"{name}-{layout}" for name, layout in NONCONTIGUOUS_CASES])
def test_noncontiguous_argument_gives_the_same_results_as_a_contiguous_copy(
        argument, layout, dtype, device, generator):
    inputs = random_inputs(generator, SHAPE, dtype, device)
    index = ARGUMENT_NAMES.index(argument)
    inputs[index] = LAYOUTS[layout](inputs[index])
    assert not inputs[index].is_contiguous()
    grad_outputs = random_grad_outputs(inputs, generator)

    results = outputs_and_gradients(inputs, grad_outputs)
    expected = outputs_and_gradients([tensor.contiguous() for tensor in inputs], grad_outputs)
    assert_tensors_close(results[0] + results[1], expected[0] + expected[1], RESULT_NAMES)


def test_all_arguments_noncontiguous_at_once(dtype, device, generator):
    inputs = random_inputs(generator, SHAPE, dtype, device)
    input, weights, bias, old_h, old_cell = inputs
    views = [LAYOUTS["transposed"](input), LAYOUTS["sliced"](weights), LAYOUTS["sliced"](bias),
             LAYOUTS["transposed"](old_h), old_cell[:1].expand_as(old_cell)]
    assert views[4].stride() == (0, 1)
    grad_outputs = random_grad_outputs(inputs, generator)

    results = outputs_and_gradients(views, grad_outputs)
    expected = outputs_and_gradients([view.contiguous() for view in views], grad_outputs)
    assert_tensors_close(results[0] + results[1], expected[0] + expected[1], RESULT_NAMES)


def _misaligned(tensor):
    """The same values, dense, but starting one element into a buffer: the
    CUDA passes must notice the address is not 16-byte aligned."""
    buffer = torch.empty(tensor.numel() + 1, dtype=tensor.dtype, device=tensor.device)
    view = buffer[1:].view(tensor.shape)
    view.copy_(tensor)
    return view


# State size 7 takes the one-element path of the CUDA passes; 8 the 16-byte path.
@pytest.mark.parametrize("shape", [SHAPE, (4, 6, 8)], ids=["state7", "state8"])
def test_noncontiguous_upstream_gradients(shape, dtype, device, generator):
    inputs = random_inputs(generator, shape, dtype, device)
    grad_h, grad_cell = random_grad_outputs(inputs, generator)
    views = (grad_h.t().contiguous().t(), grad_cell[:1].expand_as(grad_cell))
    assert not views[0].is_contiguous() and views[1].stride()[0] == 0

    results = outputs_and_gradients(inputs, views)
    expected = outputs_and_gradients(inputs, [view.contiguous() for view in views])
    assert_tensors_close(results[1], expected[1], selfcheck.GRADIENT_NAMES)


@pytest.mark.parametrize("shape", [SHAPE, (4, 6, 8)], ids=["state7", "state8"])
def test_sliced_and_misaligned_upstream_gradients(shape, dtype, device, generator):
    inputs = random_inputs(generator, shape, dtype, device)
    grad_h, grad_cell = random_grad_outputs(inputs, generator)
    views = (_interleaved_with_nan(grad_h), _misaligned(grad_cell))
    assert views[0].stride() == (2 * shape[2], 2) and views[1].is_contiguous()

    results = outputs_and_gradients(inputs, views)
    expected = outputs_and_gradients(inputs, [view.contiguous() for view in views])
    assert_tensors_close(results[1], expected[1], selfcheck.GRADIENT_NAMES)


def test_misaligned_arguments(dtype, device, generator):
    inputs = random_inputs(generator, (4, 6, 8), dtype, device)
    views = [_misaligned(tensor) for tensor in inputs]
    grad_outputs = random_grad_outputs(inputs, generator)
    results = outputs_and_gradients(views, grad_outputs)
    expected = outputs_and_gradients(inputs, grad_outputs)
    assert_tensors_close(results[0] + results[1], expected[0] + expected[1], RESULT_NAMES)




def test_sum_of_outputs_backward_matches_reference(device, generator):
    """.sum() hands backward expanded (stride 0) gradients."""
    inputs = random_inputs(generator, SHAPE, torch.float64, device)
    gradients = []
    for function in (lltm_ffi.lltm, lltm_ffi.reference.lltm):
        leaves = as_leaves(inputs)
        new_h, new_cell = function(*leaves)
        (new_h.sum() + 2 * new_cell.sum()).backward()
        gradients.append([leaf.grad for leaf in leaves])
    assert_tensors_close(gradients[0], gradients[1], selfcheck.GRADIENT_NAMES)


def test_only_one_output_used_matches_reference(device, generator):
    """The unused output's gradient reaches backward as zeros."""
    inputs = random_inputs(generator, SHAPE, torch.float64, device)
    grad_h = random_like(inputs[3], generator)
    gradients = []
    for function in (lltm_ffi.lltm, lltm_ffi.reference.lltm):
        leaves = as_leaves(inputs)
        new_h, _ = function(*leaves)
        new_h.backward(grad_h)
        gradients.append([leaf.grad for leaf in leaves])
    assert_tensors_close(gradients[0], gradients[1], selfcheck.GRADIENT_NAMES)


REQUIRING_GRAD = [("weights",), ("input",), ("bias",), ("old_h",), ("old_cell",),
                  ("input", "old_cell"), ("weights", "bias")]


@pytest.mark.parametrize("requiring", REQUIRING_GRAD, ids="+".join)
def test_only_some_inputs_require_grad(requiring, device, generator):
    inputs = random_inputs(generator, SHAPE, torch.float64, device)
    grad_outputs = random_grad_outputs(inputs, generator)
    _, all_gradients = outputs_and_gradients(inputs, grad_outputs)

    tensors = [tensor.detach().requires_grad_(name in requiring)
               for name, tensor in zip(ARGUMENT_NAMES, inputs)]
    torch.autograd.backward(lltm_ffi.lltm(*tensors), grad_outputs)
    for name, tensor, expected in zip(ARGUMENT_NAMES, tensors, all_gradients):
        if name in requiring:
            assert_tensors_close([tensor.grad], [expected], [name])
        else:
            assert tensor.grad is None, f"{name} does not require grad but got a .grad"


def test_no_input_requiring_grad_gives_outputs_without_graph(device, generator):
    new_h, new_cell = lltm_ffi.lltm(*random_inputs(generator, SHAPE, torch.float64, device))
    assert not new_h.requires_grad and not new_cell.requires_grad
    assert new_h.grad_fn is None and new_cell.grad_fn is None
