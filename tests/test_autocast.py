"""lltm_ffi under torch.autocast (README "Autocast"), as nn.GRU on a GPU:
the cell, lltm_sequence, lltm_layers and the modules cast their
floating-point arguments to the autocast dtype (bfloat16 or float16, on
the CPU and CUDA) and run in it, their results in that dtype; the
gradients come back to the float32 arguments through the casts. So a call
under autocast gives exactly what the same call gives on arguments cast by
hand, and its gradients are the half gradients cast to float32. float64
arguments stay float64, as autocast leaves them; an integer input is still
refused; torch.compile(fullgraph=True) traces the casts and the
operators."""

import copy

import pytest
import torch
from torch.nn.utils.rnn import pack_sequence

import lltm_ffi
from lltm_ffi import reference, selfcheck

AUTOCAST = [pytest.param(torch.bfloat16, id="bfloat16"), pytest.param(torch.float16, id="float16")]
# Relative error in norm of the results under autocast against float64 from
# the same float32 arguments: every operand is rounded to 8 (bf16) or 11
# (fp16) significant bits; test_half.py bounds the half computation itself.
AUTOCAST_TOLERANCES = {torch.bfloat16: 3e-2, torch.float16: 4e-3}


def assert_same_computation(value, expected, what):
    """value and expected (value's dtype, or the autocast dtype) from two
    runs of the same computation in the autocast dtype: equal, bit for bit,
    on every device."""
    torch.testing.assert_close(value, expected.to(value.dtype), rtol=0, atol=0,
                               msg=lambda message: f"{what}: {message}")


def results_and_gradients(function, arguments, grads):
    """The results of function(*leaves) (a flat tuple) and the gradients of
    every leaf of the sum of each result times its gradient in `grads`."""
    leaves = [argument.detach().clone().requires_grad_(True) for argument in arguments]
    results = function(*leaves)
    loss = sum((result.float() * grad).sum() for result, grad in zip(results, grads))
    return results, torch.autograd.grad(loss, leaves)


def assert_runs_in_the_autocast_dtype(function, arguments, grads, device, autocast_dtype):
    """function under autocast on float32 arguments: results in the autocast
    dtype, equal to function on the arguments cast by hand outside autocast;
    float32 gradients equal to the half gradients cast to float32."""
    with torch.autocast(device.type, dtype=autocast_dtype):
        results, gradients = results_and_gradients(function, arguments, grads)
    by_hand, half_gradients = results_and_gradients(
        function, [argument.to(autocast_dtype) for argument in arguments], grads)
    for index, (result, expected) in enumerate(zip(results, by_hand)):
        assert result.dtype == autocast_dtype, f"result {index} has dtype {result.dtype}"
        assert_same_computation(result, expected, f"result {index}")
    for index, (gradient, expected) in enumerate(zip(gradients, half_gradients)):
        assert gradient.dtype == torch.float32, f"gradient {index} has dtype {gradient.dtype}"
        assert gradient.abs().sum() > 0, f"gradient {index} is zero"
        assert_same_computation(gradient, expected, f"gradient {index}")
    return results


@pytest.mark.parametrize("autocast_dtype", AUTOCAST)
def test_the_cell_runs_in_the_autocast_dtype(device, generator, autocast_dtype):
    arguments = selfcheck.random_inputs(16, 64, 128, torch.float32, device, generator)
    grads = [torch.randn(16, 128, generator=generator).to(device) for _ in range(2)]
    new_h, new_cell = assert_runs_in_the_autocast_dtype(lltm_ffi.lltm, arguments, grads, device,
                                                        autocast_dtype)
    expected = reference.lltm(*[argument.double() for argument in arguments])
    for result, wanted in zip((new_h, new_cell), expected):
        error = selfcheck.relative_error(result, wanted)
        assert 1e-6 < error <= AUTOCAST_TOLERANCES[autocast_dtype], error


@pytest.mark.parametrize("autocast_dtype", AUTOCAST)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_lltm_sequence_runs_in_the_autocast_dtype(device, generator, autocast_dtype, reverse):
    arguments = [torch.randn(5, 4, 8, generator=generator).to(device),
                 *selfcheck.random_inputs(4, 8, 16, torch.float32, device, generator)[1:]]
    grads = [torch.randn(shape, generator=generator).to(device)
             for shape in ((5, 4, 16), (4, 16), (4, 16))]

    def sequence(*arguments):
        outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(*arguments, reverse=reverse)
        return outputs, h_n, c_n

    outputs, _, _ = assert_runs_in_the_autocast_dtype(sequence, arguments, grads, device,
                                                      autocast_dtype)
    steps = arguments[0].flip(0) if reverse else arguments[0]
    h, c, expected = arguments[3].double(), arguments[4].double(), []
    for step in steps.double():
        h, c = reference.lltm(step, arguments[1].double(), arguments[2].double(), h, c)
        expected.append(h)
    expected = torch.stack(expected[::-1] if reverse else expected)
    error = selfcheck.relative_error(outputs, expected)
    assert 1e-6 < error <= AUTOCAST_TOLERANCES[autocast_dtype], error


