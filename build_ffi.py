"""Builds lltm_ffi/_lltm_ffi*.so with cffi in out-of-line API mode: the C
shim and every op's C passes (src/, src/cpu/, src/ops/<op>/), plus the CUDA
kernels (src/**/*.cu, compiled with nvcc) when nvcc is found. The sources
are found, not listed (lltm_ffi/_build_info.py says where). The one place
that finds nvcc and CUDA and holds the compilers' flags and architectures;
`make` and pip both come here.

- `make` runs `python build_ffi.py`, which compiles each source whose
  object is missing, damaged or out of date (by the compiler's own list of
  what the source includes), several at once, then relinks the module if
  anything changed; one build at a time per tree, each file renamed into
  place whole, what builds killed outright left swept first;
- `pip install .` reaches `ffibuilder` through setuptools' cffi_modules
  (setup.py), whose build step calls compile_objects() first and seal()
  after.

Both seal the module: its SHA-256, appended, which the package checks
before it loads the module (lltm_ffi/_module_file.py).

Settings, from the environment (make passes its variables of the same
meaning): NVCC (nvcc to use; else PATH, else $CUDA_HOME/bin), LLTM_CUDA=0 (a
CPU-only build), LLTM_CUDA_ARCH (the GPU architectures: empty for those of
the GPUs present, `all` for every one, or nvcc -gencode flags), CC (the C
compiler; else cc).

    python build_ffi.py [-v]          build in place, as `make` does (-v: cffi's compile lines)
    python build_ffi.py --cuda DIR    compile the CUDA sources alone into DIR, no module
"""

import concurrent.futures
import contextlib
import fcntl
import functools
import glob
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
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent
BUILD = ROOT / "build"

# Machine code for Turing to Blackwell, and PTX for the GPUs after them:
# what a module for other machines needs (`make CUDA_ARCH=all`). nvcc's front
# end runs once for each virtual architecture: compute_75 serves sm_75;
# compute_80 sm_80 to sm_89, whose 16-bit persistent kernels need its
# tensor-core mma; compute_90 sm_90 and newer (thread-block clusters), and
# is the PTX the driver compiles for GPUs after them. CUDA 13 builds nothing
# older than sm_75.
ALL_ARCHS = ("-gencode arch=compute_75,code=sm_75 "
             "-gencode arch=compute_80,code=[sm_80,sm_86,sm_89] "
             "-gencode arch=compute_90,code=[sm_90,sm_100,sm_120,compute_90]")
# `CUDA_ARCH=ptx`: PTX alone for the same three virtual architectures.
# Every kernel is compiled, every GPU generation is served with the code of
# its own generation (the driver compiles the PTX for the GPU at the
# module's first load), and no machine code is generated: ptxas for seven
# GPUs is most of ALL_ARCHS' time. Each source gets those of them its code
# tells apart (ptx_archs_of).
PTX_ARCHS = ("-gencode arch=compute_75,code=compute_75 "
             "-gencode arch=compute_80,code=compute_80 "
             "-gencode arch=compute_90,code=compute_90")
# Where no GPU is found: there are no GPUs here to build for, so the
# least that keeps the module whole, PTX of the oldest architecture.
# Every kernel still compiles and every GPU from Turing on can load it, but
# the tensor-core (8.0) and cluster (9.0) kernels are compiled empty, so
# the plan takes the other paths; `make` on a GPU's machine rebuilds for
# it. Those two kernels' compute_80 and compute_90 front ends were a
# third of the clean build's processor time (docs/BUILDING.md).
NO_GPU_ARCHS = "-gencode arch=compute_75,code=compute_75"
_VIRTUAL = (75, 80, 90)
# -O1: the level of the host code nvcc compiles (the launchers); the
# kernels' code is optimised in full whatever it is (the same PTX), and -O3
# took a second more a source. ptxas advises against bulk copies multicast
# to a cluster (the persistent kernels' staging) in code for sm_90 that
# later GPUs may run: the kernels take them on compute capability 9.x alone
# (src/cuda/recurrence/persistent_kernel.cu).
NVCC_FLAGS = ("-O1", "-std=c++17", "-Xcompiler", "-fPIC",
              "-Xptxas", "-suppress-async-bulk-multicast-advisory-warning")
