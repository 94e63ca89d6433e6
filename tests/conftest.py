"""Fixtures and helpers shared by the lltm_ffi tests: devices, dtypes and
seeds; running lltm_ffi and comparing its results; tolerances; the shared
CPU-only build and child process. The tensors the tests build are in
builders.py, the copies of the checkout in checkouts.py, the cases run in a
child process in child_cases.py.

Every test's random inputs come from a fixed seed of its own, which its
failure report names; LLTM_TEST_SEED=<seed> replays it, and
LLTM_TEST_SEED=random draws fresh seeds (`make seed-hunt`). The seeds, the
devices and dtypes and the markers they set come from lltm_ffi.testing,
which op folders' tests share.
"""

import re
import sys

import pytest
import torch

from checkouts import REPO_ROOT, copy_sources, make_cpu_only

# The checkout under test comes first, also for a plain `pytest` run from elsewhere.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import lltm_ffi  # noqa: E402
from lltm_ffi import _extension, reference, selfcheck  # noqa: E402
from lltm_ffi.testing import (NO_GPU, SEED_VARIABLE, cuda_device, device, dtype,  # noqa: E402,F401
                              generator, pytest_collection_modifyitems, pytest_configure,
                              pytest_runtest_makereport, seed, seed_for,
                              seeded_global_generators, skip_without_gpu,
                              skip_without_two_gpus)

# For the tests of the 16-bit products on AMX's tiles (or AVX512-BF16's dot
# products in their place).
needs_amx = pytest.mark.skipif(_extension.lib is not None and not _extension.amx_usable(),
                               reason="this CPU has neither AMX nor AVX512-BF16")

ARGUMENT_NAMES = ("input", "weights", "bias", "old_h", "old_cell")
RESULT_NAMES = selfcheck.OUTPUT_NAMES + selfcheck.GRADIENT_NAMES
# What the fused passes return: forward_pass, then backward_pass.
PASS_NAMES = ("new_h", "new_cell", "d_old_cell", "d_gates")


@pytest.fixture(autouse=True)
def strict_float32():
    """Every test starts and must end with TF32 off: the tolerances assume strict
    float32 products, and a test that leaves TF32 on fails those after it."""
    settings = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                torch.get_float32_matmul_precision())
    yield
    left = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = settings[:2]
    torch.set_float32_matmul_precision(settings[2])
    assert left == settings, f"the test changed the float32 precision settings {settings} to {left}"


@pytest.fixture(scope="session")
def cpu_only_build(tmp_path_factory):
    """A copy of the sources built with `make CUDA=0`, shared by the tests
    that only read it."""
    directory = copy_sources(tmp_path_factory.mktemp("cpu_only") / "lltm")
    make_cpu_only(directory)
    return directory


@pytest.fixture(scope="session")
def child_run():
    """Every case of child_cases.py on every device here, run in one child process."""
    import child_cases  # not at the top: child_cases imports this module

    return child_cases.run_child()


def shape_id(shape):
    """'3x5x7' for (batch, input_features, state_size) = (3, 5, 7)."""
    return "x".join(str(size) for size in shape)


def set_or_unset(monkeypatch, name, value):
    """The environment variable `name` set to `value` for the test, or unset
    where value is None."""
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)


def as_leaves(tensors, requires_grad=True):
    """Leaf tensors sharing the values and strides of `tensors`."""
    return [tensor.detach().requires_grad_(requires_grad) for tensor in tensors]


def outputs_and_gradients(inputs, grad_outputs, function=lltm_ffi.lltm,
                          requires_grad=ARGUMENT_NAMES):
    """(new_h, new_cell) and the five arguments' .grad after backpropagating
    `grad_outputs` through `function` applied to leaves sharing the values
    and strides of `inputs` (one leaf where inputs repeat a tensor); only the
    arguments named in `requires_grad` require grad."""
    leaves = {}
    arguments = []
    for name, tensor in zip(ARGUMENT_NAMES, inputs):
        if id(tensor) not in leaves:
            leaves[id(tensor)] = tensor.detach().requires_grad_(name in requires_grad)
        arguments.append(leaves[id(tensor)])
    outputs = function(*arguments)
    if any(argument.requires_grad for argument in arguments):
        torch.autograd.backward(outputs, grad_outputs)
    return [output.detach() for output in outputs], [argument.grad for argument in arguments]


