/* roi_pool's math, written once for the CPU passes (roi_pool_cpu_impl.h),
 * the kernels (roi_pool_kernel.cu) and the C check (test_roi_pool_cpu.c):
 * where a ROI and its bins lie on the feature map, which element of a bin
 * is its maximum, and what one input element's gradient gathers.
 *
 * A ROI [batch_index, x1, y1, x2, y2] pools from the feature map of its
 * batch index truncated toward zero. Its corners, multiplied by
 * spatial_scale and rounded half away from zero, bound the rows y1 to y2
 * and the columns x1 to x2, both ends included, at least one of each (so
 * a ROI with x2 < x1 covers the column x1 alone). Of its `extent` rows,
 * bin `b` of `bins` covers floor(b * extent / bins) to
 * ceil((b + 1) * extent / bins), the end excluded, clipped to the map; the
 * same for columns. These edges are integers, computed exactly (the
 * legacy kernel rounded them in float).
 *
 * Included once per element type, with SCALAR and SUFFIX defined (as
 * include/lltm_op.h says; CUDA C++ defines SUFFIX empty and tells the two
 * types apart by overloading); the integer part is defined once. */
#ifndef ROI_POOL_MATH_H
#define ROI_POOL_MATH_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define ROI_POOL_FUNCTION static inline __host__ __device__
#else
#define ROI_POOL_FUNCTION static inline
#endif

/* Corners past this (once rounded) would overflow the bin arithmetic
 * below: up to 2^31 - 1 bins of up to 2^32 + 1 rows stay within int64. */
#define ROI_POOL_CORNER_LIMIT 2147483648.0

typedef struct {
  int64_t batch;         /* the feature map it pools from; -1: it pools nothing */
  int64_t top, left;     /* its first row and column, possibly off the map */
  int64_t height, width; /* at least 1 each */
} roi_pool_box;

/* Rows [h_start, h_end) and columns [w_start, w_end) of one bin, on the map. */
typedef struct {
  int64_t h_start, h_end, w_start, w_end;
} roi_pool_window;

ROI_POOL_FUNCTION int64_t roi_pool_clamp(int64_t value, int64_t low, int64_t high) {
  return value < low ? low : value > high ? high : value;
}

/* The box of a ROI from its batch index and its corners already scaled. A
 * batch index outside 0 .. batch_size - 1 once truncated, or a corner that
 * is NaN or past the limit once rounded, pools nothing: such a ROI would
 * read outside the input. */
ROI_POOL_FUNCTION roi_pool_box roi_pool_place(double batch_index, double x1, double y1, double x2,
                                              double y2, int64_t batch_size) {
  const double corners[4] = {round(x1), round(y1), round(x2), round(y2)};
  roi_pool_box box = {-1, 0, 0, 1, 1};
  if (!(batch_index > -1.0 && batch_index < (double)batch_size)) return box;
  for (int corner = 0; corner < 4; ++corner) {
    if (!(fabs(corners[corner]) <= ROI_POOL_CORNER_LIMIT)) return box;
  }
  box.batch = (int64_t)batch_index;
  box.left = (int64_t)corners[0];
  box.top = (int64_t)corners[1];
  box.width = (int64_t)corners[2] - box.left + 1;
  box.height = (int64_t)corners[3] - box.top + 1;
  if (box.width < 1) box.width = 1;
  if (box.height < 1) box.height = 1;
  return box;
}

/* Bin (ph, pw) of the box on a map of height x width; empty for a box that
 * pools nothing. A ceiling ceil(a / b) is written (a - 1) / b + 1 (a >= 1),
 * which stays within the limit above. */
ROI_POOL_FUNCTION roi_pool_window roi_pool_bin(roi_pool_box box, int64_t ph, int64_t pw,
                                               int64_t pooled_height, int64_t pooled_width,
                                               int64_t height, int64_t width) {
  roi_pool_window window = {0, 0, 0, 0};
  if (box.batch < 0) return window;
  window.h_start = roi_pool_clamp(box.top + ph * box.height / pooled_height, 0, height);
  window.h_end = roi_pool_clamp(
      box.top + ((ph + 1) * box.height - 1) / pooled_height + 1, 0, height);
  window.w_start = roi_pool_clamp(box.left + pw * box.width / pooled_width, 0, width);
  window.w_end = roi_pool_clamp(
      box.left + ((pw + 1) * box.width - 1) / pooled_width + 1, 0, width);
  return window;
}

