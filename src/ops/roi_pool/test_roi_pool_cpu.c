/* Checks roi_pool's CPU passes (roi_pool_cpu.c) for `make asan` and `make
 * valgrind` (tests/c/run_checks.c): roi_pool_forward and roi_pool_backward,
 * float and double, over random small shapes (some with no ROI, no batch
 * or no row) and one past the OpenMP threshold; ROIs inside, across and
 * outside the map, malformed (x2 < x1), with halves to round, batch indices
 * that do not exist, NaN or huge corners; inputs full of ties, with NaN and
 * -inf; the backward pass also given made-up argmax values. Each tensor
 * lives in a buffer of exactly its bytes (NULL when it has no element, as
 * Python passes it). Results are compared, exactly, with a plain double
 * reference written from the rule (roi_pool.py's docstring); gradients are
 * multiples of 1/64, whose sums every type holds exactly. The CUDA backward
 * kernel's gather (roi_pool_math.h) runs here too, on the host, and must
 * give the CPU pass's gradients bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lltm_check.h"

/* The backward kernel's work for one element, run here on the host in
 * double (the float kernel is the same text). */
#define SCALAR double
#define SUFFIX double
#include "roi_pool_math.h"
#undef SCALAR
#undef SUFFIX

static uint64_t rng_state;

static double uniform(void) { /* splitmix64's output, in [0, 1) */
  uint64_t bits = (rng_state += 0x9e3779b97f4a7c15ULL);
  bits = (bits ^ (bits >> 30)) * 0xbf58476d1ce4e5b9ULL;
  bits = (bits ^ (bits >> 27)) * 0x94d049bb133111ebULL;
  return (double)((bits ^ (bits >> 31)) >> 11) / 9007199254740992.0;
}

static int64_t below(int64_t bound) { return (int64_t)(uniform() * (double)bound); }

typedef struct {
  int64_t batch_size, channels, height, width, roi_count, pooled_height, pooled_width;
  double spatial_scale;
} roi_shape;

static long failures;

static void fail(const char* what, const char* type, int64_t index, double got, double expected) {
  if (failures < 20) {
    fprintf(stderr, "MISMATCH roi_pool %s (%s) at %lld: got %.17g, expected %.17g\n", what, type,
            (long long)index, got, expected);
  }
  ++failures;
}

/* ROI rows: batch indices that exist (some fractional), and now and then
 * one that does not; corners on halves of the scaled grid, from 3 before
 * the map to 3 past it; now and then a NaN or huge corner. */
static void draw_rois(const roi_shape* s, double* rois) {
  for (int64_t roi = 0; roi < s->roi_count; ++roi) {
    double* row = rois + roi * 5;
    const double u = uniform();
    row[0] = u < 0.04 ? -1.0 : u < 0.08 ? (double)s->batch_size : u < 0.10 ? NAN
             : (double)below(s->batch_size) + (u < 0.3 ? 0.75 : 0.0);
    const int64_t extents[2] = {s->width, s->height};
    for (int corner = 0; corner < 4; ++corner) {
      const double half_steps = (double)below(2 * (extents[corner % 2] + 6)) - 6.0;
      row[1 + corner] = half_steps * 0.5 / s->spatial_scale;
    }
    const double v = uniform();
    if (v < 0.03) row[1 + below(4)] = NAN;
    else if (v < 0.06) row[1 + below(4)] = (uniform() < 0.5 ? -3e9 : 3e9) / s->spatial_scale;
  }
}

/* Small integers (ties everywhere), some NaN and -inf. */
static double draw_value(void) {
  const double u = uniform();
  if (u < 0.05) return NAN;
  if (u < 0.08) return -INFINITY;
  return floor(uniform() * 12.0) - 6.0;
}

static double draw_gradient(void) { return floor(uniform() * 129.0 - 64.0) / 64.0; }

