/* Checks the LLTM's CPU passes (lltm_cpu.c) on their own, for `make asan`
 * and `make valgrind` (tests/c/run_checks.c): forward_pass and
 * backward_pass, in every dtype (float, double, float16, bfloat16), on
 * random inputs over many odd sizes (batch 1..7 and state 1..67, so that
 * every vector tail length occurs, plus sizes past the OpenMP threshold),
 * with the output gradients in several layouts (dense, broadcast rows, one
 * broadcast value, column-major, every other element); and the sequence and
 * packed passes over sizes short of and past their products' tiles and
 * depth blocks. Each tensor lives in its own malloc'd buffer of exactly the
 * bytes its elements span, so that the tool catches any read or write past
 * either end. Results are compared with a double-precision reference (the
 * cell's element of lltm_cell_math.h with libm's activations, and plain
 * loops for the products) computed from the inputs as the pass reads them
 * (rounded to its dtype); the first mismatches are printed. The formulas
 * themselves are checked against torch's in the pytest suite. */
#include <stdint.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lltm_amx.h"
#include "lltm_blas.h"
#include "lltm_check.h"
#include "lltm_half.h"
#include "lltm_padding.h"

static uint64_t rng_state;

static double uniform(void) { /* xorshift64*, in [0, 1) */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (double)((rng_state * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}

/* Mostly unit-scale values of both signs, some large enough to saturate the
 * sigmoids and tanh, some exactly zero (the ELU's branch point). */
static double draw(void) {
  const double u = uniform();
  const double value = uniform() * 2.0 - 1.0;
  if (u < 0.05) return 0.0;
  if (u < 0.15) return value * 40.0;
  if (u < 0.40) return value * 6.0;
  return value * 1.5;
}

/* The dtypes, indexed by lltm_dtype. */
enum { DTYPES = 4 };
static const char* const dtype_names[DTYPES] = {"float", "double", "float16", "bfloat16"};
static const int all_dtypes[DTYPES] = {LLTM_FLOAT32, LLTM_FLOAT64, LLTM_FLOAT16, LLTM_BFLOAT16};
/* Each one's unit roundoff: the largest relative error of a rounding to it. */
static const double unit_roundoff[DTYPES] = {
    5.9604644775390625e-08,  /* 2^-24 */
    1.1102230246251565e-16,  /* 2^-53 */
    4.8828125e-04,           /* 2^-11 */
    3.90625e-03};            /* 2^-8 */
/* And the largest error of a rounding to a subnormal: half the smallest. */
static const double underflow_error[DTYPES] = {
    7.00649232162408535e-46,  /* 2^-150 */
    0.0,                      /* 2^-1075, below double's own */
    2.98023223876953125e-08,  /* 2^-25 */
    4.59177480789956259e-41}; /* 2^-134 */

static int is_half(int dtype) { return dtype == LLTM_FLOAT16 || dtype == LLTM_BFLOAT16; }

static size_t element_size(int dtype) {
  return dtype == LLTM_FLOAT64 ? sizeof(double) : dtype == LLTM_FLOAT32 ? sizeof(float) : 2;
}

/* Element i of a buffer of `dtype`, and `value` stored there (rounded to it). */
static double get(int dtype, const void* buffer, int64_t i) {
  switch (dtype) {
    case LLTM_FLOAT64: return ((const double*)buffer)[i];
    case LLTM_FLOAT16: return lltm_float16_to_float(((const uint16_t*)buffer)[i]);
    case LLTM_BFLOAT16: return lltm_bfloat16_to_float(((const uint16_t*)buffer)[i]);
    default: return ((const float*)buffer)[i];
  }
}

static void put(int dtype, void* buffer, int64_t i, double value) {
  switch (dtype) {
    case LLTM_FLOAT64: ((double*)buffer)[i] = value; break;
    case LLTM_FLOAT16: ((uint16_t*)buffer)[i] = lltm_float_to_float16((float)value); break;
    case LLTM_BFLOAT16: ((uint16_t*)buffer)[i] = lltm_float_to_bfloat16((float)value); break;
    default: ((float*)buffer)[i] = (float)value; break;
  }
}

/* `value` as `dtype` holds it. (double to float to a 16-bit type rounds
 * twice, which can differ from rounding once; what matters here is only
 * that the pass and the reference see the same value.) */
static double rounded(int dtype, double value) {
  union {
    double d;
    float f;
    uint16_t h;
  } element;
  put(dtype, &element, 0, value);
  return get(dtype, &element, 0);
}

static void* allocate(int64_t count, size_t size) {
  /* One byte for an empty tensor: a valid pointer whose every element is out of bounds. */
  const size_t bytes = count > 0 ? (size_t)count * size : 1;
  void* pointer = malloc(bytes);
  if (!pointer) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  /* All bits set is a NaN in every dtype: an output element the pass never
   * writes compares unequal. */
  memset(pointer, 0xff, bytes);
  return pointer;
}

/* Layouts of the output gradients (batch, state): strides in elements. */
enum { DENSE, BROADCAST_ROWS, BROADCAST_ALL, COLUMN_MAJOR, EVERY_OTHER, LAYOUTS };
static const char* const layout_names[LAYOUTS] = {"dense", "broadcast-rows", "broadcast-all",
                                                  "column-major", "every-other"};

static void strides_of(int layout, int64_t batch, int64_t state, int64_t* row, int64_t* column) {
  switch (layout) {
    case BROADCAST_ROWS: *row = 0; *column = 1; break;
    case BROADCAST_ALL: *row = 0; *column = 0; break;
    case COLUMN_MAJOR: *row = 1; *column = batch; break;
    case EVERY_OTHER: *row = 2 * state; *column = 2; break;
    default: *row = state; *column = 1; break;
  }
}

/* Elements a (batch, state) view with these strides spans. */
static int64_t span(int64_t batch, int64_t state, int64_t row, int64_t column) {
  if (batch == 0 || state == 0) return 0;
  return (batch - 1) * row + (state - 1) * column + 1;
}

/* The cell in double precision: the passes' own math (lltm_cell_math.h)
 * with libm's activations, correctly rounded or nearly, for reference. */
static double reciprocal(double z) { return 1.0 / z; }
#define LLTM_CELL_MATH(name) name
#define SCALAR double
#define SUFFIX double
#include "lltm_cell_math.h"
#undef SCALAR
#undef SUFFIX
#undef LLTM_CELL_MATH

static long failures;
static long checked;
/* Largest |got - expected| / (eps * scale) of the cell's passes, and the
 * sequence passes' largest relative error, per dtype. */
static double worst[DTYPES];
static double worst_sequence[DTYPES];

/* The cell's tolerance, in roundings to the dtype of `scale`, the size of
 * the terms a value is computed from: float and double compute in their own
 * type, a few roundings each; float16 and bfloat16 compute in float, then
 * round the result once, to within one rounding of its size (at most
 * `scale`), and float's arithmetic adds under a hundredth of one more. */
static const double cell_roundings[DTYPES] = {16.0, 16.0, 1.25, 1.25};

/* |got - expected| within the dtype's cell_roundings of `scale`; NaN never is. */
static void compare(const char* what, int dtype, const char* layout, int64_t batch,
                    int64_t state, int64_t index, double got, double expected, double scale) {
  ++checked;
  const double eps = unit_roundoff[dtype];
  const double tolerance = cell_roundings[dtype] * eps * scale;
  const double ratio = fabs(got - expected) / (eps * scale);
  if (ratio > worst[dtype]) worst[dtype] = ratio;
  if (fabs(got - expected) <= tolerance) return;
  if (failures < 20) {
    fprintf(stderr,
            "MISMATCH %s %s (gradients %s) batch=%lld state=%lld index=%lld: got %.9g, "
            "expected %.9g (tolerance %.3g)\n",
            dtype_names[dtype], what, layout, (long long)batch, (long long)state,
            (long long)index, got, expected, tolerance);
  }
  ++failures;
}

/* An input value: for the 16-bit types never zero in the type. */
static double draw_for(int dtype) {
  double value = draw();
  while (is_half(dtype) && rounded(dtype, value) == 0.0) value = draw();
  return value;
}

static void check_cell(int dtype, int64_t batch, int64_t state, int layout) {
  const int64_t n = batch * state;
  const char* layout_name = layout_names[layout];
  const size_t size = element_size(dtype);
  int64_t row_stride, column_stride;
  strides_of(layout, batch, state, &row_stride, &column_stride);
  const int64_t grad_count = span(batch, state, row_stride, column_stride);
  void* gates = allocate(3 * n, size);
  void* old_cell = allocate(n, size);
  void* new_h = allocate(n, size);
  void* new_cell = allocate(n, size);
  void* grad_h = allocate(grad_count, size);
  void* grad_cell = allocate(grad_count, size);
  void* d_old_cell = allocate(n, size);
  void* d_gates = allocate(3 * n, size);
  for (int64_t i = 0; i < 3 * n; ++i) put(dtype, gates, i, draw_for(dtype));
  for (int64_t i = 0; i < n; ++i) put(dtype, old_cell, i, draw_for(dtype));
  for (int64_t i = 0; i < grad_count; ++i) {
    put(dtype, grad_h, i, draw_for(dtype));
    put(dtype, grad_cell, i, draw_for(dtype));
  }
  const int64_t sizes[6] = {batch, state, row_stride, column_stride, row_stride, column_stride};
  void* const forward_tensors[4] = {gates, old_cell, new_h, new_cell};
  void* const backward_tensors[6] = {grad_h, grad_cell, new_cell, gates, d_old_cell, d_gates};
  if (lltm_check_pass("forward_pass", dtype, sizes, NULL, forward_tensors) != LLTM_SUCCESS) {
    fprintf(stderr, "forward_pass (%s) returned an error\n", dtype_names[dtype]);
    ++failures;
  }
  if (lltm_check_pass("backward_pass", dtype, sizes, NULL, backward_tensors) != LLTM_SUCCESS) {
    fprintf(stderr, "backward_pass (%s) returned an error\n", dtype_names[dtype]);
    ++failures;
  }
  for (int64_t row = 0; row < batch; ++row) {
    for (int64_t column = 0; column < state; ++column) {
      const int64_t i = row * state + column;
      const int64_t g = row * 3 * state + column;
      const int64_t d = row * row_stride + column * column_stride;
      const double input_pre = get(dtype, gates, g);
      const double output_pre = get(dtype, gates, g + state);
      const double pre = get(dtype, gates, g + 2 * state);
      const double old = get(dtype, old_cell, i);
      double h, cell;
      cell_forward_double(input_pre, output_pre, pre, old, &h, &cell);
      const double cc = elu_double(pre);
      const double forward_scale = 1.0 + fabs(old) + fabs(cc);
      compare("new_cell", dtype, layout_name, batch, state, i, get(dtype, new_cell, i), cell,
              forward_scale);
      compare("new_h", dtype, layout_name, batch, state, i, get(dtype, new_h, i), h,
              forward_scale);
      /* The backward pass starts from the new_cell the forward pass gave. */
      const double dh = get(dtype, grad_h, d), dc = get(dtype, grad_cell, d);
      double dnc, d_input, d_output, d_candidate;
      cell_backward_double(dh, dc, get(dtype, new_cell, i), input_pre, output_pre, pre, &dnc,
                           &d_input, &d_output, &d_candidate);
      const double backward_scale = (1.0 + fabs(dh) + fabs(dc)) * (1.0 + fabs(cc));
      compare("d_old_cell", dtype, layout_name, batch, state, i, get(dtype, d_old_cell, i), dnc,
              backward_scale);
      compare("d_input_gate", dtype, layout_name, batch, state, g, get(dtype, d_gates, g),
              d_input, backward_scale);
      compare("d_output_gate", dtype, layout_name, batch, state, g + state,
              get(dtype, d_gates, g + state), d_output, backward_scale);
      compare("d_candidate_cell", dtype, layout_name, batch, state, g + 2 * state,
              get(dtype, d_gates, g + 2 * state), d_candidate, backward_scale);
    }
  }
  free(gates);
  free(old_cell);
  free(new_h);
  free(new_cell);
  free(grad_h);
  free(grad_cell);
  free(d_old_cell);
  free(d_gates);
}

/* The whole-sequence passes against the same cell in double precision,
 * step by step. Values are unit-scale (weights scaled by 1 / sqrt(depth)),
 * as a trained layer's are, so that rounding, not the recurrence, sets the
 * error; each result is compared as a whole, by its relative norm. */
struct sequence_shape {
  int64_t steps, batch, input_features, state;
  int strided_grads; /* grad_outputs read transposed from rows twice as long; no grad_cells */
  int state_grads;   /* whether d_h0 and d_c0 are asked for (always past one step) */
};

/* The options the sequence and packed checks pass, each of PRODUCT_PATHS in
 * turn: the 16-bit types' products on AMX where the CPU has it, at every
 * size (and elsewhere as products_plan_ picks: the BLAS's where one is
 * loaded, the own tiles' for small recurrences); the own tiles alone; the
 * BLAS for every product it takes (without a BLAS loaded, the own tiles
 * again). */
#define PRODUCT_PATHS 3
static const lltm_sequence_options product_paths[PRODUCT_PATHS] = {
    {LLTM_PATH_PLANNED, 0, 1, 1, 1, -1, -1},
    {LLTM_PATH_PLANNED, 0, 1, 1, 0, 0, -1},
    {LLTM_PATH_PLANNED, 0, 1, 1, 0, 1, -1}};
static const lltm_sequence_options* products_options;

static double* zeros(int64_t count) {
  double* values = allocate(count, sizeof(double));
  for (int64_t i = 0; i < count; ++i) values[i] = 0.0;
  return values;
}

static double* uniform_values(int64_t count, double scale) {
  double* values = allocate(count, sizeof(double));
  for (int64_t i = 0; i < count; ++i) values[i] = (uniform() * 2.0 - 1.0) * scale;
  return values;
}

/* The reference: every result of both passes, in double. */
struct sequence_reference {
  double *outputs, *cells, *d_inputs, *d_weights, *d_bias, *d_h0, *d_c0;
};

static struct sequence_reference reference_sequence(
    struct sequence_shape shape, const double* inputs, const double* weights, const double* bias,
    const double* h0, const double* c0, const double* grad_outputs, const int64_t* grad_strides,
    const double* grad_cells) {
  const int64_t T = shape.steps, B = shape.batch, F = shape.input_features, S = shape.state;
  const int64_t columns = S + F;
  struct sequence_reference r;
  r.outputs = allocate(T * B * S, sizeof(double));
  r.cells = allocate(T * B * S, sizeof(double));
  r.d_inputs = allocate(T * B * F, sizeof(double));
  r.d_weights = zeros(3 * S * columns);
  r.d_bias = zeros(3 * S);
  r.d_h0 = zeros(B * S);
  r.d_c0 = zeros(B * S);
  double* gates = allocate(T * B * 3 * S, sizeof(double));
  double* d_gates = allocate(B * 3 * S, sizeof(double));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < B; ++b) {
      const double* h = t ? r.outputs + ((t - 1) * B + b) * S : h0 + b * S;
      const double* c = t ? r.cells + ((t - 1) * B + b) * S : c0 + b * S;
      const double* x = inputs + (t * B + b) * F;
      double* g = gates + (t * B + b) * 3 * S;
      for (int64_t j = 0; j < 3 * S; ++j) {
        double sum = bias[j];
        for (int64_t k = 0; k < S; ++k) sum += weights[j * columns + k] * h[k];
        for (int64_t k = 0; k < F; ++k) sum += weights[j * columns + S + k] * x[k];
        g[j] = sum;
      }
      for (int64_t j = 0; j < S; ++j) {
        cell_forward_double(g[j], g[S + j], g[2 * S + j], c[j], &r.outputs[(t * B + b) * S + j],
                            &r.cells[(t * B + b) * S + j]);
      }
    }
  }
  /* d_h0 and d_c0 carry the gradients reaching h_t and c_t. */
  for (int64_t t = T - 1; t >= 0; --t) {
    for (int64_t b = 0; b < B; ++b) {
      const double* g = gates + (t * B + b) * 3 * S;
      double* dg = d_gates + b * 3 * S;
      for (int64_t j = 0; j < S; ++j) {
        const int64_t i = b * S + j;
        const double dh = r.d_h0[i] + grad_outputs[t * grad_strides[0] + b * grad_strides[1] +
                                                   j * grad_strides[2]];
        const double dc = r.d_c0[i] + (grad_cells ? grad_cells[(t * B + b) * S + j] : 0.0);
        cell_backward_double(dh, dc, r.cells[(t * B + b) * S + j], g[j], g[S + j], g[2 * S + j],
                             &r.d_c0[i], &dg[j], &dg[S + j], &dg[2 * S + j]);
      }
      const double* h = t ? r.outputs + ((t - 1) * B + b) * S : h0 + b * S;
      const double* x = inputs + (t * B + b) * F;
      for (int64_t k = 0; k < S; ++k) r.d_h0[b * S + k] = 0.0;
      for (int64_t k = 0; k < F; ++k) r.d_inputs[(t * B + b) * F + k] = 0.0;
      for (int64_t j = 0; j < 3 * S; ++j) {
        r.d_bias[j] += dg[j];
        for (int64_t k = 0; k < S; ++k) {
          r.d_h0[b * S + k] += dg[j] * weights[j * columns + k];
          r.d_weights[j * columns + k] += dg[j] * h[k];
        }
        for (int64_t k = 0; k < F; ++k) {
          r.d_inputs[(t * B + b) * F + k] += dg[j] * weights[j * columns + S + k];
          r.d_weights[j * columns + S + k] += dg[j] * x[k];
        }
      }
    }
  }
  free(gates);
  free(d_gates);
  return r;
}

