"""LLTMSequence where a script has nn.LSTM: saved whole and loaded with
torch.load's defaults, nn.LSTM's constructor and attributes, the forms of
the state (nn.LSTM's pair, nn.GRU's lone h0), initialisation by parameter
name; on a GPU, a bidirectional training step without torch's stream
warning, and the order of the backward that lets its two directions
overlap."""

import inspect
import io
import warnings

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

import lltm_ffi

# Fixed seeds: these tests draw no random seed.
SEED = 20240611


@pytest.fixture(autouse=True)
def own_generator():
    """The tests seed torch's global generator; it is restored after each."""
    with torch.random.fork_rng(devices=[]):
        yield


def saved_and_loaded(thing, safe_globals=(), map_location=None):
    """torch.load, with its defaults, of torch.save(thing)."""
    buffer = io.BytesIO()
    torch.save(thing, buffer)
    buffer.seek(0)
    with torch.serialization.safe_globals(list(safe_globals)):
        return torch.load(buffer, map_location=map_location)


class Tagger(nn.Module):
    """A user's model holding an LLTMSequence."""

    def __init__(self, tokens, features, state_size):
        super().__init__()
        self.embedding = nn.Embedding(tokens, features)
        self.rnn = lltm_ffi.LLTMSequence(features, state_size, num_layers=2, bidirectional=True)
        self.readout = nn.Linear(2 * state_size, tokens)

    def forward(self, words):
        output, _ = self.rnn(self.embedding(words))
        return self.readout(output)


# Saving whole modules ----------------------------------------------------------------

def test_every_module_lltm_ffi_exports_is_a_safe_global():
    exported = [getattr(lltm_ffi, name) for name in lltm_ffi.__all__]
    modules = [value for value in exported
               if isinstance(value, type) and issubclass(value, nn.Module)]
    assert {lltm_ffi.LLTM, lltm_ffi.LLTMSequence, lltm_ffi.RoIPool} <= set(modules)
    allowed = torch.serialization.get_safe_globals()
    for module in modules:
        assert module in allowed, module


@pytest.mark.parametrize("make", [
    lambda: lltm_ffi.LLTM(3, 5),
    lambda: lltm_ffi.LLTMSequence(3, 5, num_layers=2, bidirectional=True, dropout=0.25,
                                  batch_first=True),
    lambda: lltm_ffi.LLTMSequence(3, 5, bias=False),
    lambda: lltm_ffi.RoIPool(2, 3, 0.5),
], ids=["LLTM", "LLTMSequence", "LLTMSequence-no-bias", "RoIPool"])
def test_a_saved_module_loads_with_torch_loads_defaults(make, device):
    torch.manual_seed(SEED)
    module = make().to(device)
    loaded = saved_and_loaded(module, map_location=device)
    assert type(loaded) is type(module) and repr(loaded) == repr(module)
    assert loaded.state_dict().keys() == module.state_dict().keys()
    for name, value in module.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
        assert loaded.state_dict()[name].device == value.device
    if isinstance(module, lltm_ffi.LLTMSequence):
        inputs = torch.randn(2, 4, 3, device=device)
        module.eval(), loaded.eval()
        for got, expected in zip(torch.utils._pytree.tree_leaves(loaded(inputs)),
                                 torch.utils._pytree.tree_leaves(module(inputs))):
            assert torch.equal(got, expected)


def test_a_model_holding_an_lltm_sequence_needs_only_its_own_classes_allowed(device):
    torch.manual_seed(SEED)
    model = Tagger(11, 4, 6).to(device)
    words = torch.randint(11, (7, 3), device=device)
    with pytest.raises(Exception, match="Tagger") as refused:
        saved_and_loaded(model)
    assert "lltm_ffi" not in str(refused.value)
    loaded = saved_and_loaded(model, [Tagger, nn.Embedding, nn.Linear])
    model.eval(), loaded.eval()
    assert torch.equal(loaded(words), model(words))


