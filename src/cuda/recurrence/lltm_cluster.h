// The cluster-resident recurrence (cluster_kernel.cu) as the plan
// (src/plan.c) and the sequence's launchers (sequence_kernel.cu) see it: a
// plan, and a launcher each way on raw pointers and a stream. Dense steps only, either direction; the
// contracts are those of persistent_kernel.cu's persistent kernels.
#ifndef LLTM_CLUSTER_H
#define LLTM_CLUSTER_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

// How a cluster launch is laid out: `clusters` clusters of `cluster_size`
// blocks of `threads`, each block with `shared_bytes` of dynamic shared
// memory. kernel NULL: no plan (the pass takes another path).
typedef struct {
  const void* kernel;
  int cluster_size;
  int clusters;
  int threads;
  size_t shared_bytes;
} lltm_cluster_plan;

// The plan of the forward (backward 0) or backward recurrence of `steps`
// dense steps of batch_size rows and state_size columns, elements of the
// lltm_dtype `dtype` (any of the four), on the current device; no plan
// where the device is older than compute capability 9.0, the module holds
// no sm_90 code for the kernels, the sizes are past what they take, or the
// clusters would not all be resident at once. A failed query gives no plan
// (and clears the runtime's last error): it never fails a pass.
lltm_cluster_plan lltm_plan_cluster(int dtype, int backward, int64_t steps,
                                               int64_t batch_size, int64_t state_size);

// The forward recurrence: on entry gates (steps, batch, 3 * state) holds
// every step's input part; each step adds the bias (NULL: none) and old_h
// times the hidden weights (the first state_size columns of `weights`, rows
// weights_row_stride apart), keeps the sum in gates, and writes the step's
// outputs and cells; the last step visited (reverse: step 0) leaves its
// state in final_h and final_cell too, where final_h is not NULL.
cudaError_t lltm_launch_cluster_forward(
    const lltm_cluster_plan* plan, int dtype, int64_t steps, int64_t batch_size,
    int64_t state_size, int64_t weights_row_stride, int reverse, const void* bias,
    const void* weights, const void* h0, const void* c0, void* outputs, void* cells,
    void* gates, void* final_h, void* final_cell, cudaStream_t stream);

// The backward recurrence: d_gates of every step from the output
// gradients grad_outputs and grad_cells (NULL: zeros; read through
// grad_strides, their (step, row, column) strides, outputs' then cells')
// and those of the final state (dense (batch, state), NULL: zeros), and
// then d_h0 and d_c0 (each NULL: not wanted).
cudaError_t lltm_launch_cluster_backward(
    const lltm_cluster_plan* plan, int dtype, int64_t steps, int64_t batch_size,
    int64_t state_size, int64_t weights_row_stride, int reverse, const void* weights,
    const void* grad_outputs, const void* grad_cells, const int64_t* grad_strides,
    const void* grad_final_h, const void* grad_final_cell, const void* cells, const void* gates,
    void* d_gates, void* d_h0, void* d_c0, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif  // LLTM_CLUSTER_H
