"""The differentiable LLTM cell: argument checks, the autograd.Function and
the functional entry point.

On a GPU an eager step whose gate product is small
(lltm_ffi.sequence.fused_step; smaller still while a CUDA graph is
captured) is a sequence of length 1: one C call a pass, the matrix
products included, in lltm_ffi's own kernels (one launch forward, two or
three backward), where torch's operations around a pointwise pass cost the
host more than the GPU's arithmetic. Otherwise, and on the CPU, the matrix
products stay in torch (cat + linear forward; mm and sum backward), whose
BLAS is the faster at larger sizes, and only the two fused pointwise passes
(lltm_ffi.ops) go through the C shim.
"""

import torch
from torch.autograd import forward_ad

from . import _arguments, derivatives, ops, sequence
from .derivatives import or_zeros

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
    if not input.is_cpu:
        _arguments.check_device("lltm", input.device)


def _diagnose(input, weights, bias, old_h, old_cell):
    tensors = (input, weights, bias, old_h, old_cell)
    _arguments.check_all("lltm", _ARGUMENT_NAMES, tensors)
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


# While a CUDA graph is captured, launches cost nothing when it replays, and
# torch's products beat the step kernels' but for the smallest cells (a
# 16-step loop replayed on an H100, us a cell: 31.9 against 75.1 at
# 16x32x128, 55.4 against 39.0 at 64x64x256, 144 against 106 at 256x256x512).
_CAPTURED_STEP_MULTIPLY_ADDS = 2**20


def _runs_step_kernels(batch_size, input_features, state_size):
    """True where an eager GPU call is one step in lltm_ffi's own kernels
    (sequence.step_forward) rather than torch's products around the fused
    pointwise pass."""
    if torch.cuda.is_current_stream_capturing():
        return (sequence.step_multiply_adds(batch_size, input_features, state_size)
                <= _CAPTURED_STEP_MULTIPLY_ADDS)
    return sequence.fused_step(batch_size, input_features, state_size)


class LLTMFunction(torch.autograd.Function):
    """The LLTM cell: (input, weights, bias, old_h, old_cell) -> (new_h,
    new_cell), the tutorial's Function and lltm()'s for plain tensors.

    The backward pass runs the fused C pass. While autograd records the
    backward (create_graph=True) or the gradients are batched, it runs the same
    math in torch ops (lltm_ffi.derivatives) on the gates recomputed from the
    saved arguments, so that second derivatives are the reference's."""

    @staticmethod
    def forward(ctx, input, weights, bias, old_h, old_cell):
        check_arguments(input, weights, bias, old_h, old_cell)
        if input.is_cuda and _runs_step_kernels(*input.shape, old_h.shape[1]):
            X = None  # C reads old_h and input where they are
            new_h, new_cell, gates = sequence.step_forward(input, weights, bias, old_h, old_cell)
        else:
            X = torch.cat((old_h, input), dim=1)
            gates = torch.nn.functional.linear(X, weights, bias)
            new_h, new_cell = ops.forward(gates, old_cell)
        ctx.save_for_backward(input, weights, bias, old_h, old_cell, X, gates, new_cell)
        return new_h, new_cell

    @staticmethod
    def backward(ctx, grad_h, grad_cell):
        input, weights, bias, old_h, old_cell, X, gates, new_cell = ctx.saved_tensors
        if derivatives.in_torch_ops(grad_h, grad_cell):
            # X, the gates and new_cell as functions of the arguments.
            X = torch.cat((old_h, input), dim=1)
            gates = torch.nn.functional.linear(X, weights, bias)
            _, new_cell = derivatives.forward_pass(gates, old_cell)
            d_old_cell, d_gates = derivatives.backward_pass(grad_h, grad_cell, new_cell, gates)
        elif X is None:
            return sequence.step_backward(ctx.needs_input_grad, input, weights, bias, old_h,
                                          new_cell, gates, grad_h, grad_cell)
        else:
            d_old_cell, d_gates = ops.backward(grad_h, grad_cell, new_cell, gates)
        return _argument_gradients(ctx.needs_input_grad, d_old_cell, d_gates, None, X, weights,
                                   bias.shape)


