"""Declaring an op: each C pass once, and its derivative once.

A C pass is a Python function of the pass's arguments that allocates the
outputs and hands sizes, scalars and tensors to C (`c`), under
`c_pass` with the name its C sources register (include/lltm_op.h):

    @op.c_pass("round_forward")
    def round_forward(c, input: op.Tensor()) -> Tensor:
        output = torch.empty_like(input)
        c(sizes=(input.numel(),), tensors=(input, output))
        return output

The annotations say what each argument must be: op.Tensor(...) a tensor
(of the op's floating dtype, unless it names another: one of the dtypes
the pass's C sources register it for on the call's device, float32 and
float64, and float16 and bfloat16 where they say so, the same for every
such argument of a call; or one of several integer dtypes, converted to
the one C reads; with so many dimensions; optional; read through its
strides; read on the host, a CPU tensor whatever the pass's device), int,
float or bool. A default (`scale: float = 1.0`) makes an argument
optional in every call, and every argument can be given by keyword.
From the one function come:

- the checks: a TypeError or ValueError naming the argument and the
  function the caller called (the operator, or the op's public function),
  before any address reaches C: the annotations' (a scalar must be one C
  can hold, an int64 or a double), then `check=` (shapes and scalars: it
  also runs on the fake tensors of tracers), then `values=` (what only the
  tensors' contents can say: indices in range), which runs on real tensors
  only and which the framework skips where values cannot be read (fake
  tensors, torch.compile and other tracers, torch.func transforms, CUDA
  graph capture); both are called with that function's name first;
- the torch.library operator lltm_ffi::<name>, with those checks, and its
  fake implementation: the same function run with a `c` that calls
  nothing, on fake tensors, so the outputs' shapes are written once;
- round_forward(input): the checked call, through the operator under
  torch.compile, a tracer or a tensor subclass, else straight into C.

`nondeterministic=("cuda",)` declares a pass whose result varies from run
to run on that device (a scatter by atomicAdd): under
torch.use_deterministic_algorithms(True) a call there raises, as torch's
own such ops do (warns, with warn_only=True).

A differentiable op joins a forward pass and its derivative:

    round_ste = op.Op(round_forward, backward=lambda ctx, grad_output: grad_output)

builds the autograd.Function that plain eager calls take, registers the
same backward (and setup_context) with the operator, and calling it picks
between the two. `c(sizes, tensors, scalars=(), options=None)` runs the C
pass: sizes are ints, scalars floats, the first of `tensors` gives the
element type and the device, and options (a struct of lltm_ffi.h made with
ffi.new, the sequence's) goes after the tensors' addresses. docs/PORTING.md walks a whole op through this.
"""

import inspect
import numbers
import sys
import typing
import warnings

import torch

from . import _extension, _torch_internals
from ._extension import DTYPES, PLAIN_TENSOR_TYPES

_SCALAR_SCHEMA = {int: "SymInt", float: "float", bool: "bool"}
# What each scalar annotation accepts (a tracer's symbolic ints and floats
# too); a bool is refused where an int or a float is asked.
_SCALAR_TYPES = {int: (int, torch.SymInt), float: (float, int, torch.SymFloat, torch.SymInt),
                 bool: (bool,)}
# Op names of torch.library operators (and so of passes): their namespace.
NAMESPACE = "lltm_ffi"


