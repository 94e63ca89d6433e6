"""The binding to the compiled cffi module: loading it (and refusing a stale
or damaged build), the one call into C (lltm_run) for every pass of every
op, the helper that puts a tensor in the form C reads, torch's thread
count in a forked child, and handing C the path of the CPU passes' BLAS
(lltm_ffi/_blas.py finds it). The ops' declarations (lltm_ffi/op.py) check
their arguments before anything here sees them.

A missing, unloadable, damaged or stale module is detected when the package
is imported, which warns (LLTMBuildWarning); the error itself
(LLTMBuildError) is raised by the first call that needs the module, so that
the reference cell, the diagnostics and everything else that does not need
it still work. A process cannot load a module built after that: it is told
to restart Python.
"""

import os
import warnings
from pathlib import Path

import torch

from . import _blas, _build_info, _module_file, _torch_internals
from .errors import LLTMBuildError, LLTMBuildWarning, LLTMError

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(__file__).resolve().parent


def _file_identity():
    """(path, inode, size, modification time) of the module file
    `from . import _lltm_ffi` would load, or None where there is none."""
    module_file = _module_file.find(PACKAGE)
    try:
        status = module_file.stat() if module_file else None
    except OSError:  # renamed away meanwhile
        status = None
    return (module_file, status.st_ino, status.st_size, status.st_mtime_ns) if status else None


def _load():
    module_file = _module_file.find(PACKAGE)
    if module_file is None:
        others = sorted(path.name for path in PACKAGE.glob("_lltm_ffi*.so"))
        found = f" (only {', '.join(others)}, built for another Python)" if others else ""
        raise LLTMBuildError(f"lltm_ffi's compiled module is not built: no _lltm_ffi module for "
                             f"this Python in {PACKAGE}{found}; build it with `make` in {ROOT}")
    damage = _module_file.damage(module_file)
    if damage:
        raise LLTMBuildError(f"lltm_ffi's compiled module ({module_file}) is damaged: {damage}; "
                             f"rebuild it with `make` in {ROOT}")
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
    conflict = lib.lltm_pass_conflict()
    if conflict != ffi.NULL:
        # The registry kept the first of two passes of one name for one device:
        # one op would run another's pass, with arguments it does not take.
        what = ffi.string(conflict).decode()
        what = (what[1:-1] if what.startswith("(") else
                f"two LLTM_CPU_PASS or two LLTM_CUDA_PASS lines register the pass {what!r}")
        raise LLTMBuildError(f"lltm_ffi's compiled module ({_lltm_ffi.__file__}) refused a "
                             f"pass registration: {what}; give each pass its own name, then "
                             f"rebuild with `make` in {ROOT}")
    return ffi, lib, _lltm_ffi.__file__


# The module file as the import found it, for require() to tell whether a
# build replaced it since.
_FILE_AT_IMPORT = _file_identity()
try:
    ffi, lib, MODULE_PATH = _load()
    LOAD_ERROR = None
except LLTMBuildError as error:
    ffi = lib = MODULE_PATH = None
    LOAD_ERROR = error
    warnings.warn(str(error), LLTMBuildWarning, stacklevel=2)


def _one_thread_after_fork():
    """In a forked child, torch's OpenMP ops wait forever for OpenMP threads
    that stayed in the parent (GNU OpenMP does not survive fork), so that
    lltm_ffi.lltm would hang in its gate product; the C passes guard
    themselves (src/threads.c). The child runs torch on one thread instead,
    as DataLoader's workers do."""
    if torch.get_num_threads() > 1:
        torch.set_num_threads(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_one_thread_after_fork)


if lib is not None:
    _BLAS_PATH = _blas.library_path()
    if _BLAS_PATH is not None:
        lib.lltm_blas_library(os.fsencode(_BLAS_PATH))


def blas_config():
    """The CPU passes' BLAS as it describes itself ("OpenBLAS 0.3.34 ...
    Haswell ..."), loading it; "" where none is installed or loadable."""
    return ffi.string(require().lltm_blas_config()).decode()


