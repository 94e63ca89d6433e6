"""The LLTM cell: its C passes, the autograd.Function and the functional
entry point, lltm().

Where a call's matrix products run is the plan's choice (src/plan.c; here
uses_step_kernels asks it): on a GPU an eager step whose gate product is
small (smaller still while a CUDA graph is captured) runs in lltm_ffi's own
kernels, one C call a pass (step_forward, step_backward), where torch's
operations around a pointwise pass would cost the host more than the GPU's
arithmetic. Otherwise, and on the CPU, the products stay in torch (cat +
linear forward; mm and sum backward), whose BLAS is the faster at larger
sizes, and only the fused pointwise passes (forward_pass, backward_pass)
go through C. torch.compile, tracers and tensor subclasses see the cell as
cat, linear and the operator lltm_ffi::forward_pass.
"""

import torch
from torch import Tensor

from ... import _torch_internals, op
from . import derivatives, plan
from .derivatives import or_zeros

_ARGUMENT_NAMES = ("input", "weights", "bias", "old_h", "old_cell")


def _shape(tensor):
    return tuple(tensor.shape)


def arguments_fit(input, input_dims, weights, bias, h, c, forward, optional_bias=False):
    """True when input (input_dims dimensions, the last two batch and
    features), weights, bias (or, where optional_bias, None), h and c are
    usable together with the cell's shapes, all of one dtype on one device
    that the pass `forward` (an op.Pass) takes them in: the valid case of
    the cell and the sequence, in one expression; False, never an
    exception, otherwise, for the caller's own diagnosis."""
    try:
        dtype, device = input.dtype, input.device
        taken = (forward.cpu_dtypes if input.is_cpu else forward.cuda_dtypes if input.is_cuda
                 else ())
        if input.dim() != input_dims or dtype not in taken or input.layout is not torch.strided:
            return False
        no_bias = bias is None and optional_bias
        for tensor in (weights, h, c) if no_bias else (weights, bias, h, c):
            if (tensor.layout is not torch.strided or tensor.dtype is not dtype
                    or tensor.device != device):
                return False
        batch_size, input_features = input.shape[-2:]
        rows, columns = weights.shape
        state_size = h.shape[1]
        return (h.dim() == 2 and c.shape == h.shape and h.shape[0] == batch_size
                and rows == 3 * state_size and columns == state_size + input_features
                and (no_bias or (bias.shape[-1] == rows and (bias.dim() == 1 or bias.shape[0] == 1)
                                 and bias.dim() <= 2)))
    except (AttributeError, TypeError, IndexError, ValueError, RuntimeError):
        return False


def check_arguments(function, input, weights, bias, old_h, old_cell):
    """Raises TypeError or ValueError, naming the argument and `function`
    (the one the caller called: lltm, or an operator), for anything the C
    passes cannot take (LLTMError for a CUDA device the module was built
    without); returns nothing when all five are usable together. The
    common, valid case costs one expression; the diagnosis runs only when
    it fails."""
    if not arguments_fit(input, 2, weights, bias, old_h, old_cell, forward_pass):
        diagnose(function, _ARGUMENT_NAMES, 2, (input, weights, bias, old_h, old_cell),
                 forward_pass)


def diagnose(function, names, input_dims, tensors, forward, optional_bias=False):
    """The TypeError or ValueError, naming the argument, for arguments that
    arguments_fit refused: `function` (lltm or lltm_sequence) called with
    `tensors` (input, weights, bias, h, c) named `names`, its input of
    `input_dims` dimensions (the last two batch and features), to run the
    pass `forward`; a bias of None is no bias where optional_bias."""
    input_name, _, _, h_name, c_name = names
    input, weights, bias, h, c = tensors
    # The tensors given: all five, or four without a bias; the relations
    # below take all five, bias None for none.
    given = [(name, tensor) for index, (name, tensor) in enumerate(zip(names, tensors))
             if not (index == 2 and bias is None and optional_bias)]
    for name, tensor in given:
        op.check_tensor(function, name, tensor)
    for name, tensor in given[1:]:
        op.check_matches(function, name, tensor, input_name, input)
    op.check_device(function, input.device)
    op.check_dtype(function, input_name, input, forward)
    if input.dim() != input_dims:
        layout = "(steps, batch, input_features)" if input_dims == 3 else "(batch, input_features)"
        raise ValueError(f"{function}: {input_name} must have {input_dims} dimensions {layout}, "
                         f"got shape {_shape(input)}")
    for name, tensor in given[1:]:
        if tensor.dim() != 2 and not (tensor is bias and tensor.dim() == 1):
            expected = "1 or 2 dimensions" if tensor is bias else "2 dimensions"
            raise ValueError(f"{function}: {name} must have {expected}, got shape "
                             f"{_shape(tensor)}")
    if h.shape[0] != input.shape[-2]:
        raise ValueError(f"{function}: {h_name} has shape {_shape(h)} but {input_name} has shape "
                         f"{_shape(input)}; they must have the same batch size")
    check_relations(function, names, tensors)
    raise AssertionError("arguments_fit refused arguments that diagnose accepts")


