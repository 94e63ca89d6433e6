"""The LLTM cell's math in torch ops, written once: the gate activations,
the pointwise forward formula (forward_pass, which is also
lltm_ffi.reference.pointwise) and the cell's local partial derivatives
(_partials), from which both derivatives are built:

- backward_pass, the vector-Jacobian product: what the C backward pass
  computes, used instead of it while autograd records a graph of the
  backward (create_graph=True, torch.func), so that second derivatives flow
  through it;
- forward_tangents, the Jacobian-vector product: forward-mode AD
  (torch.func.jvp, jacfwd, forward_ad).

forward_pass and recorded_grads also give the gradients of passes that have
no hand-written derivative (the sequence's loops, backward_pass itself), by
autograd of the same math, when autograd records them.

The derivatives recompute the gate activations from the pre-activation
gates, as the C passes do. Elu's derivative at 0 is taken as 1, as in C.
"""

import torch
import torch.nn.functional as F

from ... import _torch_internals


def in_torch_ops(*gradients):
    """True where a backward given `gradients` must run in torch ops rather
    than C: while autograd records it (create_graph=True), or inside vmap,
    whose batched tensors C cannot read (torch.func's transforms; the
    autograd.grad(is_grads_batched=True) behind jacobian(vectorize=True))."""
    return (torch.is_grad_enabled() or _torch_internals.functorch_transforms_active()
            or any(gradient is not None and _torch_internals.is_legacy_batched(gradient)
                   for gradient in gradients))


def _activations(gates):
    """(input_gate, output_gate, candidate_cell, candidate_pre) from the
    pre-activation gates (batch, 3 * state): sigmoid, sigmoid, elu."""
    input_pre, output_pre, candidate_pre = gates.chunk(3, dim=1)
    return torch.sigmoid(input_pre), torch.sigmoid(output_pre), F.elu(candidate_pre), candidate_pre


def _elu_derivative(pre_activation):
    return torch.where(pre_activation > 0, torch.ones_like(pre_activation),
                       torch.exp(pre_activation))


def or_zeros(gradient, like):
    """`gradient`, or zeros shaped like `like` where it is None (a broadcast
    view: no memory)."""
    return like.new_zeros(()).expand_as(like) if gradient is None else gradient


def forward_pass(gates, old_cell):
    """(new_h, new_cell) from the pre-activation gates and old_cell, as
    lltm_ffi::forward_pass: new_cell = old_cell + candidate_cell * input_gate,
    new_h = tanh(new_cell) * output_gate."""
    input_gate, output_gate, candidate, _ = _activations(gates)
    new_cell = old_cell + candidate * input_gate
    return torch.tanh(new_cell) * output_gate, new_cell


def _partials(gates, new_cell):
    """The cell's local partial derivatives at (gates, new_cell): (d new_cell
    / d input_pre, d new_cell / d candidate_pre, d new_h / d new_cell,
    d new_h / d output_pre), elementwise (batch, state) each. d new_cell /
    d old_cell is 1, and every other partial of an output's element by an
    input's is 0."""
    input_gate, output_gate, candidate, candidate_pre = _activations(gates)
    tanh_cell = torch.tanh(new_cell)
    return (candidate * input_gate * (1 - input_gate),
            input_gate * _elu_derivative(candidate_pre),
            output_gate * (1 - tanh_cell * tanh_cell),
            tanh_cell * output_gate * (1 - output_gate))


def backward_pass(grad_h, grad_cell, new_cell, gates):
    """(d_old_cell, d_gates), as lltm_ffi::backward_pass, differentiable;
    a gradient given as None counts as zeros."""
    grad_h, grad_cell = (or_zeros(grad, new_cell) for grad in (grad_h, grad_cell))
    cell_by_input, cell_by_candidate, h_by_cell, h_by_output = _partials(gates, new_cell)
    d_new_cell = grad_cell + grad_h * h_by_cell
    d_gates = torch.cat((d_new_cell * cell_by_input, grad_h * h_by_output,
                         d_new_cell * cell_by_candidate), dim=1)
    return d_new_cell, d_gates


def forward_tangents(gates, new_cell, gates_tangent, old_cell_tangent):
    """(new_h, new_cell) tangents of the forward pass at (gates, new_cell) in
    the direction (gates_tangent, old_cell_tangent); None counts as zeros."""
    input_tangent, output_tangent, candidate_tangent = or_zeros(gates_tangent,
                                                                gates).chunk(3, dim=1)
    cell_by_input, cell_by_candidate, h_by_cell, h_by_output = _partials(gates, new_cell)
    new_cell_tangent = cell_by_input * input_tangent + cell_by_candidate * candidate_tangent
    if old_cell_tangent is not None:
        new_cell_tangent = new_cell_tangent + old_cell_tangent
    new_h_tangent = h_by_cell * new_cell_tangent + h_by_output * output_tangent
    return new_h_tangent, new_cell_tangent


def recorded_grads(function, arguments, needed, grad_outputs):
    """The gradients of function(*arguments) (torch ops) with respect to the
    arguments flagged in `needed` (None for the others, and for an argument
    given as None, which function takes as left out), for grad_outputs
    (none None). While grad mode is on they are differentiable again,
    through the arguments' own history (create_graph)."""
    create_graph = torch.is_grad_enabled()
    needed = [need and argument is not None for argument, need in zip(arguments, needed)]
    with torch.enable_grad():
        arguments = [argument if create_graph or argument is None
                     else argument.detach().requires_grad_(need)
                     for argument, need in zip(arguments, needed)]
        outputs = function(*arguments)
        sources = [argument for argument, need in zip(arguments, needed) if need]
        grads = iter(torch.autograd.grad(outputs, sources, grad_outputs,
                                         create_graph=create_graph, allow_unused=True,
                                         materialize_grads=True))
    return tuple(next(grads) if need else None for need in needed)
