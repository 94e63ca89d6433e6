"""`python -m lltm_ffi`: what a bug report needs, then a quick self-check.

Prints the lltm_ffi, Python, torch and cffi versions, the GPUs torch sees,
where the compiled module lives, what it was built with (CUDA or not, for
which architectures, against which CUDA runtime) and whether it is usable
(present, loads, not stale), and the passes it registered against those the
ops declare; then runs every op's self-check (lltm_ffi.op.self_check) on
every device there is, in float32 and float64. Exits 1 when the module is
unusable, a declared pass is missing or a check fails, else 0.

A missing or stale module is reported, never raised: importing lltm_ffi only
warns about it (see _extension), so this runs in exactly the situations a
user needs it for.
"""

import os
import platform
import re
import sys
import traceback
from pathlib import Path

from . import _build_info, _module_file

# Small enough to take well under a second on any device.
CHECK_SHAPE = (4, 8, 16)  # (batch, input_features, state_size)


def _version_of(module_name):
    try:
        module = __import__(module_name)
    except ImportError as error:
        return None, f"not importable ({error})"
    return module, getattr(module, "__version__", "unknown version")


def _cuda_runtime_text(version):
    """'13.0' for CUDART_VERSION 13000."""
    return f"{version // 1000}.{version % 1000 // 10}"


def covering_arch(arch_names, major, minor):
    """The compiled architecture a GPU of compute capability major.minor runs:
    machine code of the same major version and no newer minor, else PTX of no
    newer version (compiled by the driver at load); None when neither exists."""
    capability = major * 10 + minor
    machine_code, ptx = [], []
    for name in arch_names.split():
        match = re.fullmatch(r"(sm|compute)_(\d+)([a-z]?)", name)
        if not match:
            continue
        kind, number, suffix = match.group(1), int(match.group(2)), match.group(3)
        # An "a" (or "f") target runs only on its own capability (or major version).
        fits = number == capability if suffix == "a" else number <= capability
        if kind == "sm" and fits and number // 10 == major:
            machine_code.append((number, name))
        elif kind == "compute" and fits:
            ptx.append((number, f"{name} (PTX, compiled by the driver)"))
    best = max(machine_code, default=None) or max(ptx, default=None)
    return best[1] if best else None


def capability_of(covering):
    """The compute capability, as a number (90), whose code a name that
    covering_arch returns is: 'sm_90', 'compute_75 (PTX, ...)'."""
    return int(re.search(r"_(\d+)", covering).group(1))


def _kernels_left_out(covering, major, minor):
    """What a GPU misses in code of an older architecture than its own (a
    module built where there was no GPU: compute_75 alone), as a row's end."""
    compiled = capability_of(covering) if covering else major * 10 + minor
    missing = [kernels for kernels, needed in (("tensor-core", 80), ("cluster", 90))
               if compiled < needed <= major * 10 + minor]
    if not missing:
        return ""
    return (f" (its {' and '.join(missing)} kernels are empty there: `make` on this machine, "
            "or CUDA_ARCH=all, builds them)")


class _Report:
    def __init__(self):
        self.problems = []

    def row(self, label, value):
        print(f"{label + ':':<24}{value}")

    def problem(self, text):
        self.problems.append(text)


