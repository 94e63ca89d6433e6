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
such argument of a call; with so many dimensions; optional; read through
its strides; read on the host, a CPU tensor whatever the pass's device),
int, float or bool. From the one function come:

- the checks: a TypeError or ValueError naming the argument and the
  function the caller called (the operator, or the op's public function),
  before any address reaches C; a scalar must be one C can hold (an int64,
  a double);
- the torch.library operator lltm_ffi::<name>, with those checks, and its
  fake implementation: the same function run with a `c` that calls
  nothing, on fake tensors, so the outputs' shapes are written once;
- round_forward(input): the checked call, through the operator under
  torch.compile, a tracer or a tensor subclass, else straight into C.

A differentiable op joins a forward pass and its derivative:

    round_ste = op.Op(round_forward, backward=lambda ctx, grad_output: grad_output)

builds the autograd.Function that plain eager calls take, registers the
same backward (and setup_context) with the operator, and calling it picks
between the two. `c(sizes, tensors, scalars=())` runs the C pass: sizes are
ints, scalars floats, and the first of `tensors` gives the element type
and the device. docs/PORTING.md walks a whole op through this.
"""

import inspect
import numbers
import typing

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
    (torch.int64 for indices, say). optional: None is accepted and reaches
    C as NULL.
    strided: C reads it through its strides, so it is passed as it is
    (its negative bit resolved); otherwise it is made contiguous first.
    host: C reads it on the host (sizes that a CUDA pass's launches
    depend on, say), so it must be on the CPU whatever the other tensors'
    device; it must not be a pass's first tensor, which gives the device."""

    def __init__(self, dims=None, dtype=None, optional=False, strided=False, host=False):
        self.dims = (dims,) if isinstance(dims, int) else dims
        self.dtype = dtype
        self.optional = optional
        self.strided = strided
        self.host = host

    def schema(self):
        return "Tensor?" if self.optional else "Tensor"


def _no_call(sizes, tensors, scalars=()):
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

def _dtype_list(dtypes):
    names = [str(dtype) for dtype in dtypes]
    return " and ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " and " + names[-1]


def check_tensor(op, name, tensor, dtype=None):
    """TypeError naming `name` unless `tensor` is a dense tensor of a
    floating dtype lltm_ffi knows (or of `dtype`, where given); which of
    them a pass takes on a device is check_dtype's."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if dtype is None and tensor.dtype not in DTYPES:
        raise TypeError(f"{op}: {name} has dtype {tensor.dtype}; lltm_ffi takes floating-point "
                        f"tensors ({_dtype_list(DTYPES)}, as each op's passes allow)")
    if dtype is not None and tensor.dtype != dtype:
        raise TypeError(f"{op}: {name} has dtype {tensor.dtype}; it must be {dtype}")
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
    """ValueError naming `name` unless `tensor` has the shape `expected`."""
    if tuple(tensor.shape) != tuple(expected):
        raise ValueError(f"{op}: {name} has shape {tuple(tensor.shape)}, expected "
                         f"{tuple(expected)}")


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

    def __init__(self, name, body, check=None, devices=("cpu", "cuda")):
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
        signature = inspect.signature(body)
        # After `c`, the pass's arguments; keyword-only parameters are options
        # of the direct call (run), which the operator leaves at their defaults.
        parameters = [parameter for parameter in list(signature.parameters.values())[1:]
                      if parameter.kind is not inspect.Parameter.KEYWORD_ONLY]
        self.parameters = [(parameter.name, parameter.annotation) for parameter in parameters]
        for name_, kind in self.parameters:
            if not isinstance(kind, Tensor) and kind not in _SCALAR_SCHEMA:
                raise TypeError(f"{self.label}: the annotation of {name_} must be op.Tensor(...), "
                                f"int, float or bool, got {kind!r}")
        self.tensor_positions = [index for index, (_, kind) in enumerate(self.parameters)
                                 if isinstance(kind, Tensor)]
        self._readable = [kind.strided if isinstance(kind, Tensor) else None
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
        if floating is not None:
            check_dtype(op, *floating, self)
        if self.extra_check is not None:
            self.extra_check(op, *args)

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
        return self.body(self.c, *[
            argument if readable is None or argument is None
            else (argument.resolve_neg() if readable else _extension.dense(argument))
            for readable, argument in zip(self._readable, args)], **options)

    def _run_operator(self, *args):
        self.check(args)
        return self.run(*args)

    def _fake(self, *args):
        self.check(args)
        return self.body(_no_call, *args)

    def tensors_of(self, args):
        """The tensor arguments among `args` (those given, None left out)."""
        return [args[index] for index in self.tensor_positions
                if index < len(args) and args[index] is not None]

    def __call__(self, *args):
        if use_operator(*self.tensors_of(args)):
            return self.operator(*args)
        self.check(args)
        return self.run(*args)


# Every pass declared, by name: what the self-check and the tests go over.
PASSES = {}


def c_pass(name, check=None, devices=("cpu", "cuda")):
    """Declares the function below as the C pass `name` (a Pass); `check`,
    where given, is called after the checks the annotations ask for with
    the name of the function the caller called (for its messages) and the
    arguments; `devices`: the device types its C sources register it for
    (("cuda",) for an op with a kernel and no CPU pass, say)."""
    return lambda body: Pass(name, body, check, devices)


class Op:
    """A differentiable op: a forward Pass and its derivative.

    backward(ctx, *grad_outputs) -> a gradient (or None) per argument;
    setup_context(ctx, inputs, output) saves what it needs, as for
    torch.library.register_autograd; result(output) -> what the caller gets
    (the forward's output as it is by default: a pass may return tensors its
    backward needs and the caller does not); name: the public function's
    name, which its refusals give (the operator's by default)."""

    def __init__(self, forward, backward, setup_context=None, result=None, name=None):
        self.forward = forward
        self.name = name or forward.label
        self.result = result or (lambda output: output)
        setup_context = setup_context or (lambda ctx, inputs, output: None)
        run = forward.run
        self.function = type(f"{forward.name}_function", (torch.autograd.Function,), {
            "forward": staticmethod(lambda *args: run(*args)),
            "setup_context": staticmethod(setup_context),
            "backward": staticmethod(backward),
            "generate_vmap_rule": True,
            "__doc__": f"{forward.label} for plain eager calls, with its derivative."})
        self._apply = _torch_internals.plain_apply(self.function)
        forward.operator.register_autograd(backward, setup_context=setup_context)

    def __call__(self, *args):
        self.forward.check(args, self.name)
        if use_operator(*self.forward.tensors_of(args)):
            return self.result(self.forward.operator(*args))
        if _untransformed():
            return self.result(self._apply(*args))
        return self.result(self.function.apply(*args))


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
