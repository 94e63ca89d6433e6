"""The build as a user meets it, in copies of the sources under tmp_path:
`make CUDA=0` gives a working CPU-only module that refuses CUDA with a
message saying to rebuild, and an import of a missing, stale or damaged
module fails with a message saying to run `make`, never a signal; `make`
rebuilds a module that is missing, damaged or stale and nothing else, and
two at once in one tree both succeed without exposing a partial module.
Each check imports lltm_ffi in a fresh interpreter whose working directory
and PYTHONPATH are the copy."""

import importlib.util
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checkouts import (LLTM_CPU_HEADER, LLTM_CPU_SOURCE, LLTM_CPU_TYPE_SOURCES, ROUND_CPU_SOURCE,
                       SHARED_HEADER, append_to, assert_succeeded, copy_sources, existing, make_cpu_only,
                       output_within, run_diagnostics, run_python)

pytestmark = pytest.mark.slow

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
    append_to(directory / LLTM_CPU_SOURCE)

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
    build_info = existing(directory / "lltm_ffi" / "_build_info.py")
    text = build_info.read_text()
    assert 'VERSION = "' in text
    build_info.write_text(text.replace('VERSION = "', 'VERSION = "99.', 1))

    result = run_python(directory, IMPORT_FAILURE)
    assert_succeeded(result)
    assert result.stdout.startswith("LLTMBuildError"), result.stdout
    assert "stale" in result.stdout and "version" in result.stdout and "`make`" in result.stdout



# The compiled module's file --------------------------------------------------

