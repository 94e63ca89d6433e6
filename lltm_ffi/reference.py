"""The LLTM cell in plain PyTorch: the definition every test and benchmark
compares lltm_ffi against."""

import torch

from .ops.lltm import derivatives


def lltm(input, weights, bias, old_h, old_cell):
    X = torch.cat([old_h, input], dim=1)
    gate_weights = torch.addmm(bias, X, weights.t())
    return pointwise(gate_weights, old_cell)


def pointwise(gate_weights, old_cell):
    """(new_h, new_cell) from the gates' pre-activations: the cell after its
    matrix product, what lltm_ffi's fused passes compute. The gates (batch,
    3 * state) are the input gate, the output gate and the candidate cell:
    new_cell = old_cell + elu(candidate) * sigmoid(input),
    new_h = tanh(new_cell) * sigmoid(output)."""
    return derivatives.forward_pass(gate_weights, old_cell)
