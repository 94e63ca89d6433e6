"""This checkout (REPO_ROOT) and copies of its sources under tmp_path, built
with `make CUDA=0` and imported in fresh interpreters whose working
directory and PYTHONPATH are the copy (test_build, test_refusals,
test_diagnostics, test_packaging)."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

SOURCES = ("build_ffi.py", "Makefile", "include", "src", "lltm_ffi")
# What a build leaves in lltm_ffi/, and nothing of the checkout's own build.
NOT_SOURCES = shutil.ignore_patterns("_lltm_ffi*", "._lltm_ffi*", "__pycache__", "*.o", "*.so")


def copy_sources(destination):
    destination.mkdir()
    for name in SOURCES:
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, destination / name, ignore=NOT_SOURCES)
        else:
            shutil.copy2(source, destination / name)
    return destination


def make_cpu_only(directory):
    result = subprocess.run(["make", "CUDA=0", f"PYTHON={sys.executable}"], cwd=directory,
                            capture_output=True, text=True)
    assert result.returncode == 0, f"make CUDA=0 failed:\n{result.stdout}\n{result.stderr}"
    return result


def edit_after_build(directory, path):
    """Appends a comment to `path` (the build compares contents, not file times)."""
    with open(path, "a") as source:
        source.write("/* edited after the build */\n")


def _environment(directory):
    """The environment of an interpreter that finds the copy's lltm_ffi first."""
    inherited = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                 if path and not path.startswith(str(REPO_ROOT))]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(directory)] + inherited))


def run_python(directory, code):
    """Runs `code` in a fresh interpreter that can import only the copy's lltm_ffi."""
    prelude = textwrap.dedent(f"""\
        import sys
        sys.path[:] = [path for path in sys.path if not path.startswith({str(REPO_ROOT)!r})]
    """)
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                          cwd=directory, env=_environment(directory), capture_output=True,
                          text=True)


def run_diagnostics(directory):
    """`python -m lltm_ffi` on the copy's lltm_ffi."""
    return subprocess.run([sys.executable, "-m", "lltm_ffi"], cwd=directory,
                          env=_environment(directory), capture_output=True, text=True)


def assert_succeeded(result):
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"


# How long a stopped process group has to exit after each signal.
STOP_GRACE_S = 30


def output_within(process, timeout, what):
    """(return code, output) of a process started in its own session; past
    `timeout` seconds its whole group is stopped and the test fails."""
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} ran past {timeout} s:\n{output_after_stopping(process)}")
    return process.returncode, output


def output_after_stopping(process):
    """What the process wrote, once its group is stopped: SIGTERM first,
    which torchrun passes on to its workers (they run in sessions of their
    own, beyond the group's reach, and would hold the output open), then
    SIGKILL."""
    for stop in (signal.SIGTERM, signal.SIGKILL):
        os.killpg(process.pid, stop)
        try:
            return process.communicate(timeout=STOP_GRACE_S)[0]
        except subprocess.TimeoutExpired:
            continue
    return "(no output: a process outside the group still holds it open)"