@pytest.mark.parametrize("autocast_dtype", AUTOCAST)
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_a_two_layer_bidirectional_module_runs_in_the_autocast_dtype(device, generator,
                                                                     autocast_dtype, packed):
    """A float32 LLTMSequence under autocast: its output and final states in
    the autocast dtype, equal to those of a copy converted to that dtype;
    its float32 parameters' gradients those of the copy's, cast."""
    module = lltm_ffi.LLTMSequence(6, 9, num_layers=2, bidirectional=True).to(device)
    converted = copy.deepcopy(module).to(autocast_dtype)
    lengths = [5, 2, 4] if packed else [4, 4, 4]
    sequences = [torch.randn(length, 6, generator=generator).to(device) for length in lengths]
    state = [torch.randn(4, 3, 9, generator=generator).to(device) for _ in range(2)]

    def run(model, sequences, h0, c0):
        batch = (pack_sequence(sequences, enforce_sorted=False) if packed
                 else torch.stack(sequences, dim=1))
        output, (h_n, c_n) = model(batch, (h0, c0))
        output = output.data if packed else output
        (output.float().square().mean() + h_n.float().sum() + c_n.float().sin().sum()).backward()
        return output, h_n, c_n

    with torch.autocast(device.type, dtype=autocast_dtype):
        results = run(module, sequences, *state)
    expected = run(converted, [sequence.to(autocast_dtype) for sequence in sequences],
                   *(tensor.to(autocast_dtype) for tensor in state))
    for result, wanted in zip(results, expected):
        assert result.dtype == autocast_dtype
        assert_same_computation(result, wanted, "result")
    for (name, parameter), half in zip(module.named_parameters(), converted.parameters()):
        assert parameter.grad.dtype == torch.float32, name
        assert_same_computation(parameter.grad, half.grad, name)


def test_a_module_under_autocast_takes_an_input_of_the_autocast_dtype(device, generator):
    """As nn.GRU: a float32 module takes a bfloat16 input under autocast, and
    refuses it outside."""
    module = lltm_ffi.LLTMSequence(3, 5).to(device)
    inputs = torch.randn(4, 2, 3, generator=generator).to(device, torch.bfloat16)
    with pytest.raises(TypeError, match="input has dtype torch.bfloat16 but the module's "
                                        "parameters have torch.float32"):
        module(inputs)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        output, (h_n, c_n) = module(inputs, [torch.zeros(1, 2, 5, device=device)] * 2)
    assert output.dtype == h_n.dtype == c_n.dtype == torch.bfloat16


def test_float64_arguments_stay_float64(device, generator):
    """Autocast leaves float64 tensors as they are: so does lltm_ffi."""
    arguments = selfcheck.random_inputs(3, 4, 5, torch.float64, device, generator)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        new_h, new_cell = lltm_ffi.lltm(*arguments)
        outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(arguments[0][None], *arguments[1:])
    expected = lltm_ffi.lltm(*arguments)
    for result, wanted in ((new_h, expected[0]), (new_cell, expected[1]), (outputs[0], expected[0]),
                           (h_n, expected[0]), (c_n, expected[1])):
        assert result.dtype == torch.float64
        torch.testing.assert_close(result, wanted)


def test_autocast_rejects_integer_input(device, generator):
    inputs = list(selfcheck.random_inputs(2, 3, 4, torch.float32, device, generator))
    inputs[0] = inputs[0].to(torch.int32)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        with pytest.raises(TypeError, match="input has dtype torch.int32"):
            lltm_ffi.lltm(*inputs)
        with pytest.raises(TypeError, match="inputs has dtype torch.int32"):
            lltm_ffi.lltm_sequence(inputs[0][None], *inputs[1:])


@pytest.mark.slow
def test_compile_fullgraph_under_autocast_matches_eager(device, generator):
    """torch.compile traces the casts and the operators of a float32 module
    under bfloat16 autocast: the same results as eager autocast."""
    torch._dynamo.reset()
    module = lltm_ffi.LLTMSequence(4, 8, num_layers=2, bidirectional=True,
                                   batch_first=True).to(device)
    inputs = torch.randn(3, 6, 4, generator=generator).to(device)

    def loss(inputs):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            output, (h_n, c_n) = module(inputs)
        assert output.dtype == torch.bfloat16
        return output.float().square().mean() + c_n.float().sum()

    eager = loss(inputs)
    eager_grads = torch.autograd.grad(eager, list(module.parameters()))
    explanation = torch._dynamo.explain(loss)(inputs)
    assert explanation.graph_break_count == 0
    code = "\n".join(graph.code for graph in explanation.graphs)
    assert "lltm_ffi.packed_forward" in code and "torch.bfloat16" in code
    compiled = torch.compile(loss, fullgraph=True)(inputs)
    compiled_grads = torch.autograd.grad(compiled, list(module.parameters()))
    torch.testing.assert_close(compiled, eager)
    for value, expected in zip(compiled_grads, eager_grads):
        assert value.dtype == torch.float32
        torch.testing.assert_close(value, expected)
