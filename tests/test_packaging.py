"""The pip path beside make: one choice of CUDA architectures (the GPUs
here, PTX without one, or all) and one nvcc command for both, the
architecture names the module reports, and (marked slow) every
install path docs/BUILDING.md documents, each from a fresh `git clone`:
`pip install .`, `pip install -e .` (which passes the stale-build check after
its build, fails it after a source edit, and passes again after a second
`pip install -e .`), `pip install git+file://...` and `pip wheel --no-deps .`
(whose wheel holds the compiled module), and a wheel build without cffi,
which must fail instead of making a wheel without the module.

The clones are of the checkout's committed HEAD, so these tests check what
is committed: uncommitted edits and the checkout's own build outputs take no
part. They build CPU-only (LLTM_CUDA=0; nvcc would add minutes and nothing
that the pip path does differently) in venvs that see the running
interpreter's packages (scripts/pip_check.py's make_venv), with
--no-build-isolation --no-deps, so they need no network; one test builds
with build isolation, which installs setuptools and cffi from the configured
package index, and skips saying so when no index can supply them."""

import importlib.machinery
import importlib.metadata
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

from checkouts import ROUND_CPU_SOURCE, append_to
from conftest import REPO_ROOT
from lltm_ffi.diagnostics import covering_arch


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_ffi = load("build_ffi_under_test", REPO_ROOT / "build_ffi.py")
make_venv = load("pip_check_under_test", REPO_ROOT / "scripts" / "pip_check.py").make_venv
MODULE_FILE = "_lltm_ffi" + importlib.machinery.EXTENSION_SUFFIXES[0]


def test_kernel_command_takes_the_flags_and_the_chosen_architectures(monkeypatch):
    monkeypatch.setenv("LLTM_CUDA_ARCH", "all")
    command = shlex.join(build_ffi.kernel_command("nvcc", "round_kernel.cu", "out.o"))
    assert command.startswith(shlex.join(["nvcc", *build_ffi.NVCC_FLAGS, *shlex.split(
        build_ffi.ALL_ARCHS)]))
    monkeypatch.setenv("LLTM_CUDA_ARCH", "-gencode arch=compute_90,code=sm_90")
    command = build_ffi.kernel_command("nvcc", "round_kernel.cu", "out.o")
    assert "arch=compute_90,code=sm_90" in command and "arch=compute_75,code=sm_75" not in command


@pytest.mark.parametrize("code, archs", [
    ("", (75,)),
    ('#include "a.h"\n', (75, 80)),                       # a.h: __CUDA_ARCH__ >= 800
    ("#if __CUDA_ARCH__ >= 900\n#endif\n", (75, 90)),
    ('#include "a.h"\n#if __CUDA_ARCH__ >= 900\n#endif\n', (75, 80, 90)),
], ids=["plain", "tensor-cores-in-a-header", "clusters", "both"])
def test_a_ptx_build_compiles_a_source_for_the_architectures_its_code_tells_apart(
        code, archs, tmp_path, monkeypatch):
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "a.h").write_text("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800\n"
                                              "#endif\n")
    (tmp_path / "k.cu").write_text(code)
    monkeypatch.setattr(build_ffi, "ROOT", tmp_path)
    monkeypatch.setenv("LLTM_CUDA_ARCH", "ptx")
    command = shlex.join(build_ffi.kernel_command("nvcc", "k.cu", "k.o"))
    assert re.findall(r"arch=compute_(\d+),code=compute_\d+", command) == [str(a) for a in archs]


def test_the_ptx_build_of_the_sources_covers_every_virtual_architecture():
    """The kernels with tensor-core and cluster code get the architectures
    that hold it; together the sources cover PTX_ARCHS, which the module
    reports."""
    sources = [path.relative_to(REPO_ROOT).as_posix() for path in (REPO_ROOT / "src").rglob("*.cu")]
    archs = {source: build_ffi.ptx_archs_of(source) for source in sources}
    assert "compute_80" in archs["src/cuda/recurrence/persistent_kernel.cu"]
    assert "compute_90" in archs["src/cuda/recurrence/cluster_kernel.cu"]
    assert "compute_90" in archs["src/cuda/recurrence/cluster_mma_kernel.cu"]
    covered = {arch for flags in archs.values() for arch in shlex.split(flags)}
    assert covered == set(shlex.split(build_ffi.PTX_ARCHS))


