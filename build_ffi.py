"""Builds lltm_ffi/_lltm_ffi*.so with cffi in out-of-line API mode.

Two ways in, one build:

- `make` (the primary one) compiles src/*.cu with nvcc, names the objects in
  LLTM_KERNEL_OBJECTS (empty for `make CUDA=0`) and runs this file;
- `pip install .` reaches `ffibuilder` through setuptools' cffi_modules
  (setup.py). LLTM_KERNEL_OBJECTS is then unset, so this file finds nvcc
  itself ($NVCC, PATH, $CUDA_HOME/bin) and compile_kernels() compiles src/*.cu
  with the Makefile's flags; without nvcc, or with LLTM_CUDA=0, the module is
  CPU-only. Running this file by hand does the same.

The module holds the C shim and the CPU passes and links the CUDA runtime
statically, so it needs no torch header and no libtorch.

    python build_ffi.py [-q]        build in place, as `make` does
    python build_ffi.py --cuda-arch print the default nvcc -gencode flags
"""

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent

# Turing to Blackwell as machine code, and PTX of the newest for GPUs after it
# (CUDA 13 builds nothing older than sm_75). The Makefile's CUDA_ARCH default
# is this, too: it asks `python build_ffi.py --cuda-arch`.
MACHINE_CODE_ARCHS = (75, 80, 86, 89, 90, 100, 120)
DEFAULT_CUDA_ARCH = " ".join(
    [f"-gencode arch=compute_{sm},code=sm_{sm}" for sm in MACHINE_CODE_ARCHS]
    + [f"-gencode arch=compute_{MACHINE_CODE_ARCHS[-1]},code=compute_{MACHINE_CODE_ARCHS[-1]}"])
# The Makefile's NVCC_FLAGS ahead of $(CUDA_ARCH); tests/test_packaging.py
# checks that both compile a kernel with the same command.
NVCC_FLAGS = ("-O3", "-std=c++17", "-Xcompiler", "-fPIC")
C_SOURCES = ("src/lltm_shim.c", "src/lltm_cpu.c", "src/round_cpu.c")


def _load_build_info():
    spec = importlib.util.spec_from_file_location(
        "lltm_ffi_build_info", ROOT / "lltm_ffi" / "_build_info.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cuda_arch():
    """The nvcc -gencode flags: $LLTM_CUDA_ARCH (make passes its CUDA_ARCH) or the default."""
    return os.environ.get("LLTM_CUDA_ARCH") or DEFAULT_CUDA_ARCH


def arch_names(flags):
    """What nvcc `flags` put into the kernels, as the module reports it:
    'sm_75 sm_80 ... compute_120' (sm_: machine code, compute_: PTX)."""
    codes = (re.findall(r"code=\[?([\w,]+)", flags)
             or re.findall(r"(?:-arch|--gpu-architecture)[= ](\w+)", flags))
    names = []
    for code in codes:
        names += [name for name in code.split(",") if name and name not in names]
    return " ".join(names)


def kernels_from_make():
    """The kernel objects make compiled ([] for `make CUDA=0`), or None when
    make did not run this file."""
    objects = os.environ.get("LLTM_KERNEL_OBJECTS")
    return None if objects is None else objects.split()


def find_nvcc():
    """nvcc for a build without make: $NVCC, else the one on PATH, else
    $CUDA_HOME/bin/nvcc; None when there is none or LLTM_CUDA=0."""
    if os.environ.get("LLTM_CUDA") == "0":
        return None
    candidates = [os.environ.get("NVCC"), "nvcc"]
    if os.environ.get("CUDA_HOME"):
        candidates.append(os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc"))
    for candidate in candidates:
        found = candidate and shutil.which(candidate)
        if found:
            return found
    return None


def cuda_home_of(nvcc):
    """Where nvcc itself looks for its headers and libraries (nvcc may be a
    wrapper script elsewhere), as the Makefile finds it."""
    dryrun = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull],
                            capture_output=True, text=True)
    for line in (dryrun.stdout + dryrun.stderr).splitlines():
        if line.startswith("#$ TOP="):
            return os.path.realpath(line[len("#$ TOP="):])
    return str(Path(nvcc).resolve().parent.parent)


def kernel_command(nvcc, source, output, flags):
    """The nvcc command line for one .cu file, the Makefile's recipe (run in ROOT)."""
    return [nvcc, *NVCC_FLAGS, *shlex.split(flags), "-Iinclude", "-c", source, "-o", output]


