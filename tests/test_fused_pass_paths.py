"""The two fused passes (torch.ops.lltm_ffi.forward_pass and backward_pass)
on every path the C and CUDA code can take: float32 and float64; state sizes
that allow the CUDA passes' 16-byte packs (state % 4 == 0 in float32, % 2 in
float64) and ones that do not; batch 1; one state; the CUDA block size and
one past it; pointers one element off 16-byte alignment; and output gradients
that are broadcast, transposed, every other element or misaligned. Each is
compared with the cell's pointwise part in float64.

Every device tensor here is a copy of a CPU tensor (or a view of one), and
results come back with .cpu(): nothing the passes read was written by another
kernel, which is what `make initcheck` needs (it instruments the lltm kernels
only).
"""

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import shape_id
from lltm_ffi import selfcheck

# (batch, state)
SHAPES = [(1, 1), (1, 4), (1, 8), (2, 2), (2, 3), (3, 7), (4, 8), (6, 6), (7, 65), (5, 256),
          (33, 257), (3, 12)]


def _misaligned(tensor):
    """The same values, dense, one element into their buffer."""
    buffer = torch.empty(tensor.numel() + 1, dtype=tensor.dtype)
    buffer[0] = math.nan
    buffer[1:] = tensor.reshape(-1)
    return buffer


# name -> (CPU tensor -> (CPU buffer to copy to the device, function making the view there))
def _dense(tensor):
    return tensor, lambda buffer: buffer


def _misaligned_layout(tensor):
    return _misaligned(tensor), lambda buffer: buffer[1:].view(tensor.shape)


def _transposed(tensor):
    return tensor.t().contiguous(), lambda buffer: buffer.t()


def _every_other(tensor):
    buffer = torch.stack((tensor, torch.full_like(tensor, math.nan)), dim=-1)
    return buffer, lambda buffer: buffer[..., 0]


def _broadcast_rows(tensor):
    return tensor[:1].clone(), lambda buffer: buffer.expand(tensor.shape)


def _broadcast_all(tensor):
    return tensor[:1, :1].clone(), lambda buffer: buffer.expand(tensor.shape)


GRADIENT_LAYOUTS = {"dense": _dense, "misaligned": _misaligned_layout, "transposed": _transposed,
                    "every_other": _every_other, "broadcast_rows": _broadcast_rows,
                    "broadcast_all": _broadcast_all}


def _on_device(tensor, layout, device):
    buffer, view = layout(tensor)
    return view(buffer.to(device))


def _expected(gates, old_cell, grad_h, grad_cell):
    """new_h, new_cell, d_old_cell, d_gates in float64 from the cell's definition."""
    gates = gates.double().requires_grad_(True)
    old_cell = old_cell.double().requires_grad_(True)
    input_pre, output_pre, candidate_pre = gates.chunk(3, dim=1)
    new_cell = old_cell + F.elu(candidate_pre) * torch.sigmoid(input_pre)
    new_h = torch.tanh(new_cell) * torch.sigmoid(output_pre)
    d_gates, d_old_cell = torch.autograd.grad((new_h, new_cell), (gates, old_cell),
                                              (grad_h.double(), grad_cell.double()))
    return new_h.detach(), new_cell.detach(), d_old_cell, d_gates


def _check(got, expected, dtype, names=("new_h", "new_cell", "d_old_cell", "d_gates")):
    for name, value, wanted in zip(names, got, expected):
        assert value.shape == wanted.shape and value.dtype == dtype, \
            f"{name}: {value.dtype} {tuple(value.shape)}"
        error = selfcheck.relative_error(value.cpu(), wanted)
        assert error <= selfcheck.TOLERANCES[dtype], f"{name}: relative error {error:.3g}"


@pytest.mark.parametrize("layout", GRADIENT_LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_fused_passes(shape, layout, dtype, device, generator):
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
    inputs_layout = _misaligned_layout if layout == "misaligned" else _dense
    device_gates = _on_device(gates, inputs_layout, device)
    device_old_cell = _on_device(old_cell, inputs_layout, device)
    new_h, new_cell = torch.ops.lltm_ffi.forward_pass(device_gates, device_old_cell)
    d_old_cell, d_gates = torch.ops.lltm_ffi.backward_pass(
        device_grads[0], device_grads[1], _on_device(new_cell.cpu(), inputs_layout, device),
        device_gates)
    _check((new_h, new_cell, d_old_cell, d_gates),
           _expected(gates, old_cell, *expected_grads), dtype)
