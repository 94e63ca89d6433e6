"""lltm_ffi.embed against torch (F.embedding plus the bias) on every device
(the CUDA cases skip without a GPU) and dtype: outputs exactly; gradients
against sums in float64, within the bound of a sum in the dtype's math
type, and gradcheck and gradgradcheck in float64; int32 and int64 indices;
indices outside the rows refused where their values can be read, and
skipped by C where they cannot; the scatter's nondeterminism on a GPU,
bounded, and torch.use_deterministic_algorithms; the operators under
opcheck and torch.compile; the module and the self-check."""

import re

import pytest
import torch
from torch.nn.functional import embedding

import lltm_ffi
from lltm_ffi import op
from lltm_ffi.ops.embed.embed import embed_backward, embed_forward

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)
# The unit roundoff of the type each dtype's sums run in, and of the dtype.
SUM_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-24,
                torch.bfloat16: 2.0**-24}
STORE_ROUNDOFF = {torch.float64: 0.0, torch.float32: 0.0, torch.float16: 2.0**-11,
                  torch.bfloat16: 2.0**-8}


@pytest.fixture(params=DTYPES, ids=[str(dtype).removeprefix("torch.") for dtype in DTYPES])
def dtype(request):
    """embed's passes take the 16-bit dtypes too: every test runs in all four."""
    return request.param


@pytest.fixture
def generator():
    """The same inputs on every run."""
    return torch.Generator().manual_seed(20240531)


def table(shape, dtype, device, generator):
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(device, dtype)


def random_indices(shape, rows, device, generator, dtype=torch.int64):
    return torch.randint(0, rows, shape, generator=generator).to(device, dtype)


def reference(indices, weight, bias=None):
    output = embedding(indices.long(), weight)
    return output if bias is None else output + bias


def assert_sums_within_bound(got, terms, index, size, dtype):
    """`got` (size, ...) against the sums, in float64, of the rows of `terms`
    that `index` sends to each of its rows: within (k - 1) u sum|term| for k
    terms summed in the math type (u its unit roundoff), plus the dtype's
    rounding of the result."""
    terms = terms.detach().cpu().double()
    index = index.cpu().long()
    exact = torch.zeros(size, *terms.shape[1:], dtype=torch.float64).index_add_(0, index, terms)
    magnitude = torch.zeros_like(exact).index_add_(0, index, terms.abs())
    count = torch.zeros(size, dtype=torch.float64).index_add_(
        0, index, torch.ones(len(index), dtype=torch.float64))
    count = count.reshape(size, *[1] * (terms.dim() - 1))
    bound = ((count - 1).clamp(min=0) * SUM_ROUNDOFF[dtype] * magnitude
             + STORE_ROUNDOFF[dtype] * exact.abs()) * 1.0001
    error = (got.detach().cpu().double() - exact).abs()
    assert bool((error <= bound).all()), f"largest error over its bound {(error - bound).max()}"


# (indices' shape, rows, columns)
SHAPES = {"matrix": ((4, 6), 5, 3), "vector": ((9,), 3, 7), "scalar": ((), 4, 2),
          "3d": ((2, 3, 4), 10, 5), "one-row": ((5,), 1, 1), "no-index": ((0,), 3, 4)}


@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=["int32", "int64"])
@pytest.mark.parametrize("case", SHAPES)
def test_forward_matches_f_embedding(case, index_dtype, with_bias, dtype, device, generator):
    shape, rows, columns = SHAPES[case]
    indices = random_indices(shape, rows, device, generator, index_dtype)
    weight = table((rows, columns), dtype, device, generator)
    bias = table((columns,), dtype, device, generator) if with_bias else None
    output = lltm_ffi.embed(indices, weight, bias)
    assert output.dtype == dtype and output.shape == (*shape, columns)
    assert torch.equal(output, reference(indices, weight, bias))


@pytest.mark.parametrize("case", SHAPES)
def test_gradients_match_float64_sums(case, dtype, device, generator):
    """Rows picked many times: each weight row's gradient is a sum."""
    shape, rows, columns = SHAPES[case]
    indices = random_indices(shape, rows, device, generator)
    weight = table((rows, columns), dtype, device, generator).requires_grad_(True)
    bias = table((columns,), dtype, device, generator).requires_grad_(True)
    output = lltm_ffi.embed(indices, weight, bias=bias)
    grad_output = table(output.shape, dtype, device, generator)
    output.backward(grad_output)
    assert weight.grad.dtype == dtype and bias.grad.dtype == dtype
    flat = grad_output.reshape(-1, columns)
    assert_sums_within_bound(weight.grad, flat, indices.reshape(-1), rows, dtype)
    assert_sums_within_bound(bias.grad[None], flat, torch.zeros(len(flat), dtype=torch.long), 1,
                             dtype)