class Tensor:
    """What a tensor argument must be. dims: its number of dimensions (an
    int, a tuple of those allowed, or None for any). dtype: None for the
    op's floating dtype (one the pass takes on the call's device, the same
    for every such argument of a call), else the torch.dtype it must have
    (torch.int64 for indices, say), or a tuple of those it may have; with a
    tuple, c_dtype is the one of them C reads, and an argument of another
    is converted to it (a copy) before C sees it. optional: None is
    accepted and reaches C as NULL.
    strided: C reads it through its strides, so it is passed as it is
    (its negative bit resolved); otherwise it is made contiguous first.
    host: C reads it on the host (sizes that a CUDA pass's launches
    depend on, say), so it must be on the CPU whatever the other tensors'
    device; it must not be a pass's first tensor, which gives the device."""

    def __init__(self, dims=None, dtype=None, optional=False, strided=False, host=False,
                 c_dtype=None):
        self.dims = (dims,) if isinstance(dims, int) else dims
        if isinstance(dtype, tuple) and c_dtype not in dtype:
            raise TypeError(f"op.Tensor(dtype={dtype}) needs c_dtype=, the one of those dtypes "
                            "that C reads")
        if c_dtype is not None and not isinstance(dtype, tuple):
            raise TypeError("op.Tensor: c_dtype= goes with a tuple of dtypes, dtype=(...)")
        self.dtype = dtype
        self.c_dtype = c_dtype
        self.optional = optional
        self.strided = strided
        self.host = host

    def schema(self):
        return "Tensor?" if self.optional else "Tensor"

    def __repr__(self):
        given = {"dims": self.dims, "dtype": self.dtype, "optional": self.optional,
                 "strided": self.strided, "host": self.host, "c_dtype": self.c_dtype}
        return "op.Tensor(" + ", ".join(f"{name}={value!r}" for name, value in given.items()
                                        if value) + ")"

    def prepare(self):
        """How run() hands an argument to C: the dtype it is converted to
        (then made dense), True to pass it as it is (strided), False to
        make it dense."""
        return self.c_dtype if self.c_dtype is not None else self.strided


def _no_call(sizes, tensors, scalars=(), options=None):
    """The `c` of a fake run: fake tensors have no memory to hand over."""


def plain_eager(*tensors):
    """True for the common call that an op hands to C itself through its
    autograd.Function: plain tensors, and nothing that intercepts or
    transforms the call (torch.compile, a tracer, a __torch_dispatch__ mode,
    autocast, a torch.func transform, forward-mode AD). Every eager call pays
    for it, so it asks torch._C alone, nothing that builds objects."""
    return not use_operator(*tensors) and _untransformed()


def _untransformed():
    """No autocast, torch.func transform or forward-mode AD around the call."""
    return (not _torch_internals.any_autocast_enabled()
            and not _torch_internals.functorch_transforms_active()
            and not _torch_internals.forward_ad_active())


def use_operator(*tensors):
    """True where an op must go through its registered torch.library operator
    rather than hand data_ptr() to C itself: while torch.compile or
    torch.jit.trace traces (neither can see into a cffi call), under a
    __torch_dispatch__ mode (FakeTensorMode, make_fx, export), and for any
    argument that is not a plain torch.Tensor (tensor subclasses, fake
    tensors), which the dispatcher then hands to its own handling. functorch's
    wrapped tensors are plain torch.Tensors: the autograd.Functions take them
    and unwrap them before their forward runs."""
    # is_compiling() first: dynamo takes it as True and reads no further.
    return (torch.compiler.is_compiling() or _torch_internals.dispatch_modes_active() > 0
            or torch.jit.is_tracing()
            or not PLAIN_TENSOR_TYPES.issuperset(map(type, tensors)))


# Autocast's own device types that lltm_ffi runs on; asking autocast about
# others (meta, say) raises.
_AUTOCAST_DEVICE_TYPES = ("cpu", "cuda")


def autocast_dtype(tensor):
    """The dtype torch.autocast runs lower-precision ops in on `tensor`'s
    device type (torch.get_autocast_dtype) while it is on there; None
    otherwise, and for anything but a CPU or CUDA tensor."""
    if not _torch_internals.any_autocast_enabled() or not isinstance(tensor, torch.Tensor):
        return None
    device_type = tensor.device.type
    if device_type not in _AUTOCAST_DEVICE_TYPES or not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def autocast_cast(dtype, *arguments):
    """`arguments` as autocast hands them to an op it runs in `dtype`: each
    floating-point tensor in `dtype`, but float64 ones, which autocast
    leaves as they are; anything else unchanged. Differentiable: gradients
    come back to the tensors given in their own dtype."""
    return tuple(argument.to(dtype)
                 if isinstance(argument, torch.Tensor) and argument.is_floating_point()
                 and argument.dtype is not torch.float64 else argument
                 for argument in arguments)


# The refusals every op shares, worded once.

