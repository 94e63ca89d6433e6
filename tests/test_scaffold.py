"""`python -m lltm_ffi new-op NAME` (lltm_ffi/scaffold): the names it
refuses, what it writes and where, and, marked slow, that the op it writes
builds and passes unedited in a copy of the checkout: `make CUDA=0`, its
generated tests (opcheck and torch.compile among them), `make asan`, the
README check of tests/test_docs.py, `python -m lltm_ffi`, and an nvcc
compile of its kernels for one architecture where nvcc is found."""

import importlib.util
import os
import py_compile
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from checkouts import REPO_ROOT, copy_sources, environment_of, output_within
from lltm_ffi import scaffold

NAME = "twice_scaled"
NVCC = shutil.which(os.environ.get("NVCC") or "nvcc")


def sources_and_readme(destination):
    copy = copy_sources(destination)
    shutil.copy2(REPO_ROOT / "README.md", copy / "README.md")
    return copy


def expected_files(name):
    return [f"lltm_ffi/ops/{name}/__init__.py", f"lltm_ffi/ops/{name}/{name}.py",
            f"lltm_ffi/ops/{name}/test_{name}.py", f"src/ops/{name}/{name}_cpu.c",
            f"src/ops/{name}/{name}_cpu_impl.h", f"src/ops/{name}/{name}_kernel.cu",
            f"src/ops/{name}/{name}_math.h", f"src/ops/{name}/test_{name}_cpu.c"]


@pytest.mark.parametrize("name, words", [
    ("Embed", "is not a lowercase identifier"),
    ("my-op", "is not a lowercase identifier"),
    ("2d_pool", "is not a lowercase identifier"),
    ("", "is not a lowercase identifier"),
    ("a" * 41, "is longer than 40 characters"),
    ("lambda", "is a Python keyword"),
    ("match", "is a Python keyword"),
    ("test_op", "starts with 'test'"),
    ("roi_pool", "an op named 'roi_pool' exists already"),
    ("lltm", "an op named 'lltm' exists already"),
    ("round", "would declare the pass 'round_forward'"),
    ("packed", "would declare the pass 'packed_forward'"),
    ("forward_pass", "be named as one, but src/cpu/lltm_cpu.c has a pass of that name"),
    ("op", "would export lltm_ffi.op, a name lltm_ffi/op.py holds"),
    ("lltm_sequence", "would export lltm_ffi.lltm_sequence"),
    ("l_l_t_m", "would export lltm_ffi.LLTM, a name lltm_ffi/ops/lltm/__init__.py holds"),
    ("ro_i_pool", "would export lltm_ffi.RoIPool"),
    ("reference", "would export lltm_ffi.reference"),
    ("scaffold", "would export lltm_ffi.scaffold"),
], ids=lambda value: value if isinstance(value, str) and len(value) < 20 else None)
def test_a_name_that_cannot_be_an_op_is_refused(name, words):
    assert words in (scaffold.refusal(name, REPO_ROOT) or "")


def test_a_module_class_clash_is_refused(tmp_path):
    copy = sources_and_readme(tmp_path / "lltm")
    (copy / "lltm_ffi" / "ops" / "other").mkdir()
    (copy / "lltm_ffi" / "ops" / "other" / "__init__.py").write_text('__all__ = ["MyOp"]\n')
    assert "would export lltm_ffi.MyOp, a name lltm_ffi/ops/other/__init__.py holds" in (
        scaffold.refusal("my_op", copy))


def test_a_free_name_is_taken():
    assert scaffold.refusal(NAME, REPO_ROOT) is None


def test_new_op_writes_the_two_folders_and_the_readme_entry(tmp_path):
    copy = sources_and_readme(tmp_path / "lltm")
    readme = (copy / "README.md").read_text()
    written = scaffold.new_op(NAME, copy)
    assert sorted(written) == sorted([*expected_files(NAME), "README.md"])
    for path in written:
        text = (copy / path).read_text()
        assert "@" + "name@" not in text and "@" + "Name@" not in text and "@NAME@" not in text
        if path.endswith(".py"):
            py_compile.compile(str(copy / path), doraise=True)
    # The entry is the Ops list's last item; nothing else in the README moves.
    ops = (copy / "README.md").read_text().split("### Ops")[1].split("\nAlso in the package")[0]
    assert ops.rstrip().endswith(scaffold.readme_entry(NAME).rstrip())
    assert f"`lltm_ffi.{NAME}(" in ops
    assert (copy / "README.md").read_text().replace(scaffold.readme_entry(NAME), "") == readme
    with pytest.raises(scaffold.ScaffoldError, match=f"an op named '{NAME}' exists already"):
        scaffold.new_op(NAME, copy)


def test_a_refused_name_writes_nothing(tmp_path):
    copy = sources_and_readme(tmp_path / "lltm")
    readme = (copy / "README.md").read_text()
    before = sorted(path for path in copy.rglob("*"))
    with pytest.raises(scaffold.ScaffoldError, match="^new-op: .*choose another name$"):
        scaffold.new_op("round", copy)
    assert sorted(path for path in copy.rglob("*")) == before
    assert (copy / "README.md").read_text() == readme


def test_new_op_refuses_a_folder_that_is_not_a_checkout(tmp_path):
    with pytest.raises(scaffold.ScaffoldError, match="is not an lltm_ffi checkout"):
        scaffold.new_op(NAME, tmp_path)


