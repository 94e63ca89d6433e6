"""pip's way in (see pyproject.toml): setuptools builds lltm_ffi._lltm_ffi from
build_ffi.py's ffibuilder, after build_ffi.py has compiled the C sources and
(when it finds nvcc) the CUDA sources. `make` is the other way in, and the
primary one.

A wheel or an editable install without the compiled module would install
"successfully" and fail at the first call, so the build refuses instead: it
stops when cffi is missing (setuptools would ignore cffi_modules, an option
it does not know without cffi, and build a pure-Python wheel), when
cffi_modules added no extension, and when the build wrote no module. The
module is sealed as make seals it (build_ffi.seal), before setuptools
copies it anywhere, so that the installed package can check it whole."""

import functools
import importlib.util
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
MODULE = "lltm_ffi._lltm_ffi"

try:
    import cffi  # noqa: F401  (setuptools reads cffi_modules through cffi's plugin)
except ImportError:
    sys.exit("lltm_ffi: building needs cffi (pip install cffi), which pip's build isolation "
             "installs from pyproject.toml; with --no-build-isolation this Python must have it. "
             "Without cffi the wheel would have no compiled module.")


@functools.cache
def _load_build_ffi():
    spec = importlib.util.spec_from_file_location("lltm_build_ffi", ROOT / "build_ffi.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _require_extension(distribution):
    names = [extension.name for extension in distribution.ext_modules or []]
    if MODULE not in names:
        raise SystemExit(f"lltm_ffi: cffi_modules added no {MODULE} extension (extensions: "
                         f"{names or 'none'}); refusing to build without the compiled module")


class BuildPyRequiringTheModule(build_py):
    # Runs for a wheel and for an editable install alike, before anything is packed.
    def run(self):
        _require_extension(self.distribution)
        super().run()


class BuildExtWithKernels(build_ext):
    def pre_run(self, ext, ffi):
        # cffi calls this just before it writes the module's C source; the
        # sources compile here rather than when setup.py is read, which pip
        # does several times (metadata, then the build).
        ext.extra_objects += _load_build_ffi().compile_objects(Path(self.build_temp) / "objects")

    def build_extension(self, ext):
        # Linked into the build folder; an editable install copies it from
        # there into the package afterwards.
        super().build_extension(ext)
        if ext.name == MODULE:
            _load_build_ffi().seal(self.get_ext_fullpath(ext.name))

    def run(self):
        _require_extension(self.distribution)
        super().run()
        for extension in self.extensions:
            built = Path(self.get_ext_fullpath(extension.name))
            if not built.is_file():
                raise SystemExit(f"lltm_ffi: building {extension.name} wrote no {built}")


# setuptools' metadata goes under build/ (egg_base, relative to the project
# directory that pip runs this in), where `make clean` removes it; setuptools
# refuses an egg_base that does not exist, and in a fresh clone nothing has
# made build/ yet.
Path("build").mkdir(exist_ok=True)

setup(
    cffi_modules=["build_ffi.py:ffibuilder"],
    cmdclass={"build_ext": BuildExtWithKernels, "build_py": BuildPyRequiringTheModule},
    options={
        "egg_info": {"egg_base": "build"},
        # Always rebuild: setuptools would keep a module built with other
        # settings (CPU-only, say, or other CUDA_ARCH) from the same sources.
        "build_ext": {"force": True},
    },
)
