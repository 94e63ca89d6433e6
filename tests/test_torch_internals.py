"""Every private torch name lltm_ffi/_torch_internals.py relies on still
exists and answers as lltm_ffi uses it: a torch upgrade that removes or
changes one fails here, by name, rather than somewhere inside a call."""

import pytest
import torch
import torch.autograd.forward_ad as forward_ad
from torch._subclasses.fake_tensor import FakeTensorMode

from lltm_ffi import _torch_internals


def test_any_autocast_enabled_sees_cpu_autocast():
    assert _torch_internals.any_autocast_enabled() is False
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _torch_internals.any_autocast_enabled() is True
    assert _torch_internals.any_autocast_enabled() is False


def test_functorch_transforms_active_inside_vmap_and_grad():
    seen = []

    def probe(x):
        seen.append(_torch_internals.functorch_transforms_active())
        return x.sum()

    assert _torch_internals.functorch_transforms_active() is False
    torch.func.vmap(probe)(torch.ones(2, 3))
    torch.func.grad(probe)(torch.ones(3))
    assert seen == [True, True]


def test_dispatch_modes_active_under_fake_tensor_mode():
    assert _torch_internals.dispatch_modes_active() == 0
    with FakeTensorMode():
        assert _torch_internals.dispatch_modes_active() > 0
    assert _torch_internals.dispatch_modes_active() == 0


def test_forward_ad_active_inside_a_dual_level():
    assert _torch_internals.forward_ad_active() is False
    with forward_ad.dual_level():
        assert _torch_internals.forward_ad_active() is True
    assert _torch_internals.forward_ad_active() is False


def test_cublas_allow_tf32_follows_the_public_setting():
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        for value in (True, False):
            torch.backends.cuda.matmul.allow_tf32 = value
            assert _torch_internals.cublas_allow_tf32() is value
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def test_is_legacy_batched_sees_batched_gradients():
    """autograd.grad(is_grads_batched=True) hands a backward gradients batched
    by the legacy vmap, which hold no memory C could read."""
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            seen.append(_torch_internals.is_legacy_batched(grad))
            return grad

    x = torch.ones(3, requires_grad=True)
    torch.autograd.grad(Probe.apply(x), x, torch.eye(3), is_grads_batched=True)
    (Probe.apply(x) * 2).sum().backward()
    assert seen == [True, False]


@pytest.mark.gpu
def test_current_raw_stream_is_the_current_streams_handle():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: torch.cuda.is_available() is False")
    assert _torch_internals.current_raw_stream(0) == torch.cuda.current_stream(0).cuda_stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert _torch_internals.current_raw_stream(0) == side.cuda_stream


def test_current_raw_stream_is_torchs_private_query_in_a_cuda_build():
    """The private query, not the fallback, wherever torch is built with CUDA:
    the fallback costs a Stream object a call. (A CPU-only torch has neither
    the query nor a stream to ask for.)"""
    if torch.version.cuda is None:
        pytest.skip("torch is a CPU-only build")
    assert _torch_internals.current_raw_stream is torch._C._cuda_getCurrentRawStream


def test_plain_apply_runs_forward_and_backward_of_a_function():
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    x = torch.ones(3, requires_grad=True)
    y = _torch_internals.plain_apply(Double)(x)
    y.sum().backward()
    assert torch.equal(y, torch.full((3,), 2.0)) and torch.equal(x.grad, torch.full((3,), 2.0))
    assert type(y.grad_fn).__name__ == "DoubleBackward"
