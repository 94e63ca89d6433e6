"""lltm_ffi across processes: its exceptions reach a multiprocessing parent
whole (spawn and fork), forked children compute after the parent has used
OpenMP's threads (os.fork, a fork Pool, DataLoader workers), and the odd
arguments that used to fail inside: nested tensors, sparse and mkldnn
layouts. (LLTM with state size 0 is refused when it is made:
test_module.py.)

Everything that can hang runs under a timeout, so that a regression fails
instead of stopping the suite. The fork scenarios run in a fresh interpreter
of their own (a process group, killed whole on timeout), with torch on two
threads so that OpenMP's pool really has threads to lose in a fork.
The module-file and `make` checks are in test_build.py.
"""

import multiprocessing
import os
import pickle
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import lltm_ffi
from checkouts import output_within
from conftest import PASS_NAMES, REPO_ROOT, raises_with
from lltm_ffi import _extension

# A pool worker's result must come back well within this; a spawn worker
# first imports torch and lltm_ffi, which takes a few seconds on a busy machine.
RESULT_TIMEOUT_S = 120
# One fork scenario, parent and children, startup included.
SCENARIO_TIMEOUT_S = 300


# ---------------------------------------------------------------------------
# Exceptions through pickle and multiprocessing

BUILD_ERROR_TEXT = "lltm_ffi's compiled module is not built; build it with `make`"
BUILD_WARNING_TEXT = "lltm_ffi's compiled module is stale; rebuild with `make`"


def _c_error():
    """An LLTMError from the C shim itself: lltm_run refuses an unknown
    element type with LLTM_ERROR_DTYPE (no tensor is read)."""
    lib = _extension.require()
    pass_id = _extension.PASSES["forward_pass"][0]
    _extension.check("forward_pass", lib.lltm_run(pass_id, 99, lib.LLTM_CPU, 0, [1, 1], [],
                                                  [0] * 4))
    raise AssertionError("lltm_run accepted dtype 99")


def _exceptions():
    """One instance of every exception class lltm_ffi exports, with its fields
    set and a note added (notes travel in the instance's __dict__)."""
    try:
        _c_error()
    except lltm_ffi.LLTMError as error:
        lltm_error = error
    build_error = lltm_ffi.LLTMBuildError(BUILD_ERROR_TEXT, name="lltm_ffi._lltm_ffi",
                                          path="/nowhere/_lltm_ffi.so")
    build_warning = lltm_ffi.LLTMBuildWarning(BUILD_WARNING_TEXT)
    exceptions = [lltm_error, build_error, build_warning]
    for exception in exceptions:
        exception.add_note(f"noted on {type(exception).__name__}")
    return exceptions


def _fields(exception):
    """What must survive a trip through pickle."""
    fields = {"type": type(exception), "str": str(exception), "args": exception.args,
              "notes": getattr(exception, "__notes__", None)}
    for name in ("function", "code", "message", "name", "path", "msg"):
        if hasattr(exception, name):
            fields[name] = getattr(exception, name)
    return fields


def test_every_exported_exception_class_is_covered():
    exported = {value for value in vars(lltm_ffi).values()
                if isinstance(value, type) and issubclass(value, BaseException)}
    assert exported == {type(exception) for exception in _exceptions()}


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("index", range(3), ids=["LLTMError", "LLTMBuildError",
                                                  "LLTMBuildWarning"])
def test_exception_pickles_with_its_message_and_fields(index, protocol):
    exception = _exceptions()[index]
    copy = pickle.loads(pickle.dumps(exception, protocol=protocol))
    assert _fields(copy) == _fields(exception)


def test_lltm_error_from_c_has_the_shims_fields():
    with pytest.raises(lltm_ffi.LLTMError) as caught:
        _c_error()
    error = caught.value
    assert (error.function, error.code) == ("forward_pass", _extension.lib.LLTM_ERROR_DTYPE)
    assert error.message == _extension.error_message(error.code)
    assert str(error) == f"forward_pass failed: {error.message} (error code {error.code})"


# Pool workers: module-level functions, so that spawn can find them by name.

