"""The LLTM over whole sequences, the time loop in C: lltm_sequence and the
operators lltm_ffi::sequence_forward and lltm_ffi::sequence_backward.

Only the recurrence is sequential: the input part of every step's gates
(inputs times the input columns of the weights, plus the bias) is one matrix
product in torch before the loop, and the weights' gradient is formed after
it. The loop itself, each step's product with the hidden weights and its
gate math, is one C call each way (lltm_sequence_forward/_backward).

As for the cell, eager calls go through SequenceFunction, which calls C
directly and writes the whole weight gradient at once; torch.compile and
autocast go through the registered operators.

On a GPU the loop's recurrent products go through cuBLAS (loaded by the C
code at run time) past the sizes its persistent kernels take, with TF32 where
torch.backends.cuda.matmul.allow_tf32 allows it for torch's own products;
LLTM_CUBLAS=0 in the environment has lltm_ffi's own kernels do them instead.
"""

import os

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _arguments, _extension, derivatives

_ARGUMENT_NAMES = ("inputs", "weights", "bias", "h0", "c0")


def _shape(tensor):
    return tuple(tensor.shape)


def check_arguments(inputs, weights, bias, h0, c0):
    """TypeError or ValueError, naming the argument, for anything the C loop
    cannot take. The common, valid case costs one expression; the diagnosis
    runs only when it fails."""
    if not _arguments.cell_arguments_fit(inputs, 3, weights, bias, h0, c0):
        _diagnose(inputs, weights, bias, h0, c0)
    if not inputs.is_cpu:
        _arguments.check_device("lltm_sequence", inputs.device)


def _diagnose(inputs, weights, bias, h0, c0):
    _arguments.check_all("lltm_sequence", _ARGUMENT_NAMES, (inputs, weights, bias, h0, c0))
    if inputs.dim() != 3:
        raise ValueError(f"lltm_sequence: inputs must have 3 dimensions (steps, batch, "
                         f"input_features), got shape {_shape(inputs)}")
    for name, tensor in (("h0", h0), ("c0", c0), ("weights", weights)):
        if tensor.dim() != 2:
            raise ValueError(f"lltm_sequence: {name} must have 2 dimensions, got shape "
                             f"{_shape(tensor)}")
    steps, batch_size, input_features = inputs.shape
    state_size = h0.shape[1]
    if h0.shape[0] != batch_size or c0.shape != h0.shape:
        raise ValueError(f"lltm_sequence: h0 and c0 must both have shape (batch, state_size) "
                         f"with the batch of inputs {_shape(inputs)}; got {_shape(h0)} and "
                         f"{_shape(c0)}")
    expected = (3 * state_size, state_size + input_features)
    if _shape(weights) != expected:
        raise ValueError(f"lltm_sequence: weights has shape {_shape(weights)} but must be "
                         f"(3 * state_size, state_size + input_features) = {expected}")
    if _shape(bias) not in ((3 * state_size,), (1, 3 * state_size)):
        raise ValueError(f"lltm_sequence: bias has shape {_shape(bias)} but must be "
                         f"({3 * state_size},) or (1, {3 * state_size})")
    raise AssertionError("check_arguments rejected arguments that _diagnose accepts")


def _hidden_weights(weights):
    """(3 * state, state) with unit column stride, as C reads it (row stride free)."""
    weights = weights.resolve_neg()
    return weights if weights.stride(1) == 1 else weights.contiguous()


def _options():
    """The C loop's options (lltm_ffi.h), read at each call as torch reads its
    own TF32 setting."""
    lib = _extension.require()
    options = lib.LLTM_SEQUENCE_TF32 if torch.backends.cuda.matmul.allow_tf32 else 0
    if os.environ.get("LLTM_CUBLAS") == "0":
        options |= lib.LLTM_SEQUENCE_OWN_KERNELS
    return options


def _forward_pass(projected, hidden_weights, h0, c0):
    """(outputs, cells, gates) of every step: the C loop forward."""
    steps, batch_size, _ = projected.shape
    state_size = h0.shape[1]
    projected, h0, c0 = (_extension.dense(tensor) for tensor in (projected, h0, c0))
    hidden_weights = _hidden_weights(hidden_weights)
    outputs = h0.new_empty(steps, batch_size, state_size)
    cells = torch.empty_like(outputs)
    gates = torch.empty_like(projected)
    if outputs.numel():
        _extension.call("lltm_sequence_forward", h0,
                        (steps, batch_size, state_size, hidden_weights.stride(0), _options()),
                        (projected, hidden_weights, h0, c0, outputs, cells, gates))
    return outputs, cells, gates


@torch.library.custom_op("lltm_ffi::sequence_forward", mutates_args=(),
                         device_types=("cpu", "cuda"))