def _describe_module(report, extension):
    """Rows on the compiled module; returns its lib when it is usable, else None."""
    package = Path(extension.__file__).resolve().parent
    built = sorted(package.glob("_lltm_ffi*.so"))
    report.row("compiled module", ", ".join(str(path) for path in built) or f"none in {package}")
    lib, ffi = extension.lib, extension.ffi
    if lib is None:
        report.row("module status", f"NOT USABLE: {extension.LOAD_ERROR}")
        report.problem(str(extension.LOAD_ERROR))
        # A stale module still loads: say what it was built with all the same.
        # A damaged one is not loaded: it could kill the process (SIGBUS,
        # SIGSEGV, SIGILL).
        module_file = _module_file.find(package)
        if module_file is None or _module_file.damage(module_file):
            return None
        try:
            from . import _lltm_ffi
        except ImportError:
            return None
        lib, ffi = _lltm_ffi.lib, _lltm_ffi.ffi
    else:
        sources_here = (package.parent / "build_ffi.py").is_file()
        report.row("module status", "ok, built from the current sources" if sources_here
                   else "ok (installed without its sources: no staleness check)")

    def text(function_name):
        function = getattr(lib, function_name, None)
        return ffi.string(function()).decode() if function else "unknown (an older build)"

    report.row("built for version", text("lltm_package_version"))
    report.row("built from sources", text("lltm_source_hash"))
    if lib.lltm_cuda_compiled():
        runtime = getattr(lib, "lltm_cuda_runtime_version", None)
        report.row("CUDA compiled in", "yes")
        report.row("CUDA architectures", text("lltm_cuda_archs"))
        report.row("CUDA runtime (built)", _cuda_runtime_text(runtime()) if runtime else "unknown")
    else:
        report.row("CUDA compiled in", "no (CPU-only build)")
    amx_usable = getattr(lib, "lltm_amx_usable", None)
    if amx_usable is None:
        report.row("CPU 16-bit products", "unknown (an older build)")
    elif not amx_usable():
        report.row("CPU 16-bit products", "portable (no AMX or AVX512-BF16 on this CPU)")
    else:
        setting = os.environ.get("LLTM_AMX")
        amx = lib.lltm_amx_tiles()
        report.row("CPU 16-bit products",
                   "portable (LLTM_AMX=0)" if setting == "0"
                   else f"{'AMX' if amx else 'AVX512-BF16 (no AMX)'} for every size (LLTM_AMX=1)"
                   if setting == "1"
                   else "AMX (bfloat16 tiles; float16 tiles for the large products)" if amx
                   else "AVX512-BF16 dot products for bfloat16 (no AMX; float16 portable)")
    report.row("CPU products", _cpu_products_text(lib, ffi))
    return lib if extension.lib is not None else None


def _cpu_products_text(lib, ffi):
    """Where the CPU passes' matrix products run: the BLAS (include/lltm_blas.h), or why not."""
    config = getattr(lib, "lltm_blas_config", None)
    if config is None:
        return "own tiles (an older build)"
    setting = os.environ.get("LLTM_BLAS")
    if setting == "0":
        return "own tiles (LLTM_BLAS=0)"
    loaded = ffi.string(config()).decode()
    if not loaded:
        from . import _blas
        return ("own tiles (no BLAS: pip install scipy-openblas32)" if _blas.library_path() is None
                else f"own tiles (the BLAS at {_blas.library_path()} does not load)")
    if setting == "1":
        return loaded + ", every recurrence too (LLTM_BLAS=1)"
    narrow = getattr(lib, "lltm_blas_narrow", None)
    if narrow is not None and narrow():
        return loaded + (", the own tiles for batches of 3 or more (the BLAS's kernels are "
                         "narrower than this CPU's AVX-512)")
    return loaded + ", the own tiles for small recurrences"


def _describe_gpus(report, torch, lib, ffi):
    """Rows on the GPUs torch sees; returns those lltm_ffi can be checked on."""
    if not torch.cuda.is_available():
        why = "torch is a CPU-only build" if torch.version.cuda is None else "no usable GPU"
        report.row("GPUs (torch)", f"none ({why})")
        return []
    devices = []
    arch_names = (ffi.string(lib.lltm_cuda_archs()).decode()
                  if lib is not None and lib.lltm_cuda_compiled() else None)
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        major, minor = properties.major, properties.minor
        line = (f"{properties.name}, sm_{major}{minor}, "
                f"{properties.total_memory / 2**30:.0f} GiB")
        if arch_names is not None:
            covering = covering_arch(arch_names, major, minor)
            line += f"; runs {covering}" if covering else "; NOT covered by the compiled architectures"
            line += _kernels_left_out(covering, major, minor)
            if not covering:
                report.problem(f"cuda:{index} (sm_{major}{minor}) is not among the architectures "
                               f"lltm_ffi was compiled for ({arch_names})")
        report.row(f"GPU cuda:{index}", line)
        devices.append(f"cuda:{index}")
    if arch_names is None:
        if lib is not None:
            report.problem("torch sees a GPU but lltm_ffi was built without CUDA; put nvcc on "
                           "PATH and rebuild (`make clean && make`)")
        return []
    return devices


