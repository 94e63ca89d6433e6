"""`python -m lltm_ffi`: the diagnostics of lltm_ffi.diagnostics;
`python -m lltm_ffi new-op NAME`: a new op's folders (lltm_ffi.scaffold)."""

import sys

if sys.argv[1:2] == ["new-op"]:
    from .scaffold import main

    sys.exit(main(sys.argv[2:]))
if sys.argv[1:]:
    from .scaffold import USAGE

    print(USAGE, file=sys.stderr)
    sys.exit(2)

from .diagnostics import main  # noqa: E402

sys.exit(main())
