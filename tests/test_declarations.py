"""What lltm_ffi.op makes of a declaration, on passes of this file whose
bodies compute in torch (no C): value checks (values=) run on real tensors
in eager calls and inside the operator, never on fake tensors, under
tracers, torch.compile's tracing or torch.func; several dtypes of one
tensor (dtype=(...), c_dtype=) and the conversion C sees; defaults and
keywords in the public call, the operator's schema and its autograd (which
the dispatcher calls without the trailing defaults); nondeterministic=
under torch.use_deterministic_algorithms; and the package's exports,
gathered from each op folder's __all__."""

import inspect
import re

import pytest
import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import lltm_ffi
from checkouts import copy_sources, run_python
from lltm_ffi import _extension, op

# What each value check saw: the number of calls, by pass.
VALUE_CHECKS = {"gather": 0}
INDICES = op.Tensor(dtype=(torch.int32, torch.int64), c_dtype=torch.int64)


def _indices_in_range(function, indices, table, offset=0.0):
    VALUE_CHECKS["gather"] += 1
    if bool(((indices < 0) | (indices >= table.shape[0])).any()):
        raise ValueError(f"{function}: an index is outside table's {table.shape[0]} rows")


def _gather(c, indices: INDICES, table: op.Tensor(dims=2), offset: float = 0.0) -> Tensor:
    """table's rows at indices, plus offset, in torch: C is not needed here,
    and what the body receives is what C would."""
    assert indices.dtype == torch.int64 and indices.is_contiguous()
    return table[indices] + offset


def _scatter(c, grad_output: op.Tensor(), indices: INDICES, rows: int) -> Tensor:
    columns = grad_output.shape[-1]
    return grad_output.new_zeros(rows, columns).index_add_(0, indices.reshape(-1),
                                                           grad_output.reshape(-1, columns))


@pytest.fixture(scope="module")
def declared():
    """The test passes, declared once for the module and taken out of the
    registries after it (their torch.library operators stay, unused)."""
    names = {"test_declarations_gather": _gather, "test_declarations_scatter": _scatter}
    for name in names:
        _extension.PASSES[name] = (-1, ("cpu",), {"cpu": _extension.FULL_PRECISION_DTYPES})
    try:
        gather = op.c_pass("test_declarations_gather", values=_indices_in_range)(_gather)
        scatter = op.c_pass("test_declarations_scatter", nondeterministic=("cpu",))(_scatter)

        def save(ctx, inputs, output):
            ctx.rows = inputs[1].shape[0]
            ctx.save_for_backward(inputs[0])

        def backward(ctx, grad_output):
            (indices,) = ctx.saved_tensors
            if not ctx.needs_input_grad[1]:
                return None, None, None
            return None, scatter(grad_output, indices, ctx.rows), None

        yield gather, scatter, op.Op(gather, backward, save, name="gather")
    finally:
        for name in names:
            op.PASSES.pop(name, None)
            _extension.PASSES.pop(name, None)


def test_an_eager_value_outside_is_refused(declared):
    gather, _, differentiable = declared
    table = torch.randn(3, 2)
    for call in (gather, differentiable, gather.operator):
        with pytest.raises(ValueError, match="gather: an index is outside table's 3 rows"):
            call(torch.tensor([0, 3]), table)


def test_the_value_check_runs_once_a_call_on_real_tensors(declared):
    gather, _, differentiable = declared
    table = torch.randn(3, 2, requires_grad=True)
    for call in (gather, differentiable, gather.operator):
        before = VALUE_CHECKS["gather"]
        call(torch.tensor([2, 0]), table)
        assert VALUE_CHECKS["gather"] == before + 1


def test_opcheck_passes_with_a_value_check(declared):
    gather = declared[0]
    table = torch.randn(4, 3, dtype=torch.float64)
    for indices in (torch.tensor([[3, 0], [1, 1]]), torch.tensor([2], dtype=torch.int32)):
        torch.library.opcheck(gather.operator, (indices, table, 0.5))
        torch.library.opcheck(gather.operator, (indices, table.requires_grad_(True)))


