"""--word-language-model: pytorch/examples' word language model
(examples/word_language_model.py) trained with nn.LSTM, nn.GRU and
LLTMSequence in turn, in one process, each from the same seed and on the
same batches: at the example's default size ("small": 2 layers of 200,
dropout 0.2) and at its medium one ("medium": 2 layers of 650, dropout
0.5), 35 steps of truncated backpropagation, batch 20, SGD at the
example's learning rate 20 with gradient clipping 0.25.

The corpus is the example's synthetic one with a vocabulary of 10000
words (wikitext-2 has about 33000: the decoder's share of a batch is
smaller here). Each model trains WARMUP_BATCHES untimed batches, then
--timed-batches timed ones; a batch's time is the wall-clock time of main.py's
whole training step (forward, backward, clipping, the update and the
loss's .item(), which waits for the device). Reported: the median
milliseconds a batch, the training loss (the mean over the last timed
batches, at most 20) and the validation loss after training (evaluate()
over VALID_TOKENS tokens, batch 10). Float32 is strict: no TF32 in cuBLAS
or cuDNN.
"""

import statistics
import time
from dataclasses import dataclass

import torch

from examples import word_language_model as model_script

from . import harness


@dataclass(frozen=True)
class Size:
    name: str
    emsize: int  # the embedding's width, the recurrent module's input
    nhid: int  # its state
    nlayers: int
    dropout: float
    bptt: int = 35
    batch_size: int = 20

    def __str__(self):
        return (f"{self.name} ({self.nlayers}x{self.nhid}, dropout {self.dropout:g}, "
                f"{self.bptt} steps, batch {self.batch_size})")


SIZES = (Size("small", 200, 200, 2, 0.2), Size("medium", 650, 650, 2, 0.5))
KINDS = {"LSTM": "nn.LSTM", "GRU": "nn.GRU", "LLTM": "LLTMSequence"}
VOCABULARY = 10000
VALID_TOKENS = 20000
WARMUP_BATCHES = 20
DEFAULT_BATCHES = {"cuda": 200, "cpu": 10}
LOSS_BATCHES = 20  # the last timed batches whose mean is the training loss
SEED, LR, CLIP = 1111, 20.0, 0.25


def train_and_time(kind, size, corpus, batches, device, dtype):
    """(milliseconds of each timed batch, the training loss, the validation
    loss) of the model with recurrent module `kind` at `size`."""
    torch.manual_seed(SEED)
    model = model_script.RNNModel(kind, VOCABULARY, size.emsize, size.nhid, size.nlayers,
                                  size.dropout).to(device=device, dtype=dtype)
    train_data = model_script.batchify(corpus.train, size.batch_size, device)
    synchronize = harness.synchronizer(device)
    model.train()
    hidden = model.init_hidden(size.batch_size)
    milliseconds, losses = [], []
    for batch in range(WARMUP_BATCHES + batches):
        data, targets = model_script.get_batch(train_data, batch * size.bptt, size.bptt)
        synchronize()
        start = time.perf_counter()
        loss, hidden = model_script.train_batch(model, data, targets, hidden, LR, CLIP)
        synchronize()
        if batch >= WARMUP_BATCHES:
            milliseconds.append((time.perf_counter() - start) * 1e3)
            losses.append(loss)
    valid_data = model_script.batchify(corpus.valid, model_script.EVAL_BATCH_SIZE, device)
    valid_loss = model_script.evaluate(model, valid_data, size.bptt)
    return milliseconds, statistics.fmean(losses[-LOSS_BATCHES:]), valid_loss


def run(args, device, dtype):
    batches = args.timed_batches or DEFAULT_BATCHES[device.type]
    tokens = max(size.bptt * size.batch_size for size in SIZES) * (WARMUP_BATCHES + batches) + 1
    corpus = model_script.SyntheticCorpus(VOCABULARY, tokens, VALID_TOKENS, 0, seed=SEED)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    rows = []
    try:
        for size in SIZES:
            for kind, name in KINDS.items():
                harness.note(f"{size.name}: {name}")
                milliseconds, train_loss, valid_loss = train_and_time(kind, size, corpus, batches,
                                                                      device, dtype)
                rows.append([size.name, name, f"{statistics.median(milliseconds):.2f}",
                             f"{train_loss:.3f}", f"{valid_loss:.3f}"])
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    table = harness.markdown_table(
        ["size", "recurrent module", "ms a batch (median)", "training loss", "validation loss"],
        rows, text_columns=2)
    sizes = "; ".join(str(size) for size in SIZES)
    print(harness.report(
        "pytorch/examples' word language model: nn.LSTM, nn.GRU and LLTMSequence", device, dtype,
        table, notes=[f"- sizes: {sizes}",
                      f"- corpus: synthetic, vocabulary {VOCABULARY}; {WARMUP_BATCHES} untimed "
                      f"batches, then {batches} timed; seed {SEED} for every model",
                      f"- training loss: the mean of the last {min(LOSS_BATCHES, batches)} timed "
                      f"batches; validation loss: over {VALID_TOKENS} tokens after training"]))
