"""Builds lltm_ffi/_lltm_ffi*.so with cffi in out-of-line API mode: the C shim
and CPU passes, plus the CUDA kernels (src/*.cu, compiled with nvcc) when nvcc
is found. The one place that finds nvcc and CUDA and holds the nvcc flags and
architectures; `make` and pip both come here.

- `make` runs `python build_ffi.py`, which rebuilds whatever is missing,
  damaged or out of date (kernel objects, then the module) and nothing else,
  one build at a time per tree, each file renamed into place whole;
- `pip install .` reaches `ffibuilder` through setuptools' cffi_modules
  (setup.py), whose build step calls compile_kernels() first.

Settings, from the environment (make passes its variables of the same
meaning): NVCC (nvcc to use; else PATH, else $CUDA_HOME/bin), LLTM_CUDA=0 (a
CPU-only build), LLTM_CUDA_ARCH (nvcc -gencode flags instead of the default).

    python build_ffi.py [-v]      build in place, as `make` does (-v: cffi's compile lines)
"""

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
BUILD = ROOT / "build"

# Turing to Blackwell as machine code, and PTX of the newest for GPUs after it
# (CUDA 13 builds nothing older than sm_75).
MACHINE_CODE_ARCHS = (75, 80, 86, 89, 90, 100, 120)
DEFAULT_CUDA_ARCH = " ".join(
    [f"-gencode arch=compute_{sm},code=sm_{sm}" for sm in MACHINE_CODE_ARCHS]
    + [f"-gencode arch=compute_{MACHINE_CODE_ARCHS[-1]},code=compute_{MACHINE_CODE_ARCHS[-1]}"])
NVCC_FLAGS = ("-O3", "-std=c++17", "-Xcompiler", "-fPIC")
C_SOURCES = ("src/lltm_shim.c", "src/lltm_cpu.c", "src/round_cpu.c", "src/lltm_cublas.c")


def _load_from_package(name):
    """lltm_ffi/<name>.py, loaded by path: the package itself needs torch."""
    spec = importlib.util.spec_from_file_location(
        "lltm_ffi" + name, ROOT / "lltm_ffi" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_info = _load_from_package("_build_info")
module_file = _load_from_package("_module_file")


def cuda_arch():
    """The nvcc -gencode flags: $LLTM_CUDA_ARCH or the default."""
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


def find_nvcc():
    """$NVCC, else nvcc on PATH, else $CUDA_HOME/bin/nvcc; None when there is
    none or LLTM_CUDA=0 asks for a CPU-only build."""
    if os.environ.get("LLTM_CUDA") == "0":
        return None
    if os.environ.get("NVCC"):
        found = shutil.which(os.environ["NVCC"])
        if not found:
            raise SystemExit(f"build_ffi.py: NVCC={os.environ['NVCC']} is not an executable")
        return found
    candidates = ["nvcc"]
    if os.environ.get("CUDA_HOME"):
        candidates.append(os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc"))
    return next(filter(None, map(shutil.which, candidates)), None)


def cuda_home_of(nvcc):
    """Where nvcc itself looks for its headers and libraries (nvcc may be a
    wrapper script elsewhere)."""
    dryrun = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull],
                            capture_output=True, text=True)
    for line in (dryrun.stdout + dryrun.stderr).splitlines():
        if line.startswith("#$ TOP="):
            return os.path.realpath(line[len("#$ TOP="):])
    return str(Path(nvcc).resolve().parent.parent)


def kernel_command(nvcc, source, output):
    """The nvcc command line for one .cu file (run in ROOT)."""
    return [nvcc, *NVCC_FLAGS, *shlex.split(cuda_arch()), "-Iinclude", "-c", source, "-o", output]


