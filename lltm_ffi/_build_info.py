"""What the compiled module is built from.

build_ffi.py compiles the version and the source hash into the module; at
import the package recomputes them and refuses a module built from other
sources. This file imports nothing from the package, so build_ffi.py can load
it before the module exists.
"""

import hashlib
from pathlib import Path

VERSION = "0.1.0"

# Everything that changes the compiled module when it changes.
SOURCE_PATTERNS = ("build_ffi.py", "Makefile", "include/*.h", "src/*.c", "src/*.h", "src/*.cu")


def source_files(root):
    root = Path(root)
    return sorted({path for pattern in SOURCE_PATTERNS for path in root.glob(pattern)})


def source_hash(root):
    """SHA-256 over the names and contents of the source files, or None when
    `root` holds none (an installed package without its sources)."""
    files = source_files(root)
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]
