"""`python -m lltm_ffi`: the report a bug report needs and the self-check,
on this checkout's build (exit 0, every field right; the CUDA fields only
with a GPU) and on copies whose module is missing or stale (the environment
is still reported, the problem said plainly, exit 1)."""

import os
import re
import subprocess
import sys

import pytest
import torch

import lltm_ffi
from checkouts import (REPO_ROOT, ROUND_CPU_SOURCE, append_to, copy_sources, existing,
                       make_cpu_only)
from lltm_ffi import _extension
from lltm_ffi.diagnostics import _kernels_left_out, covering_arch

pytestmark = pytest.mark.slow


def run_diagnostics(directory):
    """`python -m lltm_ffi` in `directory`, whose lltm_ffi comes first on sys.path."""
    return subprocess.run([sys.executable, "-m", "lltm_ffi"], cwd=directory,
                          capture_output=True, text=True)


def fields(output):
    """{label: value} of the report's `label: value` lines."""
    return dict(re.findall(r"^(.+?):\s+(.*)$", output, flags=re.MULTILINE))


def test_report_on_this_build():
    result = run_diagnostics(REPO_ROOT)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    report = fields(result.stdout)
    lib, ffi = _extension.lib, _extension.ffi

    assert report["lltm_ffi"].startswith(f"{lltm_ffi.__version__} ")
    assert report["torch"].startswith(torch.__version__)
    assert report["cffi"] == __import__("cffi").__version__
    assert report["compiled module"] == str(_extension.MODULE_PATH)
    assert report["module status"] == "ok, built from the current sources"
    assert report["built from sources"] == ffi.string(lib.lltm_source_hash()).decode()
    assert report["check cpu float32"] == "pass"
    assert report["check cpu float64"] == "pass"
    assert result.stdout.rstrip().endswith("result: ok")

    if lltm_ffi.CUDA_COMPILED:
        assert report["CUDA compiled in"] == "yes"
        archs = ffi.string(lib.lltm_cuda_archs()).decode()
        assert report["CUDA architectures"] == archs, report
        assert all(re.fullmatch(r"(sm|compute)_\d+[af]?", name) for name in archs.split()), archs
        for index in range(torch.cuda.device_count()):
            assert covering_arch(archs, *torch.cuda.get_device_capability(index)), archs
        version = lib.lltm_cuda_runtime_version()
        assert version >= 12000
        assert report["CUDA runtime (built)"] == f"{version // 1000}.{version % 1000 // 10}"
    else:
        assert report["CUDA compiled in"] == "no (CPU-only build)"
    tiles = _extension.lib.lltm_amx_tiles()
    assert report["CPU 16-bit products"] == (
        "portable (no AMX or AVX512-BF16 on this CPU)" if not _extension.amx_usable()
        else "portable (LLTM_AMX=0)" if os.environ.get("LLTM_AMX") == "0"
        else f"{'AMX' if tiles else 'AVX512-BF16 (no AMX)'} for every size (LLTM_AMX=1)"
        if os.environ.get("LLTM_AMX") == "1"
        else "AMX (bfloat16 tiles; float16 tiles for the large products)" if tiles
        else "AVX512-BF16 dot products for bfloat16 (no AMX; float16 portable)")
    blas = _extension.blas_config()
    if os.environ.get("LLTM_BLAS") == "0":
        assert report["CPU products"] == "own tiles (LLTM_BLAS=0)"
    elif blas:
        assert report["CPU products"].startswith(blas + ", ")
    else:
        assert report["CPU products"].startswith("own tiles (")
    assert report["CPU threads"].startswith(f"{torch.get_num_threads()} ")

    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            assert report[f"GPU cuda:{index}"].startswith(torch.cuda.get_device_name(index))
            assert report[f"check cuda:{index} float32"] == "pass"
            assert report[f"check cuda:{index} float64"] == "pass"
    else:
        assert report["GPUs (torch)"].startswith("none")