class _TransformableCell(torch.autograd.Function):
    """The cell for torch.func's transforms and forward mode: LLTMFunction
    with X = [old_h, input] and the pre-activation gates also outputs, so that
    the backward pass, the forward-mode and the vmap rules find them as
    torch.func requires (lltm() returns the first two)."""

    @staticmethod
    def forward(input, weights, bias, old_h, old_cell):
        check_arguments(input, weights, bias, old_h, old_cell)
        X = torch.cat((old_h, input), dim=1)
        gates = torch.nn.functional.linear(X, weights, bias)
        new_h, new_cell = ops.forward(gates, old_cell)
        return new_h, new_cell, X, gates

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, weights, bias, _, _ = inputs
        _, new_cell, X, gates = output
        # The backward pass recomputes the gate activations from `gates`.
        ctx.save_for_backward(X, weights, gates, new_cell)
        if forward_ad._current_level >= 0:  # inside a dual level: forward mode may call jvp
            ctx.save_for_forward(X, weights, gates, new_cell)
        ctx.bias_shape = bias.shape
        # X's and gates' gradients are None unless someone used them.
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_h, grad_cell, grad_X, grad_gates):
        X, weights, gates, new_cell = ctx.saved_tensors
        if grad_h is None and grad_cell is None:
            d_old_cell = d_gates = None
        elif derivatives.in_torch_ops(grad_h, grad_cell):
            d_old_cell, d_gates = derivatives.backward_pass(grad_h, grad_cell, new_cell, gates)
        else:
            d_old_cell, d_gates = ops.backward(or_zeros(grad_h, new_cell),
                                               or_zeros(grad_cell, new_cell), new_cell, gates)
        return _argument_gradients(ctx.needs_input_grad, d_old_cell, _sum(d_gates, grad_gates),
                                   grad_X, X, weights, ctx.bias_shape)

    @staticmethod
    def jvp(ctx, input_tangent, weights_tangent, bias_tangent, old_h_tangent, old_cell_tangent):
        X, weights, gates, new_cell = ctx.saved_tensors
        X_tangent = None
        if input_tangent is not None or old_h_tangent is not None:
            X_tangent = torch.cat((or_zeros(old_h_tangent, new_cell),
                                   or_zeros(input_tangent, X[:, new_cell.shape[1]:])), dim=1)
        gates_tangent = _sum(_sum(None if X_tangent is None else X_tangent.mm(weights.t()),
                                  None if weights_tangent is None else X.mm(weights_tangent.t())),
                             bias_tangent)
        gates_tangent = or_zeros(gates_tangent, gates).expand_as(gates)
        new_h_tangent, new_cell_tangent = derivatives.forward_tangents(
            gates, new_cell, gates_tangent, old_cell_tangent)
        return new_h_tangent, new_cell_tangent, or_zeros(X_tangent, X), gates_tangent

    @staticmethod
    def vmap(info, in_dims, input, weights, bias, old_h, old_cell):
        arguments = [_batch_first(tensor, dim, info.batch_size)
                     for tensor, dim in zip((input, weights, bias, old_h, old_cell), in_dims)]
        if in_dims[1] is None and in_dims[2] is None:
            # Shared parameters: the mapped dimension joins the batch.
            input, old_h, old_cell = (tensor.flatten(0, 1) for tensor in
                                      (arguments[0], arguments[3], arguments[4]))
            outputs = _TransformableCell.apply(input, weights, bias, old_h, old_cell)
            outputs = tuple(output.unflatten(0, (info.batch_size, -1)) for output in outputs)
        else:
            # A stack of parameters (an ensemble): one call a member.
            members = [_TransformableCell.apply(*(tensor[index] for tensor in arguments))
                       for index in range(info.batch_size)]
            outputs = tuple(torch.stack(output) for output in zip(*members))
        return outputs, (0, 0, 0, 0)


# LLTMFunction.apply without torch.autograd.Function.apply's Python layer,
# whose work (binding defaults, unwrapping torch.func's dead wrappers, the
# transforms' path) plain eager calls do not need: a few microseconds of each.
_apply_plain = super(torch.autograd.Function, LLTMFunction).apply


def _argument_gradients(needs_input_grad, d_old_cell, d_gates, d_X, X, weights, bias_shape):
    """The five arguments' gradients (None where not needed) from d_old_cell,
    d_gates and any gradient reaching X directly (d_X); None counts as zeros."""
    needs_input, needs_weights, needs_bias, needs_old_h, needs_old_cell = needs_input_grad
    d_input = d_weights = d_bias = d_old_h = None
    if (needs_input or needs_old_h) and (d_gates is not None or d_X is not None):
        d_X = _sum(None if d_gates is None else d_gates.mm(weights), d_X)
        state_size = weights.shape[0] // 3
        d_old_h, d_input = d_X[:, :state_size], d_X[:, state_size:]
    if needs_weights and d_gates is not None:
        d_weights = d_gates.t().mm(X)
    if needs_bias and d_gates is not None:
        d_bias = d_gates.sum(dim=0).view(bias_shape)
    return d_input, d_weights, d_bias, d_old_h, d_old_cell if needs_old_cell else None


def _sum(first, second):
    if first is None:
        return second
    return first if second is None else first + second


def _batch_first(tensor, dim, batch_size):
    """`tensor` with its vmapped dimension `dim` first (expanded where None)."""
    if dim is None:
        return tensor.expand(batch_size, *tensor.shape)
    return tensor.movedim(dim, 0)


def _traceable_lltm(input, weights, bias, old_h, old_cell):
    """The cell through the registered operators, for torch.compile, tracers,
    subclasses and autocast. Inside torch.func's transforms (torch.compile of
    torch.func.grad, say) the pointwise pass runs in torch ops instead: the
    operators' autograd does not support those transforms."""
    X = torch.cat((old_h, input), dim=1)
    gates = torch.nn.functional.linear(X, weights, bias).to(old_cell.dtype)
    if torch._C._are_functorch_transforms_active():
        return derivatives.forward_pass(gates, old_cell)
    return ops.forward_pass(gates, old_cell)


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
    if _arguments.plain_eager(input, weights, bias, old_h, old_cell):
        return _apply_plain(input, weights, bias, old_h, old_cell)
    device_type = input.device.type if isinstance(input, torch.Tensor) else "cpu"
    if device_type in _AUTOCAST_DEVICE_TYPES and torch.is_autocast_enabled(device_type):
        return _autocast_lltm(input, weights, bias, old_h, old_cell, device_type)
    if _arguments.use_operator(input, weights, bias, old_h, old_cell):
        check_arguments(input, weights, bias, old_h, old_cell)
        return _traceable_lltm(input, weights, bias, old_h, old_cell)
    if torch._C._are_functorch_transforms_active() or forward_ad._current_level >= 0:
        new_h, new_cell, _, _ = _TransformableCell.apply(input, weights, bias, old_h, old_cell)
        return new_h, new_cell
    return LLTMFunction.apply(input, weights, bias, old_h, old_cell)
