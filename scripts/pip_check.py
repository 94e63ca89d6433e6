"""`make pip-check`'s last step: run by the pip-check venv's Python from
outside the checkout, it checks that the installed lltm_ffi (a CPU-only
build) is the one imported, that it computes, and that it says it has no CUDA.
Exits non-zero on any failure."""

import sys
from pathlib import Path

import torch

import lltm_ffi
from lltm_ffi import _extension, selfcheck

package = Path(lltm_ffi.__file__).resolve().parent
checkout = Path(__file__).resolve().parent.parent
if package.is_relative_to(checkout / "lltm_ffi"):
    sys.exit(f"pip-check: imported the checkout's lltm_ffi ({package}), not the installed one")
if lltm_ffi.CUDA_COMPILED:
    sys.exit("pip-check: LLTM_CUDA=0 should have built a CPU-only module")
lib, null = _extension.lib, _extension.ffi.NULL
if lib.lltm_round_forward(lib.LLTM_FLOAT32, 0, null, 4, null, null) != lib.LLTM_ERROR_NO_CUDA:
    sys.exit("pip-check: a CPU-only module's CUDA entry point did not refuse")

for dtype in (torch.float32, torch.float64):
    failure = selfcheck.disagreement(3, 5, 7, dtype, "cpu")
    if failure:
        sys.exit(f"pip-check: lltm: {failure}")
x = torch.tensor([0.2, 0.5, 0.7])
if not torch.equal(lltm_ffi.round_ste(x), torch.tensor([0.0, 1.0, 1.0])):
    sys.exit("pip-check: round_ste gave the wrong values")
print(f"pip-check ok: lltm_ffi {lltm_ffi.__version__} from {package} (CPU-only)")
