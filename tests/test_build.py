"""The build as a user meets it, in copies of the sources under tmp_path:
`make CUDA=0` gives a working CPU-only module (its refusal of CUDA tensors
is in test_refusals.py), and an import of a missing or stale module fails
with a message saying to run `make`. Each check imports lltm_ffi in a fresh
interpreter whose working directory and PYTHONPATH are the copy."""

from checkouts import assert_succeeded, copy_sources, edit_after_build, make_cpu_only, run_python

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