def test_gradcheck_and_gradgradcheck(device, generator):
    indices = torch.tensor([[0, 3, 3, 1], [3, 0, 2, 3]], device=device, dtype=torch.int32)
    weight = table((4, 3), torch.float64, device, generator).requires_grad_(True)
    bias = table((3,), torch.float64, device, generator).requires_grad_(True)
    assert torch.autograd.gradcheck(lltm_ffi.embed, (indices, weight, bias))
    assert torch.autograd.gradgradcheck(lltm_ffi.embed, (indices, weight, bias))
    assert torch.autograd.gradgradcheck(lambda weight: lltm_ffi.embed(indices, weight), (weight,))


def test_c_reads_int64_indices_whatever_their_dtype(monkeypatch):
    seen = []
    monkeypatch.setattr(embed_forward, "c", lambda sizes, tensors, scalars=(): seen.append(
        tensors[1].dtype))
    for index_dtype in INDEX_DTYPES:
        lltm_ffi.embed(torch.tensor([1, 0], dtype=index_dtype), torch.zeros(2, 3))
    assert seen == [torch.int64, torch.int64]


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=["int32", "int64"])
@pytest.mark.parametrize("values, words", [
    ([[0, 1], [5, 2]], "embed: indices at (1, 0) is 5; weight has 5 rows, so an index runs "
                       "from 0 to 4"),
    ([[0, -1], [4, 4]], "embed: indices at (0, 1) is -1; weight has 5 rows"),
    ([[0, 1], [2, 2**31 - 1]], "embed: indices at (1, 1) is 2147483647; weight has 5 rows"),
], ids=["rows", "negative", "huge"])
def test_indices_outside_the_rows_are_refused(values, words, index_dtype, device, monkeypatch):
    monkeypatch.setattr(embed_forward, "c", lambda *arguments, **options: pytest.fail("C ran"))
    indices = torch.tensor(values, dtype=index_dtype, device=device)
    weight = torch.zeros(5, 3, device=device)
    with pytest.raises(ValueError, match="^" + re.escape(words)):
        lltm_ffi.embed(indices, weight)
    with pytest.raises(ValueError, match="^" + re.escape(words)):
        torch.ops.lltm_ffi.embed_forward(indices, weight)


@pytest.mark.slow
def test_an_index_outside_is_refused_in_a_compiled_call_too():
    """torch.compile traces with fake tensors, where no value can be read; the
    operator's real implementation checks the values when the graph runs."""
    compiled = torch.compile(lambda indices, weight: lltm_ffi.embed(indices, weight) * 2,
                             fullgraph=True)
    weight = torch.ones(3, 2)
    assert torch.equal(compiled(torch.tensor([2, 0]), weight), torch.full((2, 2), 2.0))
    with pytest.raises(ValueError, match=re.escape("embed: indices at (1,) is 3")):
        compiled(torch.tensor([2, 3]), weight)


