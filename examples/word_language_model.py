"""pytorch/examples' word-level language model (word_language_model:
model.py, main.py and generate.py; BSD-3-Clause, Copyright (c) 2017,
Pytorch contributors), rewritten small, with
LLTMSequence as one more kind of its recurrent module. The model differs
from the example's by the one branch that constructs the module:

    elif rnn_type == 'LLTM':
        self.rnn = lltm_ffi.LLTMSequence(ninp, nhid, nlayers, dropout=dropout)

and the rest follows the example: init_hidden, unchanged, gives any kind
but LSTM a lone h0, which LLTMSequence takes as nn.GRU's state (its cell
state starting at zero) while returning nn.LSTM's pair; the training loop
is truncated backpropagation through time with repackage_hidden, gradient
clipping and plain SGD, the learning rate divided by 4 when the validation
loss stops falling; the best model is saved whole with torch.save and
loaded with torch.load's default weights_only=True under the example's own
safe_globals list, which does not name lltm_ffi (`import lltm_ffi`
registers its modules); generate() is generate.py's sampling loop. Left
out: the Transformer, ONNX export, the optimizer option.

The corpus is synthetic (there is no download): a stream of tokens from a
fixed-seed Markov chain over `--vocabulary` words, each word followed by
one of a few words of its own most of the time, else by a word drawn from
a Zipf distribution. Run from the repository's root:

    python -m examples.word_language_model --model LLTM [--accel] [--epochs 6]

`python benchmark.py --word-language-model` (benchmarks/word_language_model.py)
trains it with LSTM, GRU and LLTM side by side.
"""

import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import lltm_ffi

# --- The corpus (the example's data.py reads text files) ---------------------------------

SUCCESSORS = 3  # the words that mostly follow each word
FOLLOW = 0.8  # how often the next word is one of them


class Dictionary:
    def __init__(self, vocabulary):
        self.idx2word = [f"w{index}" for index in range(vocabulary)]

    def __len__(self):
        return len(self.idx2word)


class SyntheticCorpus:
    """train, valid and test token streams (int64) of one Markov chain,
    drawn from a generator seeded with `seed`."""

    def __init__(self, vocabulary, train_tokens, valid_tokens, test_tokens, seed=0):
        self.dictionary = Dictionary(vocabulary)
        generator = torch.Generator().manual_seed(seed)
        successors = torch.randint(vocabulary, (vocabulary, SUCCESSORS), generator=generator)
        zipf = 1.0 / torch.arange(1, vocabulary + 1, dtype=torch.float64)
        tokens = self._chain(train_tokens + valid_tokens + test_tokens, successors, zipf,
                             generator)
        self.train, self.valid, self.test = tokens.split([train_tokens, valid_tokens,
                                                          test_tokens])

    @staticmethod
    def _chain(count, successors, zipf, generator):
        follows = (torch.rand(count, generator=generator) < FOLLOW).tolist()
        choices = torch.randint(SUCCESSORS, (count,), generator=generator).tolist()
        drawn = torch.multinomial(zipf, count, replacement=True, generator=generator).tolist()
        table = successors.tolist()
        tokens, word = [], drawn[0]
        for follow, choice, other in zip(follows, choices, drawn):
            word = table[word][choice] if follow else other
            tokens.append(word)
        return torch.tensor(tokens, dtype=torch.int64)


# --- model.py -----------------------------------------------------------------------------

class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        if rnn_type in ['LSTM', 'GRU']:
            self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        elif rnn_type == 'LLTM':
            self.rnn = lltm_ffi.LLTMSequence(ninp, nhid, nlayers, dropout=dropout)
        else:
            try:
                nonlinearity = {'RNN_TANH': 'tanh', 'RNN_RELU': 'relu'}[rnn_type]
            except KeyError as e:
                raise ValueError("An invalid option for `--model` was supplied, options are "
                                 "['LSTM', 'GRU', 'RNN_TANH' or 'RNN_RELU']") from e
            self.rnn = nn.RNN(ninp, nhid, nlayers, nonlinearity=nonlinearity, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)

        # Optionally tie the decoder's weights to the encoder's (Press & Wolf 2016).
        if tie_weights:
            if nhid != ninp:
                raise ValueError('When using the tied flag, nhid must be equal to emsize')
            self.decoder.weight = self.encoder.weight

        self.init_weights()

        self.rnn_type = rnn_type
        self.nhid = nhid
        self.nlayers = nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == 'LSTM':
            return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                    weight.new_zeros(self.nlayers, bsz, self.nhid))
        else:
            return weight.new_zeros(self.nlayers, bsz, self.nhid)


