"""--half and --autocast: the dtype a --sequence or --accuracy run computes in,
and how it gets there. --half DTYPE: the modules and the data in DTYPE.
--autocast DTYPE: float32 modules and data, each forward under
torch.autocast(device, DTYPE). Either way the loss is summed in float32 and
the backward runs outside autocast."""

import contextlib
from dataclasses import dataclass

import torch

HALF_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Precision:
    """kind: "full" (float32, or float64 with -d), "half" or "autocast";
    dtype: the modules' and the data's dtype; compute: the dtype the
    models are asked to run in."""
    kind: str
    dtype: torch.dtype
    compute: torch.dtype

    @classmethod
    def of(cls, args, full_dtype):
        """The precision benchmark.py's arguments ask for; `full_dtype`
        (float32, or float64 with -d) without --half and --autocast."""
        if args.half:
            dtype = HALF_DTYPES[args.half]
            return cls("half", dtype, dtype)
        if args.autocast:
            return cls("autocast", torch.float32, HALF_DTYPES[args.autocast])
        return cls.full(full_dtype)

    @classmethod
    def full(cls, dtype):
        return cls("full", dtype, dtype)

    @property
    def name(self):
        """bfloat16, float16 autocast, float32, ..."""
        name = str(self.compute).removeprefix("torch.")
        return f"{name} autocast" if self.kind == "autocast" else name

    @property
    def flag(self):
        """The command-line flag of a reduced precision (--half bf16), '' for full."""
        if self.kind == "full":
            return ""
        short = next(key for key, value in HALF_DTYPES.items() if value == self.compute)
        return f"--{self.kind} {short}"

    def describe(self):
        """What the timed step does, for a report's first paragraph."""
        if self.kind == "half":
            return (f"modules and data in {self.name}, the loss summed in float32, the gradients "
                    f"in {self.name}")
        if self.kind == "autocast":
            dtype = self.name.removesuffix(" autocast")
            return (f"float32 modules and data, each forward under torch.autocast(dtype="
                    f"torch.{dtype}), the loss summed in float32, the backward outside autocast "
                    "(float32 gradients)")
        return str(self.dtype).removeprefix("torch.")

    def forward(self, device):
        """The context each forward runs in: autocast for --autocast."""
        if self.kind == "autocast":
            return torch.autocast(device.type, dtype=self.compute)
        return contextlib.nullcontext()


def loss(outputs):
    """The sum of `outputs`, in float32 where they are in a half dtype."""
    return (outputs.float() if outputs.dtype in HALF_DTYPES.values() else outputs).sum()