NVCC_13_MACHINE_CODE = {"sm_75", "sm_80", "sm_86", "sm_87", "sm_88", "sm_89", "sm_90", "sm_100",
                        "sm_103", "sm_110", "sm_120", "sm_121"}


@pytest.mark.parametrize("capabilities, flags", [
    ([], build_ffi.NO_GPU_ARCHS),
    (["90"], "-gencode arch=compute_90,code=sm_90"),
    (["86", "90"], "-gencode arch=compute_86,code=sm_86 -gencode arch=compute_90,code=sm_90"),
    # A GPU this nvcc cannot build machine code for: PTX, which the driver compiles.
    (["90", "130"], build_ffi.PTX_ARCHS),
    (["70"], build_ffi.PTX_ARCHS),
], ids=["no-gpu", "one", "two-kinds", "newer-than-nvcc", "older-than-nvcc"])
def test_the_default_architectures_are_those_of_the_gpus_here(capabilities, flags, monkeypatch):
    monkeypatch.delenv("LLTM_CUDA_ARCH", raising=False)
    monkeypatch.setattr(build_ffi, "gpu_capabilities", lambda: capabilities)
    monkeypatch.setattr(build_ffi, "_machine_code_nvcc_builds", lambda nvcc: NVCC_13_MACHINE_CODE)
    assert build_ffi.cuda_arch("nvcc") == flags


def test_the_ptx_build_gives_every_generation_its_ptx():
    """CUDA_ARCH=ptx serves every GPU the full build does: for each GPU, PTX
    of the newest virtual architecture the full build compiles for it (so
    no kernel loses the code for its generation)."""
    full, ptx = build_ffi.arch_names(build_ffi.ALL_ARCHS), build_ffi.arch_names(build_ffi.PTX_ARCHS)
    virtual = sorted(set(re.findall(r"arch=(compute_\d+)", build_ffi.ALL_ARCHS)))
    assert ptx.split() == virtual
    for major, minor in ((7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0), (13, 0)):
        served = covering_arch(full, major, minor)
        assert served is not None
        generation = max((name for name in virtual if int(name[8:]) <= major * 10 + minor),
                         key=lambda name: int(name[8:]))
        assert covering_arch(ptx, major, minor).startswith(generation + " (PTX")


def test_without_a_gpu_the_build_is_ptx_every_gpu_loads(monkeypatch):
    """With no GPU to build for, PTX of the oldest virtual architecture alone,
    for the cluster kernels too: every GPU the full build serves loads it."""
    ptx = build_ffi.arch_names(build_ffi.NO_GPU_ARCHS)
    assert ptx == "compute_75"
    for major, minor in ((7, 5), (8, 0), (8, 9), (9, 0), (10, 0), (12, 0), (13, 0)):
        assert covering_arch(ptx, major, minor) == "compute_75 (PTX, compiled by the driver)"
    monkeypatch.delenv("LLTM_CUDA_ARCH", raising=False)
    monkeypatch.setattr(build_ffi, "gpu_capabilities", lambda: [])
    command = build_ffi.kernel_command("nvcc", "src/cuda/recurrence/cluster_kernel.cu", "k.o")
    assert re.findall(r"arch=\w+,code=\w+", shlex.join(command)) == ["arch=compute_75,code=compute_75"]


def test_the_makefile_leaves_nvcc_and_its_flags_to_build_ffi():
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "build_ffi.py" in makefile
    assert "-gencode" not in makefile.replace("-gencode arch=compute_90,code=sm_90", "")
    assert "--dryrun" not in makefile and "NVCC_FLAGS" not in makefile


