"""A public training script's model code with LLTMSequence: pytorch/examples'
word language model (examples/word_language_model.py) trains, saves the
whole model, loads it with torch.load's defaults and generates, its model
differing from the example's by the branch that constructs the module;
and a stacked bidirectional classifier over packed batches of
variable-length sequences does the same. On the CPU, and on a GPU where
there is one; fixed seeds, tiny sizes."""

import inspect
import math
from argparse import Namespace

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

import lltm_ffi
from examples import word_language_model as script

SEED = 1111  # the example's
VOCABULARY = 20
# The script's arguments, tiny: 2 epochs of 40 batches of 4 x 8 tokens.
ARGUMENTS = dict(emsize=16, nhid=16, nlayers=2, lr=5.0, clip=0.25, epochs=2, max_batches=40,
                 batch_size=4, bptt=8, dropout=0.2, tied=False, log_interval=0)


@pytest.fixture(autouse=True)
def own_generator_and_one_thread():
    """The script seeds torch's global generator, as the example does; it is
    restored after each test. The models are tiny: one torch thread runs
    them faster than several (ten times faster on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_num_threads(threads)


def corpus():
    return script.SyntheticCorpus(VOCABULARY, 2000, 400, 400, seed=SEED)


def test_the_model_differs_from_the_examples_by_its_constructing_line_only():
    source = inspect.getsource(script.RNNModel)
    assert source.count("lltm_ffi") == 1
    assert ("        elif rnn_type == 'LLTM':\n"
            "            self.rnn = lltm_ffi.LLTMSequence(ninp, nhid, nlayers, dropout=dropout)\n"
            ) in source
    # init_hidden is the example's: a lone h0 for every kind but LSTM.
    assert "if self.rnn_type == 'LSTM':" in inspect.getsource(script.RNNModel.init_hidden)
    assert lltm_ffi.LLTMSequence not in script.SAFE_GLOBALS


@pytest.mark.parametrize("rnn_type", ["LLTM", "LSTM", "GRU"])
def test_trains_saves_reloads_and_generates(rnn_type, device, tmp_path):
    torch.manual_seed(SEED)
    words = corpus()
    args = Namespace(**ARGUMENTS, save=str(tmp_path / "model.pt"))
    model = script.RNNModel(rnn_type, VOCABULARY, args.emsize, args.nhid, args.nlayers,
                            args.dropout).to(device)
    valid = script.batchify(words.valid, script.EVAL_BATCH_SIZE, device)
    untrained = script.evaluate(model, valid, args.bptt)
    assert abs(untrained - math.log(VOCABULARY)) < 0.1  # about uniform

    best = script.train_and_keep_the_best(model, words, args, device)
    assert best < untrained - 0.05, f"validation loss {untrained:.3f} -> {best:.3f}"

    loaded = script.load(args.save, device)
    assert type(loaded.rnn) is type(model.rnn)
    assert next(loaded.parameters()).device.type == device.type
    assert script.evaluate(loaded, valid, args.bptt) == pytest.approx(best, rel=1e-5)

    generated = script.generate(loaded, words, 12, device)
    assert len(generated) == 12 and set(generated) <= set(words.dictionary.idx2word)
    assert script.generate(loaded, words, 12, device) == generated  # the same seed


def test_the_hidden_state_is_nn_lstms_pair_between_batches(device):
    """init_hidden gives LLTM a lone h0 (as GRU); the model returns
    nn.LSTM's (h, c) pair, which repackage_hidden detaches and the next
    batch takes."""
    torch.manual_seed(SEED)
    model = script.RNNModel("LLTM", VOCABULARY, 8, 8, 2, 0.0).to(device)
    train_data = script.batchify(corpus().train, 4, device)
    hidden = model.init_hidden(4)
    assert isinstance(hidden, torch.Tensor) and hidden.shape == (2, 4, 8)
    for i in (0, 8):
        data, targets = script.get_batch(train_data, i, 8)
        loss, hidden = script.train_batch(model, data, targets, hidden, 1.0, 0.25)
        assert math.isfinite(loss)
        assert isinstance(hidden, tuple) and [tensor.shape for tensor in hidden] == [(2, 4, 8)] * 2
        assert all(tensor.grad_fn is not None for tensor in hidden)
    assert all(tensor.grad_fn is None for tensor in script.repackage_hidden(hidden))


def test_the_script_runs_end_to_end(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert script.main(["--model", "LLTM", "--vocabulary", "20", "--tokens", "1500",
                        "--emsize", "8", "--nhid", "8", "--bptt", "6", "--batch_size", "4",
                        "--epochs", "2", "--lr", "5", "--log-interval", "20",
                        "--words", "7"]) == 0
    out = capsys.readouterr().out
    assert "| end of epoch   2 |" in out and "| End of training | test loss" in out
    assert len(out.strip().splitlines()[-1].split()) == 7  # the generated words
    assert (tmp_path / "model.pt").exists()


# A stacked bidirectional classifier over packed batches --------------------------------

class PackedClassifier(nn.Module):
    """Reads a padded batch of variable-length sequences (packed, not
    sorted) with two bidirectional layers; classifies from the last layer's
    final states of both directions."""

    def __init__(self, tokens, features, state_size, classes):
        super().__init__()
        self.embedding = nn.Embedding(tokens, features)
        self.rnn = lltm_ffi.LLTMSequence(features, state_size, num_layers=2, bidirectional=True,
                                         dropout=0.1)
        self.readout = nn.Linear(2 * state_size, classes)

    def forward(self, words, lengths):
        packed = pack_padded_sequence(self.embedding(words), lengths, enforce_sorted=False)
        _, (h_n, _) = self.rnn(packed)
        return self.readout(torch.cat([h_n[-2], h_n[-1]], dim=1))


def classification_batches(count, tokens, classes, steps, batch_size):
    """(words (steps, batch), lengths, labels): the label is the class of a
    sequence's first word, which the reverse direction reads last."""
    generator = torch.Generator().manual_seed(SEED)
    batches = []
    for _ in range(count):
        words = torch.randint(tokens, (steps, batch_size), generator=generator)
        lengths = torch.randint(2, steps + 1, (batch_size,), generator=generator)
        batches.append((words, lengths, words[0] % classes))
    return batches


