"""Everything PyTorch intercepts reaches lltm_ffi's C code only through its
registered operators, which the dispatcher hands on: tensor subclasses
(__torch_dispatch__, as TwoTensor; __torch_function__), fake tensors,
make_fx in every tracing mode, torch.jit.trace, torch.export and a user's
dispatch mode; layouts C cannot read are refused naming them; TorchScript is
refused pointing to torch.compile and torch.export.

A storage-less tensor handed to C makes it write to address 0: the cases that
did so before run in one child process (child_cases.run_child), so that a
regression fails them instead of killing the test session.

    python tests/test_tracing.py SEED CASE...   (what the child runs)
"""

import io
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._python_dispatch import TorchDispatchMode

import child_cases
import lltm_ffi
from builders import random_grad_outputs, random_inputs, sequence_arguments
from conftest import (as_leaves, assert_all_close, outputs_and_gradients, raises_with,
                      reference_sequence)
from lltm_ffi import reference, selfcheck
from lltm_ffi.ops.lltm import cell as lltm_cell, sequence
from lltm_ffi.ops.round_ste.round_ste import round_forward

SHAPE = (3, 5, 7)
SEQUENCE_SHAPE = (4, 3, 5, 7)
TOLERANCE = selfcheck.TOLERANCES[torch.float64]


def _halves(tensors):
    """Each TwoTensor's two halves, in order."""
    for tensor in tensors:
        assert type(tensor) is TwoTensor, f"expected a TwoTensor, got {type(tensor).__name__}"
    return [half for tensor in tensors for half in (tensor.a, tensor.b)]


def _twice(tensors):
    return [value for value in tensors for _ in range(2)]


def _two_tensor_cell(device, generator):
    inputs = random_inputs(generator, SHAPE, torch.float64, device)
    grads = random_grad_outputs(inputs, generator)
    wrapped = [TwoTensor(tensor, tensor.clone()) for tensor in inputs]
    outputs, gradients = outputs_and_gradients(
        wrapped, [TwoTensor(grad, grad.clone()) for grad in grads])
    expected_outputs, expected_gradients = outputs_and_gradients(inputs, grads, reference.lltm)
    assert_all_close(_halves(outputs + gradients),
                     _twice(expected_outputs + expected_gradients), TOLERANCE)


def _two_tensor_sequence(device, generator):
    arguments = sequence_arguments(generator, SEQUENCE_SHAPE, device=device)
    outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(
        *(TwoTensor(tensor, tensor.clone()) for tensor in arguments))
    expected, (expected_h, expected_c) = reference_sequence(*arguments)
    assert_all_close(_halves([outputs, h_n, c_n]), _twice([expected, expected_h, expected_c]),
                     TOLERANCE)


def _two_tensor_round(device, generator):
    values = torch.rand(4, 9, generator=generator, dtype=torch.float64).to(device)
    got = lltm_ffi.round_ste(TwoTensor(values, values.clone()))
    expected = (values >= 0.5).to(values.dtype)
    assert torch.equal(got.a, expected) and torch.equal(got.b, expected)


def _assert_fake_like(got, expected):
    for value, wanted in zip(got, expected):
        assert isinstance(value, FakeTensor), f"expected a FakeTensor, got {type(value)}"
        assert (value.shape, value.dtype, value.device) == (wanted.shape, wanted.dtype,
                                                            wanted.device)


def _fake_cell(device, generator):
    """An eager call (forward and backward) under FakeTensorMode."""
    inputs = random_inputs(generator, SHAPE, torch.float64, device)
    grads = random_grad_outputs(inputs, generator)
    with FakeTensorMode() as mode:
        fakes = [mode.from_tensor(tensor) for tensor in inputs]
        grads = [mode.from_tensor(grad) for grad in grads]
        got = outputs_and_gradients(fakes, grads)
        expected = outputs_and_gradients(fakes, grads, reference.lltm)
    _assert_fake_like(got[0] + got[1], expected[0] + expected[1])


def _fake_sequence(device, generator):
    arguments = sequence_arguments(generator, SEQUENCE_SHAPE, device=device)
    with FakeTensorMode() as mode:
        fakes = [mode.from_tensor(tensor) for tensor in arguments]
        outputs, (h_n, c_n) = lltm_ffi.lltm_sequence(*fakes)
        expected, (expected_h, expected_c) = reference_sequence(*fakes)
    _assert_fake_like([outputs, h_n, c_n], [expected, expected_h, expected_c])


def _fake_round(device, generator):
    values = torch.rand(4, 9, generator=generator).to(device)
    with FakeTensorMode() as mode:
        got = lltm_ffi.round_ste(mode.from_tensor(values))
    _assert_fake_like([got], [values])


