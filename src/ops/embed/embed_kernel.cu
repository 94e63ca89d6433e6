// embed, Caffe's Embed layer (BVLC/caffe src/caffe/layers/embed_layer.cu),
// Caffe style: one element a thread in CUDA_KERNEL_LOOP (a 64-bit counter),
// each kernel above its launcher, whose arguments run sizes, then inputs,
// then outputs, then the stream; nothing launched for no work; the error
// code returned, never printed. An element is loaded into its math type
// (to_math) and rounded once as it is stored (to_storage).
//
// The legacy layer read its indices as floats, cast to int, and trusted
// them: an index outside the table read, and its gradient wrote, outside
// it. Python refuses such an index where it can read the values; where it
// cannot (during CUDA graph capture), the kernels skip it: its output row
// is the bias (or 0) and its gradient goes nowhere.

#include "caffe_cuda_macro.h"
#include "lltm_math.cuh"
#include "lltm_op.h"

// output[n, d] = weight[indices[n], d] (+ bias[d]), one output element a thread.
template <typename Dtype>
__global__ void lltm_embed_forward_kernel(const int64_t count, const int64_t columns,
                                          const int64_t rows, const Dtype* __restrict__ weight,
                                          const int64_t* __restrict__ indices,
                                          const Dtype* __restrict__ bias,
                                          Dtype* __restrict__ output) {
  CUDA_KERNEL_LOOP(index, count) {
    const int64_t row = indices[index / columns];
    const int64_t column = index % columns;
    math_t<Dtype> value = 0;
    if (row >= 0 && row < rows) value = to_math(weight[row * columns + column]);
    if (bias != nullptr) value += to_math(bias[column]);
    output[index] = to_storage<Dtype>(value);
  }
}

template <typename Dtype>
static cudaError_t embed_forward(int64_t index_count, int64_t columns, int64_t rows,
                                 const void* weight, const void* indices, const void* bias,
                                 void* output, cudaStream_t stream) {
  const int64_t count = index_count * columns;
  if (count == 0) return cudaSuccess;
  lltm_embed_forward_kernel<Dtype>
      <<<CAFFE_GET_BLOCKS(count), CAFFE_CUDA_NUM_THREADS, 0, stream>>>(
          count, columns, rows, static_cast<const Dtype*>(weight),
          static_cast<const int64_t*>(indices), static_cast<const Dtype*>(bias),
          static_cast<Dtype*>(output));
  CUDA_POST_KERNEL_CHECK;
  return cudaSuccess;
}

// grad_weight[indices[n], d] += grad_output[n, d], one grad_output element a
// thread, by atomicAdd into grad_weight (zeros, in the math type: float for
// the 16-bit types, rounded to them once by the caller). The threads that add
// into one element do so in an order that varies from run to run, so the
// last bits of a sum of several terms do too.
template <typename Dtype>
__global__ void lltm_embed_backward_kernel(const int64_t count, const int64_t columns,
                                           const int64_t rows,
                                           const Dtype* __restrict__ grad_output,
                                           const int64_t* __restrict__ indices,
                                           math_t<Dtype>* __restrict__ grad_weight) {
  CUDA_KERNEL_LOOP(index, count) {
    const int64_t row = indices[index / columns];
    if (row >= 0 && row < rows) {
      atomicAdd(grad_weight + row * columns + index % columns, to_math(grad_output[index]));
    }
  }
}

template <typename Dtype>
static cudaError_t embed_backward(int64_t index_count, int64_t columns, int64_t rows,
                                  const void* grad_output, const void* indices, void* grad_weight,
                                  cudaStream_t stream) {
  const int64_t count = index_count * columns;
  if (count == 0) return cudaSuccess;
  lltm_embed_backward_kernel<Dtype>
      <<<CAFFE_GET_BLOCKS(count), CAFFE_CUDA_NUM_THREADS, 0, stream>>>(
          count, columns, rows, static_cast<const Dtype*>(grad_output),
          static_cast<const int64_t*>(indices), static_cast<math_t<Dtype>*>(grad_weight));
  CUDA_POST_KERNEL_CHECK;
  return cudaSuccess;
}

// The passes, in the argument order of their declarations in embed.py:
// sizes (index_count, columns, rows), then the tensors.
LLTM_CUDA_PASS_WITH_HALF(embed_forward, embed_forward, args->sizes[0], args->sizes[1],
                         args->sizes[2], args->tensors[0], args->tensors[1], args->tensors[2],
                         args->tensors[3], stream)
LLTM_CUDA_PASS_WITH_HALF(embed_backward, embed_backward, args->sizes[0], args->sizes[1],
                         args->sizes[2], args->tensors[0], args->tensors[1], args->tensors[2],
                         stream)
