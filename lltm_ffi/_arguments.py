"""What every op of lltm_ffi asks of its tensor arguments, with one wording
for each refusal, and the choice between an op's eager path and its
registered operator."""

import torch
from torch.autograd import forward_ad

from . import _extension
from ._extension import SUPPORTED_DTYPES


def check_tensor(op, name, tensor):
    """TypeError naming `name` unless `tensor` is a dense float32/float64 tensor."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{op}: {name} has dtype {tensor.dtype}; "
                        "lltm_ffi supports torch.float32 and torch.float64")
    if tensor.is_nested:
        raise TypeError(f"{op}: {name} is a nested tensor (layout {tensor.layout}); lltm_ffi "
                        "takes dense (torch.strided) tensors: pad it with "
                        "torch.nested.to_padded_tensor()")
    if tensor.layout is not torch.strided:
        raise TypeError(f"{op}: {name} has layout {tensor.layout}; lltm_ffi takes dense "
                        "(torch.strided) tensors: convert it with .to_dense()")


def usable_together(reference, *tensors):
    """True when `reference` and every one of `tensors` are dense (strided),
    of reference's dtype, a supported one, and on its device: what the checks
    here accept, in one pass that raises nothing (the ops' fast path)."""
    dtype, device = reference.dtype, reference.device
    if dtype not in SUPPORTED_DTYPES or reference.layout is not torch.strided:
        return False
    for tensor in tensors:
        if (tensor.layout is not torch.strided or tensor.dtype is not dtype
                or tensor.device != device):
            return False
    return True


def cell_arguments_fit(input, input_dims, weights, bias, h, c):
    """True when input (input_dims dimensions, the last two batch and
    features), weights, bias, h and c are usable together with the cell's
    shapes: every op's valid case, in one expression; False, never an
    exception, otherwise, for the op's own diagnosis."""
    try:
        if input.dim() != input_dims:
            return False
        batch_size, input_features = input.shape[-2:]
        rows, columns = weights.shape
        state_size = h.shape[1]
        return (usable_together(input, weights, bias, h, c)
                and h.dim() == 2 and c.shape == h.shape and h.shape[0] == batch_size
                and rows == 3 * state_size and columns == state_size + input_features
                and bias.shape[-1] == rows and (bias.dim() == 1 or bias.shape[0] == 1)
                and bias.dim() <= 2)
    except (AttributeError, TypeError, IndexError, ValueError, RuntimeError):
        return False


def check_all(op, names, tensors):
    """check_tensor for every tensor, then check_matches of each against the
    first: the type, dtype, layout and device checks of a call's arguments."""
    for name, tensor in zip(names, tensors):
        check_tensor(op, name, tensor)
    for name, tensor in zip(names[1:], tensors[1:]):
        check_matches(op, name, tensor, names[0], tensors[0])


def check_matches(op, name, tensor, reference_name, reference):
    """TypeError or ValueError naming `name` unless `tensor` has the dtype and
    device of `reference`."""
    if tensor.dtype != reference.dtype:
        raise TypeError(f"{op}: {name} has dtype {tensor.dtype} but {reference_name} has "
                        f"{reference.dtype}; all arguments must have the same dtype")
    if tensor.device != reference.device:
        raise ValueError(f"{op}: {name} is on {tensor.device} but {reference_name} is on "
                         f"{reference.device}; all arguments must be on the same device")


def check_device(op, device, subject="the arguments are"):
    """ValueError for a device lltm_ffi does not run on; LLTMError for a CUDA
    device when the module was built without CUDA (the C shim's own refusal,
    raised before anything is allocated)."""
    if device.type == "cuda":
        _extension.check_cuda_compiled(op)
    elif device.type != "cpu":
        raise ValueError(f"{op}: {subject} on {device}; lltm_ffi runs on cpu and cuda")


def plain_eager(*tensors):
    """True for the common call that an op hands to C itself through its
    autograd.Function: plain tensors, and nothing that intercepts or
    transforms the call (torch.compile, a tracer, a __torch_dispatch__ mode,
    autocast, a torch.func transform, forward-mode AD). Otherwise the op
    picks among its other paths (use_operator and the rest). Every eager call
    pays for it, so it asks torch._C alone, nothing that builds objects."""
    return (not use_operator(*tensors) and not torch._C._is_any_autocast_enabled()
            and not torch._C._are_functorch_transforms_active()
            and forward_ad._current_level < 0)


def use_operator(*tensors):
    """True where an op must go through its registered torch.library operator
    rather than hand data_ptr() to C itself: while torch.compile or
    torch.jit.trace traces (neither can see into a cffi call), under a
    __torch_dispatch__ mode (FakeTensorMode, make_fx, export), and for any
    argument that is not a plain torch.Tensor (tensor subclasses, fake
    tensors), which the dispatcher then hands to its own handling. functorch's
    wrapped tensors are plain torch.Tensors: the autograd.Functions take them
    and unwrap them before their forward runs."""
    # is_compiling() first: dynamo takes it as True and reads no further.
    return (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0
            or torch._C._get_tracing_state() is not None
            or not _extension.PLAIN_TENSOR_TYPES.issuperset(map(type, tensors)))
