"""Derivatives of every order and kind through lltm_ffi.lltm and its
operators, against the same derivatives of the reference cell: second order
(gradient penalties, Hessian-vector products, gradgradcheck), third order,
forward mode, and torch.func's transforms (grad, vjp, jacrev, jvp, jacfwd,
vmap over the batch and over a stack of weights, functional_call), also
under torch.compile; and lltm_sequence's second order and its clear refusal
of forward mode and torch.func. First-order gradients are in
test_agreement.py and test_gradcheck.py."""

import pytest
import torch
import torch.autograd.forward_ad as forward_ad
import torch.func
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

import lltm_ffi
from builders import random_inputs, random_like, sequence_arguments, transposed
from conftest import ARGUMENT_NAMES, as_leaves, assert_all_close, reference_sequence, shape_id
from lltm_ffi import reference, selfcheck
from lltm_ffi.ops.lltm import derivatives

CELLS = {"reference": reference.lltm, "lltm_ffi": lltm_ffi.lltm}
SHAPES = [(1, 2, 3), (3, 5, 7), (4, 6, 5)]
SEQUENCE_SHAPE = (4, 3, 5, 7)


def _both(function):
    """function(cell) for lltm_ffi's cell and the reference's: (got, expected)."""
    return function(lltm_ffi.lltm), function(reference.lltm)


def _tolerance(dtype):
    return selfcheck.TOLERANCES[dtype]


def _issue_inputs(dtype, device):
    """The issue's reproducer's arguments: B, F, S = 4, 6, 5, seed 1."""
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(*shape, generator=generator, dtype=dtype).to(device)
            for shape in [(4, 6), (15, 11), (15,), (4, 5), (4, 5)]]


def test_gradient_penalty_reproducer(device, dtype):
    """The issue's reproducer: the penalty's gradient reaches the weights."""
    def penalised_weight_grad(cell):
        arguments = as_leaves(_issue_inputs(dtype, device))
        new_h, new_cell = cell(*arguments)
        grad_input, = torch.autograd.grad(new_h.sum() + new_cell.sum(), arguments[0],
                                          create_graph=True)
        assert grad_input.requires_grad, "the first-order gradient came back detached"
        penalty = ((grad_input.norm(2, dim=1) - 1) ** 2).mean()
        (cell(*arguments)[0].sum() + 10 * penalty).backward()
        return [argument.grad for argument in arguments]

    got, expected = _both(penalised_weight_grad)
    assert_all_close(got, expected, _tolerance(dtype))


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_gradient_penalty_every_argument(shape, device, dtype, generator):
    """Penalty on the gradients of all five arguments, non-linear losses."""
    inputs = random_inputs(generator, shape, dtype, device)
    weights_h, weights_c = (random_like(inputs[3], generator) for _ in range(2))

    def penalised_grads(cell):
        arguments = as_leaves(inputs)
        new_h, new_cell = cell(*arguments)
        loss = (weights_h * new_h.sin()).sum() + (weights_c * new_cell).pow(2).sum()
        grads = torch.autograd.grad(loss, arguments, create_graph=True)
        penalty = sum((grad ** 2).sum() for grad in grads)
        return torch.autograd.grad(penalty, arguments)

    got, expected = _both(penalised_grads)
    assert_all_close(got, expected, _tolerance(dtype))


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_hessian_vector_product(shape, device, dtype, generator):
    inputs = random_inputs(generator, shape, dtype, device)
    vectors = [random_like(tensor, generator) for tensor in inputs]

    def hvp(cell):
        def loss(*arguments):
            new_h, new_cell = cell(*arguments)
            return new_h.tanh().sum() + (new_cell * new_h).sum()
        return torch.autograd.functional.hvp(loss, tuple(inputs), tuple(vectors))[1]

    got, expected = _both(hvp)
    assert_all_close(got, expected, _tolerance(dtype))


