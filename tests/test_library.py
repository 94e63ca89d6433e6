"""lltm_ffi as a first-class PyTorch op: the torch.library operators
(opcheck, agreement with the eager path, their own argument check) and
torch.compile(fullgraph=True) of a model that calls the cell. Streams, CUDA
graphs and several GPUs are in test_streams_graphs_devices.py, autocast in
test_autocast.py."""

import pytest
import torch
from torch.library import opcheck

import lltm_ffi
from conftest import assert_all_close
from lltm_ffi import selfcheck


def random_pass_inputs(batch_size, state_size, dtype, device, generator):
    def normal(*shape):
        return torch.randn(*shape, generator=generator, dtype=dtype).to(device)
    return {"gates": normal(batch_size, 3 * state_size), "old_cell": normal(batch_size, state_size),
            "grad_h": normal(batch_size, state_size), "grad_cell": normal(batch_size, state_size),
            "new_cell": normal(batch_size, state_size)}


@pytest.mark.parametrize("batch_size,state_size", [(1, 1), (3, 7), (5, 257)])
def test_opcheck_forward_pass(device, dtype, generator, batch_size, state_size):
    tensors = random_pass_inputs(batch_size, state_size, dtype, device, generator)
    gates = tensors["gates"].requires_grad_(True)
    old_cell = tensors["old_cell"].requires_grad_(True)
    opcheck(torch.ops.lltm_ffi.forward_pass.default, (gates, old_cell))


@pytest.mark.parametrize("batch_size,state_size", [(1, 1), (3, 7), (5, 257)])
def test_opcheck_backward_pass(device, dtype, generator, batch_size, state_size):
    tensors = random_pass_inputs(batch_size, state_size, dtype, device, generator)
    opcheck(torch.ops.lltm_ffi.backward_pass.default,
            (tensors["grad_h"], tensors["grad_cell"], tensors["new_cell"], tensors["gates"]))


def test_operators_agree_with_the_eager_path(device, dtype, generator):
    """torch's gate product and the forward_pass operator (what torch.compile
    runs) against the eager call: bit for bit on the CPU, where the eager call
    runs the same two; on a GPU the eager call's gate product is lltm_ffi's
    own kernel (a sequence of length 1), which sums in another order."""
    inputs = selfcheck.random_inputs(4, 6, 9, dtype, device, generator)
    X = torch.cat((inputs[3], inputs[0]), dim=1)
    gates = torch.addmm(inputs[2], X, inputs[1].t())
    through_operator = torch.ops.lltm_ffi.forward_pass(gates, inputs[4])
    through_function = lltm_ffi.lltm(*inputs)
    exact = {"rtol": 0, "atol": 0} if torch.device(device).type == "cpu" else {}
    for got, expected in zip(through_operator, through_function):
        torch.testing.assert_close(got, expected, **exact)


def test_operator_rejects_mismatched_shapes(device, generator):
    tensors = random_pass_inputs(3, 5, torch.float32, device, generator)
    with pytest.raises(ValueError, match=r"gates has shape \(3, 14\), expected \(3, 15\)"):
        torch.ops.lltm_ffi.forward_pass(tensors["gates"][:, :14], tensors["old_cell"])


class Sequence(torch.nn.Module):
    """A few LLTM steps and a linear readout: what people compile."""

    def __init__(self, input_features=6, state_size=10):
        super().__init__()
        self.cell = lltm_ffi.LLTM(input_features, state_size)
        self.readout = torch.nn.Linear(state_size, 1)

    def forward(self, sequence):
        h = sequence.new_zeros(sequence.shape[1], self.cell.state_size)
        cell = torch.zeros_like(h)
        for step in range(sequence.shape[0]):
            h, cell = self.cell(sequence[step], (h, cell))
        return self.readout(h).squeeze(1), cell


def run_and_collect(model, sequence):
    """Outputs and every parameter's gradient for a random-weighted loss."""
    model.zero_grad(set_to_none=True)
    prediction, cell = model(sequence)
    generator = torch.Generator().manual_seed(7)
    weights = torch.randn(cell.shape, generator=generator, dtype=cell.dtype).to(cell.device)
    (prediction.sum() + (cell * weights).sum()).backward()
    return [prediction.detach().clone(), cell.detach().clone()] + [
        parameter.grad.clone() for parameter in model.parameters()]


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
@pytest.mark.slow
def test_compile_fullgraph_matches_eager(device, generator, mode):
    if mode == "reduce-overhead" and device.type != "cuda":
        pytest.skip("reduce-overhead (CUDA graphs) is a CUDA mode")
    torch._dynamo.reset()
    model = Sequence().to(device)
    sequence = torch.randn(4, 3, 6, generator=generator).to(device)
    eager = run_and_collect(model, sequence)
    compiled = torch.compile(model, fullgraph=True, mode=mode)
    # reduce-overhead records its graph on the first runs and replays after;
    # check a replay with fresh inputs too.
    for _ in range(3):
        got = run_and_collect(compiled, sequence)
        assert_all_close(got, eager, 1e-5)
    fresh = torch.randn(4, 3, 6, generator=generator).to(device)
    assert_all_close(run_and_collect(compiled, fresh), run_and_collect(model, fresh), 1e-5)


def test_compiled_graph_calls_the_operator(generator):
    torch._dynamo.reset()
    inputs = selfcheck.random_inputs(3, 4, 5, torch.float32, "cpu", generator)
    explanation = torch._dynamo.explain(lltm_ffi.lltm)(*inputs)
    assert explanation.graph_break_count == 0
    graph_code = "\n".join(graph.code for graph in explanation.graphs)
    assert "lltm_ffi.forward_pass" in graph_code


def test_a_pass_name_declared_twice_is_refused():
    """A second declaration would replace the first's operator."""
    with pytest.raises(ValueError, match=r"^lltm_ffi::round_forward is declared twice, by "
                       r"lltm_ffi\.ops\.round_ste\.round_ste\.round_forward and "):
        @lltm_ffi.op.c_pass("round_forward")
        def round_forward(c, input: lltm_ffi.op.Tensor()) -> torch.Tensor:
            return input
    assert lltm_ffi.op.PASSES["round_forward"].body.__module__ == "lltm_ffi.ops.round_ste.round_ste"

