"""Accepted arguments at the edges give the reference cell's results
(docs/ERRORS.md, "What is accepted at the edges"): batch, input_features and
state_size 0 (in the child process of child_cases.py, as is input, old_h and
old_cell being one tensor), some, all or none of the arguments requiring
grad, one output unused, torch.inference_mode(), NaN and +-Inf in any argument (and where a
NaN spreads), and the negative bit on an argument or an output gradient."""

import math

import pytest
import torch

import child_cases
import lltm_ffi
from builders import random_grad_outputs, random_inputs, random_like
from conftest import (ARGUMENT_NAMES, RESULT_NAMES, as_leaves, assert_tensors_close,
                      outputs_and_gradients, replaced)
from lltm_ffi import reference, selfcheck

SHAPE = (3, 5, 7)  # batch, input_features, state_size
B, F, S = SHAPE


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


@pytest.mark.parametrize("case_id", child_cases.case_ids("zero_size", "aliased"))
def test_case_in_child_process_gives_the_reference_results(case_id, child_run):
    child_cases.check_case(case_id, child_run)


REQUIRING_GRAD = [(), ("input",), ("weights",), ("bias",), ("old_h",), ("old_cell",),
                  ARGUMENT_NAMES]


@pytest.mark.parametrize("requiring", REQUIRING_GRAD, ids=lambda names: "+".join(names) or "none")
def test_requires_grad_on_some_arguments(requiring, dtype, device, generator):
    inputs = random_inputs(generator, SHAPE, dtype, device)
    grad_outputs = random_grad_outputs(inputs, generator)
    got = outputs_and_gradients(inputs, grad_outputs, lltm_ffi.lltm, requiring)
    expected = outputs_and_gradients(inputs, grad_outputs, reference.lltm, requiring)
    assert_tensors_close(got[0] + got[1], expected[0] + expected[1], RESULT_NAMES)
    new_h, _ = lltm_ffi.lltm(*[tensor.detach().requires_grad_(name in requiring)
                               for name, tensor in zip(ARGUMENT_NAMES, inputs)])
    assert new_h.requires_grad == bool(requiring)


SOME_REQUIRING_GRAD = [("weights",), ("input",), ("bias",), ("old_h",), ("old_cell",),
                       ("input", "old_cell"), ("weights", "bias")]


@pytest.mark.parametrize("requiring", SOME_REQUIRING_GRAD, ids="+".join)
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


def test_inference_mode(device, generator):
    inputs = random_inputs(generator, SHAPE, torch.float64, device)
    with torch.inference_mode():
        got = lltm_ffi.lltm(*inputs)
        expected = reference.lltm(*inputs)
    assert_tensors_close(got, expected, selfcheck.OUTPUT_NAMES)


