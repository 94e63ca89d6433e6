"""embed: rows of a table picked by integer indices, Caffe's Embed layer
(BVLC/caffe src/caffe/layers/embed_layer.cu and .cpp), ported:

    output = lltm_ffi.embed(indices, weight, bias=None)

indices: int32 or int64, any shape, each from 0 to weight.shape[0] - 1 (an
index outside is refused, naming it); weight (rows, columns) and bias
(columns) or None: float32, float64, float16 or bfloat16; output:
indices.shape + (columns,), each index's row of weight plus bias, rounded
once. As F.embedding(indices, weight) + bias.

The gradient reaches weight and bias: each row of the output's gradient is
added to the row of weight its index names (on a GPU by atomicAdd, so the
last bits of a row picked several times vary from run to run; refused under
torch.use_deterministic_algorithms(True); on the CPU one index after
another), and all of them to bias. The 16-bit dtypes add in float32 and
round once.
"""

import torch
from torch import Tensor

from ... import op

INDICES = op.Tensor(dtype=(torch.int32, torch.int64), c_dtype=torch.int64)


def _check_bias(function, indices, weight, bias=None):
    if bias is not None:
        op.check_shape(function, "bias", bias, weight.shape[1:])


def _check_indices(function, indices, weight, bias=None):
    outside = (indices < 0) | (indices >= weight.shape[0])
    if outside.any():
        first = tuple(outside.nonzero()[0].tolist())
        raise ValueError(f"{function}: indices at {first} is {indices[first].item()}; weight has "
                         f"{weight.shape[0]} rows, so an index runs from 0 to "
                         f"{weight.shape[0] - 1}")


@op.c_pass("embed_forward", check=_check_bias, values=_check_indices)
def embed_forward(c, indices: INDICES, weight: op.Tensor(dims=2),
                  bias: op.Tensor(dims=1, optional=True) = None) -> Tensor:
    """weight's row of each index, plus bias: indices.shape + (columns,)."""
    rows, columns = weight.shape
    output = weight.new_empty(*indices.shape, columns)
    if output.numel():
        c(sizes=(indices.numel(), columns, rows), tensors=(weight, indices, bias, output))
    return output


def _check_backward(function, grad_output, indices, rows):
    if grad_output.dim() != indices.dim() + 1 or grad_output.shape[:-1] != indices.shape:
        raise ValueError(f"{function}: grad_output has shape "
                         f"{tuple(grad_output.shape)}; it must be indices' shape "
                         f"{tuple(indices.shape)} and one more dimension")


@op.c_pass("embed_backward", check=_check_backward, nondeterministic=("cuda",))
def embed_backward(c, grad_output: op.Tensor(), indices: INDICES, rows: int) -> Tensor:
    """The gradient of weight (rows, columns): each row of grad_output added
    to the row its index names; an index outside the rows adds nothing."""
    columns = grad_output.shape[-1]
    # Sums of a 16-bit dtype run in float32, rounded once at the end.
    grad_weight = grad_output.new_zeros(
        rows, columns, dtype=torch.promote_types(grad_output.dtype, torch.float32))
    if grad_output.numel():
        c(sizes=(indices.numel(), columns, rows), tensors=(grad_output, indices, grad_weight))
    return grad_weight.to(grad_output.dtype)


def _save_indices(ctx, inputs, output):
    ctx.rows = inputs[1].shape[0]
    ctx.save_for_backward(inputs[0])


def _embed_backward(ctx, grad_output):
    (indices,) = ctx.saved_tensors
    grad_weight = (weight_gradient(grad_output, indices, ctx.rows)
                   if ctx.needs_input_grad[1] else None)
    grad_bias = grad_output.sum_to_size(grad_output.shape[-1:]) if ctx.needs_input_grad[2] else None
    return None, grad_weight, grad_bias


def _gather_rows(ctx, grad_grad_weight):
    """The backward pass is linear in grad_output: its derivative picks, for
    each index, its row of grad_grad_weight, which is embed again."""
    (indices,) = ctx.saved_tensors
    return embed(indices, grad_grad_weight), None, None


weight_gradient = op.Op(embed_backward, _gather_rows,
                        lambda ctx, inputs, output: ctx.save_for_backward(inputs[1]))
embed = op.Op(embed_forward, _embed_backward, _save_indices, name="embed")
embed.__doc__ = "embed(indices, weight, bias=None): weight's rows (+ bias); see embed.py."


class Embed(torch.nn.Module):
    """Caffe's Embed layer: Embed(rows, columns, bias=True)(indices). Its
    weight is drawn from N(0, 1) by torch's global generator, as
    nn.Embedding's; its bias starts at zero, as Caffe's did."""

    def __init__(self, rows, columns, bias=True, device=None, dtype=None):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(rows, columns, device=device, dtype=dtype))
        self.bias = (torch.nn.Parameter(torch.zeros(columns, device=device, dtype=dtype))
                     if bias else None)

    def forward(self, indices):
        return embed(indices, self.weight, self.bias)


@op.self_check("embed")
def _embeds_as_torch_does(device, dtype):
    """Values and gradients against F.embedding plus the bias, indices
    picked several times included."""
    indices = torch.tensor([[0, 3, 3], [1, 0, 3]], device=device, dtype=torch.int32)
    weight = torch.linspace(-2, 2, 20, dtype=dtype, device=device).reshape(4, 5)
    bias = torch.linspace(1, 0, 5, dtype=dtype, device=device)
    leaves = [tensor.clone().requires_grad_(True) for tensor in (weight, bias)]
    references = [tensor.clone().requires_grad_(True) for tensor in (weight, bias)]
    output = embed(indices, *leaves)
    expected = torch.nn.functional.embedding(indices, references[0]) + references[1]
    if not torch.equal(output, expected):
        return "output differs from F.embedding(indices, weight) + bias"
    grad_output = torch.arange(30.0, dtype=dtype, device=device).reshape(output.shape) / 8
    gradients = torch.autograd.grad(output, leaves, grad_output)
    if not all(torch.equal(got, wanted)
               for got, wanted in zip(gradients, torch.autograd.grad(expected, references,
                                                                      grad_output))):
        return "the gradients differ from F.embedding's"
    return None
