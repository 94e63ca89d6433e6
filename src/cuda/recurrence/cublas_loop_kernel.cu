// The cuBLAS path of the recurrence: each step's recurrent product by cuBLAS,
// then one pointwise kernel for the step's gate math. Dense or packed
// steps, either direction (lltm_steps.h walks them). Also the cell's
// backward pass of one step, for step_kernel.cu.

#include "lltm_kernels.h"
#include "lltm_recurrence.cuh"

// Forward step's gate math: gates holds the step's input part plus old_h
// W^T; the kernel adds the bias (NULL: none), keeps the sum (the
// pre-activations) in gates where keep_gates, and applies the cell. index
// runs over the step's (row, state column) elements. new_cell may be the
// old cell's memory (step_cells), so not __restrict__.
template <typename Dtype>
__global__ void lltm_sequence_gates_forward_kernel(
    const int64_t count, const int64_t state_size, const Dtype* __restrict__ bias,
    const StepState<Dtype> state, Dtype* __restrict__ gates, Dtype* __restrict__ new_h,
    Dtype* new_cell, const bool keep_gates) {
  typedef math_t<Dtype> Math;
  CUDA_KERNEL_LOOP(index, count) {
    const int64_t row = index / state_size, column = index - row * state_size;
    const int64_t gate = index + 2 * row * state_size;  // row * 3 * state + column
    Math pre[3];
#pragma unroll
    for (int g = 0; g < 3; ++g) {
      pre[g] = keep_gate(&gates[gate + g * state_size],
                         to_math(gates[gate + g * state_size]) +
                             (bias ? to_math(bias[g * state_size + column]) : Math(0)),
                         keep_gates);
    }
    step_cell_forward(pre, state, row, index, new_h, new_cell);
  }
}

// A step's old h times the hidden weights, added to its gates: the rows it
// carries from the previous step and those that start from h0, each block
// of rows one product.
template <typename Dtype>
int sequence_forward_cublas_steps(const ForwardRecurrence<Dtype>& r, cudaStream_t stream) {
  const int64_t state_size = r.state_size, gates_size = 3 * state_size;
  return for_each_step(r.walk, [&](const lltm_step& step) -> int {
    Dtype* step_gates = r.gates + step.offset * gates_size;
    int code = LLTM_SUCCESS;
    if (step.carried) {
      code = product<Dtype>(true, stream, step.carried, gates_size, state_size,
                            r.outputs + step.previous_offset * state_size, state_size, false,
                            r.weights, r.weights_row_stride, true, true, step_gates, gates_size);
    }
    if (code == LLTM_SUCCESS && step.carried < step.rows) {
      code = product<Dtype>(true, stream, step.rows - step.carried, gates_size, state_size,
                            r.h0 + step.carried * state_size, state_size, false, r.weights,
                            r.weights_row_stride, true, true,
                            step_gates + step.carried * gates_size, gates_size);
    }
    if (code != LLTM_SUCCESS) return code;
    const int64_t elements = step.rows * state_size;
    lltm_sequence_gates_forward_kernel<Dtype>
        <<<CAFFE_GET_BLOCKS(elements), CAFFE_CUDA_NUM_THREADS, 0, stream>>>(
            elements, state_size, r.bias, step_state(r, step), step_gates,
            r.outputs + step.offset * state_size, step_cells(r, step.offset), r.cells != NULL);
    CUDA_POST_KERNEL_CHECK;
    return LLTM_SUCCESS;
  });
}

// Backward step's gate math: d_h_next holds the gradient reaching h from the
// next step (its d_gates times W, by cuBLAS) for the rows it continues;
// d_cell carries the gradient reaching each cell, as in the step-by-step
// kernel (NULL: a single step's d_c0, not wanted).
template <typename Dtype>
__global__ void lltm_sequence_gates_backward_kernel(
    const int64_t count, const int64_t state_size, const Dtype* __restrict__ d_h_next,
    const StepGradients<Dtype> gradients, const Dtype* __restrict__ cells,
    const Dtype* __restrict__ gates, Dtype* __restrict__ d_cell, Dtype* __restrict__ d_gates) {
  CUDA_KERNEL_LOOP(index, count) {
    const int64_t row = index / state_size, column = index - row * state_size;
    const int64_t gate = index + 2 * row * state_size;
    step_cell_backward(gradients, row, column, index,
                       row < gradients.continued ? to_math(d_h_next[index]) : math_t<Dtype>(0),
                       d_cell, to_math(cells[index]), gates + gate, state_size, d_cell,
                       d_gates + gate);
  }
}

