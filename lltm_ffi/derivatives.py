"""The derivatives of the cell's pointwise passes written in torch ops, for
where autograd must differentiate them again or run them forward:

- backward_pass: what the C backward pass computes, used instead of it while
  autograd records a graph of the backward (create_graph=True, torch.func),
  so that second derivatives flow through it;
- forward_tangents: forward-mode AD (torch.func.jvp, jacfwd, forward_ad).

Both recompute the gate activations from the pre-activation gates, as the C
passes do. Elu's derivative at 0 is taken as 1, as in C.
"""

import torch
import torch.nn.functional as F


def _activations(gates):
    gate_input, gate_output, gate_candidate = gates.chunk(3, dim=1)
    return (torch.sigmoid(gate_input), torch.sigmoid(gate_output), F.elu(gate_candidate),
            gate_candidate)


def _elu_derivative(pre_activation):
    return torch.where(pre_activation > 0, torch.ones_like(pre_activation),
                       torch.exp(pre_activation))


def _zeros_where_none(gradient, like):
    return torch.zeros_like(like) if gradient is None else gradient


def backward_pass(grad_h, grad_cell, new_cell, gates):
    """(d_old_cell, d_gates), as lltm_ffi::backward_pass, differentiable;
    a gradient given as None counts as zeros."""
    grad_h, grad_cell = (_zeros_where_none(grad, new_cell) for grad in (grad_h, grad_cell))
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
    gates_tangent = _zeros_where_none(gates_tangent, gates)
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