static void free_reference(struct sequence_reference r) {
  free(r.outputs);
  free(r.cells);
  free(r.d_inputs);
  free(r.d_weights);
  free(r.d_bias);
  free(r.d_h0);
  free(r.d_c0);
}

/* The sequence passes' tolerance on a result's relative error (its
 * norm's): float's and double's, a hundred-odd roundings, leave room for
 * their products' sums. The 16-bit types round every value a pass keeps in
 * a tensor, each by at most the type's unit roundoff u relative to the
 * unit-sized terms it is computed from: each step's h, cell and gates, its
 * gate gradients and the gradients it carries to the step before. An error
 * passed through sigmoid, tanh or the weights (gain under 1 at these
 * scales) shrinks, but the cell and its gradient go from step to step with
 * a gain of 1, taking two roundings a step at most (the gradient's:
 * written, then added to), so that a result's error is within (2 + 2
 * steps) u; the products' sums, in float, add nothing of the type's. */
static double sequence_tolerance(int dtype, int64_t steps) {
  switch (dtype) {
    case LLTM_FLOAT64: return 1e-12;
    case LLTM_FLOAT32: return 1e-5;
    default: return (2.0 + 2.0 * (double)steps) * unit_roundoff[dtype];
  }
}

/* |got - expected| / |expected| over `count` elements within the dtype's
 * sequence_tolerance; NaN (an element never written) never is. */
