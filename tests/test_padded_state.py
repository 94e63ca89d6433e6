"""The sequence's state padded to rows of whole 16 bytes or to whole tiles
(src/plan.c's lltm_sequence_state; each pass pads, runs and cuts back in C,
include/lltm_padding.h): where the plan pads, which sizes it pads to, and
that a padded call gives the results and gradients of the unpadded one, to
any order, dense and packed, either direction, with each form of bias and
of output gradient. LLTM_PAD=1 pads on the CPU too, so that the padding's
copies are checked here without a GPU; the GPU's padded paths are also
walked by test_paths.py's table test, padded and not."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.utils.rnn import pack_padded_sequence

import lltm_ffi
from lltm_ffi.ops.lltm import plan
from lltm_ffi.testing import compiled_capability

from conftest import set_or_unset

# The state whose rows are whole 16 bytes, by dtype, for a state of 37.
PADDED_37 = {torch.float64: 38, torch.float32: 40, torch.float16: 40, torch.bfloat16: 40}


def _state(dtype, state_size, device="cpu", steps=4, batch_size=3, packed=False,
           backward=False):
    return plan.sequence_state(dtype, torch.device(device), backward, steps, batch_size,
                               state_size, packed, plan.sequence_options("test"))


@pytest.mark.parametrize("dtype", list(PADDED_37), ids=str)
def test_lltm_pad_1_pads_to_whole_16_byte_rows_and_0_never(dtype, monkeypatch):
    monkeypatch.setenv("LLTM_PAD", "1")
    assert _state(dtype, 37) == PADDED_37[dtype]
    assert _state(dtype, 1) == 16 // dtype.itemsize
    assert _state(dtype, 40) == 40  # whole 16-byte rows already
    monkeypatch.setenv("LLTM_PAD", "0")
    assert _state(dtype, 37) == 37


@pytest.mark.parametrize("setting", [None, "0", "1"])
def test_python_answers_whole_tiles_as_c_does(setting, monkeypatch):
    """plan.sequence_state answers a state of whole tiles, a CPU call but
    under LLTM_PAD=1, or LLTM_PAD=0 without asking C; C's own answer is
    the same."""
    set_or_unset(monkeypatch, "LLTM_PAD", setting)
    options = plan.sequence_options("test")
    tile = plan.lib.LLTM_PAD_TILE
    for dtype in PADDED_37:
        for state_size in (*range(0, 18), tile - 1, tile, tile + 1, 2 * tile):
            asked = plan.lib.lltm_sequence_state(plan._extension._DTYPE_CODES[dtype],
                                                 plan.lib.LLTM_CPU, 0, 4, 3, state_size, 0,
                                                 options)
            assert _state(dtype, state_size) == asked, (dtype, state_size)


@pytest.mark.parametrize("setting", [None, "", "2"])
def test_the_plan_pads_no_state_on_the_cpu(setting, monkeypatch):
    set_or_unset(monkeypatch, "LLTM_PAD", setting)
    assert _state(torch.bfloat16, 650, steps=64, batch_size=16) == 650
    assert _state(torch.float32, 37, packed=True) == 37


def _leaves(steps, batch_size, features, state, bias_shape, generator):
    tensors = [torch.randn(steps, batch_size, features, generator=generator, dtype=torch.float64),
               torch.randn(3 * state, state + features, generator=generator,
                           dtype=torch.float64) / state ** 0.5,
               None if bias_shape is None else torch.randn(
                   *bias_shape(state), generator=generator, dtype=torch.float64),
               torch.randn(batch_size, state, generator=generator, dtype=torch.float64),
               torch.randn(batch_size, state, generator=generator, dtype=torch.float64)]
    return [None if tensor is None else tensor.requires_grad_(True) for tensor in tensors]


def _results_and_gradients(leaves, packed, reverse, grads):
    inputs, *rest = leaves
    if packed:
        lengths = [inputs.shape[0] - index for index in range(inputs.shape[1])]
        inputs = pack_padded_sequence(inputs, lengths)
    outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(inputs, *rest, reverse=reverse)
    if packed:
        outputs = outputs.data
    results = (outputs, h_n, c_n)
    loss = sum((result * grads(result)).sum() for result in results)
    wanted = [leaf for leaf in leaves if leaf is not None]
    return [*results, *torch.autograd.grad(loss, wanted)]


BIASES = {"no-bias": None, "bias": lambda state: (3 * state,),
          "bias-row": lambda state: (1, 3 * state)}


@pytest.mark.parametrize("bias", list(BIASES))
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("shape", [(1, 1, 3, 5), (6, 3, 4, 7), (4, 2, 5, 9)],
                         ids=lambda shape: "x".join(map(str, shape)))
def test_a_padded_call_gives_the_unpadded_results(shape, reverse, packed, bias, generator,
                                                  monkeypatch):
    leaves = _leaves(*shape, BIASES[bias], generator)
    weights = torch.linspace(-1, 1, 4096, dtype=torch.float64)

    def grads(result):  # fixed, different for every element
        return weights[:result.numel()].view_as(result)

    monkeypatch.setenv("LLTM_PAD", "0")
    expected = _results_and_gradients(leaves, packed, reverse, grads)
    monkeypatch.setenv("LLTM_PAD", "1")
    got = _results_and_gradients(leaves, packed, reverse, grads)
    for value, wanted in zip(got, expected, strict=True):
        assert value.shape == wanted.shape and value.is_contiguous()
        torch.testing.assert_close(value, wanted, rtol=1e-12, atol=1e-12)


def _padded_to(monkeypatch, state):
    """Every eager call from here on run at `state` (the plan's answer
    replaced): a padding past one 16-byte row, as the plan's to whole
    tiles is."""
    monkeypatch.setattr(plan, "sequence_state", lambda *arguments: state)


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_a_call_padded_past_one_row_gives_the_unpadded_results(reverse, packed, generator,
                                                               monkeypatch):
    leaves = _leaves(6, 3, 4, 7, BIASES["bias"], generator)
    weights = torch.linspace(-1, 1, 4096, dtype=torch.float64)

    def grads(result):
        return weights[:result.numel()].view_as(result)

    expected = _results_and_gradients(leaves, packed, reverse, grads)
    _padded_to(monkeypatch, 23)
    got = _results_and_gradients(leaves, packed, reverse, grads)
    for value, wanted in zip(got, expected, strict=True):
        torch.testing.assert_close(value, wanted, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bias", ["bias", "bias-row"])
def test_a_padded_call_of_strided_arguments_gives_the_unpadded_results(bias, generator,
                                                                       monkeypatch):
    """Weights, bias and states that are views with strides of their own
    (transposed, every other element) pad as dense ones do."""
    steps, batch_size, features, state = 3, 2, 5, 7
    contiguous = _leaves(steps, batch_size, features, state, BIASES[bias], generator)
    strided = [contiguous[0],
               contiguous[1].detach().t().contiguous().t().requires_grad_(),
               contiguous[2].detach().repeat_interleave(2, dim=-1)[..., ::2].requires_grad_(),
               *(leaf.detach().t().contiguous().t().requires_grad_()
                 for leaf in contiguous[3:])]
    assert not any(leaf.is_contiguous() for leaf in strided[1:])

    def grads(result):
        return torch.ones_like(result)

    monkeypatch.setenv("LLTM_PAD", "0")
    expected = _results_and_gradients(contiguous, False, False, grads)
    monkeypatch.setenv("LLTM_PAD", "1")
    got = _results_and_gradients(strided, False, False, grads)
    for value, wanted in zip(got, expected, strict=True):
        torch.testing.assert_close(value, wanted, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("grad", ["expanded", "every-other-column", "transposed"])
def test_a_padded_backward_takes_output_gradients_of_any_strides(grad, generator, monkeypatch):
    """The backward pass copies the output gradients in through their
    strides: expanded ones (a sum's), every other column, steps and rows
    transposed."""
    leaves = _leaves(4, 3, 5, 7, BIASES["bias"], generator)
    shape = (4, 3, 7)
    given = torch.randn(*shape, 2, generator=generator, dtype=torch.float64)
    strided = {"expanded": torch.ones((), dtype=torch.float64).expand(shape),
               "every-other-column": given.flatten(-2)[..., ::2],
               "transposed": given[..., 0].transpose(0, 1).contiguous().transpose(0, 1)}[grad]
    assert not strided.is_contiguous()
    results = []
    for setting in ("0", "1"):
        monkeypatch.setenv("LLTM_PAD", setting)
        outputs, _ = lltm_ffi.lltm_sequence(*leaves)
        wanted = [leaf for leaf in leaves if leaf is not None]
        results.append(torch.autograd.grad(outputs, wanted, strided))
    for value, wanted in zip(*results, strict=True):
        torch.testing.assert_close(value, wanted, rtol=1e-12, atol=1e-12)


def test_the_workspace_is_asked_only_of_a_padded_pass():
    """C asks no workspace of a pass at its own state, and room for each
    padded copy of a padded one, where the cells and gates it keeps for a
    backward are not: they are given at the padded state."""
    forward, saved = plan.lib.LLTM_PASS_FORWARD, plan.lib.LLTM_PASS_FORWARD_SAVED
    sizes = (12, 4, 3, 5, 7, 0, 7)  # rows, steps, batch, features, state, reverse, padded
    assert plan.sequence_workspace(forward, torch.float32, sizes, 0b11111111111) == 0
    padded = (*sizes[:-1], 8)
    every = 0b11111111111  # all of packed_forward's tensors but its staging
    without_cells = every & ~(1 << 7)
    alone = plan.sequence_workspace(forward, torch.float32, padded, without_cells)
    kept = plan.sequence_workspace(saved, torch.float32, padded, every)
    # Whole 512-byte chunks (128 float32) a tensor: the inputs (their 5
    # features padded to 8) 1, weights 3, bias 1, h0 and c0 1 each, outputs
    # 1, h_n and c_n 1 each; and where it keeps none, its gates 3.
    assert alone == 128 * 13 and kept == 128 * 10


@pytest.mark.parametrize("padded_state", [4, 0], ids=["no-workspace", "below-the-state"])
def test_a_pass_refuses_a_padded_state_it_cannot_run_at(padded_state):
    """C refuses, before reading a tensor, a padded state without the
    workspace its copies need, or below the state (every tensor NULL)."""
    extension = lltm_ffi._extension
    lib = extension.lib
    for name, sizes, count in (("packed_forward", [2, 2, 1, 1, 1, 0, padded_state], 14),
                               ("packed_backward", [2, 2, 1, 1, 1, 0, padded_state, 1, 1, 1, 1],
                                21)):
        code = lib.lltm_run(extension.PASSES[name][0], lib.LLTM_FLOAT32, lib.LLTM_CPU, 0, sizes,
                            [], [0] * count)
        assert code == lib.LLTM_ERROR_ARGUMENTS, name


def test_traced_calls_run_at_the_state_as_given(generator, monkeypatch):
    """A traced call reaches C through the registered operators, whose
    results' shapes are known before it runs: it runs at the state as given
    where LLTM_PAD=1 pads an eager call, and gives the same results."""
    monkeypatch.setenv("LLTM_PAD", "1")
    leaves = _leaves(4, 3, 5, 7, BIASES["bias"], generator)

    def step(*tensors):
        outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(*tensors)
        loss = outputs.sum() + 2 * h_n.sum() + 3 * c_n.sum()
        return outputs, h_n, c_n, *torch.autograd.grad(loss, tensors)

    traced = make_fx(step, tracing_mode="fake")(*leaves)
    assert "lltm_ffi.packed_forward" in traced.code

    class ShapesAsTraced(torch.fx.Interpreter):
        def run_node(self, node):
            result = super().run_node(node)
            if str(node.target).startswith("lltm_ffi."):
                for value, traced_value in zip(result, node.meta["val"], strict=True):
                    if isinstance(value, torch.Tensor):
                        assert value.shape == traced_value.shape, node.target
            return result

    got = ShapesAsTraced(traced).run(*leaves)
    for value, wanted in zip(got, step(*leaves), strict=True):
        torch.testing.assert_close(value, wanted, rtol=1e-12, atol=1e-12)


def test_a_padded_call_passes_gradcheck_and_gradgradcheck(generator, monkeypatch):
    monkeypatch.setenv("LLTM_PAD", "1")
    leaves = _leaves(2, 2, 2, 3, BIASES["bias"], generator)

    def flat(*tensors):
        outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(*tensors)
        return outputs, h_n, c_n

    assert torch.autograd.gradcheck(flat, leaves)
    assert torch.autograd.gradgradcheck(flat, leaves, fast_mode=True)


def test_a_padded_forward_alone_gives_the_unpadded_outputs(generator, monkeypatch):
    leaves = [leaf.detach() for leaf in _leaves(5, 3, 4, 7, BIASES["bias"], generator)]
    with torch.inference_mode():
        monkeypatch.setenv("LLTM_PAD", "0")
        outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(*leaves)
        monkeypatch.setenv("LLTM_PAD", "1")
        padded, (padded_h_n, padded_c_n) = lltm_ffi.lltm_sequence(*leaves)
    for value, wanted in ((padded, outputs), (padded_h_n, h_n), (padded_c_n, c_n)):
        torch.testing.assert_close(value, wanted, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
def test_the_plan_pads_where_the_persistent_and_cublas_rows_run(cuda_device, monkeypatch):
    monkeypatch.delenv("LLTM_PAD", raising=False)
    monkeypatch.delenv("LLTM_PATH", raising=False)
    if compiled_capability(cuda_device) < (8, 0):
        pytest.skip("the persistent kernels' 16-bit types need compute capability 8.0")
    # bfloat16 rows of 650 elements are 1,300 bytes: padded to 656, on a
    # long sequence (a short one's call would spend more on the padding)
    # whose backward takes the persistent row; a forward alone stays as
    # given where the cluster row's tensor-core kernel takes it (compute
    # capability 9.0), which takes any state alike. float32 rows of 650
    # are 2,600 bytes: padded to 652, their forward on the persistent row.
    clusters = compiled_capability(cuda_device) >= (9, 0)
    assert _state(torch.bfloat16, 650, cuda_device, steps=1024, batch_size=16,
                  backward=True) == 656
    assert _state(torch.bfloat16, 650, cuda_device, steps=1024,
                  batch_size=16) == (650 if clusters else 656)
    assert _state(torch.float32, 650, cuda_device, steps=1024, batch_size=16) == 652
    assert _state(torch.bfloat16, 656, cuda_device, steps=1024, batch_size=16) == 656
    assert _state(torch.bfloat16, 650, cuda_device, steps=64, batch_size=16) == 650
    # The cuBLAS loop with large products, at any steps and batch: a 16-bit
    # state of at least 1024 padded to whole tiles, aligned or not.
    assert _state(torch.bfloat16, 1500, cuda_device, steps=1024, batch_size=64) == 1536
    assert _state(torch.bfloat16, 1500, cuda_device, steps=64, batch_size=16) == 1536
    assert _state(torch.float16, 1500, cuda_device, steps=64, batch_size=64) == 1536
    assert _state(torch.bfloat16, 1500, cuda_device, steps=64, batch_size=1) == 1536
    assert _state(torch.bfloat16, 1096, cuda_device, steps=64, batch_size=64) == 1152
    assert _state(torch.float32, 1501, cuda_device, steps=64, batch_size=64) == 1501
    # A 16-bit state off 16 bytes where a pass takes the cuBLAS loop, at any
    # steps: the forward (64 rows of 1018), the backward (64 rows of 500,
    # whose forward alone the cluster row takes), packed steps.
    assert _state(torch.bfloat16, 1018, cuda_device, steps=64, batch_size=64) == 1024
    assert _state(torch.bfloat16, 500, cuda_device, steps=64, batch_size=64,
                  backward=True) == 504
    if clusters:
        assert _state(torch.bfloat16, 500, cuda_device, steps=64, batch_size=64) == 500
    assert _state(torch.bfloat16, 100, cuda_device, steps=64, batch_size=64,
                  packed=True) == 104
    # Packed float32 steps of up to 16 rows past a state of 128, which as
    # given take the step kernels, padded to whole tiles for the cuBLAS loop.
    assert _state(torch.float32, 200, cuda_device, steps=64, batch_size=16, packed=True) == 256
    assert _state(torch.float32, 200, cuda_device, steps=64, batch_size=64, packed=True) == 200
    assert _state(torch.float32, 100, cuda_device, steps=64, batch_size=16, packed=True) == 100
    assert _state(torch.float32, 200, cuda_device, steps=64, batch_size=16) == 200
    monkeypatch.setenv("LLTM_PAD", "0")
    assert _state(torch.bfloat16, 650, cuda_device, steps=1024, batch_size=16) == 650
    monkeypatch.delenv("LLTM_PAD")
    # The step-by-step kernels' rows are not padded.
    monkeypatch.setenv("LLTM_PATH", "steps")
    assert _state(torch.bfloat16, 650, cuda_device, steps=1024, batch_size=16) == 650


@pytest.mark.gpu
@pytest.mark.parametrize("padding", ["row", "past-one-row"])
@pytest.mark.parametrize("path", ["persistent", "cublas"])
def test_a_padded_gpu_call_gives_the_unpadded_results(path, padding, cuda_device, generator,
                                                      monkeypatch):
    leaves = [leaf.detach().to(cuda_device).requires_grad_(True)
              for leaf in _leaves(6, 3, 4, 7, BIASES["bias"], generator)]
    weights = torch.linspace(-1, 1, 4096, dtype=torch.float64, device=cuda_device)

    def grads(result):
        return weights[:result.numel()].view_as(result)

    monkeypatch.setenv("LLTM_PATH", path)
    monkeypatch.setenv("LLTM_PAD", "0")
    expected = _results_and_gradients(leaves, False, False, grads)
    monkeypatch.setenv("LLTM_PAD", "1")
    assert _state(torch.float64, 7, cuda_device, steps=6, batch_size=3) == 8
    if padding == "past-one-row":
        _padded_to(monkeypatch, 23)
    got = _results_and_gradients(leaves, False, False, grads)
    for value, wanted in zip(got, expected, strict=True):
        torch.testing.assert_close(value, wanted, rtol=1e-12, atol=1e-12)


# (dtype, state) whose padded copies move in each width of word the copy
# kernel takes (16, 8, 4 bytes and one element), with 8 features, the
# state padded to 24: rows of 8 float64 and 8 float32 are whole 16 bytes,
# 6 float32 and 12 bfloat16 whole 8, 6 bfloat16 whole 4; 7 are none.
WORD_CASES = [(torch.float64, 8), (torch.float64, 7), (torch.float32, 8), (torch.float32, 6),
              (torch.float32, 7), (torch.bfloat16, 8), (torch.bfloat16, 12),
              (torch.bfloat16, 6), (torch.bfloat16, 7)]
WORD_TOLERANCES = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, state", WORD_CASES, ids=lambda value: str(value))
def test_a_padded_gpu_call_copies_in_words_of_every_width(dtype, state, cuda_device, generator,
                                                         monkeypatch):
    """The GPU's padded copies move whole words of up to 16 bytes where the
    rows allow: each width gives the unpadded call's results (the cuBLAS
    loop both ways; the same products at another state, so float32 and
    bfloat16 within their roundoff at the results' scale)."""
    leaves = [leaf.detach().to(cuda_device, dtype).requires_grad_(True)
              for leaf in _leaves(5, 3, 8, state, BIASES["bias"], generator)]
    weights = torch.linspace(-1, 1, 4096, dtype=dtype, device=cuda_device)

    def grads(result):
        return weights[:result.numel()].view_as(result)

    monkeypatch.setenv("LLTM_PATH", "cublas")
    monkeypatch.setenv("LLTM_PAD", "0")
    expected = _results_and_gradients(leaves, False, False, grads)
    _padded_to(monkeypatch, 24)
    got = _results_and_gradients(leaves, False, False, grads)
    tolerance = WORD_TOLERANCES[dtype]
    for value, wanted in zip(got, expected, strict=True):
        scale = max(1.0, float(wanted.abs().max()))
        torch.testing.assert_close(value, wanted, rtol=tolerance, atol=tolerance * scale)
