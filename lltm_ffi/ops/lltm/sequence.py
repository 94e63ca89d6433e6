"""The LLTM over whole sequences, the time loop in C: lltm_sequence and its
one pair of passes, packed_forward and packed_backward (packed steps, or
without batch_sizes dense ones, either direction, bias optional, the final
states computed in C). A dense sequence (steps, batch, features) is their
rows (steps * batch, features), one step after another.

Each pass is one C call: the forward pass computes every step's input part
of the gates, then runs the recurrence; the backward pass runs the
recurrence backwards, then forms the gradients of the inputs, the weights
and the bias. Python only checks the arguments and allocates the results.
Packed steps are a PackedSequence's: rows (sum(batch_sizes), features),
step t's batch_sizes[t] rows after the steps before it, each step on its
own rows only (no work on padding); the reverse direction starts each
sequence at its own last element, reading the same rows in place.

As for the cell, eager calls go through the autograd.Function that op.Op
builds, which calls C directly; torch.compile and tracers go through the
registered operators. Under autocast the arguments are cast to the
autocast dtype first, and the call runs in it.

The recurrence's path is the plan's (src/plan.c; plan.py asks it, and
recurrence_path says which a call takes); LLTM_PATH in the environment
forces one. So is the state an eager call's passes run at: where the plan
pads it (to rows of whole 16 bytes, or to whole tiles of 128), each pass
adds zero units in a workspace and cuts its results back, in C
(include/lltm_padding.h; LLTM_PAD=0: never, 1: to whole rows on every
eager call). On a GPU the matrix
products go through cuBLAS (loaded by the C code at run time), with TF32
where torch.backends.cuda.matmul.allow_tf32 allows it for torch's own
products; LLTM_CUBLAS=0 in the environment has lltm_ffi's own kernels do
them all instead. LLTM_CLUSTER=0 keeps the
recurrence off thread-block clusters (compute capability 9.0 and newer:
the cluster kernels, and the persistent kernels' shared staging), on the
paths older GPUs take. On the CPU they go through OpenBLAS where the
scipy-openblas32 wheel is installed (loaded by the C code at run time; a
small recurrence's stay lltm_ffi's own), on as many threads as
torch.get_num_threads() says; LLTM_BLAS=0 has lltm_ffi's own products do
them all, LLTM_BLAS=1 the BLAS every recurrence's too. The options reach C
as one lltm_sequence_options (plan.sequence_options).

A forward whose backward will not run (torch.no_grad, torch.inference_mode,
no argument requiring grad) calls the packed forward pass directly, which
keeps nothing for a backward: no cells on any device, and on the CPU no
gates either; a CUDA pass writes every step's input part of the gates into
a buffer of their size, its workspace, dropped after the call.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd import forward_ad
from torch.nn.utils.rnn import PackedSequence

from ... import _torch_internals, op
from . import cell, derivatives, plan

_ARGUMENT_NAMES = ("inputs", "weights", "bias", "h0", "c0")
_shape = cell._shape


def check_dense(inputs, weights, bias, h0, c0):
    """TypeError or ValueError, naming the argument, for anything the packed
    passes cannot take as dense steps, inputs (steps, batch, features), bias
    None or not (LLTMError for a CUDA device the module was built without).
    The common, valid case costs one expression; the diagnosis runs only
    when it fails."""
    if not cell.arguments_fit(inputs, 3, weights, bias, h0, c0, packed_forward, True):
        cell.diagnose("lltm_sequence", _ARGUMENT_NAMES, 3, (inputs, weights, bias, h0, c0),
                      packed_forward, True)


# Packed steps, either direction ------------------------------------------------

def steps_of(rows, batch_size, batch_sizes):
    """The steps of `rows` packed rows: one per batch size, or without
    batch_sizes (dense steps) rows / batch_size."""
    if batch_sizes is not None:
        return batch_sizes.shape[0]
    return rows // batch_size if batch_size else 0


def check_batch_sizes(function, batch_sizes, rows, batch_size):
    """ValueError naming batch_sizes unless it lays out `rows` rows of
    batch_size sequences as a PackedSequence does: the first size
    batch_size, none larger than the one before nor below 1, their sum rows.
    Read only from a tensor that has values (a fake one has none; C checks
    the same again)."""
    if type(batch_sizes) not in op.PLAIN_TENSOR_TYPES:
        return
    sizes = batch_sizes.tolist()
    if sizes and sizes[0] != batch_size:
        raise ValueError(f"{function}: batch_sizes starts with {sizes[0]} but the state holds "
                         f"{batch_size} sequences; the first step has every sequence")
    if any(size < 1 for size in sizes) or any(later > size for size, later in
                                              zip(sizes, sizes[1:])):
        raise ValueError(f"{function}: batch_sizes {sizes} must not grow from step to step nor "
                         "fall below 1: the sequences sorted longest first, as "
                         "torch.nn.utils.rnn.pack_padded_sequence lays them out")
    if sum(sizes) != rows:
        raise ValueError(f"{function}: batch_sizes sums to {sum(sizes)} but inputs has {rows} "
                         "rows")


def check_packed(function, inputs, weights, bias, h0, c0, batch_sizes):
    """ValueError naming the argument for shapes the packed passes cannot
    take together, once their annotations are met: inputs (rows, features),
    or dense steps (steps, batch, features) without batch_sizes, weights
    (3 * state, state + features), bias (3 * state) or None, h0 and c0
    (batch, state), batch_sizes as check_batch_sizes asks or None (rows a
    whole number of steps of the batch)."""
    rows, batch_size = inputs.shape[0], h0.shape[0]
    cell.check_relations(function, _ARGUMENT_NAMES, (inputs, weights, bias, h0, c0))
    if inputs.dim() == 3:
        if batch_sizes is not None:
            raise ValueError(f"{function}: inputs must have 2 dimensions (rows, features) "
                             f"with batch_sizes, got shape {_shape(inputs)}")
        if inputs.shape[1] != batch_size:
            raise ValueError(f"{function}: inputs has shape {_shape(inputs)}, a batch of "
                             f"{inputs.shape[1]}, but h0 holds {batch_size} sequences")
    elif batch_sizes is not None:
        check_batch_sizes(function, batch_sizes, rows, batch_size)
    elif rows % max(batch_size, 1) or (rows and not batch_size):
        raise ValueError(f"{function}: inputs has {rows} rows, not a whole number of steps of "
                         f"the {batch_size} sequences of h0")


def _check_packed_forward(function, inputs, weights, bias, h0, c0, batch_sizes, reverse):
    check_packed(function, inputs, weights, bias, h0, c0, batch_sizes)


def _pass_plan(inputs, sequence_pass, steps, batch_size, state_size, batch_sizes,
               padded=None):
    """(options, padded_state) of a pass (an lltm_pass): its
    plan.sequence_options and the state it runs at (`padded`, else the
    plan's, plan.sequence_state), once the path LLTM_PATH forces, if any,
    is known to take it there (else its ValueError). A fake tensor, which
    has no device to ask about, runs at its state."""
    options = plan.sequence_options("lltm_sequence")
    if type(inputs) not in op.PLAIN_TENSOR_TYPES:
        return options, state_size
    backward = sequence_pass == plan.PASS_BACKWARD
    packed = batch_sizes is not None
    if padded is None:
        padded = plan.sequence_state(inputs.dtype, inputs.device,
                                     sequence_pass != plan.PASS_FORWARD, steps,
                                     batch_size, state_size, packed, options)
    plan.check_forced_sequence("lltm_sequence", inputs.dtype, inputs.device, backward, steps,
                               batch_size, padded, packed, options)
    return options, padded


def _with_workspace(sequence_pass, sizes, tensors, like):
    """`tensors` of a pass (an lltm_pass) of `sizes` at a padded state,
    with its workspace last: as many elements as C asks for its padded
    copies."""
    present = sum(1 << index for index, tensor in enumerate(tensors) if tensor is not None)
    return (*tensors, like.new_empty(plan.sequence_workspace(sequence_pass, like.dtype, sizes,
                                                             present)))


def _whole_16_bytes(length, tensor):
    """`length` elements of tensor's dtype rounded up to whole 16 bytes."""
    chunk = 16 // tensor.element_size()
    return (length + chunk - 1) // chunk * chunk


def _staging(h0, length, batch_sizes):
    """The persistent kernels' staging ring for a CUDA pass over dense
    steps whose rows (of `length` elements) are not whole 16 bytes: two
    (batch, length rounded up to whole 16 bytes) buffers, which C fills
    (src/cuda/recurrence/lltm_persistent.cuh, StagingRing); else None."""
    rounded = _whole_16_bytes(length, h0)
    if h0.is_cpu or batch_sizes is not None or rounded == length:
        return None
    return h0.new_empty(2 * h0.shape[0] * rounded)


@op.c_pass("packed_forward", check=_check_packed_forward)
def packed_forward(c, inputs: op.Tensor(dims=(2, 3)), weights: op.Tensor(dims=2),
                   bias: op.Tensor(dims=(1, 2), optional=True), h0: op.Tensor(dims=2),
                   c0: op.Tensor(dims=2),
                   batch_sizes: op.Tensor(dims=1, dtype=torch.int64, optional=True, host=True),
                   reverse: bool, *, saved=True,
                   padding=False) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(outputs, cells, gates, h_n, c_n) of one direction over packed steps:
    every step's new_h and new_cell (rows, state) and pre-activation gates
    (rows, 3 * state), and each sequence's final state (batch, state), after
    its own last element (reverse: its first). inputs (rows, features) holds
    the steps' rows as batch_sizes lays them out, or without batch_sizes
    dense steps of the whole batch, given as rows or as (steps, batch,
    features), outputs then (steps, batch, state) (so that a dense call's
    autograd graph holds no views around the pass); h0 and c0 (batch,
    state), in the packed order; bias None: none. saved=False, for a
    forward no backward follows: cells and gates are None, the pass
    storing neither, and outputs, h_n
    and c_n are bit for bit saved=True's. padding=True (plain eager calls;
    the operator's shapes are known before it runs): the pass runs at the
    plan's padded state, where it pads one, and its cells and gates are at
    that state, as the backward pass takes them (rows, padded state),
    (rows, 3 * padded state). No cells are
    allocated on any device (a CUDA pass carries each sequence's cell in
    c_n or in registers). A CUDA pass still gets a (rows, 3 * state) buffer, its
    workspace, dropped after the call: one product puts every step's input
    part of the gates there before the recurrence, which reads each step's
    from it (a product a step instead would cost a launch a step and might
    give other bits). The CPU pass takes a block of steps' at a time in
    memory of its own."""
    batch_size, state_size = h0.shape
    *leading, input_features = inputs.shape
    rows = math.prod(leading)  # C reads dense steps' memory as their rows
    outputs = h0.new_empty(*leading, state_size)
    if not outputs.numel():
        kept = ((h0.new_empty(rows, state_size), h0.new_empty(rows, 3 * state_size)) if saved
                else (None, None))
        return outputs, *kept, h0.clone(), c0.clone()
    h_n, c_n = torch.empty_like(h0), torch.empty_like(c0)
    steps = steps_of(rows, batch_size, batch_sizes)
    sequence_pass = plan.PASS_FORWARD_SAVED if saved else plan.PASS_FORWARD
    options, padded = _pass_plan(inputs, sequence_pass, steps, batch_size, state_size,
                                 batch_sizes, None if padding else state_size)
    own_state = padded == state_size
    cells = gates = None
    if saved:
        cells, gates = h0.new_empty(rows, padded), h0.new_empty(rows, 3 * padded)
    elif own_state and not inputs.is_cpu:
        # A CUDA pass's workspace; a padded pass's is among its padded copies.
        gates = h0.new_empty(rows, 3 * state_size)
    sizes = (rows, steps, batch_size, input_features, state_size, int(reverse), padded)
    if own_state:
        tensors = (inputs, weights, bias, h0, c0, batch_sizes, outputs, cells, gates, h_n, c_n,
                   _staging(h0, state_size, batch_sizes), None)
    else:
        tensors = _with_workspace(sequence_pass, sizes, (inputs, weights, bias, h0, c0,
                                                         batch_sizes, outputs, cells, gates, h_n,
                                                         c_n, None), h0)
    c(sizes=sizes, tensors=tensors, options=options)
    return outputs, cells, gates, h_n, c_n


def _check_packed_backward(function, inputs, weights, bias, h0, batch_sizes, reverse, outputs,
                           cells, gates, grad_outputs, grad_cells, grad_h_n, grad_c_n):
    check_packed(function, inputs, weights, bias, h0, h0, batch_sizes)
    rows, state_size = inputs.shape[0], h0.shape[1]
    # The cells and gates of a padded forward are at its padded state.
    padded = max(_kept_state(cells, state_size), state_size)
    for name, tensor, shape in (("outputs", outputs, (rows, state_size)),
                                ("cells", cells, (rows, padded)),
                                ("gates", gates, (rows, 3 * padded)),
                                ("grad_outputs", grad_outputs, (rows, state_size)),
                                ("grad_cells", grad_cells, (rows, padded)),
                                ("grad_h_n", grad_h_n, h0.shape), ("grad_c_n", grad_c_n, h0.shape)):
        if tensor is not None:
            op.check_shape(function, name, tensor, shape)


def _kept_state(cells, state_size):
    """The state the forward that kept `cells` ran at: their columns (more
    than state_size where it padded the state)."""
    return cells.shape[1] if cells.dim() == 2 else state_size


@op.c_pass("packed_backward", check=_check_packed_backward)
def packed_backward(c, inputs: op.Tensor(dims=2), weights: op.Tensor(dims=2),
                    bias: op.Tensor(dims=(1, 2), optional=True), h0: op.Tensor(dims=2),
                    batch_sizes: op.Tensor(dims=1, dtype=torch.int64, optional=True, host=True),
                    reverse: bool, outputs: op.Tensor(dims=2), cells: op.Tensor(dims=2),
                    gates: op.Tensor(dims=2),
                    grad_outputs: op.Tensor(dims=2, optional=True, strided=True),
                    grad_cells: op.Tensor(dims=2, optional=True, strided=True),
                    grad_h_n: op.Tensor(dims=2, optional=True),
                    grad_c_n: op.Tensor(dims=2, optional=True),
                    *, wanted=(True,) * 5) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients of packed_forward's inputs, weights, bias, h0 and c0
    (of bias only the shape is read; None: none) from those of its outputs,
    cells and final states (None: zeros) and what it read and saved; each
    is None unless `wanted` (five booleans) says so. It runs at the state
    the forward ran at: that of the cells and gates kept."""
    rows, input_features = inputs.shape
    batch_size, state_size = h0.shape
    steps = steps_of(rows, batch_size, batch_sizes)
    computed = cells.numel() > 0
    new = h0.new_empty if computed else h0.new_zeros
    wants_h0, wants_c0 = wanted[3:]
    # Sizes as separate arguments: torch parses a sequence of them a
    # microsecond or two slower, a few percent of a small call's host time.
    d_inputs, d_weights, d_bias = (
        new(*tensor.shape) if want and tensor is not None else None
        for tensor, want in zip((inputs, weights, bias), wanted))
    # Past one step d_h0 and d_c0 carry the gradients between steps: C needs them.
    d_h0, d_c0 = (new(*h0.shape) if want or steps > 1 else None for want in (wants_h0, wants_c0))
    if computed:
        sequence_pass = plan.PASS_BACKWARD
        options, padded = _pass_plan(inputs, sequence_pass, steps, batch_size, state_size,
                                     batch_sizes, _kept_state(cells, state_size))
        own_state = padded == state_size
        sizes = (rows, steps, batch_size, input_features, state_size, int(reverse), padded,
                 *cell._strides(grad_outputs)[1:], *cell._strides(grad_cells)[1:])
        tensors = (inputs, weights, h0, batch_sizes, outputs, cells, gates, grad_outputs,
                   grad_cells, grad_h_n, grad_c_n)
        results = (d_inputs, d_weights, d_bias, d_h0, d_c0)
        if own_state:
            tensors = (*tensors, torch.empty_like(gates), *results,
                       _staging(h0, 3 * state_size, batch_sizes),
                       _previous_states(h0, rows, batch_sizes, d_weights), None)
        else:  # its d_gates, staging and previous states among its padded copies
            tensors = _with_workspace(sequence_pass, sizes,
                                      (*tensors, None, *results, None, None), h0)
        c(sizes=sizes, tensors=tensors,
          options=options)
    return d_inputs, d_weights, d_bias, d_h0 if wants_h0 else None, d_c0 if wants_c0 else None


def _previous_states(h0, rows, batch_sizes, d_weights):
    """A CUDA backward pass's workspace for the weights' gradient over
    packed steps: (rows, state), into which it gathers each row's old state
    for one product (src/cuda/recurrence/products_kernel.cu); else None."""
    if h0.is_cpu or batch_sizes is None or d_weights is None:
        return None
    return h0.new_empty(rows, h0.shape[1])


def packed_in_torch(inputs, weights, bias, h0, c0, batch_sizes, reverse):
    """(outputs, cells, h_n, c_n) as packed_forward computes them, in torch
    ops: what autograd differentiates where it records the backward
    (create_graph=True)."""
    batch_size, state_size = h0.shape
    sizes = ([batch_size] * steps_of(inputs.shape[0], batch_size, None) if batch_sizes is None
             else batch_sizes.tolist())
    if not sizes:
        return inputs.new_empty(0, state_size), inputs.new_empty(0, state_size), h0, c0
    projected = F.linear(inputs, weights[:, state_size:],
                         None if bias is None else bias.reshape(-1))
    hidden_weights = weights[:, :state_size]
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + size)
    outputs, cells, ended = [None] * len(sizes), [None] * len(sizes), []
    h, c = h0[:0], c0[:0]
    for t in reversed(range(len(sizes))) if reverse else range(len(sizes)):
        rows = sizes[t]
        if h.shape[0] > rows:  # sequences that ended at the step before
            ended.append((h[rows:], c[rows:]))
        # Rows the step before lacked start from h0 and c0.
        h, c = (torch.cat((state[:rows], initial[state.shape[0]:rows]))
                for state, initial in ((h, h0), (c, c0)))
        gates = projected[starts[t]:starts[t + 1]] + h.mm(hidden_weights.t())
        h, c = derivatives.forward_pass(gates, c)
        outputs[t], cells[t] = h, c
    ended.append((h, c))
    # Sequences end longest last: their rows, highest first.
    h_n, c_n = (torch.cat(parts[::-1]) for parts in zip(*ended))
    return torch.cat(outputs), torch.cat(cells), h_n, c_n


