"""LLTMSequence as nn.GRU's drop-in over dense inputs: stacked and
bidirectional layers against the tutorial's cell looped over the module's
own parameters (outputs, final states and every gradient, on each GPU
path), batch_first and unbatched inputs, bias=False, dropout, gradcheck,
torch.compile, CUDA graphs (float32 and the half dtypes), the two
directions' streams, the parameters' names and state_dicts, and the
refusals. Packed sequences are in test_packed.py."""

import copy
import itertools
import warnings

import pytest
import torch
from torch.nn.utils.rnn import pack_sequence

import lltm_ffi
from builders import slow_stream_inputs
from conftest import raises_with, shape_id
from layers_reference import (assert_same_results, parameters_of, random_sequences, random_state,
                              reference_layers)
from lltm_ffi.ops.lltm import layers
from lltm_ffi.testing import assert_close_to_reference

TOLERANCES = {torch.float32: 1e-4, torch.float64: 1e-10}
NAMES = ("output", "h_n", "c_n", "d_input", "d_h0", "d_c0")
LAYERS = [(layers, bidirectional) for layers, bidirectional in
          itertools.product((1, 2, 3), (False, True))]


def layers_id(case):
    layers, bidirectional = case
    return f"{layers}-layer{'-bidirectional' if bidirectional else ''}"


def module_results(module, inputs, h0, c0, grads):
    """output, h_n, c_n of module(inputs, (h0, c0)) (inputs steps first), and
    the gradients of inputs, h0, c0 and every parameter of the sum of each
    result times its gradient in `grads`."""
    leaves = [tensor.detach().clone().requires_grad_(True) for tensor in (inputs, h0, c0)]
    output, (h_n, c_n) = module(leaves[0], (leaves[1], leaves[2]))
    return _with_gradients(module, leaves, (output, h_n, c_n), grads)


def reference_results(module, inputs, h0, c0, grads):
    """module_results of the reference cell's loop, on the CPU in float64."""
    cpu = [tensor.detach().cpu().double().requires_grad_(True) for tensor in (inputs, h0, c0)]
    reference = _reference_copy(module)
    outputs, h_n, c_n = reference_layers(reference, list(cpu[0].unbind(1)), cpu[1], cpu[2])
    return _with_gradients(reference, cpu, (torch.stack(outputs, dim=1), h_n, c_n),
                           [grad.cpu().double() for grad in grads])


def _reference_copy(module):
    """`module` on the CPU in float64 (its parameters' values, leaves of their own)."""
    copy = lltm_ffi.LLTMSequence(module.input_features, module.state_size, module.num_layers,
                                 bias=module.bias, bidirectional=module.bidirectional,
                                 dtype=torch.float64)
    copy.load_state_dict({name: value.detach().cpu().double()
                          for name, value in module.state_dict().items()})
    return copy


def _with_gradients(module, leaves, results, grads):
    loss = sum((result * grad).sum() for result, grad in zip(results, grads))
    parameters = list(module.parameters())
    gradients = torch.autograd.grad(loss, leaves + parameters)
    return list(results) + [gradient.cpu() for gradient in gradients]


def result_names(module):
    return NAMES + tuple(f"d_{name}" for name, _ in module.named_parameters())


def random_grads(module, shape, generator):
    steps, batch, _ = shape
    directions = module.num_directions
    weights = module.weights_l0
    return [torch.randn(size, generator=generator, dtype=weights.dtype).to(weights.device)
            for size in ((steps, batch, directions * module.state_size),
                         (module.num_layers * directions, batch, module.state_size),
                         (module.num_layers * directions, batch, module.state_size))]


def assert_agrees(module, shape, generator, tolerance):
    """The module against the reference on random inputs of shape (steps,
    batch, features), state and gradients."""
    weights = module.weights_l0
    inputs = torch.randn(shape, generator=generator, dtype=weights.dtype).to(weights.device)
    h0, c0 = random_state(module, shape[1], generator)
    grads = random_grads(module, shape, generator)
    got = module_results(module, inputs, h0, c0, grads)
    expected = reference_results(module, inputs, h0, c0, grads)
    assert_close_to_reference([value.cpu().double() for value in got], expected,
                              result_names(module), tolerance)


