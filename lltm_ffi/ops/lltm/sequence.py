"""The LLTM over whole sequences, the time loop in C: lltm_sequence and its
passes, sequence_forward and sequence_backward.

Each pass is one C call: the forward pass computes every step's input part
of the gates, then runs the recurrence; the backward pass runs the
recurrence backwards, then forms the gradients of the inputs, the weights
and the bias. Python only checks the arguments and allocates the results.

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
from torch.autograd import forward_ad

from ... import _torch_internals, op
from . import cell, derivatives

_ARGUMENT_NAMES = ("inputs", "weights", "bias", "h0", "c0")


def check_arguments(inputs, weights, bias, h0, c0):
    """TypeError or ValueError, naming the argument, for anything the C loop
    cannot take. The common, valid case costs one expression; the diagnosis
    runs only when it fails."""
    if not cell.arguments_fit(inputs, 3, weights, bias, h0, c0):
        cell.diagnose("lltm_sequence", _ARGUMENT_NAMES, 3, (inputs, weights, bias, h0, c0))
    if not inputs.is_cpu:
        op.check_device("lltm_sequence", inputs.device)


def _options():
    """The C passes' options: (tf32, own_kernels), read at each call as torch
    reads its own TF32 setting."""
    return (int(torch.backends.cuda.matmul.allow_tf32), int(os.environ.get("LLTM_CUBLAS") == "0"))


@op.c_pass("sequence_forward", check=check_arguments)
def sequence_forward(c, inputs: op.Tensor(dims=3), weights: op.Tensor(dims=2),
                     bias: op.Tensor(dims=(1, 2)), h0: op.Tensor(dims=2),
                     c0: op.Tensor(dims=2)) -> tuple[Tensor, Tensor, Tensor]:
    """(outputs, cells, gates) of every step, from the arguments of
    lltm_sequence: every step's new_h and new_cell (steps, batch, state) and
    its pre-activation gates (steps, batch, 3 * state)."""
    steps, batch_size, input_features = inputs.shape
    state_size = h0.shape[1]
    outputs = h0.new_empty(steps, batch_size, state_size)
    cells = torch.empty_like(outputs)
    gates = h0.new_empty(steps, batch_size, 3 * state_size)
    if outputs.numel():
        c(sizes=(steps, batch_size, input_features, state_size, *_options()),
          tensors=(inputs, weights, bias, h0, c0, outputs, cells, gates))
    return outputs, cells, gates


def _readable(gradient):
    """An output gradient as C reads it, through its strides (autograd's are
    often broadcast views, which a copy would only expand): the negation bit
    applied; None stays None (zeros)."""
    return gradient if gradient is None or not gradient.is_neg() else gradient.resolve_neg()


def _check_backward(inputs, weights, bias, h0, outputs, cells, gates, grad_outputs, grad_cells):
    check_arguments(inputs, weights, bias, h0, h0)
    steps, batch_size, _ = inputs.shape
    state_size = h0.shape[1]
    for name, tensor in (("outputs", outputs), ("cells", cells), ("grad_outputs", grad_outputs),
                         ("grad_cells", grad_cells)):
        if tensor is not None:
                op.check_shape("lltm_ffi::sequence_backward", name, tensor,
                           (steps, batch_size, state_size))
    op.check_shape("lltm_ffi::sequence_backward", "gates", gates,
                   (steps, batch_size, 3 * state_size))


@op.c_pass("sequence_backward", check=_check_backward)
def sequence_backward(c, inputs: op.Tensor(dims=3), weights: op.Tensor(dims=2),
                      bias: op.Tensor(dims=(1, 2)), h0: op.Tensor(dims=2),
                      outputs: op.Tensor(dims=3), cells: op.Tensor(dims=3),
                      gates: op.Tensor(dims=3),
                      grad_outputs: op.Tensor(dims=3, optional=True, strided=True),
                      grad_cells: op.Tensor(dims=3, optional=True, strided=True),
                      *, wanted=(True,) * 5) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients of lltm_sequence's five arguments (d_inputs, d_weights,
    d_bias, d_h0, d_c0; of bias only the shape is read) from those of every
    step's outputs and cells (None: zeros) and what the forward pass read
    and saved; each is None unless `wanted` (five booleans) says so."""
    steps, batch_size, input_features = inputs.shape
    state_size = h0.shape[1]
    computed = cells.numel() > 0
    # With no element to compute, every gradient is zeros (or empty).
    new = h0.new_empty if computed else h0.new_zeros
    wants_h0, wants_c0 = wanted[3:]
    d_inputs, d_weights, d_bias = (new(shape) if want else None for shape, want in
                                   zip((inputs.shape, weights.shape, bias.shape), wanted))
    # Past one step d_h0 and d_c0 carry the gradients between steps: C needs them.
    d_h0, d_c0 = (new(h0.shape) if want or steps > 1 else None for want in (wants_h0, wants_c0))
    if computed:
        c(sizes=(steps, batch_size, input_features, state_size, *_options(),
                 *cell._strides(grad_outputs), *cell._strides(grad_cells)),
          tensors=(inputs, weights, h0, outputs, cells, gates, grad_outputs, grad_cells,
                   torch.empty_like(gates), d_inputs, d_weights, d_bias, d_h0, d_c0))
    return d_inputs, d_weights, d_bias, d_h0 if wants_h0 else None, d_c0 if wants_c0 else None


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


