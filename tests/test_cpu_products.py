"""The CPU passes' product paths and threads (ARCHITECTURE.md, "The
sequence's paths"): the own tiles (LLTM_BLAS=0), the BLAS for every product
(LLTM_BLAS=1) and the default plan between them, each against the float64
reference, every output and gradient, dense, reverse and packed; the
forward that keeps nothing for a backward (no_grad, inference_mode, no
argument requiring grad), to the bit of the training forward's; and the
passes' threads, as many as torch.get_num_threads() says."""

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

import lltm_ffi
from lltm_ffi import _blas, _extension
from lltm_ffi.ops.lltm import sequence as sequence_module
from conftest import REPO_ROOT, needs_amx, reference_sequence, set_or_unset, shape_id

# {path: LLTM_BLAS}; None leaves it unset: the default plan.
PATHS = {"own": "0", "blas": "1", "default": None}
# (steps, batch, input_features, state): batches of 1 and 2 (the BLAS's
# products a row at a time), 5 (its packed products, the own tiles' by
# default), 9 and 40 (the BLAS's by default on a CPU without AVX-512);
# states short of the tiles and past the default's LLTM_OWN_TILES_STATE;
# 300 input features; 70 x 4 = 280 rows, past one block of the input part
# of the gates (256 rows); weights' rows of 1040 elements, past a page (the
# backward pass's recurrence in panels, a short one last).
SHAPES = [(5, 1, 7, 33), (4, 2, 5, 300), (3, 5, 9, 40), (6, 9, 4, 70), (2, 17, 300, 31),
          (3, 40, 7, 130), (70, 4, 3, 20), (3, 4, 1000, 40)]
TOLERANCES = {torch.float32: 1e-5, torch.float64: 1e-10}
SEED = 20240531


def use_path(monkeypatch, path):
    set_or_unset(monkeypatch, "LLTM_BLAS", PATHS[path])


def random_arguments(shape, dtype, seed=SEED):
    """inputs, weights, bias, h0, c0 of `shape`, as a trained layer's are scaled."""
    steps, batch, features, state = shape
    generator = torch.Generator().manual_seed(seed)

    def normal(*size, scale=1.0):
        return (torch.randn(*size, generator=generator, dtype=torch.float64) * scale).to(dtype)

    return [normal(steps, batch, features),
            normal(3 * state, state + features, scale=(state + features) ** -0.5),
            normal(3 * state, scale=0.5), normal(batch, state), normal(batch, state)]


def with_gradients(function, arguments, grads):
    """function(*leaves)'s (outputs, h_n, c_n), then the leaves' gradients."""
    leaves = [argument.detach().clone().requires_grad_(True) for argument in arguments]
    outputs, (h_n, c_n) = function(*leaves)
    torch.autograd.backward((outputs, h_n, c_n), grads)
    return [outputs, h_n, c_n] + [leaf.grad for leaf in leaves]


def plan_gives_own_bits(torch_threads, monkeypatch, threads, shape):
    """Whether lltm_sequence's plan on `threads` threads gives LLTM_BLAS=0's
    bits (every product on the own tiles) in float32 at `shape`, outputs
    and gradients; the plan's pass runs last, for recurrence_of_a_pass."""
    arguments, grads = random_arguments(shape, torch.float32), random_grads(shape, torch.float32)
    torch_threads(threads)
    results = []
    for path in ("own", "default"):
        use_path(monkeypatch, path)
        results.append(with_gradients(lltm_ffi.lltm_sequence, arguments, grads))
    own, default = results
    return all(torch.equal(got, wanted) for got, wanted in zip(default, own))


def reference_of(reverse, lengths=None):
    """The float64 reference of lltm_sequence: a loop of the reference cell
    over each sequence's own steps (all of them without `lengths`), last to
    first where `reverse`; outputs (steps, batch, state), zero past a
    sequence's end."""
    def run(inputs, weights, bias, h0, c0):
        steps = inputs.shape[0]
        outputs, h_n, c_n = [], [], []
        for row, length in enumerate(lengths or [steps] * inputs.shape[1]):
            own = inputs[:length, row:row + 1]
            own = own.flip(0) if reverse else own
            out, (h, c) = reference_sequence(own, weights, bias, h0[row:row + 1], c0[row:row + 1])
            out = out.flip(0) if reverse else out
            outputs.append(torch.cat((out, out.new_zeros(steps - length, *out.shape[1:]))))
            h_n.append(h)
            c_n.append(c)
        return torch.cat(outputs, 1), (torch.cat(h_n), torch.cat(c_n))
    return run


