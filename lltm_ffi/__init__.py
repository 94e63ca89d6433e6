"""lltm_ffi: the LLTM recurrent cell as Caffe-style CUDA kernels and C loops
behind a cffi shim, used from PyTorch through data_ptr() and the current stream.

    import lltm_ffi
    new_h, new_cell = lltm_ffi.lltm(input, weights, bias, old_h, old_cell)
    rnn = lltm_ffi.LLTM(input_features, state_size)
"""

from . import reference
from ._build_info import VERSION as __version__
from ._extension import CUDA_COMPILED, LLTMBuildError, LLTMError
from .function import LLTMFunction, lltm
from .module import LLTM

__all__ = ["CUDA_COMPILED", "LLTM", "LLTMBuildError", "LLTMError", "LLTMFunction",
           "lltm", "reference"]