def _at_state(grad_cells, outputs):
    """The gradient of cells kept at a padded state, cut to the state's
    columns (outputs'): those of the units added change nothing."""
    return None if grad_cells is None else grad_cells[:, :outputs.shape[1]]


def _save_packed(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:6], *output[:3])
    ctx.reverse = inputs[6]
    ctx.set_materialize_grads(False)


def _packed_backward(ctx, grad_outputs, grad_cells, _, grad_h_n, grad_c_n):
    """The one backward of the sequence: torch ops while autograd records it
    (create_graph=True), which it can differentiate again; else the C pass
    (its operator under a tracer). The gradients of batch_sizes and reverse
    are None."""
    inputs, weights, bias, h0, c0, batch_sizes, outputs, cells, gates = ctx.saved_tensors
    if inputs.dim() == 3:  # dense steps, as rows
        d_inputs, *grads = _packed_backward_of_rows(
            ctx, (_rows(inputs), weights, bias, h0, c0, batch_sizes, _rows(outputs), cells,
                  gates), _rows(grad_outputs), grad_cells, grad_h_n, grad_c_n)
        return (None if d_inputs is None else d_inputs.reshape(inputs.shape), *grads)
    return _packed_backward_of_rows(ctx, ctx.saved_tensors, grad_outputs, grad_cells, grad_h_n,
                                    grad_c_n)


