/* The extern "C" launchers of src/lltm_kernel.cu, src/sequence_kernel.cu,
 * src/step_kernel.cu and src/round_kernel.cu.
 * Each takes the element type, sizes, raw input pointers, output pointers
 * (device memory) and the stream to launch on, in the order of its lltm_ffi.h
 * entry point, and returns the CUDA error code (cudaSuccess when the launch
 * was accepted). */
#ifndef LLTM_KERNEL_H
#define LLTM_KERNEL_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

cudaError_t lltm_launch_forward(int dtype, int64_t batch_size, int64_t state_size,
                                const void* gates, const void* old_cell, void* new_h,
                                void* new_cell, cudaStream_t stream);
cudaError_t lltm_launch_backward(int dtype, int64_t batch_size, int64_t state_size,
                                 const int64_t grad_strides[4], const void* grad_h,
                                 const void* grad_cell, const void* new_cell, const void* gates,
                                 void* d_old_cell, void* d_gates, cudaStream_t stream);
/* The sequence launchers return an int: a CUDA error code or one of
 * lltm_ffi.h's (a cuBLAS failure). */
int lltm_launch_sequence_forward(int dtype, int64_t steps, int64_t batch_size,
                                 int64_t input_features, int64_t state_size, int options,
                                 const void* inputs, const void* weights, const void* bias,
                                 const void* h0, const void* c0, void* outputs, void* cells,
                                 void* gates, cudaStream_t stream);
int lltm_launch_sequence_backward(int dtype, int64_t steps, int64_t batch_size,
                                  int64_t input_features, int64_t state_size, int options,
                                  const int64_t grad_strides[6], const void* inputs,
                                  const void* weights, const void* h0, const void* outputs,
                                  const void* cells, const void* gates,
                                  const void* grad_outputs, const void* grad_cells,
                                  void* d_gates, void* d_inputs, void* d_weights, void* d_bias,
                                  void* d_h0, void* d_c0, cudaStream_t stream);
/* src/step_kernel.cu: one step of a sequence in lltm_ffi's own kernels,
 * which launch_sequence_forward/_backward take where lltm_step_fits (the gate
 * product at most LLTM_STEP_MULTIPLY_ADDS). The step's gradients come from
 * d_gates (written by the sequence's cell backward pass); any of them may be
 * NULL (not wanted). */
int lltm_step_fits(int64_t batch_size, int64_t input_features, int64_t state_size);
cudaError_t lltm_launch_step_forward(int dtype, int64_t batch_size, int64_t input_features,
                                     int64_t state_size, const void* input, const void* weights,
                                     const void* bias, const void* old_h, const void* old_cell,
                                     void* new_h, void* new_cell, void* gates,
                                     cudaStream_t stream);
cudaError_t lltm_launch_step_gradients(int dtype, int64_t batch_size, int64_t input_features,
                                       int64_t state_size, const void* input,
                                       const void* weights, const void* old_h,
                                       const void* d_gates, void* d_input, void* d_weights,
                                       void* d_bias, void* d_old_h, cudaStream_t stream);
cudaError_t lltm_launch_round_forward(int dtype, int64_t count, const void* input, void* output,
                                      cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* LLTM_KERNEL_H */