static void compare_norms(const char* what, int dtype, struct sequence_shape shape,
                          int64_t count, const void* got, const double* expected) {
  double difference = 0.0, norm = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    const double value = get(dtype, got, i);
    difference += (value - expected[i]) * (value - expected[i]);
    norm += expected[i] * expected[i];
  }
  checked += count;
  /* Relative to the result's norm, but never to less than unit elements':
   * the terms every result is computed from are unit-sized, and a result
   * far smaller is their cancellation, which keeps their error. */
  const double scale = fmax(sqrt(norm), sqrt((double)count));
  const double error = count ? sqrt(difference) / scale : 0.0;
  if (error > worst_sequence[dtype]) worst_sequence[dtype] = error;
  const double tolerance = sequence_tolerance(dtype, shape.steps);
  if (error <= tolerance) return;
  if (failures < 20) {
    fprintf(stderr, "MISMATCH %s sequence %s, %lldx%lldx%lldx%lld: relative error %.3g "
            "(tolerance %.3g)\n", dtype_names[dtype], what, (long long)shape.steps,
            (long long)shape.batch, (long long)shape.input_features, (long long)shape.state,
            error, tolerance);
  }
  ++failures;
}

/* `values` rounded in place to what `dtype` holds, so that the reference
 * computes from what the pass reads; NULL stays NULL. */
static double* round_values(int dtype, double* values, int64_t count) {
  for (int64_t i = 0; values && i < count; ++i) values[i] = rounded(dtype, values[i]);
  return values;
}

/* A buffer of `count` elements of `dtype` holding `values`, or NULL where
 * values is. */
static void* typed_copy(const double* values, int64_t count, int dtype) {
  if (!values) return NULL;
  void* copy = allocate(count, element_size(dtype));
  for (int64_t i = 0; i < count; ++i) put(dtype, copy, i, values[i]);
  return copy;
}

/* The products of the sequence passes against the same products, in
 * double, of the very factors the pass read and wrote (its own gates,
 * outputs and gate gradients, as its dtype holds them). Each is summed in
 * float (double for double) and rounded to the dtype once, so that it lies
 * within one rounding of its value, u |value| (or underflow_error, where it
 * is subnormal), plus float's summation error, at most depth + 2 roundings
 * of float of the sum of its terms' magnitudes; the gates, whose input part
 * is rounded before the hidden part is added to it, take a rounding of that
 * part too. A sum rounded to the dtype more often than that, or summed in
 * it, lies outside. The cell's math on them is held to the cell pass's
 * tolerance (compare). */
static double math_roundoff(int dtype) {
  return unit_roundoff[dtype == LLTM_FLOAT64 ? LLTM_FLOAT64 : LLTM_FLOAT32];
}

static void compare_sum(const char* what, int dtype, int64_t index, double got, double value,
                        double magnitude, int64_t depth, double rounded_part) {
  ++checked;
  const double tolerance = unit_roundoff[dtype] * (fabs(value) + fabs(rounded_part)) +
                           2 * underflow_error[dtype] +
                           (double)(depth + 2) * math_roundoff(dtype) * magnitude;
  if (fabs(got - value) <= tolerance) return;
  if (failures < 20) {
    fprintf(stderr, "MISMATCH %s %s index %lld: got %.9g, the product of its factors %.9g "
            "(tolerance %.3g)\n", dtype_names[dtype], what, (long long)index, got, value,
            tolerance);
  }
  ++failures;
}

/* The packed passes over dense steps (batch_sizes NULL) in the forward
 * direction, as lltm_sequence runs a (steps, batch, features) sequence:
 * arguments (inputs, weights, bias, h0, c0, grad_outputs, grad_cells),
 * grad_outputs read through grad_strides (its step, row and column
 * strides; the step's that of batch rows), grad_cells dense; results
 * (outputs, cells, gates, d_gates, d_inputs, d_weights, d_bias, d_h0,
 * d_c0). Each step's final state must be the last step's outputs and
 * cells. LLTM_SUCCESS or the first pass's error. */
static int run_dense_passes(struct sequence_shape shape, int dtype,
                            const lltm_sequence_options* products,
                            const int64_t* grad_strides, void* const* arguments,
                            void* const* results) {
  const int64_t T = shape.steps, B = shape.batch, S = shape.state, step = B * S;
  const size_t size = element_size(dtype);
  const int64_t sizes[11] = {T * B, T, B, shape.input_features, S, 0, S,
                             grad_strides[1], grad_strides[2], S, 1};
  void* h_n = allocate(step, size);
  void* c_n = allocate(step, size);
  lltm_sequence_options options = *products;
  void* const forward_tensors[14] = {arguments[0], arguments[1], arguments[2], arguments[3],
                                     arguments[4], NULL, results[0], results[1], results[2],
                                     h_n, c_n, NULL, NULL, &options};
  void* const backward_tensors[21] = {arguments[0], arguments[1], arguments[3], NULL,
                                      results[0], results[1], results[2], arguments[5],
                                      arguments[6], NULL, NULL, results[3], results[4],
                                      results[5], results[6], results[7], results[8],
                                      NULL, NULL, NULL, &options};
  int code = lltm_check_pass("packed_forward", dtype, sizes, NULL, forward_tensors);
  if (code == LLTM_SUCCESS) {
    code = lltm_check_pass("packed_backward", dtype, sizes, NULL, backward_tensors);
  }
  if (code == LLTM_SUCCESS && T > 0 &&
      (memcmp(h_n, (char*)results[0] + (T - 1) * step * size, step * size) ||
       memcmp(c_n, (char*)results[1] + (T - 1) * step * size, step * size))) {
    fprintf(stderr, "MISMATCH %s: the final states of dense steps are not the last step's\n",
            dtype_names[dtype]);
    ++failures;
  }
  free(h_n);
  free(c_n);
  return code;
}

