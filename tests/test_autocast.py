"""lltm_ffi under torch.autocast (README "Autocast"): bfloat16 (CPU and
CUDA) and float16 (CUDA) give float32 outputs and gradients, as close to
float64 as the rounded matrix operands allow, and an integer input is still
refused."""

import pytest
import torch

import lltm_ffi
from conftest import assert_all_close
from lltm_ffi import reference, selfcheck

# Relative error in norm of the float32 outputs under autocast against the
# float64 reference: the matrix product's operands are rounded to 8 (bf16) or
# 11 (fp16) significant bits, the pointwise math is float32.
AUTOCAST_TOLERANCES = {torch.bfloat16: 2e-2, torch.float16: 4e-3}


@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16],
                         ids=["bfloat16", "float16"])
def test_autocast(device, generator, autocast_dtype):
    if device.type == "cpu" and autocast_dtype == torch.float16:
        pytest.skip("CPU autocast is a bfloat16 feature")
    inputs = selfcheck.random_inputs(16, 64, 128, torch.float32, device, generator)
    leaves = [tensor.clone().requires_grad_(True) for tensor in inputs]
    with torch.autocast(device.type, dtype=autocast_dtype):
        new_h, new_cell = lltm_ffi.lltm(*leaves)
    assert new_h.dtype == torch.float32 and new_cell.dtype == torch.float32
    (new_h.sum() + new_cell.sum()).backward()
    assert all(leaf.grad is not None and leaf.grad.dtype == torch.float32 for leaf in leaves)

    expected = reference.lltm(*[tensor.double() for tensor in inputs])
    tolerance = AUTOCAST_TOLERANCES[autocast_dtype]
    assert_all_close([new_h, new_cell], expected, tolerance)
    # Not float32-exact: the products really ran in the low-precision dtype.
    assert selfcheck.relative_error(new_h, expected[0]) > 1e-6


def test_autocast_rejects_integer_input(device, generator):
    inputs = list(selfcheck.random_inputs(2, 3, 4, torch.float32, device, generator))
    inputs[0] = inputs[0].to(torch.int32)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        with pytest.raises(TypeError, match="input has dtype torch.int32"):
            lltm_ffi.lltm(*inputs)