def _rows(tensor):
    """A dense steps' tensor (steps, batch, columns) as rows, or None.
    reshape, not flatten: vmap's legacy batched gradients (jacobian's
    vectorize=True) have a rule for it."""
    if tensor is None:
        return None
    steps, batch, columns = tensor.shape
    return tensor.reshape(steps * batch, columns)


def _packed_backward_of_rows(ctx, saved, grad_outputs, grad_cells, grad_h_n, grad_c_n):
    """_packed_backward of `saved` (ctx.saved_tensors' order) whose inputs
    and outputs are rows."""
    inputs, weights, bias, h0, c0, batch_sizes, outputs, cells, gates = saved
    if derivatives.in_torch_ops(grad_outputs, grad_cells, grad_h_n, grad_c_n):
        grads = derivatives.recorded_grads(
            lambda *tensors: packed_in_torch(*tensors, batch_sizes, ctx.reverse),
            (inputs, weights, bias, h0, c0), ctx.needs_input_grad[:5],
            [derivatives.or_zeros(grad, like) for grad, like in
             ((grad_outputs, outputs), (_at_state(grad_cells, outputs), outputs),
              (grad_h_n, h0), (grad_c_n, c0))])
        return (*grads, None, None)
    arguments = (inputs, weights, bias, h0, batch_sizes, ctx.reverse, outputs, cells, gates,
                 grad_outputs, grad_cells, grad_h_n, grad_c_n)
    if op.use_operator(*packed_backward.tensors_of(arguments)):
        return (*packed_backward.operator(*arguments), None, None)
    return (*packed_backward.run(*arguments, wanted=ctx.needs_input_grad[:5]), None, None)


