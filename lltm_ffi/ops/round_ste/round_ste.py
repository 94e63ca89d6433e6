"""The differentiable round of the legacy round_cuda example, ported:

    y = lltm_ffi.round_ste(x)    # y = 1 where x >= 0.5, else 0; dy/dx taken as 1

Forward rounds at 0.5 (meant for values in (0, 1); any value is accepted and
NaN gives 0, as `x >= 0.5` does). Backward is a straight-through estimator:
the gradient passes unchanged, as if the round were the identity. The true
derivative is 0 almost everywhere, which would stop all learning upstream.
"""

import torch
from torch import Tensor

from ... import op


@op.c_pass("round_forward")
def round_forward(c, input: op.Tensor()) -> Tensor:
    """1 where input >= 0.5, else 0: a new contiguous tensor of input's
    shape, dtype and device."""
    output = torch.empty_like(input, memory_format=torch.contiguous_format)
    if input.numel():
        c(sizes=(input.numel(),), tensors=(input, output))
    return output


# The estimator's gradient is the identity: no C pass, nothing saved, and
# the backward is itself differentiable.
round_ste = op.Op(round_forward, backward=lambda ctx, grad_output: grad_output,
                  name="round_ste")


@op.self_check("round_ste")
def _rounds_as_torch_does(device, dtype):
    values = torch.tensor([-1.0, 0.0, 0.25, 0.5, 0.75, 1.0, 2.0], dtype=dtype, device=device)
    if not torch.equal(round_ste(values), (values >= 0.5).to(dtype)):
        return "forward differs from (x >= 0.5)"
    return None