def test_the_readme_entry_needs_the_ops_list():
    with pytest.raises(scaffold.ScaffoldError, match="README.md has no list under '### Ops'"):
        scaffold.with_readme_entry("# lltm_ffi\n\nNo list here.\n", NAME)


@pytest.mark.parametrize("arguments, status, words", [
    (["new-op"], 2, "usage: python -m lltm_ffi"),
    (["new-op", "a", "b"], 2, "usage: python -m lltm_ffi"),
    (["new-op", "--help"], 2, "usage: python -m lltm_ffi"),
    (["frobnicate"], 2, "usage: python -m lltm_ffi"),
    (["new-op", "Bad-Name"], 1, "new-op: 'Bad-Name' is not a lowercase identifier"),
], ids=["no-name", "two-names", "option", "other-command", "bad-name"])
def test_the_command_line(arguments, status, words):
    result = subprocess.run([sys.executable, "-m", "lltm_ffi", *arguments], cwd=REPO_ROOT,
                            capture_output=True, text=True)
    assert result.returncode == status and words in result.stderr, result.stderr


# What copy_checkout leaves out: version control, the README's venv, caches,
# what builds and runs wrote, but the compiled objects.
NOT_COPIED = shutil.ignore_patterns(".git", ".venv", "__pycache__", ".pytest_cache", "*.so",
                                    "*.so.*", "bench_out", "gpu_out", "dist", "*.egg-info",
                                    ".hypothesis")
BUILD_OUTPUTS_NOT_COPIED = shutil.ignore_patterns("run_checks*", "pip-venv", "module-*.json",
                                                  "*.lock", "asan", "checks", "cuda-all")


def copy_checkout(destination):
    """The checkout's sources, docs and tests, and its compiled objects (an
    object is reused only where its command and inputs are unchanged)."""
    def ignore(directory, names):
        ignored = NOT_COPIED(directory, names)
        if Path(directory).resolve() == (REPO_ROOT / "build").resolve():
            ignored |= BUILD_OUTPUTS_NOT_COPIED(directory, names)
        return ignored

    shutil.copytree(REPO_ROOT, destination, ignore=ignore)
    return destination


def run(command, directory, timeout=1200):
    """(status, output) of `command` in `directory`, its lltm_ffi first."""
    process = subprocess.Popen(command, cwd=directory, env=environment_of(directory),
                               stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return output_within(process, timeout, " ".join(command))


@pytest.mark.slow
def test_the_op_written_builds_and_passes_unedited(tmp_path):
    """What a porter runs first, in a copy of this checkout: every step must
    pass before a line is edited. With a GPU (and nvcc) the op's kernels are
    built and its GPU tests run too; without one the build is CPU-only."""
    copy = copy_checkout(tmp_path / "lltm")
    python = sys.executable
    with_cuda = NVCC is not None and torch.cuda.is_available()
    steps = [
        [python, "-m", "lltm_ffi", "new-op", NAME],
        ["make", f"CUDA={'' if with_cuda else '0'}", f"PYTHON={python}"],
        [python, "-m", "pytest", "-v", "-p", "no:cacheprovider", f"lltm_ffi/ops/{NAME}",
         "tests/test_docs.py", "tests/test_declarations.py::test_the_package_exports_each_op_"
         "folders_all", "tests/test_half.py::test_the_lltm_passes_take_both_halves_on_every_"
         "device_they_run_on"],
        [python, "-m", "lltm_ffi"],
        ["make", "asan", f"PYTHON={python}"],
    ]
    outputs = []
    for command in steps:
        status, output = run(command, copy)
        outputs.append(output)
        assert status == 0, f"{' '.join(command)} failed:\n{output}"
    tests, diagnostics, asan = outputs[2], outputs[3], outputs[4]
    assert " passed" in tests and "failed" not in tests
    # opcheck and torch.compile ran, on the CPU at least, and passed.
    for test in ("test_opcheck", "test_torch_compile_fullgraph", "test_gradcheck_and_gradgradcheck",
                 "test_self_check", "test_the_readme_names_every_registered_op"):
        assert re.search(rf"::{test}(\[[^\]]*\])? PASSED", tests), test
    devices = "cpu: float32+float64; cuda: float32+float64" if with_cuda else "cpu: float32+float64"
    assert f"{NAME}_forward ({devices})" in diagnostics
    if with_cuda:
        assert re.search(rf"::test_\w+\[[^\]]*cuda[^\]]*\] PASSED", tests), tests
    assert "result: ok" in diagnostics
    assert re.search(rf"^{NAME}_cpu_passes +ok$", asan, re.MULTILINE), asan


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="no nvcc")
def test_the_kernels_written_compile_with_nvcc(tmp_path, monkeypatch):
    """For one architecture, with the build's own nvcc command line."""
    spec = importlib.util.spec_from_file_location("build_ffi_for_scaffold",
                                                  REPO_ROOT / "build_ffi.py")
    build_ffi = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_ffi)
    monkeypatch.setenv("LLTM_CUDA_ARCH", "-gencode arch=compute_90,code=sm_90")
    copy = sources_and_readme(tmp_path / "lltm")
    scaffold.new_op(NAME, copy)
    command = build_ffi.kernel_command(NVCC, f"src/ops/{NAME}/{NAME}_kernel.cu",
                                       str(tmp_path / "kernel.o"))
    status, output = run(command, copy, timeout=600)
    assert status == 0, output
    assert (tmp_path / "kernel.o").stat().st_size > 0
