"""roi_pool: ROI max pooling, the legacy faster-rcnn.pytorch op, ported."""

from .roi_pool import RoIPool, roi_pool

__all__ = ["RoIPool", "roi_pool"]
