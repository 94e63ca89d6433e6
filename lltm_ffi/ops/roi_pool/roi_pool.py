"""ROI max pooling (Fast R-CNN's RoIPool), ported from the torch.utils.ffi-era
faster-rcnn.pytorch (docs/PORTING.md walks the port):

    output = lltm_ffi.roi_pool(input, rois, pooled_height, pooled_width, spatial_scale)

input (N, C, H, W); rois (R, 5), each row [batch_index, x1, y1, x2, y2] in
the coordinates of the image that input's map is spatial_scale of, of
input's dtype; output (R, C, pooled_height, pooled_width). The legacy
forward rule: the corners, times spatial_scale, are rounded (halves away
from zero); the ROI spans rows y1..y2 and columns x1..x2, ends included, at
least one of each; bin (ph, pw) covers its rows floor(ph * rows /
pooled_height) to ceil((ph + 1) * rows / pooled_height) and likewise its
columns, clipped to the map. Each output is its bin's maximum, the first
where several are equal, NaN never chosen; a bin with no number gives 0.
A ROI whose batch index (truncated toward zero) is not one of input's, or
with a corner that is NaN or past 2**31 once scaled and rounded, pools
nothing (zeros) rather than read outside input.

The gradient reaches input only, through the element each output took
(the argmax the forward pass saves, int64 flat indices into input).
"""

import math

import torch
from torch import Tensor

from ... import op


def _check_forward(function, input, rois, pooled_height, pooled_width, spatial_scale):
    if rois.shape[1] != 5:
        raise ValueError(f"{function}: rois has shape {tuple(rois.shape)}; it must be (R, 5), "
                         "each row [batch_index, x1, y1, x2, y2]")
    for name, size in (("pooled_height", pooled_height), ("pooled_width", pooled_width)):
        if not 0 < size < 2**31:
            raise ValueError(f"{function}: {name} must be from 1 to 2**31 - 1, got {size}")
    if not 0 < spatial_scale < math.inf:
        raise ValueError(f"{function}: spatial_scale must be positive and finite, got "
                         f"{spatial_scale}")


@op.c_pass("roi_pool_forward", check=_check_forward)
def roi_pool_forward(c, input: op.Tensor(dims=4), rois: op.Tensor(dims=2), pooled_height: int,
                     pooled_width: int, spatial_scale: float) -> tuple[Tensor, Tensor]:
    """(output, argmax), both (R, C, pooled_height, pooled_width): each bin's
    maximum and the flat index into input of where it is (-1 for a bin with
    no number, whose output is 0)."""
    shape = (rois.shape[0], input.shape[1], pooled_height, pooled_width)
    output = input.new_empty(shape)
    argmax = input.new_empty(shape, dtype=torch.int64)
    if output.numel():
        c(sizes=(*input.shape, rois.shape[0], pooled_height, pooled_width),
          scalars=(spatial_scale,), tensors=(input, rois, output, argmax))
    return output, argmax


def _check_backward(function, grad_output, rois, argmax, batch_size, height, width,
                    spatial_scale):
    op.check_shape(function, "argmax", argmax, grad_output.shape)
    op.check_shape(function, "rois", rois, (grad_output.shape[0], 5))
    _check_forward(function, grad_output, rois, *grad_output.shape[2:], spatial_scale)


@op.c_pass("roi_pool_backward", check=_check_backward)
def roi_pool_backward(c, grad_output: op.Tensor(dims=4), rois: op.Tensor(dims=2),
                      argmax: op.Tensor(dims=4, dtype=torch.int64), batch_size: int, height: int,
                      width: int, spatial_scale: float) -> Tensor:
    """The gradient of roi_pool_forward's input (batch_size, C, height,
    width): each output's gradient added to the element its argmax names."""
    roi_count, channels, pooled_height, pooled_width = grad_output.shape
    grad_input = grad_output.new_empty(batch_size, channels, height, width)
    if grad_input.numel():
        c(sizes=(batch_size, channels, height, width, roi_count, pooled_height, pooled_width),
          scalars=(spatial_scale,), tensors=(grad_output, rois, argmax, grad_input))
    return grad_input