def _dtype_list(dtypes, conjunction="and"):
    names = [str(dtype) for dtype in dtypes]
    last = f" {conjunction} "
    return last.join(names) if len(names) < 3 else ", ".join(names[:-1]) + last + names[-1]


def takes_tensor(tensor):
    """True where check_tensor (no dtype given) lets `tensor` pass: its
    valid case alone, for a caller that names the argument only to refuse."""
    return (isinstance(tensor, torch.Tensor) and tensor.dtype in DTYPES
            and not tensor.is_nested and tensor.layout is torch.strided)


def check_tensor(op, name, tensor, dtype=None):
    """TypeError naming `name` unless `tensor` is a dense tensor of a
    floating dtype lltm_ffi knows (or of `dtype`, where given: a dtype or a
    tuple of those allowed); which of them a pass takes on a device is
    check_dtype's."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if dtype is None and tensor.dtype not in DTYPES:
        raise TypeError(f"{op}: {name} has dtype {tensor.dtype}; lltm_ffi takes floating-point "
                        f"tensors ({_dtype_list(DTYPES)}, as each op's passes allow)")
    if dtype is not None and tensor.dtype != dtype and not (
            isinstance(dtype, tuple) and tensor.dtype in dtype):
        allowed = _dtype_list(dtype, "or") if isinstance(dtype, tuple) else dtype
        raise TypeError(f"{op}: {name} has dtype {tensor.dtype}; it must be {allowed}")
    if tensor.is_nested:
        raise TypeError(f"{op}: {name} is a nested tensor (layout {tensor.layout}); lltm_ffi "
                        "takes dense (torch.strided) tensors: pad it with "
                        "torch.nested.to_padded_tensor()")
    if tensor.layout is not torch.strided:
        raise TypeError(f"{op}: {name} has layout {tensor.layout}; lltm_ffi takes dense "
                        "(torch.strided) tensors: convert it with .to_dense()")


def check_matches(op, name, tensor, reference_name, reference, same_dtype=True):
    """TypeError or ValueError naming `name` unless `tensor` has the device
    (and, with same_dtype, the dtype) of `reference`."""
    if same_dtype and tensor.dtype != reference.dtype:
        raise TypeError(f"{op}: {name} has dtype {tensor.dtype} but {reference_name} has "
                        f"{reference.dtype}; all arguments must have the same dtype")
    if tensor.device != reference.device:
        raise ValueError(f"{op}: {name} is on {tensor.device} but {reference_name} is on "
                         f"{reference.device}; all arguments must be on the same device")


def check_dtype(op, name, tensor, c_pass):
    """TypeError naming `name` unless the dtype of `tensor` is one that
    `c_pass` (a Pass) takes on the tensor's device, listing those. Reads
    the registry only (traceable); LLTMBuildError where the compiled module
    is missing."""
    device_type = tensor.device.type
    taken = _extension.pass_dtypes(c_pass.name, device_type)
    if tensor.dtype not in taken:
        by = "" if op == c_pass.label else f" (its pass {c_pass.label})"
        raise TypeError(f"{op}: {name} has dtype {tensor.dtype}; on {device_type} {op} takes "
                        f"{_dtype_list(taken)}{by}")


def check_device(op, device, subject="the arguments are"):
    """ValueError for a device lltm_ffi does not run on; LLTMError for a CUDA
    device when the module was built without CUDA (the C shim's own refusal,
    raised before anything is allocated)."""
    if device.type == "cuda":
        _extension.check_cuda_compiled(op)
    elif device.type != "cpu":
        raise ValueError(f"{op}: {subject} on {device}; lltm_ffi runs on cpu and cuda")


def check_shape(op, name, tensor, expected):
    """ValueError naming `name` unless `tensor` has the shape `expected`, in
    which None is any size ((*indices.shape, None): indices' shape and one
    more dimension). An optional tensor left out (None) has none to check."""
    if tensor is None:
        return
    shape = tuple(tensor.shape)
    if len(shape) != len(expected) or any(
            size != wanted for size, wanted in zip(shape, expected) if wanted is not None):
        shown = ", ".join("any" if size is None else str(size) for size in expected)
        raise ValueError(f"{op}: {name} has shape {shape}, expected "
                         f"({shown}{',' if len(expected) == 1 else ''})")


def check_indices(op, name, indices, count, of):
    """ValueError naming `name` and the first of its elements outside 0 to
    count - 1, where `of` says what they index ("weight's 5 rows"). It
    reads the values: a `values=` check (c_pass), which the framework runs
    where they can be read."""
    outside = (indices < 0) | (indices >= count)
    if outside.any():
        first = tuple(outside.nonzero()[0].tolist())
        allowed = f"from 0 to {count - 1}" if count else "none"
        raise ValueError(f"{op}: {name} at {first} is {indices[first].item()}; it indexes "
                         f"{of}, so it must be {allowed}")


def math_zeros(like, *shape):
    """Zeros of `shape` on the device of `like`, in the type C's sums of
    `like`'s dtype run in (math_t: float32 for float16 and bfloat16): where
    a backward pass adds into its output (a scatter), the declaration
    allocates it so, and rounds it once to `like`'s dtype after C."""
    return like.new_zeros(shape, dtype=torch.promote_types(like.dtype, torch.float32))