def lltm_of(reverse, lengths=None):
    """lltm_sequence on the same layout as reference_of: dense, or packed by
    `lengths` (longest first) and padded back."""
    def run(inputs, weights, bias, h0, c0):
        if lengths is None:
            return lltm_ffi.lltm_sequence(inputs, weights, bias, h0, c0, reverse=reverse)
        packed = pack_padded_sequence(inputs, torch.tensor(lengths))
        outputs, state = lltm_ffi.lltm_sequence(packed, weights, bias, h0, c0, reverse=reverse)
        padded, _ = torch.nn.utils.rnn.pad_packed_sequence(outputs, total_length=inputs.shape[0])
        return padded, state
    return run


def random_grads(shape, dtype):
    steps, batch, _, state = shape
    generator = torch.Generator().manual_seed(SEED + 1)
    return [torch.randn(*size, generator=generator, dtype=torch.float64).to(dtype)
            for size in ((steps, batch, state), (batch, state), (batch, state))]


def assert_agrees_with_the_reference(shape, dtype, reverse, lengths=None):
    arguments = random_arguments(shape, dtype)
    grads = random_grads(shape, dtype)
    got = with_gradients(lltm_of(reverse, lengths), arguments, grads)
    exact = with_gradients(reference_of(reverse, lengths), [a.double() for a in arguments],
                           [g.double() for g in grads])
    names = ("outputs", "h_n", "c_n", "d_inputs", "d_weights", "d_bias", "d_h0", "d_c0")
    errors = {name: _relative_error(value, wanted) for name, value, wanted in
              zip(names, got, exact)}
    failures = [f"{name}: {error:.3g}" for name, error in errors.items()
                if not error <= TOLERANCES[dtype]]
    assert not failures, f"relative errors past {TOLERANCES[dtype]:g}: {'; '.join(failures)}"


def _relative_error(value, wanted):
    return ((value.double() - wanted).norm() / wanted.norm()).item()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_every_product_path_agrees_with_the_float64_reference(dtype, shape, reverse, path,
                                                              monkeypatch):
    use_path(monkeypatch, path)
    assert_agrees_with_the_reference(shape, dtype, reverse)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("shape, lengths", [
    ((6, 4, 3, 40), [6, 5, 2, 1]), ((5, 12, 7, 300), [5] * 3 + [4] * 4 + [2] * 3 + [1] * 2)],
    ids=["4x40", "12x300"])
def test_every_product_path_agrees_on_packed_steps(shape, lengths, reverse, path, monkeypatch):
    """The steps shrink to 2 and 1 rows: the BLAS's products of a row at a time."""
    use_path(monkeypatch, path)
    assert_agrees_with_the_reference(shape, torch.float32, reverse, lengths)


def test_the_blas_is_loaded_where_its_wheel_is_installed():
    if importlib.util.find_spec(_blas.PACKAGE) is None:
        assert _extension.blas_config() == ""
        pytest.skip(f"{_blas.PACKAGE} is not installed: the own products only")
    assert _blas.library_path() is not None
    assert _extension.blas_config().startswith("OpenBLAS")


# Without the wheel: a process that cannot find scipy_openblas32 (as
# sys.modules[name] = None hides a package from importlib) loads no BLAS,
# and every path, LLTM_BLAS=1's too, takes the own tiles, to the bit.
WITHOUT_THE_WHEEL = """
import os, sys
sys.modules[{package!r}] = None
sys.path[:0] = [{root!r}, {tests!r}]
import torch
from lltm_ffi import _blas, _extension
import test_cpu_products as t
assert _blas.library_path() is None, _blas.library_path()
assert _extension.blas_config() == "", _extension.blas_config()
for path in ("default", "blas"):
    if t.PATHS[path] is None:
        os.environ.pop("LLTM_BLAS", None)
    else:
        os.environ["LLTM_BLAS"] = t.PATHS[path]
    for shape in ((4, 2, 5, 300), (3, 40, 7, 130)):
        t.assert_agrees_with_the_reference(shape, torch.float32, False)
arguments = t.random_arguments((6, 9, 4, 70), torch.float32)
results = {{}}
for setting in ("0", "1"):
    os.environ["LLTM_BLAS"] = setting
    results[setting] = t.with_gradients(t.lltm_of(True), arguments,
                                        t.random_grads((6, 9, 4, 70), torch.float32))
assert all(torch.equal(a, b) for a, b in zip(results["0"], results["1"]))
print("own tiles only")
"""


