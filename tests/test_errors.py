"""Bad arguments are refused in Python, before any pointer reaches C, with
an exception whose message names the argument and what is wrong with it."""

import re

import pytest
import torch

import lltm_ffi
from conftest import ARGUMENT_NAMES, random_inputs, raises_with, replaced

SHAPE = (3, 5, 7)  # batch, input_features, state_size


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


BAD_DTYPES = [torch.int32, torch.int64, torch.bool, torch.float16, torch.bfloat16,
              torch.complex64]


@pytest.mark.parametrize("bad_dtype", BAD_DTYPES, ids=str)
@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_unsupported_dtype_is_a_type_error_naming_argument_and_dtype(name, bad_dtype, inputs):
    value = (inputs[ARGUMENT_NAMES.index(name)] * 10).to(bad_dtype)
    with raises_with(TypeError, f"{name} has dtype {bad_dtype}", "float32", "float64"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_mixed_dtypes_are_a_type_error_naming_both(name, inputs):
    value = inputs[ARGUMENT_NAMES.index(name)].double()
    with raises_with(TypeError, name, "torch.float32", "torch.float64", "same dtype"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


@pytest.mark.parametrize("name", ARGUMENT_NAMES[1:])
def test_argument_on_meta_device_is_a_value_error_naming_both_devices(name, inputs):
    value = inputs[ARGUMENT_NAMES.index(name)].to("meta")
    with raises_with(ValueError, f"{name} is on meta but input is on cpu"):
        lltm_ffi.lltm(*replaced(inputs, name, value))


def test_all_arguments_on_meta_device_is_a_value_error(inputs):
    with raises_with(ValueError, "meta", "lltm_ffi runs on cpu and cuda"):
        lltm_ffi.lltm(*[tensor.to("meta") for tensor in inputs])


@pytest.mark.parametrize("name", ARGUMENT_NAMES)
def test_mixed_cpu_and_cuda_is_a_value_error_naming_both_devices(name, inputs, cuda_device):
    moved = inputs[ARGUMENT_NAMES.index(name)].to(cuda_device)
    with raises_with(ValueError, name, "cuda:0", "cpu", "same device"):
        lltm_ffi.lltm(*replaced(inputs, name, moved))


S, F, B = SHAPE[2], SHAPE[1], SHAPE[0]
WRONG_RANKS = [
    ("input", (B * F,)),
    ("input", (1, B, F)),
    ("weights", (3 * S * (S + F),)),
    ("bias", ()),
    ("bias", (1, 1, 3 * S)),
    ("old_h", (B * S,)),
    ("old_cell", (B, S, 1)),
]


@pytest.mark.parametrize("name, shape", WRONG_RANKS,
                         ids=[f"{name}-{len(shape)}d" for name, shape in WRONG_RANKS])
def test_wrong_rank_is_a_value_error_naming_argument_and_shape(name, shape, inputs):
    value = inputs[ARGUMENT_NAMES.index(name)].reshape(shape) if shape else inputs[2][0]
    with raises_with(ValueError, f"{name} must have", f"got shape {tuple(value.shape)}"):
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


def test_module_call_with_wrong_state_shape_is_a_value_error(generator):
    rnn = lltm_ffi.LLTM(F, S)
    old_h, old_cell = _random(generator, B, S), _random(generator, B, S + 2)
    with raises_with(ValueError, "old_cell has shape"):
        rnn(_random(generator, B, F), (old_h, old_cell))