# Python's own release flags for extension modules, OpenMP for the passes'
# parallel loops, and no trapping math (as torch builds): without it gcc
# vectorises no loop with a floating-point condition (the cell's math, its
# exp's range checks), since evaluating both sides could raise an exception
# nothing here reads. The values are the same either way. A call of a
# function no declaration precedes is an error, not a warning: it would
# compile, and the module would not load.
C_FLAGS = ("-O3", "-DNDEBUG", "-fwrapv", "-fPIC", "-fopenmp", "-fno-trapping-math", "-Wall",
           "-Werror=implicit-function-declaration")


def _load_from_package(name):
    """lltm_ffi/<name>.py, loaded by path: the package itself needs torch."""
    spec = importlib.util.spec_from_file_location(
        "lltm_ffi" + name, ROOT / "lltm_ffi" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_info = _load_from_package("_build_info")
module_file = _load_from_package("_module_file")


@functools.lru_cache(maxsize=None)
def gpu_capabilities():
    """The compute capabilities of this machine's GPUs, as nvidia-smi reports
    them ('90' for 9.0), sorted and without repeats; empty where there is no
    GPU or no nvidia-smi."""
    try:
        query = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if query.returncode != 0:
        return []
    found = {line.strip().replace(".", "") for line in query.stdout.splitlines()}
    return sorted((name for name in found if name.isdigit()), key=int)


@functools.lru_cache(maxsize=None)
def _machine_code_nvcc_builds(nvcc):
    listed = subprocess.run([nvcc, "--list-gpu-code"], capture_output=True, text=True)
    return set(listed.stdout.split()) if listed.returncode == 0 else set()


def cuda_arch(nvcc="nvcc"):
    """The nvcc -gencode flags. $LLTM_CUDA_ARCH: `all` (ALL_ARCHS), `ptx`
    (PTX_ARCHS), or the flags themselves; unset or empty: machine code for
    each GPU of this machine, as torch.utils.cpp_extension builds for the
    GPUs it sees, PTX_ARCHS where nvcc cannot build for one of them, and
    NO_GPU_ARCHS where there is none."""
    chosen = os.environ.get("LLTM_CUDA_ARCH", "").strip()
    if chosen == "all":
        return ALL_ARCHS
    if chosen == "ptx":
        return PTX_ARCHS
    if chosen:
        return chosen
    capabilities = gpu_capabilities()
    if not capabilities:
        return NO_GPU_ARCHS
    if not {f"sm_{number}" for number in capabilities} <= _machine_code_nvcc_builds(nvcc):
        return PTX_ARCHS
    return " ".join(f"-gencode arch=compute_{number},code=sm_{number}"
                    for number in capabilities)


def arch_names(flags):
    """What nvcc `flags` put into the kernels, as the module reports it:
    'sm_75 sm_80 ... compute_90' (sm_: machine code, compute_: PTX)."""
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


@functools.lru_cache(maxsize=None)
def cuda_home_of(nvcc):
    """Where nvcc itself looks for its headers and libraries (nvcc may be a
    wrapper script elsewhere)."""
    dryrun = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull],
                            capture_output=True, text=True)
    for line in (dryrun.stdout + dryrun.stderr).splitlines():
        if line.startswith("#$ TOP="):
            return os.path.realpath(line[len("#$ TOP="):])
    return str(Path(nvcc).resolve().parent.parent)


def _included(source, seen):
    """`source` and every file it includes by quotes (found beside it or in
    include/), each once; a file named by LLTM_TYPED_FILE counts as included
    (lltm_each_dtype.h includes it)."""
    if source in seen or not source.is_file():
        return seen
    seen.add(source)
    for name in re.findall(r'^\s*#\s*(?:include|define\s+LLTM_TYPED_FILE)\s*"([^"]+)"',
                           source.read_text(), re.M):
        for folder in (source.parent, ROOT / "include"):
            _included(folder / name, seen)
    return seen


@functools.lru_cache(maxsize=None)
def _texts_of(path):
    """The text of the source at `path` and of every header it includes,
    read once a build: ptx_archs_of and _compile_weight both ask."""
    return tuple(included.read_text() for included in _included(path, set()))


def ptx_archs_of(source):
    """PTX_ARCHS less the virtual architectures whose code for `source` is
    that of the one below them: compute_75 always; compute_80 and compute_90
    where a `__CUDA_ARCH__ >= N` in the source or the headers it includes
    tells them apart from the last one kept. nvcc's front end runs once an
    architecture, and the driver compiles compute_75's PTX for any later GPU
    as well as their own."""
    thresholds = [int(found) for text in _texts_of(ROOT / source)
                  for found in re.findall(r"__CUDA_ARCH__\s*>=\s*(\d+)", text)]
    kept = [_VIRTUAL[0]]
    for arch in _VIRTUAL[1:]:
        if any(kept[-1] * 10 < threshold <= arch * 10 for threshold in thresholds):
            kept.append(arch)
    return " ".join(f"-gencode arch=compute_{arch},code=compute_{arch}" for arch in kept)


