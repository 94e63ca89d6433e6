"""What test_layers.py and test_packed.py compare LLTMSequence and its
functions against: the tutorial's cell (lltm_ffi.reference.lltm) looped
over a module's own parameters, one sequence at a time, each direction
from its own end of the sequence; and the random sequences, states and
gradients the comparisons use."""

import torch
from torch.nn.utils.rnn import PackedSequence, pack_sequence

from lltm_ffi import reference


def parameters_of(module):
    """[(weights, bias or None)] of each layer and direction, nn.LSTM's order."""
    suffixes = ("", "_reverse")[:module.num_directions]
    return [(getattr(module, f"weights_l{layer}{suffix}"),
             getattr(module, f"bias_l{layer}{suffix}", None))
            for layer in range(module.num_layers) for suffix in suffixes]


def reference_layers(module, sequences, h0, c0):
    """(outputs, h_n, c_n) of `module`'s layers over each of `sequences`
    ((length, features) each) alone: outputs a list of (length, D * state),
    h_n and c_n (num_layers * D, batch, state). h0 and c0 (num_layers * D,
    batch, state). No dropout."""
    parameters = parameters_of(module)
    directions = module.num_directions
    outputs, finals_h, finals_c = [], [], []
    for index, sequence in enumerate(sequences):
        layer_input, h_n, c_n = sequence, [], []
        for first in range(0, len(parameters), directions):
            direction_outputs = []
            for direction in range(directions):
                k = first + direction
                weights, bias = parameters[k]
                if bias is None:
                    bias = weights.new_zeros(weights.shape[0])
                h, c = h0[k, index:index + 1], c0[k, index:index + 1]
                steps = range(len(sequence))
                by_step = {}
                for t in reversed(steps) if direction else steps:
                    h, c = reference.lltm(layer_input[t:t + 1], weights, bias, h, c)
                    by_step[t] = h
                direction_outputs.append(torch.cat([by_step[t] for t in steps]))
                h_n.append(h[0])
                c_n.append(c[0])
            layer_input = torch.cat(direction_outputs, dim=1)
        outputs.append(layer_input)
        finals_h.append(torch.stack(h_n))
        finals_c.append(torch.stack(c_n))
    return outputs, torch.stack(finals_h, dim=1), torch.stack(finals_c, dim=1)


def random_sequences(lengths, features, generator, dtype=torch.float64, device="cpu"):
    return [torch.randn(length, features, generator=generator, dtype=dtype).to(device)
            for length in lengths]


def random_state(module, batch, generator):
    """(h0, c0) for `module`, unit-normal values, its dtype and device."""
    weights = module.weights_l0
    shape = (module.num_layers * module.num_directions, batch, module.state_size)
    return tuple(torch.randn(shape, generator=generator, dtype=weights.dtype).to(weights.device)
                 for _ in range(2))


def packed(sequences, enforce_sorted):
    return pack_sequence(sequences, enforce_sorted=enforce_sorted)


def assert_same_results(got, expected):
    """Two (output, (h_n, c_n)) results of the same computation, a
    PackedSequence output by its data: equal to the bit on the CPU; on a GPU
    within torch's tolerance, since a pass replayed from a recorded graph
    may have cuBLAS sum in another order."""
    outputs = [output.data if isinstance(output, PackedSequence) else output
               for output in (got[0], expected[0])]
    exact = {"rtol": 0, "atol": 0} if outputs[0].is_cpu else {}
    torch.testing.assert_close(outputs[0], outputs[1], **exact)
    torch.testing.assert_close(got[1], expected[1], **exact)
