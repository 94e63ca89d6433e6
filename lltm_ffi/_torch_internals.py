"""Every private torch name lltm_ffi uses, in one place, each with why no
public API serves. They are queries about the call in progress (is a
tracer, a transform or autocast active?) that every eager call asks, so
they must cost next to nothing, or the shortcuts that keep a call's Python
overhead low. tests/test_torch_internals.py checks that each still exists
and answers as used here, so that a torch upgrade that removes or changes
one fails loudly there rather than quietly here.
"""

import torch
from torch.autograd import forward_ad

# Public: torch.is_autocast_enabled(device_type), one call per device type;
# this asks for all of them in one.
any_autocast_enabled = torch._C._is_any_autocast_enabled

# Inside a torch.func transform (grad, vmap, jvp, ...). No public query
# exists.
functorch_transforms_active = torch._C._are_functorch_transforms_active

# Whether a __torch_dispatch__ mode (FakeTensorMode, make_fx, export) is
# active. The public torch.utils._python_dispatch helpers are private too,
# and build a list of the modes to answer.
dispatch_modes_active = torch._C._len_torch_dispatch_stack


def forward_ad_active():
    """Inside torch.autograd.forward_ad.dual_level(). The module offers no
    query; its level counter is the one place this is recorded."""
    return forward_ad._current_level >= 0


# A tensor batched by the legacy vmap behind
# torch.autograd.grad(is_grads_batched=True): it holds no memory C can
# read. No public query exists.
is_legacy_batched = torch._C._functorch.is_legacy_batchedtensor

# The current raw cudaStream_t of a device as an int. Public:
# torch.cuda.current_stream(index).cuda_stream, which builds a Stream object
# first (a microsecond on every GPU call).
current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream)

# Whether torch's own CUDA float32 products may use TF32: public as
# torch.backends.cuda.matmul.allow_tf32, whose module's __getattr__ asks
# this in Python (0.4 us of every sequence call, which reads it twice).
cublas_allow_tf32 = torch._C._get_cublas_allow_tf32


def plain_apply(function):
    """function.apply (a torch.autograd.Function's) without Function.apply's
    Python layer, whose work (binding defaults, unwrapping torch.func's dead
    wrappers, the transforms' path) plain eager calls do not need: a few
    microseconds of each. torch's C++ base class, _FunctionBase, holds the
    apply it calls in the end."""
    return super(torch.autograd.Function, function).apply
