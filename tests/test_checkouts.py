"""The helpers of checkouts.py that the build tests stand on: a test that
edits a source fails when the source has moved, instead of creating a new
file and checking nothing; and a copy's interpreter loses the checkout's
own directory from its path, and nothing else under it (a venv inside the
checkout, as the README makes one, keeps its packages)."""

import os

import pytest

import checkouts
from checkouts import REPO_ROOT, append_to, copy_sources, existing, run_python

EDITED_SOURCES = (checkouts.LLTM_CPU_SOURCE, checkouts.LLTM_CPU_HEADER,
                  checkouts.ROUND_CPU_SOURCE, checkouts.SHARED_HEADER)


@pytest.mark.parametrize("path", EDITED_SOURCES)
def test_each_source_the_build_tests_edit_exists(path):
    assert existing(REPO_ROOT / path) == REPO_ROOT / path


def test_a_moved_file_fails_the_test_that_edits_it(tmp_path):
    moved = tmp_path / "src" / "lltm_cpu.c"
    with pytest.raises(pytest.fail.Exception, match="lltm_cpu.c is not a file"):
        existing(moved)
    with pytest.raises(pytest.fail.Exception, match="has moved or gone"):
        append_to(moved)
    assert not moved.exists() and not moved.parent.exists()


def test_append_to_changes_the_contents(tmp_path):
    source = tmp_path / "source.c"
    source.write_text("int x;\n")
    append_to(source)
    append_to(source, "int y;\n")
    assert source.read_text() == "int x;\n/* edited */\nint y;\n"


def test_a_copy_imports_its_own_package_and_keeps_what_lies_under_the_checkout(
        tmp_path, monkeypatch):
    """PYTHONPATH names the checkout, whose lltm_ffi the copy's interpreter
    must not find, and tests/, a folder under the checkout standing for a
    venv's site-packages there, which it must keep."""
    directory = copy_sources(tmp_path / "lltm")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests")]))
    result = run_python(directory, """
        import importlib.util
        print(importlib.util.find_spec("lltm_ffi").origin)
        print(importlib.util.find_spec("checkouts").origin)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(directory / "lltm_ffi" / "__init__.py"),
                                     str(REPO_ROOT / "tests" / "checkouts.py")]
