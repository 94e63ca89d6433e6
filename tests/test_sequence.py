"""lltm_sequence and LLTMSequence: agreement with a Python loop of lltm_ffi.lltm
(forward and every gradient) on each of the GPU's paths and under TF32,
gradcheck, the operators (opcheck, compile, CUDA graphs, streams, devices),
refusals, and the module."""

import functools
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.library import opcheck

import lltm_ffi
from lltm_ffi.ops.lltm import cell
from builders import slow_stream_inputs
from checkouts import REPO_ROOT
from conftest import raises_with, reference_sequence, set_or_unset, skip_without_gpu

# (steps, batch, input_features, state_size): one step, batch 1, odd sizes,
# a state size that is not a multiple of the 16-wide tiles, a long sequence;
# on a GPU the persistent kernels take all but the last two (a state of 650
# among them: rows of 2,600 bytes, staged in 8-byte copies): 130 x 130 is
# past their batch x state limit, and 1100 state columns need more blocks than a
# GPU of up to 137 multiprocessors holds at once, so the step-by-step kernels
# run those. On compute capability 9.0 and newer the cluster kernels take
# most of them instead (test_cluster.py runs both with and without them).
SHAPES = [(1, 1, 3, 5), (1, 16, 32, 128), (5, 3, 4, 7), (37, 2, 5, 17), (7, 1, 9, 33),
          (4, 19, 6, 40), (6, 300, 3, 24), (6, 16, 9, 650), (2, 130, 4, 130), (3, 2, 5, 1100)]
# Past the persistent kernels: cuBLAS's products on a GPU, or with
# LLTM_CUBLAS=0 the step-by-step kernels.
BY_STEP_SHAPES = [(2, 130, 4, 130), (3, 2, 5, 1100), (5, 33, 7, 520)]
TOLERANCES = {torch.float32: 1e-5, torch.float64: 1e-10}
# TF32 keeps 10 bits of each factor's mantissa: the sequence and the loop
# round differently, and agree to about 1e-3.
TF32_TOLERANCE = 1e-2


def random_arguments(shape, dtype, device, generator):
    steps, batch_size, input_features, state_size = shape

    def normal(*size, scale=1.0):
        return (torch.randn(*size, generator=generator, dtype=dtype) * scale).to(device)

    scale = state_size ** -0.5
    return [normal(steps, batch_size, input_features),
            normal(3 * state_size, state_size + input_features, scale=scale),
            normal(3 * state_size, scale=scale), normal(batch_size, state_size),
            normal(batch_size, state_size)]


def python_loop(inputs, weights, bias, h0, c0, reverse=False):
    """lltm_sequence as a loop of the cell; reverse: from the last step to the first."""
    h, c, outputs = h0, c0, []
    for step in inputs.flip(0) if reverse else inputs:
        h, c = lltm_ffi.lltm(step, weights, bias, h, c)
        outputs.append(h)
    outputs = torch.stack(outputs)
    return outputs.flip(0) if reverse else outputs, (h, c)


def results(function, arguments, grads):
    """Outputs, final state and the five arguments' gradients."""
    leaves = [argument.detach().clone().requires_grad_(True) for argument in arguments]
    outputs, (h_n, c_n) = function(*leaves)
    torch.autograd.backward((outputs, h_n, c_n), grads)
    return [outputs, h_n, c_n] + [leaf.grad for leaf in leaves]


NAMES = ("outputs", "h_n", "c_n", "d_inputs", "d_weights", "d_bias", "d_h0", "d_c0")


def assert_agrees_with_a_loop_of_the_cell(shape, dtype, device, generator, tolerance):
    arguments = random_arguments(shape, dtype, device, generator)
    steps, batch_size, _, state_size = shape
    grads = [torch.randn(size, generator=generator, dtype=dtype).to(device)
             for size in ((steps, batch_size, state_size), (batch_size, state_size),
                          (batch_size, state_size))]
    actual = results(lltm_ffi.lltm_sequence, arguments, grads)
    expected = results(python_loop, arguments, grads)
    for name, value, reference in zip(NAMES, actual, expected):
        error = ((value - reference).norm() / reference.norm()).item()
        assert error <= tolerance, f"{name}: relative error {error:.3g}"