/* Rounds half away from zero (not with round(), which the passes use). */
static double round_half_away(double value) {
  const double whole = trunc(value);
  if (value - whole >= 0.5) return whole + 1.0;
  if (whole - value >= 0.5) return whole - 1.0;
  return whole;
}

/* box: batch, top, left, rows, columns; 0 where the ROI pools nothing. A
 * float pass scales the corners in float. */
static int reference_box(const roi_shape* s, const double* roi, int single, int64_t box[5]) {
  double corners[4];
  if (!(roi[0] > -1.0 && roi[0] < (double)s->batch_size)) return 0;
  for (int corner = 0; corner < 4; ++corner) {
    const double scaled = single ? (double)((float)roi[1 + corner] * (float)s->spatial_scale)
                                 : roi[1 + corner] * s->spatial_scale;
    corners[corner] = round_half_away(scaled);
    if (!(fabs(corners[corner]) <= 2147483648.0)) return 0;
  }
  box[0] = (int64_t)roi[0];
  box[1] = (int64_t)corners[1];
  box[2] = (int64_t)corners[0];
  box[3] = corners[3] >= corners[1] ? (int64_t)(corners[3] - corners[1]) + 1 : 1;
  box[4] = corners[2] >= corners[0] ? (int64_t)(corners[2] - corners[0]) + 1 : 1;
  return 1;
}

static int64_t clip(double value, int64_t limit) {
  return value < 0.0 ? 0 : value > (double)limit ? limit : (int64_t)value;
}

/* Rows [edges[0], edges[1]) of bin `bin`: the floor and the ceiling of its
 * fractional edges, clipped to the map. */
static void reference_edges(int64_t bin, int64_t bins, int64_t start, int64_t extent,
                            int64_t limit, int64_t edges[2]) {
  edges[0] = clip((double)start + floor((double)bin * (double)extent / (double)bins), limit);
  edges[1] = clip((double)start + ceil((double)(bin + 1) * (double)extent / (double)bins), limit);
}

/* The rows and columns of output `index`'s bin, and its plane in input;
 * 0 where its ROI pools nothing. */
static int reference_bin(const roi_shape* s, const double* rois, int single, int64_t index,
                         int64_t rows[2], int64_t columns[2], int64_t* plane) {
  const int64_t pw = index % s->pooled_width;
  const int64_t ph = index / s->pooled_width % s->pooled_height;
  const int64_t channel = index / s->pooled_width / s->pooled_height % s->channels;
  const int64_t roi = index / s->pooled_width / s->pooled_height / s->channels;
  int64_t box[5];
  if (!reference_box(s, rois + roi * 5, single, box)) return 0;
  reference_edges(ph, s->pooled_height, box[1], box[3], s->height, rows);
  reference_edges(pw, s->pooled_width, box[2], box[4], s->width, columns);
  *plane = (box[0] * s->channels + channel) * s->height * s->width;
  return 1;
}

static void reference_forward(const roi_shape* s, const double* input, const double* rois,
                              int single, int64_t count, double* output, int64_t* argmax) {
  for (int64_t index = 0; index < count; ++index) {
    int64_t rows[2], columns[2], plane;
    output[index] = 0.0;
    argmax[index] = -1;
    if (!reference_bin(s, rois, single, index, rows, columns, &plane)) continue;
    for (int64_t h = rows[0]; h < rows[1]; ++h) {
      for (int64_t w = columns[0]; w < columns[1]; ++w) {
        const double value = input[plane + h * s->width + w];
        if (isnan(value) || (argmax[index] >= 0 && !(value > output[index]))) continue;
        output[index] = value;
        argmax[index] = plane + h * s->width + w;
      }
    }
  }
}

/* Each output's gradient onto the element its argmax names, where that
 * element lies in the output's own bin. */
