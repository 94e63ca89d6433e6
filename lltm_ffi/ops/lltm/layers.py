"""Stacked and bidirectional LLTM layers: lltm_layers, what LLTMSequence
runs. Each layer and direction is one lltm_sequence (its C passes); the
layers follow one another, and on a GPU the two directions of a layer run
at the same time."""

import numbers

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import PackedSequence

from ... import op
from .sequence import lltm_sequence

# One side stream a GPU, for the reverse directions; made on first use.
_SIDE_STREAMS = {}


def _side_stream(device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(index)
    return _SIDE_STREAMS[index]


def check_dropout(function, dropout):
    """TypeError unless dropout is a number (a bool is none), ValueError
    unless it is from 0 to 1."""
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real):
        raise TypeError(f"{function}: dropout must be a number, the probability of zeroing an "
                        f"element, got {type(dropout).__name__} {dropout!r}")
    if not 0 <= dropout <= 1:
        raise ValueError(f"{function}: dropout must be a number from 0 to 1, the probability of "
                         f"zeroing an element, got {dropout!r}")


def check_parameters(function, weights, biases, input_features, directions):
    """TypeError or ValueError naming the list element (weights[k],
    biases[k]) unless every layer's weights are (3 * state_size, state_size
    + features), features input_features for the first layer and
    directions * state_size above, and every bias (3 * state_size,) or
    (1, 3 * state_size) or None; state_size is weights[0]'s. Returns
    state_size."""
    op.check_tensor(function, "weights[0]", weights[0])
    state_size = weights[0].shape[0] // 3 if weights[0].dim() else 0
    rows = 3 * state_size
    for index, (weight, bias) in enumerate(zip(weights, biases)):
        features = input_features if index < directions else directions * state_size
        # The valid case without naming anything: the names cost a small
        # call more than the checks.
        if (op.takes_tensor(weight) and weight.shape == (rows, state_size + features)
                and (bias is None or (op.takes_tensor(bias)
                                      and bias.shape in ((rows,), (1, rows))))):
            continue
        op.check_tensor(function, f"weights[{index}]", weight)
        op.check_shape(function, f"weights[{index}]", weight, (rows, state_size + features))
        if bias is not None:
            op.check_tensor(function, f"biases[{index}]", bias)
            if tuple(bias.shape) not in ((rows,), (1, rows)):
                raise ValueError(f"{function}: biases[{index}] has shape {tuple(bias.shape)}, "
                                 f"expected ({rows},) or (1, {rows}) for "
                                 f"weights[{index}] of shape {tuple(weight.shape)}")
    return state_size


def check_state(function, name, tensor, layers, batch, state_size):
    """TypeError or ValueError naming `name` unless `tensor` is a tensor of
    shape (layers, batch, state_size) (any batch where batch is None)."""
    op.check_tensor(function, name, tensor)
    shape = tuple(tensor.shape)
    if len(shape) != 3 or (shape[0], shape[2]) != (layers, state_size) or (
            batch is not None and shape[1] != batch):
        expected = f"({layers}, {'batch' if batch is None else batch}, {state_size})"
        raise ValueError(f"{function}: {name} has shape {shape} but must be (num_layers * "
                         f"num_directions, batch, state_size) = {expected}")


class _HandOver(torch.autograd.Function):
    """Views of the reverse direction's arguments, made on the caller's
    stream (see _directions). Its node holds the arguments themselves
    until its backward, which runs on the caller's stream once that stream
    has waited for the reverse direction's backward on the side stream: so
    memory the side stream reads there (the casts under autocast, a lower
    layer's outputs) is freed to the caller's stream only after that read."""

    @staticmethod
    def forward(ctx, *tensors):
        ctx.arguments = tensors
        views = tuple(tensor.view_as(tensor) for tensor in tensors)
        ctx.mark_non_differentiable(*(view for view, needed in zip(views, ctx.needs_input_grad)
                                      if not needed))
        return views

    @staticmethod
    def backward(ctx, *grads):
        ctx.arguments = None
        return grads


def _hand_over(tensors):
    """tensors (None kept) through _HandOver where one requires grad."""
    present = [tensor for tensor in tensors if tensor is not None]
    if not any(tensor.requires_grad for tensor in present):
        return list(tensors)
    views = iter(_HandOver.apply(*present))
    return [None if tensor is None else next(views) for tensor in tensors]


