"""Which path a call of the LLTM takes, asked of C: the plan's table is
src/plan.c's (docs/ARCHITECTURE.md draws it), and Python decides nothing
of it. Here: the table's names, the options a sequence pass hands C (an
lltm_sequence_options, lltm_ffi.h), and the questions Python asks, for the
cell's path, for recurrence_path, and to refuse a forced path that cannot
take a call.

The environment, read at each call as torch reads its own TF32 setting:
LLTM_PATH=<name> forces a path of the table (a path of the sequence's
leaves the cell to its plan, and a cell's path the sequence); LLTM_CUBLAS=0
keeps cuBLAS out of the sequence's products and paths; LLTM_CLUSTER=0 keeps
thread-block clusters out of its recurrence; LLTM_AMX=0 or 1 picks the
CPU's 16-bit products (never AMX, or AMX for every product it takes);
LLTM_BLAS=0 or 1 the CPU's products through the BLAS (never, or the
recurrence's too at every size); LLTM_PAD=0 or 1 the sequence's state
padded (never, or to rows of whole 16 bytes on every call, on any device).
"""

import os

import torch

from ... import _extension, _torch_internals
from ..._extension import ffi, lib

# The table's names, in its order (LLTM_PATH takes them).
PATHS = (tuple(ffi.string(lib.lltm_path_name(path)).decode()
               for path in range(lib.LLTM_PATH_COUNT)) if lib is not None else ())
_NUMBERS = {name: number for number, name in enumerate(PATHS)}
# The sequence's rows (its GPU's, then the CPU's) and the cell's.
SEQUENCE_PATHS = PATHS[:lib.LLTM_PATH_CPU + 1] if lib is not None else ()
CELL_PATHS = PATHS[lib.LLTM_PATH_CELL_STEPS:] if lib is not None else ()
_PLANNED = lib.LLTM_PATH_PLANNED if lib is not None else -1
# The sequence's passes (lltm_pass), read once: a pass asks on every call.
PASS_FORWARD, PASS_BACKWARD, PASS_FORWARD_SAVED = (
    (lib.LLTM_PASS_FORWARD, lib.LLTM_PASS_BACKWARD, lib.LLTM_PASS_FORWARD_SAVED)
    if lib is not None else (None, None, None))


def forced_path(function):
    """The number of the path LLTM_PATH forces, or LLTM_PATH_PLANNED where
    it is unset or empty; ValueError naming LLTM_PATH and `function` for a
    name the table does not hold."""
    name = os.environ.get("LLTM_PATH")
    if not name:
        return _PLANNED
    number = _NUMBERS.get(name)
    if number is None:
        raise ValueError(f"{function}: LLTM_PATH={name!r} names no path; the paths are "
                         f"{', '.join(PATHS)} (unset LLTM_PATH to let the plan choose)")
    return number


# One options struct for each setting met, kept by the settings as read: a
# pass reuses it, and a call reads the settings and looks them up, nothing
# more. They are read from os.environ's own mapping (bytes on POSIX, kept in
# step with os.environ): os.environ.get encodes each name and raises and
# catches a KeyError for each one unset, 3.7 us a call for the six against
# 0.2.
_OPTIONS = {}
_SETTINGS = tuple(map(os.fsencode, ("LLTM_PATH", "LLTM_CUBLAS", "LLTM_CLUSTER", "LLTM_AMX",
                                    "LLTM_BLAS", "LLTM_PAD")))


def sequence_options(function):
    """The sequence passes' lltm_sequence_options for this call, from the
    environment and torch.backends.cuda.matmul.allow_tf32."""
    settings = (*map(os.environ._data.get, _SETTINGS), _torch_internals.cublas_allow_tf32())
    options = _OPTIONS.get(settings)
    if options is None:
        _, cublas, clusters, amx, blas, pad, tf32 = settings
        options = ffi.new("lltm_sequence_options *", {
            "path": forced_path(function), "tf32": int(tf32), "cublas": int(cublas != b"0"),
            "clusters": int(clusters != b"0"),
            **{name: int(setting) if setting in (b"0", b"1") else -1
               for name, setting in (("amx", amx), ("blas", blas), ("pad", pad))}})
        _OPTIONS[settings] = options
    return options


def _on_device(device, ask):
    """ask(), C's answer for `device` (a torch.device): a CUDA device's
    made current for the question."""
    if device.type != "cuda":
        return ask(lib.LLTM_CPU)
    current = torch.cuda.current_device()
    if device.index is None or device.index == current:
        return ask(current)
    with torch.cuda.device(device.index):
        return ask(device.index)


