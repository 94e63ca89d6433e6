"""--sweep: lltm_sequence on each of its paths beside nn.GRU and nn.LSTM over
a grid of sizes, in strict float32 and under bfloat16 autocast, training and
inference: the measurements that place each path, and the cliffs at states
off the 128-wide tiles.

Each size's points are timed once: every implementation takes turns, run
by run, a few runs (as many as fit in POINT_SECONDS, MIN_RUNS to MAX_RUNS)
after WARMUP_CALLS untimed calls. A run is a burst of back-to-back calls,
as many for each implementation (as many as the fastest one's last
BURST_SECONDS, at most MAX_BURST), after one untimed call of the same,
begun on an idle device and timed by CUDA events on a GPU: a loop's time
per call, the host's work for a call overlapping the device's for the one
before, as in training; the medians, per call and time step. lltm_sequence's paths are forced by the
environment variables its passes read at each call (LLTM_PATH), set around
each call and restored after. The markdown table and a JSON of every figure
are rewritten after each point, so that a run cut short keeps what it
measured; the chart is drawn at the end. Each state off a multiple of 128
brings that multiple into the sweep, as a point of its own and into the
off point's runs (NEXT_TILE), for its cliff ratio: two sizes timed in the
same runs, so that the drift of the host and device between points does
not enter it. A cliff ratio past CLIFF_RECHECK is timed again, the two
alone for CLIFF_RUNS runs, and that second figure is the point's cliff."""

import contextlib
import json
import math
import os
import re
import statistics
import time
from collections import namedtuple
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence

import lltm_ffi

from . import harness, precision as precisions, sequence

# lltm_sequence's variants: the environment each call runs in. Each of the
# plan's GPU rows forced (LLTM_PATH, src/plan.c), where it can take the call,
# beside the plan's own choice, with and without its padding of the state.
VARIANTS = {
    "default": {},
    "cluster": {"LLTM_PATH": "cluster"},
    "persistent": {"LLTM_PATH": "persistent"},
    "cublas": {"LLTM_PATH": "cublas"},
    "steps": {"LLTM_PATH": "steps"},
    "LLTM_PAD=0": {"LLTM_PAD": "0"},
}
# Only the GPU passes read them: on the CPU the default alone is timed.
CPU_VARIANTS = ("default",)
PEERS = ("nn.GRU", "nn.LSTM")
# At a state off the multiples of 128, lltm_sequence as planned at the next
# multiple, timed in the same runs: the cliff's denominator.
NEXT_TILE = "default at the next multiple of 128"
PRECISIONS = (precisions.Precision.full(torch.float32),
              precisions.Precision("autocast", torch.float32, torch.bfloat16))
MODES = ("training", "inference")

TILE = 128
GPU_STATES = (100, 200, 256, 300, 500, 512, 650, 768, 1000, 1024, 1500)
GPU_BATCHES = (1, 16, 64)
GPU_STEPS = (64,)
CPU_STATES = (32, 100)
CPU_BATCHES = (1, 8)
CPU_STEPS = (16,)
# Series the GPU's default grid adds, (steps, batch, layers, packed) with
# the states they take (None: every state of the sweep): long sequences,
# pytorch/examples' word_language_model (35 steps of 20 rows, two layers,
# its small and medium sizes), one layer of its 20 rows at 64 steps about
# the states from which the plan gives float32 training of more than 16
# rows the cuBLAS loop rather than the persistent kernels, and packed
# batches of 16 and 64 sequences (lengths from the steps down to a quarter
# of them), which the plan gives the cuBLAS loop or, small, the step
# kernels.
PACKED_STATES = (100, 200, 256, 512, 1024)
GPU_EXTRA_SERIES = (((1024, 16, 1, False), None), ((35, 20, 2, False), (200, 650)),
                    ((64, 20, 1, False), (300, 512, 650)),
                    ((64, 16, 1, True), PACKED_STATES), ((64, 64, 1, True), PACKED_STATES))
# The series the chart draws, where the sweep has it.
CHART_SERIES = (64, 16, 1, False)