def test_without_the_wheel_the_own_tiles_take_every_product():
    code = WITHOUT_THE_WHEEL.format(package=_blas.PACKAGE, root=str(REPO_ROOT),
                                    tests=str(Path(__file__).parent))
    environment = {**os.environ, "LLTM_TEST_SEED": str(SEED)}
    environment.pop("LLTM_BLAS", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=environment, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("own tiles only"), done.stdout


def test_the_requirements_pin_the_blas_that_pip_installs():
    """requirements.txt (what make test installs, through scripts/deps.py)
    and pyproject.toml (what pip installs) pin the same version, and
    deps.py replaces any other installed one."""
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    try:
        import deps
    finally:
        sys.path.remove(str(REPO_ROOT / "scripts"))
    pins = [(operator, version) for name, operator, version, _ in
            deps.read_requirements(REPO_ROOT / "requirements.txt") if name == "scipy-openblas32"]
    assert len(pins) == 1 and pins[0][0] == "==", pins
    version = pins[0][1]
    assert f'"scipy-openblas32=={version};' in (REPO_ROOT / "pyproject.toml").read_text()
    assert deps.unmet("pytest", "==", "0.1") is not None
    assert deps.unmet("pytest", "==", importlib.metadata.version("pytest")) is None


# The forward alone: the same bits as the training forward.

def forward_contexts():
    return {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
            "no argument requiring grad": None}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16],
                         ids=["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("shape", [(70, 4, 3, 20), (3, 40, 7, 130), (9, 1, 5, 300)],
                         ids=shape_id)
