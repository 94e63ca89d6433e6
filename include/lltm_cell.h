// CUDA device code, for .cu files only: what the cell's kernels
// (lltm_kernel.cu, step_kernel.cu) and the sequence's (src/cuda/recurrence/)
// share, the activations in each math type's precision (lltm_math.cuh:
// float for float, __half and __nv_bfloat16, double for double) and, from
// them, one element of the cell, forward and backward (lltm_cell_math.h,
// the math the CPU passes run too). Callers convert at their loads and
// stores.
#ifndef LLTM_CELL_H
#define LLTM_CELL_H

#include <stdint.h>

#include "lltm_math.cuh"

// The activations the cell's math calls (lltm_cell_math.h), the one place
// where the kernels' accuracy is chosen. Overloads rather than one generic
// call: float math stays in float and double math in double (no
// float-only intrinsic ever sees a double).
//
// Float takes the hardware's exponential and reciprocal (ex2.approx through
// __expf, a few units in the last place over the gates' range, and
// rcp.approx, one), double the correctly rounded library functions. The
// library's expf, expm1f and __frcp_rn cost a recurrence step a fifth of
// its time: on an H200 the cluster kernels at T=1024 B=16 S=128 took 0.90
// and 0.96 us a step forward and backward with them, 0.76 and 0.83 with
// these, at the same error against float64 (outputs 3.1e-6 and 2.9e-6 of
// their largest at 64 steps). exp(z) - 1 stands for expm1 on the ELU's
// negative side: its absolute error there is exp's, which is what the
// cell's sum sees. tanhf stays the library's: tanh.approx is ten times as
// far off.
__device__ __forceinline__ float exp_of(float z) { return __expf(z); }
__device__ __forceinline__ double exp_of(double z) { return exp(z); }
__device__ __forceinline__ float expm1_of(float z) { return __expf(z) - 1.0f; }
__device__ __forceinline__ double expm1_of(double z) { return expm1(z); }
__device__ __forceinline__ float tanh_of(float z) { return tanhf(z); }
__device__ __forceinline__ double tanh_of(double z) { return tanh(z); }
__device__ __forceinline__ float reciprocal_of(float z) {
  float reciprocal;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(reciprocal) : "f"(z));
  return reciprocal;
}
// Correctly rounded, so equal to 1 / z, in fewer instructions than a division.
__device__ __forceinline__ double reciprocal_of(double z) { return __drcp_rn(z); }

// The cell's element, forward and backward (cell_forward_ and
// cell_backward_), for float and double, with the activations above.
#define LLTM_CELL_MATH(name) name##_of
#define LLTM_TYPED_FILE "lltm_cell_math.h"
#include "lltm_each_dtype.h"
#undef LLTM_CELL_MATH

// The launchers take untyped pointers (one C signature for every element
// type); the kernels take typed ones.
template <typename Dtype>
static inline const Dtype* as(const void* pointer) { return static_cast<const Dtype*>(pointer); }
template <typename Dtype>
static inline Dtype* as(void* pointer) { return static_cast<Dtype*>(pointer); }

#endif /* LLTM_CELL_H */