def sequence_forward(projected: Tensor, hidden_weights: Tensor, h0: Tensor,
                     c0: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(outputs, cells, gates) of every step, from each step's input part of
    the gates projected (steps, batch, 3 * state), the hidden weights
    (3 * state, state) and the initial state h0, c0 (batch, state)."""
    return _forward_pass(projected, hidden_weights, h0, c0)


@sequence_forward.register_fake
def _sequence_forward_fake(projected, hidden_weights, h0, c0):
    outputs = h0.new_empty(projected.shape[0], *h0.shape)
    return outputs, torch.empty_like(outputs), torch.empty_like(projected)


def _backward_pass(hidden_weights, grad_outputs, grad_cells, cells, gates):
    """(d_gates, d_h0, d_c0): the C loop backward."""
    steps, batch_size, state_size = cells.shape
    grad_outputs, grad_cells, cells, gates = (
        _extension.dense(tensor) for tensor in (grad_outputs, grad_cells, cells, gates))
    hidden_weights = _hidden_weights(hidden_weights)
    d_gates = torch.empty_like(gates)
    d_h0 = cells.new_empty(batch_size, state_size)
    d_c0 = torch.empty_like(d_h0)
    if cells.numel():
        _extension.call("lltm_sequence_backward", cells,
                        (steps, batch_size, state_size, hidden_weights.stride(0), _options()),
                        (hidden_weights, grad_outputs, grad_cells, cells, gates, d_gates, d_h0,
                         d_c0))
    return d_gates, d_h0, d_c0


@torch.library.custom_op("lltm_ffi::sequence_backward", mutates_args=(),
                         device_types=("cpu", "cuda"))
def sequence_backward(hidden_weights: Tensor, grad_outputs: Tensor, grad_cells: Tensor,
                      cells: Tensor, gates: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(d_gates, d_h0, d_c0) from the gradients of every step's outputs and
    cells and what the forward pass saved."""
    return _backward_pass(hidden_weights, grad_outputs, grad_cells, cells, gates)


@sequence_backward.register_fake
def _sequence_backward_fake(hidden_weights, grad_outputs, grad_cells, cells, gates):
    d_h0 = cells.new_empty(cells.shape[1:])
    return torch.empty_like(gates), d_h0, torch.empty_like(d_h0)


def _recurrence_in_torch(projected, hidden_weights, h0, c0):
    """(outputs, cells) of every step, as sequence_forward, in torch ops: what
    autograd differentiates where it records the backward (create_graph=True),
    for which the C loops have no derivative."""
    h, c, outputs, cells = h0, c0, [], []
    for step in projected:
        h, c = derivatives.forward_pass(step + h.mm(hidden_weights.t()), c)
        outputs.append(h)
        cells.append(c)
    return torch.stack(outputs), torch.stack(cells)


def _setup_context(ctx, inputs, output):
    projected, hidden_weights, h0, c0 = inputs
    outputs, cells, gates = output
    ctx.save_for_backward(hidden_weights, h0, outputs, cells, gates, projected, c0)


def _hidden_weights_grad(d_gates, h0, outputs, out):
    """Writes into `out` each step's gate gradient times the h it multiplied:
    h0, then the outputs but the last."""
    torch.mm(d_gates[0].t(), h0, out=out)
    if outputs.shape[0] > 1:
        out.addmm_(d_gates[1:].flatten(0, 1).t(), outputs[:-1].flatten(0, 1))
    return out


def _sequence_forward_backward(ctx, grad_outputs, grad_cells, _):
    hidden_weights, h0, outputs, cells, gates, projected, c0 = ctx.saved_tensors
    grad_outputs = derivatives.or_zeros(grad_outputs, outputs)
    grad_cells = derivatives.or_zeros(grad_cells, cells)
    if derivatives.in_torch_ops(grad_outputs, grad_cells):
        return derivatives.recorded_grads(_recurrence_in_torch,
                                          (projected, hidden_weights, h0, c0),
                                          ctx.needs_input_grad, (grad_outputs, grad_cells))
    d_gates, d_h0, d_c0 = sequence_backward(hidden_weights, grad_outputs, grad_cells, cells, gates)
    d_hidden = _hidden_weights_grad(d_gates, h0, outputs, h0.new_empty(hidden_weights.shape))
    return d_gates, d_hidden, d_h0, d_c0


sequence_forward.register_autograd(_sequence_forward_backward, setup_context=_setup_context)


class SequenceFunction(torch.autograd.Function):
    """lltm_sequence in eager mode: (inputs, weights, bias, h0, c0) ->
    (outputs, cells), calling the C loops directly."""

    @staticmethod
    def forward(ctx, inputs, weights, bias, h0, c0):
        state_size = h0.shape[1]
        projected = F.linear(inputs, weights[:, state_size:], bias.reshape(-1))
        outputs, cells, gates = _forward_pass(projected, weights[:, :state_size], h0, c0)
        ctx.save_for_backward(inputs, weights, h0, outputs, cells, gates, bias, c0)
        ctx.bias_shape = bias.shape
        return outputs, cells

    @staticmethod
    def backward(ctx, grad_outputs, grad_cells):
        inputs, weights, h0, outputs, cells, gates, bias, c0 = ctx.saved_tensors
        if derivatives.in_torch_ops(grad_outputs, grad_cells):
            return derivatives.recorded_grads(_sequence_in_torch,
                                              (inputs, weights, bias, h0, c0),
                                              ctx.needs_input_grad, (grad_outputs, grad_cells))
        state_size = h0.shape[1]
        d_gates, d_h0, d_c0 = _backward_pass(weights[:, :state_size], grad_outputs, grad_cells,
                                             cells, gates)
        needs_inputs, needs_weights, needs_bias, needs_h0, needs_c0 = ctx.needs_input_grad
        d_inputs = d_weights = d_bias = None
        if needs_inputs:
            d_inputs = d_gates.matmul(weights[:, state_size:])
        if needs_weights:
            # Both column blocks written in place: one gradient, no slice backward.
            d_weights = weights.new_empty(weights.shape)
            _hidden_weights_grad(d_gates, h0, outputs, d_weights[:, :state_size])
            torch.mm(d_gates.flatten(0, 1).t(), inputs.flatten(0, 1),
                     out=d_weights[:, state_size:])
        if needs_bias:
            d_bias = d_gates.sum(dim=(0, 1)).view(ctx.bias_shape)
        return (d_inputs, d_weights, d_bias, d_h0 if needs_h0 else None,
                d_c0 if needs_c0 else None)

    @staticmethod
    def jvp(ctx, *tangents):
        raise NotImplementedError(_UNSUPPORTED_TRANSFORMS)


# As function.py's _apply_plain: SequenceFunction.apply without
# torch.autograd.Function.apply's Python layer, for plain eager calls.
_apply_plain = super(torch.autograd.Function, SequenceFunction).apply

_UNSUPPORTED_TRANSFORMS = (
    "lltm_ffi.lltm_sequence supports torch.autograd's reverse mode, to any order, but not "
    "forward-mode AD nor torch.func's transforms (grad, vjp, jacrev, jvp, jacfwd, vmap); "
    "lltm_ffi.lltm, one step at a time, supports them all")


def _sequence_in_torch(inputs, weights, bias, h0, c0):
    """(outputs, cells) of SequenceFunction in torch ops."""
    state_size = h0.shape[1]
    projected = F.linear(inputs, weights[:, state_size:], bias.reshape(-1))
    return _recurrence_in_torch(projected, weights[:, :state_size], h0, c0)


def _autocast_enabled(inputs):
    return (isinstance(inputs, torch.Tensor) and inputs.device.type in ("cpu", "cuda")
            and torch.is_autocast_enabled(inputs.device.type))


def _run(inputs, weights, bias, h0, c0, autocast):
    """Through the registered operators, for torch.compile and autocast."""
    state_size = h0.shape[1]
    projected = F.linear(inputs, weights[:, state_size:], bias.reshape(-1))
    if autocast:
        # As in the cell: the matrix product before the loop in the autocast
        # dtype, the recurrence in float32.
        with torch.autocast(inputs.device.type, enabled=False):
            return sequence_forward(projected.float(), weights[:, :state_size].float(),
                                    h0.float(), c0.float())
    return sequence_forward(projected, weights[:, :state_size], h0, c0)


def lltm_sequence(inputs, weights, bias, h0, c0):
    """The LLTM cell over a sequence: returns (outputs, (h_n, c_n)).

    inputs (steps, batch, input_features); weights, bias as for lltm_ffi.lltm;
    h0 and c0 (batch, state_size). outputs (steps, batch, state_size) holds
    every step's new_h; h_n and c_n are the last step's state (h0 and c0 when
    steps is 0). Differentiable in all five arguments through every output.
    Under torch.autocast the input projection runs in the autocast dtype and
    the recurrence in float32 (float32 out).
    """
    plain = _arguments.plain_eager(inputs, weights, bias, h0, c0)
    autocast = not plain and _autocast_enabled(inputs)
    if autocast:
        inputs, weights, bias, h0, c0 = (
            tensor.float() if isinstance(tensor, torch.Tensor) and tensor.is_floating_point()
            else tensor for tensor in (inputs, weights, bias, h0, c0))
    check_arguments(inputs, weights, bias, h0, c0)
    if inputs.shape[0] == 0:
        return inputs.new_empty(0, *h0.shape), (h0, c0)
    if plain:
        outputs, cells = _apply_plain(inputs, weights, bias, h0, c0)
    elif torch._C._are_functorch_transforms_active():
        raise NotImplementedError(_UNSUPPORTED_TRANSFORMS)
    elif autocast or _arguments.use_operator(inputs, weights, bias, h0, c0):
        outputs, cells, _ = _run(inputs, weights, bias, h0, c0, autocast)
    else:
        outputs, cells = SequenceFunction.apply(inputs, weights, bias, h0, c0)
    return outputs, (outputs[-1], cells[-1])
