"""Fixtures and helpers shared by the lltm_ffi tests.

Every test draws fresh random inputs. Tests that take the `seed` (or
`generator`) fixture print the seed in their failure report; setting
LLTM_TEST_SEED to it replays the same inputs.
"""

import os
import re
import sys
from pathlib import Path

import pytest
import torch

# The checkout under test comes first, also for a plain `pytest` run from elsewhere.
REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import lltm_ffi  # noqa: E402
from lltm_ffi import selfcheck  # noqa: E402

ARGUMENT_NAMES = ("input", "weights", "bias", "old_h", "old_cell")
SEED_VARIABLE = "LLTM_TEST_SEED"
NO_GPU = "no CUDA device: torch.cuda.is_available() is False"


def skip_without_gpu():
    if not torch.cuda.is_available():
        pytest.skip(NO_GPU)


@pytest.fixture(params=["cpu", "cuda"])
def device(request):
    """Each device lltm_ffi runs on; the cuda case skips where there is no GPU."""
    if request.param == "cuda":
        skip_without_gpu()
    return torch.device(request.param)


@pytest.fixture
def cuda_device():
    """The GPU, for tests that need one whatever else they run on."""
    skip_without_gpu()
    return torch.device("cuda")


@pytest.fixture(params=[torch.float32, torch.float64], ids=["float32", "float64"])
def dtype(request):
    return request.param


@pytest.fixture
def seed(request):
    """A fresh random seed (or $LLTM_TEST_SEED), shown in the report if the test fails."""
    replay = os.environ.get(SEED_VARIABLE)
    value = int(replay) if replay else torch.Generator().seed()
    request.node.lltm_seed = value
    return value


@pytest.fixture
def generator(seed):
    return torch.Generator().manual_seed(seed)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    value = getattr(item, "lltm_seed", None)
    if report.failed and value is not None:
        report.sections.append(("random inputs", f"replay with {SEED_VARIABLE}={value}"))
    return report


def shape_id(shape):
    """'3x5x7' for (batch, input_features, state_size) = (3, 5, 7)."""
    return "x".join(str(size) for size in shape)


def random_inputs(generator, shape, dtype=torch.float64, device="cpu"):
    """[input, weights, bias, old_h, old_cell] for shape (batch, features, state)."""
    return list(selfcheck.random_inputs(*shape, dtype, device, generator))


def random_like(tensor, generator):
    """Unit-normal values with `tensor`'s shape, dtype and device."""
    return torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype).to(tensor.device)


def as_leaves(tensors, requires_grad=True):
    """Leaf tensors sharing the values and strides of `tensors`."""
    return [tensor.detach().requires_grad_(requires_grad) for tensor in tensors]


def outputs_and_gradients(inputs, grad_outputs, function=lltm_ffi.lltm):
    """(new_h, new_cell) and the five inputs' .grad after backpropagating
    `grad_outputs` through `function` applied to leaf copies of `inputs`."""
    leaves = as_leaves(inputs)
    outputs = function(*leaves)
    torch.autograd.backward(outputs, grad_outputs)
    return [output.detach() for output in outputs], [leaf.grad for leaf in leaves]


def assert_tensors_close(actual, expected, names):
    """torch.testing.assert_close for each pair, the failure naming the tensor."""
    assert len(actual) == len(expected) == len(names)
    for name, value, reference in zip(names, actual, expected):
        torch.testing.assert_close(value, reference,
                                   msg=lambda message, name=name: f"{name}: {message}")


def assert_agrees_with_reference(errors, dtype):
    """Checks a selfcheck.compare_with_reference result against its dtype's
    tolerance; the failure message holds the seed and every error."""
    expected_names = {"seed", *selfcheck.OUTPUT_NAMES, *selfcheck.GRADIENT_NAMES}
    assert set(errors) == expected_names, f"unexpected result keys: {sorted(errors)}"
    name, error = selfcheck.worst(errors)
    tolerance = selfcheck.TOLERANCES[dtype]
    details = ", ".join(f"{key}={value:.3g}" for key, value in errors.items() if key != "seed")
    assert error <= tolerance, (f"{name} relative error {error:.3g} exceeds {tolerance:g} "
                                f"(seed {errors['seed']}; {details})")


def replaced(inputs, name, value):
    """A copy of the five arguments with the one called `name` replaced."""
    inputs = list(inputs)
    inputs[ARGUMENT_NAMES.index(name)] = value
    return inputs


def raises_with(exception, *fragments):
    """pytest.raises for `exception` whose message holds every fragment, literally."""
    return pytest.raises(exception, match="".join(f"(?=[\\s\\S]*{re.escape(str(fragment))})"
                                                  for fragment in fragments))
