/* roi_pool's CPU passes for one element type: roi_pool_cpu.c includes this
 * file with SCALAR and SUFFIX defined, once for float and once for double;
 * it undefines both at its end. */
#include "roi_pool_math.h"

/* output and argmax (roi_count, channels, pooled_height, pooled_width): each
 * bin's first maximum and its flat index into input; 0 and -1 for a bin
 * with no number. */
static int LLTM_NAME(roi_pool_forward_)(int64_t batch_size, int64_t channels, int64_t height,
                                        int64_t width, int64_t roi_count, int64_t pooled_height,
                                        int64_t pooled_width, double spatial_scale,
                                        const SCALAR* input, const SCALAR* rois, SCALAR* output,
                                        int64_t* argmax) {
  const int64_t bins = pooled_height * pooled_width;
  LLTM_FOR_EACH(pair, roi_count * channels, roi_count * channels * bins, {
    const roi_pool_box box =
        LLTM_NAME(roi_pool_place_)(rois + pair / channels * 5, (SCALAR)spatial_scale, batch_size);
    const int64_t plane = (box.batch * channels + pair % channels) * height * width;
    for (int64_t bin = 0; bin < bins; ++bin) {
      const roi_pool_window window = roi_pool_bin(box, bin / pooled_width, bin % pooled_width,
                                                  pooled_height, pooled_width, height, width);
      const int64_t found = LLTM_NAME(roi_pool_first_maximum_)(input, plane, width, window);
      output[pair * bins + bin] = found < 0 ? (SCALAR)0 : input[found];
      argmax[pair * bins + bin] = found;
    }
  });
  return LLTM_SUCCESS;
}

/* grad_input (batch_size, channels, height, width): each output's gradient
 * added to the element its argmax names. One thread owns a channel and adds
 * ROI after ROI, bin after bin: no two threads write one element, and each
 * element's sum runs in the order of the CUDA gather's. An argmax outside
 * its own bin (the operator called with one that the forward pass did not
 * make) adds nothing, as in the gather, and is never written through. */
static int LLTM_NAME(roi_pool_backward_)(int64_t batch_size, int64_t channels, int64_t height,
                                         int64_t width, int64_t roi_count, int64_t pooled_height,
                                         int64_t pooled_width, double spatial_scale,
                                         const SCALAR* grad_output, const SCALAR* rois,
                                         const int64_t* argmax, SCALAR* grad_input) {
  const int64_t bins = pooled_height * pooled_width;
  const int64_t plane_size = height * width;
  LLTM_FOR_EACH(channel, channels, (batch_size * plane_size + roi_count * bins) * channels, {
    for (int64_t n = 0; n < batch_size; ++n) {
      SCALAR* plane = grad_input + (n * channels + channel) * plane_size;
      for (int64_t index = 0; index < plane_size; ++index) plane[index] = 0;
    }
    for (int64_t roi = 0; roi < roi_count; ++roi) {
      const roi_pool_box box =
          LLTM_NAME(roi_pool_place_)(rois + roi * 5, (SCALAR)spatial_scale, batch_size);
      if (box.batch < 0) continue;
      const int64_t plane = (box.batch * channels + channel) * plane_size;
      const int64_t first_output = (roi * channels + channel) * bins;
      for (int64_t bin = 0; bin < bins; ++bin) {
        const int64_t found = argmax[first_output + bin];
        if (found < plane || found - plane >= plane_size) continue;
        const roi_pool_window window = roi_pool_bin(box, bin / pooled_width, bin % pooled_width,
                                                    pooled_height, pooled_width, height, width);
        if (roi_pool_window_holds(window, (found - plane) / width, (found - plane) % width)) {
          grad_input[found] += grad_output[first_output + bin];
        }
      }
    }
  });
  return LLTM_SUCCESS;
}

#undef SCALAR
#undef SUFFIX
