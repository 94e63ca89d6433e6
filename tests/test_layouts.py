"""The same values in other layouts give the same results: bias of shape
(3S,) or (1, 3S); arguments and output gradients transposed, every other
element, broadcast (stride 0), misaligned; and, in the child process of
child_cases.py, every layout of builders.py (odd strides and overlapping
rows too) on each argument and the output gradients, and strides of 2^40 on
size-1 dimensions (test_huge.py has the GPU cases past 2^31 elements)."""

import pytest
import torch

import builders
import child_cases
import lltm_ffi
from builders import random_grad_outputs, random_inputs
from conftest import (ARGUMENT_NAMES, RESULT_NAMES, as_leaves, assert_tensors_close,
                      outputs_and_gradients)
from lltm_ffi import selfcheck

SHAPE = (3, 5, 7)


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


LAYOUTS = {
    "transposed": builders.transposed,
    "sliced": builders.every_other,
    "expanded": builders.broadcast_rows,
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
    views = (builders.every_other(grad_h), builders.misaligned(grad_cell))
    assert views[0].stride() == (2 * shape[2], 2) and views[1].is_contiguous()

    results = outputs_and_gradients(inputs, views)
    expected = outputs_and_gradients(inputs, [view.contiguous() for view in views])
    assert_tensors_close(results[1], expected[1], selfcheck.GRADIENT_NAMES)


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


def test_misaligned_arguments(dtype, device, generator):
    inputs = random_inputs(generator, (4, 6, 8), dtype, device)
    views = [builders.misaligned(tensor) for tensor in inputs]
    grad_outputs = random_grad_outputs(inputs, generator)
    results = outputs_and_gradients(views, grad_outputs)
    expected = outputs_and_gradients(inputs, grad_outputs)
    assert_tensors_close(results[0] + results[1], expected[0] + expected[1], RESULT_NAMES)


@pytest.mark.parametrize("case_id", child_cases.case_ids("layout", "huge_stride"))
def test_case_in_child_process_gives_the_reference_results(case_id, child_run):
    child_cases.check_case(case_id, child_run)


def test_child_process_exits_normally(child_run):
    """The one child process of these cases and test_edge_values.py's."""
    child_cases.check_exit(child_run)
