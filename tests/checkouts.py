"""This checkout (REPO_ROOT) and copies of its sources under tmp_path, built
with `make CUDA=0` and imported in fresh interpreters whose working
directory and PYTHONPATH are the copy (test_build, test_refusals,
test_diagnostics, test_packaging); and the sources those tests edit, each
named once."""

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

# The sources the build tests edit or damage, each named once: a test names
# them through these, and existing() fails a test whose file has moved.
LLTM_CPU_SOURCE = "src/cpu/lltm_cpu.c"
LLTM_CPU_HEADER = "src/cpu/lltm_cpu_impl.h"
# The sources that compile it, once an element type.
LLTM_CPU_TYPE_SOURCES = [f"src/cpu/lltm_cpu_{dtype}.c"
                         for dtype in ("bfloat16", "double", "float", "float16")]
ROUND_CPU_SOURCE = "src/ops/round_ste/round_cpu.c"
SHARED_HEADER = "include/lltm_op.h"


def existing(path):
    """`path`, after failing the test unless it is a file: a test that edits,
    damages or deletes a file must find the one it means (open(path, "a")
    on a moved source would create a new file, and the test would check
    nothing)."""
    path = Path(path)
    if not path.is_file():
        pytest.fail(f"{path} is not a file: the test edits a file that has moved or gone; "
                    f"name its new place (tests/checkouts.py)")
    return path


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


def append_to(path, text="/* edited */\n"):
    """Appends `text` (by default a C comment: an edit that changes the
    file's contents, which the build compares, not its time) to the existing
    file `path`."""
    with open(existing(path), "a") as source:
        source.write(text)


def environment_of(directory):
    """The environment of an interpreter that finds the copy's lltm_ffi first:
    the checkout's own directory is left out of PYTHONPATH (a venv or
    anything else under it stays)."""
    inherited = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                 if path and os.path.realpath(path) != str(REPO_ROOT)]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(directory)] + inherited))


def run_python(directory, code):
    """Runs `code` in a fresh interpreter that can import only the copy's
    lltm_ffi: the checkout's own directory is taken off sys.path, and
    nothing else (the README's venv lies inside the checkout)."""
    prelude = textwrap.dedent(f"""\
        import os, sys
        sys.path[:] = [path for path in sys.path
                       if os.path.realpath(path or os.curdir) != {str(REPO_ROOT)!r}]
    """)
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                          cwd=directory, env=environment_of(directory), capture_output=True,
                          text=True)


def run_diagnostics(directory):
    """`python -m lltm_ffi` on the copy's lltm_ffi."""
    return subprocess.run([sys.executable, "-m", "lltm_ffi"], cwd=directory,
                          env=environment_of(directory), capture_output=True, text=True)


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
