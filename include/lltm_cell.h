// CUDA device code, for .cu files only: what the cell's kernels
// (lltm_kernel.cu, step_kernel.cu) and the sequence's (src/cuda/recurrence/)
// share, the activations in each math type's precision (lltm_math.cuh:
// float for float, __half and __nv_bfloat16, double for double) and one
// element of the cell, forward and backward. Callers convert at their loads
// and stores.
#ifndef LLTM_CELL_H
#define LLTM_CELL_H

#include <stdint.h>

#include "lltm_math.cuh"

// Overloads rather than one generic call: float math stays in float and
// double math in double (no float-only intrinsic ever sees a double).
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

template <typename Math>
__device__ __forceinline__ Math sigmoid(Math z) {
  return reciprocal_of(Math(1) + exp_of(-z));
}

// ELU with alpha = 1; expm1 keeps its accuracy near zero.
template <typename Math>
__device__ __forceinline__ Math elu(Math z) {
  return z > Math(0) ? z : expm1_of(z);
}

template <typename Math>
__device__ __forceinline__ Math d_elu(Math z) {
  return z > Math(0) ? Math(1) : exp_of(z);
}

// One element of the forward pass: new_h and new_cell from the three gate
// pre-activations and old_cell, in a math type.
template <typename Math>
__device__ __forceinline__ void cell_forward(Math input_pre, Math output_pre,
                                             Math candidate_pre, Math old_cell, Math* new_h,
                                             Math* new_cell) {
  static_assert(IsMath<Math>::value, "the cell computes in a math type (math_t)");
  const Math cell = old_cell + elu(candidate_pre) * sigmoid(input_pre);
  *new_cell = cell;
  *new_h = tanh_of(cell) * sigmoid(output_pre);
}

// One element of the backward pass: d_old_cell and the three gate gradients
// from the output gradients, new_cell and the gate pre-activations, in a
// math type.
template <typename Math>
__device__ __forceinline__ void cell_backward(Math d_h, Math d_cell, Math new_cell,
                                              Math input_pre, Math output_pre,
                                              Math candidate_pre, Math* d_old_cell,
                                              Math* d_input, Math* d_output,
                                              Math* d_candidate) {
  static_assert(IsMath<Math>::value, "the cell computes in a math type (math_t)");
  const Math input_gate = sigmoid(input_pre);
  const Math output_gate = sigmoid(output_pre);
  const Math tanh_new_cell = tanh_of(new_cell);
  const Math d_new_cell =
      (Math(1) - tanh_new_cell * tanh_new_cell) * output_gate * d_h + d_cell;
  *d_old_cell = d_new_cell;
  *d_input = elu(candidate_pre) * d_new_cell * input_gate * (Math(1) - input_gate);
  *d_output = tanh_new_cell * d_h * output_gate * (Math(1) - output_gate);
  *d_candidate = input_gate * d_new_cell * d_elu(candidate_pre);
}

// The launchers take untyped pointers (one C signature for every element
// type); the kernels take typed ones.
template <typename Dtype>
static inline const Dtype* as(const void* pointer) { return static_cast<const Dtype*>(pointer); }
template <typename Dtype>
static inline Dtype* as(void* pointer) { return static_cast<Dtype*>(pointer); }

#endif /* LLTM_CELL_H */
