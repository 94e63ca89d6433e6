"""lltm_ffi.roi_pool against a pure-PyTorch reference written from the rule
(roi_pool.py's docstring): outputs and argmax exactly, gradients in
float64; gradcheck and gradgradcheck; odd sizes, batch 1, ROIs partly or
wholly outside the map, malformed and empty ROIs, ROIs of batch indices
that do not exist, spatial_scale != 1, no ROI at all; NaN, infinities and
ties in the input; argument refusals; the operators under opcheck and
torch.compile."""

import math
import re

import pytest
import torch

import lltm_ffi
from lltm_ffi.ops.roi_pool.roi_pool import roi_pool_backward, roi_pool_forward


def round_half_away(value):
    whole = math.trunc(value)
    return whole + (value - whole >= 0.5) - (whole - value >= 0.5)


def reference_box(roi, scaled, batch_size):
    """(batch, top, left, rows, columns) of a ROI, or None where it pools nothing."""
    batch_index = roi[0]
    if not -1 < batch_index < batch_size:
        return None
    corners = [round_half_away(value) if math.isfinite(value) else math.inf for value in scaled]
    if any(abs(corner) > 2**31 for corner in corners):
        return None
    left, top, right, bottom = corners
    return math.trunc(batch_index), top, left, max(bottom - top + 1, 1), max(right - left + 1, 1)