def check_relations(function, names, tensors):
    """ValueError, naming the argument, unless c has h's shape and the
    weights and the bias fit h's state size and the input's features (its
    last dimension): (input, weights, bias, h, c) named `names`, of the
    dimensions the cell takes, bias None for none."""
    input_name, _, _, h_name, c_name = names
    input, weights, bias, h, c = tensors
    state_size, input_features = h.shape[1], input.shape[-1]
    if c.shape != h.shape:
        raise ValueError(f"{function}: {c_name} has shape {_shape(c)} but {h_name} has shape "
                         f"{_shape(h)}; they must match")
    gates_size = 3 * state_size
    if weights.shape != (gates_size, state_size + input_features):
        raise ValueError(
            f"{function}: weights has shape {_shape(weights)} but must be (3 * state_size, "
            f"state_size + input_features) = {(gates_size, state_size + input_features)} "
            f"for {input_name} of shape {_shape(input)} and {h_name} of shape {_shape(h)}")
    if bias is not None and bias.shape != (gates_size,) and bias.shape != (1, gates_size):
        raise ValueError(f"{function}: bias has shape {_shape(bias)} but must be ({gates_size},) "
                         f"or (1, {gates_size}) for weights of shape {_shape(weights)}")


# The fused pointwise passes ---------------------------------------------------

def _check_forward_pass(function, gates, old_cell):
    batch_size, state_size = old_cell.shape
    op.check_shape(function, "gates", gates, (batch_size, 3 * state_size))


@op.c_pass("forward_pass", check=_check_forward_pass)
def forward_pass(c, gates: op.Tensor(dims=2), old_cell: op.Tensor(dims=2)) -> tuple[Tensor, Tensor]:
    """(new_h, new_cell) from the pre-activation gates (batch, 3 * state:
    input gate, output gate, candidate cell) and old_cell (batch, state)."""
    new_h = torch.empty_like(old_cell)
    new_cell = torch.empty_like(old_cell)
    if old_cell.numel():
        c(sizes=old_cell.shape, tensors=(gates, old_cell, new_h, new_cell))
    return new_h, new_cell


def _check_backward_pass(function, grad_h, grad_cell, new_cell, gates):
    batch_size, state_size = new_cell.shape
    for name, tensor in (("grad_h", grad_h), ("grad_cell", grad_cell)):
        op.check_shape(function, name, tensor, (batch_size, state_size))
    op.check_shape(function, "gates", gates, (batch_size, 3 * state_size))


@op.c_pass("backward_pass", check=_check_backward_pass)
def backward_pass(c, grad_h: op.Tensor(dims=2, strided=True),
                  grad_cell: op.Tensor(dims=2, strided=True), new_cell: op.Tensor(dims=2),
                  gates: op.Tensor(dims=2)) -> tuple[Tensor, Tensor]:
    """(d_old_cell, d_gates) from the output gradients, read through their
    strides (autograd often hands over broadcast views, which need no copy),
    and what forward_pass saved: new_cell and the gates."""
    d_old_cell = torch.empty_like(new_cell)
    d_gates = torch.empty_like(gates)
    if new_cell.numel():
        c(sizes=(*new_cell.shape, *grad_h.stride(), *grad_cell.stride()),
          tensors=(grad_h, grad_cell, new_cell, gates, d_old_cell, d_gates))
    return d_old_cell, d_gates


