"""What any op's tests use (pytest is needed here only): the fixtures that
run a test on every device and dtype, seeded random inputs with the seed a
failure report names, and the comparison with a float64 reference. An op
folder's tests find the fixtures through lltm_ffi/ops/conftest.py; the
suite under tests/ through tests/conftest.py.

Seeds: every test has one, fixed (derived from the test's id), so a run
draws the same inputs as the last and CI never meets a seed of its own.
Each test's seed also seeds torch's global generators and Python's
`random` before it runs, so what a test draws without a generator of its
own (module parameters, dropout) does not depend on what ran before it.
LLTM_TEST_SEED=<seed> gives every test that seed (a failure report names
it); LLTM_TEST_SEED=random gives each a fresh one (`make seed-hunt`).

Markers (registered in pyproject.toml): a test that runs on a GPU is
marked `gpu` (the cuda case of `device`, and every test that takes
`cuda_device`, are marked here), one that needs two GPUs `multi_gpu`; the
GPU scripts select by them (`pytest -m gpu`).
"""

import os
import random
import zlib

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


def compiled_capability(device):
    """The compute capability of the code lltm_ffi runs on the GPU `device`,
    as (major, minor): the GPU's own for a module built for it, (7, 5) for
    one built where there was no GPU (PTX for compute_75 alone, whose
    tensor-core and cluster kernels are empty); what a test expects a path
    of those kernels on. None where the module has no code for the GPU."""
    from . import _extension
    from .diagnostics import capability_of, covering_arch
    archs = _extension.ffi.string(_extension.lib.lltm_cuda_archs()).decode()
    covering = covering_arch(archs, *torch.cuda.get_device_capability(device))
    if covering is None:
        return None
    return divmod(capability_of(covering), 10)


@pytest.fixture
def cuda_device():
    """The GPU, for tests that need one whatever else they run on."""
    skip_without_gpu()
    return torch.device("cuda")


@pytest.fixture(params=FLOATING_DTYPES, ids=["float32", "float64"])
def dtype(request):
    return request.param


def seed_for(name):
    """The seed of the test, fixture or child process called `name`: fixed
    (a CRC-32 of the name) unless $LLTM_TEST_SEED says a seed, or `random`
    for a fresh one."""
    setting = os.environ.get(SEED_VARIABLE, "").strip()
    if setting == "random":
        return torch.Generator().seed() % 2 ** 63
    if setting:
        return int(setting)
    return zlib.crc32(name.encode())


def _seed_of(node):
    if not hasattr(node, "lltm_seed"):
        node.lltm_seed = seed_for(node.nodeid)
    return node.lltm_seed


@pytest.fixture(autouse=True)
def seeded_global_generators(request):
    """torch's global generators (every device's) and Python's `random`,
    seeded with the test's seed."""
    value = _seed_of(request.node)
    torch.manual_seed(value)
    random.seed(value)


@pytest.fixture
def seed(request):
    """The test's seed (see the module's docstring), shown in the report if it fails."""
    return _seed_of(request.node)


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


def pytest_configure(config):
    """Under pytest-xdist (`-n`), each worker gives torch, and so the CPU
    passes, its share of the cores: workers that each start a team of every
    core wait on each other's threads at every step of a CPU pass."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // int(workers)))


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