def shape_id(shape):
    return "x".join(map(str, shape))


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_agrees_with_a_loop_of_the_cell(shape, dtype, device, generator):
    assert_agrees_with_a_loop_of_the_cell(shape, dtype, device, generator, TOLERANCES[dtype])


@pytest.mark.parametrize("shape", BY_STEP_SHAPES, ids=shape_id)
def test_own_kernels_agree_with_a_loop_of_the_cell(shape, dtype, cuda_device, generator,
                                                   monkeypatch):
    monkeypatch.setenv("LLTM_CUBLAS", "0")
    assert_agrees_with_a_loop_of_the_cell(shape, dtype, cuda_device, generator,
                                          TOLERANCES[dtype])


@pytest.mark.parametrize("kernels", ["default", "own"])
def test_one_step_without_state_gradients(kernels, dtype, device, generator, monkeypatch):
    """One step whose h0 and c0 do not require grad: C is given no d_h0 or
    d_c0. On a GPU at a size past LLTM_STEP_MULTIPLY_ADDS (src/plan.c),
    which the general paths take (cuBLAS's, or with LLTM_CUBLAS=0 the
    step-by-step kernels)."""
    if kernels == "own":
        if device.type == "cpu":
            pytest.skip("LLTM_CUBLAS=0 changes nothing on the CPU")
        monkeypatch.setenv("LLTM_CUBLAS", "0")
    shape = (1, 1100, 256, 512) if device.type == "cuda" else (1, 5, 4, 7)
    if device.type == "cuda":
        assert not cell.uses_step_kernels(*shape[1:], dtype)
    arguments = random_arguments(shape, dtype, device, generator)
    grad = torch.randn(shape[0], shape[1], shape[3], generator=generator, dtype=dtype).to(device)
    got, expected = [], []
    for function, results, cast in ((lltm_ffi.lltm_sequence, got, dtype),
                                    (reference_sequence, expected, torch.float64)):
        leaves = [argument.detach().to(cast).requires_grad_(index < 3)
                  for index, argument in enumerate(arguments)]
        outputs, _ = function(*leaves)
        outputs.backward(grad.to(cast))
        results += [outputs] + [leaf.grad for leaf in leaves]
    assert got[4] is None and got[5] is None
    for name, value, reference in zip(("outputs", "d_inputs", "d_weights", "d_bias"),
                                      got[:4], expected[:4]):
        error = ((value.double() - reference).norm() / reference.norm()).item()
        assert error <= TOLERANCES[dtype], f"{name}: relative error {error:.3g}"


def test_backward_of_several_steps_needs_the_state_gradients(device):
    """d_h0 and d_c0 carry the gradients from step to step: the C backward
    pass refuses to go without them, before reading anything."""
    extension = lltm_ffi._extension
    lib = extension.lib
    stream = torch.cuda.current_stream().cuda_stream if device.type == "cuda" else 0
    code = lib.lltm_run(extension.PASSES["packed_backward"][0], lib.LLTM_FLOAT32,
                        lib.LLTM_CPU if device.type == "cpu" else torch.cuda.current_device(),
                        stream, [2, 2, 1, 1, 1, 0, 1] + [0] * 4, [], [0] * 21)
    assert code == lib.LLTM_ERROR_ARGUMENTS
    assert "cannot take" in extension.error_message(code)


def test_passes_on_the_same_tensors_again_read_what_they_hold_now(cuda_device, generator):
    """A pass that comes again with the same sizes and tensors is replayed
    from a recorded CUDA graph (the cuBLAS path): each replay must compute
    from the values the tensors hold at that time."""
    shape = (4, 33, 7, 520)
    arguments = random_arguments(shape, torch.float32, cuda_device, generator)
    for _ in range(4):
        fresh = random_arguments(shape, torch.float32, "cpu", generator)
        for argument, values in zip(arguments, fresh):
            argument.copy_(values)
        outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(*arguments)
        expected, (h, c) = python_loop(*[values.double() for values in fresh])
        for value, reference in ((outputs, expected), (c_n, c)):
            error = ((value.cpu().double() - reference).norm() / reference.norm()).item()
            assert error <= TOLERANCES[torch.float32], error