def test_third_derivative(device, generator):
    inputs = random_inputs(generator, (3, 4, 5), torch.float64, device)

    def third(cell):
        arguments = as_leaves(inputs)
        new_h, new_cell = cell(*arguments)
        first, = torch.autograd.grad((new_h * new_cell).sum(), arguments[1], create_graph=True)
        second, = torch.autograd.grad(first.pow(2).sum(), arguments[3], create_graph=True)
        return torch.autograd.grad(second.sin().sum(), arguments)

    got, expected = _both(third)
    assert_all_close(got, expected, _tolerance(torch.float64))


@pytest.mark.parametrize("bias_2d", [False, True], ids=["bias_3S", "bias_1x3S"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_gradgradcheck(shape, bias_2d, device, generator):
    inputs = random_inputs(generator, shape, torch.float64, device)
    if bias_2d:
        inputs[2] = inputs[2].unsqueeze(0)
    assert torch.autograd.gradgradcheck(lltm_ffi.lltm, as_leaves(inputs), eps=1e-6, atol=1e-7,
                                        rtol=1e-5)


def test_gradgradcheck_of_non_contiguous_arguments(device, generator):
    """Every argument in another layout: the second derivatives reach the
    caller's tensors (through any copy the products make)."""
    inputs = random_inputs(generator, (3, 5, 7), torch.float64, device)
    views = [transposed(tensor) for tensor in inputs]
    assert not any(view.is_contiguous() for view in views)
    assert torch.autograd.gradgradcheck(lltm_ffi.lltm, as_leaves(views), eps=1e-6, atol=1e-7,
                                        rtol=1e-5)


@pytest.mark.parametrize("used", ["new_h", "new_cell"])
def test_one_output_used(used, device, dtype, generator):
    """A gradient for one output only (the other's is None in the backward)."""
    inputs = random_inputs(generator, (3, 5, 7), dtype, device)

    def grads(cell):
        arguments = as_leaves(inputs)
        output = cell(*arguments)[0 if used == "new_h" else 1]
        return torch.autograd.grad(output.exp().sum(), arguments)

    got, expected = _both(grads)
    assert_all_close(got, expected, _tolerance(dtype))


def _pass_inputs(generator, device, batch_size=3, state_size=5):
    def normal(columns):
        return torch.randn(batch_size, columns, generator=generator,
                           dtype=torch.float64).to(device).requires_grad_(True)
    return {"grad_h": normal(state_size), "grad_cell": normal(state_size),
            "new_cell": normal(state_size), "gates": normal(3 * state_size),
            "old_cell": normal(state_size)}


def test_gradgradcheck_forward_pass_operator(device, generator):
    tensors = _pass_inputs(generator, device)
    assert torch.autograd.gradgradcheck(torch.ops.lltm_ffi.forward_pass,
                                        (tensors["gates"], tensors["old_cell"]))


def test_backward_pass_operator_is_differentiable(device, generator):
    tensors = _pass_inputs(generator, device)
    arguments = tuple(tensors[name] for name in ("grad_h", "grad_cell", "new_cell", "gates"))
    assert torch.autograd.gradcheck(torch.ops.lltm_ffi.backward_pass, arguments)
    assert torch.autograd.gradgradcheck(torch.ops.lltm_ffi.backward_pass, arguments)


class _CellInTorchOps(torch.autograd.Function):
    """The pointwise pass with the torch-op derivatives: backward_pass as
    its backward, forward_tangents as its forward mode."""

    @staticmethod
    def forward(gates, old_cell):
        return derivatives.forward_pass(gates, old_cell)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], output[1])
        ctx.save_for_forward(inputs[0], output[1])

    @staticmethod
    def backward(ctx, grad_h, grad_cell):
        gates, new_cell = ctx.saved_tensors
        d_old_cell, d_gates = derivatives.backward_pass(grad_h, grad_cell, new_cell, gates)
        return d_gates, d_old_cell

    @staticmethod
    def jvp(ctx, gates_tangent, old_cell_tangent):
        gates, new_cell = ctx.saved_tensors
        return derivatives.forward_tangents(gates, new_cell, gates_tangent, old_cell_tangent)


