"""--accuracy (with --half or --autocast): how far lltm_sequence's and
nn.GRU's results in that precision are from the same model run in float64
from the same parameters and data. For each model, at each --sequence size:
the relative error (norm of the difference over the norm of the float64
result) of its outputs and of every gradient of a loss over the outputs
(lltm_sequence: inputs, weights, bias, h0, c0; nn.GRU: inputs, its weights
and biases, h0)."""

import contextlib
import copy

import torch

import lltm_ffi

from . import harness, precision as precisions, sequence

SEED = 0


def relative_error(value, expected):
    """||value - expected|| / ||expected||, in float64 on the CPU."""
    expected = expected.detach().double().cpu()
    return ((value.detach().double().cpu() - expected).norm() / expected.norm()).item()


def results(model, inputs, state, grad_outputs, forward):
    """{tensor: value}: the outputs of model(inputs, state), and the
    gradients of inputs, every parameter and the state of the sum of the
    outputs times grad_outputs (in float32, or float64 for a float64 run);
    and the dtype the outputs came in. forward: the context of the forward."""
    inputs = inputs.detach().clone().requires_grad_(True)
    state = [tensor.detach().clone().requires_grad_(True) for tensor in state]
    with forward:
        outputs, _ = model(inputs, state[0] if len(state) == 1 else tuple(state))
    loss_dtype = torch.float64 if outputs.dtype == torch.float64 else torch.float32
    (outputs.to(loss_dtype) * grad_outputs.to(loss_dtype)).sum().backward()
    values = {"outputs": outputs, "d_inputs": inputs.grad}
    values.update({f"d_{name}": parameter.grad for name, parameter in model.named_parameters()})
    values.update({f"d_{name}": tensor.grad for name, tensor in zip(("h0", "c0"), state)})
    return values, outputs.dtype


def errors(model, inputs, state, grad_outputs, precision, device):
    """(the dtype of the run's outputs, {tensor: relative error}) of `model`
    (float32) run in `precision` against a float64 copy of what that run
    starts from."""
    if precision.kind == "half":
        model = copy.deepcopy(model).to(precision.dtype)
        inputs, state = inputs.to(precision.dtype), [tensor.to(precision.dtype) for tensor in state]
    got, dtype = results(model, inputs, state, grad_outputs, precision.forward(device))
    expected, _ = results(copy.deepcopy(model).double(), inputs.double(),
                          [tensor.double() for tensor in state], grad_outputs,
                          contextlib.nullcontext())
    return dtype, {name: relative_error(value, expected[name]) for name, value in got.items()}


def run(args, device, dtype):
    precision = precisions.Precision.of(args, dtype)
    torch.manual_seed(SEED)
    rows = []
    for shape in sequence.shapes_of(device, precision):
        steps, batch, features, state_size = shape
        inputs = torch.randn(steps, batch, features, device=device)
        state = [torch.randn(1, batch, state_size, device=device) for _ in range(2)]
        grad_outputs = torch.randn(steps, batch, state_size, device=device)
        cudnn = " (cuDNN)" if device.type == "cuda" else ""
        lltm = lltm_ffi.LLTMSequence(features, state_size, device=device)
        gru = torch.nn.GRU(features, state_size, device=device)
        for name, model, model_state in (("lltm_sequence", lltm, state),
                                         (f"nn.GRU{cudnn}", gru, state[:1])):
            output_dtype, found = errors(model, inputs, model_state, grad_outputs, precision,
                                         device)
            rows += [["x".join(map(str, shape)), name, harness.dtype_name(output_dtype), tensor,
                      f"{error:.2e}"] for tensor, error in found.items()]
    print(harness.report(
        "Accuracy of lltm_sequence and nn.GRU against float64", device, precision.name,
        f"One layer, {precision.describe()}. Each model's float64 copy runs from the same "
        "parameters, initial state and data as the run it checks (their values in the "
        "run's dtype), and the loss is the sum of the outputs times the same random gradient. "
        "Relative error: the norm of the difference over the norm of the float64 result. "
        f"`output dtype`: the dtype of the model's outputs in the run (under autocast a model "
        "may run its products in the autocast dtype and return float32). Data and parameters from "
        f"torch.manual_seed({SEED}).",
        harness.markdown_table(["T x B x F x S", "model", "output dtype", "tensor",
                                "relative error"],
                               rows, text_columns=4)))
