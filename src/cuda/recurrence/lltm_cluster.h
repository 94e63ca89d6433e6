// The plan of the cluster-resident recurrence (cluster_kernel.cu), for the
// plan of a pass (src/plan.c): how its launch is laid out, or none. Dense
// steps only, either direction. The launch itself takes the persistent
// kernels' arguments (launch_clusters, lltm_recurrence.cuh).
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

#ifdef __cplusplus
}
#endif

#endif  // LLTM_CLUSTER_H