def assert_tensors_close(actual, expected, names, equal_nan=False):
    """torch.testing.assert_close for each pair, the failure naming the
    tensor; where `expected` is None (no gradient), `actual` must be too."""
    assert len(actual) == len(expected) == len(names)
    for name, value, reference in zip(names, actual, expected):
        if reference is None:
            assert value is None, f"{name}: expected no gradient, got one"
            continue
        assert value is not None, f"{name}: expected a gradient, got None"
        torch.testing.assert_close(value, reference, equal_nan=equal_nan,
                                   msg=lambda message, name=name: f"{name}: {message}")


def assert_all_close(got, expected, tolerance):
    """selfcheck.relative_error of each pair at most `tolerance`."""
    for index, (value, reference_value) in enumerate(zip(got, expected)):
        error = selfcheck.relative_error(value, reference_value)
        assert error <= tolerance, f"tensor {index}: relative error {error:.3g}"


# Where the arguments make the cell ill-conditioned (large values saturate
# the gates, and 1 - sigmoid(z) cancels; or a tiny shape makes a gradient one
# short sum whose terms cancel), selfcheck.TOLERANCES is widened: lltm_ffi
# must stay within CONDITIONING_FACTOR times the error of the reference cell
# itself computed in float32 (scaled by float64's epsilon over float32's for
# float64).
CONDITIONING_FACTOR = 20.0
EPSILON_RATIO = {torch.float32: 1.0, torch.float64: 2.0 ** -29}


def allowed_error(dtype, reference_float32_error):
    """The relative error lltm_ffi may have in `dtype` on arguments where the
    reference cell computed in float32 has `reference_float32_error`."""
    return max(selfcheck.TOLERANCES[dtype],
               CONDITIONING_FACTOR * EPSILON_RATIO[dtype] * reference_float32_error)


def cell_disagreements(shape, dtype, device, seed):
    """selfcheck.compare_with_reference of lltm_ffi.lltm at `shape` (batch,
    input_features, state_size): a description of each output or gradient
    whose relative error exceeds allowed_error; empty where all agree."""
    errors = selfcheck.compare_with_reference(*shape, dtype, device, seed=seed)
    assert errors["seed"] == seed
    names = selfcheck.OUTPUT_NAMES + selfcheck.GRADIENT_NAMES
    if all(errors[name] <= selfcheck.TOLERANCES[dtype] for name in names):
        return []
    conditioning = selfcheck.compare_with_reference(*shape, torch.float32, device, seed=seed,
                                                    function=reference.lltm)
    allowed = {name: allowed_error(dtype, conditioning[name]) for name in names}
    return [f"{name}: {errors[name]:.3g} > {allowed[name]:.3g} (reference in float32: "
            f"{conditioning[name]:.3g})" for name in names
            if not errors[name] <= allowed[name]]  # NaN fails


def assert_cell_agrees(shape, dtype, device, seed):
    failures = cell_disagreements(shape, dtype, device, seed)
    assert not failures, f"shape {shape_id(shape)}, {dtype}, seed {seed}: " + "; ".join(failures)


def replaced(inputs, name, value):
    """A copy of the five arguments with the one called `name` replaced."""
    inputs = list(inputs)
    inputs[ARGUMENT_NAMES.index(name)] = value
    return inputs


def raises_with(exception, *fragments):
    """pytest.raises for `exception` whose message holds every fragment, literally."""
    return pytest.raises(exception, match="".join(f"(?=[\\s\\S]*{re.escape(str(fragment))})"
                                                  for fragment in fragments))


def reference_sequence(inputs, weights, bias, h0, c0):
    """lltm_sequence's results from a loop of the reference cell."""
    h, c, outputs = h0, c0, []
    for step in inputs:
        h, c = lltm_ffi.reference.lltm(step, weights, bias, h, c)
        outputs.append(h)
    return torch.stack(outputs), (h, c)