ROI_POOL_FUNCTION int roi_pool_window_holds(roi_pool_window window, int64_t h, int64_t w) {
  return h >= window.h_start && h < window.h_end && w >= window.w_start && w < window.w_end;
}

/* The bins [*first, *end) of `bins` over `extent` rows from row `start`
 * whose rows include `row`: roi_pool_bin turned around, for the gather.
 * From floor(b * extent / bins) <= offset < ceil((b + 1) * extent / bins). */
ROI_POOL_FUNCTION void roi_pool_bins_holding(int64_t row, int64_t start, int64_t extent,
                                             int64_t bins, int64_t* first, int64_t* end) {
  const int64_t offset = row - start;
  if (offset < 0 || offset >= extent) {
    *first = *end = 0;
    return;
  }
  *first = offset * bins / extent;
  *end = ((offset + 1) * bins - 1) / extent + 1;
}

#endif /* ROI_POOL_MATH_H */

/* The ROI's box, its corners scaled in the element type. */
ROI_POOL_FUNCTION roi_pool_box LLTM_NAME(roi_pool_place_)(const SCALAR* roi, SCALAR spatial_scale,
                                                          int64_t batch_size) {
  return roi_pool_place(roi[0], roi[1] * spatial_scale, roi[2] * spatial_scale,
                        roi[3] * spatial_scale, roi[4] * spatial_scale, batch_size);
}

/* The flat index of the window's first maximum in the plane at `plane` (row
 * by row), NaN never chosen; -1 where the window holds no number. */
ROI_POOL_FUNCTION int64_t LLTM_NAME(roi_pool_first_maximum_)(const SCALAR* input, int64_t plane,
                                                             int64_t width,
                                                             roi_pool_window window) {
  int64_t found = -1;
  SCALAR maximum = 0;
  for (int64_t h = window.h_start; h < window.h_end; ++h) {
    for (int64_t w = window.w_start; w < window.w_end; ++w) {
      const int64_t index = plane + h * width + w;
      const SCALAR value = input[index];
      if (found < 0 ? !isnan(value) : value > maximum) {
        maximum = value;
        found = index;
      }
    }
  }
  return found;
}

/* The gradient of input element `index` (n, c, h, w): the sum, ROI after
 * ROI and bin after bin, of the gradients of the outputs whose argmax names
 * it. Only the bins that hold the element can name it; they come from the
 * box the forward pass pooled, so a ROI with x2 < x1 (one column) counts
 * too. The backward kernel's work for one element; the CPU pass adds the
 * same terms in the same order. */
ROI_POOL_FUNCTION SCALAR LLTM_NAME(roi_pool_gathered_gradient_)(
    int64_t index, int64_t batch_size, int64_t channels, int64_t height, int64_t width,
    int64_t roi_count, int64_t pooled_height, int64_t pooled_width, SCALAR spatial_scale,
    const SCALAR* grad_output, const SCALAR* rois, const int64_t* argmax) {
  const int64_t w = index % width;
  const int64_t h = index / width % height;
  const int64_t c = index / width / height % channels;
  const int64_t n = index / width / height / channels;
  SCALAR gradient = 0;
  for (int64_t roi = 0; roi < roi_count; ++roi) {
    const roi_pool_box box = LLTM_NAME(roi_pool_place_)(rois + roi * 5, spatial_scale, batch_size);
    if (box.batch != n) continue;
    int64_t ph_start, ph_end, pw_start, pw_end;
    roi_pool_bins_holding(h, box.top, box.height, pooled_height, &ph_start, &ph_end);
    roi_pool_bins_holding(w, box.left, box.width, pooled_width, &pw_start, &pw_end);
    const int64_t first_output = (roi * channels + c) * pooled_height * pooled_width;
    for (int64_t ph = ph_start; ph < ph_end; ++ph) {
      for (int64_t pw = pw_start; pw < pw_end; ++pw) {
        const int64_t output = first_output + ph * pooled_width + pw;
        if (argmax[output] == index) gradient += grad_output[output];
      }
    }
  }
  return gradient;
}
