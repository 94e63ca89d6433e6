"""round_ste: the legacy round_cuda example, ported."""

from .round_ste import round_ste

__all__ = ["round_ste"]