def _digest(*parts):
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else str(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _install(data, destination):
    """Writes `data` to `destination` through a temporary name of this
    process's own, then renames it into place: a concurrent build or import
    never sees a partial file, and a process that has the old one loaded
    keeps it."""
    descriptor, staging = tempfile.mkstemp(dir=destination.parent, prefix=destination.name + ".")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(staging, 0o755)
        os.replace(staging, destination)
    except BaseException:
        if os.path.exists(staging):
            os.unlink(staging)
        raise


def compile_kernels(build_dir):
    """Compiles every src/*.cu into build_dir when nvcc is found, each object
    named by a hash of its command and of every source it can include, so
    an object is reused only when it is exactly what a compile would make;
    returns the objects to link ([] for a CPU-only build)."""
    nvcc = find_nvcc()
    if nvcc is None:
        return []
    build_dir = Path(build_dir).resolve()
    build_dir.mkdir(parents=True, exist_ok=True)
    headers = [path.read_bytes() for path in sorted((ROOT / "include").glob("*.h"))]
    objects = []
    for source in sorted((ROOT / "src").glob("*.cu")):
        relative = source.relative_to(ROOT).as_posix()
        command = kernel_command(nvcc, relative, "OUTPUT")
        output = build_dir / f"{source.stem}-{_digest(*command, source.read_bytes(), *headers)}.o"
        if not output.is_file():
            with tempfile.TemporaryDirectory(dir=build_dir) as scratch:
                command[-1] = str(Path(scratch) / output.name)
                print(shlex.join(command), flush=True)
                subprocess.run(command, cwd=ROOT, check=True)
                os.replace(command[-1], output)
        objects.append(str(output))
    return objects


def make_ffibuilder(kernel_objects=(), for_setuptools=False):
    """The cffi builder of lltm_ffi._lltm_ffi; with CUDA when kernel_objects
    are given (setuptools adds them later, in setup.py) or, for setuptools,
    when nvcc is found. Sources are named from ROOT for setuptools, which runs
    there and refuses absolute paths, and absolutely for ffibuilder.compile(),
    which changes directory."""
    import cffi

    nvcc = find_nvcc()
    with_cuda = bool(kernel_objects) or (for_setuptools and nvcc is not None)
    define_macros = [("LLTM_SOURCE_HASH", '"%s"' % build_info.source_hash(ROOT)),
                     ("LLTM_PACKAGE_VERSION", '"%s"' % build_info.VERSION)]
    include_dirs = [str(ROOT / "include")]
    library_dirs, libraries = [], []
    if with_cuda:
        cuda_home = cuda_home_of(nvcc)
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
        sources=[name if for_setuptools else str(ROOT / name) for name in C_SOURCES],
        include_dirs=include_dirs,
        define_macros=define_macros,
        extra_objects=list(kernel_objects),
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


def _sha256(path):
    """The SHA-256 of the file at `path`, or None when there is no such file."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


def _read_stamp(stamp):
    """What the last build recorded, or {} when nothing readable was."""
    try:
        recorded = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


@contextlib.contextmanager
def _build_lock():
    """Holds build/build.lock, so that builds in one tree run one at a time:
    a second `make` waits for the first and then finds the module up to
    date. The lock goes with the process, however it ends."""
    with open(BUILD / "build.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("build_ffi.py: waiting for another build in this tree", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _rebuild_reason(installed, recorded, recipe):
    """Why the module must be built, or None when it is the file the last
    build of this recipe wrote, byte for byte: the file itself is checked,
    so a missing, truncated or replaced module is rebuilt whatever the file
    times or the stamp say."""
    name = installed.relative_to(ROOT)
    if not installed.is_file():
        return f"{name} is missing"
    damage = module_file.elf_damage(installed)
    if damage:
        return f"{name} is damaged: {damage}"
    if {key: recorded.get(key) for key in recipe} != recipe:
        return f"{name} was built from other sources or settings"
    if recorded.get("module_sha256") != _sha256(installed):
        return f"{name} is not the file the last build wrote"
    return None


def build(verbose=False):
    """Builds the kernel objects and the module in place, unless the module
    there is the one the last build wrote from these sources and settings.
    One build at a time per tree (build/build.lock); each file is renamed
    into place whole."""
    BUILD.mkdir(exist_ok=True)
    with _build_lock():
        kernel_objects = compile_kernels(BUILD / "kernels")
        installed = ROOT / "lltm_ffi" / module_file.installed_name()
        stamp = BUILD / f"module-{sys.implementation.cache_tag}.json"
        recipe = {"sources": build_info.source_hash(ROOT),
                  "kernels": [Path(path).name for path in kernel_objects]}
        recorded = _read_stamp(stamp)
        reason = _rebuild_reason(installed, recorded, recipe)
        if reason is None:
            print(f"{installed.relative_to(ROOT)} is up to date")
            return
        if recorded:
            print(f"{reason}: rebuilding", flush=True)
        with tempfile.TemporaryDirectory(dir=BUILD) as scratch:
            built = make_ffibuilder(kernel_objects).compile(tmpdir=scratch, verbose=verbose)
            data = Path(built).read_bytes()
        _install(data, installed)
        _install(json.dumps(dict(recipe, module_sha256=hashlib.sha256(data).hexdigest()),
                            indent=1).encode(), stamp)
        print("built %s (CUDA: %s)" % (installed.relative_to(ROOT),
                                       "yes" if kernel_objects else "no"))


if __name__ == "__main__":
    build(verbose="-v" in sys.argv[1:])
else:  # setup.py: cffi_modules=["build_ffi.py:ffibuilder"]
    ffibuilder = make_ffibuilder(for_setuptools=True)
