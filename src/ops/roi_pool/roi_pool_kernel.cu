// ROI max pooling (Fast R-CNN's RoIPool), Caffe style: the forward kernel
// pools each bin of each ROI and keeps the flat index of its maximum
// (argmax); the backward kernel gathers, for each input element, the
// gradients of the outputs whose argmax names it. What one thread computes
// is in roi_pool_math.h, which the CPU passes (roi_pool_cpu.c) and
// their C check share.

#include "caffe_cuda_macro.h"
#include "lltm_op.h"

#define LLTM_TYPED_FILE "roi_pool_math.h"
#include "lltm_each_dtype.h"

// One output element (roi, c, ph, pw) a thread.
template <typename Dtype>
__global__ void lltm_roi_pool_forward_kernel(
    const int64_t count, const int64_t batch_size, const int64_t channels, const int64_t height,
    const int64_t width, const int64_t pooled_height, const int64_t pooled_width,
    const Dtype spatial_scale, const Dtype* __restrict__ input, const Dtype* __restrict__ rois,
    Dtype* __restrict__ output, int64_t* __restrict__ argmax) {
  CUDA_KERNEL_LOOP(index, count) {
    const int64_t pw = index % pooled_width;
    const int64_t ph = index / pooled_width % pooled_height;
    const int64_t c = index / pooled_width / pooled_height % channels;
    const int64_t roi = index / pooled_width / pooled_height / channels;
    const roi_pool_box box = roi_pool_place_(rois + roi * 5, spatial_scale, batch_size);
    const roi_pool_window window =
        roi_pool_bin(box, ph, pw, pooled_height, pooled_width, height, width);
    const int64_t plane = (box.batch * channels + c) * height * width;
    const int64_t found = roi_pool_first_maximum_(input, plane, width, window);
    output[index] = found < 0 ? Dtype(0) : input[found];
    argmax[index] = found;
  }
}

template <typename Dtype>
static cudaError_t roi_pool_forward(int64_t batch_size, int64_t channels, int64_t height,
                                    int64_t width, int64_t roi_count, int64_t pooled_height,
                                    int64_t pooled_width, double spatial_scale, const void* input,
                                    const void* rois, void* output, void* argmax,
                                    cudaStream_t stream) {
  const int64_t count = roi_count * channels * pooled_height * pooled_width;
  if (count == 0) return cudaSuccess;
  lltm_roi_pool_forward_kernel<Dtype>
      <<<CAFFE_GET_BLOCKS(count), CAFFE_CUDA_NUM_THREADS, 0, stream>>>(
          count, batch_size, channels, height, width, pooled_height, pooled_width,
          Dtype(spatial_scale), static_cast<const Dtype*>(input), static_cast<const Dtype*>(rois),
          static_cast<Dtype*>(output), static_cast<int64_t*>(argmax));
  CUDA_POST_KERNEL_CHECK;
  return cudaSuccess;
}

// One input element a thread, each the only writer of its gradient: no
// atomics, the same sums on every run.
template <typename Dtype>
__global__ void lltm_roi_pool_backward_kernel(
    const int64_t count, const int64_t batch_size, const int64_t channels, const int64_t height,
    const int64_t width, const int64_t roi_count, const int64_t pooled_height,
    const int64_t pooled_width, const Dtype spatial_scale, const Dtype* __restrict__ grad_output,
    const Dtype* __restrict__ rois, const int64_t* __restrict__ argmax,
    Dtype* __restrict__ grad_input) {
  CUDA_KERNEL_LOOP(index, count) {
    grad_input[index] = roi_pool_gathered_gradient_(index, batch_size, channels, height, width,
                                                    roi_count, pooled_height, pooled_width,
                                                    spatial_scale, grad_output, rois, argmax);
  }
}

template <typename Dtype>
static cudaError_t roi_pool_backward(int64_t batch_size, int64_t channels, int64_t height,
                                     int64_t width, int64_t roi_count, int64_t pooled_height,
                                     int64_t pooled_width, double spatial_scale,
                                     const void* grad_output, const void* rois, const void* argmax,
                                     void* grad_input, cudaStream_t stream) {
  const int64_t count = batch_size * channels * height * width;
  if (count == 0) return cudaSuccess;
  lltm_roi_pool_backward_kernel<Dtype>
      <<<CAFFE_GET_BLOCKS(count), CAFFE_CUDA_NUM_THREADS, 0, stream>>>(
          count, batch_size, channels, height, width, roi_count, pooled_height, pooled_width,
          Dtype(spatial_scale), static_cast<const Dtype*>(grad_output),
          static_cast<const Dtype*>(rois), static_cast<const int64_t*>(argmax),
          static_cast<Dtype*>(grad_input));
  CUDA_POST_KERNEL_CHECK;
  return cudaSuccess;
}

// The passes, in the argument order of their declarations in roi_pool.py:
// sizes (batch_size, channels, height, width, roi_count, pooled_height,
// pooled_width), scalars (spatial_scale), then the tensors.
LLTM_CUDA_PASS(roi_pool_forward, roi_pool_forward, LLTM_SIZES(7), LLTM_SCALARS(1), LLTM_TENSORS(4),
               stream)
LLTM_CUDA_PASS(roi_pool_backward, roi_pool_backward, LLTM_SIZES(7), LLTM_SCALARS(1),
               LLTM_TENSORS(4), stream)
