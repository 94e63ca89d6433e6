"""The bad-input matrix: every argument of lltm_ffi.lltm (input, weights,
bias, old_h, old_cell) through wrong dtypes, devices, ranks and sizes,
mismatched batches, empty dimensions, unusual layouts (non-contiguous,
overlapping, stride 0, odd and huge strides, misaligned), requires_grad
on and off, and NaN/Inf values.

Each case either gives the documented result (the reference cell's, see
README "Errors") or raises a Python exception whose message names the
argument. The cases whose tensors reach C with unusual sizes or strides run
in a child process, so that a crash fails those cases instead of killing
the test session; the child must exit normally.

    python -m pytest -q tests/test_bad_input_matrix.py
    python tests/test_bad_input_matrix.py --child SEED CASE...   (what the child runs)
"""

import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# conftest puts the checkout first on sys.path (for the child too, which runs
# this file as a script from tests/).
from conftest import ARGUMENT_NAMES, REPO_ROOT, SEED_VARIABLE, raises_with, replaced

import lltm_ffi  # noqa: E402
from lltm_ffi import reference, selfcheck  # noqa: E402

SHAPE = (3, 5, 7)  # batch, input_features, state_size
B, F, S = SHAPE


def _inputs(shape, dtype, device, generator):
    return list(selfcheck.random_inputs(*shape, dtype, device, generator))


def _devices():
    found = [torch.device("cpu")]
    if torch.cuda.is_available():
        found.append(torch.device("cuda", 0))
    return found


# ---------------------------------------------------------------------------
# Refused arguments: TypeError or ValueError naming the argument.

BAD_DTYPES = [torch.int32, torch.int64, torch.bool, torch.float16, torch.bfloat16,
              torch.complex64]