def test_parameters_are_named_and_shaped_in_nn_lstm_order():
    module = lltm_ffi.LLTMSequence(4, 6, num_layers=3, bidirectional=True)
    shapes = {name: tuple(parameter.shape) for name, parameter in module.named_parameters()}
    expected = {}
    for layer in range(3):
        features = 4 if layer == 0 else 12
        for suffix in ("", "_reverse"):
            expected[f"weights_l{layer}{suffix}"] = (18, 6 + features)
            expected[f"bias_l{layer}{suffix}"] = (18,)
    assert shapes == expected
    assert list(shapes) == list(expected)  # the order nn.LSTM registers its own
    assert [parameter for parameter, _ in parameters_of(module)] == [
        getattr(module, name) for name in expected if name.startswith("weights")]
    no_bias = lltm_ffi.LLTMSequence(4, 6, num_layers=2, bias=False)
    assert [name for name, _ in no_bias.named_parameters()] == ["weights_l0", "weights_l1"]
    assert not any("bias" in name for name, _ in no_bias.named_buffers())


def test_reset_parameters_draws_within_one_over_sqrt_state_size():
    module = lltm_ffi.LLTMSequence(3, 16, num_layers=2, bidirectional=True)
    for name, parameter in module.named_parameters():
        assert parameter.abs().max() <= 0.25, name
        assert parameter.abs().max() > 0.2, name


def test_repr_names_what_differs_from_the_defaults():
    assert repr(lltm_ffi.LLTMSequence(4, 6)) == "LLTMSequence(input_features=4, state_size=6)"
    text = repr(lltm_ffi.LLTMSequence(4, 6, num_layers=2, bias=False, batch_first=True,
                                      dropout=0.25, bidirectional=True))
    assert text == ("LLTMSequence(input_features=4, state_size=6, num_layers=2, bias=False, "
                    "batch_first=True, dropout=0.25, bidirectional=True)")


@pytest.mark.parametrize("case", LAYERS, ids=layers_id)
def test_agrees_with_the_reference_cell(case, device, generator):
    layers, bidirectional = case
    module = lltm_ffi.LLTMSequence(4, 6, num_layers=layers, bidirectional=bidirectional,
                                   device=device, dtype=torch.float64)
    assert_agrees(module, (5, 3, 4), generator, TOLERANCES[torch.float64])


# Each GPU path of the recurrence: the persistent kernels (small batch x
# state; the cluster kernels instead on compute capability 9.0 and newer),
# cuBLAS's products (past them), and with LLTM_CUBLAS=0 lltm_ffi's
# step-by-step kernels.
GPU_PATHS = [((5, 3, 4), 6, "1"), ((3, 130, 4), 130, "1"), ((3, 130, 4), 130, "0")]


