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

def __getattr__(name):
    # CUDA_COMPILED asks the compiled module, so a missing or stale build
    # raises LLTMBuildError here rather than at import.
    if name == "CUDA_COMPILED":
        return _extension.cuda_compiled()
    raise AttributeError(f"module 'lltm_ffi' has no attribute {name!r}")


_OWN = ["CUDA_COMPILED", "LLTMBuildError", "LLTMBuildWarning", "LLTMError", "op", "reference"]
# Each op's public names: the __all__ of its folder, lltm_ffi/ops/<op>/__init__.py.
_taken = set(ops.PUBLIC) & {*globals(), *_OWN}
if _taken:
    raise ImportError(f"an op folder exports {sorted(_taken)}, a name the package itself uses")
globals().update(ops.PUBLIC)
__all__ = sorted([*_OWN, *ops.PUBLIC])

# A whole saved module of any op (torch.save(module)) loads under
# torch.load's default weights_only=True, alone or inside a model whose
# other classes are allowed.
torch.serialization.add_safe_globals(
    [value for value in ops.PUBLIC.values()
     if isinstance(value, type) and issubclass(value, torch.nn.Module)])