packed = op.Op(packed_forward, _packed_backward, _save_packed,
               result=lambda output: (output[0], output[3], output[4]),
               eager_options={"padding": True})

_UNSUPPORTED_TRANSFORMS = (
    "lltm_ffi.lltm_sequence supports torch.autograd's reverse mode, to any order, but not "
    "forward-mode AD nor torch.func's transforms (grad, vjp, jacrev, jvp, jacfwd, vmap); "
    "lltm_ffi.lltm, one step at a time, supports them all")


def _dual(*tensors):
    """True where forward-mode AD is on and an argument carries a tangent."""
    return _torch_internals.forward_ad_active() and any(
        forward_ad.unpack_dual(tensor).tangent is not None for tensor in tensors)


def _records_backward(*tensors):
    """Whether autograd records a backward of a call on `tensors` (None
    among them left out): grad mode on (no torch.no_grad, no
    torch.inference_mode) and one of them requiring its gradient."""
    return torch.is_grad_enabled() and any(
        tensor is not None and tensor.requires_grad for tensor in tensors)


def _forward_alone(inputs, weights, bias, h0, c0, batch_sizes, reverse):
    """(outputs, (h_n, c_n)) of checked plain arguments whose backward will
    not run: the packed forward pass, which takes dense steps too, called
    directly, with no autograd.Function and nothing kept for a backward
    (packed_forward's saved=False). inputs (steps, batch, features), or the
    packed rows with their batch_sizes."""
    outputs, _, _, h_n, c_n = packed_forward.run(inputs, weights, bias, h0, c0, batch_sizes,
                                                 bool(reverse), saved=False, padding=True)
    return outputs, (h_n, c_n)


