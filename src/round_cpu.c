/* The differentiable round's forward pass on the CPU: the same rule and
 * argument order as the launchers in round_kernel.cu, in plain C. The loop
 * has no branch the compiler cannot turn into a select, so it vectorises. */
#include <stdint.h>

#include "lltm_ffi.h"

int lltm_round_forward_cpu_float(int64_t count, const float* input, float* output) {
  for (int64_t i = 0; i < count; ++i) output[i] = input[i] >= 0.5f ? 1.0f : 0.0f;
  return LLTM_SUCCESS;
}

int lltm_round_forward_cpu_double(int64_t count, const double* input, double* output) {
  for (int64_t i = 0; i < count; ++i) output[i] = input[i] >= 0.5 ? 1.0 : 0.0;
  return LLTM_SUCCESS;
}
