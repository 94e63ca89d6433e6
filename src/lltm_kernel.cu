// The LLTM cell's two fused pointwise passes, Caffe style. The matrix products
// around them stay in torch; these kernels see only raw pointers.
//
// Layout: gates is (batch, 3 * state) with the input gate, output gate and
// candidate cell pre-activations side by side in each row; every other tensor
// is (batch, state). The backward pass recomputes the activations from gates
// instead of reading them back, which moves fewer bytes than saving them.

#include "caffe_cuda_macro.h"
#include "lltm_kernel.h"

// Overloads rather than one generic call: float math stays in float and
// double math in double (no float-only intrinsic ever sees a double).
__device__ __forceinline__ float exp_of(float z) { return expf(z); }
__device__ __forceinline__ double exp_of(double z) { return exp(z); }
__device__ __forceinline__ float expm1_of(float z) { return expm1f(z); }
__device__ __forceinline__ double expm1_of(double z) { return expm1(z); }
__device__ __forceinline__ float tanh_of(float z) { return tanhf(z); }
__device__ __forceinline__ double tanh_of(double z) { return tanh(z); }

template <typename Dtype>
__device__ __forceinline__ Dtype sigmoid(Dtype z) {
  return Dtype(1) / (Dtype(1) + exp_of(-z));
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

template <typename Dtype>
__global__ void lltm_forward_kernel(const int64_t count, const int64_t state_size,
                                    const Dtype* __restrict__ gates,
                                    const Dtype* __restrict__ old_cell,
                                    Dtype* __restrict__ new_h,
                                    Dtype* __restrict__ new_cell) {
  CUDA_KERNEL_LOOP(index, count) {
    const int64_t row = index / state_size;
    const int64_t column = index - row * state_size;
    const Dtype* gate_row = gates + row * 3 * state_size + column;
    const Dtype input_gate = sigmoid(gate_row[0]);
    const Dtype output_gate = sigmoid(gate_row[state_size]);
    const Dtype candidate_cell = elu(gate_row[2 * state_size]);
    const Dtype cell = old_cell[index] + candidate_cell * input_gate;
    new_cell[index] = cell;
    new_h[index] = tanh_of(cell) * output_gate;
  }
}

template <typename Dtype>
static cudaError_t launch_forward(int64_t batch_size, int64_t state_size,
                                  const Dtype* gates, const Dtype* old_cell,
                                  Dtype* new_h, Dtype* new_cell,
                                  cudaStream_t stream) {
  const int64_t count = batch_size * state_size;
  if (count == 0) return cudaSuccess;
  lltm_forward_kernel<Dtype><<<CAFFE_GET_BLOCKS(count), CAFFE_CUDA_NUM_THREADS, 0, stream>>>(
      count, state_size, gates, old_cell, new_h, new_cell);
  CUDA_POST_KERNEL_CHECK;
  return cudaSuccess;
}

extern "C" cudaError_t lltm_launch_forward_float(int64_t batch_size, int64_t state_size,
                                                 const float* gates, const float* old_cell,
                                                 float* new_h, float* new_cell,
                                                 cudaStream_t stream) {
  return launch_forward(batch_size, state_size, gates, old_cell, new_h, new_cell, stream);
}

extern "C" cudaError_t lltm_launch_forward_double(int64_t batch_size, int64_t state_size,
                                                  const double* gates, const double* old_cell,
                                                  double* new_h, double* new_cell,
                                                  cudaStream_t stream) {
  return launch_forward(batch_size, state_size, gates, old_cell, new_h, new_cell, stream);
}

template <typename Dtype>
__global__ void lltm_backward_kernel(const int64_t count, const int64_t state_size,
                                     const Dtype* __restrict__ grad_h,
                                     const Dtype* __restrict__ grad_cell,
                                     const Dtype* __restrict__ new_cell,
                                     const Dtype* __restrict__ gates,
                                     Dtype* __restrict__ d_old_cell,
                                     Dtype* __restrict__ d_gates) {
  CUDA_KERNEL_LOOP(index, count) {
    const int64_t row = index / state_size;
    const int64_t column = index - row * state_size;
    const int64_t gate_offset = row * 3 * state_size + column;
    const Dtype* gate_row = gates + gate_offset;
    Dtype* d_gate_row = d_gates + gate_offset;

    const Dtype candidate_pre = gate_row[2 * state_size];
    const Dtype input_gate = sigmoid(gate_row[0]);
    const Dtype output_gate = sigmoid(gate_row[state_size]);
    const Dtype candidate_cell = elu(candidate_pre);

    const Dtype tanh_new_cell = tanh_of(new_cell[index]);
    const Dtype d_output_gate = tanh_new_cell * grad_h[index];
    const Dtype d_new_cell =
        (Dtype(1) - tanh_new_cell * tanh_new_cell) * output_gate * grad_h[index] +
        grad_cell[index];

    d_old_cell[index] = d_new_cell;
    d_gate_row[0] = candidate_cell * d_new_cell * input_gate * (Dtype(1) - input_gate);
    d_gate_row[state_size] = d_output_gate * output_gate * (Dtype(1) - output_gate);
    d_gate_row[2 * state_size] = input_gate * d_new_cell * d_elu(candidate_pre);
  }
}

template <typename Dtype>
static cudaError_t launch_backward(int64_t batch_size, int64_t state_size,
                                   const Dtype* grad_h, const Dtype* grad_cell,
                                   const Dtype* new_cell, const Dtype* gates,
                                   Dtype* d_old_cell, Dtype* d_gates,
                                   cudaStream_t stream) {
  const int64_t count = batch_size * state_size;
  if (count == 0) return cudaSuccess;
  lltm_backward_kernel<Dtype><<<CAFFE_GET_BLOCKS(count), CAFFE_CUDA_NUM_THREADS, 0, stream>>>(
      count, state_size, grad_h, grad_cell, new_cell, gates, d_old_cell, d_gates);
  CUDA_POST_KERNEL_CHECK;
  return cudaSuccess;
}

extern "C" cudaError_t lltm_launch_backward_float(int64_t batch_size, int64_t state_size,
                                                  const float* grad_h, const float* grad_cell,
                                                  const float* new_cell, const float* gates,
                                                  float* d_old_cell, float* d_gates,
                                                  cudaStream_t stream) {
  return launch_backward(batch_size, state_size, grad_h, grad_cell, new_cell, gates,
                         d_old_cell, d_gates, stream);
}

extern "C" cudaError_t lltm_launch_backward_double(int64_t batch_size, int64_t state_size,
                                                   const double* grad_h, const double* grad_cell,
                                                   const double* new_cell, const double* gates,
                                                   double* d_old_cell, double* d_gates,
                                                   cudaStream_t stream) {
  return launch_backward(batch_size, state_size, grad_h, grad_cell, new_cell, gates,
                         d_old_cell, d_gates, stream);
}
