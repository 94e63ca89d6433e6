"""The cases of lltm_ffi.lltm whose tensors reach C with unusual sizes or
strides: zero sizes and aliased arguments (test_edge_values.py), the layouts
of builders.py on each argument and the output gradients, and huge strides
on size-1 dimensions (test_layouts.py). They all run in one child process
(conftest's child_run fixture), so that a crash fails those cases instead of
killing the test session; the child must exit normally.

Each case builds (inputs, grad_outputs) from a generator; the child compares
lltm_ffi's outputs and gradients with the reference's (computed in float64),
as relative errors in norm, within conftest.allowed_error.

    python tests/child_cases.py SEED CASE...   (what the child runs)

Other test files run their own crash-prone cases the same way: their main
calls child_main with their own run_case, and run_child(their file, ids).
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# conftest puts the checkout first on sys.path (for the child too, which runs
# this file as a script from tests/).
from conftest import (ARGUMENT_NAMES, REPO_ROOT, RESULT_NAMES, SEED_VARIABLE, allowed_error,
                      outputs_and_gradients, seed_for)

import builders  # noqa: E402
import lltm_ffi  # noqa: E402
from builders import random_grad_outputs, random_inputs  # noqa: E402
from lltm_ffi import reference, selfcheck  # noqa: E402

LAYOUTS = {
    "transposed": builders.transposed,
    "every_other": builders.every_other,
    "misaligned": builders.misaligned,
    "odd_strides": builders.odd_strides,
    "overlapping": builders.overlapping,
    "broadcast_rows": builders.broadcast_rows,
    "broadcast_all": builders.broadcast_all,
}


def _layout_case(shape, layout, arguments):
    """A case with `layout` applied to `arguments` (names; "grad" for both output gradients)."""
    def build(dtype, device, generator):
        inputs = random_inputs(generator, shape, dtype, device)
        grads = random_grad_outputs(inputs, generator)
        for name in arguments:
            if name == "grad":
                grads = [layout(grad) for grad in grads]
            else:
                index = ARGUMENT_NAMES.index(name)
                inputs[index] = layout(inputs[index])
        return inputs, grads
    return build


def _aliased_case(dtype, device, generator):
    """input, old_h and old_cell are one tensor (input_features == state_size)."""
    inputs = random_inputs(generator, (3, 7, 7), dtype, device)
    inputs[0] = inputs[3] = inputs[4]
    return inputs, random_grad_outputs(inputs, generator)


def _bias_2d_huge_row_stride(dtype, device, generator):
    inputs = random_inputs(generator, (1, 5, 8), dtype, device)
    inputs[2] = builders.huge_stride_on_size_one_dims(inputs[2].unsqueeze(0))
    return inputs, random_grad_outputs(inputs, generator)


ZERO_SIZE_SHAPES = {"batch0": (0, 5, 7), "features0": (3, 0, 7), "state0": (3, 5, 0),
                    "batch0-state0": (0, 5, 0), "all0": (0, 0, 0), "batch0-wide": (0, 5, 8)}

CASES = {}
for _label, _shape in ZERO_SIZE_SHAPES.items():
    CASES[f"zero_size-{_label}"] = _layout_case(_shape, lambda tensor: tensor, ())
# State 7: the CUDA passes' one-element path; state 8: their 16-byte path.
for _state_label, _shape in (("s7", (3, 5, 7)), ("s8", (4, 6, 8))):
    for _layout_name, _layout in LAYOUTS.items():
        for _name in ARGUMENT_NAMES + ("grad",):
            CASES[f"layout-{_layout_name}-{_name}-{_state_label}"] = _layout_case(
                _shape, _layout, (_name,))
        CASES[f"layout-{_layout_name}-all-{_state_label}"] = _layout_case(
            _shape, _layout, ARGUMENT_NAMES + ("grad",))
# Size-1 dimensions may carry any stride; nothing may use it.
for _label, _shape, _names in (
        ("batch1", (1, 5, 8), ("input", "old_h", "old_cell", "grad")),
        ("state1", (3, 5, 1), ("old_h", "old_cell", "grad")),
        ("features1", (3, 1, 4), ("input",))):
    CASES[f"huge_stride-{_label}"] = _layout_case(_shape, builders.huge_stride_on_size_one_dims,
                                                  _names)
CASES["huge_stride-bias_1x3S"] = _bias_2d_huge_row_stride
CASES["aliased-input_old_h_old_cell"] = _aliased_case


def _devices():
    found = [torch.device("cpu")]
    if torch.cuda.is_available():
        found.append(torch.device("cuda", 0))
    return found


# The CUDA cases exist where a GPU does (so a CPU-only run lists no skips for them).
CASE_IDS = [f"{device.type}-{dtype}-{case}" for device in _devices()
            for dtype in ("float32", "float64") for case in CASES]


def case_ids(*kinds):
    """The ids of the cases whose name starts with one of `kinds` ("layout", ...)."""
    return [case_id for case_id in CASE_IDS if case_id.split("-", 2)[2].startswith(kinds)]


def _converted(inputs, grads, dtype):
    """The same arguments in `dtype` (one tensor stays one tensor)."""
    converted = {id(tensor): tensor.to(dtype) for tensor in inputs}
    return [converted[id(tensor)] for tensor in inputs], [grad.to(dtype) for grad in grads]


def _run_case(case_id, seed):
    """Runs one case; returns a summary, or raises AssertionError on a mismatch."""
    device, dtype, case = case_id.split("-", 2)
    device = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    dtype = getattr(torch, dtype)
    generator = torch.Generator().manual_seed(seed)
    inputs, grads = CASES[case](dtype, device, generator)
    outputs, gradients = outputs_and_gradients(inputs, grads, lltm_ffi.lltm)
    expected = outputs_and_gradients(*_converted(inputs, grads, torch.float64), reference.lltm)
    inputs32, grads32 = _converted(inputs, grads, torch.float32)
    conditioning = outputs_and_gradients(inputs32, grads32, reference.lltm)
    conditioning_expected = outputs_and_gradients(*_converted(inputs32, grads32, torch.float64),
                                                  reference.lltm)
    if device.type == "cuda":
        torch.cuda.synchronize()
    worst = 0.0
    for name, value, wanted, hard, hard_wanted in zip(
            RESULT_NAMES, outputs + gradients, expected[0] + expected[1],
            conditioning[0] + conditioning[1], conditioning_expected[0] + conditioning_expected[1]):
        assert value.shape == wanted.shape, f"{name} has shape {tuple(value.shape)}, " \
                                            f"reference {tuple(wanted.shape)}"
        assert value.dtype == dtype and value.device == device, f"{name}: {value.dtype} on {value.device}"
        error = selfcheck.relative_error(value, wanted)
        reference_error = selfcheck.relative_error(hard, hard_wanted)
        allowed = allowed_error(dtype, reference_error)
        assert error <= allowed, (f"{name} relative error {error:.3g} exceeds {allowed:.3g} "
                                  f"(the reference in float32: {reference_error:.3g})")
        worst = max(worst, error)
    return f"largest relative error {worst:.3g}"


def child_main(arguments, run_case=None):
    """The child's loop: runs each case id after the seed in `arguments` with
    run_case(case_id, seed) (this file's _run_case by default), printing a
    JSON line as it starts and as it ends each."""
    run_case = run_case or _run_case
    seed, case_ids = int(arguments[0]), arguments[1:]
    for case_id in case_ids:
        print(json.dumps({"start": case_id}), flush=True)
        try:
            outcome, detail = "ok", run_case(case_id, seed)
        except AssertionError as error:
            outcome, detail = "mismatch", str(error)
        except Exception as error:  # noqa: BLE001 -- reported to the parent
            outcome, detail = "raised", f"{type(error).__name__}: {error}"
        print(json.dumps({"case": case_id, "outcome": outcome, "detail": detail[:4000]}),
              flush=True)
    return 0


def run_child(script=None, case_ids=None):
    """Runs `case_ids` (every case in CASE_IDS by default) in one child
    process running `script` (this file by default, or another whose main
    calls child_main); what it reported."""
    script = Path(script or __file__).resolve()
    seed = seed_for(script.name)
    process = subprocess.run(
        [sys.executable, str(script), str(seed),
         *(CASE_IDS if case_ids is None else case_ids)],
        capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    results, last_started = {}, None
    for line in process.stdout.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if "start" in record:
            last_started = record["start"]
        elif "case" in record:
            results[record["case"]] = record
    return {"seed": seed, "results": results, "returncode": process.returncode,
            "last_started": last_started, "stderr": process.stderr[-3000:]}


def _exit_description(returncode):
    if returncode is not None and returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def _replay(run):
    return f"(replay with {SEED_VARIABLE}={run['seed']})"


def check_exit(run):
    """Fails unless the child of `run` (run_child's result) exited normally."""
    assert run["returncode"] == 0, (
        f"the child running the C-reaching cases ended with "
        f"{_exit_description(run['returncode'])} while running "
        f"{run['last_started']} {_replay(run)}; stderr:\n{run['stderr']}")


def check_case(case_id, run):
    """Fails unless the child of `run` finished `case_id` with the reference's results."""
    record = run["results"].get(case_id)
    if record is None:
        pytest.fail(f"{case_id} did not finish: the child ended with "
                    f"{_exit_description(run['returncode'])} while running "
                    f"{run['last_started']} {_replay(run)}; "
                    f"stderr:\n{run['stderr']}")
    assert record["outcome"] == "ok", f"{case_id}: {record['outcome']}: {record['detail']} " \
                                      f"{_replay(run)}"


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