def _directions(inputs, weights, biases, h0, c0, batch_sizes):
    """[(outputs, (h_n, c_n))] of each direction of one layer (forward, then
    reverse where there are two), given the lists of their weights, biases,
    h0 and c0. On a GPU, outside tracers, the reverse one
    runs on a side stream that waits for the current one, which then waits
    for it: both directions at once, each one C call; autograd runs each
    backward on its forward's stream, so they overlap too."""
    def run(direction):
        return lltm_sequence(inputs, weights[direction], biases[direction], h0[direction],
                             c0[direction], batch_sizes=batch_sizes, reverse=direction == 1)

    if len(weights) == 1 or not isinstance(inputs, torch.Tensor):
        return [run(direction) for direction in range(len(weights))]
    inputs = inputs.contiguous()  # one dense copy, where one is needed, for both
    if not inputs.is_cuda or op.use_operator(inputs, *h0, *c0):
        return [run(direction) for direction in range(len(weights))]
    current = torch.cuda.current_stream(inputs.device)
    side = _side_stream(inputs.device)
    # The reverse direction's backward runs on the side stream. It takes its
    # arguments handed over here, before the forward direction's node, so
    # that its gradients reach the parameters (and inputs) through a node of
    # the current stream: their AccumulateGrad nodes, made on this stream,
    # then get gradients from a node of their own stream (torch warns of a
    # mismatch otherwise); and, made first, the hand-over runs last
    # (autograd runs the latest-made of the ready nodes first), once the
    # forward direction's backward is queued, so the two still overlap.
    handed_over = _hand_over((inputs, weights[1], biases[1], h0[1], c0[1]))
    side.wait_stream(current)
    forward = run(0)
    with torch.cuda.stream(side):
        reverse = lltm_sequence(*handed_over, batch_sizes=batch_sizes, reverse=True)
    current.wait_stream(side)
    # Made on the side stream and used on the current one: their memory
    # must not be reused before the current stream is done with them.
    outputs, (h_n, c_n) = reverse
    for tensor in (outputs, h_n, c_n):
        tensor.record_stream(current)
    return [forward, reverse]


def lltm_layers(inputs, weights, biases, h0, c0, *, bidirectional=False, dropout=0.0,
                training=False, batch_sizes=None):
    """Stacked LLTM layers, each in one or two directions, as nn.LSTM
    stacks its own: returns (outputs, (h_n, c_n)).

    weights: num_layers * num_directions tensors in nn.LSTM's order (layer
    0's forward direction, then, where bidirectional, its reverse one, then
    layer 1's, ...), each (3 * state_size, state_size + features), features
    the input's for layer 0 and num_directions * state_size above. biases:
    as many (3 * state_size,) tensors, or None for none. h0 and c0
    (num_layers * num_directions, batch, state_size), in the same order.

    inputs (steps, batch, input_features), a PackedSequence, or packed rows
    with their batch_sizes, as lltm_sequence takes them (a PackedSequence's
    state in the batch's order, packed rows' in the packed order). outputs:
    the last layer's, each step's directions side by side (steps, batch,
    num_directions * state_size), or likewise packed. h_n and c_n: each
    layer's and direction's final states, in h0's order. dropout: where
    training, each layer's outputs but the last's are zeroed with that
    probability and scaled, by F.dropout (torch's generator).

    Differentiable in inputs, every weight and bias, h0 and c0. On a GPU the
    two directions of a layer run at the same time (streams joined); the
    layers follow one another. Under torch.autocast the floating-point
    arguments (but float64 ones) are cast to the autocast dtype once, and
    every layer runs in it, as lltm_sequence does.
    """
    directions = 2 if bidirectional else 1
    weights = list(weights)
    if not weights or len(weights) % directions:
        raise ValueError(f"lltm_layers: weights holds {len(weights)} tensors; it must hold "
                         f"num_layers * {directions} (num_layers >= 1)")
    biases = [None] * len(weights) if biases is None else list(biases)
    if len(biases) != len(weights):
        raise ValueError(f"lltm_layers: biases holds {len(biases)} tensors but weights "
                         f"{len(weights)}; give one a weight, or None for no bias")
    check_dropout("lltm_layers", dropout)
    if not isinstance(inputs, PackedSequence):  # a PackedSequence's data: checked as rows
        if isinstance(inputs, torch.Tensor) and inputs.dim():
            state_size = check_parameters("lltm_layers", weights, biases, inputs.shape[-1],
                                          directions)
        else:  # lltm_sequence refuses it, naming it
            state_size = weights[0].shape[0] // 3
        batch = (inputs.shape[1] if batch_sizes is None and isinstance(inputs, torch.Tensor)
                 and inputs.dim() == 3 else None)
        for name, state in (("h0", h0), ("c0", c0)):
            check_state("lltm_layers", name, state, len(weights), batch, state_size)
    return stacked_layers(inputs, weights, biases, h0, c0, bidirectional, dropout, training,
                          batch_sizes)


