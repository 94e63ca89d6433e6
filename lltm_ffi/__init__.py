"""lltm_ffi: the LLTM recurrent cell as Caffe-style CUDA kernels and C loops
behind a cffi shim, used from PyTorch through data_ptr() and the current stream.

    import lltm_ffi
    new_h, new_cell = lltm_ffi.lltm(input, weights, bias, old_h, old_cell)
    rnn = lltm_ffi.LLTM(input_features, state_size)
"""

import torch

from . import _extension, op, ops, reference
from ._build_info import VERSION as __version__
from .errors import LLTMBuildError, LLTMBuildWarning, LLTMError
# Each op's public names: one line an op.
from .ops.lltm import LLTM, LLTMFunction, LLTMSequence, lltm, lltm_layers, lltm_sequence
from .ops.roi_pool import RoIPool, roi_pool
from .ops.round_ste import round_ste

# A whole saved module (torch.save(module)) loads under torch.load's default
# weights_only=True, alone or inside a model whose other classes are allowed.
torch.serialization.add_safe_globals([LLTM, LLTMSequence, RoIPool])


def __getattr__(name):
    # CUDA_COMPILED asks the compiled module, so a missing or stale build
    # raises LLTMBuildError here rather than at import.
    if name == "CUDA_COMPILED":
        return _extension.cuda_compiled()
    raise AttributeError(f"module 'lltm_ffi' has no attribute {name!r}")


__all__ = ["CUDA_COMPILED", "LLTM", "LLTMBuildError", "LLTMBuildWarning", "LLTMError",
           "LLTMFunction", "LLTMSequence", "RoIPool", "lltm", "lltm_layers", "lltm_sequence",
           "op", "reference", "roi_pool", "round_ste"]
