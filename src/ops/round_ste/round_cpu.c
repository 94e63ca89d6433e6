/* The differentiable round's forward pass on the CPU: the same rule and
 * arguments as round_kernel.cu's, in plain C. The loop has no branch the
 * compiler cannot turn into a select, so it vectorises. float16 and
 * bfloat16 compare their values in float (lltm_half.h converts). */
#include <stdint.h>

#include "lltm_half.h"
#include "lltm_op.h"

static int round_forward_float(int64_t count, const float* input, float* output) {
  for (int64_t i = 0; i < count; ++i) output[i] = input[i] >= 0.5f ? 1.0f : 0.0f;
  return LLTM_SUCCESS;
}

static int round_forward_double(int64_t count, const double* input, double* output) {
  for (int64_t i = 0; i < count; ++i) output[i] = input[i] >= 0.5 ? 1.0 : 0.0;
  return LLTM_SUCCESS;
}

static int round_forward_float16(int64_t count, const lltm_float16* input,
                                 lltm_float16* output) {
  for (int64_t i = 0; i < count; ++i) {
    output[i] = lltm_float_to_float16(lltm_float16_to_float(input[i]) >= 0.5f ? 1.0f : 0.0f);
  }
  return LLTM_SUCCESS;
}

static int round_forward_bfloat16(int64_t count, const lltm_bfloat16* input,
                                  lltm_bfloat16* output) {
  for (int64_t i = 0; i < count; ++i) {
    output[i] = lltm_float_to_bfloat16(lltm_bfloat16_to_float(input[i]) >= 0.5f ? 1.0f : 0.0f);
  }
  return LLTM_SUCCESS;
}

LLTM_CPU_PASS_WITH_HALF(round_forward, round_forward, args->sizes[0], args->tensors[0],
                        args->tensors[1])
