"""--autocast: the pieces of an LLTM forward under bf16 autocast (the bf16
matrix product, the upcast of the gates, the float32 pass) next to the whole
forward, in GPU time by CUDA events."""

import torch
import torch.nn.functional as F

import lltm_ffi
from lltm_ffi.ops.lltm.cell import forward_pass

from . import harness
from .harness import Size

AUTOCAST_SIZES = (Size(256, 256, 512), Size(4096, 1024, 2048))
REPEATS = 100


def pieces(size, device):
    """{piece: function} of one forward at `size`, outside autograd."""
    inputs = harness.CellInputs.random(size, torch.float32, device)
    input, weights, bias, h, cell = (tensor.detach() for tensor in inputs.arguments())
    X16 = torch.cat((h, input), dim=1).bfloat16()
    weights16, bias16 = weights.bfloat16(), bias.bfloat16()
    gates16 = F.linear(X16, weights16, bias16)
    gates32 = gates16.float()

    def under_autocast():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return lltm_ffi.lltm(input, weights, bias, h, cell)

    return {
        "bf16 matrix product (F.linear)": lambda: F.linear(X16, weights16, bias16),
        "gates bf16 -> float32 (the cast)": lambda: gates16.float(),
        "float32 forward pass": lambda: forward_pass.run(gates32, cell),
        "whole forward under autocast": under_autocast,
        "whole forward, float32": lambda: lltm_ffi.lltm(input, weights, bias, h, cell),
    }


def run(args, device, dtype):
    rows = []
    with torch.no_grad():
        for size in AUTOCAST_SIZES:
            times = harness.cuda_event_microseconds(pieces(size, device), REPEATS)
            rows += [[str(size), name, f"{time:.1f}"] for name, time in times.items()]
    print(harness.report("The LLTM forward under bf16 autocast: where the GPU time goes",
                         device, torch.bfloat16,
                         f"GPU microseconds (CUDA events, median of {REPEATS} after warm-up, "
                         "the pieces taking turns), no autograd.",
                         harness.markdown_table(["size (BxFxS)", "piece", "us"], rows,
                                                text_columns=2)))