NON_FINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_non_finite_value_gives_the_reference_results(name, value, dtype, device, generator):
    """One NaN or +-Inf element: outputs and gradients as the reference's,
    NaN where the reference has NaN."""
    inputs = random_inputs(generator, SHAPE, dtype, device)
    poisoned = inputs[ARGUMENT_NAMES.index(name)].clone()
    poisoned.view(-1)[poisoned.numel() // 2] = NON_FINITE[value]
    inputs = replaced(inputs, name, poisoned)
    grad_outputs = random_grad_outputs(inputs, generator)
    got = outputs_and_gradients(inputs, grad_outputs, lltm_ffi.lltm)
    expected = outputs_and_gradients(inputs, grad_outputs, reference.lltm)
    assert_tensors_close(got[0] + got[1], expected[0] + expected[1], RESULT_NAMES, equal_nan=True)


def _nan_mask(rows=(), columns=(), element=None):
    mask = torch.zeros(B, S, dtype=torch.bool)
    for row in rows:
        mask[row] = True
    for column in columns:
        mask[:, column] = True
    if element is not None:
        mask[element] = True
    return mask


# (argument, element made NaN) -> NaN masks of new_h and new_cell. Rows r of
# weights and bias: r < S the input gate of state r, S <= r < 2S the output
# gate of state r - S (it does not reach new_cell), 2S <= r the candidate cell.
NAN_FOOTPRINTS = {
    ("old_cell", (1, 2)): (_nan_mask(element=(1, 2)), _nan_mask(element=(1, 2))),
    ("input", (1, 2)): (_nan_mask(rows=[1]), _nan_mask(rows=[1])),
    ("old_h", (1, 2)): (_nan_mask(rows=[1]), _nan_mask(rows=[1])),
    ("weights", (1, 2)): (_nan_mask(columns=[1]), _nan_mask(columns=[1])),
    ("weights", (S + 1, 2)): (_nan_mask(columns=[1]), _nan_mask()),
    ("weights", (2 * S + 1, 2)): (_nan_mask(columns=[1]), _nan_mask(columns=[1])),
    ("bias", (1,)): (_nan_mask(columns=[1]), _nan_mask(columns=[1])),
    ("bias", (S + 1,)): (_nan_mask(columns=[1]), _nan_mask()),
    ("bias", (2 * S + 1,)): (_nan_mask(columns=[1]), _nan_mask(columns=[1])),
}


@pytest.mark.parametrize("name, element", NAN_FOOTPRINTS,
                         ids=[f"{name}{list(element)}" for name, element in NAN_FOOTPRINTS])
def test_nan_spreads_as_the_cell_says(name, element, device, generator):
    """Where a NaN goes (docs/ERRORS.md)."""
    inputs = random_inputs(generator, SHAPE, torch.float32, device)
    poisoned = inputs[ARGUMENT_NAMES.index(name)].clone()
    poisoned[element] = math.nan
    inputs = replaced(inputs, name, poisoned)
    for output_name, output, expected in zip(selfcheck.OUTPUT_NAMES, lltm_ffi.lltm(*inputs),
                                             NAN_FOOTPRINTS[name, element]):
        mask = torch.isnan(output).cpu()
        assert torch.equal(mask, expected), \
            f"NaN in {name}{list(element)}: NaN in {output_name} at\n{mask}\nexpected\n{expected}"


# A tensor with its negative bit set (torch's lazy negation: a view whose
# data_ptr() holds the un-negated values) would reach C as it is when it is
# contiguous, as old_cell or as an output gradient; the negation must be
# applied first.
def test_old_cell_with_the_negative_bit(device, generator):
    inputs = random_inputs(generator, SHAPE, torch.float64, device)
    inputs[4] = torch._neg_view(inputs[4])
    assert inputs[4].is_neg() and inputs[4].is_contiguous()
    assert_tensors_close(lltm_ffi.lltm(*inputs), reference.lltm(*inputs), selfcheck.OUTPUT_NAMES)


def test_one_element_old_cell_from_the_imaginary_part_of_a_conjugate(device, generator):
    """The same through public API only: x.conj().imag is a negative view."""
    inputs = random_inputs(generator, (1, 2, 1), torch.float32, device)
    inputs[4] = torch.randn(1, 1, dtype=torch.complex64, generator=generator).to(device).conj().imag
    assert inputs[4].is_neg() and inputs[4].is_contiguous()
    assert_tensors_close(lltm_ffi.lltm(*inputs), reference.lltm(*inputs), selfcheck.OUTPUT_NAMES)


def test_output_gradient_with_the_negative_bit(device, generator):
    inputs = random_inputs(generator, SHAPE, torch.float64, device)
    grad_h = torch.randn(B, S, generator=generator, dtype=torch.float64).to(device)
    grad_outputs = [torch._neg_view(grad_h), torch.zeros_like(grad_h)]
    got = outputs_and_gradients(inputs, grad_outputs, lltm_ffi.lltm)
    expected = outputs_and_gradients(inputs, grad_outputs, reference.lltm)
    assert_tensors_close(got[1], expected[1], selfcheck.GRADIENT_NAMES)
