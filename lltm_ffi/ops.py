"""The two fused passes as torch.library operators, lltm_ffi::forward_pass and
lltm_ffi::backward_pass, with fake implementations (shapes only) and autograd.

torch.compile, torch.export and autocast see the cell through these: cat and
addmm stay ordinary torch ops in the graph, and the pointwise work is one
opaque operator each way. Eager calls take the shorter LLTMFunction path
(lltm_ffi.function), which calls the same C passes without the dispatcher.
"""

import torch
from torch import Tensor

from . import _extension


def _check_pass(name, reference, tensors, shapes):
    """The operators can be called directly, so they check their own inputs:
    one dtype (float32/float64), one device, the expected shapes."""
    for argument, tensor, shape in zip(tensors, tensors.values(), shapes):
        if tensor.dtype != reference.dtype or tensor.dtype not in _extension.POINTER_TYPES:
            raise TypeError(f"lltm_ffi::{name}: {argument} has dtype {tensor.dtype}; expected "
                            f"torch.float32 or torch.float64, the same for every argument")
        if tensor.device != reference.device:
            raise ValueError(f"lltm_ffi::{name}: {argument} is on {tensor.device} but "
                             f"{next(iter(tensors))} is on {reference.device}")
        if tuple(tensor.shape) != shape:
            raise ValueError(f"lltm_ffi::{name}: {argument} has shape {tuple(tensor.shape)}, "
                             f"expected {shape}")
    if reference.device.type == "cuda":
        _extension.check_cuda_compiled(f"lltm_ffi::{name}")


@torch.library.custom_op("lltm_ffi::forward_pass", mutates_args=(), device_types=("cpu", "cuda"))
def forward_pass(gates: Tensor, old_cell: Tensor) -> tuple[Tensor, Tensor]:
    """(new_h, new_cell) from the pre-activation gates (batch, 3 * state) and
    old_cell (batch, state)."""
    batch_size, state_size = old_cell.shape
    _check_pass("forward_pass", old_cell, {"old_cell": old_cell, "gates": gates},
                [(batch_size, state_size), (batch_size, 3 * state_size)])
    return _extension.forward(_extension.dense(gates), old_cell)


@forward_pass.register_fake
def _forward_pass_fake(gates, old_cell):
    return old_cell.new_empty(old_cell.shape), old_cell.new_empty(old_cell.shape)


@torch.library.custom_op("lltm_ffi::backward_pass", mutates_args=(), device_types=("cpu", "cuda"))
def backward_pass(grad_h: Tensor, grad_cell: Tensor, new_cell: Tensor,
                  gates: Tensor) -> tuple[Tensor, Tensor]:
    """(d_old_cell, d_gates) from the output gradients, new_cell and gates."""
    batch_size, state_size = new_cell.shape
    state_shape = (batch_size, state_size)
    _check_pass("backward_pass", new_cell,
                {"new_cell": new_cell, "grad_h": grad_h, "grad_cell": grad_cell, "gates": gates},
                [state_shape, state_shape, state_shape, (batch_size, 3 * state_size)])
    return _extension.backward(grad_h, grad_cell, _extension.dense(new_cell),
                               _extension.dense(gates))


@backward_pass.register_fake
def _backward_pass_fake(grad_h, grad_cell, new_cell, gates):
    return new_cell.new_empty(new_cell.shape), gates.new_empty(gates.shape)


def _setup_context(ctx, inputs, output):
    gates, _ = inputs
    _, new_cell = output
    ctx.save_for_backward(gates, new_cell)


def _forward_pass_backward(ctx, grad_h, grad_cell):
    gates, new_cell = ctx.saved_tensors
    d_old_cell, d_gates = backward_pass(grad_h, grad_cell, new_cell, gates)
    return d_gates, d_old_cell


forward_pass.register_autograd(_forward_pass_backward, setup_context=_setup_context)
