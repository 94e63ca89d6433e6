"""embed: Caffe's Embed layer, ported (rows of a table picked by integer indices)."""

from .embed import Embed, embed

# The public names: the package exports each as lltm_ffi.<name>.
__all__ = ["Embed", "embed"]