/* tensors: those of packed_forward over dense steps (inputs, weights,
 * bias, h0, c0, outputs, cells, gates), then packed_backward's d_gates,
 * d_inputs, d_weights, d_bias and d_h0, all of `dtype`. */
static void check_own_products(struct sequence_shape shape, int dtype, void* const* tensors) {
  const int64_t T = shape.steps, B = shape.batch, F = shape.input_features, S = shape.state;
  const int64_t columns = S + F, rows = T * B;
  const void *inputs = tensors[0], *weights = tensors[1], *bias = tensors[2], *h0 = tensors[3],
             *c0 = tensors[4], *outputs = tensors[5], *cells = tensors[6], *gates = tensors[7],
             *d_gates = tensors[8], *d_inputs = tensors[9], *d_weights = tensors[10],
             *d_bias = tensors[11], *d_h0 = tensors[12];
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r % B;
    const void* previous_h = r < B ? h0 : outputs;
    const void* previous_c = r < B ? c0 : cells;
    const int64_t previous = (r < B ? b : r - B) * S;
    for (int64_t j = 0; j < 3 * S; ++j) {
      double input_part = get(dtype, bias, j), part_magnitude = fabs(input_part);
      for (int64_t k = 0; k < F; ++k) {
        const double term =
            get(dtype, inputs, r * F + k) * get(dtype, weights, j * columns + S + k);
        input_part += term;
        part_magnitude += fabs(term);
      }
      double value = input_part, magnitude = part_magnitude;
      for (int64_t k = 0; k < S; ++k) {
        const double term =
            get(dtype, previous_h, previous + k) * get(dtype, weights, j * columns + k);
        value += term;
        magnitude += fabs(term);
      }
      compare_sum("sequence gates", dtype, r * 3 * S + j, get(dtype, gates, r * 3 * S + j), value,
                  magnitude, F + S, input_part);
    }
    for (int64_t j = 0; j < S; ++j) {
      const int64_t g = r * 3 * S + j;
      const double pre = get(dtype, gates, g + 2 * S);
      const double old = get(dtype, previous_c, previous + j);
      double h, cell;
      cell_forward_double(get(dtype, gates, g), get(dtype, gates, g + S), pre, old, &h, &cell);
      const double scale = 1.0 + fabs(old) + fabs(elu_double(pre));
      compare("cells", dtype, "of the sequence", B, S, r * S + j, get(dtype, cells, r * S + j),
              cell, scale);
      compare("outputs", dtype, "of the sequence", B, S, r * S + j,
              get(dtype, outputs, r * S + j), h, scale);
    }
  }
  for (int64_t j = 0; j < 3 * S; ++j) {
    double value = 0.0, magnitude = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      value += get(dtype, d_gates, r * 3 * S + j);
      magnitude += fabs(get(dtype, d_gates, r * 3 * S + j));
    }
    compare_sum("sequence d_bias", dtype, j, get(dtype, d_bias, j), value, magnitude, rows, 0.0);
    for (int64_t k = 0; k < columns; ++k) {
      value = magnitude = 0.0;
      for (int64_t r = 0; r < rows; ++r) {
        const double factor = k < S ? get(dtype, r < B ? h0 : outputs, (r < B ? r : r - B) * S + k)
                                    : get(dtype, inputs, r * F + k - S);
        const double term = get(dtype, d_gates, r * 3 * S + j) * factor;
        value += term;
        magnitude += fabs(term);
      }
      compare_sum("sequence d_weights", dtype, j * columns + k,
                  get(dtype, d_weights, j * columns + k), value, magnitude, rows, 0.0);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < columns; ++k) {
      /* d_inputs of every row; d_h0 of the first step's. */
      if (k < S && (r >= B || !d_h0)) continue;
      double value = 0.0, magnitude = 0.0;
      for (int64_t j = 0; j < 3 * S; ++j) {
        const double term =
            get(dtype, d_gates, r * 3 * S + j) * get(dtype, weights, j * columns + k);
        value += term;
        magnitude += fabs(term);
      }
      if (k < S) {
        compare_sum("sequence d_h0", dtype, r * S + k, get(dtype, d_h0, r * S + k), value,
                    magnitude, 3 * S, 0.0);
      } else {
        compare_sum("sequence d_inputs", dtype, r * F + k - S,
                    get(dtype, d_inputs, r * F + k - S), value, magnitude, 3 * S, 0.0);
      }
    }
  }
}

static void check_sequence(struct sequence_shape shape, int dtype) {
  const int64_t T = shape.steps, B = shape.batch, F = shape.input_features, S = shape.state;
  const int64_t step = B * S, weight_count = 3 * S * (S + F);
  const size_t size = element_size(dtype);
  double* inputs = round_values(dtype, uniform_values(T * B * F, 1.0), T * B * F);
  double* weights = round_values(
      dtype, uniform_values(weight_count, 1.7 / sqrt((double)(S + F))), weight_count);
  double* bias = round_values(dtype, uniform_values(3 * S, 0.5), 3 * S);
  double* h0 = round_values(dtype, uniform_values(step, 1.0), step);
  double* c0 = round_values(dtype, uniform_values(step, 1.0), step);
  /* Strided: (step, row, column) strides of a (S, 2 T B) buffer read
   * transposed, whose rows are twice as long as the steps' rows. */
  const int64_t grad_strides[6] = {shape.strided_grads ? B : step,
                                   shape.strided_grads ? 1 : S,
                                   shape.strided_grads ? 2 * T * B : 1,
                                   step, S, 1};
  const int64_t grad_count = shape.strided_grads ? 2 * T * step : T * step;
  double* grad_outputs = round_values(dtype, uniform_values(grad_count, 1.0), grad_count);
  double* grad_cells =
      shape.strided_grads ? NULL : round_values(dtype, uniform_values(T * step, 1.0), T * step);
  struct sequence_reference expected = reference_sequence(
      shape, inputs, weights, bias, h0, c0, grad_outputs, grad_strides, grad_cells);
  const double* sources[7] = {inputs, weights, bias, h0, c0, grad_outputs, grad_cells};
  const int64_t counts[7] = {T * B * F, weight_count, 3 * S, step, step, grad_count, T * step};
  void* arguments[7];
  for (int a = 0; a < 7; ++a) arguments[a] = typed_copy(sources[a], counts[a], dtype);
  void* outputs = allocate(T * step, size);
  void* cells = allocate(T * step, size);
  void* gates = allocate(T * 3 * step, size);
  void* d_gates = allocate(T * 3 * step, size);
  void* d_inputs = allocate(T * B * F, size);
  void* d_weights = allocate(weight_count, size);
  void* d_bias = allocate(3 * S, size);
  void* d_h0 = shape.state_grads ? allocate(step, size) : NULL;
  void* d_c0 = shape.state_grads ? allocate(step, size) : NULL;
  void* const results[9] = {outputs, cells, gates, d_gates, d_inputs, d_weights, d_bias, d_h0,
                            d_c0};
  if (run_dense_passes(shape, dtype, products_options, grad_strides, arguments, results) !=
      LLTM_SUCCESS) {
    fprintf(stderr, "a sequence pass (%s) returned an error\n", dtype_names[dtype]);
    ++failures;
  }
  void* const own[13] = {arguments[0], arguments[1], arguments[2], arguments[3], arguments[4],
                         outputs, cells, gates, d_gates, d_inputs, d_weights, d_bias, d_h0};
  check_own_products(shape, dtype, own);
  compare_norms("outputs", dtype, shape, T * step, outputs, expected.outputs);
  compare_norms("cells", dtype, shape, T * step, cells, expected.cells);
  compare_norms("d_inputs", dtype, shape, T * B * F, d_inputs, expected.d_inputs);
  compare_norms("d_weights", dtype, shape, weight_count, d_weights, expected.d_weights);
  compare_norms("d_bias", dtype, shape, 3 * S, d_bias, expected.d_bias);
  if (shape.state_grads) {
    compare_norms("d_h0", dtype, shape, step, d_h0, expected.d_h0);
    compare_norms("d_c0", dtype, shape, step, d_c0, expected.d_c0);
  }
  free_reference(expected);
  for (int a = 0; a < 7; ++a) {
    free(arguments[a]);
    free((void*)sources[a]);
  }
  for (int a = 0; a < 9; ++a) free(results[a]);
}

