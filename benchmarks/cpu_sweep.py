"""--cpu-sweep: lltm_sequence beside nn.LSTM and nn.GRU on the CPU, over the
sweep of sizes: states 128, 256, 512, 768 and 1024 (as many input
features), batches 1, 16 and 64, STEPS steps; float32 and bfloat16 (modules
and data in the dtype, the loss summed in float32); training (forward and
backward of the sum of every step's output) and inference (the forward
alone, under torch.inference_mode); on 1, 2 and all of torch's threads (as
many as torch.get_num_threads() said when the run began).

At each size the three take turns, run by run (harness.interleaved), after
a warm-up call each; microseconds per time step, median over the runs. A
size runs as many rounds of the three as fit in SIZE_SECONDS, MIN_RUNS to
MAX_RUNS: a shared host's bursts of other work move a median of a few runs
of a quick size by more than the differences measured. With -r, a size runs
that many times, or fewer, but MIN_RUNS at least, where they take longer
than ROUND_SECONDS (bfloat16's nn.LSTM and nn.GRU, on a CPU without
bfloat16 arithmetic). A size where lltm_sequence took RECHECK_RATIO of
nn.LSTM's time or more is timed again, the two alone taking turns for
RECHECK_SECONDS (with -r, as many runs again): the close calls, the
sizes whose few runs a burst of other work could tip either way, get the
longer measurement, and the table shows both ratios. Writes the table, with
lltm_sequence's time over nn.LSTM's, rewritten after each size so that a
run cut short keeps what it measured, and at the end a picture: time per
step against the state, one panel per dtype and mode, a line per model and
batch, at the most threads."""

import importlib.metadata
import os
import statistics
import time
from pathlib import Path

import torch

import lltm_ffi

from . import harness, precision

STATES = (128, 256, 512, 768, 1024)
BATCHES = (1, 16, 64)
# 16 steps: the whole sweep (1 and 2 threads, both dtypes and modes) runs in
# a few minutes on the 2-core development machine, where bfloat16's nn.LSTM
# and nn.GRU take most of it.
STEPS = 16
DTYPES = (torch.float32, torch.bfloat16)
MODES = ("training", "inference")
MODELS = ("lltm_sequence", "nn.LSTM", "nn.GRU")
SIZE_SECONDS = 0.5
MIN_RUNS = 3
MAX_RUNS = 50
ROUND_SECONDS = 20.0
RECHECK_RATIO = 0.9
RECHECK_SECONDS = 4.0
RECHECK_MAX_RUNS = 400
RECHECKED = ("lltm_sequence", "nn.LSTM")


def thread_counts(most):
    """1, 2 and `most` threads, each once, in that order."""
    return sorted({1, min(2, most), most})


def models(state, dtype):
    """{name: module} of one layer of `state` units taking as many features."""
    return {"lltm_sequence": lltm_ffi.LLTMSequence(state, state, dtype=dtype),
            "nn.LSTM": torch.nn.LSTM(state, state, dtype=dtype),
            "nn.GRU": torch.nn.GRU(state, state, dtype=dtype)}


def step_function(model, inputs, mode):
    """One timed call: a training step's forward and backward, or the
    forward alone under inference_mode."""
    if mode == "inference":
        def infer():
            with torch.inference_mode():
                model(inputs)
        return infer

    def train():
        precision.loss(model(inputs)[0]).backward()
    return train


def time_size(state, batch, dtype, mode, runs=None, names=MODELS, seconds=None,
              most_runs=None):
    """({model: median us per time step}, runs) at one size, the models
    `names` interleaved: `runs` of them (None: as many as fit in `seconds`,
    SIZE_SECONDS by default, up to most_runs, MAX_RUNS by default)."""
    inputs = torch.randn(STEPS, batch, state, dtype=dtype)
    functions = {name: step_function(model, inputs, mode)
                 for name, model in models(state, dtype).items() if name in names}
    started = time.perf_counter()
    harness.warm_up(lambda: [function() for function in functions.values()], 1)
    round_seconds = max(time.perf_counter() - started, 1e-9)
    if runs is None:
        runs = min(most_runs or MAX_RUNS,
                   max(MIN_RUNS, int((seconds or SIZE_SECONDS) / round_seconds)))
    elif round_seconds * runs > ROUND_SECONDS:
        runs = max(MIN_RUNS, int(ROUND_SECONDS / round_seconds))
    seconds = harness.interleaved(
        functions, runs, lambda function: harness.wall_clock(function, lambda: None)[1],
        label=f"{harness.dtype_name(dtype)} {mode} {state}x{batch}")
    return {name: harness.microseconds(statistics.median(values)) / STEPS
            for name, values in seconds.items()}, runs