# A pass through cuBLAS is recorded as a CUDA graph on its second call and
# replayed from the third, the first timed.
WARMUP_CALLS = 2
# Host-paced points (64 steps of a few rows) move from run to run: with 4
# runs a point, the default and LLTM_PAD=0 columns, the same code where the
# state is not padded, read 5.5 and 4.7 us a step at 64x16x300x300 under
# bfloat16 autocast, inference (H200). At 0.6 s a point the H200 sweep
# takes 240 s, a median of 12 runs a point.
POINT_SECONDS = 0.6
MIN_RUNS = 5
MAX_RUNS = 20
BURST_SECONDS = 0.002
MAX_BURST = 16
# An implementation whose warm-up call takes longer is not timed at that
# point: at 1024 steps that is several times cuDNN's time at any size swept.
SLOW_CALL_SECONDS = 1.0
# A few runs of nine implementations leave a cliff ratio noisy at
# host-paced points: the default and LLTM_PAD=0 columns, the same code
# where the state is not padded, differed by 0.84 to 1.10 times at the
# extremes of the H200 sweep. A ratio past CLIFF_RECHECK is timed again,
# the default at the two states taking turns alone, CLIFF_RUNS runs.
CLIFF_RECHECK = 1.10
CLIFF_RUNS = 40