static void reference_backward(const roi_shape* s, const double* grad_output, const double* rois,
                               const int64_t* argmax, int single, int64_t count,
                               int64_t input_count, double* grad_input) {
  const int64_t plane_size = s->height * s->width;
  for (int64_t index = 0; index < input_count; ++index) grad_input[index] = 0.0;
  for (int64_t index = 0; index < count; ++index) {
    int64_t rows[2], columns[2], plane;
    if (!reference_bin(s, rois, single, index, rows, columns, &plane)) continue;
    const int64_t offset = argmax[index] - plane;
    if (argmax[index] < plane || offset >= plane_size) continue;
    const int64_t h = offset / s->width, w = offset % s->width;
    if (h >= rows[0] && h < rows[1] && w >= columns[0] && w < columns[1]) {
      grad_input[argmax[index]] += grad_output[index];
    }
  }
}

/* A buffer of exactly `count` elements of `size` bytes, all bits set (NaN,
 * or -1 as an integer); NULL for none. */
static void* allocate(int64_t count, size_t size) {
  if (count == 0) return NULL;
  void* buffer = malloc((size_t)count * size);
  if (buffer) memset(buffer, 0xff, (size_t)count * size);
  return buffer;
}

static void* typed_copy(const double* values, int64_t count, int single) {
  void* buffer = allocate(count, single ? sizeof(float) : sizeof(double));
  for (int64_t index = 0; buffer && index < count; ++index) {
    if (single) ((float*)buffer)[index] = (float)values[index];
    else ((double*)buffer)[index] = values[index];
  }
  return buffer;
}

static double typed_at(const void* buffer, int64_t index, int single) {
  return single ? (double)((const float*)buffer)[index] : ((const double*)buffer)[index];
}

/* Both passes on one shape in one type; the backward pass twice: with the
 * forward pass's argmax and with made-up values. */
static void check_shape(const roi_shape* s, const double* input, const double* rois,
                        const double* grad_output, int single) {
  const char* type = single ? "float" : "double";
  const int64_t input_count = s->batch_size * s->channels * s->height * s->width;
  const int64_t count = s->roi_count * s->channels * s->pooled_height * s->pooled_width;
  const int64_t sizes[7] = {s->batch_size, s->channels,      s->height,      s->width,
                            s->roi_count,  s->pooled_height, s->pooled_width};
  const int dtype = single ? LLTM_FLOAT32 : LLTM_FLOAT64;
  const size_t element = single ? sizeof(float) : sizeof(double);
  void* typed_input = typed_copy(input, input_count, single);
  void* typed_rois = typed_copy(rois, s->roi_count * 5, single);
  void* typed_grad_output = typed_copy(grad_output, count, single);
  void* output = allocate(count, element);
  int64_t* argmax = allocate(count, sizeof(int64_t));
  void* grad_input = allocate(input_count, element);
  double* expected_output = allocate(count, sizeof(double));
  int64_t* expected_argmax = allocate(count, sizeof(int64_t));
  double* expected_grad_input = allocate(input_count, sizeof(double));
  const int ready = !((input_count && (!typed_input || !grad_input || !expected_grad_input)) ||
                      (s->roi_count && !typed_rois) ||
                      (count && (!typed_grad_output || !output || !argmax || !expected_output ||
                                 !expected_argmax)));
  if (!ready) {
    fprintf(stderr, "roi_pool check: out of memory\n");
    ++failures;
  }
  if (ready && count) {
    /* Not -1: an argmax the pass leaves unwritten must not pass for an empty bin's. */
    memset(argmax, 0x7f, (size_t)count * sizeof(int64_t));
    void* const forward_tensors[4] = {typed_input, typed_rois, output, argmax};
    if (lltm_check_pass("roi_pool_forward", dtype, sizes, &s->spatial_scale, forward_tensors)) {
      fprintf(stderr, "roi_pool_forward (%s) returned an error\n", type);
      ++failures;
    }
    reference_forward(s, input, rois, single, count, expected_output, expected_argmax);
    for (int64_t index = 0; index < count; ++index) {
      if (argmax[index] != expected_argmax[index]) {
        fail("argmax", type, index, (double)argmax[index], (double)expected_argmax[index]);
      } else if (typed_at(output, index, single) != expected_output[index]) {
        fail("output", type, index, typed_at(output, index, single), expected_output[index]);
      }
    }
  }
  for (int made_up = 0; ready && input_count && made_up < 2; ++made_up) {
    for (int64_t index = 0; made_up && index < count; ++index) {
      const int64_t anywhere = below(input_count + 8) - 4 + (uniform() < 0.1 ? 1LL << 40 : 0);
      argmax[index] = uniform() < 0.5 ? argmax[index] + below(5) - 2 : anywhere;
    }
    void* const backward_tensors[4] = {typed_grad_output, typed_rois, argmax, grad_input};
    if (lltm_check_pass("roi_pool_backward", dtype, sizes, &s->spatial_scale, backward_tensors)) {
      fprintf(stderr, "roi_pool_backward (%s) returned an error\n", type);
      ++failures;
    }
    reference_backward(s, grad_output, rois, argmax, single, count, input_count,
                       expected_grad_input);
    const char* what = made_up ? "grad_input (made-up argmax)" : "grad_input";
    for (int64_t index = 0; index < input_count; ++index) {
      const double got = typed_at(grad_input, index, single);
      const double gathered =
          single ? got
                 : roi_pool_gathered_gradient_double(index, sizes[0], sizes[1], sizes[2],
                                                     sizes[3], sizes[4], sizes[5], sizes[6],
                                                     s->spatial_scale, typed_grad_output,
                                                     typed_rois, argmax);
      if (got != expected_grad_input[index]) {
        fail(what, type, index, got, expected_grad_input[index]);
      } else if (gathered != got) {
        fail(what, "double, the kernel's gather", index, gathered, got);
      }
    }
  }
  free(typed_input);
  free(typed_rois);
  free(typed_grad_output);
  free(output);
  free(argmax);
  free(grad_input);
  free(expected_output);
  free(expected_argmax);
  free(expected_grad_input);
}