def _name_or_refusal(function, number, forced, call):
    """The name of path `number`, or for a refusal code the ValueError
    naming the path forced, the call (call(): its words) and why."""
    if number >= 0:
        return PATHS[number]
    if number == lib.LLTM_ERROR_NO_CUDA:
        _extension.check(function, number)
    reason = ffi.string(lib.lltm_error_string(number)).decode()
    raise ValueError(f"{function}: LLTM_PATH={PATHS[forced]} cannot take {call()}: {reason}; "
                     "unset LLTM_PATH to let the plan choose")


def sequence_path(function, dtype, device, sequence_pass, steps, batch_size, state_size,
                  packed, options):
    """The name of the path a sequence pass takes (`sequence_pass` an
    lltm_pass: lib.LLTM_PASS_FORWARD, LLTM_PASS_BACKWARD, or
    LLTM_PASS_FORWARD_SAVED, a forward that keeps its gates and cells for a
    backward) of `steps` steps (packed ones where `packed`) of batch_size
    rows and state_size columns, `dtype` on `device`, with `options`
    (sequence_options'); ValueError where the path LLTM_PATH forces cannot
    take it."""
    number = _on_device(device, lambda index: lib.lltm_sequence_path(
        _extension._DTYPE_CODES[dtype], index, sequence_pass, steps, batch_size, state_size,
        int(packed), options))
    backward = sequence_pass == lib.LLTM_PASS_BACKWARD
    return _name_or_refusal(function, number, options.path, lambda: (
        f"{'packed' if packed else 'dense'} steps ({steps} of {batch_size} x {state_size}, "
        f"{dtype}, {device}, {'backward' if backward else 'forward'})"))


def sequence_state(dtype, device, backward, steps, batch_size, state_size, packed, options):
    """The state size a sequence call of these sizes runs at (sequence_path's
    arguments; backward: whether a backward pass will follow the forward):
    state_size, or more where the plan pads the state with zero units (to
    rows of whole 16 bytes or to whole tiles). A state of whole tiles, a
    CPU call but under LLTM_PAD=1, or LLTM_PAD=0 runs as given, as C
    answers, without the question (a few microseconds of a small call's
    host time)."""
    if (options.pad == 0 or state_size % lib.LLTM_PAD_TILE == 0
            or (options.pad != 1 and device.type != "cuda")):
        return state_size
    return _on_device(device, lambda index: lib.lltm_sequence_state(
        _extension._DTYPE_CODES[dtype], index, int(backward), steps, batch_size, state_size,
        int(packed), options))


def sequence_workspace(sequence_pass, dtype, sizes, present):
    """The elements of `dtype` a sequence pass (an lltm_pass) of `sizes`
    (its own, the padded state after reverse) needs for its padded copies, the
    pass's tensors `present` (bit i: tensor i given); 0 where the padded
    state is the state."""
    return lib.lltm_sequence_workspace(sequence_pass, _extension._DTYPE_CODES[dtype], sizes,
                                       present)


def check_forced_sequence(function, dtype, device, backward, steps, batch_size, state_size,
                          packed, options):
    """sequence_path's ValueError where LLTM_PATH forces a path of the
    sequence that cannot take the pass; nothing (and no question to C)
    where it forces none."""
    if PATHS[options.path:options.path + 1] and PATHS[options.path] in SEQUENCE_PATHS:
        sequence_path(function, dtype, device,
                      lib.LLTM_PASS_BACKWARD if backward else lib.LLTM_PASS_FORWARD, steps,
                      batch_size, state_size, packed, options)


def cell_path(function, dtype, device, batch_size, input_features, state_size):
    """The name of the cell's path for a call of lltm() on `device` with
    these sizes: cell-steps or cell-torch, as the plan gives it (while a
    CUDA graph is captured too) or LLTM_PATH forces it; ValueError where
    the forced one cannot take the call."""
    forced = forced_path(function)
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    multiply_adds = batch_size * 3 * state_size * (state_size + input_features)
    number = lib.lltm_cell_path(_extension._DTYPE_CODES[dtype],
                                lib.LLTM_CPU if device.type != "cuda" else 0, multiply_adds,
                                int(capturing), forced)
    return _name_or_refusal(function, number, forced, lambda: (
        f"a cell of {batch_size} x {input_features} -> {state_size} ({dtype}, {device})"))