# --- main.py ------------------------------------------------------------------------------

# What main.py lets torch.load's default weights_only=True rebuild: the
# example's own list for its RNN models.
SAFE_GLOBALS = [RNNModel, nn.modules.dropout.Dropout, nn.modules.linear.Linear,
                nn.modules.rnn.GRU, nn.modules.rnn.LSTM, nn.modules.rnn.RNN,
                nn.modules.sparse.Embedding]
EVAL_BATCH_SIZE = 10


def batchify(data, bsz, device):
    """The token stream as bsz columns, each trained as an independent sequence."""
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    data = data.view(bsz, -1).t().contiguous()
    return data.to(device)


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    else:
        return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = source[i + 1:i + 1 + seq_len].view(-1)
    return data, target


def evaluate(model, data_source, bptt, criterion=nn.NLLLoss()):
    """The mean loss a token over data_source (batchify'd by EVAL_BATCH_SIZE)."""
    model.eval()
    total_loss = 0.
    hidden = model.init_hidden(EVAL_BATCH_SIZE)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, bptt):
            data, targets = get_batch(data_source, i, bptt)
            output, hidden = model(data, hidden)
            hidden = repackage_hidden(hidden)
            total_loss += len(data) * criterion(output, targets).item()
    return total_loss / (len(data_source) - 1)


def train_batch(model, data, targets, hidden, lr, clip, criterion=nn.NLLLoss()):
    """One step of main.py's train(): (the loss, the hidden state to go on from)."""
    # Starting each batch, detach the hidden state from how it was previously produced.
    model.zero_grad()
    hidden = repackage_hidden(hidden)
    output, hidden = model(data, hidden)
    loss = criterion(output, targets)
    loss.backward()

    # `clip_grad_norm` helps prevent the exploding gradient problem in RNNs / LSTMs.
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)
    return loss.item(), hidden