# The output gradients' layouts the C passes read through their strides:
# what .sum() hands over (a broadcast scalar), a transposed and a strided
# view, and torch's lazy negation.
GRADIENT_LAYOUTS = {
    "broadcast": lambda grad: grad.new_ones(()).expand_as(grad),
    "transposed": lambda grad: grad.permute(2, 1, 0).contiguous().permute(2, 1, 0),
    "every_other": lambda grad: torch.stack((grad, grad), dim=-1)[..., 0],
    "negative_bit": lambda grad: torch._neg_view(-grad),
}


@pytest.mark.parametrize("layout", GRADIENT_LAYOUTS)
@pytest.mark.parametrize("shape", [(5, 3, 4, 7), (2, 130, 4, 130)], ids=shape_id)
@pytest.mark.parametrize("kernels", ["default", "own"])
def test_output_gradients_are_read_in_any_layout(layout, shape, kernels, dtype, device,
                                                 generator, monkeypatch):
    if kernels == "own":
        if device.type != "cuda":
            pytest.skip("LLTM_CUBLAS=0 changes nothing on the CPU")
        monkeypatch.setenv("LLTM_CUBLAS", "0")
    arguments = random_arguments(shape, dtype, device, generator)
    steps, batch_size, _, state_size = shape
    grads = [GRADIENT_LAYOUTS[layout](torch.randn(steps, batch_size, state_size,
                                                  generator=generator, dtype=dtype).to(device))
             for _ in range(2)]

    def grads_of(function):
        leaves = [argument.detach().clone().requires_grad_(True) for argument in arguments]
        outputs, (h_n, c_n) = function(*leaves)
        # The cells of every step are what SequenceFunction returns; c_n's
        # gradient reaches them as the last step's.
        torch.autograd.backward((outputs, h_n, c_n), (grads[0], grads[1][-1], grads[1][0]))
        return [leaf.grad for leaf in leaves]

    for name, value, reference in zip(NAMES[3:], grads_of(lltm_ffi.lltm_sequence),
                                      grads_of(python_loop)):
        error = ((value - reference).norm() / reference.norm()).item()
        assert error <= TOLERANCES[dtype], f"{name}: relative error {error:.3g}"
    # The backward operator takes both gradients as they come, as rows
    # (steps * batch, state): the same results as from dense copies of them.
    inputs, weights, bias, h0, c0 = arguments
    inputs = inputs.reshape(steps * batch_size, -1)
    outputs, cells, gates, _, _ = torch.ops.lltm_ffi.packed_forward(
        inputs, weights, bias, h0, c0, None, False)
    rows = [grad.reshape(steps * batch_size, state_size) for grad in grads]
    saved = (inputs, weights, bias, h0, None, False, outputs, cells, gates)
    got = torch.ops.lltm_ffi.packed_backward(*saved, *rows, None, None)
    expected = torch.ops.lltm_ffi.packed_backward(
        *saved, *(grad.resolve_neg().contiguous() for grad in rows), None, None)
    for name, value, reference in zip(NAMES[3:], got, expected):
        error = ((value - reference).norm() / reference.norm()).item()
        assert error <= TOLERANCES[dtype], f"{name}: relative error {error:.3g}"


@pytest.fixture
def tf32():
    """TF32 allowed for torch's float32 matrix products (and so for lltm_sequence's)."""
    allowed = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.backends.cuda.matmul.allow_tf32 = allowed


@pytest.mark.parametrize("shape", [(1, 16, 32, 128)] + BY_STEP_SHAPES, ids=shape_id)
def test_agrees_with_a_loop_of_the_cell_under_tf32(shape, cuda_device, generator, tf32):
    assert_agrees_with_a_loop_of_the_cell(shape, torch.float32, cuda_device, generator,
                                          TF32_TOLERANCE)


def test_gradcheck(device, generator):
    arguments = [argument.requires_grad_(True) for argument in
                 random_arguments((4, 2, 3, 5), torch.float64, device, generator)]

    def flat(*arguments):
        outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(*arguments)
        return outputs, h_n, c_n

    assert torch.autograd.gradcheck(flat, arguments)