def ratio(medians):
    """lltm_sequence's time over nn.LSTM's."""
    return medians["lltm_sequence"] / medians["nn.LSTM"]


def timed_and_rechecked(state, batch, dtype, mode, runs):
    """(runs, {model: us per step}, first) at one size: time_size's, and
    where lltm_sequence's ratio to nn.LSTM is RECHECK_RATIO or more, the
    two timed again (RECHECK_SECONDS; -r: `runs` again), their medians
    then the recheck's, runs the pair of counts and `first` the first
    ratio; else first is None."""
    medians, done = time_size(state, batch, dtype, mode, runs)
    if ratio(medians) < RECHECK_RATIO:
        return (done,), medians, None
    again, recheck_runs = time_size(state, batch, dtype, mode, runs, RECHECKED,
                                    RECHECK_SECONDS, RECHECK_MAX_RUNS)
    return (done, recheck_runs), {**medians, **again}, ratio(medians)


def sweep(runs, most_threads, measured=lambda results: None):
    """[(dtype, mode, threads, state, batch, runs, {model: us per step},
    first ratio)] (timed_and_rechecked's), handed to `measured` as it
    grows, after each size. Each size runs on every thread count before
    the next size starts, so that a run cut short has compared the sizes
    it reached at all of them."""
    results = []
    saved = torch.get_num_threads()
    try:
        for dtype in DTYPES:
            for mode in MODES:
                for state in STATES:
                    for batch in BATCHES:
                        for threads in thread_counts(most_threads):
                            torch.set_num_threads(threads)
                            done, medians, first = timed_and_rechecked(state, batch, dtype,
                                                                       mode, runs)
                            results.append((dtype, mode, threads, state, batch, done, medians,
                                            first))
                            measured(results)
                            harness.note(f"{harness.dtype_name(dtype)} {mode}, {threads} "
                                         f"threads, state {state}, batch {batch}: " + ", ".join(
                                             f"{name} {value:.1f}"
                                             for name, value in medians.items()))
    finally:
        torch.set_num_threads(saved)
    return results


def in_table_order(results):
    """`results` by dtype, mode, threads, state and batch."""
    return sorted(results, key=lambda result: (DTYPES.index(result[0]),
                                               MODES.index(result[1]), *result[2:5]))


def table(results):
    rows = []
    for dtype, mode, threads, state, batch, runs, medians, first in in_table_order(results):
        last = ratio(medians)
        rows.append([harness.dtype_name(dtype), mode, str(threads), str(state), str(batch),
                     " + ".join(map(str, runs)),
                     *(f"{medians[name]:.1f}" for name in reversed(MODELS)),
                     (f"**{last:.2f}**" if last > 1 else f"{last:.2f}")
                     + ("" if first is None else f" ({first:.2f})")])
    return harness.markdown_table(
        ["dtype", "mode", "threads", "state", "batch", "runs", "nn.GRU", "nn.LSTM",
         "lltm_sequence", "lltm_sequence / nn.LSTM"], rows, text_columns=2)


def summary(results):
    """Where lltm_sequence is slower than nn.LSTM, in a sentence."""
    ratios = [(ratio(medians), dtype, mode, threads, state, batch)
              for dtype, mode, threads, state, batch, _, medians, _ in results]
    slower = [slow for slow in ratios if slow[0] > 1]
    if not slower:
        return (f"lltm_sequence is faster than nn.LSTM at all {len(results)} sizes, and its "
                "largest ratio to nn.LSTM's time is "
                f"{max(slow[0] for slow in ratios):.2f}.")
    listed = "; ".join(f"{harness.dtype_name(dtype)} {mode}, {threads} "
                       f"thread{'s' if threads > 1 else ''}, state {state}, "
                       f"batch {batch}: {slowdown:.2f}"
                       for slowdown, dtype, mode, threads, state, batch in sorted(
                           slower, key=lambda slow: slow[0], reverse=True))
    return (f"lltm_sequence is slower than nn.LSTM at {len(slower)} of {len(results)} sizes "
            f"(bold in the table): {listed}.")


