"""The differentiable round of the legacy round_cuda example, ported (the
worked example of docs/PORTING.md):

    y = lltm_ffi.round_ste(x)    # y = 1 where x >= 0.5, else 0; dy/dx taken as 1

Forward rounds at 0.5 (meant for values in (0, 1); any value is accepted and
NaN gives 0, as `x >= 0.5` does). Backward is a straight-through estimator:
the gradient passes unchanged, as if the round were the identity. The true
derivative is 0 almost everywhere, which would stop all learning upstream.

Eager calls go through RoundSTE (an autograd.Function); under torch.compile
the same C pass runs as the operator lltm_ffi::round_forward, because dynamo
cannot trace into a cffi call.
"""

import torch
from torch import Tensor

from . import _arguments, _extension


def check_argument(input):
    """Raises TypeError, ValueError or (a CUDA tensor with a CPU-only build)
    LLTMError for a tensor the C pass cannot take. Plain Python on the
    tensor's metadata, so torch.compile traces it."""
    _arguments.check_tensor("round_ste", "input", input)
    _arguments.check_device("round_ste", input.device, "input is")


def round_forward(input):
    """1 where input >= 0.5, else 0: a new contiguous tensor of input's shape,
    dtype and device. input must have passed check_argument."""
    input = _extension.dense(input)
    output = torch.empty_like(input, memory_format=torch.contiguous_format)
    if input.numel():
        _extension.call("lltm_round_forward", input, (input.numel(),), (input, output))
    return output


class RoundSTE(torch.autograd.Function):
    """round at 0.5 forward, identity backward (straight-through estimator)."""

    @staticmethod
    def forward(ctx, input):
        return round_forward(input)

    @staticmethod
    def backward(ctx, grad_output):
        # The estimator's gradient is the identity: no C pass, nothing saved,
        # and the backward is itself differentiable.
        return grad_output


@torch.library.custom_op("lltm_ffi::round_forward", mutates_args=(), device_types=("cpu", "cuda"))
def round_forward_op(input: Tensor) -> Tensor:
    """round_forward as an operator, for torch.compile."""
    check_argument(input)
    return round_forward(input)


@round_forward_op.register_fake
def _round_forward_fake(input):
    return torch.empty_like(input, memory_format=torch.contiguous_format)


round_forward_op.register_autograd(lambda ctx, grad_output: grad_output)


def round_ste(input):
    """1 where input >= 0.5, else 0, with the gradient passed straight through."""
    check_argument(input)
    if _arguments.use_operator(input):
        return round_forward_op(input)
    return RoundSTE.apply(input)