def require():
    """The compiled module's lib, or LLTMBuildError saying what to do: what
    the import found wrong, or, where a module was built since, to restart
    Python (a process loads its module once, at import, and a stale one it
    loaded stays loaded)."""
    if lib is None:
        built_since = _file_identity()
        if built_since is not None and built_since != _FILE_AT_IMPORT:
            raise LLTMBuildError(
                f"lltm_ffi's compiled module ({built_since[0]}) was built after this Python "
                f"process imported lltm_ffi, which could not use the module there then; a "
                f"running process cannot load the new one: restart Python") from LOAD_ERROR
        raise LLTMBuildError(str(LOAD_ERROR)) from LOAD_ERROR.__cause__
    return lib


# Read once: a plain bool is what torch.compile can trace through.
_CUDA_COMPILED = bool(lib.lltm_cuda_compiled()) if lib is not None else None


def cuda_compiled():
    if _CUDA_COMPILED is None:
        require()
    return _CUDA_COMPILED


_AMX_USABLE = bool(lib.lltm_amx_usable()) if lib is not None else None


def amx_usable():
    """Whether the CPU passes of float16 and bfloat16 may take their products
    on AMX here, or on AVX512-BF16's dot products in its place
    (src/cpu/lltm_amx.h); LLTM_AMX=0 in the environment keeps them on the
    portable products all the same."""
    if _AMX_USABLE is None:
        require()
    return _AMX_USABLE


def error_message(code):
    return ffi.string(require().lltm_error_string(code)).decode()


def check_cuda_compiled(function):
    """LLTMError with the shim's own message (LLTM_ERROR_NO_CUDA) when the
    module was built without its CUDA kernels."""
    if not cuda_compiled():
        code = lib.LLTM_ERROR_NO_CUDA
        raise LLTMError(function, code, error_message(code))


FULL_PRECISION_DTYPES = (torch.float32, torch.float64)
HALF_DTYPES = (torch.float16, torch.bfloat16)
# Every dtype lltm_run knows; which of them a pass takes on a device is
# pass_dtypes'.
DTYPES = FULL_PRECISION_DTYPES + HALF_DTYPES
_DTYPE_CODES = ({torch.float32: lib.LLTM_FLOAT32, torch.float64: lib.LLTM_FLOAT64,
                 torch.float16: lib.LLTM_FLOAT16, torch.bfloat16: lib.LLTM_BFLOAT16}
                if lib is not None else {})
_current_raw_stream = _torch_internals.current_raw_stream
_get_num_threads = torch.get_num_threads

# The types whose instances are plain tensors with storage of their own
# (nn.Parameter is plain to everything but nn.Module).
PLAIN_TENSOR_TYPES = {torch.Tensor, torch.nn.Parameter}


def _registry():
    """{name: (id, device types, {device type: dtypes})} of every pass the
    compiled module registered, read once: the checks consult it on every
    call, also while torch.compile traces them, which a call into C would
    stop."""
    passes = {}
    for index in range(lib.lltm_pass_count()):
        bits = lib.lltm_pass_devices(index)
        devices = tuple(device for device, bit in (("cpu", lib.LLTM_ON_CPU),
                                                   ("cuda", lib.LLTM_ON_CUDA)) if bits & bit)
        dtypes = {}
        for device, bit in (("cpu", lib.LLTM_ON_CPU), ("cuda", lib.LLTM_ON_CUDA)):
            taken = lib.lltm_pass_dtypes(index, bit)
            dtypes[device] = tuple(dtype for dtype, code in _DTYPE_CODES.items()
                                   if taken & (1 << code))
        passes[ffi.string(lib.lltm_pass_name(index)).decode()] = (index, devices, dtypes)
    return passes


PASSES = _registry() if lib is not None else {}