@pytest.mark.slow
def test_torch_compile_traces_without_values_and_checks_them_when_it_runs(declared):
    differentiable = declared[2]
    compiled = torch.compile(lambda indices, table: differentiable(indices, table, offset=1.0) * 2,
                             fullgraph=True)
    table = torch.randn(3, 2, requires_grad=True)
    output = compiled(torch.tensor([2, 2, 0]), table)
    torch.testing.assert_close(output, (table[[2, 2, 0]] + 1) * 2)
    output.sum().backward()
    assert torch.equal(table.grad, torch.tensor([[2.0, 2.0], [0.0, 0.0], [4.0, 4.0]]))
    with pytest.raises(ValueError, match="an index is outside"):
        compiled(torch.tensor([3]), table)


def test_fake_tensors_tracers_and_torch_func_skip_the_value_check(declared):
    gather, _, differentiable = declared
    indices, table = torch.tensor([0, 9]), torch.randn(3, 2)
    before = VALUE_CHECKS["gather"]
    with FakeTensorMode() as mode:
        fake = (mode.from_tensor(indices), mode.from_tensor(table))
        assert differentiable(*fake).shape == (2, 2)
        assert gather(*fake).shape == (2, 2)
    make_fx(lambda i, t: differentiable(i, t), tracing_mode="fake")(indices, table)
    inside = torch.tensor([0, 2])
    gradient = torch.func.grad(lambda t: differentiable(inside, t).sum())(table)
    assert torch.equal(gradient, torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]))
    assert VALUE_CHECKS["gather"] == before


def test_a_shape_check_still_runs_on_fake_tensors(declared):
    gather = declared[0]
    with FakeTensorMode() as mode:
        with pytest.raises(ValueError, match="table must have 2 dimensions"):
            gather(mode.from_tensor(torch.tensor([0])), mode.from_tensor(torch.randn(3)))


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_either_index_dtype_reaches_the_body_as_c_dtype(declared, index_dtype):
    gather = declared[0]
    table = torch.randn(3, 2)
    indices = torch.tensor([[2, 0, 1]], dtype=index_dtype).t()  # not contiguous
    assert torch.equal(gather(indices, table), table[indices.long()])


@pytest.mark.parametrize("index_dtype", [torch.int16, torch.uint8, torch.float32, torch.bool])
def test_another_index_dtype_is_refused_listing_those_taken(declared, index_dtype):
    with pytest.raises(TypeError, match=re.escape(
            f"gather: indices has dtype {index_dtype}; it must be torch.int32 or torch.int64")):
        declared[2](torch.zeros(2, dtype=index_dtype), torch.randn(3, 2))


def test_a_tuple_of_dtypes_needs_the_one_c_reads():
    with pytest.raises(TypeError, match=r"needs c_dtype=, the one of those dtypes that C reads"):
        op.Tensor(dtype=(torch.int32, torch.int64))
    with pytest.raises(TypeError, match=r"needs c_dtype="):
        op.Tensor(dtype=(torch.int32, torch.int64), c_dtype=torch.int16)
    with pytest.raises(TypeError, match=r"c_dtype= goes with a tuple of dtypes"):
        op.Tensor(dtype=torch.int64, c_dtype=torch.int64)


def test_defaults_and_keywords(declared):
    gather, _, differentiable = declared
    indices, table = torch.tensor([1]), torch.randn(3, 2)
    expected = table[indices] + 2.5
    for call in (gather, differentiable):
        assert torch.equal(call(indices, table), table[indices])
        assert torch.equal(call(indices, table, offset=2.5), expected)
        assert torch.equal(call(table=table, offset=2.5, indices=indices), expected)
        assert torch.equal(call(indices, table, 2.5), expected)
    schema = str(torch.ops.lltm_ffi.test_declarations_gather.default._schema)
    assert "float offset=0." in schema, schema
    assert str(inspect.signature(differentiable)) == (
        "(indices: op.Tensor(dtype=(torch.int32, torch.int64), c_dtype=torch.int64), "
        "table: op.Tensor(dims=(2,)), offset: float = 0.0)")