def test_dense_training_graph_is_the_pass_alone(device, generator):
    """A dense call's outputs come straight from the packed pass's node,
    whose inputs lead to the leaves' own AccumulateGrad: no view nodes
    around it, whose backward each training step would run."""
    arguments = [argument.requires_grad_(True) for argument in
                 random_arguments((5, 3, 4, 7), torch.float32, device, generator)]
    outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(*arguments)
    assert outputs.shape == (5, 3, 7)
    assert outputs.grad_fn is h_n.grad_fn is c_n.grad_fn
    assert outputs.grad_fn.name() == "packed_forward_functionBackward"
    leaves = [edge[0] for edge in outputs.grad_fn.next_functions[:5]]
    assert [node.variable for node in leaves] == arguments


def test_zero_steps_give_empty_outputs_and_the_initial_state(device, generator):
    inputs, weights, bias, h0, c0 = random_arguments((0, 3, 4, 5), torch.float32, device,
                                                     generator)
    outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(inputs, weights, bias, h0, c0)
    assert outputs.shape == (0, 3, 5)
    assert h_n is h0 and c_n is c0


def test_inputs_without_features_agree_with_a_loop_of_the_cell(device, generator):
    # Gates that read the state alone: inputs (steps, batch, 0), in
    # inference (the forward alone) and in training.
    arguments = random_arguments((3, 2, 0, 4), torch.float64, device, generator)
    expected, (h, c) = python_loop(*arguments)
    with torch.no_grad():
        outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(*arguments)
    torch.testing.assert_close((outputs, h_n, c_n), (expected, h, c))
    leaves = [argument.clone().requires_grad_(True) for argument in arguments]
    outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(*leaves)
    torch.testing.assert_close((outputs, h_n, c_n), (expected, h, c))
    outputs.sum().backward()
    assert leaves[0].grad.shape == (3, 2, 0)


@pytest.mark.parametrize("shape", [(3, 2, 4, 5), (2, 3, 0, 4)], ids=shape_id)
def test_operators_pass_opcheck(shape, device, generator):
    arguments = random_arguments(shape, torch.float64, device, generator)
    # A dense sequence's rows (steps * batch, features), batch_sizes None.
    rows = arguments[0].reshape(shape[0] * shape[1], shape[2])
    opcheck(torch.ops.lltm_ffi.packed_forward.default,
            [argument.requires_grad_(True) for argument in (rows, *arguments[1:])]
            + [None, False])
    inputs, weights, bias, h0, c0 = (argument.detach() for argument in (rows, *arguments[1:]))
    outputs, cells, gates, _, _ = torch.ops.lltm_ffi.packed_forward(inputs, weights, bias, h0, c0,
                                                                    None, False)
    opcheck(torch.ops.lltm_ffi.packed_backward.default,
            (inputs, weights, bias, h0, None, False, outputs, cells, gates,
             torch.randn_like(outputs), torch.randn_like(cells), torch.randn_like(h0),
             torch.randn_like(c0)))


@pytest.mark.slow
def test_compile_fullgraph_matches_eager(device, generator):
    arguments = random_arguments((6, 3, 4, 8), torch.float32, device, generator)
    module = lltm_ffi.LLTMSequence(4, 8).to(device)

    def loss(inputs):
        outputs, (h_n, c_n) = module(inputs)
        return outputs.square().mean() + c_n.sum()

    eager = loss(arguments[0])
    eager_grads = torch.autograd.grad(eager, list(module.parameters()))
    compiled = torch.compile(loss, fullgraph=True)(arguments[0])
    compiled_grads = torch.autograd.grad(compiled, list(module.parameters()))
    torch.testing.assert_close(compiled, eager)
    for value, reference in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(value, reference)


def test_module_state_dict_is_interchangeable_with_the_cell(generator):
    cell = lltm_ffi.LLTM(4, 6)
    sequence = lltm_ffi.LLTMSequence(4, 6, batch_first=True)
    sequence.load_state_dict(cell.state_dict())
    inputs = torch.randn(3, 5, 4, generator=generator)
    outputs, (h_n, c_n) = sequence(inputs)
    zeros = torch.zeros(3, 6)
    expected, (h, c) = python_loop(inputs.transpose(0, 1), cell.weights, cell.bias, zeros, zeros)
    torch.testing.assert_close(outputs, expected.transpose(0, 1))
    torch.testing.assert_close((h_n, c_n), (h.unsqueeze(0), c.unsqueeze(0)))
    cell.load_state_dict(sequence.state_dict())