def _forward(differentiable, arguments, plain):
    """The forward pass of `differentiable` (packed) on checked
    arguments, by the path the call takes: straight into C for plain eager
    calls; the operator under tracers and subclasses; refused under forward
    mode and torch.func's transforms."""
    if plain:
        return differentiable._apply(*arguments)
    tensors = [argument for argument in arguments if isinstance(argument, torch.Tensor)]
    if _torch_internals.functorch_transforms_active() or _dual(*tensors):
        raise NotImplementedError(_UNSUPPORTED_TRANSFORMS)
    if op.use_operator(*tensors):
        return differentiable.forward.operator(*arguments)
    return differentiable.function.apply(*arguments)


def lltm_sequence(inputs, weights, bias, h0, c0, *, batch_sizes=None, reverse=False):
    """The LLTM cell over a sequence: returns (outputs, (h_n, c_n)).

    inputs (steps, batch, input_features); weights, bias as for lltm_ffi.lltm
    (bias may be None: no bias); h0 and c0 (batch, state_size). outputs
    (steps, batch, state_size) holds every step's new_h; h_n and c_n are the
    last step's state (h0 and c0 when steps is 0). reverse=True runs the
    steps last to first (h_n and c_n are then step 0's state), as the
    reverse direction of a bidirectional nn.GRU does.

    inputs may instead be a torch.nn.utils.rnn.PackedSequence: outputs is
    then one too, with the same batch_sizes and indices; h0 and c0 are in
    the batch's own order (as nn.GRU's state, sorted_indices applied here)
    and so are h_n and c_n, each sequence's state after its own last
    element (reverse: after its first). Or inputs may be the packed rows
    (sum(batch_sizes), input_features) with their batch_sizes (a CPU int64
    tensor, as a PackedSequence's): h0, c0, h_n and c_n are then in the
    packed order, outputs (sum(batch_sizes), state_size). Each step computes
    its own sequences only, in C.

    Differentiable in inputs, weights, bias, h0 and c0 through every
    output. All of one dtype (float32, float64, float16 or bfloat16, as the
    C passes take it on the device); the results have that dtype. Under
    torch.autocast the floating-point arguments (but float64 ones) are cast
    to the autocast dtype and the sequence runs in it, results too.
    """
    if isinstance(inputs, PackedSequence):
        return _packed_sequence(inputs, weights, bias, h0, c0, batch_sizes, reverse)
    tensors = [tensor for tensor in (inputs, weights, bias, h0, c0, batch_sizes)
               if tensor is not None]
    plain = op.plain_eager(*tensors)
    autocast = None if plain else op.autocast_dtype(inputs)
    if autocast is not None:
        with torch.autocast(inputs.device.type, enabled=False):
            return lltm_sequence(*op.autocast_cast(autocast, inputs, weights, bias, h0, c0),
                                 batch_sizes=batch_sizes, reverse=reverse)
    arguments = (inputs, weights, bias, h0, c0, batch_sizes, bool(reverse))
    if batch_sizes is not None:
        packed_forward.check(arguments, "lltm_sequence")
        if inputs.shape[0] == 0:
            return inputs.new_empty(0, h0.shape[1]), (h0, c0)
    else:
        check_dense(inputs, weights, bias, h0, c0)
        if inputs.shape[0] == 0:
            return inputs.new_empty(0, *h0.shape), (h0, c0)
        if plain and _one_step_in_cell(inputs, bias, h0, reverse):
            # One step is a call of the cell, in its step kernels.
            new_h, new_cell = cell.lltm(inputs[0], weights, bias, h0, c0)
            return new_h.unsqueeze(0), (new_h, new_cell)
    return _run(arguments, plain, plain and _records_backward(*tensors))


