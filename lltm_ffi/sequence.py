"""The LLTM over whole sequences, the time loop in C: lltm_sequence and the
operators lltm_ffi::sequence_forward and lltm_ffi::sequence_backward.

Each pass is one C call (lltm_sequence_forward/_backward): the forward pass
computes every step's input part of the gates, then runs the recurrence;
the backward pass runs the recurrence backwards, then forms the gradients
of the inputs, the weights and the bias. Python only checks the arguments
and allocates the results.

As for the cell, eager calls go through SequenceFunction, which calls C
directly; torch.compile and autocast go through the registered operators.

On a GPU the matrix products go through cuBLAS (loaded by the C code at run
time; the recurrent ones past the sizes the persistent kernels take), with
TF32 where torch.backends.cuda.matmul.allow_tf32 allows it for torch's own
products; LLTM_CUBLAS=0 in the environment has lltm_ffi's own kernels do
them all instead.
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


def _options():
    """The C passes' options (lltm_ffi.h), read at each call as torch reads its
    own TF32 setting."""
    lib = _extension.require()
    options = lib.LLTM_SEQUENCE_TF32 if torch.backends.cuda.matmul.allow_tf32 else 0
    if os.environ.get("LLTM_CUBLAS") == "0":
        options |= lib.LLTM_SEQUENCE_OWN_KERNELS
    return options


def _dense(*tensors):
    return [_extension.dense(tensor) for tensor in tensors]


def _forward_pass(inputs, weights, bias, h0, c0):
    """(outputs, cells, gates) of every step: the C forward pass."""
    inputs, weights, bias, h0, c0 = _dense(inputs, weights, bias, h0, c0)
    steps, batch_size, input_features = inputs.shape
    state_size = h0.shape[1]
    outputs = h0.new_empty(steps, batch_size, state_size)
    cells = torch.empty_like(outputs)
    gates = h0.new_empty(steps, batch_size, 3 * state_size)
    if outputs.numel():
        _extension.call("lltm_sequence_forward", h0,
                        (steps, batch_size, input_features, state_size, _options()),
                        (inputs, weights, bias, h0, c0, outputs, cells, gates))
    return outputs, cells, gates


@torch.library.custom_op("lltm_ffi::sequence_forward", mutates_args=(),
                         device_types=("cpu", "cuda"))
def sequence_forward(inputs: Tensor, weights: Tensor, bias: Tensor, h0: Tensor,
                     c0: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(outputs, cells, gates) of every step, from the arguments of
    lltm_sequence: every step's new_h and new_cell (steps, batch, state) and
    its pre-activation gates (steps, batch, 3 * state)."""
    return _forward_pass(inputs, weights, bias, h0, c0)


@sequence_forward.register_fake
def _sequence_forward_fake(inputs, weights, bias, h0, c0):
    outputs = h0.new_empty(inputs.shape[0], *h0.shape)
    return outputs, torch.empty_like(outputs), h0.new_empty(*outputs.shape[:2], 3 * h0.shape[1])


def _readable(gradient):
    """An output gradient as C reads it, through its strides (autograd's are
    often broadcast views, which a copy would only expand): the negation bit
    applied; None stays None (zeros)."""
    return gradient if gradient is None or not gradient.is_neg() else gradient.resolve_neg()


def _strides(gradient):
    """The (step, row, column) strides of an output gradient as C reads them:
    zeros for None (zeros), a step stride of 0 for one step's (row, column)."""
    if gradient is None:
        return (0, 0, 0)
    return (0,) * (3 - gradient.dim()) + gradient.stride()


