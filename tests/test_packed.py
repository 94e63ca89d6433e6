"""Packed sequences: LLTMSequence on a PackedSequence (sorted or not)
against the tutorial's cell looped over each sequence alone, on every
layer and direction count and each GPU path; lltm_sequence and lltm_layers
on PackedSequences and on packed rows with their batch_sizes; the packed
operators (opcheck, gradcheck, torch.compile); and the refusals."""

import itertools

import pytest
import torch
from torch.library import opcheck
from torch.nn.utils.rnn import PackedSequence, pack_sequence, pad_packed_sequence

import lltm_ffi
from conftest import raises_with
from layers_reference import (assert_same_results, packed, parameters_of, random_sequences,
                              random_state, reference_layers)
from lltm_ffi.testing import assert_close_to_reference

TOLERANCES = {torch.float32: 1e-4, torch.float64: 1e-10}
# Lengths 1 and the longest (6) among them, some repeated, not in order.
LENGTHS = [4, 6, 1, 6, 3]


def unpacked(output, lengths):
    """Each sequence's rows of a PackedSequence, in the batch's order."""
    padded, _ = pad_packed_sequence(output)
    return [padded[:length, index] for index, length in enumerate(lengths)]


def packed_results(module, sequences, h0, c0, grads, enforce_sorted):
    """Each sequence's output, h_n and c_n of `module` on the packed
    sequences, and the gradients of every sequence, h0, c0 and parameter of
    the sum of each result times its gradient in `grads` (a list of each
    sequence's output gradient, then h_n's and c_n's)."""
    leaves = [tensor.detach().clone().requires_grad_(True) for tensor in (*sequences, h0, c0)]
    output, (h_n, c_n) = module(packed(leaves[:-2], enforce_sorted), (leaves[-2], leaves[-1]))
    assert isinstance(output, PackedSequence)
    outputs = unpacked(output, [len(sequence) for sequence in sequences])
    return _gradients(module, leaves, outputs, h_n, c_n, grads)


def reference_results(module, sequences, h0, c0, grads):
    reference = lltm_ffi.LLTMSequence(module.input_features, module.state_size,
                                      module.num_layers, bias=module.bias,
                                      bidirectional=module.bidirectional, dtype=torch.float64)
    reference.load_state_dict({name: value.detach().cpu().double()
                               for name, value in module.state_dict().items()})
    leaves = [tensor.detach().cpu().double().requires_grad_(True)
              for tensor in (*sequences, h0, c0)]
    outputs, h_n, c_n = reference_layers(reference, leaves[:-2], leaves[-2], leaves[-1])
    return _gradients(reference, leaves, outputs, h_n, c_n,
                      [grad.cpu().double() for grad in grads])


def _gradients(module, leaves, outputs, h_n, c_n, grads):
    results = [*outputs, h_n, c_n]
    loss = sum((result * grad).sum() for result, grad in zip(results, grads))
    gradients = torch.autograd.grad(loss, leaves + list(module.parameters()))
    return [result.detach().cpu().double() for result in results] + [
        gradient.cpu().double() for gradient in gradients]


def names(module, count):
    return ([f"output {index}" for index in range(count)] + ["h_n", "c_n"]
            + [f"d_sequence {index}" for index in range(count)] + ["d_h0", "d_c0"]
            + [f"d_{name}" for name, _ in module.named_parameters()])


def assert_agrees(module, lengths, generator, tolerance, enforce_sorted=False):
    weights = module.weights_l0
    sequences = random_sequences(lengths, module.input_features, generator, weights.dtype,
                                 weights.device)
    h0, c0 = random_state(module, len(lengths), generator)
    grads = [torch.randn(length, module.num_directions * module.state_size,
                         generator=generator, dtype=weights.dtype).to(weights.device)
             for length in lengths]
    grads += random_state(module, len(lengths), generator)
    got = packed_results(module, sequences, h0, c0, grads, enforce_sorted)
    expected = reference_results(module, sequences, h0, c0, grads)
    assert_close_to_reference(got, expected, names(module, len(lengths)), tolerance)


CASES = list(itertools.product((1, 2, 3), (False, True), (True, False)))


def case_id(case):
    layers, bidirectional, enforce_sorted = case
    return (f"{layers}-layer{'-bidirectional' if bidirectional else ''}"
            f"-{'sorted' if enforce_sorted else 'unsorted'}")


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_agrees_with_the_reference_cell_on_each_sequence(case, device, generator):
    layers, bidirectional, enforce_sorted = case
    module = lltm_ffi.LLTMSequence(3, 5, num_layers=layers, bidirectional=bidirectional,
                                   device=device, dtype=torch.float64)
    lengths = sorted(LENGTHS, reverse=True) if enforce_sorted else LENGTHS
    assert_agrees(module, lengths, generator, TOLERANCES[torch.float64], enforce_sorted)