def _run(arguments, plain, backward):
    """lltm_sequence of checked arguments (inputs, weights, bias, h0, c0,
    batch_sizes, reverse): a plain call whose backward will not run by
    _forward_alone, else by _forward."""
    if plain and not backward:
        return _forward_alone(*arguments)
    outputs, _, _, h_n, c_n = _forward(packed, arguments, plain)
    return outputs, (h_n, c_n)


def _planned_state(inputs, h0, batch_sizes, options, backward):
    """The state size the plan runs a call of these checked arguments at
    with `options` (plan.sequence_state), `backward` where its backward will
    run: h0's, or more where it pads the state."""
    batch_size, state_size = h0.shape
    steps = inputs.shape[0] if batch_sizes is None else batch_sizes.shape[0]
    return plan.sequence_state(inputs.dtype, inputs.device, backward, steps, batch_size,
                               state_size, batch_sizes is not None, options)


def _one_step_in_cell(inputs, bias, h0, reverse):
    """True where a plain eager call of dense steps runs as one call of the
    cell in its step kernels: one forward step with a bias on a GPU, the
    plan not forced (LLTM_PATH unset) and its cell taking the step
    kernels."""
    steps, batch_size, input_features = inputs.shape
    return (steps == 1 and not reverse and bias is not None and inputs.is_cuda
            and plan.forced_path("lltm_sequence") == plan.lib.LLTM_PATH_PLANNED
            and cell.uses_step_kernels(batch_size, input_features, h0.shape[1], inputs.dtype,
                                       inputs.device, "lltm_sequence"))