def pointwise_backward(grad_h, grad_cell, new_cell, gates):
    """(d_old_cell, d_gates): the cell's one backward pass after its
    product, for every path. While autograd records the backward
    (create_graph=True, torch.func) it runs in torch ops, which autograd
    can differentiate again; otherwise in C (through its operator under a
    tracer). None counts as zeros."""
    if derivatives.in_torch_ops(grad_h, grad_cell):
        return derivatives.backward_pass(grad_h, grad_cell, new_cell, gates)
    arguments = (or_zeros(grad_h, new_cell), or_zeros(grad_cell, new_cell), new_cell, gates)
    if op.use_operator(*arguments):
        return backward_pass.operator(*arguments)
    return backward_pass.run(*arguments)


def _save_gates_and_new_cell(ctx, inputs, output):
    gates, _ = inputs
    _, new_cell = output
    ctx.save_for_backward(gates, new_cell)


def _forward_pass_backward(ctx, grad_h, grad_cell):
    gates, new_cell = ctx.saved_tensors
    d_old_cell, d_gates = pointwise_backward(grad_h, grad_cell, new_cell, gates)
    return d_gates, d_old_cell


pointwise = op.Op(forward_pass, _forward_pass_backward, _save_gates_and_new_cell)


def _backward_pass_backward(ctx, grad_d_old_cell, grad_d_gates):
    """backward_pass's own derivatives: autograd's, of the same pass in torch ops."""
    return derivatives.recorded_grads(derivatives.backward_pass, ctx.saved_tensors,
                                      ctx.needs_input_grad, (grad_d_old_cell, grad_d_gates))


op.Op(backward_pass, _backward_pass_backward,
      lambda ctx, inputs, output: ctx.save_for_backward(*inputs))


# The step passes: the whole cell in lltm_ffi's own kernels (CUDA) -------------

def _strides(gradient):
    """The (step, row, column) strides of an output gradient as C reads them:
    zeros for None (zeros), a step stride of 0 for one step's (row, column)."""
    if gradient is None:
        return (0, 0, 0)
    return (0,) * (3 - gradient.dim()) + gradient.stride()


@op.c_pass("step_forward", check=check_arguments, devices=("cuda",))
def step_forward(c, input: op.Tensor(dims=2), weights: op.Tensor(dims=2),
                 bias: op.Tensor(dims=(1, 2)), old_h: op.Tensor(dims=2),
                 old_cell: op.Tensor(dims=2)) -> tuple[Tensor, Tensor, Tensor]:
    """(new_h, new_cell, gates) of one step: the gate product with the cell
    as its epilogue, one launch (CUDA only)."""
    batch_size, input_features = input.shape
    new_h, new_cell = torch.empty_like(old_h), torch.empty_like(old_h)
    gates = old_h.new_empty(batch_size, 3 * old_h.shape[1])
    if gates.numel():
        c(sizes=(batch_size, input_features, old_h.shape[1]),
          tensors=(input, weights, bias, old_h, old_cell, new_h, new_cell, gates))
    return new_h, new_cell, gates


def _check_step_backward(function, input, weights, bias, old_h, new_cell, gates, grad_h,
                         grad_cell):
    check_arguments(function, input, weights, bias, old_h, new_cell)
    _check_backward_pass(function, grad_h, grad_cell, new_cell, gates)


