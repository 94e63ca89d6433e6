"""The LLTM cell's two fused passes: forward() and backward() call the C
entry points lltm_forward and lltm_backward, and the torch.library operators
lltm_ffi::forward_pass and lltm_ffi::backward_pass wrap them, with fake
implementations (shapes only) and autograd.

torch.compile, torch.export and autocast see the cell through the operators:
cat and addmm stay ordinary torch ops in the graph, and the pointwise work is
one opaque operator each way. Eager calls take the shorter LLTMFunction path
(lltm_ffi.function), which calls forward() and backward() without the
dispatcher.
"""

import torch
from torch import Tensor

from . import _arguments, _extension, derivatives


def forward(gates, old_cell):
    """new_h, new_cell of the cell from the pre-activation gates (batch, 3 * state),
    dense (as F.linear makes them), and old_cell (batch, state), any layout."""
    old_cell = _extension.dense(old_cell)
    new_h = torch.empty_like(old_cell)
    new_cell = torch.empty_like(old_cell)
    if old_cell.numel():
        _extension.call("lltm_forward", old_cell, old_cell.shape,
                        (gates, old_cell, new_h, new_cell))
    return new_h, new_cell


def backward(grad_h, grad_cell, new_cell, gates):
    """d_old_cell (batch, state) and d_gates (batch, 3 * state) from the output
    gradients and what forward saved (dense). The gradients are read through
    their strides: autograd often hands over broadcast views, which need no copy."""
    grad_h, grad_cell = grad_h.resolve_neg(), grad_cell.resolve_neg()
    d_old_cell = torch.empty_like(new_cell)
    d_gates = torch.empty_like(gates)
    if new_cell.numel():
        _extension.call("lltm_backward", new_cell,
                        (*new_cell.shape, *grad_h.stride(), *grad_cell.stride()),
                        (grad_h, grad_cell, new_cell, gates, d_old_cell, d_gates))
    return d_old_cell, d_gates


def _check_pass(name, tensors, shapes):
    """The operators can be called directly, so they check their own inputs:
    one dtype (float32/float64), one device, the expected shapes."""
    op = f"lltm_ffi::{name}"
    (first_name, first), *_ = tensors.items()
    for (argument, tensor), shape in zip(tensors.items(), shapes):
        _arguments.check_tensor(op, argument, tensor)
        _arguments.check_matches(op, argument, tensor, first_name, first)
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{op}: {argument} has shape {tuple(tensor.shape)}, "
                             f"expected {shape}")
    _arguments.check_device(op, first.device)


@torch.library.custom_op("lltm_ffi::forward_pass", mutates_args=(), device_types=("cpu", "cuda"))
def forward_pass(gates: Tensor, old_cell: Tensor) -> tuple[Tensor, Tensor]:
    """(new_h, new_cell) from the pre-activation gates (batch, 3 * state) and
    old_cell (batch, state)."""
    batch_size, state_size = old_cell.shape
    _check_pass("forward_pass", {"old_cell": old_cell, "gates": gates},
                [(batch_size, state_size), (batch_size, 3 * state_size)])
    return forward(_extension.dense(gates), old_cell)


@forward_pass.register_fake
def _forward_pass_fake(gates, old_cell):
    return old_cell.new_empty(old_cell.shape), old_cell.new_empty(old_cell.shape)


@torch.library.custom_op("lltm_ffi::backward_pass", mutates_args=(), device_types=("cpu", "cuda"))
def backward_pass(grad_h: Tensor, grad_cell: Tensor, new_cell: Tensor,
                  gates: Tensor) -> tuple[Tensor, Tensor]:
    """(d_old_cell, d_gates) from the output gradients, new_cell and gates."""
    batch_size, state_size = new_cell.shape
    state_shape = (batch_size, state_size)
    _check_pass("backward_pass",
                {"new_cell": new_cell, "grad_h": grad_h, "grad_cell": grad_cell, "gates": gates},
                [state_shape, state_shape, state_shape, (batch_size, 3 * state_size)])
    return backward(grad_h, grad_cell, _extension.dense(new_cell), _extension.dense(gates))


@backward_pass.register_fake
def _backward_pass_fake(grad_h, grad_cell, new_cell, gates):
    return new_cell.new_empty(new_cell.shape), gates.new_empty(gates.shape)


def _setup_context(ctx, inputs, output):
    gates, _ = inputs
    _, new_cell = output
    ctx.save_for_backward(gates, new_cell)


def _forward_pass_backward(ctx, grad_h, grad_cell):
    gates, new_cell = ctx.saved_tensors
    if derivatives.in_torch_ops(grad_h, grad_cell):
        # Autograd records this backward (create_graph=True, torch.func): the
        # same math in torch ops, which it can differentiate again.
        d_old_cell, d_gates = derivatives.backward_pass(grad_h, grad_cell, new_cell, gates)
    else:
        d_old_cell, d_gates = backward_pass(grad_h, grad_cell, new_cell, gates)
    return d_gates, d_old_cell


forward_pass.register_autograd(_forward_pass_backward, setup_context=_setup_context)


def _backward_pass_setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward_pass_backward(ctx, grad_d_old_cell, grad_d_gates):
    """backward_pass's own derivatives: autograd's, of the same pass in torch ops."""
    return derivatives.recorded_grads(derivatives.backward_pass, ctx.saved_tensors,
                                      ctx.needs_input_grad, (grad_d_old_cell, grad_d_gates))


backward_pass.register_autograd(_backward_pass_backward,
                                setup_context=_backward_pass_setup_context)
