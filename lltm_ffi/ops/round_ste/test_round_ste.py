"""lltm_ffi.round_ste, the differentiable round of docs/PORTING.md: forward
values against torch's `(x >= 0.5)`, the straight-through gradient, layouts,
empty tensors, argument errors and CUDA streams and devices.

gradcheck is not used: it compares backward with finite differences of
forward, and for a straight-through estimator the two differ by design (the
finite differences are 0 away from 0.5 and huge across it; backward is the
identity). So backward is checked directly: it must return the upstream
gradient unchanged."""

import pytest
import torch

import lltm_ffi
from lltm_ffi.ops.round_ste.round_ste import round_forward
from lltm_ffi.testing import skip_without_two_gpus

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


@pytest.fixture(params=DTYPES, ids=[str(dtype).removeprefix("torch.") for dtype in DTYPES])
def dtype(request):
    """round_ste's passes take the half dtypes too: every test runs in all four."""
    return request.param


def expected_round(x):
    return (x >= 0.5).to(x.dtype)


def edge_values(dtype, device):
    """0.5 exactly and its neighbours, the ends of (0, 1) and values outside it."""
    half = torch.tensor(0.5, dtype=dtype)
    below = torch.nextafter(half, torch.tensor(0.0, dtype=dtype))
    above = torch.nextafter(half, torch.tensor(1.0, dtype=dtype))
    values = torch.tensor([0.0, 1.0, -0.5, 1.5, -1e30, 1e30, float("inf"), float("-inf"),
                           float("nan"), 1e-40, -0.0], dtype=dtype)
    return torch.cat([torch.stack([half, below, above]), values]).to(device)


def test_forward_matches_torch_at_edge_values(dtype, device):
    x = edge_values(dtype, device)
    result = lltm_ffi.round_ste(x)
    assert result.dtype == dtype and result.device == x.device
    assert torch.equal(result, expected_round(x))
    assert result[:3].tolist() == [1.0, 0.0, 1.0]  # 0.5 rounds up; the float below it does not


@pytest.mark.parametrize("shape", [(), (1,), (1000,), (3, 5, 7), (2, 1, 4, 33)],
                         ids=["scalar", "one", "1000", "3x5x7", "2x1x4x33"])
def test_forward_matches_torch_for_any_shape(shape, dtype, device, generator):
    x = (torch.rand(shape, generator=generator, dtype=dtype) * 3 - 1).to(device)
    result = lltm_ffi.round_ste(x)
    assert result.shape == x.shape
    assert torch.equal(result, expected_round(x))


def test_backward_passes_the_gradient_straight_through(dtype, device, generator):
    x = torch.rand(4, 9, generator=generator, dtype=dtype).to(device).requires_grad_(True)
    grad = torch.randn(4, 9, generator=generator, dtype=dtype).to(device)
    lltm_ffi.round_ste(x).backward(grad)
    assert torch.equal(x.grad, grad)


def test_gradient_reaches_earlier_layers(device, generator):
    """Through the estimator the chain rule sees d round / dx = 1."""
    weight = torch.randn(3, generator=generator, dtype=torch.float64).to(device)
    weight.requires_grad_(True)
    x = torch.rand(5, 3, generator=generator, dtype=torch.float64).to(device)
    lltm_ffi.round_ste(torch.sigmoid(x * weight)).sum().backward()
    s = torch.sigmoid(x * weight.detach())
    torch.testing.assert_close(weight.grad, (s * (1 - s) * x).sum(dim=0))


def test_noncontiguous_input(dtype, device, generator):
    base = torch.rand(6, 10, generator=generator, dtype=dtype).to(device).requires_grad_(True)
    views = {"transposed": base.t(), "strided": base[:, ::3], "expanded": base[:1].expand(4, 10)}
    for name, view in views.items():
        assert not view.is_contiguous(), name
        result = lltm_ffi.round_ste(view)
        assert torch.equal(result, expected_round(view.detach())), name
        grad = torch.randn(view.shape, generator=generator, dtype=dtype).to(device)
        (gradient,) = torch.autograd.grad(result, base, grad)
        (expected_gradient,) = torch.autograd.grad(view, base, grad)
        assert torch.equal(gradient, expected_gradient), name


def test_empty_input_gives_empty_output_without_a_launch(dtype, device, monkeypatch):
    def no_call(*arguments):
        raise AssertionError("round_ste called C for an empty input")

    monkeypatch.setattr(round_forward, "c", no_call)
    x = torch.empty(0, 3, dtype=dtype, device=device, requires_grad=True)
    result = lltm_ffi.round_ste(x)
    assert result.shape == (0, 3) and result.dtype == dtype
    result.sum().backward()
    assert x.grad.shape == (0, 3)


@pytest.mark.slow
def test_torch_compile_fullgraph_forward_and_backward(device, generator):
    """Under torch.compile round_ste is the operator lltm_ffi::round_forward."""
    def step(x):
        return lltm_ffi.round_ste(torch.sigmoid(x)) * 2

    x = torch.randn(6, 5, generator=generator, dtype=torch.float64).to(device)
    compiled_leaf, eager_leaf = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    compiled = torch.compile(step, fullgraph=True)(compiled_leaf)
    compiled.sum().backward()
    eager = step(eager_leaf)
    eager.sum().backward()
    assert torch.equal(compiled, eager)
    torch.testing.assert_close(compiled_leaf.grad, eager_leaf.grad)


@pytest.mark.parametrize("bad_dtype", [torch.int32, torch.int64, torch.bool, torch.complex64,
                                       torch.uint8])
def test_unsupported_dtype_is_a_type_error_naming_the_dtype(bad_dtype):
    x = torch.zeros(3, dtype=bad_dtype)
    with pytest.raises(TypeError, match=f"round_ste: input has dtype {bad_dtype}"):
        lltm_ffi.round_ste(x)


@pytest.mark.parametrize("value", [0.7, [0.2, 0.8], None])
def test_non_tensor_is_a_type_error(value):
    with pytest.raises(TypeError, match="round_ste: input must be a torch.Tensor"):
        lltm_ffi.round_ste(value)


def test_meta_device_is_a_value_error():
    with pytest.raises(ValueError, match="round_ste: input is on meta"):
        lltm_ffi.round_ste(torch.zeros(3, device="meta"))


def test_runs_on_the_current_side_stream(cuda_device, generator):
    """The input is written on a side stream after a long delay; a kernel that
    ignored the current stream would read the NaNs there before."""
    x = torch.rand(1 << 16, generator=generator).to(cuda_device)
    expected = expected_round(x)
    buffer = torch.full_like(x, float("nan"))
    lltm_ffi.round_ste(x)  # loads the kernel: a first launch can wait for the device
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)
        buffer.copy_(x, non_blocking=True)
        result = lltm_ffi.round_ste(buffer)
    side.synchronize()
    assert torch.equal(result, expected)


@pytest.mark.gpu
@pytest.mark.multi_gpu
def test_runs_on_a_second_gpu_while_the_first_is_current(generator):
    skip_without_two_gpus()
    x = torch.rand(1000, generator=generator).to("cuda:1")
    with torch.cuda.device(0):
        result = lltm_ffi.round_ste(x)
        assert torch.cuda.current_device() == 0
    assert result.device == x.device
    assert torch.equal(result, expected_round(x))