static void check_random_shape(const roi_shape* s) {
  const int64_t input_count = s->batch_size * s->channels * s->height * s->width;
  const int64_t count = s->roi_count * s->channels * s->pooled_height * s->pooled_width;
  double* input = malloc((size_t)(input_count + 1) * sizeof(double));
  double* rois = malloc((size_t)(s->roi_count * 5 + 1) * sizeof(double));
  double* grad_output = malloc((size_t)(count + 1) * sizeof(double));
  if (input && rois && grad_output) {
    for (int64_t index = 0; index < input_count; ++index) input[index] = draw_value();
    draw_rois(s, rois);
    for (int64_t index = 0; index < count; ++index) grad_output[index] = draw_gradient();
    check_shape(s, input, rois, grad_output, 1);
    check_shape(s, input, rois, grad_output, 0);
  } else {
    ++failures;
  }
  free(input);
  free(rois);
  free(grad_output);
}

static const double kScales[] = {1.0, 0.5, 0.25, 0.0625, 0.7};

LLTM_CHECK(roi_pool_cpu_passes) {
  rng_state = seed;
  failures = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const roi_shape s = {trial % 50 == 7 ? 0 : 1 + below(3), 1 + below(3),
                         trial % 50 == 9 ? 0 : 1 + below(9), 1 + below(9),
                         trial % 25 == 3 ? 0 : below(7), 1 + below(4), 1 + below(4),
                         kScales[below(5)]};
    check_random_shape(&s);
  }
  /* Past LLTM_PARALLEL_MIN_ELEMENTS, so the passes run on OpenMP threads. */
  const roi_shape large = {2, 8, 24, 21, 96, 7, 7, 0.5};
  check_random_shape(&large);
  return failures;
}