def recurrence_path(inputs, weights, bias, h0, c0, *, batch_sizes=None, reverse=False,
                    backward=False):
    """The name of the path (a row of the plan's table, docs/ARCHITECTURE.md)
    that lltm_sequence, called eagerly with these arguments, takes for its
    forward pass (backward=True: its backward pass; a forward that keeps
    what its backward needs, where an argument requires grad in grad mode,
    may take another path than a forward alone): cluster, persistent,
    cublas or steps on a GPU, cpu on the CPU, or cell-steps where one dense
    forward step runs as a call of the cell; None where the call computes
    nothing (no steps, rows or state). The arguments are lltm_sequence's
    (a PackedSequence too), checked as it checks them. Under LLTM_PATH the
    path forced, or the ValueError that lltm_sequence would raise."""
    if isinstance(inputs, PackedSequence):
        data, batch_sizes = inputs.data, inputs.batch_sizes
        h0, c0 = (state.index_select(0, inputs.sorted_indices)
                  if inputs.sorted_indices is not None else state for state in (h0, c0))
        return recurrence_path(data, weights, bias, h0, c0, batch_sizes=batch_sizes,
                               reverse=reverse, backward=backward)
    if batch_sizes is not None:
        packed_forward.check((inputs, weights, bias, h0, c0, batch_sizes, bool(reverse)),
                             "lltm_sequence")
        steps = batch_sizes.shape[0]
    else:
        check_dense(inputs, weights, bias, h0, c0)
        steps = inputs.shape[0]
        if _one_step_in_cell(inputs, bias, h0, reverse):
            return "cell-steps"
    batch_size, state_size = h0.shape
    if not steps * batch_size * state_size:
        return None
    options = plan.sequence_options("lltm_sequence")
    # The state a call runs at, and its forward's path, depend on whether
    # its backward will run.
    follows = backward or _records_backward(inputs, weights, bias, h0, c0)
    sequence_pass = (plan.PASS_BACKWARD if backward else
                     plan.PASS_FORWARD_SAVED if follows else plan.PASS_FORWARD)
    return plan.sequence_path("lltm_sequence", inputs.dtype, inputs.device, sequence_pass, steps,
                              batch_size, _planned_state(inputs, h0, batch_sizes, options, follows),
                              batch_sizes is not None, options)


