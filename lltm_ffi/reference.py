"""The LLTM cell in plain PyTorch: the definition every test and benchmark
compares lltm_ffi against."""

import torch
import torch.nn.functional as F


def lltm(input, weights, bias, old_h, old_cell):
    X = torch.cat([old_h, input], dim=1)
    gate_weights = torch.addmm(bias, X, weights.t())
    return pointwise(gate_weights, old_cell)


def pointwise(gate_weights, old_cell):
    """(new_h, new_cell) from the gates' pre-activations: the cell after its
    matrix product, what lltm_ffi's fused passes compute."""
    gates = gate_weights.chunk(3, dim=1)
    input_gate = torch.sigmoid(gates[0])
    output_gate = torch.sigmoid(gates[1])
    candidate_cell = F.elu(gates[2])
    new_cell = old_cell + candidate_cell * input_gate
    new_h = torch.tanh(new_cell) * output_gate
    return new_h, new_cell
