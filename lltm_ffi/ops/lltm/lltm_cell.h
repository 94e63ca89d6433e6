// CUDA device code, for .cu files only: what the cell's kernels
// (lltm_kernel.cu) and the sequence's (sequence_kernel.cu) share, the
// activations in each element type's own precision and one element of the
// cell, forward and backward.
#ifndef LLTM_CELL_H
#define LLTM_CELL_H

#include <stdint.h>

// Overloads rather than one generic call: float math stays in float and
// double math in double (no float-only intrinsic ever sees a double).
__device__ __forceinline__ float exp_of(float z) { return expf(z); }
__device__ __forceinline__ double exp_of(double z) { return exp(z); }
__device__ __forceinline__ float expm1_of(float z) { return expm1f(z); }
__device__ __forceinline__ double expm1_of(double z) { return expm1(z); }
__device__ __forceinline__ float tanh_of(float z) { return tanhf(z); }
__device__ __forceinline__ double tanh_of(double z) { return tanh(z); }
// Correctly rounded, so equal to 1 / z, in fewer instructions than a division.
__device__ __forceinline__ float reciprocal_of(float z) { return __frcp_rn(z); }
__device__ __forceinline__ double reciprocal_of(double z) { return __drcp_rn(z); }

template <typename Dtype>
__device__ __forceinline__ Dtype sigmoid(Dtype z) {
  return reciprocal_of(Dtype(1) + exp_of(-z));
}

// ELU with alpha = 1; expm1 keeps its accuracy near zero.
template <typename Dtype>
__device__ __forceinline__ Dtype elu(Dtype z) {
  return z > Dtype(0) ? z : expm1_of(z);
}

template <typename Dtype>
__device__ __forceinline__ Dtype d_elu(Dtype z) {
  return z > Dtype(0) ? Dtype(1) : exp_of(z);
}

// One element of the forward pass: new_h and new_cell from the three gate
// pre-activations and old_cell.
template <typename Dtype>
__device__ __forceinline__ void cell_forward(Dtype input_pre, Dtype output_pre,
                                             Dtype candidate_pre, Dtype old_cell, Dtype* new_h,
                                             Dtype* new_cell) {
  const Dtype cell = old_cell + elu(candidate_pre) * sigmoid(input_pre);
  *new_cell = cell;
  *new_h = tanh_of(cell) * sigmoid(output_pre);
}

// One element of the backward pass: d_old_cell and the three gate gradients
// from the output gradients, new_cell and the gate pre-activations.
template <typename Dtype>
__device__ __forceinline__ void cell_backward(Dtype d_h, Dtype d_cell, Dtype new_cell,
                                              Dtype input_pre, Dtype output_pre,
                                              Dtype candidate_pre, Dtype* d_old_cell,
                                              Dtype* d_input, Dtype* d_output,
                                              Dtype* d_candidate) {
  const Dtype input_gate = sigmoid(input_pre);
  const Dtype output_gate = sigmoid(output_pre);
  const Dtype tanh_new_cell = tanh_of(new_cell);
  const Dtype d_new_cell =
      (Dtype(1) - tanh_new_cell * tanh_new_cell) * output_gate * d_h + d_cell;
  *d_old_cell = d_new_cell;
  *d_input = elu(candidate_pre) * d_new_cell * input_gate * (Dtype(1) - input_gate);
  *d_output = tanh_new_cell * d_h * output_gate * (Dtype(1) - output_gate);
  *d_candidate = input_gate * d_new_cell * d_elu(candidate_pre);
}

// The launchers take untyped pointers (one C signature for both element
// types); the kernels take typed ones.
template <typename Dtype>
static inline const Dtype* as(const void* pointer) { return static_cast<const Dtype*>(pointer); }
template <typename Dtype>
static inline Dtype* as(void* pointer) { return static_cast<Dtype*>(pointer); }

#endif /* LLTM_CELL_H */