def check_sizes(function, **sizes):
    """The sizes (a module's, say: input_features=4, state_size=8), each as
    an int; TypeError naming the first that is no integer (a bool is none,
    nor is a float of integral value), ValueError for one below 1."""
    checked = []
    for name, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, numbers.Integral):
            raise TypeError(f"{function}: {name} must be an int, got {type(size).__name__} "
                            f"{_shown(size)}")
        if size < 1:
            raise ValueError(f"{function}: {name} must be at least 1, got {size}")
        checked.append(int(size))
    return checked


def _shown(value):
    """repr(value), shortened where it is long (an int of many digits)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...{text[-8:]} ({len(text)} characters)"


_INT64 = (-2**63, 2**63 - 1)


def _scalar_problem(kind, value):
    """Why C cannot hold `value` (of a type the annotation `kind` accepts)
    as an int64 (sizes=) or a double (scalars=), or None: an int of more
    than 64 bits, or one beyond the largest finite double (NaN and the
    infinities are doubles: which values make sense is the op's check's).
    A tracer's symbolic value is checked where it becomes one."""
    if kind is bool or isinstance(value, (torch.SymInt, torch.SymFloat)):
        return None
    if kind is int:
        return None if _INT64[0] <= value <= _INT64[1] else "must fit an int64"
    try:
        float(value)
    except OverflowError:
        return "is beyond the range of a double"
    return None


