"""lltm_ffi on CUDA streams, in CUDA graphs and on several GPUs (GPU only):
the passes launch on the current stream of the tensors' device, wait for
inputs handed over from another stream, capture and replay in a CUDA graph,
and run on a GPU other than the current one, which stays current.
(round_ste's stream and device checks are in test_round.py.)"""

import pytest
import torch

import lltm_ffi
from lltm_ffi.ops.lltm import cell
from builders import slow_stream_inputs
from conftest import assert_all_close, skip_without_two_gpus
from lltm_ffi import reference, selfcheck


def test_runs_on_the_current_side_stream(cuda_device, generator):
    inputs = selfcheck.random_inputs(8, 16, 300, torch.float32, cuda_device, generator)
    expected = reference.lltm(*inputs)
    # A kernel's first launch in a process can wait for the device (its module
    # is loaded then), which would hide a launch on the wrong stream.
    lltm_ffi.lltm(*inputs)
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


# Captured, a cell runs in lltm_ffi's step kernels only up to 2^20
# multiply-adds (32x16x96: 1032192), in torch's products past that
# (LLTM_CAPTURED_STEP_MULTIPLY_ADDS, src/plan.c).
@pytest.mark.parametrize("shape, step_kernels", [((32, 16, 96), True), ((64, 64, 256), False)],
                         ids=["step-kernels", "torch-products"])
def test_cuda_graph_capture_and_replay(shape, step_kernels, cuda_device, generator, monkeypatch):
    batch_size, input_features, state_size = shape
    model = lltm_ffi.LLTM(input_features, state_size).to(cuda_device)
    static = [torch.randn(shape, generator=generator).to(cuda_device)
              for shape in ((batch_size, input_features),) + ((batch_size, state_size),) * 4]
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
    captured_steps = []
    run = cell.step_forward.run
    monkeypatch.setattr(cell.step_forward, "run",
                        lambda *arguments: captured_steps.append(1) or run(*arguments))
    with torch.cuda.graph(graph):
        static_new_h, static_new_cell = step()
    assert bool(captured_steps) == step_kernels

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


@pytest.mark.gpu
@pytest.mark.multi_gpu
def test_second_gpu_while_the_first_is_current(generator):
    skip_without_two_gpus()
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
