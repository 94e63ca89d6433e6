// The forward pass of the differentiable round (the legacy round_cuda
// example), Caffe style: values at or above 0.5 become 1, all others 0 (NaN
// included, as in torch's `x >= 0.5`). The backward pass is the identity (a
// straight-through estimator), so it needs no kernel: see round_ste.py. Every
// element type; a 16-bit one is compared in float (lltm_math.cuh).

#include "caffe_cuda_macro.h"
#include "lltm_math.cuh"
#include "lltm_op.h"

template <typename Dtype>
__global__ void lltm_round_forward_kernel(const int64_t count,
                                          const Dtype* __restrict__ input,
                                          Dtype* __restrict__ output) {
  CUDA_KERNEL_LOOP(index, count) {
    output[index] = to_storage<Dtype>(to_math(input[index]) >= math_t<Dtype>(0.5) ? 1 : 0);
  }
}

template <typename Dtype>
static cudaError_t round_forward(int64_t count, const void* input, void* output,
                                 cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  lltm_round_forward_kernel<Dtype><<<CAFFE_GET_BLOCKS(count), CAFFE_CUDA_NUM_THREADS, 0, stream>>>(
      count, static_cast<const Dtype*>(input), static_cast<Dtype*>(output));
  CUDA_POST_KERNEL_CHECK;
  return cudaSuccess;
}

LLTM_CUDA_PASS_WITH_HALF(round_forward, round_forward, args->sizes[0], args->tensors[0],
                         args->tensors[1], stream)
