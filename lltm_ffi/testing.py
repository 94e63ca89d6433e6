"""What any op's tests use (pytest is needed here only): the fixtures that
run a test on every device and dtype, fresh random inputs with a seed a
failure report names, and the comparison with a float64 reference. An op
folder's tests find the fixtures through lltm_ffi/ops/conftest.py; the
suite under tests/ through tests/conftest.py.

Markers (registered in pyproject.toml): a test that runs on a GPU is
marked `gpu` (the cuda case of `device`, and every test that takes
`cuda_device`, are marked here), one that needs two GPUs `multi_gpu`; the
GPU scripts select by them (`pytest -m gpu`).
"""

import os

import pytest
import torch

# TOLERANCES: what assert_close_to_reference is usually given, one per dtype.
from .selfcheck import TOLERANCES, relative_error  # noqa: F401

SEED_VARIABLE = "LLTM_TEST_SEED"
NO_GPU = "no CUDA device: torch.cuda.is_available() is False"
NO_SECOND_GPU = "needs two CUDA devices"
FLOATING_DTYPES = (torch.float32, torch.float64)


def skip_without_gpu():
    if not torch.cuda.is_available():
        pytest.skip(NO_GPU)


def skip_without_two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip(NO_SECOND_GPU)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
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


@pytest.fixture(params=FLOATING_DTYPES, ids=["float32", "float64"])
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


def pytest_collection_modifyitems(items):
    for item in items:
        if "cuda_device" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.gpu)


def assert_close_to_reference(got, expected, names, tolerance):
    """relative_error of each pair (got, expected, a float64 reference) at
    most `tolerance` (TOLERANCES[dtype], say); the failure names the tensor."""
    for name, value, reference in zip(names, got, expected, strict=True):
        assert value.shape == reference.shape, (
            f"{name} has shape {tuple(value.shape)}, reference {tuple(reference.shape)}")
        error = relative_error(value, reference)
        assert error <= tolerance, f"{name}: relative error {error:.3g} > {tolerance:g}"