def test_training_on_a_sequence_task_lowers_the_loss():
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    model = lltm_ffi.LLTMSequence(3, 16)
    readout = torch.nn.Linear(16, 1)
    optimizer = torch.optim.Adam([*model.parameters(), *readout.parameters()], lr=1e-2)
    losses = []
    for _ in range(150):
        inputs = torch.randn(10, 32, 3, generator=generator)
        target = torch.tanh(inputs[:, :, 0].sum(dim=0) / 10 ** 0.5)
        outputs, _ = model(inputs)
        loss = torch.nn.functional.mse_loss(readout(outputs[-1]).squeeze(1), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-10:]) < 0.2 * sum(losses[:10]), (losses[:10], losses[-10:])


@pytest.mark.parametrize("index, value, exception, fragments", [
    (0, lambda a: a[0][0], ValueError, ("inputs must have 3 dimensions",)),
    (0, lambda a: a[0].int(), TypeError, ("inputs has dtype torch.int32",)),
    (1, lambda a: a[1][:, 1:], ValueError, ("weights has shape",)),
    (2, lambda a: a[2][1:], ValueError, ("bias has shape",)),
    (3, lambda a: a[3][1:], ValueError, ("h0 has shape (1, 5) but inputs has shape",)),
    (4, lambda a: a[4][:, 1:], ValueError, ("c0 has shape (2, 4) but h0 has shape (2, 5)",)),
    (4, lambda a: a[4].double(), TypeError, ("c0 has dtype torch.float64", "inputs has")),
    (4, lambda a: a[4].to("meta"), ValueError, ("c0 is on meta",)),
    (1, lambda a: None, TypeError, ("weights must be a torch.Tensor",)),
])
def test_bad_arguments_are_refused_naming_them(index, value, exception, fragments, generator):
    arguments = random_arguments((3, 2, 4, 5), torch.float32, "cpu", generator)
    arguments[index] = value(arguments)
    with raises_with(exception, "lltm_sequence", *fragments):
        lltm_ffi.lltm_sequence(*arguments)


# Each GPU path: the step kernels (one step), the persistent kernels, cuBLAS's
# products (run, then recorded, then replayed: three calls), and with
# LLTM_CUBLAS=0 the step-by-step kernels. On compute capability 9.0 and newer
# the cluster kernels (LLTM_CLUSTER unset) take 5x3x4x9, and 5x16x8x128: a
# state of 128, held by a cluster of several blocks.
DEVICE_PATHS = [((1, 16, 32, 128), "1"), ((5, 3, 4, 9), "1"), ((5, 16, 8, 128), "1"),
                ((5, 33, 7, 520), "1"), ((5, 33, 7, 520), "0")]


@pytest.mark.gpu
@pytest.mark.parametrize("index", [pytest.param(0, id="first_gpu"),
                                   pytest.param(1, id="second_gpu", marks=pytest.mark.multi_gpu)])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("shape, cublas", DEVICE_PATHS,
                         ids=[f"{shape_id(shape)}-LLTM_CUBLAS={cublas}"
                              for shape, cublas in DEVICE_PATHS])
def test_runs_on_the_tensors_device_and_stream(index, reverse, shape, cublas, generator,
                                               monkeypatch):
    """Three calls on cuda:`index`'s current stream, a side stream that fills
    the arguments after a long delay, while cuda:0 is the current device: a
    launch on another stream reads NaNs, one on another device fails or reads
    another GPU's memory. (A kernel's first launch in a process can wait for
    the device, its module loaded then, and hide a wrong stream: hence more
    than one call.) Either direction."""
    skip_without_gpu()
    if torch.cuda.device_count() <= index:
        pytest.skip(f"needs {index + 1} GPUs, torch sees {torch.cuda.device_count()}")
    monkeypatch.setenv("LLTM_CUBLAS", cublas)
    monkeypatch.delenv("LLTM_CLUSTER", raising=False)
    device = torch.device("cuda", index)
    steps, batch_size, _, state_size = shape
    arguments = random_arguments(shape, torch.float64, "cpu", generator)
    grads = [torch.randn(size, generator=generator, dtype=torch.float64)
             for size in ((steps, batch_size, state_size), (batch_size, state_size),
                          (batch_size, state_size))]
    expected = results(functools.partial(python_loop, reverse=reverse), arguments, grads)
    on_device = [tensor.to(device) for tensor in arguments + grads]
    side = torch.cuda.Stream(device)
    buffers, calls = [], []
    for _ in range(3):
        side.wait_stream(torch.cuda.current_stream(device))
        buffers.append(slow_stream_inputs(side, on_device))  # kept until side is done
        # torch.cuda.stream makes the side stream's device current; the inner
        # torch.cuda.device(0) makes cuda:0 current again, leaving the side
        # stream current on cuda:`index`.
        with torch.cuda.stream(side), torch.cuda.device(0):
            leaves = [buffer.requires_grad_(True) for buffer in buffers[-1][:5]]
            outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(*leaves, reverse=reverse)
            torch.autograd.backward((outputs, h_n, c_n), buffers[-1][5:])
            calls.append([outputs, h_n, c_n] + [leaf.grad for leaf in leaves])
            assert torch.cuda.current_device() == 0
    side.synchronize()
    for call, actual in enumerate(calls):
        for name, value, reference in zip(NAMES, actual, expected):
            assert value.device == device, f"call {call}: {name} is on {value.device}"
            error = ((value.cpu() - reference).norm() / reference.norm()).item()
            assert error <= TOLERANCES[torch.float64], f"call {call}: {name}: {error:.3g}"


