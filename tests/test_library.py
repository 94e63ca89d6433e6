"""lltm_ffi as a first-class PyTorch op: the torch.library operators
(opcheck), torch.compile, streams, CUDA graphs, several GPUs and autocast."""

import pytest
import torch
from torch.library import opcheck

import lltm_ffi
from lltm_ffi import reference, selfcheck

from conftest import skip_without_gpu


def random_pass_inputs(batch_size, state_size, dtype, device, generator):
    def normal(*shape):
        return torch.randn(*shape, generator=generator, dtype=dtype).to(device)
    return {"gates": normal(batch_size, 3 * state_size), "old_cell": normal(batch_size, state_size),
            "grad_h": normal(batch_size, state_size), "grad_cell": normal(batch_size, state_size),
            "new_cell": normal(batch_size, state_size)}


@pytest.mark.parametrize("batch_size,state_size", [(1, 1), (3, 7), (5, 257)])
def test_opcheck_forward_pass(device, dtype, generator, batch_size, state_size):
    tensors = random_pass_inputs(batch_size, state_size, dtype, device, generator)
    gates = tensors["gates"].requires_grad_(True)
    old_cell = tensors["old_cell"].requires_grad_(True)
    opcheck(torch.ops.lltm_ffi.forward_pass.default, (gates, old_cell))


@pytest.mark.parametrize("batch_size,state_size", [(1, 1), (3, 7), (5, 257)])
def test_opcheck_backward_pass(device, dtype, generator, batch_size, state_size):
    tensors = random_pass_inputs(batch_size, state_size, dtype, device, generator)
    opcheck(torch.ops.lltm_ffi.backward_pass.default,
            (tensors["grad_h"], tensors["grad_cell"], tensors["new_cell"], tensors["gates"]))


def test_operators_agree_with_the_eager_path(device, dtype, generator):
    inputs = selfcheck.random_inputs(4, 6, 9, dtype, device, generator)
    X = torch.cat((inputs[3], inputs[0]), dim=1)
    gates = torch.addmm(inputs[2], X, inputs[1].t())
    through_operator = torch.ops.lltm_ffi.forward_pass(gates, inputs[4])
    through_function = lltm_ffi.lltm(*inputs)
    for got, expected in zip(through_operator, through_function):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_operator_rejects_mismatched_shapes(device, generator):
    tensors = random_pass_inputs(3, 5, torch.float32, device, generator)
    with pytest.raises(ValueError, match=r"gates has shape \(3, 14\), expected \(3, 15\)"):
        torch.ops.lltm_ffi.forward_pass(tensors["gates"][:, :14], tensors["old_cell"])


class Sequence(torch.nn.Module):
    """A few LLTM steps and a linear readout: what people compile."""

    def __init__(self, input_features=6, state_size=10):
        super().__init__()
        self.cell = lltm_ffi.LLTM(input_features, state_size)
        self.readout = torch.nn.Linear(state_size, 1)

    def forward(self, sequence):
        h = sequence.new_zeros(sequence.shape[1], self.cell.state_size)
        cell = torch.zeros_like(h)
        for step in range(sequence.shape[0]):
            h, cell = self.cell(sequence[step], (h, cell))
        return self.readout(h).squeeze(1), cell


def run_and_collect(model, sequence):
    """Outputs and every parameter's gradient for a random-weighted loss."""
    model.zero_grad(set_to_none=True)
    prediction, cell = model(sequence)
    generator = torch.Generator().manual_seed(7)
    weights = torch.randn(cell.shape, generator=generator, dtype=cell.dtype).to(cell.device)
    (prediction.sum() + (cell * weights).sum()).backward()
    return [prediction.detach().clone(), cell.detach().clone()] + [
        parameter.grad.clone() for parameter in model.parameters()]