def stacked_layers(inputs, weights, biases, h0, c0, bidirectional, dropout, training,
                   batch_sizes=None):
    """lltm_layers of arguments whose layers fit together (weights and
    biases lists, their shapes, h0's and c0's; a PackedSequence's are
    checked here): what LLTMSequence calls once its own checks have passed,
    so that a call checks its module's parameters and state once."""
    if isinstance(inputs, PackedSequence):
        return _packed_layers(inputs, weights, biases, h0, c0, bidirectional, dropout, training,
                              batch_sizes)
    autocast = op.autocast_dtype(inputs)
    if autocast is not None:
        # Once for all layers and both directions, rather than in each
        # lltm_sequence.
        inputs, h0, c0, *parameters = op.autocast_cast(autocast, inputs, h0, c0, *weights,
                                                       *biases)
        with torch.autocast(inputs.device.type, enabled=False):
            return stacked_layers(inputs, parameters[:len(weights)], parameters[len(weights):],
                                  h0, c0, bidirectional, dropout, training, batch_sizes)
    directions = 2 if bidirectional else 1
    layer_input, finals = inputs, []
    for first in range(0, len(weights), directions):
        layer = range(first, first + directions)
        results = _directions(layer_input, weights[first:first + directions],
                              biases[first:first + directions], [h0[k] for k in layer],
                              [c0[k] for k in layer], batch_sizes)
        finals += [final for _, final in results]
        outputs = (results[0][0] if directions == 1
                   else torch.cat([output for output, _ in results], dim=-1))
        if dropout and training and first + directions < len(weights):
            outputs = F.dropout(outputs, dropout, training=True)
        layer_input = outputs
    if len(finals) == 1:
        return layer_input, (finals[0][0].unsqueeze(0), finals[0][1].unsqueeze(0))
    h_n, c_n = (torch.stack(states) for states in zip(*finals))
    return layer_input, (h_n, c_n)


def _packed_layers(inputs, weights, biases, h0, c0, bidirectional, dropout, training,
                   batch_sizes):
    """lltm_layers of a PackedSequence, its state in the batch's order."""
    if batch_sizes is not None:
        raise TypeError("lltm_layers: inputs is a PackedSequence, which carries its own "
                        "batch_sizes; pass batch_sizes only with packed rows (a tensor)")
    data, sizes, sorted_indices, unsorted_indices = inputs
    if sorted_indices is not None:
        op.check_tensor("lltm_layers", "weights[0]", weights[0])
        for name, state in (("h0", h0), ("c0", c0)):
            check_state("lltm_layers", name, state, len(weights), sorted_indices.shape[0],
                        weights[0].shape[0] // 3)
            op.check_matches("lltm_layers", name, state, "inputs", data, same_dtype=False)
        h0, c0 = h0.index_select(1, sorted_indices), c0.index_select(1, sorted_indices)
    outputs, (h_n, c_n) = lltm_layers(data, weights, biases, h0, c0, bidirectional=bidirectional,
                                      dropout=dropout, training=training, batch_sizes=sizes)
    if unsorted_indices is not None:
        h_n, c_n = h_n.index_select(1, unsorted_indices), c_n.index_select(1, unsorted_indices)
    return PackedSequence(outputs, sizes, sorted_indices, unsorted_indices), (h_n, c_n)