@dataclass(frozen=True)
class Shape:
    """`steps` of `batch` rows, features = state, `layers` stacked; packed:
    the batch's sequences of lengths from `steps` down to a quarter of it,
    as a PackedSequence."""
    steps: int
    batch: int
    layers: int
    state: int
    packed: bool = False

    def __str__(self):
        packed = " packed" if self.packed else ""
        return f"{self.steps}x{self.batch}x{self.state}x{self.state}{packed}"

    def lengths(self):
        """The packed sequences' lengths, longest first."""
        return torch.linspace(self.steps, max(1, self.steps // 4), self.batch).long()


@dataclass
class Point:
    """One shape in one precision and mode: microseconds per time step
    (median) by implementation, the path each lltm variant ran, and why any
    implementation was not timed."""
    shape: Shape
    precision: str
    mode: str
    runs: int = 0
    calls: int = 0  # the calls of each run's burst, for every implementation
    times: dict = field(default_factory=dict)
    paths: dict = field(default_factory=dict)
    failures: dict = field(default_factory=dict)
    # The cliff's second timing, where the first passed CLIFF_RECHECK:
    # {"runs": n, "default": us, NEXT_TILE: us}.
    cliff_check: dict = field(default_factory=dict)

    def label(self):
        layers = f", {self.shape.layers} layers" if self.shape.layers > 1 else ""
        return f"{self.shape}{layers} {self.precision} {self.mode}"

    @property
    def series(self):
        shape = self.shape
        return shape.steps, shape.batch, shape.layers, shape.packed, self.precision, self.mode

    def fastest(self):
        """(variant, us) of the fastest lltm variant; (None, nan) if none ran."""
        timed = [(us, name) for name, us in self.times.items() if name in VARIANTS]
        if not timed:
            return None, math.nan
        us, name = min(timed)
        return name, us

    def over_peers(self):
        """The fastest lltm variant's time over the lesser of nn.GRU's and nn.LSTM's."""
        peers = [self.times[name] for name in PEERS if name in self.times]
        return self.fastest()[1] / min(peers) if peers else math.nan


def next_tile(state):
    return -(-state // TILE) * TILE


def grid(args, device):
    """The shapes to time, series by series, states ascending: the product of
    --steps, --batches and --states at --layers layers, packed with
    --packed (each the device's default where not given; the GPU's default
    grid adds GPU_EXTRA_SERIES), each state off a multiple of 128 with that
    multiple."""
    cuda = device.type == "cuda"
    states = args.states or (GPU_STATES if cuda else CPU_STATES)
    series = {(steps, batch, args.layers or 1, bool(args.packed)): states
              for steps in args.steps or (GPU_STEPS if cuda else CPU_STEPS)
              for batch in args.batches or (GPU_BATCHES if cuda else CPU_BATCHES)}
    if cuda and not (args.steps or args.batches or args.layers or args.packed):
        for key, chosen in GPU_EXTRA_SERIES:
            taken = [state for state in states if chosen is None or state in chosen]
            if taken:
                series.setdefault(key, taken)
    return [Shape(steps, batch, layers, state, packed)
            for (steps, batch, layers, packed), chosen in series.items()
            for state in sorted(set(chosen) | {next_tile(state) for state in chosen})]


def cliff_ratio(times):
    """The default's time over the default's at the next multiple of 128 in
    `times` (NEXT_TILE), or None where either is missing."""
    if "default" in times and NEXT_TILE in times:
        return times["default"] / times[NEXT_TILE]
    return None


def cliff_ratios(points):
    """{index in points: (cliff, first)}: the default's time over the
    default's at the next multiple of 128, timed in the same runs (the
    second timing's where there is one, with the first's), for each point
    whose state is off the tiles and where both were timed."""
    ratios = {}
    for index, point in enumerate(points):
        first = cliff_ratio(point.times)
        if point.shape.state % TILE and first is not None:
            checked = cliff_ratio(point.cliff_check)
            ratios[index] = (first, None) if checked is None else (checked, first)
    return ratios


def check_cliff(point, candidates, device):
    """Times the default at the point's state and at the next multiple of
    128 again, alone, where the first ratio passed CLIFF_RECHECK."""
    ratio = cliff_ratio(point.times)
    if ratio is None or ratio <= CLIFF_RECHECK:
        return
    check = Point(point.shape, point.precision, point.mode)
    time_point(check, {name: candidates[name] for name in ("default", NEXT_TILE)}, device,
               CLIFF_RUNS)
    if cliff_ratio(check.times) is not None:
        point.cliff_check = {"runs": check.runs, **check.times}


@contextlib.contextmanager
def environment(settings):
    """The variants' variables (LLTM_PATH, LLTM_PAD) as `settings` has them (absent: unset),
    restored after; settings None leaves the environment alone."""
    names = {name for variant in VARIANTS.values() for name in variant}
    saved = {name: os.environ.get(name) for name in names}
    if settings is not None:
        for name in names:
            os.environ.pop(name, None)
        os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


Candidate = namedtuple("Candidate", "settings function")


def step_function(model, inputs, precision, device, mode):
    """One call of `model` on `inputs`: a training step (sequence.training_step)
    or a forward under torch.inference_mode()."""
    def outputs():
        output = model(inputs)[0]
        return output.data if isinstance(output, PackedSequence) else output
    if mode == "training":
        return sequence.training_step(outputs, precision, device)

    def infer():
        with torch.inference_mode(), precision.forward(device):
            model(inputs)
    return infer


def planned_paths(model, inputs, precision, mode):
    """paths(): {direction: path} that a call of the LLTMSequence `model` on
    `inputs` takes in the environment of the moment, by the plan's own answer
    for its first layer (lltm_ffi.recurrence_path, on the layer's arguments
    in the precision's compute dtype; the layers above take the same,
    features = state): the forward and, for training, the backward."""
    def paths():
        with torch.inference_mode(mode == "inference"):
            dtype = precision.compute
            packed = isinstance(inputs, PackedSequence)
            batch = int(inputs.batch_sizes[0]) if packed else inputs.shape[1]
            state = model.weights_l0.new_zeros(batch, model.state_size, dtype=dtype)
            arguments = (inputs.to(dtype), model.weights_l0.to(dtype), model.bias_l0.to(dtype),
                         state, state)
            found = {"forward": lltm_ffi.recurrence_path(*arguments)}
            if mode == "training":
                found["backward"] = lltm_ffi.recurrence_path(*arguments, backward=True)
        return found
    return paths


def path_text(paths, mode):
    """forward/backward for training (one name where they agree), the forward for inference."""
    forward, backward = paths.get("forward", "?"), paths.get("backward", "?")
    return forward if mode == "inference" or forward == backward else f"{forward}/{backward}"


def measurer(device, calls):
    """measure(candidate): an untimed call, then a burst of `calls` calls
    of it in its environment, returning a function that gives the
    microseconds per call once the device is synchronised."""
    def on_gpu(candidate):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        with environment(candidate.settings):
            # An untimed call first: the calls of the implementations timed
            # just before leave this one's first call what a training loop
            # pays once (its tensors placed anew by the caching allocator, so
            # the cuBLAS loop records its graph again; the host's caches).
            candidate.function()
            # Each burst starts on an idle device: otherwise the work queued
            # before it would hide part of its host's time.
            torch.cuda.synchronize()
            start.record()
            for _ in range(calls):
                candidate.function()
            end.record()
        return lambda: start.elapsed_time(end) * 1e3 / calls

    def on_cpu(candidate):
        with environment(candidate.settings):
            candidate.function()  # untimed, as on a GPU
            seconds = harness.wall_clock(candidate.function, lambda: None, calls)[1]
        return lambda: harness.microseconds(seconds)
    return on_gpu if device.type == "cuda" else on_cpu


class TooSlow(Exception):
    pass


# lltm_sequence's ValueError where the path LLTM_PATH forces cannot take a
# call: its reason, without the call's sizes, is the same at every point.
REFUSAL = re.compile(r"LLTM_PATH=\S+ cannot take .*?\): (.*); unset LLTM_PATH")


def failure_text(error):
    """'kind: why' of an implementation left out of a point."""
    if isinstance(error, TooSlow):
        return f"too slow: {error}"
    refusal = REFUSAL.search(str(error)) if isinstance(error, ValueError) else None
    if refusal:
        return f"refused: {refusal.group(1)}"
    kind = "out of memory" if isinstance(error, torch.cuda.OutOfMemoryError) else "failed"
    return f"{kind}: {type(error).__name__}: {str(error).splitlines()[0]}"


def time_point(point, candidates, device, runs, paths_of=None):
    """Fills point: each candidate warmed up (a failure recorded, that one
    left out), each lltm variant's paths by paths_of() in its environment
    where given (a forward alone may take another path than a training
    step's), then the runs, interleaved."""
    synchronize = harness.synchronizer(device)
    working, seconds, paths = {}, {}, {}
    for name, candidate in candidates.items():
        try:
            with environment(candidate.settings):
                for _ in range(WARMUP_CALLS):
                    seconds[name] = harness.wall_clock(candidate.function, synchronize)[1]
                    if seconds[name] > SLOW_CALL_SECONDS:
                        raise TooSlow(f"{seconds[name]:.1f} s a call, past the sweep's "
                                      f"{SLOW_CALL_SECONDS} s")
                if paths_of and name in VARIANTS:
                    paths[name] = paths_of()
        except Exception as error:  # an implementation that cannot run this point is skipped
            seconds.pop(name, None)
            point.failures[name] = failure_text(error)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        working[name] = candidate
    # One burst length for every implementation, from the fastest one's
    # last warm-up call: a burst's time per call falls as it lengthens (its
    # first call starts on an idle device, the others overlap the host's
    # work with the device's), so a length of each one's own would favour
    # the ones given longer bursts.
    fastest = max(min(seconds.values(), default=1.0), 1e-9)
    point.calls = max(1, min(MAX_BURST, int(BURST_SECONDS / fastest)))
    # A run: each one's untimed call and its burst.
    burst_seconds = (point.calls + 1) * sum(seconds[name] for name in working)
    point.runs = runs or min(MAX_RUNS, max(MIN_RUNS, int(POINT_SECONDS / max(burst_seconds, 1e-9))))
    results = harness.interleaved(working, point.runs, measurer(device, point.calls))
    synchronize()
    for name, measured in results.items():
        point.times[name] = statistics.median(elapsed() for elapsed in measured) / point.shape.steps
        if name in paths:
            point.paths[name] = path_text(paths[name], point.mode)


MODULES = {"lltm": lltm_ffi.LLTMSequence, "nn.GRU": torch.nn.GRU, "nn.LSTM": torch.nn.LSTM}


def models_of(shape, device, names=tuple(MODULES)):
    """{name: model} of one shape, float32, for each of `names` (keys of
    MODULES), and its inputs."""
    configuration = {"num_layers": shape.layers, "device": device}
    models = {name: MODULES[name](shape.state, shape.state, **configuration) for name in names}
    inputs = torch.randn(shape.steps, shape.batch, shape.state, device=device)
    if shape.packed:
        inputs = pack_padded_sequence(inputs, shape.lengths())
    return models, inputs


def run(args, device, dtype):
    """The sweep in strict float32 (TF32 off; the caller's settings come back
    after) and under bfloat16 autocast."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        return _run(args, device)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _run(args, device):
    torch.manual_seed(0)
    shapes = grid(args, device)
    cuda = device.type == "cuda"
    variants = (VARIANTS if cuda
                else {name: VARIANTS[name] for name in CPU_VARIANTS})
    output = args.output or Path("bench_out") / f"sweep_{device.type}.md"
    output.parent.mkdir(parents=True, exist_ok=True)
    total = len(shapes) * len(PRECISIONS) * len(MODES)
    harness.note(f"sweep: {total} points ({len(shapes)} shapes x {len(PRECISIONS)} precisions x "
                 f"{len(MODES)} modes); {output} and its JSON rewritten after each")
    points, started = [], time.perf_counter()
    for shape in shapes:
        models, inputs = models_of(shape, device)
        tiled = (models_of(replace(shape, state=next_tile(shape.state)), device, ("lltm",))
                 if shape.state % TILE else None)
        for precision in PRECISIONS:
            for mode in MODES:
                candidates = {name: Candidate(settings, step_function(
                                  models["lltm"], inputs, precision, device, mode))
                              for name, settings in variants.items()}
                candidates.update({name: Candidate(None, step_function(
                                       models[name], inputs, precision, device, mode))
                                   for name in PEERS})
                if tiled:
                    candidates[NEXT_TILE] = Candidate(VARIANTS["default"], step_function(
                        tiled[0]["lltm"], tiled[1], precision, device, mode))
                point = Point(shape, precision.name, mode)
                time_point(point, candidates, device, args.runs,
                           planned_paths(models["lltm"], inputs, precision, mode) if cuda else None)
                check_cliff(point, candidates, device)
                points.append(point)
                elapsed = time.perf_counter() - started
                write(output, points, total, variants, device, elapsed)
                name, fastest = point.fastest()
                peers = ", ".join(f"{peer} {point.times.get(peer, math.nan):.1f}" for peer in PEERS)
                harness.note(f"[{len(points)}/{total}] {point.label()}: lltm {fastest:.1f} "
                             f"us/step ({name}), {peers}; "
                             f"{point.runs} runs; {elapsed:.0f} s")
        del models, inputs, tiled
    chart = output.with_suffix(".png")
    if not draw(chart, points, variants, device):
        chart = False
        harness.note("matplotlib is not importable: no chart drawn")
    text = write(output, points, total, variants, device, time.perf_counter() - started, chart)
    print(text)
    harness.note(f"wrote {output}, {output.with_suffix('.json')}"
                 + (f" and {chart}" if chart else ""))


def write(output, points, total, variants, device, seconds, chart=None):
    """The report (and its JSON beside it) of the points so far; its text.
    chart: the picture's path once drawn, False where it could not be."""
    cliffs = cliff_ratios(points)
    notes = [f"- points: {len(points)} of {total}, in {seconds:.0f} s"]
    if chart is False:
        notes.append("- chart: none drawn, matplotlib is not importable")
    paragraphs = [describe(device),
                  harness.markdown_table(
                      ["T x B x F x S", "layers", "precision", "mode", *variants, *PEERS,
                       "fastest lltm", "lltm / best peer", "cliff"],
                      [row(point, variants, cliffs.get(index))
                       for index, point in enumerate(points)], text_columns=4)]
    if chart:  # a Path once drawn
        paragraphs.append(f"![microseconds per time step against the state]({chart.name})")
    text = harness.report("lltm_sequence's paths, nn.GRU and nn.LSTM over a sweep of sizes",
                          device, "float32 (strict) and bfloat16 autocast", *paragraphs,
                          notes=notes + failure_notes(points))
    output.write_text(text + "\n")
    record = {"device": harness.device_description(device), "torch": torch.__version__,
              "lltm_ffi": lltm_ffi.__version__, "command": harness.command_line(),
              "unit": "microseconds per time step, median", "variants": variants,
              "complete": len(points) == total, "seconds": round(seconds, 1),
              "points": [{**asdict(point), "fastest": point.fastest()[0],
                          "lltm_over_peers": finite(point.over_peers()),
                          "cliff": cliffs.get(index, (None,))[0]}
                         for index, point in enumerate(points)]}
    output.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    return text


def row(point, variants, cliff):
    """The table's row of `point`: each time with its path, or why there is none."""
    cells = []
    for name in (*variants, *PEERS):
        if name in point.times:
            path = point.paths.get(name)
            cells.append(f"{point.times[name]:.1f}" + (f" {path}" if path else ""))
        else:
            cells.append(point.failures.get(name, "–").split(":")[0])
    cliff, first = cliff or (None, None)
    cliff_text = ratio_text(cliff) + (f" ({ratio_text(first)})" if first is not None else "")
    return [str(point.shape), str(point.shape.layers), point.precision, point.mode, *cells,
            point.fastest()[0] or "–", ratio_text(point.over_peers()), cliff_text]


def failure_notes(points):
    """A line for each implementation and reason that left it out of points."""
    failed = {}
    for point in points:
        for name, failure in point.failures.items():
            failed.setdefault((name, failure), []).append(point.label())
    notes = []
    for (name, failure), labels in failed.items():
        kind, why = failure.split(": ", 1)
        more = f" and {len(labels) - 3} more" if len(labels) > 3 else ""
        notes.append(f"- {name} {kind} at {len(labels)} point{'s' if len(labels) > 1 else ''} "
                     f"({', '.join(labels[:3])}{more}): {why}")
    return notes


def finite(value):
    """value, or None for NaN (which JSON has no word for)."""
    return None if value is None or math.isnan(value) else value


def ratio_text(value):
    return "–" if finite(value) is None else f"{value:.2f}"


def describe(device):
    """The report's first paragraph: what each figure is."""
    cuda = device.type == "cuda"
    timer = ("CUDA events around a burst of back-to-back calls, begun on an idle device "
             "after an untimed call"
             if cuda else "the wall clock around a burst of back-to-back calls")
    forced = ("; cluster, persistent, cublas, steps: that row of the plan forced "
              "(LLTM_PATH), where it takes the call; LLTM_PAD=0: the state as given, never "
              "padded" if cuda else "")
    paths = (" Beside each lltm time, the path its recurrence takes, by the plan's answer "
             "(lltm_ffi.recurrence_path; training: forward/backward where they differ): a row "
             "of src/plan.c's table, cluster, persistent, cublas or steps." if cuda else "")
    return (
        f"Microseconds per time step, the median of a few interleaved runs ({timer}, as "
        f"many for each as the fastest one's last {BURST_SECONDS * 1e3:g} ms, at most "
        f"{MAX_BURST}; after "
        f"{WARMUP_CALLS} untimed calls): lltm_sequence (LLTMSequence) on each path the "
        f"environment forces at each call (default: its own choice{forced}), beside "
        f"{'cuDNN' if cuda else 'PyTorch'}'s nn.GRU and nn.LSTM of the same size: features = "
        "state, T steps of B rows. training: the forward and the backward of the sum of every "
        "step's output; inference: the forward under torch.inference_mode(). float32 is strict "
        f"(TF32 off for cuBLAS and cuDNN); bfloat16 autocast: {PRECISIONS[1].describe()}."
        f"{paths} fastest lltm: the variant of the least time; lltm / best peer: its time over "
        "the lesser of nn.GRU's and nn.LSTM's; cliff: for a state off the multiples of 128, the "
        "default's time over the default's at the next multiple (T, B, precision and mode "
        f"alike), timed in the same runs; where that passes {CLIFF_RECHECK:.2f}, the two are "
        f"timed again alone, {CLIFF_RUNS} runs, and the cliff is that second figure (the first "
        "in brackets).")


def draw(path, points, variants, device):
    """Time per step against the state, one panel per precision and mode, at
    CHART_SERIES (or the sweep's first series without it); False without
    matplotlib."""
    series = {point.series[:4] for point in points}
    chosen = CHART_SERIES if CHART_SERIES in series else points[0].series[:4]
    states = sorted({point.shape.state for point in points if point.series[:4] == chosen})
    panels = {}
    for precision in PRECISIONS:
        for mode in MODES:
            at = {point.shape.state: point for point in points
                  if point.series == (*chosen, precision.name, mode)}
            lines = {"lltm_ffi (default)": [at[state].times.get("default", math.nan)
                                            for state in states]}
            if len(variants) > 1:
                lines["lltm_ffi (fastest path)"] = [at[state].fastest()[1] for state in states]
            for peer in PEERS:
                lines[peer] = [at[state].times.get(peer, math.nan) for state in states]
            panels[f"{precision.name}, {mode}"] = lines
    steps, batch, layers, packed = chosen
    return harness.write_bar_chart(
        path, f"T={steps}, B={batch}{' packed' if packed else ''}, "
              f"{layers} layer{'s' if layers > 1 else ''}, "
              f"{harness.device_description(device)}",
        [str(state) for state in states], panels, "state = features", "median us per time step")
