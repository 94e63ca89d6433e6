"""Where the CPU passes' BLAS is (torch-free: `make asan` runs this file to
hand the same library to the C checks).

The CPU passes take their matrix products from the OpenBLAS of the
scipy-openblas32 wheel where it is installed (include/lltm_blas.h); C loads
it on the first product that asks for it, from the path found here.

    python lltm_ffi/_blas.py     prints that path, or nothing without the wheel
"""

import importlib.util
from pathlib import Path

PACKAGE = "scipy_openblas32"


def library_path():
    """The path of the wheel's OpenBLAS, found without importing the package
    (which would load the library into the process's global namespace);
    None where the wheel is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "lib"
    found = sorted(folder.glob("libscipy_openblas*.so")) if folder.is_dir() else []
    return str(found[0]) if found else None


if __name__ == "__main__":
    print(library_path() or "")