def test_a_forward_without_backward_gives_the_training_forwards_bits(shape, dtype, reverse,
                                                                     packed, path,
                                                                     monkeypatch):
    use_path(monkeypatch, path)
    inputs, weights, bias, h0, c0 = random_arguments(shape, dtype)
    steps, batch = shape[:2]
    lengths = [steps - row * (steps - 1) // max(batch - 1, 1) for row in range(batch)]
    if packed:
        inputs = pack_padded_sequence(inputs, torch.tensor(lengths))
    trained = lltm_ffi.lltm_sequence(inputs, weights.clone().requires_grad_(), bias, h0, c0,
                                     reverse=reverse)
    for name, context in forward_contexts().items():
        if context is None:
            alone = lltm_ffi.lltm_sequence(inputs, weights, bias, h0, c0, reverse=reverse)
        else:
            with context():
                alone = lltm_ffi.lltm_sequence(inputs, weights.clone().requires_grad_(), bias,
                                               h0, c0, reverse=reverse)
        for what, got, wanted in (("outputs", alone[0], trained[0]),
                                  ("h_n", alone[1][0], trained[1][0]),
                                  ("c_n", alone[1][1], trained[1][1])):
            got = got.data if packed else got
            wanted = wanted.data if packed else wanted
            assert torch.equal(got, wanted), f"{name}: {what} differ from the training forward's"


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_a_gpu_forward_without_backward_agrees_with_the_training_forward(packed, reverse,
                                                                         cuda_device):
    """On a GPU the forward alone is the packed pass too, keeping no cells
    or gates there either (test_paths.py checks its bits path by path)."""
    shape = (9, 40, 7, 130)
    inputs, weights, bias, h0, c0 = (tensor.to(cuda_device) for tensor in
                                     random_arguments(shape, torch.float32))
    if packed:
        inputs = pack_padded_sequence(inputs, torch.tensor([9] * 20 + [5] * 15 + [1] * 5))
    trained = lltm_ffi.lltm_sequence(inputs, weights.clone().requires_grad_(), bias, h0, c0,
                                     reverse=reverse)
    with torch.inference_mode():
        alone = lltm_ffi.lltm_sequence(inputs, weights, bias, h0, c0, reverse=reverse)
    alone_outputs, trained_outputs = alone[0], trained[0]
    if packed:
        alone_outputs, trained_outputs = alone_outputs.data, trained_outputs.data
    for got, wanted in ((alone_outputs, trained_outputs), *zip(alone[1], trained[1])):
        assert _relative_error(got, wanted.detach()) <= TOLERANCES[torch.float32]


def test_a_forward_without_backward_keeps_no_cells_or_gates(monkeypatch):
    """lltm_sequence runs the packed forward pass with saved=False where no
    backward follows, and on the CPU that pass allocates neither."""
    calls = []
    run = sequence_module.packed_forward.run

    def spy(*args, **options):
        calls.append(options)
        return run(*args, **options)

    monkeypatch.setattr(sequence_module.packed_forward, "run", spy)
    inputs, weights, bias, h0, c0 = random_arguments((5, 3, 4, 24), torch.float32)
    with torch.no_grad():
        outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(inputs, weights, bias, h0, c0)
    assert [call["saved"] for call in calls] == [False]
    result = run(inputs.reshape(15, 4), weights, bias, h0, c0, None, False, saved=False)
    assert result[1] is None and result[2] is None
    assert torch.equal(result[0].view(5, 3, 24), outputs)
    calls.clear()
    lltm_ffi.lltm_sequence(inputs, weights.clone().requires_grad_(), bias, h0, c0)
    assert calls == [], "a forward autograd records took the forward alone"


# Threads.

@pytest.fixture
def torch_threads():
    """torch.set_num_threads for the test, the caller's count back after it."""
    saved = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(saved)


def outputs_and_threads_of_a_pass(inputs, weights, bias, h0, c0):
    """lltm_sequence's outputs without autograd, and the most threads its
    forward pass ran on (the calling thread's last pass)."""
    with torch.no_grad():
        outputs, _ = lltm_ffi.lltm_sequence(inputs, weights, bias, h0, c0)
    return outputs, _extension.lib.lltm_cpu_threads_used()


def threads_of_a_pass(*arguments):
    """The most threads lltm_sequence's forward pass ran on."""
    return outputs_and_threads_of_a_pass(*arguments)[1]


@pytest.mark.parametrize("path", PATHS)
def test_the_passes_run_on_torchs_threads(path, torch_threads, monkeypatch):
    """As many as torch.get_num_threads() says, one where it says one; in a
    thread of its own too, whose OpenMP setting torch never touched."""
    use_path(monkeypatch, path)
    arguments = random_arguments((4, 64, 32, 128), torch.float32)
    torch_threads(1)
    assert threads_of_a_pass(*arguments) == 1
    torch_threads(2)
    assert threads_of_a_pass(*arguments) == 2
    torch_threads(1)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(threads_of_a_pass(*arguments)))
    worker.start()
    worker.join()
    assert seen == [1]


