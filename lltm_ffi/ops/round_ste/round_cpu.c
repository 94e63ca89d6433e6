/* The differentiable round's forward pass on the CPU: the same rule and
 * arguments as round_kernel.cu's, in plain C. The loop has no branch the
 * compiler cannot turn into a select, so it vectorises. */
#include <stdint.h>

#include "lltm_op.h"

static int round_forward_float(int64_t count, const float* input, float* output) {
  for (int64_t i = 0; i < count; ++i) output[i] = input[i] >= 0.5f ? 1.0f : 0.0f;
  return LLTM_SUCCESS;
}

static int round_forward_double(int64_t count, const double* input, double* output) {
  for (int64_t i = 0; i < count; ++i) output[i] = input[i] >= 0.5 ? 1.0 : 0.0;
  return LLTM_SUCCESS;
}

LLTM_CPU_PASS(round_forward, round_forward, args->sizes[0], args->tensors[0], args->tensors[1])
