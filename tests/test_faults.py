"""Faults that come from CUDA itself, through the C shim (GPU only; skips
cleanly without one): the shim returns CUDA's error code, _extension turns it
into lltm_ffi.LLTMError with CUDA's own message, and the ordinary path still
works afterwards in the same process.

Only a non-sticky error is provoked (an invalid device ordinal): a sticky one
(an illegal address) would ruin the CUDA context for the rest of the test
session. (A stream of another GPU is no fault: the launch goes to the
stream's device.)

    python -m pytest -q tests/test_faults.py
"""

import pytest
import torch

import lltm_ffi
from conftest import cell_disagreements, skip_without_gpu
from lltm_ffi import _extension

BATCH, STATE = 3, 5


# Every test here takes a GPU.
pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda_lib():
    """The compiled module's lib, where there is a GPU and the module has CUDA."""
    skip_without_gpu()
    if not lltm_ffi.CUDA_COMPILED:
        pytest.skip("lltm_ffi was built without CUDA")
    return _extension.require()


def _pass_tensors(device):
    """gates, old_cell, new_h, new_cell, grad_h, grad_cell, d_old_cell, d_gates (float32)."""
    state_shape, gates_shape = (BATCH, STATE), (BATCH, 3 * STATE)
    return [torch.randn(shape, device=device) for shape in
            (gates_shape, state_shape, state_shape, state_shape, state_shape, state_shape,
             state_shape, gates_shape)]


def _run(lib, name, sizes, tensors, device_index, stream):
    """The pass `name` through lltm_run, as _extension calls it, on `device_index`."""
    pass_id = _extension.PASSES[name][0]
    return lib.lltm_run(pass_id, lib.LLTM_FLOAT32, device_index, stream, sizes, [],
                        [tensor.data_ptr() for tensor in tensors])


def _forward(lib, tensors, device_index, stream):
    gates, old_cell, new_h, new_cell = tensors[:4]
    return _run(lib, "forward_pass", [BATCH, STATE], (gates, old_cell, new_h, new_cell),
                device_index, stream)


def _backward(lib, tensors, device_index, stream):
    gates, _, _, new_cell, grad_h, grad_cell, d_old_cell, d_gates = tensors
    return _run(lib, "backward_pass", [BATCH, STATE, STATE, 1, STATE, 1],
                (grad_h, grad_cell, new_cell, gates, d_old_cell, d_gates), device_index, stream)


def _assert_ordinary_path_works(device, seed, when):
    """lltm_ffi.lltm forward and backward against the reference, on both kernel
    paths (state 8: 16-byte packs; state 7: one element)."""
    for shape in ((4, 6, 8), (3, 5, 7)):
        try:
            failures = cell_disagreements(shape, torch.float32, device, seed)
            torch.cuda.synchronize(device)
        except lltm_ffi.LLTMError as error:
            pytest.fail(f"{when}, an ordinary call of shape {shape} failed: {error}. If this is "
                        f"the fault's error again, the shim left it set in the CUDA runtime "
                        f"(cudaGetLastError after the next launch returns it): clear it with "
                        f"cudaGetLastError() where the shim returns an error")
        assert not failures, f"{when}, shape {shape}: " + "; ".join(failures)


def test_device_that_does_not_exist_is_an_lltm_error_with_cuda_message(cuda_lib, seed):
    device = torch.device("cuda", torch.cuda.current_device())
    _assert_ordinary_path_works(device, seed, "before the fault")
    tensors = _pass_tensors(device)
    stream = torch.cuda.current_stream(device).cuda_stream
    missing = torch.cuda.device_count() + 7

    for name, call in (("forward_pass", _forward), ("backward_pass", _backward)):
        code = call(cuda_lib, tensors, missing, stream)
        assert code != 0, f"{name} on device {missing} of {torch.cuda.device_count()} returned 0"
        with pytest.raises(lltm_ffi.LLTMError) as raised:
            _extension.check(name, code)
        error = raised.value
        assert isinstance(error, RuntimeError)
        assert "invalid device ordinal" in str(error), str(error)
        assert str(error).startswith(f"{name} failed: ") and f"(error code {code})" in str(error)
        assert (error.function, error.code) == (name, code)

    # The fault changed nothing the caller can see...
    assert torch.cuda.current_device() == device.index
    # ...and later calls in this process work.
    _assert_ordinary_path_works(device, seed, "after the invalid-device fault")