def compile_kernels(build_dir):
    """Compiles every src/*.cu into build_dir when make has not and nvcc is
    found; returns the objects to link ([] for a CPU-only build)."""
    nvcc = None if kernels_from_make() is not None else find_nvcc()
    if nvcc is None:
        return []
    build_dir = Path(build_dir).resolve()
    build_dir.mkdir(parents=True, exist_ok=True)
    objects = []
    for source in sorted((ROOT / "src").glob("*.cu")):
        output = str(build_dir / (source.stem + ".o"))
        command = kernel_command(nvcc, source.relative_to(ROOT).as_posix(), output, cuda_arch())
        print(shlex.join(command), flush=True)
        subprocess.run(command, cwd=ROOT, check=True)
        objects.append(output)
    return objects


def make_ffibuilder(kernel_objects=(), for_setuptools=False):
    """The cffi builder of lltm_ffi._lltm_ffi, with CUDA when make compiled the
    kernels or (without make) nvcc is found; kernel_objects adds objects to link.
    Sources are named from ROOT for setuptools, which runs there and refuses
    absolute paths, and absolutely for ffibuilder.compile(), which changes
    directory."""
    import cffi

    def source_path(name):
        return name if for_setuptools else str(ROOT / name)

    build_info = _load_build_info()
    from_make = kernels_from_make()
    if from_make is not None:
        with_cuda = bool(from_make)
        cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    else:
        nvcc = find_nvcc()
        with_cuda = nvcc is not None
        cuda_home = os.environ.get("CUDA_HOME") or (nvcc and cuda_home_of(nvcc))

    define_macros = [
        ("LLTM_SOURCE_HASH", '"%s"' % build_info.source_hash(ROOT)),
        ("LLTM_PACKAGE_VERSION", '"%s"' % build_info.VERSION),
    ]
    include_dirs = [str(ROOT / "include")]
    extra_objects = [str(Path(path).resolve()) for path in (from_make or [])] + list(kernel_objects)
    library_dirs = []
    libraries = []
    if with_cuda:
        define_macros += [("LLTM_WITH_CUDA", "1"),
                          ("LLTM_CUDA_ARCHS", '"%s"' % arch_names(cuda_arch()))]
        include_dirs.append(os.path.join(cuda_home, "include"))
        library_dirs.append(os.path.join(cuda_home, "lib64"))
        # The static runtime keeps the module independent of whichever
        # libcudart torch happens to ship.
        libraries += ["cudart_static", "stdc++", "rt", "pthread", "dl"]

    ffibuilder = cffi.FFI()
    ffibuilder.cdef((ROOT / "include" / "lltm_ffi.h").read_text())
    ffibuilder.set_source(
        "lltm_ffi._lltm_ffi",
        '#include <stdint.h>\n#include "lltm_ffi.h"\n',
        sources=[source_path(name) for name in C_SOURCES],
        include_dirs=include_dirs,
        define_macros=define_macros,
        extra_objects=extra_objects,
        library_dirs=library_dirs,
        libraries=libraries,
        extra_compile_args=["-O3", "-fopenmp", "-Wall"],
        extra_link_args=["-fopenmp"],
        # The file name make writes (_lltm_ffi.cpython-*.so), not .abi3.so,
        # so that an editable pip build replaces make's module instead of
        # sitting beside it.
        py_limited_api=False,
    )
    return ffibuilder


def main(arguments):
    if arguments == ["--cuda-arch"]:
        print(DEFAULT_CUDA_ARCH)
        return
    kernel_objects = compile_kernels(ROOT / "build" / "kernels")
    ffibuilder = make_ffibuilder(kernel_objects)
    built = Path(ffibuilder.compile(tmpdir=str(ROOT / "build"), verbose="-q" not in arguments))
    installed = ROOT / "lltm_ffi" / built.name
    # A new file renamed over the old one: a process that has the old module
    # loaded keeps its mapping instead of reading a half-written copy.
    staging = installed.with_name(installed.name + ".new")
    shutil.copyfile(built, staging)
    os.replace(staging, installed)
    with_cuda = bool(kernels_from_make() or kernel_objects)
    print("built %s (CUDA: %s)" % (installed.relative_to(ROOT), "yes" if with_cuda else "no"))


if __name__ == "__main__":
    main(sys.argv[1:])
else:  # setup.py: cffi_modules=["build_ffi.py:ffibuilder"]
    ffibuilder = make_ffibuilder(for_setuptools=True)
