"""The pip path beside make: one list of CUDA architectures and one nvcc
command for both, the architecture names the module reports, and an editable
install (CPU-only, in a copy) that passes the stale-build check after its
build and fails it after a source edit. `make pip-check` covers a regular
install into site-packages."""

import importlib.util
import os
import shlex
import subprocess
import sys
import site
import textwrap
import venv
from pathlib import Path

import pytest

from checkouts import REPO_ROOT, copy_sources


def load_build_ffi():
    spec = importlib.util.spec_from_file_location("build_ffi_under_test", REPO_ROOT / "build_ffi.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_ffi = load_build_ffi()


def test_kernel_command_takes_the_flags_and_the_chosen_architectures(monkeypatch):
    monkeypatch.delenv("LLTM_CUDA_ARCH", raising=False)
    command = shlex.join(build_ffi.kernel_command("nvcc", "src/round_kernel.cu", "out.o"))
    assert command.startswith(shlex.join(["nvcc", *build_ffi.NVCC_FLAGS, *shlex.split(
        build_ffi.DEFAULT_CUDA_ARCH)]))
    monkeypatch.setenv("LLTM_CUDA_ARCH", "-gencode arch=compute_90,code=sm_90")
    command = build_ffi.kernel_command("nvcc", "src/round_kernel.cu", "out.o")
    assert "arch=compute_90,code=sm_90" in command and "arch=compute_75,code=sm_75" not in command


def test_the_makefile_leaves_nvcc_and_its_flags_to_build_ffi():
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert "build_ffi.py" in makefile
    assert "-gencode" not in makefile.replace("-gencode arch=compute_90,code=sm_90", "")
    assert "--dryrun" not in makefile and "NVCC_FLAGS" not in makefile


@pytest.mark.parametrize("flags, names", [
    (None, "sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_120 compute_120"),
    ("-gencode arch=compute_90,code=sm_90", "sm_90"),
    ("-gencode arch=compute_90,code=[sm_90,compute_90]", "sm_90 compute_90"),
    ("-gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90a,code=sm_90a", "sm_90a"),
    ("-arch=sm_86", "sm_86"),
])
def test_arch_names(flags, names):
    assert build_ffi.arch_names(flags or build_ffi.DEFAULT_CUDA_ARCH) == names


def run_in_venv(python, code, directory):
    return subprocess.run([python, "-c", textwrap.dedent(code)], cwd=directory,
                          capture_output=True, text=True)


IMPORT_AND_CHECK = """\
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import lltm_ffi
    import torch
    stale = [str(warning.message) for warning in caught
             if issubclass(warning.category, lltm_ffi.LLTMBuildWarning)]
    print("package", lltm_ffi.__file__)
    print("warnings", stale)
    if not stale:
        print("round", lltm_ffi.round_ste(torch.tensor([0.2, 0.5])).tolist())
"""


def make_venv(environment):
    """A venv that sees this interpreter's packages (torch, cffi, setuptools)
    even when this interpreter is itself a venv, whose packages
    system_site_packages alone would not reach. Returns its python."""
    venv.create(environment, system_site_packages=True, with_pip=False)
    python = environment / "bin" / "python"
    own_site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    (Path(own_site) / "parent_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return str(python)


def test_editable_install_passes_the_stale_check_until_a_source_changes(tmp_path):
    directory = copy_sources(tmp_path / "lltm")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        (directory / name).write_bytes((REPO_ROOT / name).read_bytes())
    python = make_venv(tmp_path / "venv")
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "-e", "."],
        cwd=directory, capture_output=True, text=True, env=dict(os.environ, LLTM_CUDA="0"))
    assert install.returncode == 0, f"{install.stdout}\n{install.stderr}"

    result = run_in_venv(python, IMPORT_AND_CHECK, tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"package {directory / 'lltm_ffi' / '__init__.py'}" in result.stdout
    assert "warnings []" in result.stdout and "round [0.0, 1.0]" in result.stdout

    with open(directory / "src" / "round_cpu.c", "a") as source:
        source.write("/* edited after the install */\n")
    result = run_in_venv(python, IMPORT_AND_CHECK, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "stale" in result.stdout
