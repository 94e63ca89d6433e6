/* The extern "C" launchers of src/round_kernel.cu: the element count, the
 * input and output pointers (device memory, dense), the stream to launch on;
 * each returns the CUDA error code (cudaSuccess when the launch was accepted). */
#ifndef LLTM_ROUND_KERNEL_H
#define LLTM_ROUND_KERNEL_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

cudaError_t lltm_launch_round_forward_float(int64_t count, const float* input, float* output,
                                            cudaStream_t stream);
cudaError_t lltm_launch_round_forward_double(int64_t count, const double* input, double* output,
                                             cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* LLTM_ROUND_KERNEL_H */