@pytest.mark.parametrize("shape, state_size, cublas", GPU_PATHS,
                         ids=["persistent", "cublas", "own_kernels"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_every_gpu_path_agrees_with_the_reference_cell(shape, state_size, cublas, dtype,
                                                       cuda_device, generator, monkeypatch):
    monkeypatch.setenv("LLTM_CUBLAS", cublas)
    module = lltm_ffi.LLTMSequence(shape[2], state_size, num_layers=2, bidirectional=True,
                                   device=cuda_device, dtype=dtype)
    assert_agrees(module, shape, generator, TOLERANCES[dtype])


def test_float32_agrees_with_the_reference_cell(device, generator):
    module = lltm_ffi.LLTMSequence(4, 6, num_layers=2, bidirectional=True, device=device)
    assert_agrees(module, (5, 3, 4), generator, TOLERANCES[torch.float32])


@pytest.mark.parametrize("case", [(1, False), (2, True)], ids=layers_id)
def test_without_bias(case, device, generator):
    layers, bidirectional = case
    module = lltm_ffi.LLTMSequence(4, 6, num_layers=layers, bias=False,
                                   bidirectional=bidirectional, device=device,
                                   dtype=torch.float64)
    assert_agrees(module, (4, 2, 4), generator, TOLERANCES[torch.float64])


def test_batch_first_and_unbatched_inputs(device, generator):
    module = lltm_ffi.LLTMSequence(4, 6, num_layers=2, bidirectional=True, device=device,
                                   dtype=torch.float64)
    inputs = torch.randn(5, 3, 4, generator=generator, dtype=torch.float64).to(device)
    h0, c0 = random_state(module, 3, generator)
    output, (h_n, c_n) = module(inputs, (h0, c0))
    module.batch_first = True
    first, (h_first, c_first) = module(inputs.transpose(0, 1), (h0, c0))
    torch.testing.assert_close(first, output.transpose(0, 1))
    torch.testing.assert_close((h_first, c_first), (h_n, c_n))
    module.batch_first = False
    for index in range(3):
        single, (h_single, c_single) = module(inputs[:, index], (h0[:, index], c0[:, index]))
        assert single.shape == (5, 12) and h_single.shape == c_single.shape == (4, 6)
        torch.testing.assert_close(single, output[:, index])
        torch.testing.assert_close((h_single, c_single), (h_n[:, index], c_n[:, index]))
    # batch_first changes nothing for an unbatched input, as for nn.GRU.
    module.batch_first = True
    torch.testing.assert_close(module(inputs[:, 0])[0], module(inputs[:, 0])[0])


def test_no_state_means_zeros(device, generator):
    module = lltm_ffi.LLTMSequence(4, 6, num_layers=2, bidirectional=True, device=device,
                                   dtype=torch.float64)
    inputs = torch.randn(5, 3, 4, generator=generator, dtype=torch.float64).to(device)
    zeros = torch.zeros(4, 3, 6, dtype=torch.float64, device=device)
    assert_same_results(module(inputs), module(inputs, (zeros, zeros)))


def test_lltm_layers_is_the_module_in_functional_form(device, generator):
    module = lltm_ffi.LLTMSequence(4, 6, num_layers=2, bidirectional=True, device=device,
                                   dtype=torch.float64)
    inputs = torch.randn(5, 3, 4, generator=generator, dtype=torch.float64).to(device)
    h0, c0 = random_state(module, 3, generator)
    weights, biases = zip(*parameters_of(module))
    assert_same_results(lltm_ffi.lltm_layers(inputs, weights, biases, h0, c0, bidirectional=True),
                        module(inputs, (h0, c0)))


def test_gradcheck(device, generator):
    module = lltm_ffi.LLTMSequence(2, 3, num_layers=2, bidirectional=True, device=device,
                                   dtype=torch.float64)
    inputs = torch.randn(3, 2, 2, generator=generator, dtype=torch.float64).to(device)
    state = random_state(module, 2, generator)
    weights, biases = (list(parameters) for parameters in zip(*parameters_of(module)))
    leaves = [tensor.detach().requires_grad_(True) for tensor in
              (inputs, *state, *weights, *biases)]

    def layers(inputs, h0, c0, *parameters):
        output, (h_n, c_n) = lltm_ffi.lltm_layers(inputs, parameters[:4], parameters[4:], h0, c0,
                                                  bidirectional=True)
        return output, h_n, c_n

    assert torch.autograd.gradcheck(layers, leaves)


# Dropout -----------------------------------------------------------------------

def dropped_run(module, inputs, seed):
    torch.manual_seed(seed)
    output, (h_n, c_n) = module(inputs)
    return output, h_n, c_n


def test_dropout_is_reproduced_by_the_seed_and_off_in_eval_mode(device, generator):
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        module = lltm_ffi.LLTMSequence(4, 6, num_layers=3, dropout=0.5, bidirectional=True,
                                       device=device, dtype=torch.float64)
        inputs = torch.randn(5, 3, 4, generator=generator, dtype=torch.float64).to(device)
        first, second, other = (dropped_run(module, inputs, seed) for seed in (7, 7, 8))
        for a, b in zip(first, second):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert not torch.equal(first[0], other[0])
        module.eval()
        evaluated = dropped_run(module, inputs, 7)
        assert not torch.equal(first[0], evaluated[0])
        module.dropout = 0.0
        module.train()
        for a, b in zip(dropped_run(module, inputs, 9), evaluated):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_dropout_of_one_zeroes_every_layer_input_but_the_first(device, generator):
    """With dropout=1 the second layer sees zeros: its outputs are those of
    the same layer run on zeros, and the first layer's final states are
    untouched."""
    module = lltm_ffi.LLTMSequence(4, 6, num_layers=2, dropout=1.0, bidirectional=True,
                                   device=device, dtype=torch.float64)
    inputs = torch.randn(5, 3, 4, generator=generator, dtype=torch.float64).to(device)
    output, (h_n, c_n) = module(inputs)
    weights, biases = zip(*parameters_of(module))
    zeros = torch.zeros(4, 3, 6, dtype=torch.float64, device=device)
    second, (h_second, c_second) = lltm_ffi.lltm_layers(
        inputs.new_zeros(5, 3, 12), weights[2:], biases[2:], zeros[2:], zeros[2:],
        bidirectional=True)
    torch.testing.assert_close(output, second)
    torch.testing.assert_close((h_n[2:], c_n[2:]), (h_second, c_second))
    module.eval()
    _, (h_eval, c_eval) = module(inputs)
    torch.testing.assert_close((h_n[:2], c_n[:2]), (h_eval[:2], c_eval[:2]))
    assert not torch.allclose(h_n[2:], h_eval[2:])


def test_dropout_with_one_layer_warns_as_nn_gru_does():
    with pytest.warns(UserWarning, match="num_layers > 1"):
        lltm_ffi.LLTMSequence(4, 6, dropout=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lltm_ffi.LLTMSequence(4, 6, num_layers=2, dropout=0.5)


# Compilers, graphs, streams ----------------------------------------------------------

@pytest.mark.slow
def test_compile_fullgraph_matches_eager(device, generator):
    torch._dynamo.reset()
    module = lltm_ffi.LLTMSequence(4, 8, num_layers=2, bidirectional=True, batch_first=True,
                                   device=device)
    inputs = torch.randn(3, 6, 4, generator=generator).to(device)

    def loss(inputs):
        output, (h_n, c_n) = module(inputs)
        return output.square().mean() + c_n.sum() + h_n.sin().sum()

    eager = loss(inputs)
    eager_grads = torch.autograd.grad(eager, list(module.parameters()))
    compiled = torch.compile(loss, fullgraph=True)(inputs)
    compiled_grads = torch.autograd.grad(compiled, list(module.parameters()))
    torch.testing.assert_close(compiled, eager)
    for value, reference in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(value, reference)


HALF_DTYPES = (torch.bfloat16, torch.float16)
# A captured training step's SGD learning rate: small, so that float16's
# range holds the weights the five steps make, and so that the steps do not
# magnify the products' differences in rounding (below) past the tolerance:
# at 0.5, float32's 3x40x4x420 case failed at one seed in five on an H200
# (1.1e-4 off where 6.1e-5 was allowed).
CAPTURE_LEARNING_RATE = 0.05
# How close the captured steps leave the parameters to the eager steps'
# (relative, and absolute at the parameters' scale). A capture's cuBLAS
# products run without a workspace (none can be allocated while capturing),
# the eager ones with their stream's, so cuBLAS may take other algorithms,
# which sum in another order: the two agree to float32's roundoff over the
# products' depth, and within a couple of units of a half dtype's roundoff,
# not bit for bit.
CAPTURE_TOLERANCES = {torch.float32: 1e-5,
                      **{dtype: 2 * torch.finfo(dtype).eps for dtype in HALF_DTYPES}}
# (steps, batch, input_features), state size, dtype: the persistent kernels,
# then cuBLAS's products.
CAPTURE_CASES = ([((6, 8, 4), 16, torch.float32), ((3, 40, 4), 420, torch.float32)]
                 + [((6, 8, 4), state_size, dtype)
                    for dtype in HALF_DTYPES for state_size in (16, 420)])


def capture_id(case):
    shape, state_size, dtype = case
    return f"{shape_id(shape + (state_size,))}-{str(dtype).removeprefix('torch.')}"


@pytest.mark.parametrize("shape, state_size, dtype", CAPTURE_CASES,
                         ids=[capture_id(case) for case in CAPTURE_CASES])
def test_cuda_graph_capture_of_a_training_step(shape, state_size, dtype, cuda_device, generator):
    """torch's whole-network capture of a two-layer bidirectional module's
    training step (forward, backward and an SGD step; both directions'
    streams inside the graph), in float32 and the half dtypes: its replays
    train the module as eager steps train a copy of it."""
    module = lltm_ffi.LLTMSequence(shape[2], state_size, num_layers=2, bidirectional=True,
                                   device=cuda_device, dtype=dtype)
    inputs = torch.randn(shape, generator=generator).to(cuda_device, dtype)

    def train(model, optimizer):
        output, (h_n, _) = model(inputs)
        (output.float().square().mean() + h_n.float().sum()).backward()
        optimizer.step()

    optimizer = torch.optim.SGD(module.parameters(), lr=CAPTURE_LEARNING_RATE)
    # Warm-up, as torch.cuda.graph asks: cuBLAS's handle, the reverse
    # directions' stream and the passes' first runs, outside the capture.
    warm_up = torch.cuda.Stream(cuda_device)
    warm_up.wait_stream(torch.cuda.current_stream(cuda_device))
    with torch.cuda.stream(warm_up):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            train(module, optimizer)
    torch.cuda.current_stream(cuda_device).wait_stream(warm_up)
    eager = copy.deepcopy(module)
    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=CAPTURE_LEARNING_RATE)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        train(module, optimizer)
    before = [parameter.detach().clone() for parameter in module.parameters()]
    for _ in range(2):
        graph.replay()
        eager_optimizer.zero_grad(set_to_none=True)
        train(eager, eager_optimizer)
    torch.cuda.synchronize(cuda_device)
    assert any(not torch.equal(parameter, old) for parameter, old in
               zip(module.parameters(), before)), "the replays changed no parameter"
    tolerance = CAPTURE_TOLERANCES[dtype]
    for (name, parameter), trained in zip(module.named_parameters(), eager.parameters()):
        assert parameter.dtype == dtype
        assert torch.isfinite(trained).all(), f"{name}: the eager steps overflowed"
        scale = trained.abs().max().item()
        torch.testing.assert_close(parameter, trained, rtol=tolerance, atol=tolerance * scale,
                                   msg=lambda message, name=name: f"{name}: {message}")


@pytest.mark.parametrize("state_size", [6, 130], ids=["persistent", "cublas"])
def test_both_directions_wait_for_the_callers_stream(state_size, cuda_device, generator):
    """Three training steps on a side stream whose inputs another stream
    fills after a long delay: the reverse direction's own stream must wait
    for the caller's, and the caller's for it, forward and backward."""
    module = lltm_ffi.LLTMSequence(4, state_size, num_layers=2, bidirectional=True,
                                   device=cuda_device, dtype=torch.float64)
    shape = (4, 3 if state_size < 100 else 130, 4)
    inputs = torch.randn(shape, generator=generator, dtype=torch.float64)
    state = random_state(module, shape[1], generator)
    grads = random_grads(module, shape, generator)
    expected = reference_results(module, inputs, *state, grads)
    side, filler = torch.cuda.Stream(cuda_device), torch.cuda.Stream(cuda_device)
    calls = []
    for _ in range(3):
        filler.wait_stream(torch.cuda.current_stream(cuda_device))
        arguments = slow_stream_inputs(filler, [inputs.to(cuda_device), *state, *grads])
        side.wait_stream(filler)
        with torch.cuda.stream(side):
            calls.append((module_results(module, *arguments[:3], arguments[3:]), arguments))
    side.synchronize()
    for got, _ in calls:
        assert_close_to_reference([value.cpu() for value in got], expected, result_names(module),
                                  TOLERANCES[torch.float64])


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_the_reverse_directions_arguments_outlive_its_side_stream(packed, cuda_device, generator):
    """Training steps of a two-layer bidirectional module under bfloat16
    autocast, whose casts of the inputs and parameters are freed during the
    backward, each followed by a step of a bfloat16 copy (which allocates
    otherwise), with the side stream the reverse direction runs on held up
    before each backward: every autocast step's gradients are the copy's,
    bit for bit. So the memory the reverse direction's backward reads on
    the side stream is not handed back to the caller's stream before that
    backward is done with it. Both runs take the same deterministic paths
    on the same streams (cuBLAS's products, each on its stream's own
    workspace, give the same bits on every run), so any difference is a
    race."""
    module = lltm_ffi.LLTMSequence(6, 9, num_layers=2, bidirectional=True).to(cuda_device)
    converted = copy.deepcopy(module).to(torch.bfloat16)
    lengths = [5, 2, 4] if packed else [4, 4, 4]
    sequences = [torch.randn(length, 6, generator=generator).to(cuda_device)
                 for length in lengths]
    state = [torch.randn(4, 3, 9, generator=generator).to(cuda_device) for _ in range(2)]

    def step(model, dtype):
        inputs = [sequence.to(dtype) for sequence in sequences]
        batch = (pack_sequence(inputs, enforce_sorted=False) if packed
                 else torch.stack(inputs, dim=1))
        output, (h_n, c_n) = model(batch, tuple(tensor.to(dtype) for tensor in state))
        output = output.data if packed else output
        loss = output.float().square().mean() + h_n.float().sum() + c_n.float().sin().sum()
        # The side stream held up (some 10 ms), so that the caller's stream
        # runs well ahead of the reverse direction's backward.
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)
        loss.backward()
        grads = {name: parameter.grad.float() for name, parameter in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        return grads

    side = layers._side_stream(cuda_device)
    for repeat in range(10):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            grads = step(module, torch.float32)
        expected = step(converted, torch.bfloat16)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, expected[name], rtol=0, atol=0,
                                       msg=lambda message, name=name, repeat=repeat:
                                       f"{name}, step {repeat}: {message}")


# Parameters' names, state_dicts ----------------------------------------------------

def test_state_dicts_load_between_lltm_and_a_one_layer_module(generator):
    cell = lltm_ffi.LLTM(4, 6)
    sequence = lltm_ffi.LLTMSequence(4, 6)
    sequence.load_state_dict(cell.state_dict())
    assert torch.equal(sequence.weights_l0, cell.weights)
    assert torch.equal(sequence.bias_l0, cell.bias)
    other = lltm_ffi.LLTM(4, 6)
    other.load_state_dict(lltm_ffi.LLTMSequence(4, 6).state_dict())
    model = torch.nn.Sequential(lltm_ffi.LLTMSequence(4, 6))
    model.load_state_dict({"0.weights": cell.weights.detach(), "0.bias": cell.bias.detach()})
    assert torch.equal(model[0].weights_l0, cell.weights)


def test_a_stacked_module_does_not_load_an_lltm_state_dict():
    with pytest.raises(RuntimeError, match="weights_l1"):
        lltm_ffi.LLTMSequence(4, 6, num_layers=2).load_state_dict(lltm_ffi.LLTM(4, 6).state_dict())
    with pytest.raises(RuntimeError, match="bias"):
        lltm_ffi.LLTMSequence(4, 6, bias=False).load_state_dict(lltm_ffi.LLTM(4, 6).state_dict())


# Refusals ------------------------------------------------------------------------

@pytest.mark.parametrize("keywords, exception, fragments", [
    ({"num_layers": 0}, ValueError, ("num_layers must be at least 1", "0")),
    ({"num_layers": -3}, ValueError, ("num_layers must be at least 1", "-3")),
    ({"num_layers": 1.5}, TypeError, ("num_layers must be an int", "float")),
    ({"num_layers": True}, TypeError, ("num_layers must be an int", "bool")),
    ({"dropout": -0.1}, ValueError, ("dropout must be a number from 0 to 1",)),
    ({"dropout": 1.5}, ValueError, ("dropout", "1.5")),
    ({"dropout": float("nan")}, ValueError, ("dropout", "nan")),
    ({"dropout": "half"}, TypeError, ("dropout must be a number", "str")),
    ({"dropout": True}, TypeError, ("dropout must be a number", "bool")),
])
def test_construction_refuses_naming_the_argument(keywords, exception, fragments):
    with raises_with(exception, "LLTMSequence", *fragments):
        lltm_ffi.LLTMSequence(4, 6, **keywords)


def bad_calls():
    module = lltm_ffi.LLTMSequence(4, 6, num_layers=2, bidirectional=True, dtype=torch.float64)
    good = torch.randn(5, 3, 4, dtype=torch.float64)
    state = torch.zeros(4, 3, 6, dtype=torch.float64)
    return module, [
        ((good[..., :3],), ValueError, ("input has 3 features", "input_features=4")),
        ((good.float(),), TypeError, ("input has dtype torch.float32", "torch.float64")),
        ((good[None],), ValueError, ("input must have 3 dimensions",)),
        ((good, (state[:2], state)), ValueError, ("state h0 has shape (2, 3, 6)", "(4, 3, 6)")),
        ((good, (state, state[:, :2])), ValueError, ("state c0 has shape (4, 2, 6)",)),
        ((good, (state, state[..., :5])), ValueError, ("state c0", "(4, 3, 6)")),
        ((good, (state, state.float())), TypeError, ("state c0 has dtype torch.float32",)),
        ((good, (state, state, state)), TypeError,
         ("state must be a pair (h0, c0), a lone h0 tensor or None", "a tuple of 3")),
        ((good, "h0"), TypeError, ("state must be a pair (h0, c0)", "got str")),
        ((good[:, 0], (state, state)), ValueError, ("state h0", "unbatched", "(4, 6)")),
        ((good, (state, 0)), TypeError, ("state c0 must be a torch.Tensor",)),
        ((good, state[:2]), ValueError, ("state h0 has shape (2, 3, 6)",)),
    ]


@pytest.mark.parametrize("index", range(len(bad_calls()[1])))
def test_calls_are_refused_naming_the_argument(index):
    module, calls = bad_calls()
    arguments, exception, fragments = calls[index]
    with raises_with(exception, "LLTMSequence", *fragments):
        module(*arguments)


def test_lltm_layers_refuses_mismatched_lists(generator):
    module = lltm_ffi.LLTMSequence(4, 6, num_layers=2, bidirectional=True, dtype=torch.float64)
    weights, biases = zip(*parameters_of(module))
    inputs = torch.randn(5, 3, 4, dtype=torch.float64)
    state = torch.zeros(4, 3, 6, dtype=torch.float64)
    with raises_with(ValueError, "lltm_layers: weights holds 3 tensors", "num_layers * 2"):
        lltm_ffi.lltm_layers(inputs, weights[:3], biases[:3], state, state, bidirectional=True)
    with raises_with(ValueError, "lltm_layers: biases holds 2 tensors but weights 4"):
        lltm_ffi.lltm_layers(inputs, weights, biases[:2], state, state, bidirectional=True)
    with raises_with(ValueError, "lltm_layers: h0 has shape (2, 3, 6)", "(4, 3, 6)"):
        lltm_ffi.lltm_layers(inputs, weights, biases, state[:2], state, bidirectional=True)
    with raises_with(ValueError, "lltm_layers: dropout"):
        lltm_ffi.lltm_layers(inputs, weights, biases, state, state, bidirectional=True,
                             dropout=2)


def test_reference_agrees_with_the_sequences_own_reference(generator):
    """The reference loop itself, one layer forward, against the sequence's."""
    from conftest import reference_sequence
    module = lltm_ffi.LLTMSequence(4, 6, dtype=torch.float64)
    sequences = random_sequences([5, 5, 5], 4, generator)
    state = random_state(module, 3, generator)
    outputs, h_n, c_n = reference_layers(module, sequences, *state)
    expected, (h, c) = reference_sequence(torch.stack(sequences, dim=1), module.weights_l0,
                                          module.bias_l0, state[0][0], state[1][0])
    torch.testing.assert_close(torch.stack(outputs, dim=1), expected)
    torch.testing.assert_close((h_n[0], c_n[0]), (h, c))