class Pass:
    """A C pass, declared by the function that runs it (see the module's
    docstring; c_pass is the decorator). Calling it checks the arguments and
    runs the pass, through its operator where use_operator says so."""

    def __init__(self, name, body, check=None, devices=("cpu", "cuda"), values=None,
                 nondeterministic=()):
        if name in PASSES:
            # torch.library would replace the operator: the first op's traced
            # and compiled calls would run the second's.
            first = PASSES[name].body
            raise ValueError(f"{NAMESPACE}::{name} is declared twice, by "
                             f"{first.__module__}.{first.__qualname__} and "
                             f"{body.__module__}.{body.__qualname__}: give each pass its own name")
        self.name = name
        self.devices = devices
        self.label = f"{NAMESPACE}::{name}"
        self.body = body
        self.extra_check = check
        self.value_check = values
        self.nondeterministic = nondeterministic
        signature = inspect.signature(body)
        # After `c`, the pass's arguments; keyword-only parameters are options
        # of the direct call (run), which the operator leaves at their defaults.
        parameters = [parameter for parameter in list(signature.parameters.values())[1:]
                      if parameter.kind is not inspect.Parameter.KEYWORD_ONLY]
        self.parameters = [(parameter.name, parameter.annotation) for parameter in parameters]
        self._names = tuple(name for name, _ in self.parameters)
        self.defaults = {parameter.name: parameter.default for parameter in parameters
                         if parameter.default is not inspect.Parameter.empty}
        # What inspect.signature and help() show for the pass and its op.
        self.__signature__ = signature.replace(parameters=parameters)
        for name_, kind in self.parameters:
            if not isinstance(kind, Tensor) and kind not in _SCALAR_SCHEMA:
                raise TypeError(f"{self.label}: the annotation of {name_} must be op.Tensor(...), "
                                f"int, float or bool, got {kind!r}")
        self.tensor_positions = [index for index, (_, kind) in enumerate(self.parameters)
                                 if isinstance(kind, Tensor)]
        self._prepare = [kind.prepare() if isinstance(kind, Tensor) else None
                         for _, kind in self.parameters]
        self.c = _extension.CPass(name)
        # The dtypes the compiled module registered the pass for on each
        # device, read once, for the checks' valid case: attributes, since
        # asking a tensor is_cpu costs a fifth of asking its device's type.
        # Empty where the module is missing: the calls' checks then raise
        # its LLTMBuildError.
        registered = _extension.PASSES[name][2] if name in _extension.PASSES else {}
        self.cpu_dtypes = registered.get("cpu", ())
        self.cuda_dtypes = registered.get("cuda", ())
        self.operator = torch.library.custom_op(
            self.label, self._run_operator, mutates_args=(), device_types=("cpu", "cuda"),
            schema=self._schema(signature.return_annotation))
        self.operator.register_fake(self._fake)
        self.__doc__ = body.__doc__
        PASSES[name] = self

    def _schema(self, returns):
        arguments = ", ".join(
            f"{kind.schema() if isinstance(kind, Tensor) else _SCALAR_SCHEMA[kind]} {name}"
            + (f"={self.defaults[name]!r}" if name in self.defaults else "")
            for name, kind in self.parameters)
        if returns is torch.Tensor:
            count = 1
        elif typing.get_origin(returns) is tuple and set(typing.get_args(returns)) == {
                torch.Tensor}:
            count = len(typing.get_args(returns))
        else:
            raise TypeError(f"{self.label}: the return annotation must be Tensor or "
                            f"tuple[Tensor, ...], got {returns!r}")
        outputs = "Tensor" if count == 1 else "(" + ", ".join(["Tensor"] * count) + ")"
        return f"({arguments}) -> {outputs}"

    def check(self, args, op=None):
        """Raises TypeError or ValueError, naming the argument (and `op`,
        the function the caller called: the operator by default), for
        anything the pass cannot take: what the annotations ask, then the
        pass's own check (the shapes' relations, say), called with `op` and
        the arguments."""
        op = op or self.label
        if len(args) != len(self.parameters):
            raise TypeError(f"{op} takes {len(self.parameters)} arguments "
                            f"({', '.join(name for name, _ in self.parameters)}), "
                            f"got {len(args)}")
        floating = first = None
        for (name, kind), value in zip(self.parameters, args):
            if isinstance(kind, Tensor):
                if value is None and kind.optional:
                    continue
                check_tensor(op, name, value, kind.dtype)
                if kind.dtype is None:
                    if floating is None:
                        floating = (name, value)
                    check_matches(op, name, value, *floating)
                if kind.host:
                    if value.device.type != "cpu":
                        raise ValueError(f"{op}: {name} is on {value.device}; it must be on the "
                                         "CPU, where C reads it")
                else:
                    if first is None:
                        first = (name, value)
                    check_matches(op, name, value, *first, same_dtype=False)
                if kind.dims is not None and value.dim() not in kind.dims:
                    allowed = " or ".join(map(str, kind.dims))
                    raise ValueError(f"{op}: {name} must have {allowed} dimensions, got shape "
                                     f"{tuple(value.shape)}")
            elif (not isinstance(value, _SCALAR_TYPES[kind])
                  or (kind is not bool and isinstance(value, bool))):
                raise TypeError(f"{op}: {name} must be {kind.__name__}, got "
                                f"{type(value).__name__}")
            else:
                problem = _scalar_problem(kind, value)
                if problem:
                    raise ValueError(f"{op}: {name} {problem}, got {_shown(value)}")
        if first is not None:
            self.check_device(op, *first)
            if first[1].device.type in self.nondeterministic:
                _alert_nondeterministic(op, first[1].device.type)
        if floating is not None:
            check_dtype(op, *floating, self)
        if self.extra_check is not None:
            self.extra_check(op, *args)

    def bind(self, args, keywords, op=None):
        """The arguments of a call given by position and by keyword (the
        defaults filling in what neither gives) as the full tuple, by
        position, that the checks, C and the operator take."""
        names = self._names
        if not keywords and len(args) == len(names):
            return args
        op = op or self.label
        takes = ", ".join(f"{name}={self.defaults[name]!r}" if name in self.defaults else name
                          for name in names)
        if len(args) > len(names):
            raise TypeError(f"{op} takes {len(names)} arguments ({takes}), got {len(args)}")
        for name in keywords:
            if name not in names:
                raise TypeError(f"{op}: no argument is named {name} (it takes {takes})")
            if names.index(name) < len(args):
                raise TypeError(f"{op}: {name} is given twice, by position and by keyword")
        bound = list(args)
        for name in names[len(args):]:
            if name in keywords:
                bound.append(keywords[name])
            elif name in self.defaults:
                bound.append(self.defaults[name])
            else:
                raise TypeError(f"{op}: missing the argument {name} (it takes {takes})")
        return tuple(bound)

    def check_values(self, args, op=None):
        """The pass's `values=` check, where the tensors' values can be read:
        real tensors, outside tracers, torch.func transforms and CUDA graph
        capture (reading a value there would need a synchronization that
        capture forbids)."""
        if self.value_check is None:
            return
        tensors = self.tensors_of(args)
        if (use_operator(*tensors) or _torch_internals.functorch_transforms_active()
                or (any(tensor.is_cuda for tensor in tensors)
                    and torch.cuda.is_current_stream_capturing())):
            return
        self.value_check(op or self.label, *args)

    def check_device(self, op, name, tensor):
        """check_device for the device of `tensor` (the argument `name`), and
        a ValueError where this pass has no version for it in the compiled
        module."""
        device = tensor.device
        check_device(op, device, f"{name} is")
        # The declared devices first: a module built without CUDA registers
        # no pass that has kernels only.
        if device.type not in self.devices or device.type not in _extension.pass_devices(
                self.name):
            raise ValueError(f"{op}: {name} is on {device}, but {self.label} has no "
                             f"{device.type} version (its op has no "
                             f"{'kernel' if device.type == 'cuda' else 'CPU pass'})")

    def run(self, *args, **options):
        """The body on the arguments as C reads them, with no check: for
        callers that checked the whole call already; `options` are the
        body's keyword-only parameters."""
        return self.body(self.c, *self._as_c_reads(args), **options)

    def _as_c_reads(self, args):
        """Each tensor argument as C reads it: dense (but where strided=),
        converted to its c_dtype."""
        return [argument if prepare is None or argument is None
                else argument.resolve_neg() if prepare is True
                else _extension.dense(argument if prepare is False else argument.to(prepare))
                for prepare, argument in zip(self._prepare, args)]

    # The operator's implementations: torch's dispatcher leaves out trailing
    # arguments equal to their defaults, which bind() puts back.

    def _run_operator(self, *args):
        args = self.bind(args, {})
        self.check(args)
        self.check_values(args)
        return self.run(*args)

    def _fake(self, *args):
        args = self.bind(args, {})
        self.check(args)
        return self.body(_no_call, *self._as_c_reads(args))

    def tensors_of(self, args):
        """The tensor arguments among `args` (those given, None left out)."""
        return [args[index] for index in self.tensor_positions
                if index < len(args) and args[index] is not None]

    def __call__(self, *args, **keywords):
        if keywords or len(args) != len(self._names):
            args = self.bind(args, keywords)
        if use_operator(*self.tensors_of(args)):
            return self.operator(*args)
        self.check(args)
        if self.value_check is not None:
            self.check_values(args)
        return self.run(*args)


