"""`make pip-check`: pip's regular install path, CPU-only, checked from
outside the checkout. Exits non-zero on any failure.

    python scripts/pip_check.py

1. makes a fresh venv, build/pip-venv, that sees this Python's packages
   (torch, cffi, setuptools, pip), also when this Python is itself a venv:
   system_site_packages alone would reach only the base interpreter's;
2. `LLTM_CUDA=0 pip install --no-build-isolation --no-deps .` into it
   (no network);
3. runs this file again with --installed in that venv, from a directory
   outside the checkout, which checks that the installed lltm_ffi is the one
   imported, that it has its compiled module (a wheel without one would
   import, then fail at the first call), that it computes, and that it says
   it has no CUDA.
"""

import os
import shutil
import site
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent


def make_venv(environment):
    """A venv at `environment` that sees this interpreter's packages even when
    this interpreter is itself a venv, whose packages system_site_packages
    alone would not reach: a .pth in the venv's own site-packages names this
    interpreter's site-packages, after the venv's own and before the base
    interpreter's. Returns its python."""
    venv.create(environment, system_site_packages=True, with_pip=False, clear=True)
    python = Path(environment) / "bin" / "python"
    own_site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    (Path(own_site) / "parent_packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return str(python)


def install_and_check():
    environment = CHECKOUT / "build" / "pip-venv"
    shutil.rmtree(environment, ignore_errors=True)
    python = make_venv(environment)
    print(f"pip-check: LLTM_CUDA=0 pip install --no-build-isolation --no-deps . "
          f"into {environment}", flush=True)
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "."],
        cwd=CHECKOUT, env=dict(os.environ, LLTM_CUDA="0"))
    if install.returncode != 0:
        return "pip-check: pip install failed"
    with tempfile.TemporaryDirectory() as outside:
        check = subprocess.run([python, str(Path(__file__).resolve()), "--installed"], cwd=outside)
    return check.returncode


def check_installed():
    import torch

    import lltm_ffi
    from lltm_ffi import _extension, op

    package = Path(lltm_ffi.__file__).resolve().parent
    if package == CHECKOUT / "lltm_ffi":
        return f"pip-check: imported the checkout's lltm_ffi ({package}), not the installed one"
    if _extension.LOAD_ERROR is not None:
        return f"pip-check: the installed lltm_ffi has no usable compiled module: {_extension.LOAD_ERROR}"
    if Path(_extension.MODULE_PATH).resolve().parent != package:
        return f"pip-check: the compiled module {_extension.MODULE_PATH} is not the installed one"
    if lltm_ffi.CUDA_COMPILED:
        return "pip-check: LLTM_CUDA=0 should have built a CPU-only module"
    lib = _extension.lib
    on_cpu = {name for name, declared in op.PASSES.items() if "cpu" in declared.devices}
    if set(_extension.PASSES) != on_cpu:
        return (f"pip-check: the module registers {sorted(_extension.PASSES)}, the ops "
                f"declare {sorted(on_cpu)} for the CPU")
    pass_id = _extension.PASSES["round_forward"][0]
    if lib.lltm_run(pass_id, lib.LLTM_FLOAT32, 0, 0, [4], [], [0, 0]) != lib.LLTM_ERROR_NO_CUDA:
        return "pip-check: a CPU-only module's pass did not refuse a CUDA device"
    for name, check in op.SELF_CHECKS.items():
        for dtype in (torch.float32, torch.float64):
            failure = check("cpu", dtype)
            if failure:
                return f"pip-check: {name}: {failure}"
    print(f"pip-check ok: lltm_ffi {lltm_ffi.__version__} from {package}, "
          f"module {Path(_extension.MODULE_PATH).name} (CPU-only), self-checks of "
          f"{', '.join(op.SELF_CHECKS)} passed")
    return 0


if __name__ == "__main__":
    sys.exit(check_installed() if sys.argv[1:] == ["--installed"] else install_and_check())
