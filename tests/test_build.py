"""The build as a user meets it, in copies of the sources under tmp_path:
`make CUDA=0` gives a working CPU-only module that refuses CUDA with a
message saying to rebuild, and an import of a missing or stale module fails
with a message saying to run `make`. Each check imports lltm_ffi in a fresh
interpreter whose working directory and PYTHONPATH are the copy."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO_ROOT

SOURCES = ("build_ffi.py", "Makefile", "include", "src", "lltm_ffi")
# What a build leaves in lltm_ffi/, and nothing of the checkout's own build.
NOT_SOURCES = shutil.ignore_patterns("_lltm_ffi*", "__pycache__", "*.o", "*.so")


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


def run_python(directory, code):
    """Runs `code` in a fresh interpreter that can import only the copy's lltm_ffi."""
    inherited = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                 if path and not path.startswith(str(REPO_ROOT))]
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(directory)] + inherited))
    prelude = textwrap.dedent(f"""\
        import sys
        sys.path[:] = [path for path in sys.path if not path.startswith({str(REPO_ROOT)!r})]
    """)
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                          cwd=directory, env=environment, capture_output=True, text=True)


def assert_succeeded(result):
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"


# A broken build warns at import; the reference still works; the first call
# that needs the compiled module raises LLTMBuildError, printed for the test.
IMPORT_FAILURE = """\
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import lltm_ffi
    assert any(issubclass(warning.category, lltm_ffi.LLTMBuildWarning) for warning in caught)
    import torch
    inputs = [torch.randn(2, 3), torch.randn(12, 7), torch.randn(12), torch.randn(2, 4),
              torch.randn(2, 4)]
    lltm_ffi.reference.lltm(*inputs)
    try:
        lltm_ffi.lltm(*inputs)
    except lltm_ffi.LLTMBuildError as error:
        print(type(error).__name__, error)
    else:
        raise SystemExit("the first call succeeded")
"""


@pytest.fixture(scope="module")
def cpu_only_build(tmp_path_factory):
    """A copy of the sources built with `make CUDA=0`, shared by the tests
    that only read it."""
    directory = copy_sources(tmp_path_factory.mktemp("cpu_only") / "lltm")
    make_cpu_only(directory)
    return directory


def test_cpu_only_build_refuses_cuda_through_the_c_shim(cpu_only_build):
    result = run_python(cpu_only_build, f"""
        from pathlib import Path
        import lltm_ffi
        from lltm_ffi import _extension
        package = Path(lltm_ffi.__file__).resolve().parent
        assert package == Path({str(cpu_only_build)!r}).resolve() / "lltm_ffi", package
        assert lltm_ffi.CUDA_COMPILED is False
        ffi, lib = _extension.ffi, _extension.lib
        assert lib.lltm_cuda_compiled() == 0
        null = ffi.NULL
        for dtype in (lib.LLTM_FLOAT32, lib.LLTM_FLOAT64):
            codes = [lib.lltm_forward(dtype, 0, null, 2, 3, null, null, null, null),
                     lib.lltm_backward(dtype, 0, null, 2, 3, 3, 1, 3, 1, *[null] * 6),
                     lib.lltm_round_forward(dtype, 0, null, 4, null, null)]
            assert codes == [lib.LLTM_ERROR_NO_CUDA] * 3, codes
        message = _extension.error_message(lib.LLTM_ERROR_NO_CUDA)
        assert "without CUDA" in message and "make" in message, message
        print("ok")
    """)
    assert_succeeded(result)
    assert result.stdout.strip() == "ok"


def test_cpu_only_build_computes_on_cpu(cpu_only_build):
    result = run_python(cpu_only_build, """
        import torch
        from lltm_ffi import selfcheck
        for dtype in (torch.float32, torch.float64):
            errors = selfcheck.compare_with_reference(3, 5, 7, dtype, "cpu")
            name, error = selfcheck.worst(errors)
            assert error <= selfcheck.TOLERANCES[dtype], errors
        print("ok")
    """)
    assert_succeeded(result)
    assert result.stdout.strip() == "ok"


def test_cpu_only_build_given_cuda_tensors_raises_lltm_error(cpu_only_build, cuda_device):
    result = run_python(cpu_only_build, """
        import torch
        import lltm_ffi
        from lltm_ffi import selfcheck
        inputs = selfcheck.random_inputs(2, 3, 4, torch.float32, "cuda")
        try:
            lltm_ffi.lltm(*inputs)
        except lltm_ffi.LLTMError as error:
            assert error.code == lltm_ffi._extension.lib.LLTM_ERROR_NO_CUDA, error.code
            assert "make clean && make" in str(error), error
        else:
            raise SystemExit("lltm_ffi.lltm on CUDA tensors did not raise")
        print("ok")
    """)
    assert_succeeded(result)
    assert result.stdout.strip() == "ok"


def test_import_without_a_built_module_says_to_run_make(tmp_path):
    directory = copy_sources(tmp_path / "lltm")
    result = run_python(directory, IMPORT_FAILURE)
    assert_succeeded(result)
    assert result.stdout.startswith("LLTMBuildError"), result.stdout
    assert "_lltm_ffi" in result.stdout, result.stdout
    assert "not built" in result.stdout and "`make`" in result.stdout


def test_import_after_a_source_change_says_stale_and_make(tmp_path):
    directory = copy_sources(tmp_path / "lltm")
    make_cpu_only(directory)
    edit_after_build(directory, directory / "src" / "lltm_cpu.c")

    result = run_python(directory, IMPORT_FAILURE)
    assert_succeeded(result)
    assert result.stdout.startswith("LLTMBuildError"), result.stdout
    assert "stale" in result.stdout and "`make`" in result.stdout

    # `make` sees the change and rebuilds; the import then works.
    make_cpu_only(directory)
    assert_succeeded(run_python(directory, "import lltm_ffi"))


def test_import_of_a_module_built_for_another_version_says_stale(tmp_path):
    directory = copy_sources(tmp_path / "lltm")
    make_cpu_only(directory)
    build_info = directory / "lltm_ffi" / "_build_info.py"
    text = build_info.read_text()
    assert 'VERSION = "' in text
    build_info.write_text(text.replace('VERSION = "', 'VERSION = "99.', 1))

    result = run_python(directory, IMPORT_FAILURE)
    assert_succeeded(result)
    assert result.stdout.startswith("LLTMBuildError"), result.stdout
    assert "stale" in result.stdout and "version" in result.stdout and "`make`" in result.stdout

