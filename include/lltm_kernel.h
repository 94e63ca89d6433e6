/* The extern "C" launchers of src/lltm_kernel.cu. Each takes sizes, then raw
 * input pointers, then output pointers, then the stream to launch on, and
 * returns the CUDA error code (cudaSuccess when the launch was accepted). */
#ifndef LLTM_KERNEL_H
#define LLTM_KERNEL_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

cudaError_t lltm_launch_forward_float(int64_t batch_size, int64_t state_size,
                                      const float* gates, const float* old_cell,
                                      float* new_h, float* new_cell,
                                      cudaStream_t stream);
cudaError_t lltm_launch_forward_double(int64_t batch_size, int64_t state_size,
                                       const double* gates, const double* old_cell,
                                       double* new_h, double* new_cell,
                                       cudaStream_t stream);

cudaError_t lltm_launch_backward_float(int64_t batch_size, int64_t state_size,
                                       int64_t grad_h_row_stride, int64_t grad_h_column_stride,
                                       int64_t grad_cell_row_stride, int64_t grad_cell_column_stride,
                                       const float* grad_h, const float* grad_cell,
                                       const float* new_cell, const float* gates,
                                       float* d_old_cell, float* d_gates,
                                       cudaStream_t stream);
cudaError_t lltm_launch_backward_double(int64_t batch_size, int64_t state_size,
                                        int64_t grad_h_row_stride, int64_t grad_h_column_stride,
                                        int64_t grad_cell_row_stride, int64_t grad_cell_column_stride,
                                        const double* grad_h, const double* grad_cell,
                                        const double* new_cell, const double* gates,
                                        double* d_old_cell, double* d_gates,
                                        cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* LLTM_KERNEL_H */