@pytest.mark.parametrize("bad_dtype", BAD_DTYPES, ids=str)
@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_unsupported_dtype(name, bad_dtype, device, generator):
    inputs = _inputs(SHAPE, torch.float32, device, generator)
    value = (inputs[ARGUMENT_NAMES.index(name)] * 10).to(bad_dtype)
    with raises_with(TypeError, f"lltm: {name} has dtype {bad_dtype}"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_one_argument_of_the_other_float_dtype(name, device, generator):
    inputs = _inputs(SHAPE, torch.float32, device, generator)
    value = inputs[ARGUMENT_NAMES.index(name)].double()
    # Naming input when input is the odd one out is enough: the message names both.
    with raises_with(TypeError, name, "torch.float64", "torch.float32"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_not_a_tensor(name, generator):
    inputs = _inputs(SHAPE, torch.float32, "cpu", generator)
    with raises_with(TypeError, f"{name} must be a torch.Tensor", "NoneType"):
        lltm_ffi.lltm(*replaced(inputs, name, None))


@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_one_argument_on_the_meta_device(name, generator):
    inputs = _inputs(SHAPE, torch.float32, "cpu", generator)
    value = inputs[ARGUMENT_NAMES.index(name)].to("meta")
    with raises_with(ValueError, name, "meta", "same device"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


def test_every_argument_on_the_meta_device(generator):
    inputs = [tensor.to("meta") for tensor in _inputs(SHAPE, torch.float32, "cpu", generator)]
    with raises_with(ValueError, "meta", "lltm_ffi runs on cpu and cuda"):
        lltm_ffi.lltm(*inputs)


@pytest.mark.parametrize("name", ARGUMENT_NAMES)
@pytest.mark.parametrize("odd_one", ["cuda", "cpu"], ids=["one_on_cuda", "one_on_cpu"])
def test_one_argument_on_another_device(name, odd_one, cuda_device, generator):
    others = "cpu" if odd_one == "cuda" else cuda_device
    inputs = _inputs(SHAPE, torch.float32, others, generator)
    value = inputs[ARGUMENT_NAMES.index(name)].to(odd_one)
    with raises_with(ValueError, name, "same device"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_one_argument_on_another_gpu(name, generator):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    inputs = _inputs(SHAPE, torch.float32, "cuda:0", generator)
    value = inputs[ARGUMENT_NAMES.index(name)].to("cuda:1")
    with raises_with(ValueError, name, "cuda:1", "cuda:0", "same device"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


# (argument, shape of the replacement) for every rank an argument must not have.
WRONG_RANKS = [(name, shape) for name, shapes in {
    "input": [(), (B * F,), (1, B, F)],
    "weights": [(), (3 * S * (S + F),), (1, 3 * S, S + F)],
    "bias": [(), (1, 1, 3 * S)],  # 1-d and (1, 3S) are both valid
    "old_h": [(), (B * S,), (1, B, S)],
    "old_cell": [(), (B * S,), (B, S, 1)],
}.items() for shape in shapes]


@pytest.mark.parametrize("name, shape", WRONG_RANKS,
                         ids=[f"{name}-{len(shape)}d" for name, shape in WRONG_RANKS])
def test_wrong_rank(name, shape, device, generator):
    inputs = _inputs(SHAPE, torch.float32, device, generator)
    value = torch.randn(shape, generator=generator).to(device)
    with raises_with(ValueError, f"{name} must have", f"got shape {shape}"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


# (argument, wrong shape): sizes that disagree with the other arguments.
WRONG_SIZES = [
    ("input", (B, F + 1)),             # more features than weights has columns for
    ("input", (B + 1, F)),             # batch differs from old_h's
    ("input", (0, F)),
    ("weights", (3 * S + 1, S + F)),
    ("weights", (3 * S, S + F - 1)),
    ("weights", (S + F, 3 * S)),       # transposed
    ("bias", (3 * S - 1,)),
    ("bias", (S,)),
    ("bias", (B, 3 * S)),              # one row per batch element: not supported
    ("bias", (3 * S, 1)),
    ("old_h", (B + 1, S)),             # batch differs from input's
    ("old_h", (B, S + 1)),             # state differs from old_cell's and weights'
    ("old_cell", (B + 1, S)),
    ("old_cell", (B, S + 1)),
    ("old_cell", (B, 0)),
]


@pytest.mark.parametrize("name, shape", WRONG_SIZES,
                         ids=[f"{name}-{'x'.join(map(str, shape))}" for name, shape in WRONG_SIZES])
def test_wrong_size(name, shape, device, generator):
    inputs = _inputs(SHAPE, torch.float32, device, generator)
    value = torch.randn(shape, generator=generator).to(device)
    with raises_with(ValueError, name, f"shape {shape}"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


def test_old_h_and_old_cell_of_one_other_state_size(device, generator):
    """Consistent with each other but not with weights: named via weights and old_h."""
    inputs = _inputs(SHAPE, torch.float32, device, generator)
    inputs[3] = torch.randn(B, S + 1, generator=generator).to(device)
    inputs[4] = torch.randn(B, S + 1, generator=generator).to(device)
    with raises_with(ValueError, "weights has shape", f"old_h of shape {(B, S + 1)}"):
        lltm_ffi.lltm(*inputs)


# Layouts other than strided (sparse, mkldnn): refused before any torch op
# inside the cell sees them.
def _to_layout(tensor, layout):
    if layout == "sparse_coo":
        return tensor.to_sparse()
    if layout == "sparse_csr":
        return tensor.to_sparse_csr() if tensor.dim() == 2 else tensor.to_sparse()
    return tensor.to_mkldnn()


@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr", "mkldnn"])
@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_non_strided_layout(name, layout, generator):
    inputs = _inputs(SHAPE, torch.float32, "cpu", generator)
    value = _to_layout(inputs[ARGUMENT_NAMES.index(name)], layout)
    with raises_with(TypeError, f"lltm: {name} has layout {value.layout}"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


# ---------------------------------------------------------------------------
# Valid arguments with unusual values: the reference cell's results.

def _results(function, inputs, grad_outputs, requires_grad=None):
    """Outputs and the five .grad after backward, from leaves sharing the
    values and strides of `inputs` (the same leaf where inputs repeat a tensor)."""
    leaves = {}
    arguments = []
    for name, tensor in zip(ARGUMENT_NAMES, inputs):
        if id(tensor) not in leaves:
            wants = requires_grad is None or name in requires_grad
            leaves[id(tensor)] = tensor.detach().requires_grad_(wants)
        arguments.append(leaves[id(tensor)])
    outputs = function(*arguments)
    if any(argument.requires_grad for argument in arguments):
        torch.autograd.backward(outputs, grad_outputs)
    return [output.detach() for output in outputs], [argument.grad for argument in arguments]


def _assert_agree(got, expected, names, equal_nan=False):
    for name, value, wanted in zip(names, got, expected):
        if wanted is None:
            assert value is None, f"{name}: expected no gradient, got one"
            continue
        assert value is not None, f"{name}: expected a gradient, got None"
        torch.testing.assert_close(value, wanted, equal_nan=equal_nan,
                                   msg=lambda message, name=name: f"{name}: {message}")


RESULT_NAMES = selfcheck.OUTPUT_NAMES + selfcheck.GRADIENT_NAMES

REQUIRING_GRAD = [(), ("input",), ("weights",), ("bias",), ("old_h",), ("old_cell",),
                  ARGUMENT_NAMES]


@pytest.mark.parametrize("requiring", REQUIRING_GRAD, ids=lambda names: "+".join(names) or "none")
def test_requires_grad_on_some_arguments(requiring, dtype, device, generator):
    inputs = _inputs(SHAPE, dtype, device, generator)
    grad_outputs = [torch.randn(B, S, generator=generator, dtype=dtype).to(device)
                    for _ in range(2)]
    got = _results(lltm_ffi.lltm, inputs, grad_outputs, requiring)
    expected = _results(reference.lltm, inputs, grad_outputs, requiring)
    _assert_agree(got[0] + got[1], expected[0] + expected[1], RESULT_NAMES)
    new_h, _ = lltm_ffi.lltm(*[tensor.detach().requires_grad_(name in requiring)
                               for name, tensor in zip(ARGUMENT_NAMES, inputs)])
    assert new_h.requires_grad == bool(requiring)


def test_inference_mode(device, generator):
    inputs = _inputs(SHAPE, torch.float64, device, generator)
    with torch.inference_mode():
        got = lltm_ffi.lltm(*inputs)
        expected = reference.lltm(*inputs)
    _assert_agree(got, expected, selfcheck.OUTPUT_NAMES)


NON_FINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_non_finite_value_gives_the_reference_results(name, value, dtype, device, generator):
    """One NaN or +-Inf element: outputs and gradients as the reference's,
    NaN where the reference has NaN."""
    inputs = _inputs(SHAPE, dtype, device, generator)
    poisoned = inputs[ARGUMENT_NAMES.index(name)].clone()
    poisoned.view(-1)[poisoned.numel() // 2] = NON_FINITE[value]
    inputs = replaced(inputs, name, poisoned)
    grad_outputs = [torch.randn(B, S, generator=generator, dtype=dtype).to(device)
                    for _ in range(2)]
    got = _results(lltm_ffi.lltm, inputs, grad_outputs)
    expected = _results(reference.lltm, inputs, grad_outputs)
    _assert_agree(got[0] + got[1], expected[0] + expected[1], RESULT_NAMES, equal_nan=True)


def _nan_mask(rows=(), columns=(), element=None):
    mask = torch.zeros(B, S, dtype=torch.bool)
    for row in rows:
        mask[row] = True
    for column in columns:
        mask[:, column] = True
    if element is not None:
        mask[element] = True
    return mask


# (argument, element made NaN) -> NaN masks of new_h and new_cell. Rows r of
# weights and bias: r < S the input gate of state r, S <= r < 2S the output
# gate of state r - S (it does not reach new_cell), 2S <= r the candidate cell.
NAN_FOOTPRINTS = {
    ("old_cell", (1, 2)): (_nan_mask(element=(1, 2)), _nan_mask(element=(1, 2))),
    ("input", (1, 2)): (_nan_mask(rows=[1]), _nan_mask(rows=[1])),
    ("old_h", (1, 2)): (_nan_mask(rows=[1]), _nan_mask(rows=[1])),
    ("weights", (1, 2)): (_nan_mask(columns=[1]), _nan_mask(columns=[1])),
    ("weights", (S + 1, 2)): (_nan_mask(columns=[1]), _nan_mask()),
    ("weights", (2 * S + 1, 2)): (_nan_mask(columns=[1]), _nan_mask(columns=[1])),
    ("bias", (1,)): (_nan_mask(columns=[1]), _nan_mask(columns=[1])),
    ("bias", (S + 1,)): (_nan_mask(columns=[1]), _nan_mask()),
    ("bias", (2 * S + 1,)): (_nan_mask(columns=[1]), _nan_mask(columns=[1])),
}


@pytest.mark.parametrize("name, element", NAN_FOOTPRINTS,
                         ids=[f"{name}{list(element)}" for name, element in NAN_FOOTPRINTS])
def test_nan_spreads_as_the_cell_says(name, element, device, generator):
    """Where a NaN goes (README "Errors")."""
    inputs = _inputs(SHAPE, torch.float32, device, generator)
    poisoned = inputs[ARGUMENT_NAMES.index(name)].clone()
    poisoned[element] = math.nan
    inputs = replaced(inputs, name, poisoned)
    for output_name, output, expected in zip(selfcheck.OUTPUT_NAMES, lltm_ffi.lltm(*inputs),
                                             NAN_FOOTPRINTS[name, element]):
        mask = torch.isnan(output).cpu()
        assert torch.equal(mask, expected), \
            f"NaN in {name}{list(element)}: NaN in {output_name} at\n{mask}\nexpected\n{expected}"


# A tensor with its negative bit set (torch's lazy negation: a view whose
# data_ptr() holds the un-negated values) would reach C as it is when it is
# contiguous, as old_cell or as an output gradient; the negation must be
# applied first.
def test_old_cell_with_the_negative_bit(device, generator):
    inputs = _inputs(SHAPE, torch.float64, device, generator)
    inputs[4] = torch._neg_view(inputs[4])
    assert inputs[4].is_neg() and inputs[4].is_contiguous()
    _assert_agree(lltm_ffi.lltm(*inputs), reference.lltm(*inputs), selfcheck.OUTPUT_NAMES)


def test_one_element_old_cell_from_the_imaginary_part_of_a_conjugate(device, generator):
    """The same through public API only: x.conj().imag is a negative view."""
    inputs = _inputs((1, 2, 1), torch.float32, device, generator)
    inputs[4] = torch.randn(1, 1, dtype=torch.complex64, generator=generator).to(device).conj().imag
    assert inputs[4].is_neg() and inputs[4].is_contiguous()
    _assert_agree(lltm_ffi.lltm(*inputs), reference.lltm(*inputs), selfcheck.OUTPUT_NAMES)


def test_output_gradient_with_the_negative_bit(device, generator):
    inputs = _inputs(SHAPE, torch.float64, device, generator)
    grad_h = torch.randn(B, S, generator=generator, dtype=torch.float64).to(device)
    grad_outputs = [torch._neg_view(grad_h), torch.zeros_like(grad_h)]
    got = _results(lltm_ffi.lltm, inputs, grad_outputs)
    expected = _results(reference.lltm, inputs, grad_outputs)
    _assert_agree(got[1], expected[1], selfcheck.GRADIENT_NAMES)


# ---------------------------------------------------------------------------
# Cases whose tensors reach C with unusual sizes or strides: run in a child
# process. Each builds (inputs, grad_outputs) from a generator; the child
# compares lltm_ffi's outputs and gradients with the reference's (computed
# in float64), as relative errors in norm (see _run_case).

def _every_other(tensor):
    """Stride 2 in the last dimension; the elements in between are NaN."""
    return torch.stack((tensor, torch.full_like(tensor, math.nan)), dim=-1)[..., 0]


def _misaligned(tensor):
    """Dense, one element into its buffer (not 16-byte aligned)."""
    buffer = torch.full((tensor.numel() + 1,), math.nan, dtype=tensor.dtype, device=tensor.device)
    view = buffer[1:].view(tensor.shape)
    view.copy_(tensor)
    return view


def _odd_strides(tensor):
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


def _overlapping(tensor):
    """Rows that share elements: element (i, j) is buffer[i + j] (strides (1, 1))."""
    if tensor.dim() == 1:
        return tensor[:1].expand_as(tensor)
    rows, columns = tensor.shape
    buffer = tensor.new_empty(rows + columns - 1) if rows and columns else tensor.new_empty(0)
    if buffer.numel():
        buffer[:columns] = tensor[0]
        buffer[columns:] = tensor[1:, -1]
    return buffer.as_strided(tensor.shape, (1, 1))


def _transposed(tensor):
    return tensor.t().contiguous().t() if tensor.dim() == 2 else _every_other(tensor)


def _broadcast_rows(tensor):
    return tensor[:1].expand_as(tensor)


def _broadcast_all(tensor):
    return tensor.reshape(-1)[:1].reshape((1,) * tensor.dim()).expand_as(tensor)


LAYOUTS = {
    "transposed": _transposed,
    "every_other": _every_other,
    "misaligned": _misaligned,
    "odd_strides": _odd_strides,
    "overlapping": _overlapping,
    "broadcast_rows": _broadcast_rows,
    "broadcast_all": _broadcast_all,
}
HUGE_STRIDE = 2 ** 40  # elements: any address computed from it would be far outside memory


def _huge_stride_on_size_one_dims(tensor):
    """The same values with stride 2**40 on every dimension of size 1 (torch
    calls such a tensor contiguous; its data_ptr() is the same)."""
    strides = [HUGE_STRIDE if size == 1 else stride
               for size, stride in zip(tensor.shape, tensor.contiguous().stride())]
    return tensor.contiguous().as_strided(tensor.shape, strides)


def _gradients(shape, dtype, device, generator):
    return [torch.randn(shape[0], shape[2], generator=generator, dtype=dtype).to(device)
            for _ in range(2)]


def _layout_case(shape, layout, arguments):
    """A case with `layout` applied to `arguments` (names; "grad" for both output gradients)."""
    def build(dtype, device, generator):
        inputs = _inputs(shape, dtype, device, generator)
        grads = _gradients(shape, dtype, device, generator)
        for name in arguments:
            if name == "grad":
                grads = [layout(grad) for grad in grads]
            else:
                index = ARGUMENT_NAMES.index(name)
                inputs[index] = layout(inputs[index])
        return inputs, grads
    return build


def _aliased_case(dtype, device, generator):
    """input, old_h and old_cell are one tensor (input_features == state_size)."""
    inputs = _inputs((3, 7, 7), dtype, device, generator)
    inputs[0] = inputs[3] = inputs[4]
    return inputs, _gradients((3, 7, 7), dtype, device, generator)


def _bias_2d_huge_row_stride(dtype, device, generator):
    inputs = _inputs((1, 5, 8), dtype, device, generator)
    inputs[2] = _huge_stride_on_size_one_dims(inputs[2].unsqueeze(0))
    return inputs, _gradients((1, 5, 8), dtype, device, generator)


ZERO_SIZE_SHAPES = {"batch0": (0, 5, 7), "features0": (3, 0, 7), "state0": (3, 5, 0),
                    "batch0-state0": (0, 5, 0), "all0": (0, 0, 0), "batch0-wide": (0, 5, 8)}

CHILD_CASES = {}
for _label, _shape in ZERO_SIZE_SHAPES.items():
    CHILD_CASES[f"zero_size-{_label}"] = _layout_case(_shape, lambda tensor: tensor, ())
# State 7: the CUDA passes' one-element path; state 8: their 16-byte path.
for _state_label, _shape in (("s7", (3, 5, 7)), ("s8", (4, 6, 8))):
    for _layout_name, _layout in LAYOUTS.items():
        for _name in ARGUMENT_NAMES + ("grad",):
            CHILD_CASES[f"layout-{_layout_name}-{_name}-{_state_label}"] = _layout_case(
                _shape, _layout, (_name,))
        CHILD_CASES[f"layout-{_layout_name}-all-{_state_label}"] = _layout_case(
            _shape, _layout, ARGUMENT_NAMES + ("grad",))
# Size-1 dimensions may carry any stride; nothing may use it.
for _label, _shape, _names in (
        ("batch1", (1, 5, 8), ("input", "old_h", "old_cell", "grad")),
        ("state1", (3, 5, 1), ("old_h", "old_cell", "grad")),
        ("features1", (3, 1, 4), ("input",))):
    CHILD_CASES[f"huge_stride-{_label}"] = _layout_case(_shape, _huge_stride_on_size_one_dims,
                                                        _names)
CHILD_CASES["huge_stride-bias_1x3S"] = _bias_2d_huge_row_stride
CHILD_CASES["aliased-input_old_h_old_cell"] = _aliased_case

# The CUDA cases exist where a GPU does (so a CPU-only run lists no skips for them).
CHILD_IDS = [f"{device.type}-{dtype}-{case}" for device in _devices()
             for dtype in ("float32", "float64") for case in CHILD_CASES]


def _converted(inputs, grads, dtype):
    """The same arguments in `dtype` (one tensor stays one tensor)."""
    converted = {id(tensor): tensor.to(dtype) for tensor in inputs}
    return [converted[id(tensor)] for tensor in inputs], [grad.to(dtype) for grad in grads]


# Tolerance: selfcheck.TOLERANCES, widened only where the arguments make the
# cell ill-conditioned (when every element is the same saturated value, say,
# 1 - sigmoid(z) cancels everywhere): there lltm_ffi must stay within
# CONDITIONING_FACTOR times the reference cell's own float32 error (scaled by
# float64's epsilon over float32's for float64), as in test_random_agreement.
CONDITIONING_FACTOR = 20.0
EPSILON_RATIO = {torch.float32: 1.0, torch.float64: 2.0 ** -29}


def _run_case(case_id, seed):
    """Runs one case; returns a summary, or raises AssertionError on a mismatch."""
    device, dtype, case = case_id.split("-", 2)
    device = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    dtype = getattr(torch, dtype)
    generator = torch.Generator().manual_seed(seed)
    inputs, grads = CHILD_CASES[case](dtype, device, generator)
    outputs, gradients = _results(lltm_ffi.lltm, inputs, grads)
    expected = _results(reference.lltm, *_converted(inputs, grads, torch.float64))
    inputs32, grads32 = _converted(inputs, grads, torch.float32)
    conditioning = _results(reference.lltm, inputs32, grads32)
    conditioning_expected = _results(reference.lltm, *_converted(inputs32, grads32, torch.float64))
    if device.type == "cuda":
        torch.cuda.synchronize()
    worst = 0.0
    for name, value, wanted, hard, hard_wanted in zip(
            RESULT_NAMES, outputs + gradients, expected[0] + expected[1],
            conditioning[0] + conditioning[1], conditioning_expected[0] + conditioning_expected[1]):
        assert value.shape == wanted.shape, f"{name} has shape {tuple(value.shape)}, " \
                                            f"reference {tuple(wanted.shape)}"
        assert value.dtype == dtype and value.device == device, f"{name}: {value.dtype} on {value.device}"
        error = selfcheck.relative_error(value, wanted)
        reference_error = selfcheck.relative_error(hard, hard_wanted)
        allowed = max(selfcheck.TOLERANCES[dtype],
                      CONDITIONING_FACTOR * EPSILON_RATIO[dtype] * reference_error)
        assert error <= allowed, (f"{name} relative error {error:.3g} exceeds {allowed:.3g} "
                                  f"(the reference in float32: {reference_error:.3g})")
        worst = max(worst, error)
    return f"largest relative error {worst:.3g}"


def _child_main(arguments):
    seed, case_ids = int(arguments[0]), arguments[1:]
    for case_id in case_ids:
        print(json.dumps({"start": case_id}), flush=True)
        try:
            outcome, detail = "ok", _run_case(case_id, seed)
        except AssertionError as error:
            outcome, detail = "mismatch", str(error)
        except Exception as error:  # noqa: BLE001 -- reported to the parent
            outcome, detail = "raised", f"{type(error).__name__}: {error}"
        print(json.dumps({"case": case_id, "outcome": outcome, "detail": detail[:4000]}),
              flush=True)
    return 0


def _exit_description(returncode):
    if returncode is not None and returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


@pytest.fixture(scope="module")
def child_run():
    """Runs every child case of the available devices in one child process."""
    replay = os.environ.get(SEED_VARIABLE)
    seed = int(replay) if replay else torch.Generator().seed() % 2 ** 63
    process = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", str(seed), *CHILD_IDS],
        capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    results, last_started = {}, None
    for line in process.stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "start" in record:
            last_started = record["start"]
        elif "case" in record:
            results[record["case"]] = record
    return {"seed": seed, "results": results, "returncode": process.returncode,
            "last_started": last_started, "stderr": process.stderr[-3000:]}


def _replay(run):
    return f"(replay with {SEED_VARIABLE}={run['seed']})"


def test_child_process_exits_normally(child_run):
    assert child_run["returncode"] == 0, (
        f"the child running the C-reaching cases ended with "
        f"{_exit_description(child_run['returncode'])} while running "
        f"{child_run['last_started']} {_replay(child_run)}; stderr:\n{child_run['stderr']}")


@pytest.mark.parametrize("case_id", CHILD_IDS)
def test_case_in_child_process_gives_the_reference_results(case_id, child_run):
    record = child_run["results"].get(case_id)
    if record is None:
        pytest.fail(f"{case_id} did not finish: the child ended with "
                    f"{_exit_description(child_run['returncode'])} while running "
                    f"{child_run['last_started']} {_replay(child_run)}; "
                    f"stderr:\n{child_run['stderr']}")
    assert record["outcome"] == "ok", f"{case_id}: {record['outcome']}: {record['detail']} " \
                                      f"{_replay(child_run)}"


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    sys.exit(_child_main(sys.argv[2:]))