@pytest.mark.parametrize("arguments, keywords, words", [
    ((torch.tensor([1]), torch.randn(3, 2)), {"ofset": 1.0},
     "gather: no argument is named ofset (it takes indices, table, offset=0.0)"),
    ((torch.tensor([1]), torch.randn(3, 2), 1.0), {"offset": 1.0},
     "gather: offset is given twice, by position and by keyword"),
    ((torch.tensor([1]),), {}, "gather: missing the argument table (it takes indices, table, "
                               "offset=0.0)"),
    ((torch.tensor([1]), torch.randn(3, 2), 1.0, 2.0), {},
     "gather takes 3 arguments (indices, table, offset=0.0), got 4"),
], ids=["unknown", "twice", "missing", "too-many"])
def test_a_call_that_does_not_bind_is_refused(declared, arguments, keywords, words):
    with pytest.raises(TypeError, match="^" + re.escape(words)):
        declared[2](*arguments, **keywords)


def test_the_operator_called_without_its_defaults(declared):
    """The dispatcher leaves out trailing arguments equal to their defaults:
    the implementations, setup_context and the backward still see them."""
    gather = declared[0]
    table = torch.randn(3, 2, requires_grad=True)
    output = torch.ops.lltm_ffi.test_declarations_gather(torch.tensor([1, 1]), table)
    output.sum().backward()
    assert torch.equal(table.grad, torch.tensor([[0.0, 0.0], [2.0, 2.0], [0.0, 0.0]]))
    assert torch.equal(gather.operator(torch.tensor([0]), table, 0.0), table[[0]])


def test_a_nondeterministic_pass_follows_use_deterministic_algorithms(declared):
    scatter = declared[1]
    arguments = (torch.ones(2, 3), torch.tensor([0, 0]), 3)
    assert torch.equal(scatter(*arguments)[0], torch.full((3,), 2.0))
    try:
        torch.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match=re.escape(
                "lltm_ffi::test_declarations_scatter does not have a deterministic "
                "implementation on cpu")):
            scatter(*arguments)
        torch.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match="torch.use_deterministic_algorithms"):
            scatter(*arguments)
    finally:
        torch.use_deterministic_algorithms(False)


def test_the_package_exports_each_op_folders_all():
    """No list to keep in order: every op folder's __all__ is lltm_ffi's."""
    import importlib
    import pkgutil

    folders = [module.name for module in pkgutil.iter_modules(lltm_ffi.ops.__path__)
               if module.ispkg]
    assert {"lltm", "roi_pool", "round_ste"} <= set(folders)
    for folder in folders:
        package = importlib.import_module(f"lltm_ffi.ops.{folder}")
        for name in package.__all__:
            assert getattr(lltm_ffi, name) is getattr(package, name), (folder, name)
            assert name in lltm_ffi.__all__
    assert lltm_ffi.__all__ == sorted(lltm_ffi.__all__)


@pytest.mark.parametrize("exported, words", [
    ("roi_pool", "lltm_ffi.ops.zz_clash exports roi_pool, which another op folder exports too"),
    ("reference", "an op folder exports ['reference'], a name the package itself uses"),
])
def test_a_name_exported_twice_is_refused_at_import(tmp_path, exported, words):
    copy = copy_sources(tmp_path / "lltm")
    folder = copy / "lltm_ffi" / "ops" / "zz_clash"
    folder.mkdir()
    (folder / "__init__.py").write_text(f"{exported} = None\n__all__ = [{exported!r}]\n")
    result = run_python(copy, "import lltm_ffi")
    assert result.returncode != 0 and words in result.stderr, result.stderr
