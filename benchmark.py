"""Times the LLTM cell: lltm_ffi against the pure-PyTorch reference and
torch.compile of it, after the PyTorch C++/CUDA extension tutorial's benchmark.

    python benchmark.py {py,ffi,compile} [-c] [-d] [-b B] [-f F] [-s S] [-r RUNS]
    Forward: 177.860/196.116 us | Backward 430.584/461.504 us

and one flag per other mode: --compare, --kernels, --overhead, --sequence,
--accuracy, --distributed, --sweep, --word-language-model, --cpu-sweep (see
--help and BENCHMARKS.md); --half or
--autocast (bf16 or fp16) runs --sequence and --accuracy in that precision.
Each mode is a module of the benchmarks package.
"""

import sys

from benchmarks.cli import main

if __name__ == "__main__":
    sys.exit(main())