def assert_reports_environment_and_problem(result, *problem_words):
    assert result.returncode == 1, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    report = fields(result.stdout)
    for label in ("lltm_ffi", "python", "torch", "cffi", "compiled module"):
        assert label in report, f"no {label!r} line in:\n{result.stdout}"
    assert report["module status"].startswith("NOT USABLE: ")
    assert report["self-check"].startswith("not run")
    problems = result.stdout.split("result: 1 problem(s)")[1]
    for word in problem_words:
        assert word in report["module status"] and word in problems, result.stdout


def test_report_without_a_built_module(tmp_path):
    directory = copy_sources(tmp_path / "lltm")
    assert_reports_environment_and_problem(run_diagnostics(directory), "not built", "`make`")


def test_report_on_a_stale_module(tmp_path):
    directory = copy_sources(tmp_path / "lltm")
    make_cpu_only(directory)
    append_to(directory / ROUND_CPU_SOURCE)
    result = run_diagnostics(directory)
    assert_reports_environment_and_problem(result, "stale", "`make`")
    # What the stale module was built with is still shown.
    assert fields(result.stdout)["CUDA compiled in"] == "no (CPU-only build)"


def test_report_on_a_pass_registered_twice(tmp_path):
    """A second op's source registering a pass name already taken: the
    registry keeps the first, so the module is refused (rather than have
    one op run another's pass)."""
    directory = copy_sources(tmp_path / "lltm")
    append_to(directory / ROUND_CPU_SOURCE,
                     "LLTM_CPU_PASS(forward_pass, round_forward, args->sizes[0], "
                     "args->tensors[0], args->tensors[1])\n")
    make_cpu_only(directory)
    assert_reports_environment_and_problem(
        run_diagnostics(directory), "refused a pass registration", "'forward_pass'", "`make`")


def test_report_on_a_declared_pass_that_no_source_registers(tmp_path):
    directory = copy_sources(tmp_path / "lltm")
    source = existing(directory / ROUND_CPU_SOURCE)
    text, renamed = re.subn(r"\b(LLTM_CPU_PASS\w*)\(round_forward,", r"\1(round_forwards,",
                            source.read_text())
    assert renamed == 1, "round_cpu.c no longer registers round_forward as this test expects"
    source.write_text(text)
    make_cpu_only(directory)
    result = run_diagnostics(directory)
    assert result.returncode == 1, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert ("the compiled module lacks passes the ops declare (round_forward on cpu)"
            in result.stdout), result.stdout
    assert "round_ste: lltm_ffi.errors.LLTMBuildError" in fields(result.stdout)["check cpu float32"]


ARCHS = "sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_120 compute_120"


@pytest.mark.parametrize("capability, expected", [
    ((7, 5), "sm_75"), ((8, 0), "sm_80"), ((8, 6), "sm_86"), ((8, 7), "sm_86"),
    ((9, 0), "sm_90"), ((10, 0), "sm_100"), ((10, 3), "sm_100"), ((12, 0), "sm_120"),
    ((12, 1), "sm_120"), ((13, 0), "compute_120 (PTX, compiled by the driver)"), ((7, 0), None),
])
def test_covering_arch(capability, expected):
    assert covering_arch(ARCHS, *capability) == expected


def test_covering_arch_of_arch_specific_and_ptx_only_builds():
    assert covering_arch("sm_90a", 9, 0) == "sm_90a"
    assert covering_arch("sm_90a", 10, 0) is None
    assert covering_arch("compute_80", 8, 6) == "compute_80 (PTX, compiled by the driver)"
    assert covering_arch("", 9, 0) is None


@pytest.mark.parametrize("archs, capability, missing", [
    ("compute_75", (9, 0), "its tensor-core and cluster kernels are empty there"),
    ("compute_75", (8, 6), "its tensor-core kernels are empty there"),
    ("compute_75 compute_80", (9, 0), "its cluster kernels are empty there"),
    ("compute_75", (7, 5), None), (ARCHS, (9, 0), None), (ARCHS, (13, 0), None),
])
def test_a_gpu_running_older_code_is_told_what_it_misses(archs, capability, missing):
    """A module built without a GPU (compute_75 alone) runs on an H100 without
    its tensor-core and cluster kernels; the report's GPU row says so."""
    note = _kernels_left_out(covering_arch(archs, *capability), *capability)
    assert (missing in note and "`make` on this machine" in note) if missing else note == ""