@op.c_pass("step_backward", check=_check_step_backward, devices=("cuda",))
def step_backward(c, input: op.Tensor(dims=2), weights: op.Tensor(dims=2),
                  bias: op.Tensor(dims=(1, 2)), old_h: op.Tensor(dims=2),
                  new_cell: op.Tensor(dims=2), gates: op.Tensor(dims=2),
                  grad_h: op.Tensor(dims=2, strided=True), grad_cell: op.Tensor(dims=2, strided=True),
                  *, wanted=(True,) * 5) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(d_input, d_weights, d_bias, d_old_h, d_old_cell) of one step from what
    step_forward returned, each None unless `wanted` (five booleans) says so:
    the cell's backward pass, then one product for the weights and the bias
    and, where wanted, one for old_h and the input (CUDA only)."""
    # With no element to compute, every gradient is zeros (or empty); C
    # writes d_bias as 3 * state consecutive elements, as empty_like lays
    # out any bias.
    new = torch.empty_like if gates.numel() else torch.zeros_like
    gradients = tuple(new(tensor) if want else None for want, tensor in
                      zip(wanted, (input, weights, bias, old_h, old_h)))
    if gates.numel():
        c(sizes=(*input.shape, old_h.shape[1], *_strides(grad_h), *_strides(grad_cell)),
          tensors=(input, weights, old_h, new_cell, gates, grad_h, grad_cell,
                   torch.empty_like(gates), *gradients))
    return gradients


def uses_step_kernels(batch_size, input_features, state_size, dtype, device=None,
                      function="lltm"):
    """True where a call of the cell on `device` (a CUDA device where None)
    is one step in lltm_ffi's own kernels (step_forward) rather than torch's
    products around the fused pointwise pass: as the plan (src/plan.c) or
    LLTM_PATH says; ValueError naming `function` where LLTM_PATH forces
    cell-steps on a call they cannot take."""
    return plan.cell_path(function, dtype, device or _CUDA, batch_size, input_features,
                          state_size) == "cell-steps"


_CUDA = torch.device("cuda")


# The differentiable cell -------------------------------------------------------

def gate_product(X, weights, bias):
    """The pre-activation gates, X weights^T + bias, in torch. The weights go
    in contiguous (a copy only where they are not): torch's 16-bit products
    on the CPU round differently for strided or transposed weights, and
    every layout gets a dense one's results."""
    return torch.nn.functional.linear(X, weights.contiguous(), bias)


def _argument_gradients(needs_input_grad, d_old_cell, d_gates, d_X, X, weights, bias_shape):
    """The five arguments' gradients (None where not needed) from d_old_cell,
    d_gates and any gradient reaching X directly (d_X); None counts as zeros."""
    needs_input, needs_weights, needs_bias, needs_old_h, needs_old_cell = needs_input_grad
    d_input = d_weights = d_bias = d_old_h = None
    if (needs_input or needs_old_h) and (d_gates is not None or d_X is not None):
        # The weights contiguous, as in gate_product.
        d_X = _sum(None if d_gates is None else d_gates.mm(weights.contiguous()), d_X)
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


class LLTMFunction(torch.autograd.Function):
    """The LLTM cell: (input, weights, bias, old_h, old_cell) -> (new_h,
    new_cell), the tutorial's Function and lltm()'s for plain tensors.

    The backward pass runs the fused C pass. While autograd records the
    backward (create_graph=True) or the gradients are batched, it runs the same
    math in torch ops (derivatives.py) on the gates recomputed from the
    saved arguments, so that second derivatives are the reference's."""

    @staticmethod
    def forward(ctx, input, weights, bias, old_h, old_cell):
        check_arguments("lltm", input, weights, bias, old_h, old_cell)
        if uses_step_kernels(*input.shape, old_h.shape[1], input.dtype, input.device):
            X = None  # C reads old_h and input where they are
            new_h, new_cell, gates = step_forward.run(input, weights, bias, old_h, old_cell)
        else:
            X = torch.cat((old_h, input), dim=1)
            gates = gate_product(X, weights, bias)
            new_h, new_cell = forward_pass.run(gates, old_cell)
        ctx.save_for_backward(input, weights, bias, old_h, old_cell, X, gates, new_cell)
        return new_h, new_cell

    @staticmethod
    def backward(ctx, grad_h, grad_cell):
        input, weights, bias, old_h, old_cell, X, gates, new_cell = ctx.saved_tensors
        if derivatives.in_torch_ops(grad_h, grad_cell):
            # X, the gates and new_cell as functions of the arguments, so that
            # the recorded backward reaches their history.
            X = torch.cat((old_h, input), dim=1)
            gates = gate_product(X, weights, bias)
            _, new_cell = derivatives.forward_pass(gates, old_cell)
        elif X is None:
            return step_backward.run(input, weights, bias, old_h, new_cell, gates, grad_h,
                                     grad_cell, wanted=ctx.needs_input_grad)
        d_old_cell, d_gates = pointwise_backward(grad_h, grad_cell, new_cell, gates)
        return _argument_gradients(ctx.needs_input_grad, d_old_cell, d_gates, None, X, weights,
                                   bias.shape)