static void check_cells(int64_t batch, int64_t state, int layout) {
  for (int k = 0; k < DTYPES; ++k) check_cell(all_dtypes[k], batch, state, layout);
}

/* The largest errors per dtype, as "name a, ..." into text. */
static const char* worst_of(const double* values, const char* format, char* text, size_t size) {
  size_t used = 0;
  for (int k = 0; k < DTYPES && used < size; ++k) {
    used += (size_t)snprintf(text + used, size - used, "%s%s ", k ? ", " : "", dtype_names[k]);
    if (used < size) used += (size_t)snprintf(text + used, size - used, format, values[k]);
  }
  return text;
}

LLTM_CHECK(lltm_cpu_passes) {
  rng_state = seed ? seed : 1;
  /* Every tail length of every vector width, batch 1 included. */
  for (int64_t batch = 1; batch <= 7; ++batch) {
    for (int64_t state = 1; state <= 67; ++state) {
      for (int layout = 0; layout < LAYOUTS; ++layout) check_cells(batch, state, layout);
    }
  }
  /* Empty tensors: nothing may be touched (each buffer is one byte). */
  for (int layout = 0; layout < LAYOUTS; ++layout) {
    check_cells(0, 5, layout);
    check_cells(3, 0, layout);
    check_cells(0, 0, layout);
  }
  /* Past LLTM_PARALLEL_MIN_ELEMENTS elements: the OpenMP-parallel row loop. */
  static const int64_t large[][2] = {{129, 257}, {3, 11001}, {200, 167}};
  for (size_t k = 0; k < sizeof large / sizeof large[0]; ++k) {
    check_cells(large[k][0], large[k][1], DENSE);
    check_cells(large[k][0], large[k][1], BROADCAST_ROWS);
    check_cells(large[k][0], large[k][1], EVERY_OTHER);
  }
  /* The sequence passes: one step with and without state gradients, batch
   * 1, sizes short of and past the products' 8 x 32 tiles and 256-deep
   * blocks (3 x 95 gates, 300 input features, 18 x 17 = 306 rows of steps
   * and batch) and the threads' threshold, strided output gradients. */
  static const struct sequence_shape sequences[] = {
      {1, 1, 1, 1, 0, 0},   {1, 3, 2, 5, 1, 0},    {1, 9, 4, 33, 0, 1},  {4, 1, 3, 7, 1, 1},
      {3, 9, 5, 33, 0, 1},  {2, 8, 300, 31, 1, 1}, {5, 17, 3, 40, 0, 1}, {4, 3, 2, 95, 1, 1},
      {18, 17, 6, 64, 0, 1}, {3, 40, 7, 130, 1, 1}, {2, 0, 3, 4, 0, 1},  {3, 2, 0, 4, 1, 1}};
  for (int path = 0; path < PRODUCT_PATHS; ++path) {
    products_options = &product_paths[path];
    for (size_t k = 0; k < sizeof sequences / sizeof sequences[0]; ++k) {
      for (int d = 0; d < DTYPES; ++d) check_sequence(sequences[k], all_dtypes[d]);
    }
  }
  products_options = NULL;
  char cell_text[200], sequence_text[200];
  printf("lltm_cpu_passes: %ld values compared, %ld mismatches; largest error in roundings of "
         "the terms (16 allowed for float and double, 1.25 for the 16-bit types): %s; "
         "sequences' largest relative error: %s\n",
         checked, failures, worst_of(worst, "%.2f", cell_text, sizeof cell_text),
         worst_of(worst_sequence, "%.2g", sequence_text, sizeof sequence_text));
  return failures;
}

/* The packed passes (packed_forward, packed_backward): steps of shrinking
 * batches as a PackedSequence lays them out, in either direction, against
 * a reference that runs each sequence on its own, in double, from its
 * first element (forward) or its last (reverse), and takes the final
 * states' gradients where that sequence ends. */
struct packed_shape {
  int64_t steps, batch, input_features, state;
  const int64_t* lengths; /* each sequence's, longest first; NULL: every one `steps` */
  int packed;             /* batch_sizes given (else NULL: dense steps) */
  int reverse;
  int bias;               /* a bias given (else NULL) */
  int final_grads;        /* the final states' gradients given (else NULL) */
  int strided_grads;      /* grad_outputs transposed and grad_cells every other element
                             (else grad_outputs dense and no grad_cells) */
  int state_grads;        /* d_h0 and d_c0 asked for (always past one step) */
};

/* Each step's rows (the sequences at least that long) and first row. */
static void packed_layout(struct packed_shape shape, int64_t* batch_sizes, int64_t* offsets) {
  int64_t offset = 0;
  for (int64_t t = 0; t < shape.steps; ++t) {
    int64_t size = 0;
    for (int64_t r = 0; r < shape.batch; ++r) {
      size += (shape.lengths ? shape.lengths[r] : shape.steps) > t;
    }
    batch_sizes[t] = size;
    offsets[t] = offset;
    offset += size;
  }
}

/* Sequence r's row at its k-th step (k from 0 in the order it runs). */
static int64_t packed_row(struct packed_shape shape, const int64_t* offsets, int64_t length,
                          int64_t r, int64_t k) {
  return offsets[shape.reverse ? length - 1 - k : k] + r;
}

struct packed_reference {
  double *outputs, *cells, *h_n, *c_n, *d_inputs, *d_weights, *d_bias, *d_h0, *d_c0;
};