def _save_for_backward(ctx, inputs, output):
    # The arguments as given, so that a backward recorded in torch ops
    # reaches their history.
    ctx.save_for_backward(*inputs, *output)
    ctx.set_materialize_grads(False)


def _sequence_backward(ctx, grad_outputs, grad_cells, _=None):
    """The one backward of the sequence: torch ops while autograd records it
    (create_graph=True), which it can differentiate again; else the C pass
    (its operator under a tracer)."""
    inputs, weights, bias, h0, c0, outputs, cells, gates = ctx.saved_tensors
    if derivatives.in_torch_ops(grad_outputs, grad_cells):
        return derivatives.recorded_grads(
            _sequence_in_torch, (inputs, weights, bias, h0, c0), ctx.needs_input_grad,
            (derivatives.or_zeros(grad_outputs, outputs), derivatives.or_zeros(grad_cells, cells)))
    arguments = (inputs, weights, bias, h0, outputs, cells, gates, _readable(grad_outputs),
                 _readable(grad_cells))
    if op.use_operator(*(tensor for tensor in arguments if tensor is not None)):
        return sequence_backward.operator(*arguments)
    return sequence_backward.run(*arguments, wanted=ctx.needs_input_grad)


sequence = op.Op(sequence_forward, _sequence_backward, _save_for_backward,
                 result=lambda output: output[:2])

_UNSUPPORTED_TRANSFORMS = (
    "lltm_ffi.lltm_sequence supports torch.autograd's reverse mode, to any order, but not "
    "forward-mode AD nor torch.func's transforms (grad, vjp, jacrev, jvp, jacfwd, vmap); "
    "lltm_ffi.lltm, one step at a time, supports them all")


def _dual(*tensors):
    """True where forward-mode AD is on and an argument carries a tangent."""
    return _torch_internals.forward_ad_active() and any(
        forward_ad.unpack_dual(tensor).tangent is not None for tensor in tensors)


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
    plain = op.plain_eager(inputs, weights, bias, h0, c0)
    autocast = not plain and _autocast_enabled(inputs)
    if autocast:
        inputs, weights, bias, h0, c0 = (
            tensor.float() if isinstance(tensor, torch.Tensor) and tensor.is_floating_point()
            else tensor for tensor in (inputs, weights, bias, h0, c0))
    check_arguments(inputs, weights, bias, h0, c0)
    steps = inputs.shape[0]
    if steps == 0:
        return inputs.new_empty(0, *h0.shape), (h0, c0)
    if plain and steps == 1 and inputs.is_cuda and cell.uses_step_kernels(
            *inputs.shape[1:], h0.shape[1]):
        # One step is a call of the cell, in its step kernels.
        new_h, new_cell = cell.lltm(inputs[0], weights, bias, h0, c0)
        return new_h.unsqueeze(0), (new_h, new_cell)
    if plain:
        outputs, cells = sequence._apply(inputs, weights, bias, h0, c0)[:2]
    elif _torch_internals.functorch_transforms_active() or _dual(inputs, weights, bias, h0, c0):
        raise NotImplementedError(_UNSUPPORTED_TRANSFORMS)
    elif autocast or op.use_operator(inputs, weights, bias, h0, c0):
        outputs, cells, _ = sequence_forward.operator(inputs, weights, bias, h0, c0)
    else:
        outputs, cells = sequence.function.apply(inputs, weights, bias, h0, c0)[:2]
    return outputs, (outputs[-1], cells[-1])