def package_module(directory, name):
    """The copy's lltm_ffi/<name>.py, loaded by path: _module_file and
    _build_info need neither torch nor the package."""
    spec = importlib.util.spec_from_file_location(
        f"lltm_ffi{name}_of_the_copy", directory / "lltm_ffi" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def module_file_check(directory):
    """What import and build_ffi.py use to name and check the module."""
    return package_module(directory, "_module_file")


def installed_module(directory):
    """The copy's built module, which must exist: the tests damage or delete it."""
    return existing(directory / "lltm_ffi" / module_file_check(directory).installed_name())


def _elf_layout(data):
    """(program header table offset, section header table offset, [(offset,
    size) of each segment in the file]) of a 64-bit little-endian ELF file."""
    program_offset, section_offset = struct.unpack_from("<QQ", data, 32)
    entry_size, count = struct.unpack_from("<HH", data, 54)
    segments = [struct.unpack_from("<QQQQ", data, program_offset + index * entry_size + 8)
                for index in range(count)]
    return program_offset, section_offset, [(offset, size) for offset, _, _, size in segments]


def _inside_the_largest_segment(data):
    _, _, segments = _elf_layout(data)
    offset, size = max(segments, key=lambda segment: segment[1])
    return data[:offset + size // 2]


def _garbage(length):
    return random.Random(length).randbytes(length)


def _with_garbage_at(offset, data, length=4096):
    """`data` with `length` bytes of garbage written over it at `offset`."""
    return data[:offset] + _garbage(length) + data[offset + length:]


def _executable_segment(data):
    """(offset, size) in the file of the first loadable segment whose code
    runs (PT_LOAD with PF_X), of a 64-bit little-endian ELF file."""
    program_offset = struct.unpack_from("<Q", data, 32)[0]
    entry_size, count = struct.unpack_from("<HH", data, 54)
    for index in range(count):
        kind, flags, offset, _, _, size = struct.unpack_from(
            "<IIQQQQ", data, program_offset + index * entry_size)
        if kind == 1 and flags & 1:
            return offset, size
    raise AssertionError("no executable segment")


def _garbage_in_the_code(data):
    offset, size = _executable_segment(data)
    return _with_garbage_at(offset + size // 3, data)


# How a module file gets damaged: each takes the whole file's bytes.
DAMAGE = {
    "empty": lambda data: b"",
    "cut_inside_the_elf_header": lambda data: data[:40],
    "cut_inside_the_program_headers": lambda data: data[:_elf_layout(data)[0] + 56 * 2 + 10],
    "cut_inside_a_segment": _inside_the_largest_segment,
    "cut_before_the_section_headers": lambda data: data[:_elf_layout(data)[1]],
    "one_byte_short": lambda data: data[:-1],
    "garbage_of_full_size": lambda data: _garbage(len(data)),
    "elf_header_then_garbage": lambda data: data[:64] + _garbage(len(data) - 64),
    # Its headers whole, its size right: only its contents say it is damaged.
    "garbage_in_the_middle": lambda data: _with_garbage_at(len(data) // 2, data),
    "garbage_in_the_code": _garbage_in_the_code,
    "garbage_near_the_start": lambda data: _with_garbage_at(60000, data),
    "one_byte_changed": lambda data: _with_garbage_at(len(data) // 3, data, 1),
}


@pytest.fixture(scope="module")
def damaged_module_tree(tmp_path_factory):
    """A built copy whose module each test damages (and the fixture restores)."""
    directory = copy_sources(tmp_path_factory.mktemp("damaged") / "lltm")
    make_cpu_only(directory)
    return directory


@pytest.fixture(params=DAMAGE)
def damaged_module(request, damaged_module_tree):
    """The copy, with its module damaged as DAMAGE[param] says."""
    module = installed_module(damaged_module_tree)
    whole = module.read_bytes()
    damaged = DAMAGE[request.param](whole)
    assert len(damaged) == 0 or damaged != whole
    module.write_bytes(damaged)
    yield damaged_module_tree
    module.write_bytes(whole)


def assert_exited_normally(result):
    assert result.returncode >= 0, (f"killed by signal {-result.returncode}\n"
                                    f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}")


def test_damaged_module_is_refused_at_import_with_rebuild_and_make(damaged_module):
    """Never loaded, so never a signal: a module cut short would be mapped
    and kill the process with SIGBUS at first touch, and garbage in its code
    or its tables with SIGSEGV or SIGILL."""
    damage = module_file_check(damaged_module).damage(installed_module(damaged_module))
    assert damage and ("truncated" in damage or "not an ELF" in damage
                       or "no usable program headers" in damage
                       or "not the file its build wrote" in damage
                       or "carries no digest" in damage), damage

    result = run_python(damaged_module, IMPORT_FAILURE)
    assert_exited_normally(result)
    assert_succeeded(result)
    assert result.stdout.startswith("LLTMBuildError"), result.stdout
    assert "is damaged" in result.stdout and damage in result.stdout, result.stdout
    assert "rebuild it with `make`" in result.stdout, result.stdout


def test_damaged_module_makes_diagnostics_exit_1_with_rebuild_and_make(damaged_module):
    result = run_diagnostics(damaged_module)
    assert_exited_normally(result)
    assert result.returncode == 1, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "is damaged" in result.stdout and "rebuild it with `make`" in result.stdout, (
        result.stdout)


def test_elf_check_passes_a_whole_module_and_explains_a_missing_one(damaged_module_tree,
                                                                    tmp_path):
    check = module_file_check(damaged_module_tree)
    assert check.elf_damage(installed_module(damaged_module_tree)) is None
    assert check.damage(installed_module(damaged_module_tree)) is None
    assert "cannot be read" in check.elf_damage(tmp_path / "absent.so")
    assert "cannot be read" in check.damage(tmp_path / "absent.so")


# `make` repairs the module --------------------------------------------------

@pytest.fixture(scope="module")
def built_tree(tmp_path_factory):
    """A copy built with `make CUDA=0`; tests change copies of it."""
    directory = copy_sources(tmp_path_factory.mktemp("built") / "lltm")
    make_cpu_only(directory)
    return directory


@pytest.fixture
def built_copy(built_tree, tmp_path):
    """A copy of built_tree, its module and build/ included (the build's
    record holds no absolute path, so the copy is up to date)."""
    return Path(shutil.copytree(built_tree, tmp_path / "lltm"))


def _keeping_the_file_time(change):
    """`change` applied to a file (the module, an object) with its
    modification time put back: make must look at the file, not at the file
    times."""
    def apply(path, *others):
        times = path.stat()
        change(path, *others)
        os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
    return apply


def _overwrite_a_page(module):
    data = bytearray(module.read_bytes())
    data[len(data) // 2:len(data) // 2 + 4096] = bytes(4096)
    module.write_bytes(bytes(data))


MODULE_CHANGES = {
    "deleted": lambda module: module.unlink(),
    "truncated": lambda module: module.write_bytes(module.read_bytes()[:100000]),
    "truncated_keeping_its_time": _keeping_the_file_time(
        lambda module: module.write_bytes(module.read_bytes()[:100000])),
    "overwritten_in_place_keeping_size_and_time": _keeping_the_file_time(_overwrite_a_page),
    "garbage": lambda module: module.write_bytes(_garbage(module.stat().st_size)),
}


def assert_module_computes(directory):
    """The copy's lltm_ffi agrees with the reference on the CPU, and on the
    GPU too where there is one and the module has CUDA."""
    result = run_python(directory, """
        import torch
        import lltm_ffi
        from lltm_ffi import selfcheck
        devices = ["cpu"]
        if lltm_ffi.CUDA_COMPILED and torch.cuda.is_available():
            devices.append("cuda")
        for device in devices:
            assert selfcheck.disagreement(3, 5, 7, torch.float64, device) is None, device
        print("ok")
    """)
    assert_succeeded(result)
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize("change", MODULE_CHANGES)
def test_make_rebuilds_a_module_that_is(change, built_copy):
    MODULE_CHANGES[change](installed_module(built_copy))
    output = make_cpu_only(built_copy).stdout
    assert "built lltm_ffi/" in output and "up to date" not in output, output
    assert module_file_check(built_copy).damage(installed_module(built_copy)) is None
    assert_module_computes(built_copy)


# How an object file of the build gets damaged or replaced; each takes the
# object and the build's other objects.
OBJECT_CHANGES = {
    "truncated_to_100_bytes": lambda target, others: target.write_bytes(
        target.read_bytes()[:100]),
    "garbage_of_full_size": lambda target, others: target.write_bytes(
        _garbage(target.stat().st_size)),
    "another_objects_contents_keeping_its_time": _keeping_the_file_time(
        lambda target, others: target.write_bytes(others[0].read_bytes())),
}


@pytest.mark.parametrize("change", OBJECT_CHANGES)
def test_make_recompiles_a_damaged_or_foreign_object(change, built_copy):
    """Whatever happened to an object, make compiles it again, and that one
    alone (the compiler writes the same bytes, so the module stays up to
    date); the module computes, and a second make has nothing to do."""
    objects = built_copy / "build" / "objects"
    target = next(objects.glob("*round_cpu.c.o"))
    before = target.read_bytes()
    others = sorted(path for path in objects.glob("*.o") if path != target)
    OBJECT_CHANGES[change](target, others)
    output = make_cpu_only(built_copy).stdout
    assert [source.rsplit("/", 1)[-1] for source in _compiled(output)] == ["round_cpu.c"], output
    assert target.read_bytes() == before
    assert_module_computes(built_copy)
    output = make_cpu_only(built_copy).stdout
    assert "is up to date" in output and not _compiled(output), output


def test_make_rebuilds_after_a_source_edit(built_copy):
    append_to(built_copy / LLTM_CPU_SOURCE)
    output = make_cpu_only(built_copy).stdout
    assert "built lltm_ffi/" in output and "up to date" not in output, output
    assert_module_computes(built_copy)


def _compiled(output):
    """The sources a build's output shows compiled (one command line each)."""
    return sorted(line.split(" -c ")[1].split()[0] for line in output.splitlines()
                  if " -c " in line and " -o " in line)


# An edit of a file recompiles exactly the sources that include it.
EDITS = {
    "round_cpu.c": (ROUND_CPU_SOURCE, [ROUND_CPU_SOURCE]),
    "an op's own header": (LLTM_CPU_HEADER, LLTM_CPU_TYPE_SOURCES),
    # (src/cuda/cublas.c includes nothing in a build without CUDA; src/blas.c,
    # which loads the BLAS, includes lltm_blas.h alone.)
    "a header every source includes": (SHARED_HEADER, None),
}


@pytest.mark.parametrize("edit", EDITS)
def test_an_edit_recompiles_only_what_includes_the_file(edit, built_copy):
    path, expected = EDITS[edit]
    append_to(built_copy / path)
    output = make_cpu_only(built_copy).stdout
    every_c_source = sorted(
        path.relative_to(built_copy).as_posix()
        for path in package_module(built_copy, "_build_info").module_sources(built_copy, ".c")
        if path.name not in ("cublas.c", "blas.c"))
    assert _compiled(output) == (expected or every_c_source), output
    assert "built lltm_ffi/" in output, output
    assert_module_computes(built_copy)


def test_make_with_nothing_changed_does_not_rebuild(built_copy):
    module = installed_module(built_copy)
    before = module.stat()
    output = make_cpu_only(built_copy).stdout
    assert "is up to date" in output and "built" not in output, output
    after = module.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_make_rebuilds_over_an_unreadable_record(built_copy):
    stamps = list((built_copy / "build").glob("module-*.json"))
    assert stamps, "the build wrote no build/module-*.json record"
    for stamp in stamps:
        stamp.write_text("{not json")
    output = make_cpu_only(built_copy).stdout
    assert "built lltm_ffi/" in output, output


# Two builds at once ---------------------------------------------------------

NVCC_FOUND = shutil.which(os.environ.get("NVCC") or "nvcc") is not None


def _start_make(directory, arguments):
    return subprocess.Popen(["make", *arguments, f"PYTHON={sys.executable}"], cwd=directory,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _watch_module(module, check, processes):
    """Checks the module file, whenever there is one, until every process has
    ended; returns (checks of a present file, damage seen). The file is opened
    once per check and judged through that descriptor, so a rename in between
    cannot mix two files."""
    checks, damage = 0, []
    while any(process.poll() is None for process in processes):
        try:
            descriptor = os.open(module, os.O_RDONLY)
        except FileNotFoundError:
            time.sleep(0.001)
            continue
        try:
            reason = check.elf_damage(f"/proc/self/fd/{descriptor}")
        finally:
            os.close(descriptor)
        checks += 1
        if reason:
            damage.append(reason)
        time.sleep(0.001)
    return checks, damage


@pytest.mark.parametrize("cuda", [
    False, pytest.param(True, marks=pytest.mark.skipif(not NVCC_FOUND, reason="no nvcc"))],
    ids=["cpu_only", "cuda"])
def test_concurrent_makes_in_one_tree_both_succeed_and_expose_no_partial_module(cuda,
                                                                                built_copy):
    """Each round gives both builds a reason to build (the module deleted, or
    a source edited), starts them together, and checks the module file while
    they run. The CUDA round compiles the kernels too, so it runs once."""
    arguments = [] if cuda else ["CUDA=0"]
    module, check = installed_module(built_copy), module_file_check(built_copy)
    for round in range(1 if cuda else 3):
        if round % 2:
            append_to(built_copy / ROUND_CPU_SOURCE)
        else:
            existing(module).unlink()
        processes = [_start_make(built_copy, arguments) for _ in range(2)]
        checks, damage = _watch_module(module, check, processes)
        results = [output_within(process, 600, "make") for process in processes]
        for status, output in results:
            assert status == 0, output
        assert not damage, damage
        assert any("built lltm_ffi/" in output for _, output in results), results
        assert check.elf_damage(module) is None
        leftovers = sorted(path.name for path in module.parent.glob("_lltm_ffi*")
                           if path != module)
        assert not leftovers, leftovers
        print(f"round {round}: {checks} checks of the module while building")
    assert_module_computes(built_copy)


# Builds killed outright (SIGKILL), and the process that imported before a build

def _leftovers(directory):
    """What builds write under a temporary name, still there: scratch
    folders in build/ and staging files (.name.PID, .name.PID.d) beside
    the files they become."""
    found = [path for path in (directory / "build").glob("tmp*") if path.is_dir()]
    for folder in (directory / "build", directory / "build" / "objects", directory / "lltm_ffi"):
        found += [path for path in folder.glob(".*") if any(part.isdigit()
                                                            for part in path.name.split("."))]
    return sorted(path.relative_to(directory).as_posix() for path in found)


# Where a build is killed: (how to give make something to do, what shows it is there).
KILLED_WHILE = {
    "compiling": (lambda tree: append_to(tree / LLTM_CPU_HEADER),
                  lambda tree: list((tree / "build" / "objects").glob(".*lltm_cpu_*.c.o.*"))),
    "linking": (lambda tree: installed_module(tree).unlink(),
                lambda tree: [path for path in (tree / "build").glob("tmp*") if path.is_dir()]),
}


@pytest.mark.parametrize("phase", KILLED_WHILE)
def test_make_after_a_killed_make_sweeps_what_it_left_and_builds(phase, built_copy):
    """make killed with SIGKILL (its compilers too) leaves its scratch files;
    the next make removes them and builds a module that computes."""
    give_work, under_way = KILLED_WHILE[phase]
    give_work(built_copy)
    process = _start_make(built_copy, ["CUDA=0"])
    deadline = time.monotonic() + 300
    while not under_way(built_copy):
        assert process.poll() is None and time.monotonic() < deadline, (
            f"make ended before it was killed:\n{process.communicate()[0]}")
        time.sleep(0.005)
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
    left = _leftovers(built_copy)
    assert left, "the kill left nothing to sweep: it came too late"

    output = make_cpu_only(built_copy).stdout
    assert "built lltm_ffi/" in output, output
    assert not _leftovers(built_copy), (left, _leftovers(built_copy))
    assert_module_computes(built_copy)


# A process imports lltm_ffi while its module is unusable, then builds it.
BUILD_THEN_CALL = """\
    import subprocess, sys, warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import lltm_ffi
    print("at import:", [str(warning.message) for warning in caught
                         if issubclass(warning.category, lltm_ffi.LLTMBuildWarning)])
    subprocess.run(["make", "CUDA=0", f"PYTHON={sys.executable}"], check=True,
                   capture_output=True)
    import torch
    try:
        lltm_ffi.lltm(torch.randn(2, 3), torch.randn(12, 7), torch.randn(12), torch.randn(2, 4),
                      torch.randn(2, 4))
    except lltm_ffi.LLTMBuildError as error:
        print("after make:", error)
"""

UNUSABLE_AT_IMPORT = {
    "missing": (lambda tree: installed_module(tree).unlink(), "not built"),
    "stale": (lambda tree: append_to(tree / "src" / "shim.c"), "stale"),
    "damaged": (lambda tree: installed_module(tree).write_bytes(
        _with_garbage_at(60000, installed_module(tree).read_bytes())), "damaged"),
}


@pytest.mark.parametrize("state", UNUSABLE_AT_IMPORT)
def test_after_make_a_process_that_imported_before_it_is_told_to_restart(state, built_copy):
    make_unusable, said_at_import = UNUSABLE_AT_IMPORT[state]
    make_unusable(built_copy)
    result = run_python(built_copy, BUILD_THEN_CALL)
    assert_exited_normally(result)
    assert_succeeded(result)
    at_import, after_make = result.stdout.split("\nafter make: ")
    assert said_at_import in at_import, result.stdout
    assert "restart Python" in after_make, result.stdout
    assert "build it with `make`" not in after_make and "rebuild" not in after_make, result.stdout
    # A new process loads the module make built.
    assert_module_computes(built_copy)
