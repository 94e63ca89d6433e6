"""lltm_ffi's ops, one folder each: an op's C and CUDA sources (which the
build finds), its Python declaration (lltm_ffi.op) and its tests. Every
folder here is imported with the package, so every op's passes,
operators and self-checks are registered (lltm_ffi.op.PASSES,
lltm_ffi.op.SELF_CHECKS) whether or not the package exports its
functions."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    if _module.ispkg:
        importlib.import_module(f"{__name__}.{_module.name}")