def _backward_pass(inputs, weights, bias_shape, h0, outputs, cells, gates, grad_outputs,
                   grad_cells, wanted):
    """(d_inputs, d_weights, d_bias, d_h0, d_c0): the C backward pass. A
    gradient of the outputs or cells given as None counts as zeros; each
    gradient is None unless `wanted` (five booleans) says so."""
    inputs, weights, h0, outputs, cells, gates = _dense(inputs, weights, h0, outputs, cells, gates)
    grad_outputs, grad_cells = _readable(grad_outputs), _readable(grad_cells)
    steps, batch_size, input_features = inputs.shape
    state_size = h0.shape[1]
    computed = cells.numel() > 0
    # With no element to compute, every gradient is zeros (or empty).
    new = h0.new_empty if computed else h0.new_zeros
    wants_h0, wants_c0 = wanted[3:]
    d_inputs, d_weights, d_bias = (new(shape) if want else None for shape, want in
                                   zip((inputs.shape, weights.shape, bias_shape), wanted))
    # Past one step d_h0 and d_c0 carry the gradients between steps: C needs them.
    d_h0, d_c0 = (new(h0.shape) if want or steps > 1 else None for want in (wants_h0, wants_c0))
    if computed:
        strides = (*_strides(grad_outputs), *_strides(grad_cells))
        _extension.call("lltm_sequence_backward", h0,
                        (steps, batch_size, input_features, state_size, _options(), strides),
                        (inputs, weights, h0, outputs, cells, gates, grad_outputs, grad_cells,
                         torch.empty_like(gates), d_inputs, d_weights, d_bias, d_h0, d_c0))
    return d_inputs, d_weights, d_bias, d_h0 if wants_h0 else None, d_c0 if wants_c0 else None


@torch.library.custom_op("lltm_ffi::sequence_backward", mutates_args=(),
                         device_types=("cpu", "cuda"))
def sequence_backward(inputs: Tensor, weights: Tensor, bias: Tensor, h0: Tensor,
                      outputs: Tensor, cells: Tensor, gates: Tensor, grad_outputs: Tensor,
                      grad_cells: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients of lltm_sequence's five arguments (bias: only its shape
    is read) from those of every step's outputs and cells and what the
    forward pass read and saved."""
    return _backward_pass(inputs, weights, bias.shape, h0, outputs, cells, gates, grad_outputs,
                          grad_cells, (True,) * 5)


@sequence_backward.register_fake
def _sequence_backward_fake(inputs, weights, bias, h0, outputs, cells, gates, grad_outputs,
                            grad_cells):
    return tuple(h0.new_empty(tensor.shape) for tensor in (inputs, weights, bias, h0, h0))


# lltm_ffi.h's LLTM_STEP_MULTIPLY_ADDS.
_STEP_MULTIPLY_ADDS = (_extension.lib.LLTM_STEP_MULTIPLY_ADDS if _extension.lib is not None
                       else 0)


def step_multiply_adds(batch_size, input_features, state_size):
    """The multiply-adds of one step's gate product."""
    return batch_size * 3 * state_size * (state_size + input_features)


def fused_step(batch_size, input_features, state_size):
    """True where C runs one step on a GPU in its own fused kernels (its gate
    product at most LLTM_STEP_MULTIPLY_ADDS multiply-adds), as the C passes
    decide: the cell's eager GPU calls take step_forward there."""
    return step_multiply_adds(batch_size, input_features, state_size) <= _STEP_MULTIPLY_ADDS


def step_forward(input, weights, bias, old_h, old_cell):
    """(new_h, new_cell, gates) of one step of the cell, as a sequence of
    length 1 where fused_step says C runs it in its step kernels: one C call
    for the gate product and the cell. The cell's hot path, hence written
    out rather than through _forward_pass; the step kernels take no
    options."""
    input, weights, bias, old_h, old_cell = _dense(input, weights, bias, old_h, old_cell)
    batch_size, input_features = input.shape
    new_h, new_cell = torch.empty_like(old_h), torch.empty_like(old_h)
    gates = old_h.new_empty(batch_size, 3 * old_h.shape[1])
    if gates.numel():
        _extension.call("lltm_sequence_forward", old_h,
                        (1, batch_size, input_features, old_h.shape[1], 0),
                        (input, weights, bias, old_h, old_cell, new_h, new_cell, gates))
    return new_h, new_cell, gates


def step_backward(wanted, input, weights, bias, old_h, new_cell, gates, grad_h, grad_cell):
    """(d_input, d_weights, d_bias, d_old_h, d_old_cell) of one step from what
    step_forward returned (new_cell and gates, dense), each None unless
    `wanted` (five booleans) says so: one C call."""
    input, weights, old_h = _dense(input, weights, old_h)
    grad_h, grad_cell = _readable(grad_h), _readable(grad_cell)
    # With no element to compute, every gradient is zeros (or empty); C
    # writes d_bias as 3 * state consecutive elements, as empty_like lays
    # out any bias.
    new = torch.empty_like if gates.numel() else torch.zeros_like
    gradients = tuple(new(tensor) if want else None for want, tensor in
                      zip(wanted, (input, weights, bias, old_h, old_h)))
    if gates.numel():
        _extension.call("lltm_sequence_backward", old_h,
                        (1, *input.shape, old_h.shape[1], 0,
                         (*_strides(grad_h), *_strides(grad_cell))),
                        (input, weights, old_h, None, new_cell, gates, grad_h, grad_cell,
                         torch.empty_like(gates), *gradients))
    return gradients


