/* What the LLTM's CPU passes of every element type share (each includes it
 * before lltm_cpu_impl.h): the activations the cell's math calls
 * (lltm_cell_math.h), float's branch-free exp/expm1/tanh (all three from
 * Cephes' polynomial for exp, within a few ulp of libm where exp is a
 * normal float) so that each row loop vectorises (glibc's scalar calls run
 * several times slower than ATen's vectorised ops), double's libm, and a
 * division for the reciprocal; the BLAS's products by type. */
#ifndef LLTM_CPU_MATH_H
#define LLTM_CPU_MATH_H

#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

#include "lltm_amx.h"
#include "lltm_blas.h"
#include "lltm_half.h"
#include "lltm_op.h"
#include "lltm_steps.h"

/* One copy of each row loop per instruction set, picked at load time. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LLTM_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define LLTM_VECTOR_CLONES
#endif

/* The row loops vectorise only with the math inlined into them, which gcc's
 * budget for a unit of four families does not reach unasked. */
#if defined(__GNUC__)
#define LLTM_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define LLTM_ALWAYS_INLINE inline
#endif

/* x = n ln 2 + r with |r| <= ln 2 / 2: expm1(r) (Cephes' polynomial for
 * exp(r) - 1 - r, times r^2, plus r) and 2^n. 2^n is made from n's bits in
 * one shift: rounding to nearest by the 1.5 * 2^23 trick, which vectorises
 * everywhere, leaves n in the low bits of `shifted`, all that 2^n's
 * exponent keeps of them. It is a normal float within exp_float's bounds. */
static LLTM_ALWAYS_INLINE float expm1_reduced_float(float x, float* two_to_n) {
  const float shifted = x * 1.44269504088896341f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  *two_to_n = lltm_float_of_bits((lltm_bits_of_float(shifted) + 127u) << 23);
  return p * r * r + r;
}

/* Past these bounds exp is taken as inf and 0 (as exp is from 88.72 up
 * and from -103.98 down), which changes what the cell makes of it (a
 * sigmoid, tanh, the ELU) by less than 1e-38. 2^n in two factors, which
 * reached the subnormals, converted from float (NaN made 0 first), took
 * the cell's row loops 13 to 25% more instructions, and bfloat16's
 * forward row 3.1 ns an element on the H200 machine's Xeon, against 2.7.
 * NaN fails both comparisons and stays NaN. expm1_float keeps the same
 * bounds. */
#define LLTM_EXP_FLOAT_HIGHEST 88.3f
#define LLTM_EXP_FLOAT_LOWEST -87.6f

static LLTM_ALWAYS_INLINE float exp_float(float x) {
  float two_to_n;
  const float scaled = (expm1_reduced_float(x, &two_to_n) + 1.0f) * two_to_n;
  return x > LLTM_EXP_FLOAT_HIGHEST ? HUGE_VALF : x < LLTM_EXP_FLOAT_LOWEST ? 0.0f : scaled;
}

/* 2^n expm1(r) + (2^n - 1): expm1(r) itself where n is 0, near zero, where
 * exp(x) - 1 would cancel. expm1 and tanh once had polynomials of their
 * own near zero beside exp's, each element computing both sides: with
 * exp's alone, on a 2-core Xeon with AMX, one thread, T=16 B=64 S=128
 * inference took 45.2 us a step in bfloat16 against 50.7, and 115.4 in
 * float32 against 121.5. */
static LLTM_ALWAYS_INLINE float expm1_float(float x) {
  float two_to_n;
  const float reduced = expm1_reduced_float(x, &two_to_n);
  const float result = two_to_n * reduced + (two_to_n - 1.0f);
  return x > LLTM_EXP_FLOAT_HIGHEST ? HUGE_VALF : x < LLTM_EXP_FLOAT_LOWEST ? -1.0f : result;
}

/* tanh(|x|) = expm1(2|x|) / (expm1(2|x|) + 2), with x's sign; |x| is taken
 * as at most 44, where tanh is 1 in float and expm1 finite. */
static LLTM_ALWAYS_INLINE float tanh_float(float x) {
  const float magnitude = fabsf(x);
  const float e = expm1_float(2.0f * (magnitude > 44.0f ? 44.0f : magnitude));
  return copysignf(e / (e + 2.0f), x);
}

static LLTM_ALWAYS_INLINE float reciprocal_float(float x) { return 1.0f / x; }

/* The BLAS's product of each SCALAR (lltm_blas.h). */
static inline void blas_gemm_float(int transpose_a, int transpose_b, int64_t m, int64_t n,
                                   int64_t k, const float* a, int64_t lda, const float* b,
                                   int64_t ldb, float beta, float* c, int64_t ldc) {
  lltm_blas_sgemm(transpose_a, transpose_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

static inline void blas_gemm_double(int transpose_a, int transpose_b, int64_t m, int64_t n,
                                    int64_t k, const double* a, int64_t lda, const double* b,
                                    int64_t ldb, double beta, double* c, int64_t ldc) {
  lltm_blas_dgemm(transpose_a, transpose_b, m, n, k, a, lda, b, ldb, beta, c, ldc);
}

static inline void blas_gemv_float(int transpose, int64_t m, int64_t n, const float* a,
                                   int64_t lda, const float* x, float* y) {
  lltm_blas_sgemv(transpose, m, n, a, lda, x, y);
}

static inline void blas_gemv_double(int transpose, int64_t m, int64_t n, const double* a,
                                    int64_t lda, const double* x, double* y) {
  lltm_blas_dgemv(transpose, m, n, a, lda, x, y);
}

static inline double exp_double(double x) { return exp(x); }
static inline double expm1_double(double x) { return expm1(x); }
static inline double tanh_double(double x) { return tanh(x); }
static inline double reciprocal_double(double x) { return 1.0 / x; }

#endif
