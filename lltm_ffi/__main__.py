"""`python -m lltm_ffi`: the diagnostics of lltm_ffi.diagnostics."""

import sys

from .diagnostics import main

sys.exit(main())
