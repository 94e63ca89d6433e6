// The sequence's recurrence on a CUDA device as the plan (src/plan.c)
// chooses it and the passes (sequence_kernel.cu) run it, in C: the plan of
// a pass, and what the plan asks the paths' own files.
#ifndef LLTM_PLAN_H
#define LLTM_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "lltm_cluster.h"
#include "lltm_op.h"

#ifdef __cplusplus
extern "C" {
#endif

// Past this many elements (batch x state) the persistent kernels take no
// pass, and up to it packed steps take the step-by-step kernels even where
// cuBLAS runs (src/plan.c).
#define LLTM_PERSISTENT_ELEMENTS 16384

// How a persistent launch is laid out, or blocks == 0 where it cannot run
// here (persistent_kernel.cu's plan_persistent).
typedef struct {
  const void* kernel;  // the kernel for the plan's columns a block
  int blocks;
  size_t shared_bytes;
  int cluster;  // blocks a cluster (MulticastStage), or 1: no clusters
} lltm_persistent_plan;

// A pass's recurrence: `path` an lltm_path of the GPU's (cluster,
// persistent, cuBLAS loop, step-by-step), with the cluster or persistent
// launch's layout where it is one of those; or, where the path forced
// cannot take the pass, its LLTM_ERROR_PATH code.
typedef struct {
  int path;
  lltm_cluster_plan cluster;
  lltm_persistent_plan persistent;
} lltm_recurrence_plan;

// The plan of one pass `pass` (an lltm_pass, include/lltm_ffi.h) of
// `steps` steps of batch_size rows (packed: packed steps) and state_size
// columns, elements of the lltm_dtype `dtype`, on the current device, with
// `options` (NULL: the defaults); `cublas` says whether the pass's products
// run through cuBLAS (loaded, taking the dtype, and not turned off).
lltm_recurrence_plan lltm_plan_recurrence(int dtype, int pass, int64_t steps,
                                          int64_t batch_size, int64_t state_size, int packed,
                                          const lltm_sequence_options* options, int cublas);

// persistent_kernel.cu: the persistent launch's layout (blocks == 0: none)
// of a pass `pass` (an lltm_pass), its shared staging in clusters where
// `clusters` allows them.
lltm_persistent_plan lltm_plan_persistent(int dtype, int pass, int64_t steps, int64_t batch_size,
                                          int64_t state_size, int clusters);

#ifdef __cplusplus
}
#endif

#endif  // LLTM_PLAN_H