def _sequence_in_torch(inputs, weights, bias, h0, c0):
    """(outputs, cells) of every step, as sequence_forward, in torch ops: what
    autograd differentiates where it records the backward (create_graph=True),
    for which the C passes have no derivative."""
    state_size = h0.shape[1]
    projected = F.linear(inputs, weights[:, state_size:], bias.reshape(-1))
    hidden_weights = weights[:, :state_size]
    h, c, outputs, cells = h0, c0, [], []
    for step in projected:
        h, c = derivatives.forward_pass(step + h.mm(hidden_weights.t()), c)
        outputs.append(h)
        cells.append(c)
    return torch.stack(outputs), torch.stack(cells)


def _recorded_grads(ctx, arguments, outputs, cells, grad_outputs, grad_cells):
    return derivatives.recorded_grads(
        _sequence_in_torch, arguments, ctx.needs_input_grad,
        (derivatives.or_zeros(grad_outputs, outputs), derivatives.or_zeros(grad_cells, cells)))


def _setup_context(ctx, inputs, output):
    outputs, cells, gates = output
    ctx.save_for_backward(*inputs, outputs, cells, gates)


def _sequence_forward_backward(ctx, grad_outputs, grad_cells, _):
    inputs, weights, bias, h0, c0, outputs, cells, gates = ctx.saved_tensors
    if derivatives.in_torch_ops(grad_outputs, grad_cells):
        return _recorded_grads(ctx, (inputs, weights, bias, h0, c0), outputs, cells,
                               grad_outputs, grad_cells)
    return sequence_backward(inputs, weights, bias, h0, outputs, cells, gates,
                             derivatives.or_zeros(grad_outputs, outputs),
                             derivatives.or_zeros(grad_cells, cells))


sequence_forward.register_autograd(_sequence_forward_backward, setup_context=_setup_context)


class SequenceFunction(torch.autograd.Function):
    """lltm_sequence in eager mode: (inputs, weights, bias, h0, c0) ->
    (outputs, cells), calling the C passes directly."""

    @staticmethod
    def forward(ctx, inputs, weights, bias, h0, c0):
        outputs, cells, gates = _forward_pass(inputs, weights, bias, h0, c0)
        # The arguments as given, so that a backward recorded in torch ops
        # reaches their history.
        ctx.save_for_backward(inputs, weights, bias, h0, c0, outputs, cells, gates)
        ctx.set_materialize_grads(False)
        return outputs, cells

    @staticmethod
    def backward(ctx, grad_outputs, grad_cells):
        inputs, weights, bias, h0, c0, outputs, cells, gates = ctx.saved_tensors
        if derivatives.in_torch_ops(grad_outputs, grad_cells):
            return _recorded_grads(ctx, (inputs, weights, bias, h0, c0), outputs, cells,
                                   grad_outputs, grad_cells)
        return _backward_pass(inputs, weights, bias.shape, h0, outputs, cells, gates,
                              grad_outputs, grad_cells, ctx.needs_input_grad)

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


def _autocast_enabled(inputs):
    return (isinstance(inputs, torch.Tensor) and inputs.device.type in ("cpu", "cuda")
            and torch.is_autocast_enabled(inputs.device.type))


def lltm_sequence(inputs, weights, bias, h0, c0):
    """The LLTM cell over a sequence: returns (outputs, (h_n, c_n)).

    inputs (steps, batch, input_features); weights, bias as for lltm_ffi.lltm;
    h0 and c0 (batch, state_size). outputs (steps, batch, state_size) holds
    every step's new_h; h_n and c_n are the last step's state (h0 and c0 when
    steps is 0). Differentiable in all five arguments through every output.
    Under torch.autocast it runs in float32 (float32 out), the arguments cast
    to float32.
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
        outputs, cells, _ = sequence_forward(inputs, weights, bias, h0, c0)
    else:
        outputs, cells = SequenceFunction.apply(inputs, weights, bias, h0, c0)
    return outputs, (outputs[-1], cells[-1])