@pytest.mark.parametrize("flags, names", [
    (build_ffi.ALL_ARCHS, "sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_120 compute_90"),
    (build_ffi.PTX_ARCHS, "compute_75 compute_80 compute_90"),
    ("-gencode arch=compute_90,code=sm_90", "sm_90"),
    ("-gencode arch=compute_90,code=[sm_90,compute_90]", "sm_90 compute_90"),
    ("-gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90a,code=sm_90a", "sm_90a"),
    ("-arch=sm_86", "sm_86"),
])
def test_arch_names(flags, names):
    assert build_ffi.arch_names(flags) == names


def clone_head(destination):
    """A `git clone` of the checkout under test into `destination`, on its
    committed HEAD (a branch of its own, as a user's clone has). Skips where
    the checkout is no git repository."""
    head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
                          capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip(f"the install tests clone the checkout's HEAD, and {REPO_ROOT} is no git "
                    f"repository: {head.stderr.strip()}")
    for command in (["clone", "-q", "--no-checkout", str(REPO_ROOT), str(destination)],
                    ["-C", str(destination), "checkout", "-q", "-b", "under-test",
                     head.stdout.strip()]):
        subprocess.run(["git", *command], check=True, capture_output=True)
    return destination


OFFLINE = ("--no-build-isolation", "--no-deps")


def pip(python, *arguments, cwd):
    """`python -m pip arguments` in `cwd`, building CPU-only; asserts success."""
    result = subprocess.run([python, "-m", "pip", *arguments], cwd=cwd, capture_output=True,
                            text=True, env=dict(os.environ, LLTM_CUDA="0"))
    assert result.returncode == 0, f"pip {shlex.join(arguments)}:\n{result.stdout}\n{result.stderr}"
    return result


IMPORT_AND_CHECK = """\
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import lltm_ffi
    import torch
    from lltm_ffi import _extension
    stale = [str(warning.message) for warning in caught
             if issubclass(warning.category, lltm_ffi.LLTMBuildWarning)]
    print("package", lltm_ffi.__file__)
    print("warnings", stale)
    if not stale:
        print("module", _extension.MODULE_PATH)
        print("round", lltm_ffi.round_ste(torch.tensor([0.2, 0.5])).tolist())
"""