# nn.LSTM's constructor and attributes ------------------------------------------------

ATTRIBUTES = ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout",
              "bidirectional", "proj_size")


@pytest.mark.parametrize("arguments", [(7, 5), (7, 5, 3, False, True, 0.25, True)],
                         ids=["two", "seven"])
def test_positional_arguments_mean_what_they_mean_to_nn_lstm(arguments):
    lstm, lltm = nn.LSTM(*arguments), lltm_ffi.LLTMSequence(*arguments)
    for name in ATTRIBUTES:
        assert getattr(lltm, name) == getattr(lstm, name), name
    assert len(lltm.all_weights) == len(lstm.all_weights)


def test_the_first_seven_parameters_are_nn_lstms_in_its_order():
    lltm = list(inspect.signature(lltm_ffi.LLTMSequence).parameters)
    lstm = list(inspect.signature(nn.RNNBase).parameters)[1:]  # after nn.RNNBase's mode
    assert lstm[:7] == ["input_size", "hidden_size", *lltm[2:7]]
    assert lltm[:2] == ["input_features", "state_size"]


def test_nn_lstms_keywords_name_the_sizes():
    module = lltm_ffi.LLTMSequence(input_size=7, hidden_size=5, num_layers=2, proj_size=0)
    assert (module.input_features, module.state_size) == (7, 5)
    assert (module.input_size, module.hidden_size) == (7, 5)
    assert repr(module) == repr(lltm_ffi.LLTMSequence(7, 5, 2))


@pytest.mark.parametrize("keywords, exception, fragment", [
    ({"state_size": 5}, TypeError, "missing its argument input_features (or nn.LSTM's name for "
                                   "it, input_size)"),
    ({"input_size": 7}, TypeError, "missing its argument state_size"),
    ({"input_features": 7, "input_size": 7, "state_size": 5}, TypeError,
     "got both input_features=7 and input_size=7"),
    ({"input_size": 7, "state_size": 5, "hidden_size": 5}, TypeError,
     "got both state_size=5 and hidden_size=5"),
    ({"input_size": 7, "hidden_size": 5, "proj_size": 3}, ValueError,
     "proj_size must be 0, got 3"),
])
def test_the_size_keywords_are_refused_naming_them(keywords, exception, fragment):
    with pytest.raises(exception, match="LLTMSequence") as refused:
        lltm_ffi.LLTMSequence(**keywords)
    assert fragment in str(refused.value)


def test_flatten_parameters_does_nothing():
    module = lltm_ffi.LLTMSequence(3, 4, num_layers=2)
    before = {name: (parameter, parameter.data_ptr(), parameter.clone())
              for name, parameter in module.named_parameters()}
    assert module.flatten_parameters() is None
    for name, parameter in module.named_parameters():
        same, pointer, values = before[name]
        assert parameter is same and parameter.data_ptr() == pointer
        assert torch.equal(parameter, values)


@pytest.mark.parametrize("bias", [True, False])
def test_all_weights_lists_each_layer_and_directions_parameters(bias):
    module = lltm_ffi.LLTMSequence(3, 4, num_layers=2, bidirectional=True, bias=bias)
    suffixes = ["l0", "l0_reverse", "l1", "l1_reverse"]
    expected = [[getattr(module, f"weights_{suffix}")]
                + ([getattr(module, f"bias_{suffix}")] if bias else []) for suffix in suffixes]
    got = module.all_weights
    assert [[id(parameter) for parameter in group] for group in got] == [
        [id(parameter) for parameter in group] for group in expected]


