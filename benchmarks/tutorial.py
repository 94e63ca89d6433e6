"""The tutorial's benchmark: one implementation at one size, and its one line
of min/average microseconds."""

import statistics
import sys

from . import harness
from .harness import Size

DEFAULT_RUNS = 100  # the tutorial's


def run(args, device, dtype):
    default = harness.TUTORIAL_SIZE
    size = Size(args.batch or default.batch, args.features or default.features,
                args.state or default.state)
    name = args.implementation
    synchronize = harness.synchronizer(device)
    inputs = harness.CellInputs.random(size, dtype, device)
    try:
        implementation = harness.make_implementation(name)
        harness.warm_up_cell(name, implementation, inputs, synchronize)
    except Exception as error:
        if name != "compile":
            raise
        sys.exit(f"benchmark.py: torch.compile of the reference failed: "
                 f"{type(error).__name__}: {error}")
    timings = harness.time_cells({name: implementation}, inputs, args.runs or DEFAULT_RUNS,
                                 synchronize, f"{name} {size}")[name]
    print("Forward: {:.3f}/{:.3f} us | Backward {:.3f}/{:.3f} us".format(
        *(harness.microseconds(statistic(seconds))
          for seconds in (timings.forward, timings.backward)
          for statistic in (min, statistics.fmean))))