def reference_edges(bin_index, bins, start, extent, limit):
    """The rows [first, end) of a bin: floor and ceil of exact fractions, clipped."""
    first = start + bin_index * extent // bins
    end = start - (-(bin_index + 1) * extent // bins)
    return min(max(first, 0), limit), min(max(end, 0), limit)


def reference_roi_pool(input, rois, pooled_height, pooled_width, spatial_scale):
    """(output, argmax) by the rule, one bin at a time."""
    batch_size, channels, height, width = input.shape
    shape = (rois.shape[0], channels, pooled_height, pooled_width)
    output = torch.zeros(shape, dtype=input.dtype)
    argmax = torch.full(shape, -1, dtype=torch.int64)
    values = input.detach().cpu()
    scaled_corners = (rois[:, 1:] * spatial_scale).tolist()  # in rois' dtype, as C does
    for index, (roi, scaled) in enumerate(zip(rois.tolist(), scaled_corners)):
        box = reference_box(roi, scaled, batch_size)
        if box is None:
            continue
        batch, top, left, rows, columns = box
        for ph in range(pooled_height):
            h_start, h_end = reference_edges(ph, pooled_height, top, rows, height)
            for pw in range(pooled_width):
                w_start, w_end = reference_edges(pw, pooled_width, left, columns, width)
                for channel in range(channels):
                    window = values[batch, channel, h_start:h_end, w_start:w_end].reshape(-1)
                    numbers = window[~window.isnan()]
                    if numbers.numel() == 0:
                        continue
                    first = int((window == numbers.max()).nonzero()[0])
                    h = h_start + first // (w_end - w_start)
                    w = w_start + first % (w_end - w_start)
                    output[index, channel, ph, pw] = window[first]
                    argmax[index, channel, ph, pw] = (
                        ((batch * channels + channel) * height + h) * width + w)
    return output, argmax


def reference_gradient(input_shape, argmax, grad_output):
    """Each output's gradient added to the element its argmax names, in float64."""
    taken = argmax.reshape(-1) >= 0
    grad_input = torch.zeros(math.prod(input_shape), dtype=torch.float64)
    grad_input.index_add_(0, argmax.reshape(-1)[taken], grad_output.reshape(-1)[taken].double())
    return grad_input.reshape(input_shape)


def distinct_values(shape, generator, dtype=torch.float64, device="cpu"):
    """Values 0.25 apart in random order: every maximum unique, also in float32."""
    values = torch.randperm(math.prod(shape), generator=generator, dtype=torch.float64) / 4 - 3
    return values.reshape(shape).to(device, dtype)


def make_rois(rows, dtype, device):
    return torch.tensor(rows, dtype=dtype).reshape(-1, 5).to(device)


NAN, INF = float("nan"), float("inf")

# (input shape, rois, pooled height and width, spatial_scale)
CASES = {
    "odd-sizes": ((2, 3, 7, 9), [[0, 1, 1, 5, 4], [1, 0, 2, 8, 6], [1, 3, 0, 3, 6]], (3, 2), 1.0),
    "batch-1": ((1, 4, 5, 6), [[0, 0, 0, 5, 4], [0, 2, 1, 3, 3]], (2, 3), 1.0),
    "partly-outside": ((2, 2, 6, 5), [[0, -3, -2, 2, 3], [1, 3, 4, 9, 11], [0, -5, 2, 7, 3]],
                       (3, 3), 1.0),
    "wholly-outside": ((1, 2, 4, 4), [[0, 5, 5, 9, 9], [0, -9, -9, -5, -5]], (2, 2), 1.0),
    "malformed": ((2, 2, 6, 7), [[0, 4, 2, 1, 5], [1, 3, 5, 5, 0], [1, 6, 3, 2, 1]], (2, 3), 1.0),
    "more-bins-than-rows": ((1, 2, 5, 5), [[0, 1, 1, 2, 3]], (5, 4), 1.0),
    "spatial-scale": ((2, 3, 8, 10), [[0, 3, 5, 30, 20], [1, 10, 2, 38, 31], [1, 2, 2, 6, 6]],
                      (3, 3), 0.25),
    "scale-rounding": ((1, 2, 9, 9), [[0, 1.5, 2.5, 10.5, 13.5], [0, -1.5, -0.5, 4.5, 7.5]],
                       (2, 2), 0.5),
    "batch-index": ((2, 2, 4, 5), [[-1, 0, 0, 3, 3], [2, 0, 0, 3, 3], [1.9, 0, 0, 3, 3],
                                   [-0.5, 1, 1, 2, 2], [NAN, 0, 0, 3, 3], [1e10, 0, 0, 3, 3]],
                    (2, 2), 1.0),
    "bad-corners": ((1, 2, 4, 5), [[0, NAN, 0, 3, 3], [0, 0, INF, 3, 3], [0, 0, 0, 3e9, 3],
                                   [0, -1e30, 0, 3, 3], [0, 0, 0, 2**31 - 1, 3]], (2, 2), 1.0),
    "no-roi": ((2, 3, 4, 4), [], (2, 2), 1.0),
    "no-element": ((0, 3, 4, 4), [[0, 0, 0, 2, 2]], (2, 2), 1.0),
    "no-row": ((1, 2, 0, 4), [[0, 0, 0, 2, 2]], (2, 2), 1.0),
}


@pytest.mark.parametrize("case", CASES)
def test_forward_matches_the_reference(case, dtype, device, generator):
    shape, rows, pooled, scale = CASES[case]
    input = distinct_values(shape, generator, dtype, device)
    rois = make_rois(rows, dtype, device)
    output, argmax = roi_pool_forward(input, rois, *pooled, scale)
    expected_output, expected_argmax = reference_roi_pool(input, rois, *pooled, scale)
    assert output.dtype == dtype and argmax.dtype == torch.int64
    assert torch.equal(argmax.cpu(), expected_argmax)
    assert torch.equal(output.cpu(), expected_output)
    assert torch.equal(lltm_ffi.roi_pool(input, rois, *pooled, scale), output)


@pytest.mark.parametrize("case", CASES)
def test_gradient_matches_the_reference(case, dtype, device, generator):
    shape, rows, pooled, scale = CASES[case]
    input = distinct_values(shape, generator, dtype, device).requires_grad_(True)
    rois = make_rois(rows, dtype, device)
    output = lltm_ffi.roi_pool(input, rois, *pooled, scale)
    grad_output = torch.randn(output.shape, generator=generator, dtype=dtype).to(device)
    output.backward(grad_output)
    _, argmax = reference_roi_pool(input, rois, *pooled, scale)
    expected = reference_gradient(shape, argmax, grad_output.cpu())
    tolerance = {torch.float32: 1e-6, torch.float64: 1e-15}[dtype]
    torch.testing.assert_close(input.grad.cpu().double(), expected, rtol=tolerance, atol=tolerance)


def test_special_values(dtype, device):
    """NaN is never chosen, a bin of NaN alone gives 0 and -1, -inf is a
    number, and of equal maxima the first (row by row) wins."""
    nan, inf = float("nan"), float("inf")
    plane = [[nan, nan, 1.0, 3.0],
             [nan, nan, 3.0, 2.0],
             [-inf, -inf, 5.0, 5.0],
             [-inf, nan, 5.0, inf]]
    input = torch.tensor([[plane]], dtype=dtype, device=device)
    rois = make_rois([[0, 0, 0, 3, 3]], dtype, device)
    output, argmax = roi_pool_forward(input, rois, 2, 2, 1.0)
    assert argmax.cpu().reshape(2, 2).tolist() == [[-1, 3], [8, 15]]
    assert output.cpu().reshape(2, 2).tolist() == [[0.0, 3.0], [-inf, inf]]
    output, argmax = roi_pool_forward(input, make_rois([[0, 2, 2, 3, 3]], dtype, device), 1, 1, 1.0)
    assert (output.item(), argmax.item()) == (inf, 15)
    output, argmax = roi_pool_forward(input, make_rois([[0, 2, 2, 3, 2]], dtype, device), 1, 1, 1.0)
    assert (output.item(), argmax.item()) == (5.0, 10)


def test_malformed_roi_gives_its_gradient_back(device):
    """A ROI with x2 < x1 and y2 < y1 pools from the one element at (y1, x1):
    every bin takes it, and so it gets every bin's gradient."""
    input = torch.arange(30, dtype=torch.float64, device=device).reshape(1, 1, 5, 6)
    input.requires_grad_(True)
    rois = make_rois([[0, 4, 3, 1, 0]], torch.float64, device)
    output = lltm_ffi.roi_pool(input, rois, 2, 2, 1.0)
    assert output.detach().cpu().reshape(-1).tolist() == [22.0] * 4
    output.backward(torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]], device=device))
    expected = torch.zeros(1, 1, 5, 6, dtype=torch.float64)
    expected[0, 0, 3, 4] = 10.0
    assert torch.equal(input.grad.cpu(), expected)


