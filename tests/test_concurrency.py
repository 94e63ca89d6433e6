"""Several Python threads calling lltm_ffi.lltm forward and backward at once
(cffi releases the GIL around the C passes, so they do run concurrently):
each thread's results equal, bit for bit, a serial run of the same inputs.
On the CPU each thread has its own tensors (some large enough for the passes'
OpenMP loop); on a GPU each thread also has its own CUDA stream.

    python -m pytest -q tests/test_concurrency.py
"""

import threading

import pytest
import torch

from builders import random_grad_outputs
from conftest import PASS_NAMES, RESULT_NAMES, outputs_and_gradients
import lltm_ffi
from lltm_ffi import selfcheck

THREADS = 4
ITERATIONS = 20
# (batch, input_features, state_size, dtype): odd sizes, batch 1, both CUDA
# kernel paths (state % 4 == 0 and not), and 64 x 600 = 38400 elements, past
# the CPU passes' OpenMP threshold (32768). Thread t takes case (i * (t + 1))
# % 4 at iteration i: every thread its own sequence of shapes, the threads
# often on the same shape at once.
CASES = [
    (3, 5, 7, torch.float32),
    (1, 4, 8, torch.float64),
    (13, 17, 19, torch.float32),
    (64, 33, 600, torch.float64),
]
TIMEOUT = 300


def _work(thread, device, generator):
    """ITERATIONS (inputs, grad_outputs) pairs for one thread."""
    work = []
    for iteration in range(ITERATIONS):
        batch_size, input_features, state_size, dtype = CASES[iteration * (thread + 1) % len(CASES)]
        inputs = selfcheck.random_inputs(batch_size, input_features, state_size, dtype, device,
                                         generator)
        work.append((inputs, random_grad_outputs(inputs, generator)))
    return work


def _step(inputs, grads):
    outputs, gradients = outputs_and_gradients(inputs, grads)
    return outputs + gradients


def _pass_step(inputs, grads):
    """The fused passes alone, through the registered operators."""
    X = torch.cat((inputs[3], inputs[0]), dim=1)
    gates = torch.addmm(inputs[2], X, inputs[1].t())
    new_h, new_cell = torch.ops.lltm_ffi.forward_pass(gates, inputs[4])
    d_old_cell, d_gates = torch.ops.lltm_ffi.backward_pass(grads[0], grads[1], new_cell, gates)
    return [new_h, new_cell, d_old_cell, d_gates]


def _run(step, work, stream=None):
    if stream is None:
        return [step(*item) for item in work]
    # The inputs were made on the default stream; this stream waits for them.
    stream.wait_stream(torch.cuda.default_stream(stream.device))
    with torch.cuda.stream(stream):
        results = [step(*item) for item in work]
    stream.synchronize()
    return results


def _run_concurrently(step, works, streams):
    """Each work list on its own thread (and stream), all released at once."""
    barrier = threading.Barrier(len(works))
    results, errors = [None] * len(works), [None] * len(works)

    def thread_main(index):
        try:
            barrier.wait(timeout=TIMEOUT)
            results[index] = _run(step, works[index], streams[index])
        except BaseException as error:  # noqa: BLE001 -- re-raised in the test thread
            errors[index] = error

    threads = [threading.Thread(target=thread_main, args=(index,), daemon=True)
               for index in range(len(works))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=TIMEOUT)
        assert not thread.is_alive(), "a thread did not finish"
    for index, error in enumerate(errors):
        if error is not None:
            raise AssertionError(f"thread {index} raised") from error
    return results


def _assert_bitwise_equal(concurrent, serial, names):
    for thread, (got_thread, expected_thread) in enumerate(zip(concurrent, serial)):
        for iteration, (got, expected) in enumerate(zip(got_thread, expected_thread)):
            for name, value, wanted in zip(names, got, expected):
                assert torch.equal(value, wanted), (
                    f"thread {thread}, iteration {iteration} (shape {tuple(wanted.shape)}): {name} "
                    f"differs from the serial run by up to "
                    f"{(value.double() - wanted.double()).abs().max().item():.3g}")


def _works(device, seed):
    generator = torch.Generator().manual_seed(seed)
    return [_work(thread, device, generator) for thread in range(THREADS)]


def test_threads_on_cpu_match_a_serial_run(seed):
    works = _works(torch.device("cpu"), seed)
    streams = [None] * len(works)
    serial = [_run(_step, work) for work in works]
    for _ in range(2):  # twice: different interleavings
        _assert_bitwise_equal(_run_concurrently(_step, works, streams), serial, RESULT_NAMES)


def test_threads_on_cpu_fused_passes_match_a_serial_run(seed):
    works = _works(torch.device("cpu"), seed)
    serial = [_run(_pass_step, work) for work in works]
    concurrent = _run_concurrently(_pass_step, works, [None] * len(works))
    _assert_bitwise_equal(concurrent, serial, PASS_NAMES)


@pytest.mark.parametrize("step, names", [(_pass_step, PASS_NAMES), (_step, RESULT_NAMES)],
                         ids=["fused_passes", "lltm"])
def test_threads_with_own_cuda_streams_match_a_serial_run(step, names, cuda_device, seed):
    """The fused passes alone first: should the full cell differ and they not,
    the difference comes from cuBLAS, not from lltm_ffi."""
    works = _works(cuda_device, seed)
    streams = [torch.cuda.Stream(cuda_device) for _ in works]
    torch.cuda.synchronize(cuda_device)
    serial = [_run(step, work, stream) for work, stream in zip(works, streams)]
    for _ in range(2):
        _assert_bitwise_equal(_run_concurrently(step, works, streams), serial, names)


# (steps, batch, input_features, state_size, dtype): the persistent kernels'
# sizes and, past them, cuBLAS's products; each thread its own tensors and stream.
SEQUENCE_CASES = [(6, 3, 5, 24, torch.float32), (4, 40, 7, 520, torch.float32),
                  (3, 33, 6, 530, torch.float64)]


def _sequence_work(device, generator):
    work = []
    for steps, batch_size, input_features, state_size, dtype in SEQUENCE_CASES:
        def normal(*size):
            return torch.randn(*size, generator=generator, dtype=dtype).to(device)

        arguments = [normal(steps, batch_size, input_features),
                     normal(3 * state_size, state_size + input_features) * state_size ** -0.5,
                     normal(3 * state_size), normal(batch_size, state_size),
                     normal(batch_size, state_size)]
        grads = [normal(steps, batch_size, state_size), normal(batch_size, state_size),
                 normal(batch_size, state_size)]
        work.append((arguments, grads))
    return work


def _sequence_step(arguments, grads):
    leaves = [argument.detach().clone().requires_grad_(True) for argument in arguments]
    outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(*leaves)
    torch.autograd.backward((outputs, h_n, c_n), grads)
    return [outputs, h_n, c_n] + [leaf.grad for leaf in leaves]


def test_threads_with_own_cuda_streams_run_sequences_as_a_serial_run(cuda_device, seed):
    """The sequence layer's cuBLAS handle is shared by every stream of a device."""
    generator = torch.Generator().manual_seed(seed)
    works = [_sequence_work(cuda_device, generator) * 3 for _ in range(THREADS)]
    streams = [torch.cuda.Stream(cuda_device) for _ in works]
    torch.cuda.synchronize(cuda_device)
    serial = [_run(_sequence_step, work, stream) for work, stream in zip(works, streams)]
    names = ("outputs", "h_n", "c_n", "d_inputs", "d_weights", "d_bias", "d_h0", "d_c0")
    for _ in range(2):
        _assert_bitwise_equal(_run_concurrently(_sequence_step, works, streams), serial, names)
