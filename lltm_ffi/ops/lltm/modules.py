"""The LLTM as nn.Modules: the cell, with the tutorial's parameters and call,
and the whole sequence, called like nn.GRU."""

import math

import torch

from .cell import lltm
from .sequence import lltm_sequence


class LLTM(torch.nn.Module):
    """rnn = LLTM(input_features, state_size); new_h, new_cell = rnn(X, (h, C))."""

    def __init__(self, input_features, state_size, device=None, dtype=None):
        super().__init__()
        self.input_features = input_features
        self.state_size = state_size
        # Rows: input gate, output gate, candidate cell. Columns: [old_h, input].
        self.weights = torch.nn.Parameter(
            torch.empty(3 * state_size, state_size + input_features, device=device, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.empty(3 * state_size, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self):
        """Uniform in +-1/sqrt(state_size), drawn from torch's global generator
        (never reseeded here). State size 0 has no parameter values to draw."""
        if self.state_size == 0:
            return
        bound = 1.0 / math.sqrt(self.state_size)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.uniform_(-bound, bound)

    def forward(self, input, state):
        old_h, old_cell = state
        return lltm(input, self.weights, self.bias, old_h, old_cell)

    def __prepare_scriptable__(self):
        # torch.jit.script calls this on every module it compiles.
        raise RuntimeError(
            f"lltm_ffi.{type(self).__name__} does not support TorchScript (torch.jit.script): "
            "its passes are called through cffi, which TorchScript cannot compile. Use "
            "torch.compile, or torch.export for a graph to save and load")

    def extra_repr(self):
        return f"input_features={self.input_features}, state_size={self.state_size}"


class LLTMSequence(LLTM):
    """The cell over whole sequences, called like nn.GRU:
    outputs, (h_n, c_n) = LLTMSequence(input_features, state_size)(inputs, state=None).

    inputs (steps, batch, input_features), or (batch, steps, input_features)
    with batch_first=True (outputs likewise); state (h0, c0), zeros when None.
    Its parameters are LLTM's, so either loads the other's state_dict."""

    def __init__(self, input_features, state_size, batch_first=False, device=None, dtype=None):
        super().__init__(input_features, state_size, device=device, dtype=dtype)
        self.batch_first = batch_first

    def forward(self, inputs, state=None):
        if self.batch_first:
            inputs = inputs.transpose(0, 1)
        if state is None:
            zeros = inputs.new_zeros(inputs.shape[1], self.state_size)
            state = (zeros, zeros)
        outputs, final_state = lltm_sequence(inputs, self.weights, self.bias, *state)
        return (outputs.transpose(0, 1) if self.batch_first else outputs), final_state

    def extra_repr(self):
        return super().extra_repr() + (", batch_first=True" if self.batch_first else "")