# The GPU's paths for packed steps: cuBLAS's products, and with
# LLTM_CUBLAS=0 the step-by-step kernels, on a small batch and on a batch of
# 40 with lengths spread over 1 to 9 (past the kernels' tiles); a batch of 50
# of every length from 1 to 50, whose steps each start a run of old states
# of their own (the backward gathers them for the weights' gradient, 48
# runs a launch); sequences all as long are dense steps, which the
# persistent kernels (the cluster kernels on compute capability 9.0 and
# newer) take up to their batch x state, cuBLAS's products past it.
GPU_CASES = [(LENGTHS, 5, "1"), (LENGTHS, 5, "0"),
             ([9 - index % 9 for index in range(40)], 33, "1"),
             ([9 - index % 9 for index in range(40)], 33, "0"),
             ([1 + index * 7 % 50 for index in range(50)], 9, "1"), ([4, 4, 4], 5, "1"),
             ([3] * 132, 130, "1")]


@pytest.mark.parametrize("lengths, state_size, cublas", GPU_CASES,
                         ids=["cublas", "own_kernels", "batch_40_cublas", "batch_40_own_kernels",
                              "every_length_to_50", "dense_steps_persistent",
                              "dense_steps_cublas"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_every_gpu_path_agrees_with_the_reference_cell(lengths, state_size, cublas, dtype,
                                                       cuda_device, generator, monkeypatch):
    monkeypatch.setenv("LLTM_CUBLAS", cublas)
    module = lltm_ffi.LLTMSequence(3, state_size, num_layers=2, bidirectional=True,
                                   device=cuda_device, dtype=dtype)
    assert_agrees(module, lengths, generator, TOLERANCES[dtype])


def test_float32_agrees_with_the_reference_cell(device, generator):
    module = lltm_ffi.LLTMSequence(3, 5, num_layers=2, bidirectional=True, device=device)
    assert_agrees(module, LENGTHS, generator, TOLERANCES[torch.float32])


@pytest.mark.parametrize("lengths", [[1], [1, 1, 1], [6], [5, 5]], ids=str)
def test_edge_lengths(lengths, device, generator):
    module = lltm_ffi.LLTMSequence(3, 5, num_layers=2, bidirectional=True, bias=False,
                                   device=device, dtype=torch.float64)
    assert_agrees(module, lengths, generator, TOLERANCES[torch.float64])


def test_packed_and_padded_dense_runs_agree_where_every_length_is_the_same(device, generator):
    module = lltm_ffi.LLTMSequence(3, 5, num_layers=2, bidirectional=True, device=device,
                                   dtype=torch.float64)
    inputs = torch.randn(4, 3, 3, generator=generator, dtype=torch.float64).to(device)
    dense, dense_state = module(inputs)
    sequences, state = module(packed(list(inputs.unbind(1)), True))
    torch.testing.assert_close(pad_packed_sequence(sequences)[0], dense)
    torch.testing.assert_close(state, dense_state)


# The functions -----------------------------------------------------------------

@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_lltm_sequence_of_a_packed_sequence_and_of_packed_rows(reverse, device, generator):
    module = lltm_ffi.LLTMSequence(3, 5, bidirectional=reverse, device=device,
                                   dtype=torch.float64)
    weights, bias = parameters_of(module)[-1]
    sequences = random_sequences(LENGTHS, 3, generator, device=device)
    state = random_state(module, len(LENGTHS), generator)
    h0, c0 = state[0][-1], state[1][-1]
    packed_input = packed(sequences, False)
    output, (h_n, c_n) = lltm_ffi.lltm_sequence(packed_input, weights, bias, h0, c0,
                                                reverse=reverse)
    assert isinstance(output, PackedSequence)
    assert output.batch_sizes is packed_input.batch_sizes
    assert torch.equal(output.sorted_indices, packed_input.sorted_indices)
    expected, h, c = reference_layers(module, sequences, *state)
    size = module.state_size
    for got, reference in zip(unpacked(output, LENGTHS), expected):
        torch.testing.assert_close(got, reference[:, -size:])
    torch.testing.assert_close((h_n, c_n), (h[-1], c[-1]))
    # The same rows in the packed order, with the state in that order too.
    order = packed_input.sorted_indices
    rows, (h_rows, c_rows) = lltm_ffi.lltm_sequence(
        packed_input.data, weights, bias, h0[order], c0[order],
        batch_sizes=packed_input.batch_sizes, reverse=reverse)
    assert_same_results((rows, (h_rows, c_rows)), (output, (h_n[order], c_n[order])))


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_a_replayed_pass_follows_its_batch_sizes(reverse, cuda_device, generator):
    """The GPU records a pass that comes again as a CUDA graph and replays
    it: two packings of as many rows in as many steps, each run three times
    on the same tensors, give each its own results, forward and backward."""
    state_size, features, batch = 33, 7, 3
    weights = torch.randn(3 * state_size, state_size + features, generator=generator,
                          dtype=torch.float64) / 4
    bias = torch.randn(3 * state_size, generator=generator, dtype=torch.float64)
    rows = torch.randn(9, features, generator=generator, dtype=torch.float64)
    h0, c0 = (torch.randn(batch, state_size, generator=generator, dtype=torch.float64)
              for _ in range(2))
    grad = torch.randn(9, state_size, generator=generator, dtype=torch.float64)
    arguments = [rows, weights, bias, h0, c0]

    def results(device, batch_sizes):
        leaves = [tensor.to(device).requires_grad_(True) for tensor in arguments]
        outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(*leaves, batch_sizes=batch_sizes,
                                                     reverse=reverse)
        loss = (outputs * grad.to(device)).sum() + h_n.sum() + c_n.sum()
        return [tensor.detach().cpu() for tensor in
                (outputs, h_n, c_n, *torch.autograd.grad(loss, leaves))]

    for batch_sizes in ([3, 3, 2, 1], [3, 2, 2, 2], [3, 3, 2, 1]):
        batch_sizes = torch.tensor(batch_sizes)
        expected = results("cpu", batch_sizes)
        for _ in range(3):
            for got, reference in zip(results(cuda_device, batch_sizes), expected):
                torch.testing.assert_close(got, reference, rtol=1e-10, atol=1e-10)


def test_lltm_layers_of_a_packed_sequence_is_the_module(device, generator):
    module = lltm_ffi.LLTMSequence(3, 5, num_layers=2, bidirectional=True, device=device,
                                   dtype=torch.float64)
    sequences = packed(random_sequences(LENGTHS, 3, generator, device=device), False)
    state = random_state(module, len(LENGTHS), generator)
    weights, biases = zip(*parameters_of(module))
    assert_same_results(lltm_ffi.lltm_layers(sequences, weights, biases, *state,
                                             bidirectional=True), module(sequences, state))


def packed_arguments(lengths, device, generator, features=3, state_size=4):
    """(rows, weights, bias, h0, c0, batch_sizes) of sorted sequences of `lengths`."""
    sequences = random_sequences(sorted(lengths, reverse=True), features, generator,
                                 device=device)
    data, batch_sizes, _, _ = pack_sequence(sequences)
    scale = state_size ** -0.5

    def normal(*size, scale=1.0):
        return (torch.randn(*size, generator=generator, dtype=torch.float64) * scale).to(device)

    return (data, normal(3 * state_size, state_size + features, scale=scale),
            normal(3 * state_size, scale=scale), normal(len(lengths), state_size),
            normal(len(lengths), state_size), batch_sizes)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_gradcheck_and_gradgradcheck(reverse, device, generator):
    *tensors, batch_sizes = packed_arguments([3, 1, 2], device, generator)
    leaves = [tensor.requires_grad_(True) for tensor in tensors]

    def sequence(data, weights, bias, h0, c0):
        output, (h_n, c_n) = lltm_ffi.lltm_sequence(data, weights, bias, h0, c0,
                                                    batch_sizes=batch_sizes, reverse=reverse)
        return output, h_n, c_n

    assert torch.autograd.gradcheck(sequence, leaves)
    assert torch.autograd.gradgradcheck(sequence, leaves)


@pytest.mark.parametrize("lengths", [[3, 1, 2], [2, 2]], ids=["packed", "dense_steps"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_operators_pass_opcheck(lengths, reverse, device, generator):
    *tensors, batch_sizes = packed_arguments(lengths, device, generator)
    opcheck(torch.ops.lltm_ffi.packed_forward.default,
            (*[tensor.requires_grad_(True) for tensor in tensors], batch_sizes, reverse))
    data, weights, bias, h0, c0 = (tensor.detach() for tensor in tensors)
    outputs, cells, gates, h_n, c_n = torch.ops.lltm_ffi.packed_forward(
        data, weights, bias, h0, c0, batch_sizes, reverse)
    opcheck(torch.ops.lltm_ffi.packed_backward.default,
            (data, weights, bias, h0, batch_sizes, reverse, outputs, cells, gates,
             torch.randn_like(outputs), None, torch.randn_like(h_n), torch.randn_like(c_n)))


@pytest.mark.slow
def test_compile_matches_eager(device, generator):
    torch._dynamo.reset()
    module = lltm_ffi.LLTMSequence(3, 5, num_layers=2, bidirectional=True, device=device)
    sequences = packed(random_sequences(LENGTHS, 3, generator, torch.float32, device), False)

    def loss(sequences):
        output, (h_n, c_n) = module(sequences)
        return output.data.square().mean() + c_n.sum() + h_n.sin().sum()

    eager = loss(sequences)
    eager_grads = torch.autograd.grad(eager, list(module.parameters()))
    compiled = torch.compile(loss)(sequences)
    compiled_grads = torch.autograd.grad(compiled, list(module.parameters()))
    torch.testing.assert_close(compiled, eager)
    for value, reference in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(value, reference)


# Refusals -----------------------------------------------------------------------

def test_a_packed_sequence_of_another_dtype_is_refused(generator):
    module = lltm_ffi.LLTMSequence(3, 5, dtype=torch.float64)
    sequences = packed(random_sequences(LENGTHS, 3, generator, torch.float32), False)
    with raises_with(TypeError, "LLTMSequence: input is a PackedSequence whose data has dtype "
                                "torch.float32", "torch.float64"):
        module(sequences)
    with raises_with(ValueError, "LLTMSequence: input has 2 features", "input_features=3"):
        module(packed(random_sequences(LENGTHS, 2, generator), False))


def test_a_packed_sequences_state_must_hold_every_sequence(generator):
    module = lltm_ffi.LLTMSequence(3, 5, num_layers=2, dtype=torch.float64)
    sequences = packed(random_sequences(LENGTHS, 3, generator), False)
    state = torch.zeros(2, 4, 5, dtype=torch.float64)
    with raises_with(ValueError, "LLTMSequence: state h0 has shape (2, 4, 5)", "(2, 5, 5)"):
        module(sequences, (state, state))
    weights, bias = parameters_of(module)[0]
    with raises_with(ValueError, "lltm_sequence: h0 has shape (4, 5)",
                     "the PackedSequence holds 5 sequences"):
        lltm_ffi.lltm_sequence(sequences, weights, bias, state[0], state[0])
    with raises_with(TypeError, "lltm_sequence: inputs is a PackedSequence",
                     "pass batch_sizes only with packed rows"):
        lltm_ffi.lltm_sequence(sequences, weights, bias, state[0], state[0],
                               batch_sizes=sequences.batch_sizes)


@pytest.mark.parametrize("sizes, exception, fragments", [
    ([2, 3, 1], ValueError, ("batch_sizes starts with 2 but the state holds 3",)),
    ([3, 1, 2], ValueError, ("batch_sizes [3, 1, 2] must not grow",)),
    ([3, 3, 0], ValueError, ("must not grow from step to step nor fall below 1",)),
    ([3, 2, 2], ValueError, ("batch_sizes sums to 7 but inputs has 6 rows",)),
])
def test_batch_sizes_are_checked_naming_them(sizes, exception, fragments, generator):
    data, weights, bias, h0, c0, _ = packed_arguments([3, 2, 1], "cpu", generator)
    with raises_with(exception, "lltm_sequence", *fragments):
        lltm_ffi.lltm_sequence(data, weights, bias, h0, c0, batch_sizes=torch.tensor(sizes))


def test_batch_sizes_must_be_int64_on_the_cpu(cuda_device, generator):
    data, weights, bias, h0, c0, batch_sizes = packed_arguments([3, 2, 1], cuda_device,
                                                                generator)
    with raises_with(ValueError, "lltm_sequence: batch_sizes is on cuda",
                     "it must be on the CPU"):
        lltm_ffi.lltm_sequence(data, weights, bias, h0, c0, batch_sizes=batch_sizes.cuda())


def test_batch_sizes_of_another_dtype_are_refused(generator):
    data, weights, bias, h0, c0, batch_sizes = packed_arguments([3, 2, 1], "cpu", generator)
    with raises_with(TypeError, "lltm_sequence: batch_sizes has dtype torch.int32",
                     "torch.int64"):
        lltm_ffi.lltm_sequence(data, weights, bias, h0, c0, batch_sizes=batch_sizes.int())
    with raises_with(ValueError, "lltm_sequence: inputs must have 2 dimensions"):
        lltm_ffi.lltm_sequence(data[None], weights, bias, h0, c0, batch_sizes=batch_sizes)