def test_torch_op_derivatives_against_finite_differences(generator):
    """The cell's partial derivatives in torch ops, which the higher orders
    and forward mode are built from: both products (backward_pass and
    forward_tangents) against finite differences of the forward formula,
    and backward_pass's own derivatives, in float64."""
    tensors = _pass_inputs(generator, "cpu")
    arguments = (tensors["gates"], tensors["old_cell"])
    assert torch.autograd.gradcheck(_CellInTorchOps.apply, arguments, check_forward_ad=True)
    assert torch.autograd.gradgradcheck(_CellInTorchOps.apply, arguments)


def test_torch_op_elu_derivative_at_zero_is_one(generator):
    """At a candidate pre-activation of 0, d new_cell / d candidate_pre is
    the input gate (elu'(0) taken as 1, as the C passes take it)."""
    tensors = {name: tensor.detach() for name, tensor in _pass_inputs(generator, "cpu").items()}
    gates, state_size = tensors["gates"], tensors["old_cell"].shape[1]
    gates[:, 2 * state_size:] = 0
    input_gate = torch.sigmoid(gates[:, :state_size])
    _, new_cell = derivatives.forward_pass(gates, tensors["old_cell"])
    d_old_cell, d_gates = derivatives.backward_pass(None, tensors["grad_cell"], new_cell, gates)
    assert torch.equal(d_gates[:, 2 * state_size:], tensors["grad_cell"] * input_gate)
    _, new_cell_tangent = derivatives.forward_tangents(
        gates, new_cell, torch.cat((torch.zeros_like(gates[:, state_size:]),
                                    tensors["grad_cell"]), dim=1), None)
    assert torch.equal(new_cell_tangent, input_gate * tensors["grad_cell"])


def _compiled_graphs(function, arguments):
    """The forward and backward graph code AOTAutograd hands its compilers."""
    graphs = {}

    def capture(name):
        def compiler(graph_module, example_inputs):
            graphs[name] = graph_module.code
            return make_boxed_func(graph_module.forward)
        return compiler

    backend = aot_autograd(fw_compiler=capture("forward"), bw_compiler=capture("backward"))
    new_h, new_cell = torch.compile(function, backend=backend, fullgraph=True)(*arguments)
    (new_h.sum() + new_cell.sum()).backward()
    return graphs


def test_vectorized_jacobian(device, generator):
    """jacobian(vectorize=True): a backward on batched gradients
    (autograd.grad(is_grads_batched=True)), for the cell and the sequence."""
    inputs = tuple(random_inputs(generator, (2, 3, 4), torch.float64, device))
    arguments = tuple(sequence_arguments(generator, (3, 2, 3, 4), device=device))

    def jacobians(cell, sequence):
        return [*torch.autograd.functional.jacobian(cell, inputs, vectorize=True)[0],
                *torch.autograd.functional.jacobian(lambda *leaves: sequence(*leaves)[0],
                                                    arguments, vectorize=True)]

    got = jacobians(lltm_ffi.lltm, lltm_ffi.lltm_sequence)
    expected = jacobians(reference.lltm, reference_sequence)
    assert_all_close(got, expected, _tolerance(torch.float64))


def test_compiled_first_order_backward_keeps_the_fused_pass(generator):
    arguments = as_leaves(random_inputs(generator, (3, 4, 5)))
    graphs = _compiled_graphs(lltm_ffi.lltm, arguments)
    assert "lltm_ffi.forward_pass" in graphs["forward"]
    assert "lltm_ffi.backward_pass" in graphs["backward"]