GRADCHECK_ROIS = [[0, 1, 1, 5, 4], [1, -2, 3, 3, 9], [1, 6, 2, 2, 0], [0, 0, 0, 1, 1],
                  [0, 3, 0, 4, 6], [5, 0, 0, 3, 3]]


def gradcheck_arguments(device, generator):
    input = distinct_values((2, 3, 7, 6), generator, device=device).requires_grad_(True)
    return input, make_rois(GRADCHECK_ROIS, torch.float64, device), 3, 2, 1.0


def test_gradcheck(device, generator):
    """Over distinct values (0.25 apart, far beyond gradcheck's steps): ROIs
    inside, partly outside, malformed, smaller than their bins, of a batch
    that does not exist."""
    assert torch.autograd.gradcheck(lltm_ffi.roi_pool, gradcheck_arguments(device, generator))


def test_gradgradcheck(device, generator):
    assert torch.autograd.gradgradcheck(lltm_ffi.roi_pool, gradcheck_arguments(device, generator))


def test_no_roi_gives_an_empty_output_and_a_zero_gradient(dtype, device, monkeypatch):
    calls = []
    monkeypatch.setattr(roi_pool_forward, "c", lambda *arguments, **options: calls.append(1))
    input = torch.ones(2, 3, 4, 5, dtype=dtype, device=device, requires_grad=True)
    output = lltm_ffi.roi_pool(input, torch.empty(0, 5, dtype=dtype, device=device), 2, 2, 1.0)
    assert output.shape == (0, 3, 2, 2) and not calls
    output.sum().backward()
    assert torch.equal(input.grad, torch.zeros_like(input))


def test_layouts(dtype, device, generator):
    """A channels-last input and a strided view of rois read as their dense copies."""
    input = distinct_values((2, 4, 6, 7), generator, dtype, device)
    rois = torch.tensor([[1, 0, 1, 5, 4, 0], [0, 2, 0, 6, 5, 0]], dtype=dtype, device=device)[:, :5]
    assert not rois.is_contiguous()
    expected = lltm_ffi.roi_pool(input, rois.contiguous(), 2, 3, 1.0)
    result = lltm_ffi.roi_pool(input.to(memory_format=torch.channels_last), rois, 2, 3, 1.0)
    assert torch.equal(result, expected)