static struct packed_reference reference_packed(
    struct packed_shape shape, int64_t rows, const int64_t* offsets, const double* inputs,
    const double* weights, const double* bias, const double* h0, const double* c0,
    const double* grad_outputs, const int64_t* grad_strides, const double* grad_cells,
    const double* grad_h_n, const double* grad_c_n) {
  const int64_t B = shape.batch, F = shape.input_features, S = shape.state, columns = S + F;
  struct packed_reference r;
  r.outputs = allocate(rows * S, sizeof(double));
  r.cells = allocate(rows * S, sizeof(double));
  r.h_n = allocate(B * S, sizeof(double));
  r.c_n = allocate(B * S, sizeof(double));
  r.d_inputs = zeros(rows * F);
  r.d_weights = zeros(3 * S * columns);
  r.d_bias = zeros(3 * S);
  r.d_h0 = allocate(B * S, sizeof(double));
  r.d_c0 = allocate(B * S, sizeof(double));
  double* gates = allocate(rows * 3 * S, sizeof(double));
  double* d_gates = allocate(3 * S, sizeof(double));
  double* dh = allocate(S, sizeof(double));
  double* dc = allocate(S, sizeof(double));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t length = shape.lengths ? shape.lengths[b] : shape.steps;
    for (int64_t k = 0; k < length; ++k) {
      const int64_t row = packed_row(shape, offsets, length, b, k);
      const int64_t previous = k ? packed_row(shape, offsets, length, b, k - 1) : -1;
      const double* h = k ? r.outputs + previous * S : h0 + b * S;
      const double* c = k ? r.cells + previous * S : c0 + b * S;
      double* g = gates + row * 3 * S;
      for (int64_t j = 0; j < 3 * S; ++j) {
        double sum = bias ? bias[j] : 0.0;
        for (int64_t i = 0; i < S; ++i) sum += weights[j * columns + i] * h[i];
        for (int64_t i = 0; i < F; ++i) sum += weights[j * columns + S + i] * inputs[row * F + i];
        g[j] = sum;
      }
      for (int64_t j = 0; j < S; ++j) {
        cell_forward_double(g[j], g[S + j], g[2 * S + j], c[j], &r.outputs[row * S + j],
                            &r.cells[row * S + j]);
      }
    }
    const int64_t last = packed_row(shape, offsets, length, b, length - 1);
    for (int64_t j = 0; j < S; ++j) {
      r.h_n[b * S + j] = r.outputs[last * S + j];
      r.c_n[b * S + j] = r.cells[last * S + j];
      dh[j] = grad_h_n ? grad_h_n[b * S + j] : 0.0;
      dc[j] = grad_c_n ? grad_c_n[b * S + j] : 0.0;
    }
    for (int64_t k = length - 1; k >= 0; --k) {
      const int64_t row = packed_row(shape, offsets, length, b, k);
      const double* h =
          k ? r.outputs + packed_row(shape, offsets, length, b, k - 1) * S : h0 + b * S;
      const double* g = gates + row * 3 * S;
      for (int64_t j = 0; j < S; ++j) {
        const double d_h = dh[j] + grad_outputs[row * grad_strides[0] + j * grad_strides[1]];
        const double d_c =
            dc[j] + (grad_cells ? grad_cells[row * grad_strides[2] + j * grad_strides[3]] : 0.0);
        cell_backward_double(d_h, d_c, r.cells[row * S + j], g[j], g[S + j], g[2 * S + j], &dc[j],
                             &d_gates[j], &d_gates[S + j], &d_gates[2 * S + j]);
      }
      for (int64_t i = 0; i < S; ++i) dh[i] = 0.0;
      for (int64_t j = 0; j < 3 * S; ++j) {
        r.d_bias[j] += d_gates[j];
        for (int64_t i = 0; i < S; ++i) {
          dh[i] += d_gates[j] * weights[j * columns + i];
          r.d_weights[j * columns + i] += d_gates[j] * h[i];
        }
        for (int64_t i = 0; i < F; ++i) {
          r.d_inputs[row * F + i] += d_gates[j] * weights[j * columns + S + i];
          r.d_weights[j * columns + S + i] += d_gates[j] * inputs[row * F + i];
        }
      }
    }
    for (int64_t j = 0; j < S; ++j) {
      r.d_h0[b * S + j] = dh[j];
      r.d_c0[b * S + j] = dc[j];
    }
  }
  free(gates);
  free(d_gates);
  free(dh);
  free(dc);
  return r;
}

/* packed_forward once more without cells and gates (NULL: a forward no
 * backward follows), which must give the same outputs and final states, to
 * the bit, as the run that kept them (forward_tensors, whose outputs,
 * h_n and c_n are `output_bytes` and `state_bytes` long). */
static void check_forward_alone(int dtype, const int64_t* sizes, void* const* forward_tensors,
                                size_t output_bytes, size_t state_bytes) {
  void* alone[3] = {allocate((int64_t)output_bytes, 1), allocate((int64_t)state_bytes, 1),
                    allocate((int64_t)state_bytes, 1)};
  void* const tensors[14] = {forward_tensors[0], forward_tensors[1], forward_tensors[2],
                             forward_tensors[3], forward_tensors[4], forward_tensors[5],
                             alone[0], NULL, NULL, alone[1], alone[2], NULL, NULL,
                             forward_tensors[13]};
  const void* kept[3] = {forward_tensors[6], forward_tensors[9], forward_tensors[10]};
  const size_t bytes[3] = {output_bytes, state_bytes, state_bytes};
  if (lltm_check_pass("packed_forward", dtype, sizes, NULL, tensors) != LLTM_SUCCESS) {
    fprintf(stderr, "packed_forward (%s) without cells and gates returned an error\n",
            dtype_names[dtype]);
    ++failures;
  }
  for (int k = 0; k < 3; ++k) {
    if (memcmp(alone[k], kept[k], bytes[k]) != 0) {
      fprintf(stderr, "MISMATCH %s packed_forward without cells and gates: its %s differ from "
              "those of the pass that kept them\n", dtype_names[dtype],
              k == 0 ? "outputs" : k == 1 ? "h_n" : "c_n");
      ++failures;
    }
    free(alone[k]);
  }
}

/* A padded pass's workspace (lltm_sequence_workspace, for `tensors` before
 * `count`), or NULL where its sizes ask for none. */
static void* padding_workspace(int pass, int dtype, const int64_t* sizes, void* const* tensors,
                               int count) {
  uint64_t present = 0;
  for (int index = 0; index < count; ++index) {
    present |= (uint64_t)(tensors[index] != NULL) << index;
  }
  const int64_t elements = lltm_sequence_workspace(pass, dtype, sizes, present);
  return elements ? allocate(elements, element_size(dtype)) : NULL;
}