@pytest.mark.parametrize("cell", CELLS.values(), ids=CELLS.keys())
@pytest.mark.slow
def test_compiled_double_backward_is_refused_as_for_the_reference(cell, generator):
    """torch.compile (AOTAutograd) refuses any double backward, the reference's
    too: lltm_ffi must raise the same error, never return a detached gradient.
    (A graph of the cell compiled earlier in the process, by a test that made
    no second-order graph, refuses with another message: compile afresh.)"""
    torch.compiler.reset()
    arguments = as_leaves(random_inputs(generator, (3, 4, 5)))
    new_h, new_cell = torch.compile(cell, fullgraph=True)(*arguments)
    grad_input, = torch.autograd.grad(new_h.sum() + new_cell.sum(), arguments[0],
                                      create_graph=True)
    assert grad_input.requires_grad
    with pytest.raises(RuntimeError, match="does not currently support double backward"):
        grad_input.pow(2).sum().backward()


@pytest.mark.parametrize("transform", ["grad", "vmap", "jvp"])
@pytest.mark.slow
def test_compiled_func_transforms(transform, generator):
    """torch.compile of a torch.func transform of the cell (its pointwise pass
    then in torch ops: the operators' autograd does not support them)."""
    inputs = random_inputs(generator, (3, 5, 7))
    tangents = [random_like(tensor, generator) for tensor in inputs]
    stacked = _stacked(inputs, generator, VMAPPED["batch"])

    def compiled(cell):
        if transform == "grad":
            function = torch.func.grad(_loss(cell), argnums=ARGNUMS)
            arguments = inputs
        elif transform == "vmap":
            function = torch.func.vmap(cell, in_dims=(0, None, None, 0, 0))
            arguments = stacked
        else:
            def function(*arguments):
                return torch.func.jvp(cell, arguments, tuple(tangents))[1]
            arguments = inputs
        return torch.compile(function, fullgraph=True)(*arguments)

    got, expected = _both(compiled)
    assert_all_close(got, expected, _tolerance(torch.float64))


def test_forward_mode_dual_numbers(device, dtype, generator):
    inputs = random_inputs(generator, (3, 5, 7), dtype, device)
    tangents = [random_like(tensor, generator) for tensor in inputs]

    def tangents_out(cell):
        with forward_ad.dual_level():
            duals = [forward_ad.make_dual(tensor, tangent)
                     for tensor, tangent in zip(inputs, tangents)]
            return [forward_ad.unpack_dual(output).tangent for output in cell(*duals)]

    got, expected = _both(tangents_out)
    assert_all_close(got, expected, _tolerance(dtype))


def _loss(cell):
    def loss(*arguments):
        new_h, new_cell = cell(*arguments)
        return _scalar(new_h, new_cell)
    return loss


def _scalar(new_h, new_cell):
    return new_h.sin().sum() + (new_cell * new_h).sum()


ARGNUMS = tuple(range(len(ARGUMENT_NAMES)))


def test_func_grad_and_vjp(device, dtype, generator):
    inputs = random_inputs(generator, (3, 5, 7), dtype, device)
    grad_outputs = [random_like(inputs[3], generator) for _ in range(2)]

    def grads(cell):
        outputs, vjp = torch.func.vjp(cell, *inputs)
        return list(torch.func.grad(_loss(cell), argnums=ARGNUMS)(*inputs)) + list(
            vjp(tuple(grad_outputs))) + list(outputs)

    got, expected = _both(grads)
    assert_all_close(got, expected, _tolerance(dtype))


@pytest.mark.parametrize("jacobian", ["jacrev", "jacfwd"])
def test_func_jacobians(jacobian, device, dtype, generator):
    inputs = random_inputs(generator, (2, 3, 4), dtype, device)
    transform = getattr(torch.func, jacobian)
    got, expected = _both(lambda cell: transform(cell, argnums=ARGNUMS)(*inputs))
    for got_output, expected_output in zip(got, expected):
        assert_all_close(got_output, expected_output, _tolerance(dtype))


def test_func_jvp(device, dtype, generator):
    inputs = random_inputs(generator, (3, 5, 7), dtype, device)
    tangents = [random_like(tensor, generator) for tensor in inputs]
    got, expected = _both(lambda cell: torch.func.jvp(cell, tuple(inputs), tuple(tangents)))
    assert_all_close(got[0] + got[1], expected[0] + expected[1], _tolerance(dtype))


