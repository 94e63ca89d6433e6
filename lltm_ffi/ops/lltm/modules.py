"""The LLTM as nn.Modules: the cell, with the tutorial's parameters and call,
and whole sequences through stacked, optionally bidirectional layers, called
and constructed like nn.LSTM."""

import math
import warnings

import torch
from torch.nn.utils.rnn import PackedSequence

from ... import op
from .cell import lltm
from .layers import check_dropout, check_parameters, check_state, stacked_layers


def _rename(state_dict, prefix, renames):
    """Moves each state_dict entry prefix + old to prefix + new, where the
    new name is absent: a checkpoint of one module loading into the other."""
    for old, new in renames:
        if prefix + old in state_dict and prefix + new not in state_dict:
            state_dict[prefix + new] = state_dict.pop(prefix + old)


# A one-layer, one-direction LLTMSequence's parameters are LLTM's, renamed.
_CELL_NAMES = (("weights", "weights_l0"), ("bias", "bias_l0"))


class LLTM(torch.nn.Module):
    """rnn = LLTM(input_features, state_size); new_h, new_cell = rnn(X, (h, C))."""

    def __init__(self, input_features, state_size, device=None, dtype=None):
        super().__init__()
        input_features, state_size = op.check_sizes("LLTM", input_features=input_features,
                                                    state_size=state_size)
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

    def _load_from_state_dict(self, state_dict, prefix, *args):
        # A one-layer, one-direction LLTMSequence's checkpoint loads too.
        _rename(state_dict, prefix, [(new, old) for old, new in _CELL_NAMES])
        super()._load_from_state_dict(state_dict, prefix, *args)

    def __prepare_scriptable__(self):
        # torch.jit.script calls this on every module it compiles.
        raise RuntimeError(
            f"lltm_ffi.{type(self).__name__} does not support TorchScript (torch.jit.script): "
            "its passes are called through cffi, which TorchScript cannot compile. Use "
            "torch.compile, or torch.export for a graph to save and load")

    def extra_repr(self):
        return f"input_features={self.input_features}, state_size={self.state_size}"


def _one_of(name, value, alias, alias_value):
    """The value given under `name` or under nn.LSTM's `alias` for it;
    TypeError for neither or both."""
    if value is None and alias_value is None:
        raise TypeError(f"LLTMSequence: missing its argument {name} (or nn.LSTM's name for it, "
                        f"{alias}): {name} must be an int, got NoneType")
    if value is not None and alias_value is not None:
        raise TypeError(f"LLTMSequence: got both {name}={value!r} and {alias}={alias_value!r}, "
                        f"two names of one argument; give one")
    return value if value is not None else alias_value


