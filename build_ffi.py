"""Builds lltm_ffi/_lltm_ffi*.so with cffi in out-of-line API mode.

Run by `make`, which first compiles src/*.cu with nvcc and names the objects
in LLTM_KERNEL_OBJECTS (space-separated); without them the module is CPU-only. The module
holds the C shim and the CPU passes and links the CUDA runtime statically, so
it needs no torch header and no libtorch.
"""

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import cffi

ROOT = Path(__file__).resolve().parent


def _load_build_info():
    spec = importlib.util.spec_from_file_location(
        "lltm_ffi_build_info", ROOT / "lltm_ffi" / "_build_info.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_info = _load_build_info()
kernel_objects = os.environ.get("LLTM_KERNEL_OBJECTS", "").split()
cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")

define_macros = [
    ("LLTM_SOURCE_HASH", '"%s"' % build_info.source_hash(ROOT)),
    ("LLTM_PACKAGE_VERSION", '"%s"' % build_info.VERSION),
]
include_dirs = [str(ROOT / "include")]
extra_objects = []
library_dirs = []
libraries = []
if kernel_objects:
    define_macros.append(("LLTM_WITH_CUDA", "1"))
    include_dirs.append(os.path.join(cuda_home, "include"))
    extra_objects += [str(Path(kernel_object).resolve()) for kernel_object in kernel_objects]
    library_dirs.append(os.path.join(cuda_home, "lib64"))
    # The static runtime keeps the module independent of whichever
    # libcudart torch happens to ship.
    libraries += ["cudart_static", "stdc++", "rt", "pthread", "dl"]

ffibuilder = cffi.FFI()
ffibuilder.cdef((ROOT / "include" / "lltm_ffi.h").read_text())
ffibuilder.set_source(
    "lltm_ffi._lltm_ffi",
    '#include <stdint.h>\n#include "lltm_ffi.h"\n',
    sources=[str(ROOT / "src" / "lltm_shim.c"), str(ROOT / "src" / "lltm_cpu.c")],
    include_dirs=include_dirs,
    define_macros=define_macros,
    extra_objects=extra_objects,
    library_dirs=library_dirs,
    libraries=libraries,
    extra_compile_args=["-O3", "-fopenmp", "-Wall"],
    extra_link_args=["-fopenmp"],
)

if __name__ == "__main__":
    built = Path(ffibuilder.compile(tmpdir=str(ROOT / "build"), verbose="-q" not in sys.argv))
    installed = ROOT / "lltm_ffi" / built.name
    shutil.copyfile(built, installed)
    print("built %s (CUDA: %s)" % (installed.relative_to(ROOT), "yes" if kernel_objects else "no"))