@pytest.mark.parametrize("composition", ["jacfwd(jacrev)", "jacrev(jacrev)", "jvp(grad)"])
def test_func_second_order(composition, device, generator):
    inputs = random_inputs(generator, (2, 3, 4), torch.float64, device)
    direction = random_like(inputs[1], generator)

    def second(cell):
        def loss_of_weights(weights):
            return _loss(cell)(inputs[0], weights, *inputs[2:])
        if composition == "jvp(grad)":
            return torch.func.jvp(torch.func.grad(loss_of_weights), (inputs[1],), (direction,))[1]
        outer = torch.func.jacfwd if composition.startswith("jacfwd") else torch.func.jacrev
        return outer(torch.func.jacrev(loss_of_weights))(inputs[1])

    got, expected = _both(second)
    assert_all_close([got], [expected], _tolerance(torch.float64))


def _stacked(inputs, generator, names, members=3):
    """`members` draws of the arguments called `names`, stacked first; the rest as given."""
    stacked = list(inputs)
    for name in names:
        index = ARGUMENT_NAMES.index(name)
        stacked[index] = torch.stack([inputs[index]] + [
            random_like(inputs[index], generator) for _ in range(members - 1)])
    return stacked


VMAPPED = {"batch": ("input", "old_h", "old_cell"), "ensemble": ("weights", "bias"),
           "input_only": ("input",), "everything": ARGUMENT_NAMES}


@pytest.mark.parametrize("mapped", VMAPPED.keys())
def test_func_vmap(mapped, device, dtype, generator):
    inputs = random_inputs(generator, (3, 5, 7), dtype, device)
    stacked = _stacked(inputs, generator, VMAPPED[mapped])
    in_dims = tuple(0 if name in VMAPPED[mapped] else None for name in ARGUMENT_NAMES)
    got, expected = _both(lambda cell: torch.func.vmap(cell, in_dims=in_dims)(*stacked))
    assert_all_close(got, expected, _tolerance(dtype))


def test_func_vmap_over_another_dimension(generator):
    """in_dims other than 0: the batch of the vmap last."""
    inputs = random_inputs(generator, (3, 5, 7), torch.float64)
    stacked = [tensor.movedim(0, -1) for tensor in _stacked(inputs, generator, ("input", "old_h"))]
    in_dims = (-1, None, None, -1, None)
    got, expected = _both(lambda cell: torch.func.vmap(cell, in_dims=in_dims, out_dims=1)(
        stacked[0], inputs[1], inputs[2], stacked[3], inputs[4]))
    assert_all_close(got, expected, _tolerance(torch.float64))


def test_func_ensemble_gradients(device, dtype, generator):
    """Model ensembling: vmap over stacked weights of grad of a loss."""
    inputs = random_inputs(generator, (3, 5, 7), dtype, device)
    stacked = _stacked(inputs, generator, ("weights", "bias"))

    def ensemble_grads(cell):
        def member_loss(weights, bias):
            return _loss(cell)(inputs[0], weights, bias, *inputs[3:])
        return torch.func.vmap(torch.func.grad(member_loss, argnums=(0, 1)))(*stacked[1:3])

    got, expected = _both(ensemble_grads)
    assert_all_close(got, expected, _tolerance(dtype))


def test_func_functional_call(device, dtype, generator):
    """grad over the parameters of an LLTM module through functional_call."""
    module = lltm_ffi.LLTM(5, 7, device=device, dtype=dtype)
    own_weights = module.weights.detach().clone()
    input, weights, bias, old_h, old_cell = random_inputs(generator, (3, 5, 7), dtype, device)

    def module_loss(parameters):
        return _scalar(*torch.func.functional_call(module, parameters, (input, (old_h, old_cell))))

    def reference_loss(parameters):
        return _scalar(*reference.lltm(input, parameters["weights"], parameters["bias"], old_h,
                                    old_cell))

    parameters = {"weights": weights, "bias": bias}
    got = torch.func.grad(module_loss)(parameters)
    expected = torch.func.grad(reference_loss)(parameters)
    assert_all_close([got["weights"], got["bias"]], [expected["weights"], expected["bias"]],
                     _tolerance(dtype))
    assert torch.equal(module.weights, own_weights)


