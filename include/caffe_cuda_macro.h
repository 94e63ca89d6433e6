/* Caffe's CUDA launch helpers (include/caffe/util/device_alternate.hpp), with
 * two fixes: the loop counter is 64-bit, and the grid size is bounded so a
 * launch never asks for more blocks than the grid-stride loop needs. */
#ifndef LLTM_CAFFE_CUDA_MACRO_H
#define LLTM_CAFFE_CUDA_MACRO_H

#include <stdint.h>
#include <cuda_runtime.h>

/* Caffe's index is an int and wraps near 2^30 elements; this one does not. */
#define CUDA_KERNEL_LOOP(i, n)                                         \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;    \
       i < (n);                                                        \
       i += (int64_t)blockDim.x * gridDim.x)

#define CAFFE_CUDA_NUM_THREADS 256

/* Enough blocks to fill any current GPU many times over; past this the
 * grid-stride loop covers the rest. */
#define CAFFE_MAXIMUM_NUM_BLOCKS 65535

static inline int CAFFE_GET_BLOCKS(const int64_t n) {
  const int64_t blocks = (n + CAFFE_CUDA_NUM_THREADS - 1) / CAFFE_CUDA_NUM_THREADS;
  if (blocks < 1) return 1;
  return blocks < CAFFE_MAXIMUM_NUM_BLOCKS ? (int)blocks : CAFFE_MAXIMUM_NUM_BLOCKS;
}

/* Caffe printed the error and aborted; this hands the code to the caller. */
#define CUDA_POST_KERNEL_CHECK                        \
  do {                                                \
    const cudaError_t lltm_launch_error = cudaGetLastError(); \
    if (lltm_launch_error != cudaSuccess) return lltm_launch_error; \
  } while (0)

#endif /* LLTM_CAFFE_CUDA_MACRO_H */
