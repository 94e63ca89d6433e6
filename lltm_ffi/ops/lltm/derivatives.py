"""The cell's pointwise passes and their derivatives written in torch ops,
for where autograd must differentiate them again or run them forward:

- backward_pass: what the C backward pass computes, used instead of it while
  autograd records a graph of the backward (create_graph=True, torch.func),
  so that second derivatives flow through it;
- forward_tangents: forward-mode AD (torch.func.jvp, jacfwd, forward_ad);
- forward_pass and recorded_grads: the gradients of passes that have no
  hand-written derivative (the sequence's loops, backward_pass itself) by
  autograd of the same math in torch ops, when autograd records them.

Both recompute the gate activations from the pre-activation gates, as the C
passes do. Elu's derivative at 0 is taken as 1, as in C.
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
    gate_input, gate_output, gate_candidate = gates.chunk(3, dim=1)
    return (torch.sigmoid(gate_input), torch.sigmoid(gate_output), F.elu(gate_candidate),
            gate_candidate)


def _elu_derivative(pre_activation):
    return torch.where(pre_activation > 0, torch.ones_like(pre_activation),
                       torch.exp(pre_activation))


def or_zeros(gradient, like):
    """`gradient`, or zeros shaped like `like` where it is None (a broadcast
    view: no memory)."""
    return like.new_zeros(()).expand_as(like) if gradient is None else gradient


def forward_pass(gates, old_cell):
    """(new_h, new_cell), as lltm_ffi::forward_pass."""
    input_gate, output_gate, candidate, _ = _activations(gates)
    new_cell = old_cell + candidate * input_gate
    return torch.tanh(new_cell) * output_gate, new_cell


def backward_pass(grad_h, grad_cell, new_cell, gates):
    """(d_old_cell, d_gates), as lltm_ffi::backward_pass, differentiable;
    a gradient given as None counts as zeros."""
    grad_h, grad_cell = (or_zeros(grad, new_cell) for grad in (grad_h, grad_cell))
    input_gate, output_gate, candidate, candidate_pre = _activations(gates)
    tanh_cell = torch.tanh(new_cell)
    d_new_cell = grad_cell + grad_h * output_gate * (1 - tanh_cell * tanh_cell)
    d_gates = torch.cat((d_new_cell * candidate * input_gate * (1 - input_gate),
                         grad_h * tanh_cell * output_gate * (1 - output_gate),
                         d_new_cell * input_gate * _elu_derivative(candidate_pre)), dim=1)
    return d_new_cell, d_gates


def forward_tangents(gates, new_cell, gates_tangent, old_cell_tangent):
    """(new_h, new_cell) tangents of the forward pass at (gates, new_cell) in
    the direction (gates_tangent, old_cell_tangent); None counts as zeros."""
    gates_tangent = or_zeros(gates_tangent, gates)
    input_gate, output_gate, candidate, candidate_pre = _activations(gates)
    input_tangent, output_tangent, candidate_tangent = gates_tangent.chunk(3, dim=1)
    new_cell_tangent = (candidate * input_gate * (1 - input_gate) * input_tangent
                        + input_gate * _elu_derivative(candidate_pre) * candidate_tangent)
    if old_cell_tangent is not None:
        new_cell_tangent = new_cell_tangent + old_cell_tangent
    tanh_cell = torch.tanh(new_cell)
    new_h_tangent = (output_gate * (1 - tanh_cell * tanh_cell) * new_cell_tangent
                     + tanh_cell * output_gate * (1 - output_gate) * output_tangent)
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