def pass_dtypes(name, device_type):
    """The dtypes the pass `name` takes on `device_type` ("cpu" or "cuda");
    () where it has no version there."""
    pass_devices(name)
    return PASSES[name][2].get(device_type, ())


def pass_devices(name):
    """The device types the compiled module runs the pass `name` on ("cpu",
    "cuda"); LLTMBuildError where it has no such pass. Reads only PASSES
    when the pass is there, so that torch.compile traces it."""
    if name in PASSES:
        return PASSES[name][1]
    require()
    raise LLTMBuildError(
        f"lltm_ffi's compiled module has no pass {name!r}: no C or CUDA source under "
        f"src/ registers it with LLTM_CPU_PASS or LLTM_CUDA_PASS; check the name there, "
        f"then rebuild with `make` in {ROOT}")


class CPass:
    """The C pass registered as `name` (include/lltm_op.h), called through
    lltm_run."""

    __slots__ = ("name", "_id")

    def __init__(self, name):
        self.name = name
        self._id = None

    def __call__(self, sizes, tensors, scalars=(), options=None):
        """Runs the pass with `sizes` (ints), `scalars` (floats) and the
        addresses of `tensors`, for the dtype and device of the first of
        them, on that device's current CUDA stream (on the CPU, on as many
        threads as torch.get_num_threads() says); raises LLTMError with
        the shim's message for a non-zero code. A tensor given as None (left
        out) or with no elements is passed as NULL. The tensors stay
        referenced until the call returns, so their addresses stay valid.
        `options`, a pointer made by ffi.new (the sequence's
        lltm_sequence_options), goes after the tensors' addresses."""
        if self._id is None:
            pass_devices(self.name)  # LLTMBuildError where the module lacks the pass
            self._id = PASSES[self.name][0]
        pass_id = self._id
        reference = tensors[0]
        if reference.is_cuda:
            index = reference.get_device()
            stream = _current_raw_stream(index)
        else:
            index, stream = lib.LLTM_CPU, _get_num_threads()
        addresses = []
        for tensor in tensors:
            if tensor is None:
                addresses.append(0)
                continue
            address = tensor.data_ptr()
            if not address or type(tensor) not in PLAIN_TENSOR_TYPES:
                address = _checked_address(self.name, tensor, address)
            addresses.append(address)
        if options is not None:
            addresses.append(int(ffi.cast("intptr_t", options)))
        check(self.name, lib.lltm_run(pass_id, _DTYPE_CODES[reference.dtype], index, stream,
                                      sizes, scalars, addresses))


def check(function, code):
    """LLTMError naming `function`, with the shim's message, for a non-zero code."""
    if code:
        raise LLTMError(function, code, error_message(code))


def _checked_address(function, tensor, address):
    """`address` of a tensor with memory of its own, 0 for a plain tensor
    without elements; TypeError for a tensor without memory of its
    own at a non-null address: a fake tensor, or a subclass that overrides
    __torch_dispatch__ (a wrapper such as TwoTensor), has none, and C would
    write to address 0. Subclasses of __torch_function__ alone hold real
    memory and pass."""
    kind = type(tensor)
    dispatching = (kind not in PLAIN_TENSOR_TYPES
                   and kind.__torch_dispatch__ is not torch.Tensor.__torch_dispatch__)
    if not dispatching and (address or (kind in PLAIN_TENSOR_TYPES and tensor.numel() == 0)):
        return address
    raise TypeError(f"{function}: got a {kind.__module__}.{kind.__qualname__} without "
                    "memory of its own (a fake tensor or a __torch_dispatch__ subclass); "
                    "lltm_ffi's C passes take tensors with real storage, and lltm_ffi's "
                    "public functions route such tensors through the torch.library "
                    "operators")


def dense(tensor):
    """`tensor` as C can read it: contiguous, with torch's lazy negation
    (the negative bit of views such as x.conj().imag) applied. No copy, and
    no torch op, when it already is."""
    if tensor.is_contiguous() and not tensor.is_neg():
        return tensor
    return tensor.resolve_neg().contiguous()
