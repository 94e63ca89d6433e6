"""The cluster row's tensor-core forward (cluster_mma_kernel.cu) alone, for
`make racecheck-tensor-cores`: the path table's shapes of it, float16 and
bfloat16, both directions, a forward under torch.inference_mode with
LLTM_CUBLAS=0, so that no cuBLAS kernel runs (compute-sanitizer's racecheck
aborts inside cuBLAS's 16-bit Hopper kernels, which the table test's own
products and the backward reach). The table test checks the results;
this run asserts the path and prints each case it ran.

    python3 scripts/race_tensor_cores.py [--steps N] [INDEX ...]

runs the shapes of those indices into SHAPES (all without any), so that
a run under racecheck, minutes a shape, can be split; --steps N runs each
at most N steps (the kernel alternates two buffers of the state from step
to step, so that 4 steps reach each step-to-step handover both ways and
the last step; racecheck's time grows with the steps: a case at 60 steps
of 768 took over 8 minutes on an H200)."""

import os
import sys

import torch

import lltm_ffi

# tests/test_paths.py's MMA_SHAPES: steps, batch, input features, state.
SHAPES = [(2, 1, 3, 257), (6, 17, 5, 300), (100, 16, 7, 512), (5, 33, 4, 500),
          (3, 33, 6, 513), (7, 26, 9, 650), (60, 22, 11, 768)]


def shapes_of(arguments):
    """The SHAPES the command line names (indices, all of them without any;
    --steps N caps their steps at N)."""
    most_steps = None
    if arguments[:1] == ["--steps"]:
        if len(arguments) < 2 or not arguments[1].isdigit() or int(arguments[1]) < 1:
            sys.exit("race_tensor_cores: --steps takes a whole number of at least 1")
        most_steps, arguments = int(arguments[1]), arguments[2:]
    try:
        chosen = [SHAPES[int(index)] for index in arguments] or SHAPES
    except (ValueError, IndexError):
        sys.exit(f"race_tensor_cores: the arguments are [--steps N] and indices from 0 to "
                 f"{len(SHAPES) - 1}, got {' '.join(arguments)}")
    return [(min(steps, most_steps or steps), *sizes) for steps, *sizes in chosen]


def main():
    chosen = shapes_of(sys.argv[1:])
    if not torch.cuda.is_available():
        sys.exit("race_tensor_cores: needs a CUDA device")
    os.environ["LLTM_CUBLAS"] = "0"  # read at each call
    generator = torch.Generator().manual_seed(0)
    for steps, batch, features, state in chosen:
        for dtype in (torch.float16, torch.bfloat16):
            for reverse in (False, True):
                def tensor(*size, scale=1.0):
                    return (torch.randn(*size, generator=generator) * scale).to("cuda", dtype)
                arguments = (tensor(steps, batch, features),
                             tensor(3 * state, state + features, scale=state ** -0.5),
                             tensor(3 * state), tensor(batch, state), tensor(batch, state))
                case = (f"{steps}x{batch}x{features}x{state} {str(dtype)[6:]} "
                        f"{'reverse' if reverse else 'forward'}")
                with torch.inference_mode():
                    path = lltm_ffi.recurrence_path(*arguments, reverse=reverse)
                    if path != "cluster":
                        sys.exit(f"race_tensor_cores: {case} takes {path}, not cluster")
                    outputs, _ = lltm_ffi.lltm_sequence(*arguments, reverse=reverse)
                torch.cuda.synchronize()
                if not torch.isfinite(outputs).all():
                    sys.exit(f"race_tensor_cores: {case} gave non-finite outputs")
                print(f"ran {case}", flush=True)


if __name__ == "__main__":
    main()
