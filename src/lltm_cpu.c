/* The LLTM's passes on the CPU, the cell's and the whole sequence's: the
 * same math, layout and argument order as the CUDA launchers of
 * lltm_kernel.h, in plain C (the passes themselves: lltm_cpu_impl.h).
 *
 * float uses the branch-free exp/expm1/tanh below (Cephes' polynomials, within
 * a few ulp of libm) so that each row loop vectorises; glibc's scalar calls
 * run several times slower than ATen's vectorised ops. double keeps libm. */
#include <math.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "lltm_cpu.h"
#include "lltm_dtype.h"
#include "lltm_ffi.h"

/* Below this many elements per tensor, waking threads costs more than the loop. */
#define LLTM_CPU_PARALLEL_MIN 32768

/* GNU OpenMP's thread pool does not survive fork(): a forked child inherits
 * the pool's bookkeeping but not its threads, so its first parallel region
 * with more than one thread waits for them forever. torch runs on the same
 * libgomp, so torch's own ops may have started the pool as well as these
 * passes. Hence a forked child never enters a parallel region here: the fork
 * handler registered when the module loads clears lltm_threads_allowed in
 * every child (and so in the children's children). Without a handler the
 * passes never use threads. Only the constructor and the handler write it,
 * each while no pass can run. */
static int lltm_threads_allowed;

static void lltm_forbid_threads(void) { lltm_threads_allowed = 0; }

__attribute__((constructor)) static void lltm_cpu_init(void) {
  lltm_threads_allowed = pthread_atfork(NULL, NULL, lltm_forbid_threads) == 0;
}

/* for (int64_t row = 0; row < rows; ++row) body, across OpenMP threads when
 * there are `elements` enough to pay for them and this process may use them,
 * else on the calling thread without entering OpenMP at all. */
#define LLTM_FOR_EACH_ROW(row, rows, elements, ...)                             \
  do {                                                                          \
    if (lltm_threads_allowed && (elements) >= LLTM_CPU_PARALLEL_MIN) {          \
      _Pragma("omp parallel for schedule(static)")                              \
      for (int64_t row = 0; row < (rows); ++row) __VA_ARGS__                    \
    } else {                                                                    \
      for (int64_t row = 0; row < (rows); ++row) __VA_ARGS__                    \
    }                                                                           \
  } while (0)

/* One copy of each row loop per instruction set, picked at load time. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LLTM_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define LLTM_VECTOR_CLONES
#endif

#if defined(__GNUC__)
#define LLTM_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define LLTM_ALWAYS_INLINE inline
#endif

static inline float float_from_bits(int32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

static inline float exp_float(float x) {
  /* Past these bounds the scaling below overflows to inf or underflows to 0,
   * as exp does; NaN fails both comparisons and stays NaN. */
  x = x > 89.0f ? 89.0f : x;
  x = x < -104.0f ? -104.0f : x;
  /* Round to nearest by the 1.5 * 2^23 trick, which vectorises everywhere. */
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  n = n == n ? n : 0.0f; /* keeps the int conversion defined for NaN */
  /* 2^n in two factors, so that n down to -150 reaches the subnormals. */
  const int32_t k = (int32_t)n;
  const int32_t half = k >> 1;
  return y * float_from_bits((half + 127) << 23) * float_from_bits((k - half + 127) << 23);
}

static inline float expm1_float(float x) {
  /* Near zero exp(x) - 1 cancels; the series to x^8 is exact to rounding there. */
  float p = 1.0f / 40320.0f;
  p = p * x + 1.0f / 5040.0f;
  p = p * x + 1.0f / 720.0f;
  p = p * x + 1.0f / 120.0f;
  p = p * x + 1.0f / 24.0f;
  p = p * x + 1.0f / 6.0f;
  p = p * x + 0.5f;
  const float near_zero = p * x * x + x;
  return fabsf(x) < 0.5f ? near_zero : exp_float(x) - 1.0f;
}

static inline float tanh_float(float x) {
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float near_zero = p * z * x + x;
  const float magnitude = fabsf(x);
  const float far = 1.0f - 2.0f / (exp_float(2.0f * magnitude) + 1.0f);
  return magnitude < 0.625f ? near_zero : copysignf(far, x);
}

static inline double exp_double(double x) { return exp(x); }
static inline double expm1_double(double x) { return expm1(x); }
static inline double tanh_double(double x) { return tanh(x); }

#define SCALAR float
#define SUFFIX float
#include "lltm_cpu_impl.h"
#undef SCALAR
#undef SUFFIX

#define SCALAR double
#define SUFFIX double
#include "lltm_cpu_impl.h"
#undef SCALAR
#undef SUFFIX

int lltm_cpu_forward(int dtype, int64_t batch_size, int64_t state_size, const void* gates,
                     const void* old_cell, void* new_h, void* new_cell) {
  return LLTM_TYPED_CALL(dtype, forward, batch_size, state_size, gates, old_cell, new_h, new_cell);
}

int lltm_cpu_backward(int dtype, int64_t batch_size, int64_t state_size,
                      const int64_t grad_strides[4], const void* grad_h, const void* grad_cell,
                      const void* new_cell, const void* gates, void* d_old_cell, void* d_gates) {
  return LLTM_TYPED_CALL(dtype, backward, batch_size, state_size, grad_strides, grad_h, grad_cell,
                         new_cell, gates, d_old_cell, d_gates);
}

int lltm_cpu_sequence_forward(int dtype, int64_t steps, int64_t batch_size,
                              int64_t input_features, int64_t state_size, const void* inputs,
                              const void* weights, const void* bias, const void* h0,
                              const void* c0, void* outputs, void* cells, void* gates) {
  return LLTM_TYPED_CALL(dtype, sequence_forward, steps, batch_size, input_features, state_size,
                         inputs, weights, bias, h0, c0, outputs, cells, gates);
}

int lltm_cpu_sequence_backward(int dtype, int64_t steps, int64_t batch_size,
                               int64_t input_features, int64_t state_size,
                               const int64_t grad_strides[6], const void* inputs,
                               const void* weights, const void* h0, const void* outputs,
                               const void* cells, const void* gates, const void* grad_outputs,
                               const void* grad_cells, void* d_gates, void* d_inputs,
                               void* d_weights, void* d_bias, void* d_h0, void* d_c0) {
  return LLTM_TYPED_CALL(dtype, sequence_backward, steps, batch_size, input_features, state_size,
                         grad_strides, inputs, weights, h0, outputs, cells, gates, grad_outputs,
                         grad_cells, d_gates, d_inputs, d_weights, d_bias, d_h0, d_c0);
}