def train(model, train_data, batch_size, bptt, lr, clip, max_batches=None, log_interval=0,
          epoch=1):
    """One epoch of main.py's train() (max_batches: its first batches
    only); returns the loss of each batch."""
    model.train()
    losses = []
    start_time = time.time()
    hidden = model.init_hidden(batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
        if max_batches is not None and batch >= max_batches:
            break
        data, targets = get_batch(train_data, i, bptt)
        loss, hidden = train_batch(model, data, targets, hidden, lr, clip)
        losses.append(loss)
        if log_interval and batch % log_interval == 0 and batch > 0:
            cur_loss = sum(losses[-log_interval:]) / log_interval
            elapsed = time.time() - start_time
            print(f"| epoch {epoch:3d} | {batch:5d}/{len(train_data) // bptt:5d} batches | "
                  f"lr {lr:02.2f} | ms/batch {elapsed * 1000 / log_interval:5.2f} | "
                  f"loss {cur_loss:5.2f} | ppl {math.exp(cur_loss):8.2f}")
            start_time = time.time()
    return losses


def save(model, path):
    with open(path, 'wb') as f:
        torch.save(model, f)


def load(path, device=None):
    """The whole saved model, by torch.load with its default weights_only=True."""
    with open(path, 'rb') as f:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            model = torch.load(f, map_location=device)
    # After load the rnn params are not a continuous chunk of memory; this
    # makes them one (only the torch RNNs have flatten_parameters in the example).
    if model.rnn_type in ['RNN_TANH', 'RNN_RELU', 'LSTM', 'GRU']:
        model.rnn.flatten_parameters()
    return model


def train_and_keep_the_best(model, corpus, args, device):
    """main.py's loop over epochs: the best model (by validation loss) saved
    to args.save, the learning rate divided by 4 when it does not improve.
    Returns the best validation loss."""
    train_data = batchify(corpus.train, args.batch_size, device)
    val_data = batchify(corpus.valid, EVAL_BATCH_SIZE, device)
    lr, best_val_loss = args.lr, None
    for epoch in range(1, args.epochs + 1):
        epoch_start_time = time.time()
        train(model, train_data, args.batch_size, args.bptt, lr, args.clip,
              max_batches=args.max_batches, log_interval=args.log_interval, epoch=epoch)
        val_loss = evaluate(model, val_data, args.bptt)
        print('-' * 89)
        print(f"| end of epoch {epoch:3d} | time: {time.time() - epoch_start_time:5.2f}s | "
              f"valid loss {val_loss:5.2f} | valid ppl {math.exp(val_loss):8.2f}")
        print('-' * 89)
        if not best_val_loss or val_loss < best_val_loss:
            save(model, args.save)
            best_val_loss = val_loss
        else:
            lr /= 4.0
    return best_val_loss


# --- generate.py --------------------------------------------------------------------------

def generate(model, corpus, words, device, temperature=1.0, seed=1111):
    """generate.py's sampling loop: `words` words, each drawn from the
    model's distribution given the words before it."""
    torch.manual_seed(seed)
    model.eval()
    ntokens = len(corpus.dictionary)
    hidden = model.init_hidden(1)
    input = torch.randint(ntokens, (1, 1), dtype=torch.long).to(device)
    generated = []
    with torch.no_grad():  # no tracking history
        for _ in range(words):
            output, hidden = model(input, hidden)
            word_weights = output.squeeze().div(temperature).exp().cpu()
            word_idx = torch.multinomial(word_weights, 1)[0]
            input.fill_(word_idx)
            generated.append(corpus.dictionary.idx2word[word_idx])
    return generated


def build_parser():
    parser = argparse.ArgumentParser(
        description="pytorch/examples' word language model on a synthetic corpus")
    parser.add_argument('--model', type=str, default='LLTM',
                        help='type of network (RNN_TANH, RNN_RELU, LSTM, GRU, LLTM)')
    parser.add_argument('--vocabulary', type=int, default=10000, help='words in the corpus')
    parser.add_argument('--tokens', type=int, default=200000, help='tokens of training data')
    parser.add_argument('--emsize', type=int, default=200, help='size of word embeddings')
    parser.add_argument('--nhid', type=int, default=200, help='number of hidden units per layer')
    parser.add_argument('--nlayers', type=int, default=2, help='number of layers')
    parser.add_argument('--lr', type=float, default=20, help='initial learning rate')
    parser.add_argument('--clip', type=float, default=0.25, help='gradient clipping')
    parser.add_argument('--epochs', type=int, default=6, help='upper epoch limit')
    parser.add_argument('--max-batches', type=int, default=None,
                        help='batches an epoch (default: all)')
    parser.add_argument('--batch_size', type=int, default=20, help='batch size')
    parser.add_argument('--bptt', type=int, default=35, help='sequence length')
    parser.add_argument('--dropout', type=float, default=0.2,
                        help='dropout applied to layers (0 = no dropout)')
    parser.add_argument('--tied', action='store_true',
                        help='tie the word embedding and softmax weights')
    parser.add_argument('--seed', type=int, default=1111, help='random seed')
    parser.add_argument('--log-interval', type=int, default=200, help='report interval')
    parser.add_argument('--save', type=str, default='model.pt',
                        help='path to save the final model')
    parser.add_argument('--words', type=int, default=40, help='number of words to generate')
    parser.add_argument('--accel', action='store_true', help='train on the accelerator')
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    torch.manual_seed(args.seed)
    device = (torch.accelerator.current_accelerator()
              if args.accel and torch.accelerator.is_available() else torch.device("cpu"))
    print("Using device:", device)
    corpus = SyntheticCorpus(args.vocabulary, args.tokens, args.tokens // 10, args.tokens // 10)
    ntokens = len(corpus.dictionary)
    model = RNNModel(args.model, ntokens, args.emsize, args.nhid, args.nlayers, args.dropout,
                     args.tied).to(device)
    try:
        train_and_keep_the_best(model, corpus, args, device)
    except KeyboardInterrupt:
        print('-' * 89)
        print('Exiting from training early')
    model = load(args.save, device)
    test_loss = evaluate(model, batchify(corpus.test, EVAL_BATCH_SIZE, device), args.bptt)
    print('=' * 89)
    print(f"| End of training | test loss {test_loss:5.2f} | test ppl {math.exp(test_loss):8.2f}")
    print('=' * 89)
    print(" ".join(generate(model, corpus, args.words, device, seed=args.seed)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