def _worker_type_error():
    inputs = [torch.randn(2, 3), torch.randn(12, 7), torch.randn(12), torch.randn(2, 4),
              torch.randn(2, 4)]
    inputs[0] = inputs[0].tolist()
    lltm_ffi.lltm(*inputs)


def _worker_lltm_error():
    raise _exceptions()[0]


def _worker_build_error():
    raise _exceptions()[1]


def _worker_build_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", lltm_ffi.LLTMBuildWarning)
        warnings.warn(BUILD_WARNING_TEXT, lltm_ffi.LLTMBuildWarning)


def _raised(result):
    """The exception a pool worker raised, as the parent receives it."""
    try:
        result.get(timeout=RESULT_TIMEOUT_S)
    except multiprocessing.TimeoutError:
        pytest.fail(f"no result within {RESULT_TIMEOUT_S} s (did it fail to unpickle?)")
    except BaseException as exception:  # whatever the worker raised
        return exception
    pytest.fail("the worker raised nothing")


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_exceptions_raised_in_pool_workers_reach_the_parent(method):
    """Before LLTMError could be unpickled, the pool's result thread died on it
    and get() waited forever; the timeout turns that into a failure."""
    lltm_error, build_error, build_warning = _exceptions()
    pool = multiprocessing.get_context(method).Pool(1)
    try:
        results = [pool.apply_async(worker) for worker in (
            _worker_type_error, _worker_lltm_error, _worker_build_error, _worker_build_warning)]
        type_error, *received = [_raised(result) for result in results]
        pool.close()
    finally:
        pool.terminate()
        pool.join()
    assert type(type_error) is TypeError
    assert "lltm: input must be a torch.Tensor, got list" in str(type_error)
    # multiprocessing attaches the worker's traceback as the cause, so the
    # rest arrives as it was raised.
    assert _fields(received[0]) == _fields(lltm_error)
    assert _fields(received[1]) == _fields(build_error)
    assert type(received[2]) is lltm_ffi.LLTMBuildWarning
    assert str(received[2]) == str(build_warning)


# ---------------------------------------------------------------------------
# Fork after the parent has used OpenMP's threads