def _in_packed_order(name, state, data, sorted_indices):
    """`state` (batch, state_size) in the batch's order, its rows put in
    the packed order, once checked enough to index."""
    op.check_tensor("lltm_sequence", name, state)
    op.check_matches("lltm_sequence", name, state, "inputs", data, same_dtype=False)
    if state.dim() != 2 or state.shape[0] != sorted_indices.shape[0]:
        raise ValueError(f"lltm_sequence: {name} has shape {_shape(state)} but the "
                         f"PackedSequence holds {sorted_indices.shape[0]} sequences; it must be "
                         f"({sorted_indices.shape[0]}, state_size)")
    return state.index_select(0, sorted_indices)


def _packed_sequence(inputs, weights, bias, h0, c0, batch_sizes, reverse):
    """lltm_sequence of a PackedSequence, its state in the batch's order."""
    if batch_sizes is not None:
        raise TypeError("lltm_sequence: inputs is a PackedSequence, which carries its own "
                        "batch_sizes; pass batch_sizes only with packed rows (a tensor)")
    data, sizes, sorted_indices, unsorted_indices = inputs
    if sorted_indices is not None:
        h0, c0 = (_in_packed_order(name, state, data, sorted_indices)
                  for name, state in (("h0", h0), ("c0", c0)))
    outputs, (h_n, c_n) = lltm_sequence(data, weights, bias, h0, c0, batch_sizes=sizes,
                                        reverse=reverse)
    if unsorted_indices is not None:
        h_n, c_n = h_n.index_select(0, unsorted_indices), c_n.index_select(0, unsorted_indices)
    return PackedSequence(outputs, sizes, sorted_indices, unsorted_indices), (h_n, c_n)