def test_module(dtype, device, generator):
    layer = lltm_ffi.RoIPool(2, 3, 0.5)
    assert repr(layer) == "RoIPool(pooled_height=2, pooled_width=3, spatial_scale=0.5)"
    input = distinct_values((1, 2, 5, 5), generator, dtype, device)
    rois = make_rois([[0, 0, 0, 8, 8]], dtype, device)
    assert torch.equal(layer(input, rois), lltm_ffi.roi_pool(input, rois, 2, 3, 0.5))


def test_cpu_and_cuda_agree_bit_for_bit(cuda_device, dtype, generator):
    """The CPU scatter adds in the CUDA gather's order: the same bits."""
    input = distinct_values((2, 5, 9, 11), generator, dtype).requires_grad_(True)
    rows = torch.rand(40, 5, generator=generator, dtype=torch.float64) * 14 - 2
    rows[:, 0] = torch.randint(-1, 3, (40,), generator=generator)
    rois = rows.to(dtype)
    grad_output = torch.randn(40, 5, 3, 4, generator=generator, dtype=dtype)
    results = []
    for device in ("cpu", cuda_device):
        leaf = input.detach().to(device).requires_grad_(True)
        output = lltm_ffi.roi_pool(leaf, rois.to(device), 3, 4, 0.7)
        output.backward(grad_output.to(device))
        results.append((output.cpu(), leaf.grad.cpu()))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


@pytest.mark.huge
def test_huge_argmax_past_2_31_elements(cuda_device):
    """An argmax past 2**31 (where the legacy int32 one wrapped): 12 GiB of
    input, as much again for its gradient."""
    side = 2**15
    input = torch.zeros(1, 3, side, side, device=cuda_device)
    input[0, 2, -1, -2] = 1.0
    rois = torch.tensor([[0.0, side - 4, side - 4, side - 1, side - 1]], device=cuda_device)
    output, argmax = roi_pool_forward(input, rois, 1, 1, 1.0)
    corner = (side - 4) * side + side - 4
    assert argmax.cpu().reshape(-1).tolist() == [corner, side**2 + corner,
                                                 3 * side**2 - 2]
    assert output.cpu().reshape(-1).tolist() == [0.0, 0.0, 1.0]
    grad_input = roi_pool_backward(torch.ones_like(output), rois, argmax, 1, side, side, 1.0)
    assert grad_input[0, 2, -1, -2].item() == 1.0 and grad_input.sum().item() == 3.0


def valid_arguments(dtype=torch.float32):
    return [torch.zeros(2, 3, 6, 6, dtype=dtype), torch.zeros(4, 5, dtype=dtype), 2, 3, 0.5]


@pytest.mark.parametrize("position, value, error, words", [
    (1, torch.zeros(4, 4), ValueError, "roi_pool: rois has shape (4, 4); it must be (R, 5)"),
    (1, torch.zeros(4, 5, dtype=torch.int64), TypeError, "roi_pool: rois has dtype torch.int64"),
    (1, torch.zeros(4, 5, dtype=torch.float64), TypeError,
     "roi_pool: rois has dtype torch.float64 but input has"),
    (1, torch.zeros(5), ValueError, "roi_pool: rois must have 2 dimensions"),
    (1, [[0, 1, 1, 2, 2]], TypeError, "roi_pool: rois must be a torch.Tensor"),
    (0, torch.zeros(3, 6, 6), ValueError, "roi_pool: input must have 4 dimensions"),
    (0, torch.zeros(2, 3, 6, 6, dtype=torch.float16), TypeError,
     "roi_pool: rois has dtype torch.float32 but input has torch.float16"),
    (2, 0, ValueError, "roi_pool: pooled_height must be from 1 to 2**31 - 1, got 0"),
    (3, -2, ValueError, "roi_pool: pooled_width must be from 1 to 2**31 - 1, got -2"),
    (2, 2**31, ValueError, "roi_pool: pooled_height must be from 1 to 2**31 - 1"),
    (3, 2.0, TypeError, "roi_pool: pooled_width must be int, got float"),
    (2, True, TypeError, "roi_pool: pooled_height must be int, got bool"),
    (4, 0.0, ValueError, "roi_pool: spatial_scale must be positive and finite, got 0.0"),
    (4, float("nan"), ValueError, "roi_pool: spatial_scale must be positive and finite"),
    (4, float("inf"), ValueError, "roi_pool: spatial_scale must be positive and finite"),
    (4, "1", TypeError, "roi_pool: spatial_scale must be float, got str"),
], ids=["4-columns", "int-rois", "mixed-dtypes", "1d-rois", "list-rois", "3d-input", "half",
        "zero-height", "negative-width", "huge-height", "float-width", "bool-height",
        "zero-scale", "nan-scale", "inf-scale", "str-scale"])