def test_initialisation_by_parameter_name_reaches_every_parameter():
    """The loop scripts run over nn.LSTM's named_parameters."""
    torch.manual_seed(SEED)
    module = lltm_ffi.LLTMSequence(10, 4, num_layers=2, bidirectional=True, dtype=torch.float64)
    for name, parameter in module.named_parameters():
        if 'weight' in name:
            nn.init.orthogonal_(parameter)
        elif 'bias' in name:
            nn.init.zeros_(parameter)
        else:
            pytest.fail(f"{name} is neither a weight nor a bias by its name")
    for name, parameter in module.named_parameters():
        if 'bias' in name:
            assert not parameter.any(), name
        else:
            rows, columns = parameter.shape  # (12, 14) and (12, 12): orthonormal rows
            assert rows <= columns
            torch.testing.assert_close(parameter @ parameter.T,
                                       torch.eye(rows, dtype=torch.float64))


# The state ---------------------------------------------------------------------------

def state_case(device):
    torch.manual_seed(SEED)
    module = lltm_ffi.LLTMSequence(3, 5, num_layers=2, bidirectional=True,
                                   dtype=torch.float64).to(device)
    inputs = torch.randn(6, 4, 3, dtype=torch.float64, device=device)
    h0 = torch.randn(4, 4, 5, dtype=torch.float64, device=device)
    c0 = torch.randn(4, 4, 5, dtype=torch.float64, device=device)
    return module, inputs, h0, c0


def results(module, inputs, state):
    """The outputs and the gradients of the parameters and of the state's
    tensors of a loss of every output."""
    module.zero_grad()
    leaves = [tensor.detach().requires_grad_() if tensor is not None else None
              for tensor in (state if isinstance(state, tuple) else (state,))]
    given = leaves[0] if not isinstance(state, tuple) else tuple(leaves)
    output, (h_n, c_n) = module(inputs, given)
    (output.sin().sum() + h_n.cos().sum() + c_n.square().sum()).backward()
    gradients = [parameter.grad.clone() for parameter in module.parameters()]
    return [output, h_n, c_n, *gradients, *(leaf.grad for leaf in leaves if leaf is not None)]


def assert_same(got, expected):
    assert len(got) == len(expected)
    for index, (value, reference) in enumerate(zip(got, expected)):
        torch.testing.assert_close(value, reference, rtol=0, atol=0,
                                   msg=lambda message, index=index: f"result {index}: {message}")


def test_a_lone_h0_starts_the_cell_state_at_zero(device):
    module, inputs, h0, _ = state_case(device)
    expected = results(module, inputs, (h0, torch.zeros_like(h0)))[:-1]  # but d_c0
    assert_same(results(module, inputs, h0), expected)
    assert_same(results(module, inputs, (h0, None)), expected)


def test_none_in_the_pair_is_zeros(device):
    module, inputs, h0, c0 = state_case(device)
    expected = results(module, inputs, (torch.zeros_like(c0), c0))
    assert_same(results(module, inputs, (None, c0)), expected[:-2] + expected[-1:])  # but d_h0
    with torch.no_grad():
        assert_same(torch.utils._pytree.tree_leaves(module(inputs, (None, None))),
                    torch.utils._pytree.tree_leaves(module(inputs)))


def test_nn_lstms_hx_keyword_is_the_state(device):
    module, inputs, h0, c0 = state_case(device)
    module.eval()
    with torch.no_grad():
        assert_same(torch.utils._pytree.tree_leaves(module(inputs, hx=(h0, c0))),
                    torch.utils._pytree.tree_leaves(module(inputs, (h0, c0))))
        with pytest.raises(TypeError, match="both state and hx"):
            module(inputs, (h0, c0), hx=(h0, c0))


def test_a_lone_h0_for_unbatched_and_packed_inputs(device):
    module, inputs, h0, c0 = state_case(device)
    module.eval()
    with torch.no_grad():
        output, (h_n, c_n) = module(inputs[:, 1], h0[:, 1])
        expected_output, (expected_h, expected_c) = module(inputs[:, 1:2], h0[:, 1:2])
        assert_same([output, h_n, c_n], [expected_output[:, 0], expected_h[:, 0],
                                         expected_c[:, 0]])
        packed = pack_padded_sequence(inputs, torch.tensor([3, 6, 1, 4]), enforce_sorted=False)
        got = module(packed, h0)
        expected = module(packed, (h0, torch.zeros_like(h0)))
        assert_same([got[0].data, *got[1]], [expected[0].data, *expected[1]])