// One step's gate math backward over its `count` (rows x state) elements:
// the kernel above, launched.
template <typename Dtype>
static cudaError_t launch_gates_backward(int64_t count, int64_t state_size, const Dtype* d_h_next,
                                         const StepGradients<Dtype>& gradients,
                                         const Dtype* cells, const Dtype* gates, Dtype* d_cell,
                                         Dtype* d_gates, cudaStream_t stream) {
  lltm_sequence_gates_backward_kernel<Dtype>
      <<<CAFFE_GET_BLOCKS(count), CAFFE_CUDA_NUM_THREADS, 0, stream>>>(
          count, state_size, d_h_next, gradients, cells, gates, d_cell, d_gates);
  CUDA_POST_KERNEL_CHECK;
  return cudaSuccess;
}

// d_h0 holds the gradient reaching each step's h from the step after it;
// the gradient of h0 itself comes after the loop (initial_state_grads).
template <typename Dtype>
int sequence_backward_cublas_steps(const BackwardRecurrence<Dtype>& r, cudaStream_t stream) {
  const int64_t state_size = r.state_size, gates_size = 3 * state_size;
  return for_each_step_backward(r.walk, [&](const lltm_step& step, int64_t next_offset) -> int {
    if (step.continued) {
      const int code = product<Dtype>(true, stream, step.continued, state_size, gates_size,
                                      r.d_gates + next_offset * gates_size, gates_size, false,
                                      r.weights, r.weights_row_stride, false, false, r.d_h0,
                                      state_size);
      if (code != LLTM_SUCCESS) return code;
    }
    return launch_gates_backward<Dtype>(step.rows * state_size, state_size, r.d_h0,
                                        step_gradients(r, step),
                                        r.cells + step.offset * state_size,
                                        r.gates + step.offset * gates_size, r.d_c0,
                                        r.d_gates + step.offset * gates_size, stream);
  });
}
// A single step's cell backward pass, for step_kernel.cu (lltm_kernels.h).
template <typename Dtype>
static cudaError_t step_gates_backward(int64_t batch_size, int64_t state_size,
                                       const int64_t* grad_strides, const void* grad_h,
                                       const void* grad_cell, const void* new_cell,
                                       const void* gates, void* d_old_cell, void* d_gates,
                                       cudaStream_t stream) {
  const StepGradients<Dtype> gradients = {
      as<Dtype>(grad_h), as<Dtype>(grad_cell),
      {{0, grad_strides[1], grad_strides[2]}, {0, grad_strides[4], grad_strides[5]}}, NULL, NULL,
      0};
  return launch_gates_backward<Dtype>(batch_size * state_size, state_size, NULL, gradients,
                                      as<Dtype>(new_cell), as<Dtype>(gates),
                                      as<Dtype>(d_old_cell), as<Dtype>(d_gates), stream);
}

extern "C" cudaError_t lltm_launch_step_gates_backward(
    int dtype, int64_t batch_size, int64_t state_size, const int64_t* grad_strides,
    const void* grad_h, const void* grad_cell, const void* new_cell, const void* gates,
    void* d_old_cell, void* d_gates, cudaStream_t stream) {
  return LLTM_TYPED_CALL_WITH_HALF(dtype, step_gates_backward, batch_size, state_size,
                                   grad_strides, grad_h, grad_cell, new_cell, gates, d_old_cell,
                                   d_gates, stream);
}

// What the other files of the recurrence call (lltm_recurrence.cuh), for
// every element type.
#define LLTM_INSTANTIATE(Dtype)                                                              \
  template int sequence_forward_cublas_steps<Dtype>(const ForwardRecurrence<Dtype>&,         \
                                                    cudaStream_t);                           \
  template int sequence_backward_cublas_steps<Dtype>(const BackwardRecurrence<Dtype>&,       \
                                                     cudaStream_t);
LLTM_FOR_EVERY_DTYPE(LLTM_INSTANTIATE)
