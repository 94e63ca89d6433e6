"""The tensors the tests hand to lltm_ffi: random arguments and output
gradients, and the same values in unusual layouts (strided, overlapping,
broadcast, misaligned, huge strides on size-1 dimensions). Each layout
function takes a dense tensor and returns a view, on its device, that holds
its values (the broadcast ones: its first row or element, repeated); buffer
elements the view does not reach are NaN where the function allocates one."""

import math

import torch

from lltm_ffi import selfcheck


def random_inputs(generator, shape, dtype=torch.float64, device="cpu"):
    """[input, weights, bias, old_h, old_cell] for shape (batch, features, state)."""
    return list(selfcheck.random_inputs(*shape, dtype, device, generator))


def random_like(tensor, generator):
    """Unit-normal values with `tensor`'s shape, dtype and device."""
    return torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype).to(tensor.device)


def random_grad_outputs(inputs, generator):
    """[grad_h, grad_cell]: unit-normal values shaped like old_h (inputs[3])."""
    return [random_like(inputs[3], generator) for _ in range(2)]


def slow_stream_inputs(stream, inputs):
    """Fresh buffers (NaN at first) that `stream` fills with `inputs` after a
    long delay, so a kernel that ignored the stream would read the NaNs."""
    buffers = [torch.full_like(tensor, float("nan")) for tensor in inputs]
    with torch.cuda.stream(stream):
        torch.cuda._sleep(20_000_000)
        for buffer, tensor in zip(buffers, inputs):
            buffer.copy_(tensor, non_blocking=True)
    return buffers


def every_other(tensor):
    """Stride 2 in the last dimension; the elements in between are NaN."""
    return torch.stack((tensor, torch.full_like(tensor, math.nan)), dim=-1)[..., 0]


def misaligned(tensor):
    """Dense, one element into its buffer (not 16-byte aligned)."""
    buffer = torch.full((tensor.numel() + 1,), math.nan, dtype=tensor.dtype, device=tensor.device)
    view = buffer[1:].view(tensor.shape)
    view.copy_(tensor)
    return view


def odd_strides(tensor):
    """Strides (3 * columns + 5, 3) from offset 7 into a NaN-filled buffer."""
    if tensor.dim() == 1:
        sizes, strides = tensor.shape, (3,)
    else:
        sizes, strides = tensor.shape, (3 * tensor.shape[1] + 5, 3)
    span = 7 + sum((size - 1) * stride for size, stride in zip(sizes, strides)) + 1
    buffer = torch.full((max(span, 8),), math.nan, dtype=tensor.dtype, device=tensor.device)
    view = buffer.as_strided(sizes, strides, 7)
    view.copy_(tensor)
    return view


def overlapping(tensor):
    """Rows that share elements: element (i, j) is buffer[i + j] (strides (1, 1))."""
    if tensor.dim() == 1:
        return tensor[:1].expand_as(tensor)
    rows, columns = tensor.shape
    buffer = tensor.new_empty(rows + columns - 1) if rows and columns else tensor.new_empty(0)
    if buffer.numel():
        buffer[:columns] = tensor[0]
        buffer[columns:] = tensor[1:, -1]
    return buffer.as_strided(tensor.shape, (1, 1))


def transposed(tensor):
    """Column-major strides (a 1-d tensor: every_other)."""
    return tensor.t().contiguous().t() if tensor.dim() == 2 else every_other(tensor)


def broadcast_rows(tensor):
    """The first row (element) repeated with stride 0."""
    return tensor[:1].expand_as(tensor)


def broadcast_all(tensor):
    """The first element repeated with stride 0 in every dimension."""
    return tensor.reshape(-1)[:1].reshape((1,) * tensor.dim()).expand_as(tensor)


HUGE_STRIDE = 2 ** 40  # elements: any address computed from it would be far outside memory


def huge_stride_on_size_one_dims(tensor):
    """The same values with stride 2**40 on every dimension of size 1 (torch
    calls such a tensor contiguous; its data_ptr() is the same)."""
    strides = [HUGE_STRIDE if size == 1 else stride
               for size, stride in zip(tensor.shape, tensor.contiguous().stride())]
    return tensor.contiguous().as_strided(tensor.shape, strides)


def copied_to(view, device):
    """`view` on `device` with the same sizes, strides and offset, its whole
    buffer copied from the host: no kernel wrote what it holds there."""
    elements = view.untyped_storage().nbytes() // view.element_size()
    buffer = view.as_strided((elements,), (1,), 0).to(device)
    return buffer.as_strided(view.shape, view.stride(), view.storage_offset())


def sequence_arguments(generator, shape, dtype=torch.float64, device="cpu"):
    """[inputs, weights, bias, h0, c0] of lltm_sequence for shape (steps,
    batch, features, state), drawn as random_inputs draws the cell's."""
    steps, batch_size, input_features, state_size = shape
    cell = random_inputs(generator, (batch_size, input_features, state_size), dtype, device)
    inputs = torch.randn(steps, batch_size, input_features, generator=generator, dtype=dtype)
    return [inputs.to(device), *cell[1:]]