# One direction: the persistent kernels (the cluster kernels on 9.0 and
# newer), then cuBLAS's products; both directions of a layer at once: the
# cluster kernels a batch row a cluster, and (a state of 256, 48 rows) 4 rows
# a cluster; a state of 37 padded to 40 (LLTM_PAD=1), its copies captured
# with the passes.
@pytest.mark.parametrize("shape, bidirectional, pad",
                         [((6, 8, 4, 16), False, None), ((3, 40, 4, 420), False, None),
                          ((6, 16, 32, 128), True, None), ((4, 48, 5, 256), True, None),
                          ((5, 3, 7, 37), True, "1")],
                         ids=["6x8x4x16", "3x40x4x420", "6x16x32x128-bidirectional",
                              "4x48x5x256-bidirectional", "5x3x7x37-bidirectional-padded"])
def test_cuda_graph_capture_of_a_training_step(shape, bidirectional, pad, cuda_device, generator,
                                               monkeypatch):
    set_or_unset(monkeypatch, "LLTM_PAD", pad)
    steps, batch_size, input_features, state_size = shape
    module = lltm_ffi.LLTMSequence(input_features, state_size,
                                   bidirectional=bidirectional).to(cuda_device)
    inputs = torch.randn(steps, batch_size, input_features, generator=generator).to(cuda_device)

    def step():
        outputs, _ = module(inputs)
        outputs.square().mean().backward()

    side = torch.cuda.Stream(cuda_device)
    side.wait_stream(torch.cuda.current_stream(cuda_device))
    with torch.cuda.stream(side):
        for _ in range(3):
            module.zero_grad(set_to_none=False)
            step()
    torch.cuda.current_stream(cuda_device).wait_stream(side)
    expected = [parameter.grad.clone() for parameter in module.parameters()]
    graph = torch.cuda.CUDAGraph()
    module.zero_grad(set_to_none=False)
    with torch.cuda.graph(graph):
        step()
    for parameter in module.parameters():
        parameter.grad.zero_()
    graph.replay()
    torch.cuda.synchronize(cuda_device)
    for parameter, reference in zip(module.parameters(), expected):
        torch.testing.assert_close(parameter.grad, reference)


def test_capture_before_any_call_on_the_device_is_refused_clearly(cuda_device):
    """cuBLAS's handle cannot be made during a capture: a fresh process that
    captures before any sequence ran on the device gets LLTMError saying so."""
    child = textwrap.dedent("""
        import torch
        import lltm_ffi
        arguments = [torch.randn(*size, device="cuda")
                     for size in ((2, 40, 4), (1260, 424), (1260,), (40, 420), (40, 420))]
        torch.mm(arguments[3], arguments[3].t())  # torch's own handle, made outside
        torch.cuda.synchronize()
        try:
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                lltm_ffi.lltm_sequence(*arguments)
        except lltm_ffi.LLTMError as error:
            print("refused:", error)
    """)
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                            timeout=300, cwd=REPO_ROOT)
    assert "refused: packed_forward failed" in result.stdout and "before capturing" in result.stdout, (
        result.stdout + result.stderr)
