// What the LLTM's CUDA sources share beyond the cell's math (lltm_cell.h):
// the one step's backward pass that step_kernel.cu borrows from
// cublas_loop_kernel.cu.
#ifndef LLTM_KERNELS_H
#define LLTM_KERNELS_H

#include <stdint.h>
#include <cuda_runtime_api.h>

// One step's cell backward pass (cublas_loop_kernel.cu): d_gates (batch,
// 3 * state) and, where d_old_cell is not NULL, d_old_cell (batch, state)
// from the output gradients grad_h and grad_cell, read through their (row,
// column) strides (grad_strides[1], [2] and [4], [5]; [0] and [3], the step
// strides, are not read), new_cell and the gates.
extern "C" cudaError_t lltm_launch_step_gates_backward(
    int dtype, int64_t batch_size, int64_t state_size, const int64_t* grad_strides,
    const void* grad_h, const void* grad_cell, const void* new_cell, const void* gates,
    void* d_old_cell, void* d_gates, cudaStream_t stream);

#endif  // LLTM_KERNELS_H