def test_gru_style_code_changes_only_its_unpacking(device):
    """nn.GRU's `output, h_n = gru(x, h0)` becomes `output, (h_n, c_n) =
    ...`; the returned pair goes back in as the next state."""
    torch.manual_seed(SEED)
    module = lltm_ffi.LLTMSequence(3, 5, num_layers=2, dtype=torch.float64).to(device)
    inputs = torch.randn(6, 4, 3, dtype=torch.float64, device=device)
    h0 = torch.randn(2, 4, 5, dtype=torch.float64, device=device)
    with torch.no_grad():
        output, hidden = module(inputs[:3], h0)
        assert isinstance(hidden, tuple) and len(hidden) == 2
        rest, _ = module(inputs[3:], hidden)
        whole, _ = module(inputs, h0)
    torch.testing.assert_close(torch.cat([output, rest]), whole)


# GPU: streams --------------------------------------------------------------------------

def test_autograd_runs_the_latest_made_ready_node_first():
    """What lets a bidirectional layer's two backwards overlap on a GPU
    (layers.py): of the nodes ready at once, autograd runs the one made
    last first, so the reverse direction's hand-over views, made before the
    forward direction's node, run after its backward is queued. The same
    graph on the CPU, the order recorded."""
    order = []

    class Direction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inputs, name):
            ctx.name = name
            return inputs * 2

        @staticmethod
        def backward(ctx, grad):
            order.append(ctx.name)
            return grad * 2, None

    weights = torch.ones(3, requires_grad=True)
    handed_over = weights.view_as(weights)
    handed_over.register_hook(lambda grad: order.append("hand-over"))
    forward = Direction.apply(weights, "forward")
    reverse = Direction.apply(handed_over, "reverse")
    torch.cat([forward, reverse]).sum().backward()
    assert order == ["reverse", "forward", "hand-over"]
    assert torch.equal(weights.grad, torch.full((3,), 4.0))


@pytest.mark.parametrize("case", ["parameters", "leaf-input", "accumulators-made-ahead",
                                  "packed"])
def test_a_bidirectional_training_step_makes_torch_warn_nothing(case, cuda_device):
    """Three steps of a two-layer bidirectional module, the last loss kept
    alive into the next forward (as a training loop keeps it): no warning,
    torch's AccumulateGrad stream warning included (set_warn_always, so that
    one given earlier in the process is given again)."""
    torch.manual_seed(SEED)
    module = lltm_ffi.LLTMSequence(8, 32, num_layers=2, bidirectional=True).to(cuda_device)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
    inputs = torch.randn(20, 6, 8, device=cuda_device, requires_grad=case == "leaf-input")
    if case == "packed":
        inputs = pack_padded_sequence(inputs, torch.tensor([20, 3, 17, 9, 20, 1]),
                                      enforce_sorted=False)
    # As DistributedDataParallel does: every parameter's AccumulateGrad node
    # made ahead on the current stream, and kept.
    accumulators = ([parameter.view_as(parameter).grad_fn.next_functions[0][0]
                     for parameter in module.parameters()]
                    if case == "accumulators-made-ahead" else [])
    warned_always = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                optimizer.zero_grad()
                output, (h_n, c_n) = module(inputs)
                data = output.data if case == "packed" else output
                loss = data.square().mean() + h_n.square().mean() + c_n.mean()
                loss.backward()
                optimizer.step()
            torch.cuda.synchronize(cuda_device)
    finally:
        torch.set_warn_always(warned_always)
    assert not caught, [str(warning.message) for warning in caught]
    assert all(node is not None for node in accumulators)  # alive through every step
    for name, parameter in module.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
