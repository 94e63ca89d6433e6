/* ROI max pooling on the CPU: the same math, layout and arguments as
 * roi_pool_kernel.cu's passes, in plain C (the passes themselves:
 * roi_pool_cpu_impl.h; the math both share: roi_pool_math.h). */
#include <math.h>
#include <stdint.h>

#include "lltm_op.h"

#define SCALAR float
#define SUFFIX float
#include "roi_pool_cpu_impl.h"

#define SCALAR double
#define SUFFIX double
#include "roi_pool_cpu_impl.h"

/* The passes, in the argument order of their declarations in roi_pool.py:
 * sizes (batch_size, channels, height, width, roi_count, pooled_height,
 * pooled_width), scalars (spatial_scale), then the tensors. */
LLTM_CPU_PASS(roi_pool_forward, roi_pool_forward, LLTM_SIZES(7), LLTM_SCALARS(1), LLTM_TENSORS(4))
LLTM_CPU_PASS(roi_pool_backward, roi_pool_backward, LLTM_SIZES(7), LLTM_SCALARS(1),
              LLTM_TENSORS(4))
