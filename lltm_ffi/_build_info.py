"""What the compiled module is built from.

The module's sources are found, never listed: every C and CUDA file under
src/ (the shim, the LLTM's CPU and CUDA passes, each ported op's
src/ops/<op>/), but the C checks (test_*.c, which `make asan` builds). build_ffi.py compiles the
version and the hash of these sources into the module; at import the
package recomputes them and refuses a module built from other sources.
This file imports nothing from the package, so build_ffi.py can load it
before the module exists.
"""

import hashlib
from pathlib import Path

VERSION = "0.1.0"

# The folders whose .c and .cu files make the module, and those that hold
# the headers they include; "**" takes the folder and every folder in it.
SOURCE_FOLDERS = ("src/**",)
HEADER_FOLDERS = ("include", "src/**")
C_TEST_PREFIX = "test_"
# Everything else that changes the module when it changes.
BUILD_FILES = ("build_ffi.py",)


def module_sources(root, suffix):
    """The module's sources ending in `suffix` (".c" or ".cu"), sorted, as
    paths under `root`."""
    root = Path(root)
    return sorted(path for folder in SOURCE_FOLDERS for path in root.glob(f"{folder}/*{suffix}")
                  if not path.name.startswith(C_TEST_PREFIX))


def source_files(root):
    """Every file whose change changes the compiled module."""
    root = Path(root)
    headers = {path for folder in HEADER_FOLDERS for pattern in ("*.h", "*.cuh")
               for path in root.glob(f"{folder}/{pattern}")}
    build_files = {root / name for name in BUILD_FILES if (root / name).is_file()}
    return sorted({*module_sources(root, ".c"), *module_sources(root, ".cu"), *headers,
                   *build_files})


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