static void check_packed(struct packed_shape shape, int dtype) {
  const int64_t T = shape.steps, B = shape.batch, F = shape.input_features, S = shape.state;
  const size_t element = element_size(dtype);
  int64_t* batch_sizes = allocate(T, sizeof(int64_t));
  int64_t* offsets = allocate(T, sizeof(int64_t));
  packed_layout(shape, batch_sizes, offsets);
  const int64_t rows = T ? offsets[T - 1] + batch_sizes[T - 1] : 0;
  const int64_t weight_count = 3 * S * (S + F);
  double* inputs = round_values(dtype, uniform_values(rows * F, 1.0), rows * F);
  double* weights = round_values(
      dtype, uniform_values(weight_count, 1.7 / sqrt((double)(S + F))), weight_count);
  double* bias = shape.bias ? round_values(dtype, uniform_values(3 * S, 0.5), 3 * S) : NULL;
  double* h0 = round_values(dtype, uniform_values(B * S, 1.0), B * S);
  double* c0 = round_values(dtype, uniform_values(B * S, 1.0), B * S);
  /* grad_outputs (rows, S) transposed or dense; grad_cells every other element. */
  const int64_t grad_strides[4] = {shape.strided_grads ? 1 : S, shape.strided_grads ? rows : 1,
                                   2 * S, 2};
  const int64_t grad_cells_count = rows ? (rows - 1) * 2 * S + (S - 1) * 2 + 1 : 0;
  double* grad_outputs = round_values(dtype, uniform_values(rows * S, 1.0), rows * S);
  double* grad_cells =
      shape.strided_grads
          ? round_values(dtype, uniform_values(grad_cells_count, 1.0), grad_cells_count)
          : NULL;
  double* grad_h_n =
      shape.final_grads ? round_values(dtype, uniform_values(B * S, 1.0), B * S) : NULL;
  double* grad_c_n =
      shape.final_grads ? round_values(dtype, uniform_values(B * S, 1.0), B * S) : NULL;
  struct packed_reference expected = reference_packed(
      shape, rows, offsets, inputs, weights, bias, h0, c0, grad_outputs, grad_strides, grad_cells,
      grad_h_n, grad_c_n);
  const double* sources[10] = {inputs, weights, bias, h0, c0, grad_outputs, grad_cells,
                               grad_h_n, grad_c_n, NULL};
  const int64_t counts[10] = {rows * F, weight_count, 3 * S, B * S, B * S, rows * S,
                              grad_cells_count, B * S, B * S, 0};
  void* arguments[10];
  for (int a = 0; a < 10; ++a) arguments[a] = typed_copy(sources[a], counts[a], dtype);
  void* outputs = allocate(rows * S, element);
  void* cells = allocate(rows * S, element);
  void* gates = allocate(rows * 3 * S, element);
  void* h_n = allocate(B * S, element);
  void* c_n = allocate(B * S, element);
  void* d_gates = allocate(rows * 3 * S, element);
  void* d_inputs = allocate(rows * F, element);
  void* d_weights = allocate(weight_count, element);
  void* d_bias = allocate(3 * S, element);
  void* d_h0 = shape.state_grads ? allocate(B * S, element) : NULL;
  void* d_c0 = shape.state_grads ? allocate(B * S, element) : NULL;
  void* given_sizes = shape.packed ? batch_sizes : NULL;
  /* As given, then at a padded state (lltm_padding.h), off every tile. */
  const int64_t padded_state = S + 5;
  void* padded_cells = allocate(rows * padded_state, element);
  void* padded_gates = allocate(rows * 3 * padded_state, element);
  for (int padding = 0; padding < 2; ++padding) {
    /* NaN in every result, so that none can pass as the run before's. */
    void* const written[11] = {outputs, cells, gates, h_n, c_n, d_gates, d_inputs, d_weights,
                               d_bias, d_h0, d_c0};
    const int64_t written_counts[11] = {rows * S, rows * S, rows * 3 * S, B * S, B * S,
                                        rows * 3 * S, rows * F, weight_count, 3 * S, B * S,
                                        B * S};
    for (int a = 0; a < 11; ++a) {
      if (written[a]) memset(written[a], 0xff, written_counts[a] * element);
    }
    /* A padded forward keeps its cells and gates at the padded state. */
    void* kept_cells = padding ? padded_cells : cells;
    void* kept_gates = padding ? padded_gates : gates;
    const int64_t sizes[11] = {rows, T, B, F, S, shape.reverse, padding ? padded_state : S,
                               grad_strides[0], grad_strides[1], grad_strides[2],
                               grad_strides[3]};
    lltm_sequence_options options = *products_options;
    void* forward_tensors[14] = {arguments[0], arguments[1], arguments[2], arguments[3],
                                 arguments[4], given_sizes, outputs, kept_cells, kept_gates, h_n,
                                 c_n, NULL, NULL, &options};
    void* backward_tensors[21] = {arguments[0], arguments[1], arguments[3], given_sizes,
                                  outputs, kept_cells, kept_gates, arguments[5], arguments[6],
                                  arguments[7], arguments[8], d_gates, d_inputs, d_weights,
                                  d_bias, d_h0, d_c0, NULL, NULL, NULL, &options};
    forward_tensors[LLTM_F_WORKSPACE] =
        padding_workspace(LLTM_PASS_FORWARD_SAVED, dtype, sizes, forward_tensors,
                          LLTM_F_WORKSPACE);
    backward_tensors[LLTM_B_WORKSPACE] = padding_workspace(
        LLTM_PASS_BACKWARD, dtype, sizes, backward_tensors, LLTM_B_WORKSPACE);
    if (lltm_check_pass("packed_forward", dtype, sizes, NULL, forward_tensors) != LLTM_SUCCESS ||
        lltm_check_pass("packed_backward", dtype, sizes, NULL, backward_tensors) !=
            LLTM_SUCCESS) {
      fprintf(stderr, "a packed pass (%s%s) returned an error\n", dtype_names[dtype],
              padding ? ", padded" : "");
      ++failures;
    }
    free(forward_tensors[LLTM_F_WORKSPACE]);
    free(backward_tensors[LLTM_B_WORKSPACE]);
    if (!padding) {
      check_forward_alone(dtype, sizes, forward_tensors, rows * S * element, B * S * element);
    }
    struct sequence_shape named = {T, B, F, S, shape.strided_grads, shape.state_grads};
    const struct {
      const char* name;
      int64_t count;
      const void* got;
      const double* expected;
    } results[] = {{"packed outputs", rows * S, outputs, expected.outputs},
                   {"packed cells", rows * S, padding ? NULL : cells, expected.cells},
                   {"packed h_n", B * S, h_n, expected.h_n},
                   {"packed c_n", B * S, c_n, expected.c_n},
                   {"packed d_inputs", rows * F, d_inputs, expected.d_inputs},
                   {"packed d_weights", weight_count, d_weights, expected.d_weights},
                   {"packed d_bias", 3 * S, d_bias, expected.d_bias},
                   {"packed d_h0", B * S, d_h0, expected.d_h0},
                   {"packed d_c0", B * S, d_c0, expected.d_c0}};
    for (size_t k = 0; k < sizeof results / sizeof results[0]; ++k) {
      if (!results[k].got) continue;
      char label[64];
      snprintf(label, sizeof label, "%s%s", results[k].name, padding ? " (padded)" : "");
      compare_norms(label, dtype, named, results[k].count, results[k].got, results[k].expected);
    }
  }
  free(padded_cells);
  free(padded_gates);
  double* references[9] = {expected.outputs, expected.cells, expected.h_n, expected.c_n,
                           expected.d_inputs, expected.d_weights, expected.d_bias, expected.d_h0,
                           expected.d_c0};
  for (int a = 0; a < 9; ++a) free(references[a]);
  for (int a = 0; a < 10; ++a) {
    free(arguments[a]);
    free((void*)sources[a]);
  }
  void* results_to_free[11] = {outputs, cells, gates, h_n, c_n, d_gates, d_inputs, d_weights,
                               d_bias, d_h0, d_c0};
  for (int a = 0; a < 11; ++a) free(results_to_free[a]);
  free(batch_sizes);
  free(offsets);
}

/* Batch sizes that are no PackedSequence's are refused before anything is
 * read or written (every tensor here is NULL). */
static void check_packed_refusals(void) {
  static const int64_t growing[3] = {2, 3, 1}, zero[3] = {3, 0, 0}, first_short[2] = {2, 1};
  static const struct {
    const int64_t* batch_sizes;
    int64_t rows, steps, batch;
  } cases[] = {{growing, 6, 3, 3}, {zero, 3, 3, 3}, {first_short, 3, 2, 3}, {first_short, 4, 2, 2},
               {NULL, 5, 2, 3}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) {
    const int64_t sizes[11] = {cases[k].rows, cases[k].steps, cases[k].batch, 2, 3, 0, 3,
                               3, 1, 3, 1};
    void* const forward_tensors[14] = {NULL, NULL, NULL, NULL, NULL,
                                       (void*)cases[k].batch_sizes, NULL, NULL, NULL, NULL, NULL,
                                       NULL, NULL, NULL};
    void* const backward_tensors[21] = {NULL, NULL, NULL, (void*)cases[k].batch_sizes};
    if (lltm_check_pass("packed_forward", LLTM_FLOAT32, sizes, NULL, forward_tensors) !=
            LLTM_ERROR_ARGUMENTS ||
        lltm_check_pass("packed_backward", LLTM_FLOAT64, sizes, NULL, backward_tensors) !=
            LLTM_ERROR_ARGUMENTS) {
      fprintf(stderr, "packed passes accepted the batch sizes of case %zu\n", k);
      ++failures;
    }
  }
}

LLTM_CHECK(lltm_cpu_packed_passes) {
  const long failures_before = failures;
  double worst_before[DTYPES];
  for (int d = 0; d < DTYPES; ++d) {
    worst_before[d] = worst_sequence[d];
    worst_sequence[d] = 0.0;
  }
  rng_state = seed ? seed ^ 0x9e3779b97f4a7c15ULL : 1;
  /* Lengths with 1 and the whole sequence among them, repeated and not; a
   * batch past the 8-row tiles with states past the 32-column tiles; one
   * step; every sequence as long (walked as dense steps); the threads'
   * threshold (40 x 130 elements a step); batch 1. */
  static const int64_t four[4] = {5, 3, 3, 1}, ones[3] = {1, 1, 1}, full[3] = {4, 4, 4};
  static const int64_t single[1] = {6};
  static const int64_t seventeen[17] = {9, 9, 8, 7, 7, 6, 5, 5, 4, 3, 3, 2, 2, 1, 1, 1, 1};
  static const int64_t nine[9] = {12, 11, 10, 9, 8, 7, 3, 2, 1};
  static int64_t forty[40];
  for (int r = 0; r < 40; ++r) forty[r] = 3 - r / 14;
  const struct packed_shape shapes[] = {
      {5, 4, 3, 7, four, 1, 0, 1, 1, 0, 1},     {5, 4, 3, 7, four, 1, 1, 1, 1, 0, 1},
      {5, 4, 3, 7, four, 1, 1, 0, 0, 1, 1},     {5, 4, 3, 7, four, 1, 0, 0, 1, 1, 1},
      {9, 17, 5, 40, seventeen, 1, 0, 1, 1, 1, 1}, {9, 17, 5, 40, seventeen, 1, 1, 1, 1, 1, 1},
      {12, 9, 4, 33, nine, 1, 1, 1, 1, 0, 1},   {12, 9, 4, 33, nine, 1, 0, 1, 0, 1, 1},
      {1, 3, 2, 5, ones, 1, 1, 1, 1, 0, 0},     {1, 3, 2, 5, ones, 1, 0, 1, 0, 1, 1},
      {4, 3, 2, 9, full, 1, 1, 1, 1, 1, 1},     {4, 3, 2, 9, NULL, 0, 1, 1, 1, 0, 1},
      {4, 3, 2, 9, NULL, 0, 0, 0, 1, 1, 1},     {3, 40, 7, 130, forty, 1, 1, 1, 1, 1, 1},
      {3, 40, 7, 130, forty, 1, 0, 1, 1, 0, 1}, {6, 1, 3, 5, single, 1, 1, 1, 1, 1, 1},
      {6, 1, 3, 5, single, 1, 0, 0, 0, 1, 1}};
  for (int path = 0; path < PRODUCT_PATHS; ++path) {
    products_options = &product_paths[path];
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; ++k) {
      for (int d = 0; d < DTYPES; ++d) check_packed(shapes[k], all_dtypes[d]);
    }
  }
  products_options = NULL;
  check_packed_refusals();
  char text[200];
  printf("lltm_cpu_packed_passes: %ld mismatches; largest relative error: %s\n",
         failures - failures_before, worst_of(worst_sequence, "%.2g", text, sizeof text));
  for (int d = 0; d < DTYPES; ++d) {
    if (worst_before[d] > worst_sequence[d]) worst_sequence[d] = worst_before[d];
  }
  return failures - failures_before;
}