def test_refusals_name_the_argument(position, value, error, words, monkeypatch):
    monkeypatch.setattr(roi_pool_forward, "c", lambda *arguments, **options: pytest.fail("C ran"))
    arguments = valid_arguments()
    arguments[position] = value
    with pytest.raises(error, match="^" + re.escape(words)):
        lltm_ffi.roi_pool(*arguments)


def test_backward_pass_refuses_mismatched_shapes():
    grad_output, rois = torch.zeros(4, 3, 2, 2), torch.zeros(4, 5)
    argmax = torch.zeros(4, 3, 2, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match=re.escape("argmax has shape (4, 3, 2, 1), expected "
                                                   "(4, 3, 2, 2)")):
        roi_pool_backward(grad_output, rois, argmax[..., :1], 1, 4, 4, 1.0)
    with pytest.raises(ValueError, match=re.escape("rois has shape (3, 5), expected (4, 5)")):
        roi_pool_backward(grad_output, rois[:3], argmax, 1, 4, 4, 1.0)
    with pytest.raises(TypeError, match="argmax has dtype torch.int32; it must be torch.int64"):
        roi_pool_backward(grad_output, rois, argmax.int(), 1, 4, 4, 1.0)


def test_backward_pass_ignores_an_argmax_outside_its_bin(device):
    """Given made-up indices (the operator called by hand), the pass adds an
    output's gradient only where its own bin holds the element named, and
    writes nowhere else. Each bin here is one element: rows ph, columns pw
    of the plane of channel c (elements 16 * c + 4 * ph + pw)."""
    rois = torch.tensor([[0.0, 0, 0, 1, 1]], device=device)
    argmax = torch.tensor([-7, 0, 5, 2**40, 1, 17, 16, 21], device=device).reshape(1, 2, 2, 2)
    grad_output = torch.arange(1.0, 9.0, device=device).reshape(1, 2, 2, 2)
    grad_input = roi_pool_backward(grad_output, rois, argmax, 1, 4, 4, 1.0)
    expected = torch.zeros(32)
    expected[17], expected[21] = 6.0, 8.0
    assert torch.equal(grad_input.cpu(), expected.reshape(1, 2, 4, 4))


def test_opcheck(dtype, device, generator):
    input = distinct_values((2, 3, 5, 6), generator, dtype, device)
    rois = make_rois([[0, 0, 0, 4, 4], [1, 2, 1, 5, 3], [1, 4, 4, 1, 1]], dtype, device)
    torch.library.opcheck(roi_pool_forward.operator, (input, rois, 2, 3, 0.5))
    torch.library.opcheck(roi_pool_forward.operator, (input.requires_grad_(True), rois, 2, 3, 0.5))
    _, argmax = roi_pool_forward(input.detach(), rois, 2, 3, 0.5)
    grad_output = torch.randn(argmax.shape, generator=generator, dtype=dtype).to(device)
    torch.library.opcheck(roi_pool_backward.operator, (grad_output, rois, argmax, 2, 5, 6, 0.5))


@pytest.mark.slow
def test_torch_compile_fullgraph(device, generator):
    """Under torch.compile roi_pool is the operator lltm_ffi::roi_pool_forward,
    its backward lltm_ffi::roi_pool_backward."""
    def head(features, rois):
        return (lltm_ffi.roi_pool(torch.relu(features), rois, 3, 2, 0.5) * 2).flatten(1)

    features = distinct_values((2, 4, 9, 7), generator, device=device)
    rois = make_rois([[0, 0, 0, 12, 16], [1, 4, 2, 9, 9], [1, 8, 8, 2, 2]], torch.float64, device)
    compiled_leaf = features.clone().requires_grad_(True)
    eager_leaf = features.clone().requires_grad_(True)
    compiled = torch.compile(head, fullgraph=True)(compiled_leaf, rois)
    eager = head(eager_leaf, rois)
    assert torch.equal(compiled, eager)
    compiled.sum().backward()
    eager.sum().backward()
    assert torch.equal(compiled_leaf.grad, eager_leaf.grad)