class LLTMSequence(torch.nn.Module):
    """The cell over whole sequences, in stacked layers, each in one or two
    directions, constructed and called like nn.LSTM:

        rnn = LLTMSequence(input_features, state_size, num_layers=1, bias=True,
                           batch_first=False, dropout=0.0, bidirectional=False)
        output, (h_n, c_n) = rnn(input, state=None)

    The first seven arguments are nn.LSTM's, in its order; input_size= and
    hidden_size= are accepted for input_features and state_size, and
    proj_size=0 (the LLTM has no projection). input (steps, batch,
    input_features), (batch, steps, input_features) with batch_first=True,
    (steps, input_features) unbatched, or a PackedSequence (sorted or not);
    output (steps, batch, D * state_size) likewise (D = 2 where
    bidirectional), or a PackedSequence. state (nn.LSTM's hx, a keyword
    too): the pair (h0, c0), each (num_layers * D, batch, state_size)
    ((num_layers * D, state_size) unbatched) in nn.LSTM's order, layer by
    layer, the forward direction first; or h0 alone, c0 then zeros (the
    state nn.GRU takes); None in either place, or for the whole, is zeros.
    h_n and c_n as h0 and c0: each sequence's state after its own last
    element (the reverse direction's: after its first); always the pair,
    as nn.LSTM returns it. dropout: the probability of zeroing each output
    of every layer but the last, in training mode only.

    Parameters: weights_l{k} (3 * state_size, state_size + F_k), rows input
    gate, output gate, candidate cell, columns [h, x] (the parts nn.LSTM
    keeps apart as weight_hh_l{k} and weight_ih_l{k}), F_0 = input_features
    and F_k = D * state_size above, and bias_l{k} (3 * state_size,), none
    where bias=False; the reverse direction's weights_l{k}_reverse and
    bias_l{k}_reverse. all_weights lists them as nn.LSTM's does. A
    one-layer, one-direction module loads an LLTM's state_dict, and LLTM
    its. nn.LSTM's checkpoints do not convert: its cell has four gates."""

    # nn.LSTM's attribute: the LLTM's hidden state has no projection.
    proj_size = 0

    def __init__(self, input_features=None, state_size=None, num_layers=1, bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, device=None, dtype=None, *,
                 input_size=None, hidden_size=None, proj_size=0):
        super().__init__()
        input_features = _one_of("input_features", input_features, "input_size", input_size)
        state_size = _one_of("state_size", state_size, "hidden_size", hidden_size)
        if proj_size != 0:
            raise ValueError(f"LLTMSequence: proj_size must be 0, got {proj_size!r}: the LLTM has "
                             "no projection of its hidden state")
        input_features, state_size, num_layers = op.check_sizes(
            "LLTMSequence", input_features=input_features, state_size=state_size,
            num_layers=num_layers)
        check_dropout("LLTMSequence", dropout)
        if dropout > 0 and num_layers == 1:
            warnings.warn("LLTMSequence: dropout applies to the outputs of every layer but the "
                          f"last, so it needs num_layers > 1; got dropout={dropout} and "
                          "num_layers=1", stacklevel=2)
        self.input_features = input_features
        self.state_size = state_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        directions = 2 if bidirectional else 1
        self._weight_names, self._bias_names = [], []
        for layer in range(num_layers):
            features = input_features if layer == 0 else directions * state_size
            for suffix in ("", "_reverse")[:directions]:
                name = f"l{layer}{suffix}"
                self.register_parameter(f"weights_{name}", torch.nn.Parameter(torch.empty(
                    3 * state_size, state_size + features, device=device, dtype=dtype)))
                self._weight_names.append(f"weights_{name}")
                if bias:
                    self.register_parameter(f"bias_{name}", torch.nn.Parameter(
                        torch.empty(3 * state_size, device=device, dtype=dtype)))
                    self._bias_names.append(f"bias_{name}")
        self.reset_parameters()

    reset_parameters = LLTM.reset_parameters
    __prepare_scriptable__ = LLTM.__prepare_scriptable__

    @property
    def num_directions(self):
        return 2 if self.bidirectional else 1

    # nn.LSTM's names for the sizes.
    @property
    def input_size(self):
        return self.input_features

    @property
    def hidden_size(self):
        return self.state_size

    @property
    def all_weights(self):
        """nn.LSTM's all_weights: for each layer and direction, in nn.LSTM's
        order, the list of its parameters, [weights] or [weights, bias]."""
        biases = self._bias_names or [None] * len(self._weight_names)
        return [[getattr(self, name) for name in names if name is not None]
                for names in zip(self._weight_names, biases)]

    def flatten_parameters(self):
        """Does nothing, and is there for the scripts that call nn.LSTM's
        (after .to(), or under DataParallel): lltm_ffi's passes read each
        parameter in place, so there is no single buffer to gather them in."""

    def _check_input(self, input):
        """TypeError or ValueError naming input for what the layers cannot
        take, before anything reaches C."""
        packed = isinstance(input, PackedSequence)
        data = input.data if packed else input
        what = "input is a PackedSequence whose data" if packed else "input"
        op.check_tensor("LLTMSequence", "input" if not packed else "input.data", data)
        weights = self.weights_l0
        # Under autocast, as nn.GRU, the layers cast both to the autocast dtype.
        if data.dtype != weights.dtype and op.autocast_dtype(data) is None:
            raise TypeError(f"LLTMSequence: {what} has dtype {data.dtype} but the module's "
                            f"parameters have {weights.dtype}; convert one to the other "
                            "(module.to(dtype))")
        if data.device != weights.device:
            raise ValueError(f"LLTMSequence: {what} is on {data.device} but the module's "
                             f"parameters are on {weights.device}")
        if not packed and data.dim() not in (2, 3):
            raise ValueError(f"LLTMSequence: input must have 3 dimensions ((steps, batch, "
                             f"features), or (batch, steps, features) with batch_first) or 2 "
                             f"(unbatched), got shape {tuple(data.shape)}")
        if data.shape[-1] != self.input_features:
            raise ValueError(f"LLTMSequence: input has {data.shape[-1]} features (its last "
                             f"dimension, shape {tuple(data.shape)}) but the module was built "
                             f"for input_features={self.input_features}")

    def forward(self, input, state=None, *, hx=None):
        if hx is not None:
            if state is not None:
                raise TypeError("LLTMSequence: got both state and hx, two names of the initial "
                                "state; give one")
            state = hx
        self._check_input(input)
        packed = isinstance(input, PackedSequence)
        unbatched = not packed and input.dim() == 2
        if unbatched:
            input = input.unsqueeze(1)
        elif self.batch_first and not packed:
            input = input.transpose(0, 1)
        batch = int(input.batch_sizes[0]) if packed else input.shape[1]
        layers = self.num_layers * self.num_directions
        state = self._checked_state(state, layers, batch, unbatched)
        weights = [self._parameter(name) for name in self._weight_names]
        biases = ([self._parameter(name) for name in self._bias_names] if self._bias_names
                  else [None] * len(weights))
        # A parameter replaced by one of another shape is refused here, named.
        check_parameters("LLTMSequence", weights, biases, self.input_features,
                         self.num_directions)
        output, (h_n, c_n) = stacked_layers(input, weights, biases, *state, self.bidirectional,
                                            self.dropout, self.training)
        if unbatched:
            return output.squeeze(1), (h_n.squeeze(1), c_n.squeeze(1))
        if self.batch_first and not packed:
            output = output.transpose(0, 1)
        return output, (h_n, c_n)

    def _parameter(self, name):
        """The parameter `name`, from nn.Module's dict where it is there (a
        getattr takes nn.Module's slow path), else as getattr finds it (a
        parametrization's, say)."""
        parameter = self._parameters.get(name)
        return getattr(self, name) if parameter is None else parameter

    def _checked_state(self, state, layers, batch, unbatched):
        """(h0, c0) as the layers take them, from the pair (h0, c0), a lone h0
        or None (None in the pair: zeros), refused naming the one that does
        not fit the module and the input."""
        if state is None:
            zeros = self.weights_l0.new_zeros(layers, batch, self.state_size)
            return zeros, zeros
        if isinstance(state, torch.Tensor):
            state = (state, None)
        if not isinstance(state, (tuple, list)) or len(state) != 2:
            what = (f"a {type(state).__name__} of {len(state)}"
                    if isinstance(state, (tuple, list)) else type(state).__name__)
            raise TypeError(f"LLTMSequence: state must be a pair (h0, c0), a lone h0 tensor or "
                            f"None, got {what}")
        checked = []
        for name, tensor in zip(("h0", "c0"), state):
            if tensor is None:
                checked.append(None)
                continue
            op.check_tensor("LLTMSequence", f"state {name}", tensor)
            if unbatched and tensor.dim() == 2:
                tensor = tensor.unsqueeze(1)
            elif unbatched:
                raise ValueError(f"LLTMSequence: state {name} has shape {tuple(tensor.shape)}; "
                                 f"for an unbatched input it must be (num_layers * "
                                 f"num_directions, state_size) = ({layers}, {self.state_size})")
            check_state("LLTMSequence", f"state {name}", tensor, layers, batch, self.state_size)
            weights = self.weights_l0
            if tensor.device != weights.device or (tensor.dtype != weights.dtype
                                                   and op.autocast_dtype(tensor) is None):
                raise TypeError(f"LLTMSequence: state {name} has dtype {tensor.dtype} on "
                                f"{tensor.device} but the module's parameters have "
                                f"{weights.dtype} on {weights.device}")
            checked.append(tensor)
        given = next((tensor for tensor in checked if tensor is not None), None)
        zeros = (self.weights_l0.new_zeros(layers, batch, self.state_size) if given is None
                 else torch.zeros_like(given))
        return [zeros if tensor is None else tensor for tensor in checked]

    def _load_from_state_dict(self, state_dict, prefix, *args):
        if self.num_layers == 1 and not self.bidirectional:
            # An LLTM's checkpoint: the same two parameters.
            _rename(state_dict, prefix, _CELL_NAMES)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def extra_repr(self):
        text = f"input_features={self.input_features}, state_size={self.state_size}"
        defaults = (("num_layers", 1), ("bias", True), ("batch_first", False), ("dropout", 0.0),
                    ("bidirectional", False))
        return text + "".join(f", {name}={getattr(self, name)}" for name, default in defaults
                              if getattr(self, name) != default)
