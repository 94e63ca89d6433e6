"""The one-script check: lltm_ffi against the pure-PyTorch reference, forward
and backward, on the CPU and (when one is present) the GPU, in float32 and
float64, plus float64 gradcheck. Prints a summary; exits 1 on any failure.
Its random inputs are seeded as the pytest suite's are (lltm_ffi.testing):
the same every run, or LLTM_TEST_SEED's.

    python test.py
"""

import sys

import torch

import lltm_ffi
from lltm_ffi import selfcheck
from lltm_ffi.testing import seed_for

# (batch, input_features, state_size): the tutorial's size, batch 1, odd sizes,
# state sizes that are not a multiple of the CUDA block size, large features.
SHAPES = [(16, 32, 128), (1, 3, 5), (3, 5, 7), (13, 17, 257), (4, 2048, 33), (64, 96, 1000)]


def devices():
    found = ["cpu"]
    if torch.cuda.is_available() and lltm_ffi.CUDA_COMPILED:
        found.append("cuda")
    return found


def check_agreement(device, dtype):
    failures = [selfcheck.disagreement(*shape, dtype, device,
                                       seed=seed_for(f"test.py {shape} {dtype} {device}"))
                for shape in SHAPES]
    return [failure for failure in failures if failure]


def check_gradcheck(device):
    generator = torch.Generator().manual_seed(seed_for(f"test.py gradcheck {device}"))
    inputs = selfcheck.random_inputs(3, 5, 7, torch.float64, device, generator)
    inputs = [tensor.requires_grad_(True) for tensor in inputs]
    try:
        torch.autograd.gradcheck(lltm_ffi.lltm, inputs)
    except Exception as error:  # gradcheck raises GradcheckError with the Jacobians
        return [f"gradcheck: {error}".splitlines()[0]]
    return []


def main():
    print(f"lltm_ffi {lltm_ffi.__version__}, torch {torch.__version__}, "
          f"CUDA compiled in: {lltm_ffi.CUDA_COMPILED}, GPU: "
          f"{torch.cuda.get_device_name() if 'cuda' in devices() else 'none'}")
    if torch.cuda.is_available() and not lltm_ffi.CUDA_COMPILED:
        print("warning: a GPU is present but the module was built without CUDA; "
              "run `make clean && make` with nvcc on PATH")
    rows = []
    for device in devices():
        for dtype in (torch.float32, torch.float64):
            rows.append((f"{device} {dtype} forward+backward", check_agreement(device, dtype)))
        rows.append((f"{device} torch.float64 gradcheck", check_gradcheck(device)))

    failed = 0
    for label, failures in rows:
        print(f"{'FAIL' if failures else 'ok  '}  {label}")
        for failure in failures:
            print(f"      {failure}")
        failed += bool(failures)
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