class _TransformableCell(torch.autograd.Function):
    """The cell for torch.func's transforms and forward mode: LLTMFunction
    with X = [old_h, input] and the pre-activation gates also outputs, so that
    the backward pass, the forward-mode and the vmap rules find them as
    torch.func requires (lltm() returns the first two)."""

    @staticmethod
    def forward(input, weights, bias, old_h, old_cell):
        check_arguments("lltm", input, weights, bias, old_h, old_cell)
        X = torch.cat((old_h, input), dim=1)
        gates = gate_product(X, weights, bias)
        new_h, new_cell = forward_pass.run(gates, old_cell)
        return new_h, new_cell, X, gates

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, weights, bias, _, _ = inputs
        _, new_cell, X, gates = output
        # The backward pass recomputes the gate activations from `gates`.
        ctx.save_for_backward(X, weights, gates, new_cell)
        if _torch_internals.forward_ad_active():  # forward mode may call jvp
            ctx.save_for_forward(X, weights, gates, new_cell)
        ctx.bias_shape = bias.shape
        # X's and gates' gradients are None unless someone used them.
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, grad_h, grad_cell, grad_X, grad_gates):
        X, weights, gates, new_cell = ctx.saved_tensors
        d_old_cell = d_gates = None
        if grad_h is not None or grad_cell is not None:
            d_old_cell, d_gates = pointwise_backward(grad_h, grad_cell, new_cell, gates)
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


_apply_plain = _torch_internals.plain_apply(LLTMFunction)


def _batch_first(tensor, dim, batch_size):
    """`tensor` with its vmapped dimension `dim` first (expanded where None)."""
    if dim is None:
        return tensor.expand(batch_size, *tensor.shape)
    return tensor.movedim(dim, 0)


def _traced_lltm(input, weights, bias, old_h, old_cell):
    """The cell through the registered operator, for torch.compile, tracers
    and subclasses. Inside torch.func's transforms (torch.compile of
    torch.func.grad, say) the pointwise pass runs in torch ops instead: the
    operators' autograd does not support those transforms."""
    X = torch.cat((old_h, input), dim=1)
    gates = gate_product(X, weights, bias)
    if _torch_internals.functorch_transforms_active():
        return derivatives.forward_pass(gates, old_cell)
    return forward_pass.operator(gates, old_cell)


def lltm(input, weights, bias, old_h, old_cell):
    """One step of the LLTM cell; returns (new_h, new_cell), differentiable.

    input (batch, input_features); weights (3 * state_size, state_size +
    input_features), its columns ordered [old_h, input]; bias (3 * state_size)
    or (1, 3 * state_size); old_h and old_cell (batch, state_size). All of one
    dtype (float32, float64, float16 or bfloat16, as the C passes take it on
    the device), all on one CPU or CUDA device; the results have that dtype.
    Under torch.autocast the floating-point arguments (but float64 ones) are
    cast to the autocast dtype and the whole cell runs in it, results too.
    """
    if op.plain_eager(input, weights, bias, old_h, old_cell):
        return _apply_plain(input, weights, bias, old_h, old_cell)
    autocast = op.autocast_dtype(input)
    if autocast is not None:
        with torch.autocast(input.device.type, enabled=False):
            return lltm(*op.autocast_cast(autocast, input, weights, bias, old_h, old_cell))
    if op.use_operator(input, weights, bias, old_h, old_cell):
        check_arguments("lltm", input, weights, bias, old_h, old_cell)
        return _traced_lltm(input, weights, bias, old_h, old_cell)
    if (_torch_internals.functorch_transforms_active()
            or _torch_internals.forward_ad_active()):
        new_h, new_cell, _, _ = _TransformableCell.apply(input, weights, bias, old_h, old_cell)
        return new_h, new_cell
    return LLTMFunction.apply(input, weights, bias, old_h, old_cell)
