"""Bad arguments are refused (docs/ERRORS.md, "What is refused"): in Python,
before any pointer reaches C, with an exception whose message names the argument
and what is wrong with it; every row for each of the five arguments of
lltm_ffi.lltm, and a module built without CUDA given CUDA tensors.

Refusals that belong to another area stay with it: round_ste's in
test_round.py (the checklist of docs/PORTING.md), the operators' own check
in test_library.py, an integer input under autocast in test_autocast.py, a
float64 LLTM given float32 input in test_module.py, half dtypes mixed or
where a pass does not take them in test_half.py."""

import pytest
import torch

import lltm_ffi
from lltm_ffi import op
from builders import random_inputs
from checkouts import assert_succeeded, run_python
from conftest import ARGUMENT_NAMES, raises_with, replaced, skip_without_two_gpus

SHAPE = (3, 5, 7)  # batch, input_features, state_size
B, F, S = SHAPE


@pytest.fixture
def inputs(generator):
    return random_inputs(generator, SHAPE, torch.float32)


def test_exception_classes():
    assert issubclass(lltm_ffi.LLTMError, RuntimeError)
    assert issubclass(lltm_ffi.LLTMBuildError, ImportError)


@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_non_tensor_argument_is_a_type_error(name, inputs):
    value = inputs[ARGUMENT_NAMES.index(name)].tolist()
    with raises_with(TypeError, f"{name} must be a torch.Tensor", "list"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_not_a_tensor(name, generator):
    inputs = random_inputs(generator, SHAPE, torch.float32, "cpu")
    with raises_with(TypeError, f"{name} must be a torch.Tensor", "NoneType"):
        lltm_ffi.lltm(*replaced(inputs, name, None))


# Dtypes lltm_run knows nothing of: no op takes them. (A half dtype a pass
# does not take on a device, float16 for roi_pool say, is test_half.py's.)
BAD_DTYPES = [torch.int32, torch.int64, torch.bool, torch.uint8, torch.float8_e4m3fn,
              torch.complex64]


@pytest.mark.parametrize("bad_dtype", BAD_DTYPES, ids=str)
@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_unsupported_dtype_is_a_type_error_naming_argument_and_dtype(name, bad_dtype, inputs):
    value = (inputs[ARGUMENT_NAMES.index(name)] * 10).to(bad_dtype)
    with raises_with(TypeError, f"{name} has dtype {bad_dtype}", "float32", "float64"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


@pytest.mark.parametrize("bad_dtype", BAD_DTYPES, ids=str)
@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_unsupported_dtype(name, bad_dtype, device, generator):
    inputs = random_inputs(generator, SHAPE, torch.float32, device)
    value = (inputs[ARGUMENT_NAMES.index(name)] * 10).to(bad_dtype)
    with raises_with(TypeError, f"lltm: {name} has dtype {bad_dtype}"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_mixed_dtypes_are_a_type_error_naming_both(name, inputs):
    value = inputs[ARGUMENT_NAMES.index(name)].double()
    with raises_with(TypeError, name, "torch.float32", "torch.float64", "same dtype"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_one_argument_of_the_other_float_dtype(name, device, generator):
    inputs = random_inputs(generator, SHAPE, torch.float32, device)
    value = inputs[ARGUMENT_NAMES.index(name)].double()
    # Naming input when input is the odd one out is enough: the message names both.
    with raises_with(TypeError, name, "torch.float64", "torch.float32"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


# Layouts other than strided (sparse, mkldnn): refused before any torch op
# inside the cell sees them.
def _to_layout(tensor, layout):
    if layout == "sparse_coo":
        return tensor.to_sparse()
    if layout == "sparse_csr":
        return tensor.to_sparse_csr() if tensor.dim() == 2 else tensor.to_sparse()
    return tensor.to_mkldnn()


@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr", "mkldnn"])
@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_non_strided_layout(name, layout, generator):
    inputs = random_inputs(generator, SHAPE, torch.float32, "cpu")
    value = _to_layout(inputs[ARGUMENT_NAMES.index(name)], layout)
    with raises_with(TypeError, f"lltm: {name} has layout {value.layout}"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


@pytest.mark.parametrize("name", ARGUMENT_NAMES[1:])
def test_argument_on_meta_device_is_a_value_error_naming_both_devices(name, inputs):
    value = inputs[ARGUMENT_NAMES.index(name)].to("meta")
    with raises_with(ValueError, f"{name} is on meta but input is on cpu"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_one_argument_on_the_meta_device(name, generator):
    inputs = random_inputs(generator, SHAPE, torch.float32, "cpu")
    value = inputs[ARGUMENT_NAMES.index(name)].to("meta")
    with raises_with(ValueError, name, "meta", "same device"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


def test_all_arguments_on_meta_device_is_a_value_error(inputs):
    with raises_with(ValueError, "meta", "lltm_ffi runs on cpu and cuda"):
        lltm_ffi.lltm(*[tensor.to("meta") for tensor in inputs])


def test_every_argument_on_the_meta_device(generator):
    inputs = [tensor.to("meta") for tensor in random_inputs(generator, SHAPE, torch.float32, "cpu")]
    with raises_with(ValueError, "meta", "lltm_ffi runs on cpu and cuda"):
        lltm_ffi.lltm(*inputs)


@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_mixed_cpu_and_cuda_is_a_value_error_naming_both_devices(name, inputs, cuda_device):
    moved = inputs[ARGUMENT_NAMES.index(name)].to(cuda_device)
    with raises_with(ValueError, name, "cuda:0", "cpu", "same device"):
        lltm_ffi.lltm(*replaced(inputs, name, moved))


@pytest.mark.parametrize("name", ARGUMENT_NAMES)
@pytest.mark.parametrize("odd_one", ["cuda", "cpu"], ids=["one_on_cuda", "one_on_cpu"])
def test_one_argument_on_another_device(name, odd_one, cuda_device, generator):
    others = "cpu" if odd_one == "cuda" else cuda_device
    inputs = random_inputs(generator, SHAPE, torch.float32, others)
    value = inputs[ARGUMENT_NAMES.index(name)].to(odd_one)
    with raises_with(ValueError, name, "same device"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_one_argument_on_a_second_gpu(name, generator):
    skip_without_two_gpus()
    inputs = random_inputs(generator, SHAPE, torch.float32, "cuda:0")
    value = inputs[ARGUMENT_NAMES.index(name)].to("cuda:1")
    with raises_with(ValueError, name, "cuda:1", "cuda:0", "same device"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


# (argument, shape): the argument reshaped to a rank it must not have.
RESHAPED_WRONG_RANKS = [
    ("input", (B * F,)),
    ("input", (1, B, F)),
    ("weights", (3 * S * (S + F),)),
    ("bias", ()),
    ("bias", (1, 1, 3 * S)),
    ("old_h", (B * S,)),
    ("old_cell", (B, S, 1)),
]


@pytest.mark.parametrize("name, shape", RESHAPED_WRONG_RANKS,
                         ids=[f"{name}-{len(shape)}d" for name, shape in RESHAPED_WRONG_RANKS])
def test_wrong_rank_is_a_value_error_naming_argument_and_shape(name, shape, inputs):
    value = inputs[ARGUMENT_NAMES.index(name)].reshape(shape) if shape else inputs[2][0]
    with raises_with(ValueError, f"{name} must have", f"got shape {tuple(value.shape)}"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


# (argument, shape of the replacement) for every rank an argument must not have.
WRONG_RANKS = [(name, shape) for name, shapes in {
    "input": [(), (B * F,), (1, B, F)],
    "weights": [(), (3 * S * (S + F),), (1, 3 * S, S + F)],
    "bias": [(), (1, 1, 3 * S)],  # 1-d and (1, 3S) are both valid
    "old_h": [(), (B * S,), (1, B, S)],
    "old_cell": [(), (B * S,), (B, S, 1)],
}.items() for shape in shapes]


@pytest.mark.parametrize("name, shape", WRONG_RANKS,
                         ids=[f"{name}-{len(shape)}d" for name, shape in WRONG_RANKS])
def test_wrong_rank(name, shape, device, generator):
    inputs = random_inputs(generator, SHAPE, torch.float32, device)
    value = torch.randn(shape, generator=generator).to(device)
    with raises_with(ValueError, f"{name} must have", f"got shape {shape}"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


# (argument, wrong shape): sizes that disagree with the other arguments.
WRONG_SIZES = [
    ("input", (B, F + 1)),             # more features than weights has columns for
    ("input", (B + 1, F)),             # batch differs from old_h's
    ("input", (0, F)),
    ("weights", (3 * S + 1, S + F)),
    ("weights", (3 * S, S + F - 1)),
    ("weights", (S + F, 3 * S)),       # transposed
    ("bias", (3 * S - 1,)),
    ("bias", (S,)),
    ("bias", (B, 3 * S)),              # one row per batch element: not supported
    ("bias", (3 * S, 1)),
    ("old_h", (B + 1, S)),             # batch differs from input's
    ("old_h", (B, S + 1)),             # state differs from old_cell's and weights'
    ("old_cell", (B + 1, S)),
    ("old_cell", (B, S + 1)),
    ("old_cell", (B, 0)),
]


@pytest.mark.parametrize("name, shape", WRONG_SIZES,
                         ids=[f"{name}-{'x'.join(map(str, shape))}" for name, shape in WRONG_SIZES])
def test_wrong_size(name, shape, device, generator):
    inputs = random_inputs(generator, SHAPE, torch.float32, device)
    value = torch.randn(shape, generator=generator).to(device)
    with raises_with(ValueError, name, f"shape {shape}"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


def _random(generator, *shape):
    return torch.randn(*shape, generator=generator)


def test_old_h_batch_differing_from_input_is_a_value_error(inputs, generator):
    old_h = _random(generator, B + 1, S)
    with raises_with(ValueError, f"old_h has shape {(B + 1, S)}", f"input has shape {(B, F)}"):
        lltm_ffi.lltm(*replaced(inputs, "old_h", old_h))


@pytest.mark.parametrize("shape", [(B + 1, S), (B, S + 1)], ids=["batch", "state"])
def test_old_cell_differing_from_old_h_is_a_value_error(shape, inputs, generator):
    old_cell = _random(generator, *shape)
    with raises_with(ValueError, f"old_cell has shape {shape}", f"old_h has shape {(B, S)}"):
        lltm_ffi.lltm(*replaced(inputs, "old_cell", old_cell))


@pytest.mark.parametrize("shape", [(3 * S + 1, S + F), (3 * S, S + F - 1), (S + F, 3 * S)],
                         ids=["rows", "columns", "transposed"])
def test_weights_of_wrong_shape_is_a_value_error(shape, inputs, generator):
    weights = _random(generator, *shape)
    with raises_with(ValueError, f"weights has shape {shape}", f"{(3 * S, S + F)}",
                 f"input of shape {(B, F)}", f"old_h of shape {(B, S)}"):
        lltm_ffi.lltm(*replaced(inputs, "weights", weights))


@pytest.mark.parametrize("shape", [(3 * S - 1,), (2, 3 * S), (3 * S, 1), (S,)],
                         ids=["short", "two_rows", "column", "state_size"])
def test_bias_of_wrong_shape_is_a_value_error(shape, inputs, generator):
    bias = _random(generator, *shape)
    with raises_with(ValueError, f"bias has shape {shape}", f"({3 * S},)", f"(1, {3 * S})"):
        lltm_ffi.lltm(*replaced(inputs, "bias", bias))


def test_state_size_differing_between_old_h_and_weights_is_a_value_error(inputs, generator):
    old_h, old_cell = _random(generator, B, S + 1), _random(generator, B, S + 1)
    with raises_with(ValueError, "weights has shape"):
        lltm_ffi.lltm(*inputs[:3], old_h, old_cell)


def test_old_h_and_old_cell_of_one_other_state_size(device, generator):
    """Consistent with each other but not with weights: named via weights and old_h."""
    inputs = random_inputs(generator, SHAPE, torch.float32, device)
    inputs[3] = torch.randn(B, S + 1, generator=generator).to(device)
    inputs[4] = torch.randn(B, S + 1, generator=generator).to(device)
    with raises_with(ValueError, "weights has shape", f"old_h of shape {(B, S + 1)}"):
        lltm_ffi.lltm(*inputs)


def test_module_call_with_wrong_state_shape_is_a_value_error(generator):
    rnn = lltm_ffi.LLTM(F, S)
    old_h, old_cell = _random(generator, B, S), _random(generator, B, S + 2)
    with raises_with(ValueError, "old_cell has shape"):
        rnn(_random(generator, B, F), (old_h, old_cell))


@pytest.mark.slow
def test_cpu_only_build_refuses_cuda_through_the_c_shim(cpu_only_build):
    """Every pass the module registers, and every pass an op declares (none
    missing), answers a CUDA device with LLTM_ERROR_NO_CUDA."""
    result = run_python(cpu_only_build, f"""
        from pathlib import Path
        import lltm_ffi
        from lltm_ffi import _extension, op
        package = Path(lltm_ffi.__file__).resolve().parent
        assert package == Path({str(cpu_only_build)!r}).resolve() / "lltm_ffi", package
        assert lltm_ffi.CUDA_COMPILED is False
        lib = _extension.lib
        assert lib.lltm_cuda_compiled() == 0
        on_cpu = {{name for name, declared in op.PASSES.items() if "cpu" in declared.devices}}
        assert set(_extension.PASSES) == on_cpu, (on_cpu, _extension.PASSES)
        for name, (pass_id, devices, _) in _extension.PASSES.items():
            assert devices == ("cpu",), (name, devices)
            for dtype in (lib.LLTM_FLOAT32, lib.LLTM_FLOAT64):
                code = lib.lltm_run(pass_id, dtype, 0, 0, [2] * 16, [0.5] * 4, [0] * 32)
                assert code == lib.LLTM_ERROR_NO_CUDA, (name, code)
        message = _extension.error_message(lib.LLTM_ERROR_NO_CUDA)
        assert "without CUDA" in message and "make" in message, message
        print("ok", len(_extension.PASSES))
    """)
    assert_succeeded(result)
    on_cpu = [name for name, declared in lltm_ffi.op.PASSES.items() if "cpu" in declared.devices]
    assert result.stdout.strip() == f"ok {len(on_cpu)}"


# cuda_device first: without a GPU the test skips before the build.
@pytest.mark.slow
def test_cpu_only_build_given_cuda_tensors_raises_lltm_error(cuda_device, cpu_only_build):
    result = run_python(cpu_only_build, """
        import torch
        import lltm_ffi
        from lltm_ffi import selfcheck
        inputs = selfcheck.random_inputs(2, 3, 4, torch.float32, "cuda")
        try:
            lltm_ffi.lltm(*inputs)
        except lltm_ffi.LLTMError as error:
            assert error.code == lltm_ffi._extension.lib.LLTM_ERROR_NO_CUDA, error.code
            assert "make clean && make" in str(error), error
        else:
            raise SystemExit("lltm_ffi.lltm on CUDA tensors did not raise")
        print("ok")
    """)
    assert_succeeded(result)
    assert result.stdout.strip() == "ok"


# The sequence, the layers and the operators: every refusal names the argument
# and the function or operator it came through ------------------------------------

T = 4  # steps


def _sequence_arguments(generator):
    inputs = torch.randn(T, B, F, generator=generator)
    return [inputs, _random(generator, 3 * S, S + F), _random(generator, 3 * S),
            _random(generator, B, S), _random(generator, B, S)]


# (argument replaced, its shape, what the message names): shapes that do not
# fit the others, for a sequence with and without a bias.
SEQUENCE_MISFITS = [
    ("weights", (3 * S + 1, S + F), ("weights has shape (22, 12)", f"{(3 * S, S + F)}")),
    ("weights", (3 * S, S + F + 1), ("weights has shape (21, 13)",)),
    ("c0", (B, S + 1), (f"c0 has shape {(B, S + 1)}", f"h0 has shape {(B, S)}")),
    ("h0", (B, S + 1), (f"c0 has shape {(B, S)}", f"h0 has shape {(B, S + 1)}")),
]
SEQUENCE_NAMES = ("inputs", "weights", "bias", "h0", "c0")


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("name, shape, fragments", SEQUENCE_MISFITS,
                         ids=[f"{name}-{'x'.join(map(str, shape))}"
                              for name, shape, _ in SEQUENCE_MISFITS])
def test_sequence_refuses_shapes_that_do_not_fit_naming_the_argument(name, shape, fragments,
                                                                     bias, reverse, generator):
    """With bias None too (no bias), and in either direction: the diagnosis
    leaves the missing bias out of its checks, not out of the arguments it
    relates."""
    arguments = _sequence_arguments(generator)
    arguments[SEQUENCE_NAMES.index(name)] = _random(generator, *shape)
    if not bias:
        arguments[2] = None
    with raises_with(ValueError, "lltm_sequence: ", *fragments):
        lltm_ffi.lltm_sequence(*arguments, reverse=reverse)


def test_takes_tensor_answers_as_check_tensor_refuses():
    """op.takes_tensor, the valid case of op.check_tensor that lltm_layers
    asks before naming anything, passes exactly what check_tensor does."""
    dense = torch.ones(2, 3)
    candidates = [dense, dense.double(), dense.bfloat16(), dense.half(), dense.long(),
                  dense.to_sparse(), torch.nested.nested_tensor([dense, dense[:1]]),
                  [[1.0, 2.0]], None, torch.nn.Parameter(dense)]
    for candidate in candidates:
        try:
            op.check_tensor("f", "x", candidate)
            refused = False
        except TypeError:
            refused = True
        assert op.takes_tensor(candidate) is not refused, candidate


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_layers_refuse_a_weight_or_bias_of_the_wrong_shape_naming_it(bias, generator):
    """lltm_layers names the list element, whatever layer and direction it is."""
    module = lltm_ffi.LLTMSequence(F, S, num_layers=2, bidirectional=True, bias=bias)
    weights = [getattr(module, name).detach() for name in module._weight_names]
    biases = [getattr(module, name).detach() for name in module._bias_names] or None
    inputs, state = torch.randn(T, B, F, generator=generator), torch.zeros(4, B, S)
    for index in range(4):
        wrong = list(weights)
        wrong[index] = _random(generator, 3 * S + 1, wrong[index].shape[1])
        with raises_with(ValueError, f"lltm_layers: weights[{index}] has shape "
                                     f"{(3 * S + 1, wrong[index].shape[1])}"):
            lltm_ffi.lltm_layers(inputs, wrong, biases, state, state, bidirectional=True)
    if bias:
        wrong = list(biases)
        wrong[3] = _random(generator, 3 * S - 1)
        with raises_with(ValueError, f"lltm_layers: biases[3] has shape {(3 * S - 1,)}"):
            lltm_ffi.lltm_layers(inputs, weights, wrong, state, state, bidirectional=True)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_sequence_module_with_a_replaced_parameter_of_the_wrong_shape_names_it(bias, generator):
    module = lltm_ffi.LLTMSequence(F, S, bias=bias)
    module.weights_l0 = torch.nn.Parameter(_random(generator, 3 * S + 3, S + F))
    with raises_with(ValueError, "weights[0] has shape (24, 12)"):
        module(torch.randn(T, B, F, generator=generator))


def _packed_rows(generator, weights_rows=3 * S):
    inputs, weights, bias, h0, c0 = _sequence_arguments(generator)
    return (inputs.reshape(T * B, F), _random(generator, weights_rows, S + F), bias, h0, c0)


def _packed_backward_arguments(generator):
    rows, weights, bias, h0, _ = _packed_rows(generator, 3 * S + 1)
    saved = [torch.zeros(T * B, size) for size in (S, S, 3 * S)]
    return (rows, weights, bias, h0, None, False, *saved, None, None, None, None)


# (what is called, the name its refusal must start with): each operator named
# as itself when called directly, the public function when called through it.
OPERATOR_CALLS = {
    "packed_forward": (lambda g: torch.ops.lltm_ffi.packed_forward(*_packed_rows(g, 3 * S + 1),
                                                                   None, False),
                       "lltm_ffi::packed_forward: weights has shape"),
    "packed_backward": (lambda g: torch.ops.lltm_ffi.packed_backward(*_packed_backward_arguments(g)),
                        "lltm_ffi::packed_backward: weights has shape"),
    "embed_forward": (lambda g: torch.ops.lltm_ffi.embed_forward(
        torch.tensor([0, 3]), torch.randn(3, 2), None),
        "lltm_ffi::embed_forward: indices at (1,) is 3"),
    "embed": (lambda g: lltm_ffi.embed(torch.tensor([0, 3]), torch.randn(3, 2)),
              "embed: indices at (1,) is 3"),
    "lltm_sequence_packed": (lambda g: lltm_ffi.lltm_sequence(
        *_packed_rows(g, 3 * S + 1), batch_sizes=torch.full((T,), B)),
        "lltm_sequence: weights has shape"),
    "roi_pool_forward": (lambda g: torch.ops.lltm_ffi.roi_pool_forward(
        torch.randn(1, 2, 5, 5), torch.zeros(1, 4), 2, 2, 1.0),
        "lltm_ffi::roi_pool_forward: rois has shape (1, 4)"),
    "roi_pool": (lambda g: lltm_ffi.roi_pool(torch.randn(1, 2, 5, 5), torch.zeros(1, 4), 2, 2, 1.0),
                 "roi_pool: rois has shape (1, 4)"),
    "roi_pool_backward": (lambda g: torch.ops.lltm_ffi.roi_pool_backward(
        torch.randn(1, 2, 2, 2), torch.zeros(1, 5), torch.zeros(1, 2, 2, 2, dtype=torch.int64),
        1, 5, 5, -1.0), "lltm_ffi::roi_pool_backward: spatial_scale must be positive"),
}


@pytest.mark.parametrize("call", OPERATOR_CALLS)
def test_a_refusal_names_the_operator_it_came_through(call, generator):
    function, start = OPERATOR_CALLS[call]
    with pytest.raises(ValueError) as raised:
        function(generator)
    assert str(raised.value).startswith(start), str(raised.value)


def test_a_pass_without_a_cpu_version_refuses_cpu_tensors_naming_the_operator(generator):
    """step_forward has kernels only: on CPU tensors its operator says so,
    whether or not the module was built with CUDA."""
    arguments = random_inputs(generator, SHAPE, torch.float32)
    with raises_with(ValueError, "lltm_ffi::step_forward: input is on cpu",
                     "no cpu version"):
        torch.ops.lltm_ffi.step_forward(*arguments)


# Scalars C cannot hold: an int beyond int64, a float beyond a double, or not finite.
UNREPRESENTABLE_SCALARS = [
    ("spatial_scale", 10**400, "roi_pool: spatial_scale"),
    ("spatial_scale", -10**400, "roi_pool: spatial_scale"),
    ("pooled_height", 2**63, "roi_pool: pooled_height"),
    ("pooled_width", -2**70, "roi_pool: pooled_width"),
]


@pytest.mark.parametrize("name, value, start", UNREPRESENTABLE_SCALARS,
                         ids=[f"{name}-{'neg' if value < 0 else 'pos'}{len(str(abs(value)))}digits"
                              for name, value, _ in UNREPRESENTABLE_SCALARS])
def test_a_scalar_c_cannot_hold_is_a_value_error_naming_it(name, value, start):
    arguments = {"pooled_height": 2, "pooled_width": 2, "spatial_scale": 1.0, name: value}
    with pytest.raises(ValueError) as raised:
        lltm_ffi.roi_pool(torch.randn(1, 2, 5, 5), torch.tensor([[0.0, 0, 0, 3, 3]]),
                          *arguments.values())
    assert str(raised.value).startswith(start), str(raised.value)
    assert len(str(raised.value)) < 300, "the message should not print hundreds of digits"