def test_the_value_check_is_skipped_where_values_cannot_be_read():
    """Fake tensors (opcheck, torch.compile, export), make_fx and torch.func
    transforms: the shapes are checked, the values are not."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    indices, weight = torch.tensor([[0, 7]]), torch.randn(3, 2)
    with FakeTensorMode() as mode:
        output = lltm_ffi.embed(mode.from_tensor(indices), mode.from_tensor(weight))
        assert output.shape == (1, 2, 2)
        with pytest.raises(ValueError, match="bias has shape"):
            lltm_ffi.embed(mode.from_tensor(indices), mode.from_tensor(weight),
                           mode.from_tensor(torch.zeros(3)))
    graph = make_fx(lambda i, w: lltm_ffi.embed(i, w), tracing_mode="fake")(indices, weight)
    assert "lltm_ffi.embed_forward" in graph.code
    # Under torch.func, C reads nothing outside the rows: that row is 0.
    gradient = torch.func.grad(lambda w: lltm_ffi.embed(indices, w).sum())(weight)
    assert torch.equal(gradient, torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]))


def test_the_backward_pass_skips_indices_outside_the_rows(device):
    """Given made-up indices (the operator called by hand), nothing is added
    for them and nothing written outside the gradient."""
    indices = torch.tensor([1, -1, 3, 2**40, 1], device=device)
    grad_output = torch.arange(1.0, 11.0, device=device).reshape(5, 2)
    grad_weight = embed_backward(grad_output, indices, 3)
    assert torch.equal(grad_weight.cpu(), torch.tensor([[0.0, 0.0], [10.0, 12.0], [0.0, 0.0]]))


def test_empty_without_a_launch(dtype, device, monkeypatch):
    for declared in (embed_forward, embed_backward):
        monkeypatch.setattr(declared, "c", lambda *arguments, **options: pytest.fail("C ran"))
    weight = torch.zeros(3, 4, dtype=dtype, device=device, requires_grad=True)
    output = lltm_ffi.embed(torch.empty(2, 0, dtype=torch.int64, device=device), weight)
    assert output.shape == (2, 0, 4)
    output.sum().backward()
    assert torch.equal(weight.grad, torch.zeros_like(weight))
    assert lltm_ffi.embed(torch.tensor([1], device=device), weight[:, :0]).shape == (1, 0)


def test_noncontiguous_arguments(device, generator):
    indices = random_indices((6, 4), 5, device, generator).t()
    weight = table((3, 5), torch.float64, device, generator).t().requires_grad_(True)
    bias = table((6,), torch.float64, device, generator)[::2]
    assert not (indices.is_contiguous() or weight.is_contiguous() or bias.is_contiguous())
    assert torch.equal(lltm_ffi.embed(indices, weight, bias), reference(indices, weight, bias))


@pytest.mark.parametrize("arguments, keywords, error, words", [
    ((torch.tensor([0.0]), torch.zeros(3, 2)), {}, TypeError,
     "embed: indices has dtype torch.float32; it must be torch.int32 or torch.int64"),
    ((torch.tensor([True]), torch.zeros(3, 2)), {}, TypeError,
     "embed: indices has dtype torch.bool; it must be torch.int32 or torch.int64"),
    ((torch.tensor([0]), torch.zeros(3)), {}, ValueError,
     "embed: weight must have 2 dimensions, got shape (3,)"),
    ((torch.tensor([0]), torch.zeros(3, 2, dtype=torch.int64)), {}, TypeError,
     "embed: weight has dtype torch.int64; lltm_ffi takes floating-point tensors"),
    ((torch.tensor([0]), torch.zeros(3, 2), torch.zeros(3)), {}, ValueError,
     "embed: bias has shape (3,), expected (2,)"),
    ((torch.tensor([0]), torch.zeros(3, 2)), {"bias": torch.zeros(2, dtype=torch.float64)},
     TypeError, "embed: bias has dtype torch.float64 but weight has torch.float32"),
    ((torch.tensor([0]), torch.zeros(3, 2)), {"bais": torch.zeros(2)}, TypeError,
     "embed: no argument is named bais (it takes indices, weight, bias=None)"),
    (([0], torch.zeros(3, 2)), {}, TypeError, "embed: indices must be a torch.Tensor, got list"),
    ((torch.tensor([0], device="meta"), torch.zeros(3, 2, device="meta")), {}, ValueError,
     "embed: indices is on meta"),
], ids=["float-indices", "bool-indices", "1d-weight", "int-weight", "bias-shape", "bias-dtype",
        "unknown-keyword", "list-indices", "meta"])
def test_refusals_name_the_argument(arguments, keywords, error, words, monkeypatch):
    monkeypatch.setattr(embed_forward, "c", lambda *arguments, **options: pytest.fail("C ran"))
    with pytest.raises(error, match="^" + re.escape(words)):
        lltm_ffi.embed(*arguments, **keywords)


def test_the_backward_pass_refuses_a_gradient_of_another_shape():
    with pytest.raises(ValueError, match=re.escape("grad_output has shape (4, 2); it must be "
                                                   "indices' shape (3,)")):
        embed_backward(torch.zeros(4, 2), torch.zeros(3, dtype=torch.int64), 5)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=["int32", "int64"])
def test_opcheck(index_dtype, dtype, device, generator):
    indices = random_indices((3, 4), 5, device, generator, index_dtype)
    weight = table((5, 2), dtype, device, generator)
    bias = table((2,), dtype, device, generator)
    torch.library.opcheck(embed_forward.operator, (indices, weight, bias))
    torch.library.opcheck(embed_forward.operator, (indices, weight.requires_grad_(True)))
    grad_output = table((3, 4, 2), dtype, device, generator)
    torch.library.opcheck(embed_backward.operator, (grad_output, indices, 5))


@pytest.mark.slow
def test_torch_compile_fullgraph(device, generator):
    """Under torch.compile embed is the operator lltm_ffi::embed_forward, its
    backward lltm_ffi::embed_backward."""
    def head(indices, weight, bias):
        return torch.tanh(lltm_ffi.embed(indices, weight, bias=bias)).sum(-1)

    indices = random_indices((5, 3), 4, device, generator, torch.int32)
    weight, bias = table((4, 6), torch.float64, device, generator), table((6,), torch.float64,
                                                                          device, generator)
    leaves = [[tensor.clone().requires_grad_(True) for tensor in (weight, bias)]
              for _ in range(2)]
    compiled = torch.compile(head, fullgraph=True)(indices, *leaves[0])
    eager = head(indices, *leaves[1])
    compiled.sum().backward()
    eager.sum().backward()
    torch.testing.assert_close(compiled, eager)
    for got, expected in zip(leaves[0], leaves[1]):
        torch.testing.assert_close(got.grad, expected.grad)


def test_the_cpu_backward_gives_the_same_bits_every_run(generator):
    """One index after another on one thread: no atomics, no threads."""
    indices = random_indices((20000,), 3, "cpu", generator)
    grad_output = table((20000, 8), torch.float32, "cpu", generator)
    first = embed_backward(grad_output, indices, 3)
    assert torch.equal(first, embed_backward(grad_output, indices, 3))
    try:
        torch.use_deterministic_algorithms(True)
        assert torch.equal(first, embed_backward(grad_output, indices, 3))
    finally:
        torch.use_deterministic_algorithms(False)


def test_the_cuda_backward_varies_within_the_bound(cuda_device, generator):
    """20000 gradients into 3 rows by atomicAdd, twice: each run within the
    bound of a float32 sum of the float64 sums, whatever the order the
    threads added in, so the two runs within twice that of each other."""
    indices = random_indices((20000,), 3, cuda_device, generator)
    grad_output = table((20000, 8), torch.float32, cuda_device, generator)
    runs = [embed_backward(grad_output, indices, 3) for _ in range(2)]
    for run in runs:
        assert_sums_within_bound(run, grad_output, indices, 3, torch.float32)


def test_deterministic_algorithms_refuse_the_cuda_backward(cuda_device):
    weight = torch.ones(3, 2, device=cuda_device, requires_grad=True)
    output = lltm_ffi.embed(torch.tensor([0, 0], device=cuda_device), weight)
    try:
        torch.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match="embed_backward does not have a deterministic "
                                               "implementation on cuda"):
            output.sum().backward(retain_graph=True)
        torch.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match="does not have a deterministic implementation"):
            output.sum().backward()
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(weight.grad.cpu(), torch.tensor([[2.0, 2.0], [0, 0], [0, 0]]))


def test_module(device):
    torch.manual_seed(3)
    layer = lltm_ffi.Embed(5, 4).to(device)
    assert layer.weight.shape == (5, 4) and torch.equal(layer.bias, torch.zeros(4, device=device))
    indices = torch.tensor([[4, 0], [2, 2]], device=device)
    output = layer(indices)
    assert torch.equal(output, reference(indices, layer.weight, layer.bias))
    output.sum().backward()
    assert torch.equal(layer.bias.grad, torch.full((4,), 4.0, device=device))
    assert lltm_ffi.Embed(5, 4, bias=False).bias is None


def test_self_check(device):
    for dtype in (torch.float32, torch.float64):
        assert op.SELF_CHECKS["embed"](device, dtype) is None


def test_runs_on_the_current_side_stream(cuda_device, generator):
    """The indices are written on a side stream after a long delay; a kernel
    that ignored the current stream would read the -1s there before. The
    pass runs without its value check (run), whose read of the indices
    would wait for the side stream."""
    indices = random_indices((1 << 16,), 7, cuda_device, generator)
    weight = table((7, 3), torch.float32, cuda_device, generator)
    expected = reference(indices, weight)
    buffer = torch.full_like(indices, -1)
    lltm_ffi.embed(indices, weight)  # loads the kernel: a first launch can wait for the device
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)
        buffer.copy_(indices, non_blocking=True)
        output = embed_forward.run(buffer, weight, None)
    side.synchronize()
    assert torch.equal(output, expected)


def test_cuda_graph_capture_skips_the_value_check(cuda_device):
    """Reading a value during capture would synchronize, which capture
    forbids: the check is skipped and the kernel reads nothing outside the
    rows (an index outside gives the bias)."""
    weight = torch.arange(6.0, device=cuda_device).reshape(3, 2)
    bias = torch.tensor([10.0, 20.0], device=cuda_device)
    indices = torch.tensor([2, 0], device=cuda_device)
    lltm_ffi.embed(indices, weight, bias)  # warm-up, outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = lltm_ffi.embed(indices, weight, bias)
    indices.copy_(torch.tensor([1, 5], device=cuda_device))
    graph.replay()
    torch.cuda.synchronize()
    assert output.cpu().tolist() == [[12.0, 23.0], [10.0, 20.0]]
