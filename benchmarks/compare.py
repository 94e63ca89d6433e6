"""--compare: py, ffi, compile and the floor cell taking turns, once each agrees
with the reference; a markdown report, also written to a file, and a chart."""

import contextlib
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from lltm_ffi import selfcheck

from . import harness
from .harness import Size

# --compare also times "floor", a cell that does no LLTM work, in the same runs.
FLOOR = "floor"
TIMED = harness.IMPLEMENTATIONS + (FLOOR,)
PASSES = ("forward", "backward")
RATIOS = (("ffi", "py"), ("ffi", "compile"), (FLOOR, "py"))

# Each size with its default runs on the CPU and on CUDA; None: not run there.
COMPARE_SIZES = (
    (Size(16, 32, 128), {"cpu": 200, "cuda": 200}),
    (Size(256, 256, 512), {"cpu": 50, "cuda": 200}),
    (Size(4096, 1024, 2048), {"cpu": None, "cuda": 50}),
)


@dataclass
class SizeResult:
    size: Size
    runs: int
    timings: dict  # implementation name -> harness.Timings; a failed torch.compile is absent

    def microseconds(self, name, pass_name, statistic=statistics.median):
        """NaN for an implementation that failed."""
        timings = self.timings.get(name)
        if timings is None:
            return math.nan
        return harness.microseconds(statistic(getattr(timings, pass_name)))


def default_runs_text(device_type):
    return "/".join(str(runs[device_type]) for _, runs in COMPARE_SIZES if runs[device_type])


def compare_sizes(device_type, runs):
    """[(Size, runs)] on this device; -r overrides every size's default."""
    return [(size, runs or defaults[device_type])
            for size, defaults in COMPARE_SIZES if defaults[device_type] is not None]


@contextlib.contextmanager
def tolerating_compile_failure(name, implementations, failures):
    """Drops the compiled implementation, and records why, when the block raises
    for it: torch.compile is the peer compared against, so its failure is
    reported, not fatal. Any other implementation's error goes through."""
    try:
        yield
    except Exception as error:
        if name != "compile":
            raise
        implementations.pop(name, None)
        first_line = str(error).strip().partition("\n")[0]
        failures[name] = f"{type(error).__name__}: {first_line}"
        harness.note(f"torch.compile of the reference failed; its column is marked failed:\n"
                     f"{type(error).__name__}: {error}")


def check_all_agree(implementations, failures, sizes, dtype, device):
    """Every implementation at every size, at full size, before anything is timed;
    exits (status 1) naming the first that disagrees."""
    for size, _ in sizes:
        harness.note(f"checking agreement with the reference at {size}...")
        for name, lltm in list(implementations.items()):
            with tolerating_compile_failure(name, implementations, failures):
                why = selfcheck.disagreement(size.batch, size.features, size.state, dtype,
                                             device, function=lltm)
                if why is not None:
                    sys.exit(f"benchmark.py: {name} disagrees with the reference: {why}")


def run(args, device, dtype):
    sizes = compare_sizes(device.type, args.runs)
    synchronize = harness.synchronizer(device)
    implementations, failures = {}, {}
    for name in harness.IMPLEMENTATIONS:
        with tolerating_compile_failure(name, implementations, failures):
            implementations[name] = harness.make_implementation(name)
    check_all_agree(implementations, failures, sizes, dtype, device)

    results = []
    for size, runs in sizes:
        if "compile" in implementations:
            # Each size compiles its own graphs. Dropping the previous ones keeps
            # torch.compile under its recompile limit, past which it runs eagerly.
            torch.compiler.reset()
        inputs = harness.CellInputs.random(size, dtype, device)
        harness.note(f"{size}: warming up, then {runs} runs of {', '.join(implementations)} "
                     f"and {FLOOR}...")
        for name, lltm in [*implementations.items(), (FLOOR, harness.floor_cell)]:
            with tolerating_compile_failure(name, implementations, failures):
                harness.warm_up_cell(name, lltm, inputs, synchronize)
        cells = {**implementations, FLOOR: harness.floor_cell}
        results.append(SizeResult(size, runs, harness.time_cells(cells, inputs, runs,
                                                                 synchronize, str(size))))

    output = args.output or Path("bench_out") / f"compare_{device.type}.md"
    output.parent.mkdir(parents=True, exist_ok=True)
    plot = output.with_suffix(".png")
    if not write_plot(results, plot, device, dtype):
        plot = None
        harness.note("matplotlib is not importable: no plot written")
    text = compare_report(results, failures, device, dtype, plot)
    print(text)
    output.write_text(text + "\n")
    harness.note(f"wrote {output}" + (f" and {plot}" if plot else ""))


def number(value, decimals):
    return "failed" if math.isnan(value) else f"{value:.{decimals}f}"


def timing_rows(results):
    for result in results:
        for name in TIMED:
            yield [str(result.size), name, str(result.runs),
                   *(number(result.microseconds(name, pass_name, statistic), 1)
                     for pass_name in PASSES for statistic in (statistics.median, min))]


def ratio_rows(results):
    for result in results:
        yield [str(result.size), *(number(result.microseconds(numerator, pass_name)
                                          / result.microseconds(denominator, pass_name), 2)
                                   for numerator, denominator in RATIOS
                                   for pass_name in PASSES)]


def compare_report(results, failures, device, dtype, plot):
    notes = [
        "- runs: " + ", ".join(f"{result.runs} at {result.size}" for result in results)
        + f"; interleaved (each run times every implementation once, in a shuffled order), after "
        f"{harness.WARMUP_RUNS} warm-up runs each ({harness.COMPILE_WARMUP_RUNS} for compile)",
        f"- agreement: the outputs and five gradients of every implementation run are within "
        f"{selfcheck.TOLERANCES[dtype]:g} (relative) of the float64 reference at every size, "
        f"checked at full size by lltm_ffi.selfcheck.disagreement",
        *(f"- {name} FAILED, marked failed below: {failure}" for name, failure in failures.items()),
    ]
    paragraphs = [
        "Microseconds per call, each forward and each backward "
        "((new_h.sum() + new_C.sum()).backward()) timed alone with time.perf_counter"
        + (", between torch.cuda.synchronize() calls" if device.type == "cuda" else "") + ".",
        harness.markdown_table(["size (BxFxS)", "implementation", "runs", "forward median",
                                "forward min", "backward median", "backward min"],
                               timing_rows(results), text_columns=2),
        f"{FLOOR}: a cell that does no LLTM work (returns weights.sum() and bias.sum()), timed "
        "in the same runs: no implementation can take less here, and floor/py is the "
        "smallest ratio any implementation can reach on this machine.",
        "Ratios of medians (below 1: the first is faster):",
        harness.markdown_table(["size (BxFxS)"] + [f"{pass_name} {numerator}/{denominator}"
                                                   for numerator, denominator in RATIOS
                                                   for pass_name in PASSES],
                               ratio_rows(results)),
    ]
    if plot is not None:
        paragraphs.append(f"![median times]({plot.name})")
    return harness.report("LLTM cell: lltm_ffi (ffi) vs the PyTorch reference (py) vs "
                          "torch.compile (compile)", device, dtype, *paragraphs, notes=notes)


def write_plot(results, path, device, dtype):
    panels = {pass_name: {name: [result.microseconds(name, pass_name) for result in results]
                          for name in TIMED}
              for pass_name in PASSES}
    return harness.write_bar_chart(
        path, f"LLTM cell, {harness.device_description(device)}, {harness.dtype_name(dtype)}",
        [str(result.size) for result in results], panels, "batch x features x state",
        "median time (us)")