def assert_all_close(got, expected, tolerance):
    for index, (value, reference_value) in enumerate(zip(got, expected)):
        error = selfcheck.relative_error(value, reference_value)
        assert error <= tolerance, f"tensor {index}: relative error {error:.3g}"


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compile_fullgraph_matches_eager(device, generator, mode):
    if mode == "reduce-overhead" and device.type != "cuda":
        pytest.skip("reduce-overhead (CUDA graphs) is a CUDA mode")
    torch._dynamo.reset()
    model = Sequence().to(device)
    sequence = torch.randn(4, 3, 6, generator=generator).to(device)
    eager = run_and_collect(model, sequence)
    compiled = torch.compile(model, fullgraph=True, mode=mode)
    # reduce-overhead records its graph on the first runs and replays after;
    # check a replay with fresh inputs too.
    for _ in range(3):
        got = run_and_collect(compiled, sequence)
        assert_all_close(got, eager, 1e-5)
    fresh = torch.randn(4, 3, 6, generator=generator).to(device)
    assert_all_close(run_and_collect(compiled, fresh), run_and_collect(model, fresh), 1e-5)


def test_compiled_graph_calls_the_operator(generator):
    torch._dynamo.reset()
    inputs = selfcheck.random_inputs(3, 4, 5, torch.float32, "cpu", generator)
    explanation = torch._dynamo.explain(lltm_ffi.lltm)(*inputs)
    assert explanation.graph_break_count == 0
    graph_code = "\n".join(graph.code for graph in explanation.graphs)
    assert "lltm_ffi.forward_pass" in graph_code


def slow_stream_inputs(stream, inputs):
    """Fills fresh buffers with `inputs` on `stream` after a long delay, so a
    kernel that ignored the stream would read the buffers' stale contents."""
    buffers = [torch.full_like(tensor, float("nan")) for tensor in inputs]
    with torch.cuda.stream(stream):
        torch.cuda._sleep(20_000_000)
        for buffer, tensor in zip(buffers, inputs):
            buffer.copy_(tensor, non_blocking=True)
    return buffers


def test_runs_on_the_current_side_stream(cuda_device, generator):
    inputs = selfcheck.random_inputs(8, 16, 300, torch.float32, cuda_device, generator)
    expected = reference.lltm(*inputs)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    buffers = slow_stream_inputs(side, inputs)
    with torch.cuda.stream(side):
        new_h, new_cell = lltm_ffi.lltm(*buffers)
    side.synchronize()
    assert_all_close([new_h, new_cell], expected, 1e-6)


def test_inputs_handed_over_from_another_stream(cuda_device, generator):
    inputs = selfcheck.random_inputs(8, 16, 300, torch.float32, cuda_device, generator)
    leaves = [tensor.clone().requires_grad_(True) for tensor in inputs]
    expected_outputs = reference.lltm(*leaves)
    sum(output.sum() for output in expected_outputs).backward()
    expected_gradients = [leaf.grad for leaf in leaves]
    torch.cuda.synchronize()

    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    buffers = slow_stream_inputs(producer, inputs)
    consumer.wait_stream(producer)
    with torch.cuda.stream(consumer):
        leaves = [buffer.requires_grad_(True) for buffer in buffers]
        outputs = lltm_ffi.lltm(*leaves)
        sum(output.sum() for output in outputs).backward()
    consumer.synchronize()
    assert_all_close(list(outputs), expected_outputs, 1e-6)
    assert_all_close([leaf.grad for leaf in leaves], expected_gradients, 1e-5)