def test_a_stacked_bidirectional_classifier_trains_on_packed_batches(device, tmp_path):
    torch.manual_seed(SEED)
    model = PackedClassifier(12, 8, 16, 3).to(device)
    batches = [(words.to(device), lengths, labels.to(device))
               for words, lengths, labels in classification_batches(6, 12, 3, 10, 24)]
    losses = []
    for step in range(60):
        words, lengths, labels = batches[step % len(batches)]
        loss = nn.functional.cross_entropy(model(words, lengths), labels)
        model.zero_grad()
        loss.backward()
        # Plain SGD, as the word language model's: torch.optim's first use
        # imports torch._dynamo, seconds of this test's time.
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(parameter.grad, alpha=-1.0)
        losses.append(loss.item())
    first, last = sum(losses[:6]) / 6, sum(losses[-6:]) / 6
    assert last < 0.5 * first, f"loss {first:.3f} -> {last:.3f}"

    path = tmp_path / "classifier.pt"
    torch.save(model, path)
    with torch.serialization.safe_globals([PackedClassifier, nn.Embedding, nn.Linear]):
        loaded = torch.load(path)
    model.eval(), loaded.eval()
    right = 0
    with torch.no_grad():
        for words, lengths, labels in batches:
            assert torch.equal(loaded(words, lengths), model(words, lengths))
            right += (loaded(words, lengths).argmax(1) == labels).sum().item()
    assert right > 0.8 * 24 * len(batches)