def _make_fx_cell(tracing_mode):
    def case(device, generator):
        traced_on = random_inputs(generator, SHAPE, torch.float64, device)
        graph = make_fx(lltm_ffi.lltm, tracing_mode=tracing_mode)(*traced_on)
        assert "lltm_ffi.forward_pass" in graph.code, graph.code
        replayed_on = random_inputs(generator, SHAPE, torch.float64, device)
        assert_all_close(graph(*replayed_on), reference.lltm(*replayed_on), TOLERANCE)
    return case


def _gradients(cell):
    def gradients(*arguments):
        *inputs, grad_h, grad_cell = arguments
        leaves = as_leaves(inputs)
        return torch.autograd.grad(cell(*leaves), leaves, (grad_h, grad_cell))
    return gradients


def _make_fx_cell_gradients(device, generator):
    """make_fx of forward and backward: the graph holds both passes, and its
    replay gives the reference's gradients."""
    def arguments():
        inputs = random_inputs(generator, SHAPE, torch.float64, device)
        return inputs + random_grad_outputs(inputs, generator)

    graph = make_fx(_gradients(lltm_ffi.lltm))(*arguments())
    assert "lltm_ffi.backward_pass" in graph.code, graph.code
    replayed_on = arguments()
    assert_all_close(graph(*replayed_on), _gradients(reference.lltm)(*replayed_on), TOLERANCE)


def _make_fx_round(device, generator):
    graph = make_fx(lltm_ffi.round_ste)(torch.rand(5, 3, generator=generator).to(device))
    values = torch.rand(5, 3, generator=generator).to(device)
    assert torch.equal(graph(values), (values >= 0.5).to(values.dtype))


def _jit_trace_module(device, generator):
    module = lltm_ffi.LLTM(5, 7, device=device, dtype=torch.float64)
    input, _, _, h, c = random_inputs(generator, SHAPE, torch.float64, device)
    traced = torch.jit.trace(module, (input, (h, c)))
    assert "lltm_ffi::forward_pass" in str(traced.graph), str(traced.graph)
    input, _, _, h, c = random_inputs(generator, SHAPE, torch.float64, device)
    expected = reference.lltm(input, module.weights, module.bias, h, c)
    assert_all_close(traced(input, (h, c)), expected, TOLERANCE)


def _storage_less_refused_before_c(device, generator):
    """Called past the public functions, the C passes refuse what has no memory."""
    inputs = random_inputs(generator, SHAPE, torch.float64, device)
    # On a GPU the cell at this size runs in its step kernels.
    cell_pass = "forward_pass" if torch.device(device).type == "cpu" else "step_forward"
    with raises_with(TypeError, cell_pass, "TwoTensor", "without memory of its own"):
        lltm_cell.LLTMFunction.apply(*(TwoTensor(tensor, tensor) for tensor in inputs))
    with FakeTensorMode() as mode:
        gates = mode.from_tensor(torch.randn(3, 21, dtype=torch.float64))
        with raises_with(TypeError, "forward_pass", "FakeTensor", "without memory of its own"):
            lltm_cell.forward_pass.run(gates, torch.empty_like(gates[:, :7]))
    with raises_with(TypeError, "round_forward", "TwoTensor", "without memory of its own"):
        round_forward.run(TwoTensor(inputs[0], inputs[0]))


def _nested_and_sparse_refused(device, generator):
    def jagged():
        return torch.nested.nested_tensor([torch.rand(3), torch.rand(2)], layout=torch.jagged,
                                          device=device)

    def nested_strided():
        return torch.nested.nested_tensor([torch.rand(3), torch.rand(2)], device=device)

    refused = {"jagged": jagged, "strided": nested_strided,
               "sparse_coo": lambda: torch.rand(3, 3, device=device).to_sparse(),
               "sparse_csr": lambda: torch.rand(3, 3, device=device).to_sparse_csr()}
    if device.type == "cpu":
        refused["_mkldnn"] = lambda: torch.rand(3, 3).to_mkldnn()
    for layout, build in refused.items():
        with raises_with(TypeError, "round_ste: input", f"torch.{layout}"):
            lltm_ffi.round_ste(build())
    inputs = random_inputs(generator, SHAPE, torch.float64, device)
    with raises_with(TypeError, "lltm: input", "nested", "torch.jagged"):
        lltm_ffi.lltm(torch.nested.nested_tensor(list(inputs[0]), layout=torch.jagged),
                      *inputs[1:])


CRASH_PRONE = {
    "two_tensor-cell": _two_tensor_cell, "two_tensor-sequence": _two_tensor_sequence,
    "two_tensor-round": _two_tensor_round, "fake-cell": _fake_cell,
    "fake-sequence": _fake_sequence, "fake-round": _fake_round,
    "make_fx_real-cell": _make_fx_cell("real"), "make_fx_fake-cell": _make_fx_cell("fake"),
    "make_fx_symbolic-cell": _make_fx_cell("symbolic"),
    "make_fx-cell_gradients": _make_fx_cell_gradients, "make_fx-round": _make_fx_round,
    "jit_trace-module": _jit_trace_module,
    "storage_less-refused_before_c": _storage_less_refused_before_c,
    "nested_and_sparse-refused": _nested_and_sparse_refused,
}
CASE_IDS = [f"{device.type}-{case}" for device in child_cases._devices() for case in CRASH_PRONE]


