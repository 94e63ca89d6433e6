"""The differentiable LLTM cell: argument checks, the autograd.Function and
the functional entry point.

The matrix products stay in torch (cat + linear forward; mm and sum
backward); only the two fused pointwise passes (lltm_ffi.ops) go through the
C shim.
"""

import torch
from torch.autograd.function import once_differentiable

from . import _arguments, ops

_ARGUMENT_NAMES = ("input", "weights", "bias", "old_h", "old_cell")
# Autocast's own device types that lltm_ffi runs on; asking autocast about
# others (meta, say) raises.
_AUTOCAST_DEVICE_TYPES = ("cpu", "cuda")


def _shape(tensor):
    return tuple(tensor.shape)


def check_arguments(input, weights, bias, old_h, old_cell):
    """Raises TypeError or ValueError, naming the argument, for anything the C
    passes cannot take; returns nothing when all five are usable together.
    The common, valid case costs one expression; the diagnosis runs only
    when it fails."""
    if not _arguments.cell_arguments_fit(input, 2, weights, bias, old_h, old_cell):
        _diagnose(input, weights, bias, old_h, old_cell)
    if input.device.type != "cpu":
        _arguments.check_device("lltm", input.device)


def _diagnose(input, weights, bias, old_h, old_cell):
    tensors = (input, weights, bias, old_h, old_cell)
    for name, tensor in zip(_ARGUMENT_NAMES, tensors):
        _arguments.check_tensor("lltm", name, tensor)
    for name, tensor in zip(_ARGUMENT_NAMES[1:], tensors[1:]):
        _arguments.check_matches("lltm", name, tensor, "input", input)

    for name, tensor in zip(_ARGUMENT_NAMES, tensors):
        if tensor.dim() != 2 and not (name == "bias" and tensor.dim() == 1):
            expected = "1 or 2 dimensions" if name == "bias" else "2 dimensions"
            raise ValueError(f"lltm: {name} must have {expected}, got shape {_shape(tensor)}")
    batch_size, input_features = input.shape
    state_size = old_h.shape[1]
    if old_h.shape[0] != batch_size:
        raise ValueError(f"lltm: old_h has shape {_shape(old_h)} but input has shape "
                         f"{_shape(input)}; they must have the same batch size")
    if old_cell.shape != old_h.shape:
        raise ValueError(f"lltm: old_cell has shape {_shape(old_cell)} but old_h has shape "
                         f"{_shape(old_h)}; they must match")
    gates_size = 3 * state_size
    if weights.shape != (gates_size, state_size + input_features):
        raise ValueError(
            f"lltm: weights has shape {_shape(weights)} but must be (3 * state_size, "
            f"state_size + input_features) = {(gates_size, state_size + input_features)} "
            f"for input of shape {_shape(input)} and old_h of shape {_shape(old_h)}")
    if bias.shape != (gates_size,) and bias.shape != (1, gates_size):
        raise ValueError(f"lltm: bias has shape {_shape(bias)} but must be ({gates_size},) or "
                         f"(1, {gates_size}) for weights of shape {_shape(weights)}")
    raise AssertionError("check_arguments rejected arguments that _diagnose accepts")


class LLTMFunction(torch.autograd.Function):
    """The LLTM cell: (input, weights, bias, old_h, old_cell) -> (new_h, new_cell)."""

    @staticmethod
    def forward(ctx, input, weights, bias, old_h, old_cell):
        check_arguments(input, weights, bias, old_h, old_cell)
        X = torch.cat((old_h, input), dim=1)
        gates = torch.nn.functional.linear(X, weights, bias)
        new_h, new_cell = ops.forward(gates, old_cell)
        # The backward pass recomputes the gate activations from `gates`.
        ctx.save_for_backward(X, weights, gates, new_cell)
        ctx.bias_shape = bias.shape
        return new_h, new_cell

    @staticmethod
    @once_differentiable  # the C pass has no derivative of its own
    def backward(ctx, grad_h, grad_cell):
        X, weights, gates, new_cell = ctx.saved_tensors
        d_old_cell, d_gates = ops.backward(grad_h, grad_cell, new_cell, gates)
        needs_input, needs_weights, needs_bias, needs_old_h, needs_old_cell = ctx.needs_input_grad
        d_input = d_weights = d_bias = d_old_h = None
        if needs_input or needs_old_h:
            d_X = d_gates.mm(weights)
            state_size = new_cell.shape[1]
            d_old_h, d_input = d_X[:, :state_size], d_X[:, state_size:]
        if needs_weights:
            d_weights = d_gates.t().mm(X)
        if needs_bias:
            d_bias = d_gates.sum(dim=0).view(ctx.bias_shape)
        return d_input, d_weights, d_bias, d_old_h, d_old_cell if needs_old_cell else None


def _traceable_lltm(input, weights, bias, old_h, old_cell):
    """The cell through the registered operators, for torch.compile and autocast."""
    X = torch.cat((old_h, input), dim=1)
    gates = torch.nn.functional.linear(X, weights, bias)
    return ops.forward_pass(gates.to(old_cell.dtype), old_cell)


def _autocast_lltm(input, weights, bias, old_h, old_cell, device_type):
    """Under autocast the matrix products run in the autocast dtype, as nn.Linear
    would, and the pointwise passes in float32 on the upcast gates; new_h and
    new_cell come out float32."""
    for name, tensor in zip(_ARGUMENT_NAMES, (input, weights, bias, old_h, old_cell)):
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            raise TypeError(f"lltm: {name} has dtype {getattr(tensor, 'dtype', type(tensor))}; "
                            "lltm_ffi under autocast takes floating-point tensors")
    input, weights, bias, old_h, old_cell = (
        tensor.float() for tensor in (input, weights, bias, old_h, old_cell))
    check_arguments(input, weights, bias, old_h, old_cell)
    matmul_dtype = torch.get_autocast_dtype(device_type)
    with torch.autocast(device_type, enabled=False):
        return _traceable_lltm(input.to(matmul_dtype), weights.to(matmul_dtype),
                               bias.to(matmul_dtype), old_h.to(matmul_dtype), old_cell)


def lltm(input, weights, bias, old_h, old_cell):
    """One step of the LLTM cell; returns (new_h, new_cell), differentiable.

    input (batch, input_features); weights (3 * state_size, state_size +
    input_features), its columns ordered [old_h, input]; bias (3 * state_size)
    or (1, 3 * state_size); old_h and old_cell (batch, state_size). float32 or
    float64, all on one CPU or CUDA device. Under torch.autocast the matrix
    products run in the autocast dtype and the rest in float32 (float32 out).
    """
    device_type = input.device.type if isinstance(input, torch.Tensor) else "cpu"
    if device_type in _AUTOCAST_DEVICE_TYPES and torch.is_autocast_enabled(device_type):
        return _autocast_lltm(input, weights, bias, old_h, old_cell, device_type)
    if _arguments.use_operator():
        check_arguments(input, weights, bias, old_h, old_cell)
        return _traceable_lltm(input, weights, bias, old_h, old_cell)
    return LLTMFunction.apply(input, weights, bias, old_h, old_cell)
