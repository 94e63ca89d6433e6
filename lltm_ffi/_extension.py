"""The compiled cffi module and the two fused passes called through it.

This is the only file that touches pointers: it takes data_ptr(), the sizes
and the current CUDA stream of the tensors' device, and hands them to the C
shim. The tensors it receives are already checked (lltm_ffi.function): right
dtype, one device, contiguous, consistent shapes.

A missing, unloadable or stale module is detected when the package is
imported, which warns (LLTMBuildWarning); the error itself (LLTMBuildError)
is raised by the first call that needs the module, so that the reference
cell, the diagnostics and everything else that does not need it still work.
"""

import warnings
from pathlib import Path

import torch

from . import _build_info

ROOT = Path(__file__).resolve().parent.parent


class LLTMError(RuntimeError):
    """A non-zero code from the C shim, with the shim's (CUDA's) own message."""

    def __init__(self, function, code, message):
        super().__init__(f"{function} failed: {message} (error code {code})")
        self.function = function
        self.code = code


class LLTMBuildError(ImportError):
    """The compiled module is missing, does not load, or is stale."""


class LLTMBuildWarning(UserWarning):
    """Issued at import when the compiled module cannot be used."""


def _load():
    package = Path(__file__).resolve().parent
    if not any(package.glob("_lltm_ffi*.so")):
        raise LLTMBuildError(f"lltm_ffi's compiled module is not built (no _lltm_ffi*.so in "
                             f"{package}); build it with `make` in {ROOT}")
    try:
        import _cffi_backend  # noqa: F401  (what every cffi module needs at load)
    except ImportError as error:
        raise LLTMBuildError("lltm_ffi needs cffi: pip install cffi") from error
    try:
        from . import _lltm_ffi
    except ImportError as error:
        raise LLTMBuildError(f"lltm_ffi's compiled module does not load ({error}); "
                             f"rebuild it with `make clean && make` in {ROOT}") from error
    ffi, lib = _lltm_ffi.ffi, _lltm_ffi.lib
    built_version = ffi.string(lib.lltm_package_version()).decode()
    if built_version != _build_info.VERSION:
        raise LLTMBuildError(
            f"lltm_ffi's compiled module ({_lltm_ffi.__file__}) is stale: it was built for "
            f"version {built_version}, the package is {_build_info.VERSION}; rebuild with `make`")
    if (ROOT / "build_ffi.py").is_file():
        built_hash = ffi.string(lib.lltm_source_hash()).decode()
        current_hash = _build_info.source_hash(ROOT)
        if built_hash != current_hash:
            raise LLTMBuildError(
                f"lltm_ffi's compiled module ({_lltm_ffi.__file__}) is stale: the C/CUDA "
                f"sources changed since it was built (hash {built_hash}, now {current_hash}); "
                f"rebuild with `make`")
    return ffi, lib, _lltm_ffi.__file__


try:
    ffi, lib, MODULE_PATH = _load()
    LOAD_ERROR = None
except LLTMBuildError as error:
    ffi = lib = MODULE_PATH = None
    LOAD_ERROR = error
    warnings.warn(str(error), LLTMBuildWarning, stacklevel=2)


def require():
    """The compiled module's lib, or LLTMBuildError saying what to do."""
    if lib is None:
        raise LLTMBuildError(str(LOAD_ERROR)) from LOAD_ERROR.__cause__
    return lib


# Read once: a plain bool is what torch.compile can trace through.
_CUDA_COMPILED = bool(lib.lltm_cuda_compiled()) if lib is not None else None


def cuda_compiled():
    if _CUDA_COMPILED is None:
        require()
    return _CUDA_COMPILED


def check_cuda_compiled(function):
    """LLTMError with the shim's own message (LLTM_ERROR_NO_CUDA) when the
    module was built without its CUDA kernels."""
    if not cuda_compiled():
        code = lib.LLTM_ERROR_NO_CUDA
        raise LLTMError(function, code, error_message(code))


POINTER_TYPES = {torch.float32: "float *", torch.float64: "double *"}


def _functions(prefix):
    """{dtype: lib.<prefix>_float or _double}; empty without a usable module."""
    if lib is None:
        return {}
    return {torch.float32: getattr(lib, prefix + "_float"),
            torch.float64: getattr(lib, prefix + "_double")}


_cast = ffi.cast if ffi is not None else None
_CPU_FORWARD = _functions("lltm_forward_cpu")
_CPU_BACKWARD = _functions("lltm_backward_cpu")
_CUDA_FORWARD = _functions("lltm_forward_cuda")
_CUDA_BACKWARD = _functions("lltm_backward_cuda")

# A raw cudaStream_t as an int, without building a torch.cuda.Stream object.
_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream)


def error_message(code):
    return ffi.string(require().lltm_error_string(code)).decode()


def _check(function, code):
    if code:
        raise LLTMError(function, code, error_message(code))


def _call(cpu_functions, cuda_functions, name, reference, arguments, tensors):
    """Calls the pass for `reference`'s dtype and device with the integer
    `arguments` (sizes, strides) and the addresses of `tensors`. The tensors
    stay referenced until the call returns, so the casts (which own nothing)
    stay valid."""
    if lib is None:
        require()
    pointer_type = POINTER_TYPES[reference.dtype]
    pointers = [_cast(pointer_type, tensor.data_ptr()) for tensor in tensors]
    device = reference.device
    if device.type == "cuda":
        index = device.index
        stream = _cast("void *", _current_raw_stream(index))
        code = cuda_functions[reference.dtype](*arguments, *pointers, index, stream)
    else:
        code = cpu_functions[reference.dtype](*arguments, *pointers)
    _check(name, code)


def dense(tensor):
    """`tensor` as C can read it: contiguous, with torch's lazy negation
    (the negative bit of views such as x.conj().imag) applied. No copy when
    it already is."""
    return tensor.resolve_neg().contiguous()


def forward(gates, old_cell):
    """new_h, new_cell of the cell from the pre-activation gates (batch, 3 * state),
    dense (as F.linear makes them), and old_cell (batch, state), any layout."""
    old_cell = dense(old_cell)
    new_h = torch.empty_like(old_cell)
    new_cell = torch.empty_like(old_cell)
    if old_cell.numel():
        _call(_CPU_FORWARD, _CUDA_FORWARD, "lltm_forward", old_cell, old_cell.shape,
              (gates, old_cell, new_h, new_cell))
    return new_h, new_cell


def backward(grad_h, grad_cell, new_cell, gates):
    """d_old_cell (batch, state) and d_gates (batch, 3 * state) from the output
    gradients and what forward saved (dense). The gradients are read through
    their strides: autograd often hands over broadcast views, which need no copy."""
    grad_h, grad_cell = grad_h.resolve_neg(), grad_cell.resolve_neg()
    d_old_cell = torch.empty_like(new_cell)
    d_gates = torch.empty_like(gates)
    if new_cell.numel():
        _call(_CPU_BACKWARD, _CUDA_BACKWARD, "lltm_backward", new_cell,
              (*new_cell.shape, *grad_h.stride(), *grad_cell.stride()),
              (grad_h, grad_cell, new_cell, gates, d_old_cell, d_gates))
    return d_old_cell, d_gates