def _run_case(case_id, seed):
    device, case = case_id.split("-", 1)
    CRASH_PRONE[case](torch.device(device), torch.Generator().manual_seed(seed))
    return "as the reference"


@pytest.fixture(scope="module")
def crash_prone_run():
    return child_cases.run_child(Path(__file__).resolve(), CASE_IDS)


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_crash_prone_case(case_id, crash_prone_run):
    child_cases.check_case(case_id, crash_prone_run)


def test_crash_prone_child_exits_normally(crash_prone_run):
    child_cases.check_exit(crash_prone_run)


def test_plain_tensors_and_parameters_take_the_eager_path(monkeypatch, device, generator):
    """The modules' nn.Parameters count as plain: no detour through the operators."""
    def refuse(*arguments):
        raise AssertionError("a plain call went through the operators")

    monkeypatch.setattr(lltm_cell, "_traced_lltm", refuse)
    monkeypatch.setattr(sequence.packed_forward, "operator", refuse)
    cell = lltm_ffi.LLTM(5, 7, device=device, dtype=torch.float64)
    input, _, _, h, c = random_inputs(generator, SHAPE, torch.float64, device)
    expected = reference.lltm(input, cell.weights, cell.bias, h, c)
    assert_all_close(cell(input, (h, c)), expected, TOLERANCE)
    layer = lltm_ffi.LLTMSequence(5, 7, device=device, dtype=torch.float64)
    layer.load_state_dict(cell.state_dict())
    outputs, _ = layer(input.unsqueeze(0), (h.unsqueeze(0), c.unsqueeze(0)))
    assert_all_close([outputs[0]], [expected[0]], TOLERANCE)


class Tagged(torch.Tensor):
    """A __torch_function__ subclass that changes nothing but the type."""


def test_torch_function_subclass_comes_back_as_from_the_reference(device, generator):
    inputs = random_inputs(generator, SHAPE, torch.float64, device)
    tagged = [inputs[0], inputs[1].as_subclass(Tagged), *inputs[2:]]
    got, expected = lltm_ffi.lltm(*tagged), reference.lltm(*tagged)
    assert [type(value) for value in got] == [type(value) for value in expected] == [Tagged] * 2
    assert_all_close(got, expected, TOLERANCE)
    rounded = lltm_ffi.round_ste(inputs[0].as_subclass(Tagged))
    assert type(rounded) is type(inputs[0].as_subclass(Tagged) >= 0.5) is Tagged
    assert torch.equal(rounded.as_subclass(torch.Tensor), (inputs[0] >= 0.5).to(inputs[0].dtype))


class RecordingMode(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_dispatch_mode_sees_the_operators(device, generator):
    inputs = random_inputs(generator, SHAPE, torch.float64, device)
    with RecordingMode() as mode:
        got = lltm_ffi.lltm(*inputs)
    assert "lltm_ffi.forward_pass.default" in mode.calls, mode.calls
    assert_all_close(got, reference.lltm(*inputs), TOLERANCE)


@pytest.mark.parametrize("module_class", [lltm_ffi.LLTM, lltm_ffi.LLTMSequence])
def test_torchscript_is_refused_pointing_to_compile_and_export(module_class):
    with raises_with(RuntimeError, module_class.__name__, "TorchScript", "torch.compile",
                     "torch.export"):
        torch.jit.script(module_class(5, 7))


class CellModel(torch.nn.Module):
    """Two steps of the cell and a readout: a model to export."""

    def __init__(self):
        super().__init__()
        self.cell = lltm_ffi.LLTM(5, 7, dtype=torch.float64)
        self.readout = torch.nn.Linear(7, 2, dtype=torch.float64)

    def forward(self, input, h, c):
        h, c = self.cell(input, (h, c))
        h, c = self.cell(input, (h, c))
        return self.readout(h)

    def reference(self, input, h, c):
        for _ in range(2):
            h, c = reference.lltm(input, self.cell.weights, self.cell.bias, h, c)
        return self.readout(h)


def test_export_save_and_load(generator):
    model = CellModel()
    input, _, _, h, c = random_inputs(generator, SHAPE, torch.float64)
    exported = torch.export.export(model, (input, h, c))
    assert "lltm_ffi.forward_pass" in exported.graph_module.code
    buffer = io.BytesIO()
    torch.export.save(exported, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer).module()
    input, _, _, h, c = random_inputs(generator, SHAPE, torch.float64)
    with torch.no_grad():
        expected = model.reference(input, h, c)
    assert_all_close([loaded(input, h, c), exported.module()(input, h, c)], [expected] * 2,
                     TOLERANCE)


if __name__ == "__main__":
    sys.exit(child_cases.child_main(sys.argv[1:], _run_case))