@pytest.mark.parametrize("workers", [1, 3, 1000])
def test_a_pytest_xdist_worker_takes_its_share_of_the_cores(workers, torch_threads, monkeypatch):
    """lltm_ffi.testing's pytest_configure, under `pytest -n WORKERS`."""
    from lltm_ffi import testing
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
    testing.pytest_configure(None)
    assert torch.get_num_threads() == max(1, cores // workers)
    torch_threads(cores + 1)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT")
    testing.pytest_configure(None)
    assert torch.get_num_threads() == cores + 1


def test_a_larger_team_takes_smaller_work(torch_threads, monkeypatch):
    """Two threads pay from 32,768 elements of a loop on; a team of n from
    2/n of that (lltm_team_size): a pass whose largest loop is 24,576
    elements (a step's 32 x 192 sums of 64 products each, as 16 multiply-adds
    an element) runs on one thread of two, on all of sixteen."""
    use_path(monkeypatch, "default")
    arguments = random_arguments((2, 32, 8, 64), torch.float32)
    torch_threads(2)
    assert threads_of_a_pass(*arguments) == 1
    torch_threads(16)
    assert threads_of_a_pass(*arguments) == 16


@needs_amx
@pytest.mark.parametrize("threads, state", [(2, 128), (4, 128), (4, 256), (16, 128)])
def test_threads_split_a_bfloat16_step_of_two_row_blocks_by_rows_first(threads, state,
                                                                       torch_threads):
    """A bfloat16 step of 64 rows (two of AMX's blocks of 32) at a state of
    128 is 11,264 units of work: below what two or four threads take by
    blocks of states (32,768 and 16,384), above what they take by rows
    (8,192, start_amx_step_), each of two threads all the states of its 32
    rows; at a state of 256, four threads split each block of rows' states
    in two; sixteen, which blocks of 32 rows would leave half idle, take
    parts of 16 rows (a tile row) by 32 states. Each way the pass gives the
    bits of one thread."""
    arguments = random_arguments((3, 64, 20, state), torch.bfloat16)
    torch_threads(1)
    alone, one = outputs_and_threads_of_a_pass(*arguments)
    torch_threads(threads)
    split, team = outputs_and_threads_of_a_pass(*arguments)
    assert (one, team) == (1, threads)
    assert torch.equal(split, alone)


@needs_amx
@pytest.mark.parametrize("threads", [4, 16])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_parts_packing_their_own_rows_give_one_threads_bits(reverse, threads, torch_threads):
    """64 bfloat16 sequences of 1 to 6 steps at a state of 128: on four
    threads each part of a step packs its own rows (start_amx_step_), on
    sixteen parts of 16 rows, of steps that lose rows as sequences end, the
    backward's of fewer rows than the step has (those carried to the step
    before). Outputs, final states and every gradient are one thread's, bit
    for bit."""
    shape = (6, 64, 20, 128)
    lengths = [6] * 7 + [5] * 13 + [4] * 13 + [3] * 8 + [2] * 19 + [1] * 4
    arguments = random_arguments(shape, torch.bfloat16)
    grads = random_grads(shape, torch.bfloat16)
    results = []
    for count in (1, threads):
        torch_threads(count)
        results.append(with_gradients(lltm_of(reverse, lengths), arguments, grads))
    alone, split = results
    assert all(torch.equal(got, wanted) for got, wanted in zip(split, alone))


def recurrence_of_a_pass():
    """What took the recurrent products of the calling thread's last CPU pass."""
    return _extension.ffi.string(_extension.lib.lltm_cpu_recurrence()).decode()


def test_a_large_batch_of_a_small_state_takes_the_own_tiles_where_they_pay(torch_threads,
                                                                          monkeypatch):
    """The plan's recurrence of 8 rows or more of a state up to 256
    (lltm_own_tiles_pay, as the last pass, the backward, reports it): the own
    tiles' on 4 threads, and on 2 where the CPU has AVX-512, else the
    BLAS's; where they are the own tiles', they agree with the BLAS forced."""
    if _blas.library_path() is None:
        pytest.skip(f"{_blas.PACKAGE} is not installed: the own products only")
    shape = (3, 16, 8, 64)
    arguments, grads = random_arguments(shape, torch.float32), random_grads(shape, torch.float32)

    def results(path):
        use_path(monkeypatch, path)
        got = with_gradients(lltm_ffi.lltm_sequence, arguments, grads)
        return got, recurrence_of_a_pass()

    for threads, own in ((2, bool(_extension.lib.lltm_cpu_avx512())), (4, True)):
        torch_threads(threads)
        (default, recurrence), (blas, forced) = results("default"), results("blas")
        assert (recurrence, forced) == ("own tiles" if own else "blas", "blas")
        for got, wanted in zip(default, blas):
            assert _relative_error(got, wanted) <= TOLERANCES[torch.float32]


def test_a_batch_of_8_or_more_of_a_state_up_to_1024_takes_the_own_tiles_with_avx512(
        torch_threads, monkeypatch):
    """Past a state of 256, the plan's recurrence (lltm_own_tiles_pay) is the
    own tiles' for 8 rows or more up to a state of 1024 on a CPU with
    AVX-512, on one thread for at most 16 rows; else the BLAS's (or the own
    tiles' everywhere, where the BLAS is narrower than the CPU). Where the
    own tiles take it, the results agree with the BLAS forced."""
    if _blas.library_path() is None:
        pytest.skip(f"{_blas.PACKAGE} is not installed: the own products only")
    avx512, narrow = bool(_extension.lib.lltm_cpu_avx512()), bool(_extension.lib.lltm_blas_narrow())
    cases = ((1, 16, 300, avx512), (1, 20, 300, False), (2, 20, 300, avx512),
             (2, 7, 300, False), (2, 8, 1025, False))
    for threads, batch, state, own in cases:
        shape = (2, batch, 5, state)
        arguments = random_arguments(shape, torch.float32)
        grads = random_grads(shape, torch.float32)
        torch_threads(threads)
        use_path(monkeypatch, "default")
        default = with_gradients(lltm_ffi.lltm_sequence, arguments, grads)
        recurrence = recurrence_of_a_pass()
        assert recurrence == ("own tiles" if own or narrow else "blas"), (threads, shape)
        use_path(monkeypatch, "blas")
        forced = with_gradients(lltm_ffi.lltm_sequence, arguments, grads)
        for got, wanted in zip(default, forced):
            assert _relative_error(got, wanted) <= TOLERANCES[torch.float32], (threads, shape)


def test_eight_threads_take_every_product_of_a_small_state_on_the_own_tiles_with_avx512(
        torch_threads, monkeypatch):
    """On 8 threads or more of a CPU with AVX-512, a batch of 3 rows or more
    of a state up to 256 takes every product on the own tiles
    (lltm_own_products_pay): the bits of LLTM_BLAS=0's, as on 4 threads the
    inputs' products on the BLAS do not give."""
    if _blas.library_path() is None:
        pytest.skip(f"{_blas.PACKAGE} is not installed: the own products only")
    if not _extension.lib.lltm_cpu_avx512() or _extension.lib.lltm_blas_narrow():
        pytest.skip("the rule is for a CPU with AVX-512 and a BLAS as wide")
    shape = (3, 16, 40, 200)
    assert plan_gives_own_bits(torch_threads, monkeypatch, 8, shape)
    assert not plan_gives_own_bits(torch_threads, monkeypatch, 4, shape)


def test_four_threads_take_every_product_of_a_state_up_to_128_on_the_own_tiles_with_avx512(
        torch_threads, monkeypatch):
    """From 4 threads on, with AVX-512, a batch of 3 rows or more of a state
    up to 128 takes every product on the own tiles (lltm_own_products_pay):
    LLTM_BLAS=0's bits at 128, where 2 threads, or a state of 129, keep the
    inputs' products on the BLAS."""
    if _blas.library_path() is None:
        pytest.skip(f"{_blas.PACKAGE} is not installed: the own products only")
    if not _extension.lib.lltm_cpu_avx512() or _extension.lib.lltm_blas_narrow():
        pytest.skip("the rule is for a CPU with AVX-512 and a BLAS as wide")
    assert plan_gives_own_bits(torch_threads, monkeypatch, 4, (3, 16, 40, 128))
    assert not plan_gives_own_bits(torch_threads, monkeypatch, 2, (3, 16, 40, 128))
    assert not plan_gives_own_bits(torch_threads, monkeypatch, 4, (3, 16, 40, 129))


def test_where_the_blas_is_narrower_than_the_cpu_the_own_tiles_take_every_product(
        torch_threads, monkeypatch):
    """With the BLAS's kernels narrower than the CPU's vectors
    (lltm_blas_narrow: OPENBLAS_CORETYPE=Haswell on a CPU with AVX-512), a
    batch of 20 of a state of 810 (past LLTM_OWN_TILES_STATE, and off the
    panels' width) takes every product on the own tiles: the bits
    of LLTM_BLAS=0's. Elsewhere its recurrence is the BLAS's."""
    if _blas.library_path() is None:
        pytest.skip(f"{_blas.PACKAGE} is not installed: the own products only")
    same = plan_gives_own_bits(torch_threads, monkeypatch, 1, (3, 20, 8, 810))
    if not _extension.lib.lltm_blas_narrow():
        assert recurrence_of_a_pass() == "blas"
        return
    assert recurrence_of_a_pass() == "own tiles"
    assert same


@pytest.mark.parametrize("path", PATHS)
def test_the_threads_change_no_more_than_the_order_of_sums(path, torch_threads, monkeypatch):
    """The own tiles give the same bits on any number of threads; the BLAS's
    products, cut into one part a thread, may sum in another order."""
    use_path(monkeypatch, path)
    shape = (6, 40, 7, 130)
    arguments, grads = random_arguments(shape, torch.float32), random_grads(shape, torch.float32)
    results = []
    for threads in (1, 2, 3):
        torch_threads(threads)
        results.append(with_gradients(lltm_ffi.lltm_sequence, arguments, grads))
    for other in results[1:]:
        for got, wanted in zip(other, results[0]):
            if path == "own":
                assert torch.equal(got, wanted)
            assert _relative_error(got, wanted) <= TOLERANCES[torch.float32]