def kernel_command(nvcc, source, output):
    """The nvcc command line for one .cu file (run in ROOT); it also writes
    the headers the file includes to output.d. The source's own folder is
    searched too, from the headers of include/: lltm_each_dtype.h
    includes a file of the op's (nvcc has no -iquote)."""
    archs = cuda_arch(nvcc)
    if archs == PTX_ARCHS:
        archs = ptx_archs_of(source)
    return [nvcc, *NVCC_FLAGS, *shlex.split(archs), "-Iinclude", "-I",
            os.path.dirname(source) or ".", "-MMD", "-MF", output + ".d", "-c", source, "-o", output]


def c_command(compiler, source, output, cuda_home=None):
    """The C compiler's command line for one .c file (run in ROOT); with
    `cuda_home`, for a module with CUDA (the shim switches devices). The
    source's own folder is searched for quoted includes, also from the
    headers of include/: lltm_each_dtype.h includes a file of the op's."""
    cuda = ["-DLLTM_WITH_CUDA", "-isystem", os.path.join(cuda_home, "include")] if cuda_home else []
    return [compiler, *C_FLAGS, *cuda, "-Iinclude", "-iquote", os.path.dirname(source) or ".",
            "-MMD", "-MF", output + ".d", "-c", source, "-o", output]


def _digest(*parts):
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else str(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def _staging(destination):
    """The temporary name of this process's own under which `destination` is
    written before it is renamed into place: .NAME.PID beside it (the
    compilers add .d to it for their list of headers). A build killed
    outright leaves it; _remove_leftovers sweeps it once that process is gone."""
    return destination.with_name(f".{destination.name}.{os.getpid()}")


def _install(data, destination):
    """Writes `data` to `destination` through its staging name, then renames
    it into place: a concurrent build or import never sees a partial file,
    and a process that has the old one loaded keeps it."""
    staging = _staging(destination)
    try:
        with open(staging, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(staging, 0o755)
        os.replace(staging, destination)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


def _running(pid):
    """Whether the process `pid` runs: it exists and is no zombie (a killed
    build whose parent died too may stay one where nothing reaps it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    try:  # Linux: the state follows the parenthesised command name
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _remove_leftovers(destination):
    """Removes the staging files of `destination` (_staging's names, .d
    files included) whose process is gone: what builds killed outright left."""
    prefix = f".{destination.name}."
    for path in destination.parent.glob(glob.escape(prefix) + "*"):
        pid = path.name[len(prefix):].removesuffix(".d")
        if pid.isdigit() and not _running(int(pid)):
            path.unlink(missing_ok=True)


def _dependencies(depfile):
    """The files a make-style dependency file (the compiler's -MMD output)
    says its object was made from, as paths relative to ROOT; files outside
    the checkout (the compilers' own headers) are left out."""
    text = Path(depfile).read_text().replace("\\\n", " ")
    _, _, listed = text.partition(": ")
    # Spaces inside a name are escaped with a backslash.
    names = [name.replace("\0", " ") for name in listed.replace("\\ ", "\0").split()]
    files = set()
    for name in names:
        path = (ROOT / name).resolve()
        if path.is_relative_to(ROOT):
            files.add(path.relative_to(ROOT).as_posix())
    return sorted(files)


def _input_hashes(files):
    """{file: digest of its contents} for files relative to ROOT; None when
    one of them is gone."""
    try:
        return {name: _digest((ROOT / name).read_bytes()) for name in files}
    except FileNotFoundError:
        return None


_OUTPUT_LOCK = threading.Lock()


class _Object:
    """One object file of the module under `build_dir` and its record:
    the command that made it, the digest of every file it was made from
    (the source and what the compiler said it includes) and its own. It is
    up to date while the command and every one of those files are unchanged
    and it is the file that command wrote: a damaged or foreign object is
    compiled again."""

    def __init__(self, build_dir, source, command_for):
        relative = source.relative_to(ROOT).as_posix()
        self.source = relative
        self.path = build_dir / (relative.replace("/", "__") + ".o")
        self.record = self.path.with_name(self.path.name + ".json")
        # Paths in the command relative to ROOT, where it runs, so that a
        # copy of the tree finds its objects up to date.
        self.command = command_for(relative, os.path.relpath(self.path, ROOT))

    def up_to_date(self):
        try:
            record = json.loads(self.record.read_text())
        except (OSError, ValueError):
            return False
        digest = _sha256(self.path)
        return (isinstance(record, dict) and digest is not None and record.get("object") == digest
                and record.get("command") == self.command
                and _input_hashes(record.get("inputs", {})) == record.get("inputs"))

    def compile(self):
        """Compiles into its staging name, then renames the object and writes
        its record; raises SystemExit with the compiler's verdict on failure."""
        staging = _staging(self.path)
        output = os.path.relpath(self.path, ROOT)
        command = [str(staging) if part == output else part for part in self.command]
        command = [str(staging) + ".d" if part == output + ".d" else part for part in command]
        with _OUTPUT_LOCK:  # several compile at once: one whole line each
            print(shlex.join(self.command), flush=True)
        try:
            if subprocess.run(command, cwd=ROOT).returncode != 0:
                raise SystemExit(f"build_ffi.py: compiling {self.source} failed (the compiler's "
                                 "messages are above)")
            inputs = _input_hashes(_dependencies(str(staging) + ".d"))
            digest = _sha256(staging)
            os.replace(staging, self.path)
        finally:
            for leftover in (staging, Path(str(staging) + ".d")):
                leftover.unlink(missing_ok=True)
        _install(json.dumps({"command": self.command, "inputs": inputs, "object": digest},
                            indent=1).encode(), self.record)


def _compile_weight(source):
    """How long `source` takes to compile, roughly: the bytes of it and the
    headers it includes (a CPU pass's source is small and includes its
    implementation), times the virtual architectures nvcc compiles it for
    in a PTX build."""
    size = sum(len(text) for text in _texts_of(ROOT / source))
    return size * (len(ptx_archs_of(source).split()) // 2 if source.endswith(".cu") else 1)


def compile_objects(build_dir, cuda_only=False):
    """Compiles every C source (unless `cuda_only`) and, when nvcc is found,
    every CUDA source of the module into build_dir, those that are not up to
    date only, several at once (one per processor); returns the objects to
    link."""
    build_dir = Path(build_dir).resolve()
    build_dir.mkdir(parents=True, exist_ok=True)
    nvcc = find_nvcc()
    cuda_home = cuda_home_of(nvcc) if nvcc else None
    compiler = os.environ.get("CC", "cc")
    objects = [] if cuda_only else [
        _Object(build_dir, source, lambda source, output: c_command(compiler, source, output,
                                                                    cuda_home))
        for source in build_info.module_sources(ROOT, ".c")]
    if nvcc:
        objects += [_Object(build_dir, source,
                            lambda source, output: kernel_command(nvcc, source, output))
                    for source in build_info.module_sources(ROOT, ".cu")]
    for item in objects:
        _remove_leftovers(item.path)
        _remove_leftovers(item.record)
    stale = [item for item in objects if not item.up_to_date()]
    # The longest first, so that none is left to finish alone at the end.
    stale.sort(key=lambda item: -_compile_weight(item.source))
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for future in [pool.submit(item.compile) for item in stale]:
            future.result()
    return [str(item.path) for item in objects]


# The build facts the module reports, compiled into cffi's own source.
_BUILD_FACTS = """
const char* lltm_source_hash(void) { return LLTM_SOURCE_HASH; }
const char* lltm_package_version(void) { return LLTM_PACKAGE_VERSION; }
const char* lltm_cuda_archs(void) { return LLTM_CUDA_ARCHS; }
"""


def make_ffibuilder(objects=(), for_setuptools=False):
    """The cffi builder of lltm_ffi._lltm_ffi, linking `objects`
    (compile_objects'; setuptools adds them later, in setup.py); with CUDA
    when nvcc is found."""
    import cffi

    nvcc = find_nvcc()
    archs = arch_names(cuda_arch(nvcc)) if nvcc else ""
    define_macros = [("LLTM_SOURCE_HASH", '"%s"' % build_info.source_hash(ROOT)),
                     ("LLTM_PACKAGE_VERSION", '"%s"' % build_info.VERSION),
                     ("LLTM_CUDA_ARCHS", '"%s"' % archs)]
    # dl: the CPU passes' BLAS and cuBLAS are loaded at run time (in libc
    # itself since glibc 2.34).
    library_dirs, libraries = [], ["dl"]
    if nvcc:
        library_dirs.append(os.path.join(cuda_home_of(nvcc), "lib64"))
        # The static runtime keeps the module independent of whichever
        # libcudart torch happens to ship.
        libraries += ["cudart_static", "stdc++", "rt", "pthread"]

    ffibuilder = cffi.FFI()
    ffibuilder.cdef((ROOT / "include" / "lltm_ffi.h").read_text())
    ffibuilder.set_source(
        "lltm_ffi._lltm_ffi",
        '#include <stdint.h>\n#include "lltm_ffi.h"\n' + _BUILD_FACTS,
        include_dirs=["include" if for_setuptools else str(ROOT / "include")],
        define_macros=define_macros,
        extra_objects=list(objects),
        library_dirs=library_dirs,
        libraries=libraries,
        extra_compile_args=["-O3"],
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


def seal(path):
    """Appends the seal (lltm_ffi/_module_file.py) to the module cffi linked
    at `path`, renamed into place whole: pip's build (setup.py), whose
    module setuptools links; build() seals its own before installing it."""
    path = Path(path)
    _install(module_file.sealed(path.read_bytes()), path)


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
    damage = module_file.damage(installed)
    if damage:
        return f"{name} is damaged: {damage}"
    if {key: recorded.get(key) for key in recipe} != recipe:
        return f"{name} was built from other sources or settings"
    if recorded.get("module_sha256") != _sha256(installed):
        return f"{name} is not the file the last build wrote"
    return None


# The scratch folders of build()'s links (tempfile's names).
_SCRATCH = re.compile(r"tmp[a-z0-9_]{8}")


def build(verbose=False):
    """Builds the kernel objects and the module in place, unless the module
    there is the one the last build wrote from these sources and settings.
    One build at a time per tree (build/build.lock); each file is renamed
    into place whole, and what builds killed outright left is swept first."""
    BUILD.mkdir(exist_ok=True)
    with _build_lock():
        installed = ROOT / "lltm_ffi" / module_file.installed_name()
        stamp = BUILD / f"module-{sys.implementation.cache_tag}.json"
        # Only a build holds the lock while it links in a scratch folder:
        # any there now is a killed build's.
        for scratch in BUILD.iterdir():
            if scratch.is_dir() and _SCRATCH.fullmatch(scratch.name):
                shutil.rmtree(scratch, ignore_errors=True)
        _remove_leftovers(installed)
        _remove_leftovers(stamp)
        objects = compile_objects(BUILD / "objects")
        recipe = {"sources": build_info.source_hash(ROOT),
                  "objects": {Path(path).name: _sha256(path) for path in objects}}
        recorded = _read_stamp(stamp)
        reason = _rebuild_reason(installed, recorded, recipe)
        if reason is None:
            print(f"{installed.relative_to(ROOT)} is up to date")
            return
        if recorded:
            print(f"{reason}: rebuilding", flush=True)
        with tempfile.TemporaryDirectory(dir=BUILD) as scratch:
            built = make_ffibuilder(objects).compile(tmpdir=scratch, verbose=verbose)
            data = module_file.sealed(Path(built).read_bytes())
        _install(data, installed)
        _install(json.dumps(dict(recipe, module_sha256=hashlib.sha256(data).hexdigest()),
                            indent=1).encode(), stamp)
        print("built %s (CUDA: %s)" % (installed.relative_to(ROOT),
                                       "yes" if find_nvcc() else "no"))


def compile_cuda(build_dir):
    """Compiles the CUDA sources alone into build_dir, those not up to date,
    linking nothing (`make cuda-all`: the kernels for every architecture,
    beside the module); says so and does nothing where nvcc is not found."""
    nvcc = find_nvcc()
    if not nvcc:
        print("build_ffi.py --cuda: no nvcc (or LLTM_CUDA=0): no CUDA source compiled")
        return
    objects = compile_objects(build_dir, cuda_only=True)
    print(f"{len(objects)} CUDA sources compiled for {arch_names(cuda_arch(nvcc))} "
          f"in {os.path.relpath(build_dir, ROOT)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--cuda"] and len(sys.argv) == 3:
        compile_cuda(ROOT / sys.argv[2])
    else:
        build(verbose="-v" in sys.argv[1:])
else:  # setup.py: cffi_modules=["build_ffi.py:ffibuilder"]
    ffibuilder = make_ffibuilder(for_setuptools=True)