def test_cuda_graph_capture_and_replay(cuda_device, generator):
    model = lltm_ffi.LLTM(16, 96).to(cuda_device)
    static = [torch.randn(shape, generator=generator).to(cuda_device)
              for shape in ((32, 16), (32, 96), (32, 96), (32, 96), (32, 96))]
    static_input, static_h, static_cell, static_grad_h, static_grad_cell = static

    def step():
        new_h, new_cell = model(static_input, (static_h, static_cell))
        torch.autograd.backward((new_h, new_cell), (static_grad_h, static_grad_cell))
        return new_h, new_cell

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model.zero_grad(set_to_none=False)
            step()
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    model.zero_grad(set_to_none=False)
    with torch.cuda.graph(graph):
        static_new_h, static_new_cell = step()

    for _ in range(2):
        fresh = [torch.randn(tensor.shape, generator=generator).to(cuda_device) for tensor in static]
        for tensor, value in zip(static, fresh):
            tensor.copy_(value)
        for parameter in model.parameters():
            parameter.grad.zero_()
        graph.replay()
        torch.cuda.synchronize()

        weights = model.weights.detach().clone().requires_grad_(True)
        bias = model.bias.detach().clone().requires_grad_(True)
        expected = reference.lltm(fresh[0], weights, bias, fresh[1], fresh[2])
        torch.autograd.backward(expected, (fresh[3], fresh[4]))
        assert_all_close([static_new_h, static_new_cell], expected, 1e-6)
        assert_all_close([model.weights.grad, model.bias.grad], [weights.grad, bias.grad], 1e-5)


def test_second_gpu_while_first_is_current(generator):
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, torch sees {torch.cuda.device_count()}")
    second = torch.device("cuda", 1)
    torch.cuda.set_device(0)
    inputs = selfcheck.random_inputs(8, 16, 300, torch.float64, "cpu", generator)
    errors = selfcheck.compare_with_reference(8, 16, 300, torch.float64, second)
    name, error = selfcheck.worst(errors)
    assert error <= selfcheck.TOLERANCES[torch.float64], f"{name}: {error} (seed {errors['seed']})"
    on_second = [tensor.to(second) for tensor in inputs]
    new_h, new_cell = lltm_ffi.lltm(*on_second)
    assert new_h.device == second and new_cell.device == second
    assert torch.cuda.current_device() == 0
    assert_all_close([new_h.cpu(), new_cell.cpu()], reference.lltm(*inputs), 1e-12)
    mixed = list(on_second)
    mixed[4] = inputs[4].to("cuda:0")
    with pytest.raises(ValueError, match="old_cell is on cuda:0 but input is on cuda:1"):
        lltm_ffi.lltm(*mixed)


# Relative error in norm of the float32 outputs under autocast against the
# float64 reference: the matrix product's operands are rounded to 8 (bf16) or
# 11 (fp16) significant bits, the pointwise math is float32.
AUTOCAST_TOLERANCES = {torch.bfloat16: 2e-2, torch.float16: 4e-3}


@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16],
                         ids=["bfloat16", "float16"])
def test_autocast(device, generator, autocast_dtype):
    if device.type == "cpu" and autocast_dtype == torch.float16:
        pytest.skip("CPU autocast is a bfloat16 feature")
    inputs = selfcheck.random_inputs(16, 64, 128, torch.float32, device, generator)
    leaves = [tensor.clone().requires_grad_(True) for tensor in inputs]
    with torch.autocast(device.type, dtype=autocast_dtype):
        new_h, new_cell = lltm_ffi.lltm(*leaves)
    assert new_h.dtype == torch.float32 and new_cell.dtype == torch.float32
    (new_h.sum() + new_cell.sum()).backward()
    assert all(leaf.grad is not None and leaf.grad.dtype == torch.float32 for leaf in leaves)

    expected = reference.lltm(*[tensor.double() for tensor in inputs])
    tolerance = AUTOCAST_TOLERANCES[autocast_dtype]
    assert_all_close([new_h, new_cell], expected, tolerance)
    # Not float32-exact: the products really ran in the low-precision dtype.
    assert selfcheck.relative_error(new_h, expected[0]) > 1e-6


def test_autocast_rejects_integer_input(device, generator):
    inputs = list(selfcheck.random_inputs(2, 3, 4, torch.float32, device, generator))
    inputs[0] = inputs[0].to(torch.int32)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        with pytest.raises(TypeError, match="input has dtype torch.int32"):
            lltm_ffi.lltm(*inputs)