def _alert_nondeterministic(op, device_type):
    """What torch's own ops do under torch.use_deterministic_algorithms(True)
    where their kernel on the device is not deterministic: raise (warn with
    warn_only=True)."""
    if not torch.are_deterministic_algorithms_enabled():
        return
    message = (f"{op} does not have a deterministic implementation on {device_type} (it adds "
               "with atomics, in an order that varies from run to run), but you set "
               "'torch.use_deterministic_algorithms(True)'. You can turn off determinism just "
               "for this operation, or use the 'warn_only=True' option")
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(message, stacklevel=3)
    else:
        raise RuntimeError(message)


# Every pass declared, by name: what the self-check and the tests go over.
PASSES = {}


def c_pass(name, check=None, devices=("cpu", "cuda"), values=None, nondeterministic=()):
    """Declares the function below as the C pass `name` (a Pass). `check`,
    where given, is called with the name of the function the caller called
    (for its messages) and the arguments, after the checks the annotations
    ask for, on real and fake tensors alike: it may read shapes, dtypes and
    scalars, never a tensor's values. `values`, where given, is called after
    it the same way, on real tensors only, where their values can be read
    (Pass.check_values): indices in range, say. `devices`: the device types
    its C sources register it for (("cuda",) for an op with a kernel and no
    CPU pass, say). `nondeterministic`: the device types whose version gives
    results that vary from run to run (a scatter by atomicAdd), refused
    under torch.use_deterministic_algorithms(True)."""
    return lambda body: Pass(name, body, check, devices, values, nondeterministic)