def _describe_passes(report, extension, op):
    """A row of the passes the module registered, each with its devices
    and the dtypes it takes there, and a problem for every pass an op
    declares that the module lacks on a device it was built for."""
    registered = extension.PASSES

    def dtypes(taken):
        return "+".join(str(dtype).removeprefix("torch.") for dtype in taken)

    report.row("passes", ", ".join(
        f"{name} ({'; '.join(f'{device}: {dtypes(taken[device])}' for device in devices)})"
        for name, (_, devices, taken) in registered.items()))
    built_for = ("cpu", "cuda") if extension.cuda_compiled() else ("cpu",)
    missing = [f"{name} on {device}" for name, declared in op.PASSES.items()
               for device in declared.devices
               if device in built_for and device not in registered.get(name, (None, ()))[1]]
    if missing:
        report.problem(f"the compiled module lacks passes the ops declare ({', '.join(missing)})"
                       ": no C or CUDA source registers them under those names; check the "
                       "LLTM_CPU_PASS and LLTM_CUDA_PASS lines, then rebuild with `make`")


def _self_check(checks, device, dtype):
    """None when every op's self-check passes on `device`, else what went wrong."""
    failures = []
    for name, check in checks.items():
        try:
            failure = check(device, dtype)
        except Exception as error:  # a CUDA error, say: report it, check the rest
            failure = "".join(traceback.format_exception_only(error)).strip()
        if failure is not None:
            failures.append(f"{name}: {failure}")
    return "; ".join(failures) or None


def main():
    report = _Report()
    print("lltm_ffi diagnostics (paste all of this into a bug report)")
    report.row("lltm_ffi", f"{_build_info.VERSION} ({Path(__file__).resolve().parent})")
    report.row("python", f"{platform.python_version()} ({sys.executable})")
    report.row("platform", platform.platform())
    torch, torch_version = _version_of("torch")
    if torch is not None:
        torch_version += f" (CUDA {torch.version.cuda})" if torch.version.cuda else " (CPU-only)"
    report.row("torch", torch_version)
    report.row("cffi", _version_of("cffi")[1])

    from . import _extension

    lib = _describe_module(report, _extension)
    if torch is not None:
        report.row("CPU threads", f"{torch.get_num_threads()} (torch.get_num_threads(), which the "
                                  "CPU passes follow)")
    devices = ["cpu"]
    if torch is not None:
        devices += _describe_gpus(report, torch, lib, _extension.ffi)

    if lib is None:
        report.row("self-check", "not run: the compiled module is not usable")
    else:
        from . import op

        _describe_passes(report, _extension, op)
        report.row("self-checks", ", ".join(op.SELF_CHECKS))
        for device in devices:
            for dtype in (torch.float32, torch.float64):
                label = f"check {device} {str(dtype).replace('torch.', '')}"
                failure = _self_check(op.SELF_CHECKS, device, dtype)
                report.row(label, "pass" if failure is None else f"FAIL: {failure}")
                if failure is not None:
                    report.problem(f"{label}: {failure}")

    if report.problems:
        print(f"\nresult: {len(report.problems)} problem(s)")
        for text in report.problems:
            print(f"  - {text}")
        return 1
    print("\nresult: ok")
    return 0