def test_sequence_functional_call(device, generator):
    """functional_call on LLTMSequence, differentiated by torch.autograd."""
    layer = lltm_ffi.LLTMSequence(5, 7, device=device, dtype=torch.float64)
    inputs, weights, bias, h0, c0 = sequence_arguments(generator, SEQUENCE_SHAPE, device=device)
    parameters = {"weights_l0": weights.requires_grad_(True), "bias_l0": bias.requires_grad_(True)}
    outputs, (h_n, c_n) = torch.func.functional_call(
        layer, parameters, (inputs, (h0.unsqueeze(0), c0.unsqueeze(0))))
    got = torch.autograd.grad(_scalar(outputs, c_n), (weights, bias))
    expected_outputs, (_, expected_c) = reference_sequence(inputs, weights, bias, h0, c0)
    expected = torch.autograd.grad(_scalar(expected_outputs, expected_c), (weights, bias))
    assert_all_close(got, expected, _tolerance(torch.float64))


def test_sequence_gradient_penalty(device, generator):
    arguments = sequence_arguments(generator, SEQUENCE_SHAPE, device=device)

    def penalised_grads(sequence):
        leaves = as_leaves(arguments)
        outputs, (h_n, c_n) = sequence(*leaves)
        grads = torch.autograd.grad(outputs.sum() + c_n.sum(), leaves, create_graph=True)
        assert all(grad.requires_grad for grad in grads)
        penalty = sum((grad ** 2).sum() for grad in grads)
        return torch.autograd.grad(outputs.sin().sum() + penalty, leaves)

    got = penalised_grads(lltm_ffi.lltm_sequence)
    expected = penalised_grads(reference_sequence)
    assert_all_close(got, expected, _tolerance(torch.float64))


def test_sequence_gradgradcheck(device, generator):
    arguments = as_leaves(sequence_arguments(generator, (3, 2, 3, 4), device=device))
    assert torch.autograd.gradgradcheck(lambda *leaves: lltm_ffi.lltm_sequence(*leaves)[0],
                                        arguments)


def test_sequence_operator_gradgradcheck(device, generator):
    inputs, *arguments = sequence_arguments(generator, (3, 2, 3, 4), device=device)
    # A dense sequence's rows (steps * batch, features), batch_sizes None.
    arguments = as_leaves([inputs.reshape(6, 3), *arguments])
    assert torch.autograd.gradgradcheck(
        lambda *leaves: torch.ops.lltm_ffi.packed_forward(*leaves, None, False)[:2], arguments)


@pytest.mark.parametrize("transform", ["grad", "vmap", "jvp", "forward_ad"])
def test_sequence_refuses_transforms_naming_lltm_ffi(transform, generator):
    arguments = sequence_arguments(generator, SEQUENCE_SHAPE, device=torch.device("cpu"))

    def output_sum(*arguments):
        return lltm_ffi.lltm_sequence(*arguments)[0].sum()

    with pytest.raises(NotImplementedError, match="lltm_ffi.lltm_sequence .* not forward-mode"):
        if transform == "grad":
            torch.func.grad(output_sum)(*arguments)
        elif transform == "vmap":
            torch.func.vmap(output_sum)(*(tensor.unsqueeze(0) for tensor in arguments))
        elif transform == "jvp":
            torch.func.jvp(output_sum, tuple(arguments), tuple(arguments))
        else:
            with forward_ad.dual_level():
                output_sum(forward_ad.make_dual(arguments[0], arguments[0]), *arguments[1:])