def import_and_check(python, directory):
    """Imports lltm_ffi with `python` in `directory`, where no checkout lies
    on the path; returns what IMPORT_AND_CHECK prints."""
    directory.mkdir(exist_ok=True)
    result = subprocess.run([python, "-c", textwrap.dedent(IMPORT_AND_CHECK)], cwd=directory,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def assert_works_from(package_parent, output):
    """`output` of IMPORT_AND_CHECK shows lltm_ffi imported from
    package_parent/lltm_ffi, without a warning, with its compiled module
    beside it, computing."""
    package = Path(package_parent) / "lltm_ffi"
    assert f"package {package / '__init__.py'}\n" in output, output
    assert "warnings []" in output and f"module {package / MODULE_FILE}\n" in output, output
    assert "round [0.0, 1.0]" in output, output


def site_packages(environment):
    return (Path(environment) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
            / "site-packages")


@pytest.mark.slow
def test_pip_install_from_a_clone(tmp_path):
    clone = clone_head(tmp_path / "clone")
    python = make_venv(tmp_path / "venv")
    pip(python, "install", "-q", *OFFLINE, ".", cwd=clone)
    assert_works_from(site_packages(tmp_path / "venv"), import_and_check(python, tmp_path / "away"))


@pytest.mark.slow
def test_pip_install_from_a_git_url(tmp_path):
    clone = clone_head(tmp_path / "clone")
    python = make_venv(tmp_path / "venv")
    pip(python, "install", "-q", *OFFLINE, f"git+file://{clone}", cwd=tmp_path)
    assert_works_from(site_packages(tmp_path / "venv"), import_and_check(python, tmp_path / "away"))


def wheel_of(directory):
    wheels = list(Path(directory).glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def assert_holds_the_module(wheel):
    """A platform wheel (never py3-none-any) with lltm_ffi's compiled module."""
    assert not wheel.name.endswith("-none-any.whl"), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert f"lltm_ffi/{MODULE_FILE}" in names, names


@pytest.mark.slow
def test_pip_wheel_holds_the_compiled_module(tmp_path):
    clone = clone_head(tmp_path / "clone")
    python = make_venv(tmp_path / "venv")
    pip(python, "wheel", "-q", *OFFLINE, "-w", str(tmp_path / "dist"), ".", cwd=clone)
    assert_holds_the_module(wheel_of(tmp_path / "dist"))


def venv_without_cffi(environment):
    """A venv with pip and setuptools only (linked from this interpreter's),
    without cffi: setuptools there does not know cffi_modules."""
    venv.create(environment, with_pip=False)
    python = str(environment / "bin" / "python")
    own_site = Path(subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"],
                                   capture_output=True, text=True, check=True).stdout.strip())
    for name in ("pip", "setuptools"):
        distribution = importlib.metadata.distribution(name)
        tops = {file.parts[0] for file in distribution.files if file.parts[0] != ".."}
        for top in tops:
            path = Path(distribution.locate_file(top))
            if path.is_dir() and not (own_site / top).exists():
                (own_site / top).symlink_to(path)
    return python


@pytest.mark.slow
def test_a_wheel_build_without_cffi_fails_loudly(tmp_path):
    clone = clone_head(tmp_path / "clone")
    python = venv_without_cffi(tmp_path / "venv")
    # PYTHONPATH (where a machine keeps cffi outside any site) would lend the venv cffi.
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    environment["LLTM_CUDA"] = "0"
    assert subprocess.run([python, "-c", "import cffi"], capture_output=True,
                          env=environment).returncode != 0
    assert subprocess.run([python, "-c", "import setuptools, pip"], env=environment).returncode == 0
    result = subprocess.run([python, "-m", "pip", "wheel", *OFFLINE, "-w", str(tmp_path / "dist"),
                             "."], cwd=clone, capture_output=True, text=True, env=environment)
    assert result.returncode != 0, result.stdout
    assert "lltm_ffi: building needs cffi" in result.stdout + result.stderr, result.stdout
    assert not list((tmp_path / "dist").glob("*.whl"))


@pytest.mark.slow
def test_editable_install_passes_the_stale_check_until_a_source_changes(tmp_path):
    clone = clone_head(tmp_path / "clone")
    python = make_venv(tmp_path / "venv")
    pip(python, "install", "-q", *OFFLINE, "-e", ".", cwd=clone)
    assert_works_from(clone, import_and_check(python, tmp_path / "away"))

    append_to(clone / ROUND_CPU_SOURCE, "/* edited after the install */\n")
    output = import_and_check(python, tmp_path / "away")
    assert "stale" in output and "rebuild" in output, output

    # docs/BUILDING.md's remedy: the editable install again rebuilds the module.
    pip(python, "install", "-q", *OFFLINE, "-e", ".", cwd=clone)
    assert_works_from(clone, import_and_check(python, tmp_path / "away"))


@pytest.mark.slow
def test_pip_wheel_with_build_isolation_installs_and_runs(tmp_path):
    """docs/BUILDING.md's `pip wheel --no-deps .`, with build isolation: pip
    installs setuptools and cffi into an isolated build environment from the
    configured index (this test's only download; nothing is installed
    outside tmp_path), builds the wheel, and the wheel, installed offline,
    works."""
    clone = clone_head(tmp_path / "clone")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--retries", "1", "--timeout", "30",
         "-w", str(tmp_path / "dist"), "."], cwd=clone, capture_output=True, text=True,
        env=dict(os.environ, LLTM_CUDA="0"))
    output = result.stdout + result.stderr
    if result.returncode != 0 and ("No matching distribution found for setuptools" in output
                                   or "No matching distribution found for cffi" in output):
        pytest.skip("build isolation installs setuptools and cffi from the package index, and "
                    "none is reachable here: " + output.strip().splitlines()[-1])
    assert result.returncode == 0, output
    wheel = wheel_of(tmp_path / "dist")
    assert_holds_the_module(wheel)

    python = make_venv(tmp_path / "venv")
    pip(python, "install", "-q", "--no-index", "--no-deps", str(wheel), cwd=tmp_path)
    assert_works_from(site_packages(tmp_path / "venv"), import_and_check(python, tmp_path / "away"))