/* The 16-bit types' two paths for the sequence passes' products: AMX
 * where the CPU has it, and the portable products (amx 0), from the
 * same inputs, against each other (the checks above hold each to the
 * reference). Their products differ only in the order of float's sums, so
 * their results only where such a sum rounds to the dtype on the other side
 * of a boundary, in a few elements, carried through the steps: each result
 * lies within PATHS_APART units of the dtype's roundoff of the other's norm
 * (test_half.py's bound); with an inf among the inputs (whose float16 products AMX declines,
 * taking the portable ones) they hold inf and NaN in the same places.
 * Without AMX both paths are the portable products. */
#define PATHS_APART 4.0
#define PATH_RESULTS 7
static const char* const path_result_names[PATH_RESULTS] = {
    "outputs", "cells", "d_inputs", "d_weights", "d_bias", "d_h0", "d_c0"};

/* Every result of the sequence passes of `dtype` over `arguments`
 * (inputs, weights, bias, h0, c0, grad_outputs, grad_cells), as double,
 * into results (counts: their sizes), their products as `amx` picks. */
static void path_results(struct sequence_shape shape, int dtype, int amx,
                         void* const* arguments, double** results, int64_t* counts) {
  const int64_t T = shape.steps, B = shape.batch, F = shape.input_features, S = shape.state;
  const size_t size = element_size(dtype);
  const int64_t step = B * S;
  const int64_t grad_strides[6] = {step, S, 1, step, S, 1};
  void* outputs[PATH_RESULTS] = {allocate(T * step, size), allocate(T * step, size),
                                 allocate(T * B * F, size), allocate(3 * S * (S + F), size),
                                 allocate(3 * S, size), allocate(step, size), allocate(step, size)};
  const int64_t result_counts[PATH_RESULTS] = {T * step, T * step, T * B * F, 3 * S * (S + F),
                                               3 * S, step, step};
  void* gates = allocate(T * 3 * step, size);
  void* d_gates = allocate(T * 3 * step, size);
  void* const results_in_order[9] = {outputs[0], outputs[1], gates, d_gates, outputs[2],
                                     outputs[3], outputs[4], outputs[5], outputs[6]};
  const lltm_sequence_options products = {LLTM_PATH_PLANNED, 0, 1, 1, amx, -1, -1};
  if (run_dense_passes(shape, dtype, &products, grad_strides, arguments, results_in_order) !=
      LLTM_SUCCESS) {
    fprintf(stderr, "a sequence pass (%s, amx %d) returned an error\n", dtype_names[dtype],
            amx);
    ++failures;
  }
  for (int r = 0; r < PATH_RESULTS; ++r) {
    counts[r] = result_counts[r];
    results[r] = allocate(counts[r], sizeof(double));
    for (int64_t i = 0; i < counts[r]; ++i) results[r][i] = get(dtype, outputs[r], i);
    free(outputs[r]);
  }
  free(gates);
  free(d_gates);
}

static void compare_product_paths(struct sequence_shape shape, int dtype, int with_inf) {
  const int64_t T = shape.steps, B = shape.batch, F = shape.input_features, S = shape.state;
  const int64_t counts[7] = {T * B * F, 3 * S * (S + F), 3 * S, B * S, B * S, T * B * S,
                             T * B * S};
  const double scales[7] = {1.0, 1.7 / sqrt((double)(S + F)), 0.5, 1.0, 1.0, 1.0, 1.0};
  void* arguments[7];
  for (int a = 0; a < 7; ++a) {
    double* values = round_values(dtype, uniform_values(counts[a], scales[a]), counts[a]);
    if (with_inf && a == 0) values[counts[0] / 2] = INFINITY;
    arguments[a] = typed_copy(values, counts[a], dtype);
    free(values);
  }
  double* results[2][PATH_RESULTS];
  int64_t sizes[PATH_RESULTS];
  path_results(shape, dtype, 1, arguments, results[0], sizes);
  path_results(shape, dtype, 0, arguments, results[1], sizes);
  for (int r = 0; r < PATH_RESULTS; ++r) {
    double difference = 0.0, norm = 0.0;
    int64_t apart = 0;
    for (int64_t i = 0; i < sizes[r]; ++i) {
      const double amx = results[0][r][i], portable = results[1][r][i];
      ++checked;
      if (isfinite(amx) && isfinite(portable)) {
        difference += (amx - portable) * (amx - portable);
        norm += portable * portable;
      } else if (!(isnan(amx) && isnan(portable)) && amx != portable) {
        ++apart;
      }
    }
    const double error = norm > 0.0 ? sqrt(difference / norm) : sqrt(difference);
    if (apart == 0 && error <= PATHS_APART * unit_roundoff[dtype]) continue;
    if (failures < 20) {
      fprintf(stderr, "MISMATCH %s %s %lldx%lldx%lldx%lld%s between the product paths: relative "
              "difference %.3g (allowed %.3g), %lld values not both finite and equal\n",
              dtype_names[dtype], path_result_names[r], (long long)T, (long long)B, (long long)F,
              (long long)S, with_inf ? " with an inf input" : "", error,
              PATHS_APART * unit_roundoff[dtype],
              (long long)apart);
    }
    ++failures;
  }
  for (int path = 0; path < 2; ++path) {
    for (int r = 0; r < PATH_RESULTS; ++r) free(results[path][r]);
  }
  for (int a = 0; a < 7; ++a) free(arguments[a]);
}

LLTM_CHECK(lltm_cpu_product_paths) {
  const long failures_before = failures;
  rng_state = seed ? seed ^ 0x2545f4914f6cdd1dULL : 1;
  /* Sizes short of and past the tiles (16 and 32) and the 256-row blocks
   * of the whole products, batch 1, one step. */
  static const struct sequence_shape shapes[] = {
      {1, 1, 1, 1, 0, 1}, {1, 1, 3, 5, 0, 1}, {6, 1, 7, 33, 0, 1}, {5, 17, 40, 130, 0, 1},
      {3, 33, 9, 70, 0, 1}, {2, 130, 20, 48, 0, 1}};
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; ++k) {
    for (int with_inf = 0; with_inf < 2; ++with_inf) {
      compare_product_paths(shapes[k], LLTM_FLOAT16, with_inf);
      compare_product_paths(shapes[k], LLTM_BFLOAT16, with_inf);
    }
  }
  printf("lltm_cpu_product_paths: %s; %ld mismatches\n",
         !lltm_amx_usable() ? "no AMX or AVX512-BF16 here: the portable products twice"
         : lltm_amx_tiles() ? "AMX against the portable products"
                            : "AVX512-BF16 (no AMX) against the portable products",
         failures - failures_before);
  return failures - failures_before;
}
