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
LLTM_CPU_PASS(roi_pool_forward, roi_pool_forward, args->sizes[0], args->sizes[1],
              args->sizes[2], args->sizes[3], args->sizes[4], args->sizes[5], args->sizes[6],
              args->scalars[0], args->tensors[0], args->tensors[1], args->tensors[2],
              args->tensors[3])
LLTM_CPU_PASS(roi_pool_backward, roi_pool_backward, args->sizes[0], args->sizes[1],
              args->sizes[2], args->sizes[3], args->sizes[4], args->sizes[5], args->sizes[6],
              args->scalars[0], args->tensors[0], args->tensors[1], args->tensors[2],
              args->tensors[3])