class Op:
    """A differentiable op: a forward Pass and its derivative.

    backward(ctx, *grad_outputs) -> a gradient (or None) per argument;
    setup_context(ctx, inputs, output) saves what it needs, as for
    torch.library.register_autograd; result(output) -> what the caller gets
    (the forward's output as it is by default: a pass may return tensors its
    backward needs and the caller does not); name: the public function's
    name, which its refusals give (the operator's by default);
    eager_options: keyword-only options of the forward pass for plain
    eager calls (the operator leaves them at their defaults). Its
    docstring is that of the forward pass's module (the op's file), which
    says how to call it."""

    def __init__(self, forward, backward, setup_context=None, result=None, name=None,
                 eager_options=None):
        self.forward = forward
        self.name = name or forward.label
        self.__doc__ = getattr(sys.modules.get(forward.body.__module__), "__doc__", None)
        self.result = result or (lambda output: output)
        setup_context = setup_context or (lambda ctx, inputs, output: None)
        run, options = forward.run, eager_options or {}
        self.function = type(f"{forward.name}_function", (torch.autograd.Function,), {
            "forward": staticmethod(lambda *args: run(*args, **options)),
            "setup_context": staticmethod(setup_context),
            "backward": staticmethod(backward),
            "generate_vmap_rule": True,
            "__doc__": f"{forward.label} for plain eager calls, with its derivative."})
        self._apply = _torch_internals.plain_apply(self.function)
        self.__signature__ = forward.__signature__.replace(
            return_annotation=inspect.Signature.empty)
        forward.operator.register_autograd(_with_every_input(backward, len(forward.parameters)),
                                           setup_context=setup_context)

    def __call__(self, *args, **keywords):
        forward = self.forward
        if keywords or len(args) != len(forward._names):
            args = forward.bind(args, keywords, self.name)
        forward.check(args, self.name)
        if use_operator(*forward.tensors_of(args)):
            return self.result(forward.operator(*args))
        if forward.value_check is not None:
            forward.check_values(args, self.name)
        if _untransformed():
            return self.result(self._apply(*args))
        return self.result(self.function.apply(*args))


def _with_every_input(backward, count):
    """`backward` as the operator runs it. The dispatcher leaves out trailing
    arguments equal to their defaults (torch puts them back for
    setup_context, not for ctx.needs_input_grad): they are None or scalars,
    which need no gradient, so needs_input_grad gets False for each, and the
    backward sees as many inputs as eager calls give it."""
    def operator_backward(ctx, *grad_outputs):
        given = ctx.needs_input_grad
        if len(given) < count:
            ctx.needs_input_grad = (*given, *[False] * (count - len(given)))
        return backward(ctx, *grad_outputs)
    return operator_backward


# Every op's self-check, by the op's public name.
SELF_CHECKS = {}


def self_check(name):
    """Registers the function below as the self-check of the op `name`,
    which `python -m lltm_ffi` runs on every device and dtype there is:
    function(device, dtype) -> None where the op agrees with its
    reference on fresh random inputs there, else what went wrong."""
    def register(function):
        SELF_CHECKS[name] = function
        return function
    return register
