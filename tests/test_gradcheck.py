"""torch.autograd.gradcheck in float64: the hand-written backward against
finite differences, with all five inputs requiring grad."""

import pytest
import torch

import lltm_ffi
from builders import random_inputs
from conftest import shape_id

GRADCHECK_SHAPES = [(1, 2, 3), (3, 5, 7), (2, 7, 4)]


def _gradcheck_inputs(generator, shape, device, bias_2d):
    inputs = random_inputs(generator, shape, torch.float64, device)
    if bias_2d:
        inputs[2] = inputs[2].unsqueeze(0)
    return [tensor.requires_grad_(True) for tensor in inputs]


@pytest.mark.parametrize("bias_2d", [False, True], ids=["bias_3S", "bias_1x3S"])
@pytest.mark.parametrize("shape", GRADCHECK_SHAPES, ids=shape_id)
def test_gradcheck(shape, bias_2d, device, generator):
    inputs = _gradcheck_inputs(generator, shape, device, bias_2d)
    assert torch.autograd.gradcheck(lltm_ffi.lltm, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)