def run_scenario(code, timeout=SCENARIO_TIMEOUT_S):
    """Runs `code` in a fresh interpreter (the checkout's lltm_ffi) in a process
    group of its own; on timeout kills the whole group, forked children too,
    and fails. Returns the stdout."""
    prelude = textwrap.dedent("""\
        import os, sys, time
        import torch
        import lltm_ffi
        from lltm_ffi import reference, selfcheck
        from lltm_ffi.ops.lltm.cell import backward_pass, forward_pass

        # Two threads even on one core: OpenMP's pool then has a thread to lose.
        torch.set_num_threads(2)
        BIG = (256, 16, 256)  # batch * state = 65536, past LLTM_PARALLEL_MIN_ELEMENTS
        SMALL = (3, 5, 7)

        def make_case(shape, dtype):
            # The fused passes' inputs and float64 reference results, made here,
            # before any fork: after the parent has run autograd, torch's CUDA
            # builds refuse autograd in a forked child (torch's own rule), so the
            # children check the C passes without it.
            batch, _, state = shape
            generator = torch.Generator().manual_seed(batch * state)
            gates, old_cell, grad_h, grad_cell = (
                torch.randn(batch, width * state, generator=generator, dtype=dtype)
                for width in (3, 1, 1, 1))
            leaves = [gates.double().requires_grad_(), old_cell.double().requires_grad_()]
            outputs = reference.pointwise(*leaves)
            torch.autograd.backward(outputs, (grad_h.double(), grad_cell.double()))
            expected = [output.detach() for output in outputs] + [leaves[1].grad, leaves[0].grad]
            return (gates, old_cell, grad_h, grad_cell), expected

        CASES = {(shape, dtype): make_case(shape, dtype)
                 for shape in (BIG, SMALL) for dtype in (torch.float32, torch.float64)}

        def disagreements(shape):
            # The fused passes in C, forward and backward, against the reference.
            problems = []
            for dtype in (torch.float32, torch.float64):
                (gates, old_cell, grad_h, grad_cell), expected = CASES[shape, dtype]
                new_h, new_cell = forward_pass.run(gates, old_cell)
                results = (new_h, new_cell, *backward_pass.run(grad_h, grad_cell, new_cell, gates))
                for name, value, reference_value in zip(PASS_NAMES, results, expected):
                    error = selfcheck.relative_error(value, reference_value)
                    if not error <= selfcheck.TOLERANCES[dtype]:
                        problems.append(f"{name} ({dtype}) relative error {error:.3g}")
            return problems

        def start_openmp_threads():
            # The big passes (forward and backward) run across OpenMP threads.
            assert not disagreements(BIG), disagreements(BIG)
            threads = len(os.listdir("/proc/self/task"))
            assert threads > 1, f"no OpenMP threads started ({threads} thread)"

        def wait_for(pid, timeout):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    return os.waitstatus_to_exitcode(status)
                time.sleep(0.05)
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise SystemExit(f"forked child {pid} hung for {timeout} s")
    """)
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO_ROOT)] + [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                            if path]))
    environment.pop("OMP_NUM_THREADS", None)
    prelude += f"PASS_NAMES = {PASS_NAMES!r}\n"
    process = subprocess.Popen([sys.executable, "-c", prelude + textwrap.dedent(code)],
                               cwd=REPO_ROOT, env=environment, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    returncode, output = output_within(process, timeout, "the scenario")
    assert returncode == 0, f"exit status {returncode}:\n{output}"
    return output


def run_scenario_to_its_end(code):
    """run_scenario(code), and that it ran to its end: the last line it
    prints is the "ok" printed after `code`."""
    output = run_scenario(textwrap.dedent(code) + 'print("ok")\n')
    assert output.splitlines()[-1] == "ok", output


@pytest.mark.slow
def test_os_fork_children_compute_after_the_parent_ran_big_passes():
    run_scenario_to_its_end("""
        start_openmp_threads()
        for shapes in ([SMALL, BIG], [BIG, SMALL]):
            pid = os.fork()
            if pid == 0:
                problems = [text for shape in shapes for text in disagreements(shape)]
                # A grandchild, forked from a child that has computed.
                grandchild = os.fork()
                if grandchild == 0:
                    os._exit(1 if disagreements(BIG) else 0)
                problems += [] if wait_for(grandchild, 60) == 0 else ["the grandchild disagrees"]
                print(problems, flush=True)
                os._exit(1 if problems else 0)
            assert wait_for(pid, 120) == 0, f"child computing {shapes} failed"
        # The parent's own threads still work.
        assert not disagreements(BIG)
    """)


@pytest.mark.slow
def test_forked_child_c_passes_stay_off_openmp_even_with_torch_threads_restored():
    """The C passes do not rely on torch's thread count: a child that sets it
    back to 2 (its own torch ops may then hang, torch's affair) still gets
    the passes' results, computed without OpenMP, identical to the parent's."""
    run_scenario_to_its_end("""
        start_openmp_threads()
        generator = torch.Generator().manual_seed(0)
        batch, _, state = BIG
        gates = torch.randn(batch, 3 * state, generator=generator, dtype=torch.float64)
        old_cell, grad_h, grad_cell = (
            torch.randn(batch, state, generator=generator, dtype=torch.float64)
            for _ in range(3))
        forward = forward_pass.run(gates, old_cell)
        backward = backward_pass.run(grad_h, grad_cell, forward[1], gates)
        expected = [tensor.numpy().tobytes() for tensor in (*forward, *backward)]
        pid = os.fork()
        if pid == 0:
            torch.set_num_threads(2)
            for _ in range(3):
                forward = forward_pass.run(gates, old_cell)
                backward = backward_pass.run(grad_h, grad_cell, forward[1], gates)
                results = [tensor.numpy().tobytes() for tensor in (*forward, *backward)]
                if results != expected:
                    os._exit(1)
            os._exit(0)
        assert wait_for(pid, 60) == 0, "the child's passes disagree with the parent's"
    """)


@pytest.mark.slow
def test_fork_pool_workers_compute_after_the_parent_ran_big_passes():
    run_scenario_to_its_end("""
        import multiprocessing

        def check(shape):
            return disagreements(shape)

        start_openmp_threads()
        with multiprocessing.get_context("fork").Pool(2) as pool:
            results = pool.map_async(check, [SMALL, BIG, BIG, SMALL]).get(timeout=120)
        assert results == [[]] * 4, results
    """)


@pytest.mark.slow
def test_dataloader_fork_workers_compute_after_the_parent_ran_big_passes():
    run_scenario_to_its_end("""
        from torch.utils.data import DataLoader, Dataset

        class Cells(Dataset):
            # Each item runs lltm_ffi forward and backward in the worker.
            def __len__(self):
                return 6

            def __getitem__(self, index):
                shape = BIG if index % 2 else SMALL
                return os.getpid(), disagreements(shape)

        start_openmp_threads()
        loader = DataLoader(Cells(), batch_size=None, num_workers=2,
                            multiprocessing_context="fork", timeout=120)
        items = list(loader)
        assert len(items) == 6 and all(problems == [] for _, problems in items), items
        assert len({pid for pid, _ in items} - {os.getpid()}) == 2, items
    """)


@pytest.mark.slow
def test_forked_child_runs_torch_on_one_thread():
    output = run_scenario("""
        start_openmp_threads()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, str(torch.get_num_threads()).encode())
            os._exit(0)
        assert wait_for(pid, 60) == 0
        print("child threads", os.read(read, 16).decode())
        print("parent threads", torch.get_num_threads())
    """)
    assert "child threads 1" in output and "parent threads 2" in output, output


# ---------------------------------------------------------------------------
# Arguments that used to fail inside

def _nested(tensor, layout):
    rows = list(tensor) if tensor.dim() > 1 else [tensor]
    return torch.nested.nested_tensor(rows, layout=layout)


def NESTED_LAYOUTS(test):
    """Each nested layout, without torch's prototype-stage warning."""
    test = pytest.mark.filterwarnings(
        "ignore:The PyTorch API of nested tensors is in prototype stage:UserWarning")(test)
    return pytest.mark.parametrize("layout", [torch.strided, torch.jagged],
                                   ids=["strided", "jagged"])(test)


@NESTED_LAYOUTS
@pytest.mark.parametrize("name", ["input", "weights", "bias", "old_h", "old_cell"])
def test_lltm_refuses_a_nested_tensor_naming_the_argument(name, layout):
    inputs = [torch.randn(2, 3), torch.randn(12, 7), torch.randn(12), torch.randn(2, 4),
              torch.randn(2, 4)]
    index = ("input", "weights", "bias", "old_h", "old_cell").index(name)
    inputs[index] = _nested(inputs[index], layout)
    with raises_with(TypeError, f"lltm: {name} is a nested tensor", "to_padded_tensor"):
        lltm_ffi.lltm(*inputs)


@NESTED_LAYOUTS
def test_round_ste_refuses_a_nested_tensor(layout):
    with raises_with(TypeError, "round_ste: input is a nested tensor", "to_padded_tensor"):
        lltm_ffi.round_ste(_nested(torch.rand(3, 4), layout))


LAYOUTS = {
    "sparse_coo": lambda tensor: tensor.to_sparse(),
    "sparse_csr": lambda tensor: tensor.to_sparse_csr(),
    "sparse_csc": lambda tensor: tensor.to_sparse_csc(),
    "sparse_bsr": lambda tensor: tensor.to_sparse_bsr((2, 2)),
    "mkldnn": lambda tensor: tensor.to_mkldnn(),
}


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state:UserWarning")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_round_ste_names_a_non_strided_layout_as_lltm_does(layout):
    convert = LAYOUTS[layout]
    tensor = convert(torch.rand(4, 6))
    with pytest.raises(TypeError) as round_error:
        lltm_ffi.round_ste(tensor)
    inputs = [tensor, torch.randn(12, 10), torch.randn(12), torch.randn(4, 4), torch.randn(4, 4)]
    with pytest.raises(TypeError) as lltm_error:
        lltm_ffi.lltm(*inputs)
    expected = (f"input has layout {tensor.layout}; lltm_ffi takes dense (torch.strided) "
                "tensors: convert it with .to_dense()")
    assert str(round_error.value) == f"round_ste: {expected}"
    assert str(lltm_error.value) == f"lltm: {expected}"
