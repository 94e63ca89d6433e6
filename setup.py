"""pip's way in (see pyproject.toml): setuptools builds lltm_ffi._lltm_ffi from
build_ffi.py's ffibuilder, and compiles src/*.cu first when build_ffi.py finds
nvcc. `make` is the other way in, and the primary one."""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext


def _load_build_ffi():
    spec = importlib.util.spec_from_file_location(
        "lltm_build_ffi", Path(__file__).resolve().parent / "build_ffi.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildExtWithKernels(build_ext):
    def pre_run(self, ext, ffi):
        # cffi calls this just before it writes the module's C source; the
        # kernels compile here rather than when setup.py is read, which pip
        # does several times (metadata, then the build).
        ext.extra_objects += _load_build_ffi().compile_kernels(Path(self.build_temp) / "kernels")


setup(
    cffi_modules=["build_ffi.py:ffibuilder"],
    cmdclass={"build_ext": BuildExtWithKernels},
    options={
        # setuptools' metadata under build/ too, where `make clean` removes it.
        "egg_info": {"egg_base": "build"},
        # Always rebuild: setuptools would keep a module built with other
        # settings (CPU-only, say, or other CUDA_ARCH) from the same sources.
        "build_ext": {"force": True},
    },
)
