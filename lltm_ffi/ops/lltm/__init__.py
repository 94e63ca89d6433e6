"""The LLTM: the cell (lltm, LLTM), the whole sequence (lltm_sequence), its
stacked and bidirectional layers (lltm_layers, LLTMSequence), their passes
on the CPU (src/cpu/) and on the GPU (src/lltm_kernel.cu, src/cuda/,
src/cuda/recurrence/)."""

import torch

from ... import op, reference, selfcheck
from .cell import LLTMFunction, lltm
from .layers import lltm_layers
from .modules import LLTM, LLTMSequence
from .sequence import lltm_sequence, recurrence_path


@op.self_check("lltm")
def _cell_agrees(device, dtype):
    return selfcheck.disagreement(4, 8, 16, dtype, device)


@op.self_check("lltm_sequence")
def _sequence_agrees(device, dtype):
    """lltm_sequence's outputs and last state against a loop of the reference
    cell in float64, over 5 steps of 3 x 4 -> 6."""
    seed = selfcheck.DEFAULT_SEED
    generator = torch.Generator().manual_seed(seed)
    inputs = [(torch.rand(*shape, generator=generator, dtype=torch.float64) * 2 - 1)
              for shape in ((5, 3, 4), (18, 10), (18,), (3, 6), (3, 6))]
    outputs, (h_n, c_n) = lltm_sequence(*(tensor.to(device, dtype) for tensor in inputs))
    h, c, expected = inputs[3], inputs[4], []
    for step in inputs[0]:
        h, c = reference.lltm(step, *inputs[1:3], h, c)
        expected.append(h)
    for name, value, wanted in (("outputs", outputs, torch.stack(expected)), ("h_n", h_n, h),
                                ("c_n", c_n, c)):
        error = selfcheck.relative_error(value.cpu(), wanted)
        if not error <= selfcheck.TOLERANCES[dtype]:
            return (f"{name} has relative error {error:.3g}, tolerance "
                    f"{selfcheck.TOLERANCES[dtype]:g} ({device}; seed {seed})")
    return None

__all__ = ["LLTM", "LLTMFunction", "LLTMSequence", "lltm", "lltm_layers", "lltm_sequence",
           "recurrence_path"]
