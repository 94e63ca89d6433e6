"""lltm_ffi's ops, one folder each: an op's C and CUDA sources (which the
build finds), its Python declaration (lltm_ffi.op) and its tests. Every
folder here is imported with the package, so every op's passes,
operators and self-checks are registered (lltm_ffi.op.PASSES,
lltm_ffi.op.SELF_CHECKS) whether or not the package exports its
functions. What a folder's __init__.py lists in __all__ is public: the
package exports it as lltm_ffi.<name> (PUBLIC)."""

import importlib
import pkgutil

# Each op folder's public names, {name: object}, in the folders' order.
PUBLIC = {}

for _module in pkgutil.iter_modules(__path__):
    if _module.ispkg:
        _package = importlib.import_module(f"{__name__}.{_module.name}")
        for _name in getattr(_package, "__all__", ()):
            if _name in PUBLIC:
                raise ImportError(f"lltm_ffi.ops.{_module.name} exports {_name}, which another "
                                  "op folder exports too: give each public name one owner")
            PUBLIC[_name] = getattr(_package, _name)
