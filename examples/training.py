"""What the demo's runs share, single-process (demo.py) and distributed
(distributed.py): the task, the model, one training step, the progress
line and the loss curve.

The task: read a sequence of random vectors and report, at the end, a squashed
running sum of their first feature. The LLTM has no forget gate, so its cell
state can carry the sum; the loss should fall by well over an order of magnitude.
"""

import sys

import torch

import lltm_ffi

# The task's sequences and the model, for the single-process and the
# --distributed runs alike.
SEQUENCE_STEPS, BATCH_SIZE, INPUT_FEATURES, STATE_SIZE = 20, 64, 8, 64


class SequenceRegressor(torch.nn.Module):
    """The demo's model: LLTMSequence over the whole sequence, then a linear
    readout of the last hidden state. Takes (steps, batch, features), or
    (batch, steps, features) with batch_first."""

    def __init__(self, input_features, state_size, batch_first=False, device=None, dtype=None):
        super().__init__()
        self.rnn = lltm_ffi.LLTMSequence(input_features, state_size, batch_first=batch_first,
                                         device=device, dtype=dtype)
        self.readout = torch.nn.Linear(state_size, 1, device=device, dtype=dtype)

    def forward(self, sequence):
        _, (h, _) = self.rnn(sequence)
        return self.readout(h[-1]).squeeze(1)


def task_targets(sequences, steps_dim):
    """The squashed running sum of the first feature over the steps, which
    are dimension `steps_dim` of `sequences`."""
    return torch.tanh(sequences[..., 0].sum(dim=steps_dim) / sequences.shape[steps_dim] ** 0.5)


def make_batch(steps, batch_size, input_features, device, generator):
    sequence = torch.randn(steps, batch_size, input_features, generator=generator).to(device)
    return sequence, task_targets(sequence, 0)


def training_step(model, optimizer, sequences, targets):
    """One optimizer step on the mean squared error; returns the loss."""
    loss = torch.nn.functional.mse_loss(model(sequences), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def best_device():
    if torch.cuda.is_available() and lltm_ffi.CUDA_COMPILED:
        return "cuda"
    return "cpu"


class Progress:
    """tqdm when it is installed, a plain updating line otherwise."""

    def __init__(self, total, start=0):
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        if not sys.stderr.isatty():  # a log file gets a line every tenth of the run
            tqdm = None
        self.bar = tqdm(total=total, initial=start, unit="step") if tqdm else None
        self.total = total
        self.done = start

    def update(self, loss):
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}")
        elif sys.stderr.isatty():
            print(f"\r  step {self.done}/{self.total}  loss {loss:.4f}", end="", file=sys.stderr,
                  flush=True)
        elif self.done % max(1, self.total // 10) == 0 or self.done == self.total:
            print(f"  step {self.done}/{self.total}  loss {loss:.4f}", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif sys.stderr.isatty():
            print(file=sys.stderr)


def mean_losses(losses, window=10):
    """(window, mean loss of the first `window` steps, of the last `window`):
    the demo's summary, less noisy than single steps."""
    window = min(window, len(losses))
    return window, sum(losses[:window]) / window, sum(losses[-window:]) / window


def save_plot(losses, path, resumed_at=None):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed, so no loss curve was written to {path} "
              f"(`make demo` installs it: requirements-demo.txt)")
        return
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(losses, linewidth=1, label="loss of each step")
    window, first, last = mean_losses(losses)
    for start, label, mean in ((0, "first", first), (len(losses) - window, "last", last)):
        axes.plot([start, start + window - 1], [mean, mean], linewidth=3,
                  label=f"mean of the {label} {window} steps: {mean:.4f}")
    if resumed_at is not None:
        axes.axvline(resumed_at, color="gray", linestyle=":", label=f"resumed at step {resumed_at}")
    axes.legend()
    axes.set_yscale("log")
    axes.set_xlabel("step")
    axes.set_ylabel("training loss (MSE)")
    axes.set_title("LLTM sequence model (lltm_ffi)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    print(f"loss curve written to {path}")