def _save_rois_and_argmax(ctx, inputs, output):
    input, rois, _, _, spatial_scale = inputs
    ctx.input_shape, ctx.spatial_scale = input.shape, spatial_scale
    ctx.save_for_backward(rois, output[1])


def _roi_pool_backward(ctx, grad_output, _grad_argmax):
    rois, argmax = ctx.saved_tensors
    batch_size, _, height, width = ctx.input_shape
    grad_input = (input_gradient(grad_output, rois, argmax, batch_size, height, width,
                                 ctx.spatial_scale) if ctx.needs_input_grad[0] else None)
    return grad_input, None, None, None, None


def _gather_at_argmax(ctx, grad_grad_input):
    """The backward pass is linear in grad_output: its own gradient takes, for
    each output, the element its argmax names (-1 takes the zero appended)."""
    (argmax,) = ctx.saved_tensors
    flat = torch.cat((grad_grad_input.reshape(-1), grad_grad_input.new_zeros(1)))
    return flat[argmax], None, None, None, None, None, None


input_gradient = op.Op(roi_pool_backward, _gather_at_argmax,
                       lambda ctx, inputs, output: ctx.save_for_backward(inputs[2]))
roi_pool = op.Op(roi_pool_forward, _roi_pool_backward, _save_rois_and_argmax,
                 result=lambda output: output[0], name="roi_pool")
roi_pool.__doc__ = ("roi_pool(input, rois, pooled_height, pooled_width, spatial_scale): each "
                    "ROI's bins' maxima, (R, C, pooled_height, pooled_width); see roi_pool.py.")


class RoIPool(torch.nn.Module):
    """roi_pool as a layer: RoIPool(pooled_height, pooled_width, spatial_scale)(input, rois)."""

    def __init__(self, pooled_height, pooled_width, spatial_scale):
        super().__init__()
        self.pooled_height, self.pooled_width = pooled_height, pooled_width
        self.spatial_scale = spatial_scale

    def forward(self, input, rois):
        return roi_pool(input, rois, self.pooled_height, self.pooled_width, self.spatial_scale)

    def extra_repr(self):
        return (f"pooled_height={self.pooled_height}, pooled_width={self.pooled_width}, "
                f"spatial_scale={self.spatial_scale}")


@op.self_check("roi_pool")
def _pools_as_adaptive_max_pool(device, dtype):
    """A ROI inside the map pools as adaptive_max_pool2d of its crop (whose bins
    are the same floor/ceil ones), values and gradients, over distinct values."""
    sizes, pooled = (2, 3, 11, 13), (3, 4)
    values = torch.randperm(math.prod(sizes), dtype=torch.float64).reshape(sizes)
    input = values.to(device, dtype).requires_grad_(True)
    boxes = ((0, 0, 0, 12, 10), (1, 2, 3, 9, 7), (1, 5, 5, 5, 5), (0, 7, 1, 8, 10))
    rois = torch.tensor(boxes, dtype=dtype, device=device)
    output = roi_pool(input, rois, *pooled, 1.0)
    (gradient,) = torch.autograd.grad(output, input, torch.ones_like(output))
    leaf = values.requires_grad_(True)
    expected = torch.stack([torch.nn.functional.adaptive_max_pool2d(
        leaf[n, :, y1:y2 + 1, x1:x2 + 1], pooled) for n, x1, y1, x2, y2 in boxes])
    (expected_gradient,) = torch.autograd.grad(expected, leaf, torch.ones_like(expected))
    if not torch.equal(output.detach().cpu().double(), expected.detach()):
        return "output differs from adaptive_max_pool2d of each ROI's crop"
    if not torch.equal(gradient.cpu().double(), expected_gradient):
        return "the gradient differs from adaptive_max_pool2d's"
    return None