def write_chart(path, results, threads):
    """Time per step against the state, one panel per dtype and mode, a line
    per model and batch, at `threads` threads; False without matplotlib."""
    pyplot = harness.pyplot_or_none()
    if pyplot is None:
        return False
    figure, axes = pyplot.subplots(len(DTYPES), len(MODES), figsize=(12, 9), squeeze=False)
    colours = dict(zip(MODELS, ("tab:red", "tab:blue", "tab:green")))
    styles = dict(zip(BATCHES, ("o:", "s--", "^-")))
    for row, dtype in enumerate(DTYPES):
        for column, mode in enumerate(MODES):
            axis = axes[row][column]
            for name in MODELS:
                for batch in BATCHES:
                    points = [(state, medians[name])
                              for d, m, t, state, b, _, medians, _ in results
                              if (d, m, t, b) == (dtype, mode, threads, batch)]
                    if points:
                        axis.plot(*zip(*points), styles[batch], color=colours[name],
                                  label=f"{name}, batch {batch}")
            axis.set_xscale("log", base=2)
            axis.set_xticks(STATES, [str(state) for state in STATES])
            harness.label_log_axis(axis, "state (= input features)", "median us per time step",
                                   f"{harness.dtype_name(dtype)}, {mode}")
    axes[0][0].legend(fontsize="small", ncol=3)
    return harness.save_figure(
        pyplot, figure, path,
        f"LLTM over {STEPS} steps on the CPU, {harness.cpu_model()}, {threads} threads", dpi=110)


def blas_line():
    """What the CPU passes' products may take, for the report's header."""
    try:
        version = f"scipy-openblas32 {importlib.metadata.version('scipy-openblas32')}"
    except importlib.metadata.PackageNotFoundError:
        version = "no BLAS installed (scipy-openblas32): the own products only"
    setting = os.environ.get("LLTM_BLAS")
    return f"- lltm_sequence's products: {version}" + (
        f", LLTM_BLAS={setting}" if setting is not None else "")


def report(results, most, device, chart=None):
    """The markdown report of `results`, with `chart` (a path) shown."""
    paragraphs = [
        f"Microseconds per time step, median over the runs, of {STEPS} steps: a training step "
        "(forward and backward of the sum of every step's output, in float32) or the forward "
        "alone under torch.inference_mode; one layer, as many input features as states; the "
        "three models taking turns at each size. The last column is lltm_sequence's time over "
        "nn.LSTM's (oneDNN's), in bold where above 1. Where the first runs gave "
        f"{RECHECK_RATIO} or more, lltm_sequence and nn.LSTM were timed again, the two alone "
        "taking turns, for longer (the second count of runs): their columns are the second "
        "timing's, and the first ratio follows in brackets.",
        summary(results), table(results)]
    if chart is not None:
        paragraphs.append(f"![median us per time step against the state]({chart.name})")
    return harness.report(
        "LLTM on the CPU against nn.LSTM and nn.GRU, over the sweep of sizes", device,
        "float32 and bfloat16", *paragraphs,
        notes=[blas_line(), f"- threads: {', '.join(map(str, thread_counts(most)))} "
                            f"(torch.get_num_threads() was {most})"])


def run(args, device, dtype):
    most = torch.get_num_threads()
    output = args.output or Path("bench_out") / "cpu_sweep.md"
    output.parent.mkdir(parents=True, exist_ok=True)
    results = sweep(args.runs, most,
                    lambda results: output.write_text(report(results, most, device) + "\n"))
    chart = output.with_suffix(".png")
    if not write_chart(chart, results, most):
        chart = None
        harness.note("matplotlib is not importable: no chart written")
    text = report(results, most, device, chart)
    print(text)
    output.write_text(text + "\n")
    harness.note(f"wrote {output}" + (f" and {chart}" if chart else ""))
