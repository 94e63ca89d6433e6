/* Checks the LLTM's CPU passes (lltm_cpu.c) on their own, for `make asan`
 * and `make valgrind` (tests/c/run_checks.c): forward_pass and
 * backward_pass, in float and double, on random inputs over many odd sizes
 * (batch 1..7 and state 1..67, so that every vector tail length occurs, plus
 * sizes past the OpenMP threshold), with the output gradients in several
 * layouts (dense, broadcast rows, one broadcast value, column-major, every
 * other element); and sequence_forward and sequence_backward over sizes
 * short of and past their products' tiles and depth blocks. Each tensor
 * lives in its own malloc'd buffer of exactly the bytes its elements span,
 * so that the tool catches any read or write past either end. Results are
 * compared with a plain double-precision reference; the first mismatches are
 * printed. */
#include <stdint.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lltm_check.h"

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

static void* allocate(int64_t count, size_t size) {
  /* One byte for an empty tensor: a valid pointer whose every element is out of bounds. */
  const size_t bytes = count > 0 ? (size_t)count * size : 1;
  void* pointer = malloc(bytes);
  if (!pointer) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  /* All bits set is a NaN in float and double: an output element the pass
   * never writes compares unequal. */
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

/* The cell in double precision, straight from its definition. */
static double sigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }
static double elu(double z) { return z > 0.0 ? z : expm1(z); }
static double d_elu(double z) { return z > 0.0 ? 1.0 : exp(z); }

static long failures;
static long checked;
static double worst[2]; /* largest |got - expected| / (eps * scale): float, double */
static double worst_sequence[2]; /* the sequence passes' largest relative error: float, double */

/* Within this many roundings of the terms each value is computed from. */
#define TOLERANCE_ROUNDINGS 16.0

/* |got - expected| within TOLERANCE_ROUNDINGS roundings of `scale`, the size of the terms the
 * value is computed from; NaN never is. */
static void compare(const char* what, const char* type, const char* layout, int64_t batch,
                    int64_t state, int64_t index, double got, double expected, double scale,
                    double eps) {
  ++checked;
  const double tolerance = TOLERANCE_ROUNDINGS * eps * scale;
  const double ratio = fabs(got - expected) / (eps * scale);
  double* worst_of_type = &worst[type[0] == 'd'];
  if (ratio > *worst_of_type) *worst_of_type = ratio;
  if (fabs(got - expected) <= tolerance) return;
  if (failures < 20) {
    fprintf(stderr,
            "MISMATCH %s %s (gradients %s) batch=%lld state=%lld index=%lld: got %.9g, "
            "expected %.9g (tolerance %.3g)\n",
            type, what, layout, (long long)batch, (long long)state, (long long)index, got,
            expected, tolerance);
  }
  ++failures;
}

#define DEFINE_CHECK(SCALAR, DTYPE, EPS)                                                      \
  static void check_##SCALAR(int64_t batch, int64_t state, int layout) {                      \
    const int64_t n = batch * state;                                                          \
    const char* layout_name = layout_names[layout];                                           \
    int64_t row_stride, column_stride;                                                        \
    strides_of(layout, batch, state, &row_stride, &column_stride);                            \
    const int64_t grad_count = span(batch, state, row_stride, column_stride);                 \
    SCALAR* gates = allocate(3 * n, sizeof(SCALAR));                                          \
    SCALAR* old_cell = allocate(n, sizeof(SCALAR));                                           \
    SCALAR* new_h = allocate(n, sizeof(SCALAR));                                              \
    SCALAR* new_cell = allocate(n, sizeof(SCALAR));                                           \
    SCALAR* grad_h = allocate(grad_count, sizeof(SCALAR));                                    \
    SCALAR* grad_cell = allocate(grad_count, sizeof(SCALAR));                                 \
    SCALAR* d_old_cell = allocate(n, sizeof(SCALAR));                                         \
    SCALAR* d_gates = allocate(3 * n, sizeof(SCALAR));                                        \
    for (int64_t i = 0; i < 3 * n; ++i) gates[i] = (SCALAR)draw();                            \
    for (int64_t i = 0; i < n; ++i) old_cell[i] = (SCALAR)draw();                             \
    for (int64_t i = 0; i < grad_count; ++i) {                                                \
      grad_h[i] = (SCALAR)draw();                                                             \
      grad_cell[i] = (SCALAR)draw();                                                          \
    }                                                                                         \
    const int64_t sizes[6] = {batch, state, row_stride, column_stride, row_stride,            \
                              column_stride};                                                 \
    void* const forward_tensors[4] = {gates, old_cell, new_h, new_cell};                      \
    void* const backward_tensors[6] = {grad_h, grad_cell, new_cell, gates, d_old_cell,        \
                                       d_gates};                                              \
    if (lltm_check_pass("forward_pass", DTYPE, sizes, NULL, forward_tensors) !=               \
        LLTM_SUCCESS) {                                                                       \
      fprintf(stderr, "forward_pass (" #SCALAR ") returned an error\n");                      \
      ++failures;                                                                             \
    }                                                                                         \
    if (lltm_check_pass("backward_pass", DTYPE, sizes, NULL, backward_tensors) !=             \
        LLTM_SUCCESS) {                                                                       \
      fprintf(stderr, "backward_pass (" #SCALAR ") returned an error\n");                     \
      ++failures;                                                                             \
    }                                                                                         \
    for (int64_t row = 0; row < batch; ++row) {                                               \
      for (int64_t column = 0; column < state; ++column) {                                    \
        const int64_t i = row * state + column;                                               \
        const int64_t g = row * 3 * state + column;                                           \
        const int64_t d = row * row_stride + column * column_stride;                          \
        const double ig = sigmoid(gates[g]);                                                  \
        const double og = sigmoid(gates[g + state]);                                          \
        const double pre = gates[g + 2 * state];                                              \
        const double cc = elu(pre);                                                           \
        const double cell = old_cell[i] + cc * ig;                                            \
        const double forward_scale = 1.0 + fabs(old_cell[i]) + fabs(cc);                      \
        compare("new_cell", #SCALAR, layout_name, batch, state, i, new_cell[i], cell,         \
                forward_scale, EPS);                                                          \
        compare("new_h", #SCALAR, layout_name, batch, state, i, new_h[i], tanh(cell) * og,    \
                forward_scale, EPS);                                                          \
        /* The backward pass starts from the new_cell the forward pass gave. */               \
        const double t = tanh((double)new_cell[i]);                                           \
        const double dh = grad_h[d], dc = grad_cell[d];                                       \
        const double dnc = (1.0 - t * t) * og * dh + dc;                                      \
        const double backward_scale = (1.0 + fabs(dh) + fabs(dc)) * (1.0 + fabs(cc));         \
        compare("d_old_cell", #SCALAR, layout_name, batch, state, i, d_old_cell[i], dnc,       \
                backward_scale, EPS);                                                         \
        compare("d_input_gate", #SCALAR, layout_name, batch, state, g, d_gates[g],            \
                cc * dnc * ig * (1.0 - ig), backward_scale, EPS);                             \
        compare("d_output_gate", #SCALAR, layout_name, batch, state, g + state,               \
                d_gates[g + state], t * dh * og * (1.0 - og), backward_scale, EPS);           \
        compare("d_candidate_cell", #SCALAR, layout_name, batch, state, g + 2 * state,        \
                d_gates[g + 2 * state], ig * dnc * d_elu(pre), backward_scale, EPS);          \
      }                                                                                       \
    }                                                                                         \
    free(gates);                                                                              \
    free(old_cell);                                                                           \
    free(new_h);                                                                              \
    free(new_cell);                                                                           \
    free(grad_h);                                                                             \
    free(grad_cell);                                                                          \
    free(d_old_cell);                                                                         \
    free(d_gates);                                                                            \
  }

DEFINE_CHECK(float, LLTM_FLOAT32, 5.9604644775390625e-08)   /* 2^-24 */
DEFINE_CHECK(double, LLTM_FLOAT64, 1.1102230246251565e-16)  /* 2^-53 */

/* The whole-sequence passes against the same cell in double precision,
 * step by step. Values are unit-scale (weights scaled by 1 / sqrt(depth)),
 * as a trained layer's are, so that rounding, not the recurrence, sets the
 * error; each result is compared as a whole, by its relative norm. */
struct sequence_shape {
  int64_t steps, batch, input_features, state;
  int strided_grads; /* grad_outputs every other element, transposed rows; no grad_cells */
  int state_grads;   /* whether d_h0 and d_c0 are asked for (always past one step) */
};

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
        const double cell = c[j] + elu(g[2 * S + j]) * sigmoid(g[j]);
        r.cells[(t * B + b) * S + j] = cell;
        r.outputs[(t * B + b) * S + j] = tanh(cell) * sigmoid(g[S + j]);
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
        const double ig = sigmoid(g[j]), og = sigmoid(g[S + j]), pre = g[2 * S + j];
        const double th = tanh(r.cells[(t * B + b) * S + j]);
        const double dnc = (1.0 - th * th) * og * dh + dc;
        r.d_c0[i] = dnc;
        dg[j] = elu(pre) * dnc * ig * (1.0 - ig);
        dg[S + j] = th * dh * og * (1.0 - og);
        dg[2 * S + j] = ig * dnc * d_elu(pre);
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

/* |got - expected| / |expected| over `count` elements within `tolerance`;
 * NaN (an element never written) never is. */
static void compare_norms(const char* what, const char* type, struct sequence_shape shape,
                          int64_t count, const void* got, int is_double, const double* expected,
                          double tolerance) {
  double difference = 0.0, norm = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    const double value = is_double ? ((const double*)got)[i] : ((const float*)got)[i];
    difference += (value - expected[i]) * (value - expected[i]);
    norm += expected[i] * expected[i];
  }
  checked += count;
  const double error = count ? sqrt(difference) / (sqrt(norm) + 1e-300) : 0.0;
  if (error > worst_sequence[is_double]) worst_sequence[is_double] = error;
  if (error <= tolerance) return;
  if (failures < 20) {
    fprintf(stderr, "MISMATCH %s sequence %s, %lldx%lldx%lldx%lld: relative error %.3g "
            "(tolerance %.3g)\n", type, what, (long long)shape.steps, (long long)shape.batch,
            (long long)shape.input_features, (long long)shape.state, error, tolerance);
  }
  ++failures;
}

#define DEFINE_SEQUENCE_CHECK(SCALAR, DTYPE, TOLERANCE)                                          \
  static void check_sequence_##SCALAR(struct sequence_shape shape) {                            \
    const int64_t T = shape.steps, B = shape.batch, F = shape.input_features, S = shape.state;  \
    const int64_t step = B * S, weight_count = 3 * S * (S + F);                                 \
    const int is_double = sizeof(SCALAR) == sizeof(double);                                     \
    double* inputs = uniform_values(T * B * F, 1.0);                                            \
    double* weights = uniform_values(weight_count, 1.7 / sqrt((double)(S + F)));                \
    double* bias = uniform_values(3 * S, 0.5);                                                  \
    double* h0 = uniform_values(step, 1.0);                                                     \
    double* c0 = uniform_values(step, 1.0);                                                     \
    /* Strided: (step, row, column) strides of a (T, S, 2 B) buffer read transposed. */         \
    const int64_t grad_strides[6] = {                                                           \
        shape.strided_grads ? 2 * step : step, shape.strided_grads ? 2 : S,                     \
        shape.strided_grads ? 2 * B : 1,       step, S, 1};                                     \
    const int64_t grad_count = shape.strided_grads ? 2 * T * step : T * step;                   \
    double* grad_outputs = uniform_values(grad_count, 1.0);                                     \
    double* grad_cells = shape.strided_grads ? NULL : uniform_values(T * step, 1.0);            \
    struct sequence_reference expected = reference_sequence(                                    \
        shape, inputs, weights, bias, h0, c0, grad_outputs, grad_strides, grad_cells);          \
    SCALAR* arguments[7];                                                                       \
    const double* sources[7] = {inputs, weights, bias, h0, c0, grad_outputs, grad_cells};       \
    const int64_t counts[7] = {T * B * F, weight_count, 3 * S, step, step, grad_count,          \
                               T * step};                                                       \
    for (int a = 0; a < 7; ++a) {                                                               \
      arguments[a] = NULL;                                                                      \
      if (!sources[a]) continue;                                                                \
      arguments[a] = allocate(counts[a], sizeof(SCALAR));                                       \
      for (int64_t i = 0; i < counts[a]; ++i) arguments[a][i] = (SCALAR)sources[a][i];          \
    }                                                                                           \
    SCALAR* outputs = allocate(T * step, sizeof(SCALAR));                                       \
    SCALAR* cells = allocate(T * step, sizeof(SCALAR));                                         \
    SCALAR* gates = allocate(T * 3 * step, sizeof(SCALAR));                                     \
    SCALAR* d_gates = allocate(T * 3 * step, sizeof(SCALAR));                                   \
    SCALAR* d_inputs = allocate(T * B * F, sizeof(SCALAR));                                     \
    SCALAR* d_weights = allocate(weight_count, sizeof(SCALAR));                                 \
    SCALAR* d_bias = allocate(3 * S, sizeof(SCALAR));                                           \
    SCALAR* d_h0 = shape.state_grads ? allocate(step, sizeof(SCALAR)) : NULL;                   \
    SCALAR* d_c0 = shape.state_grads ? allocate(step, sizeof(SCALAR)) : NULL;                   \
    const int64_t sizes[12] = {T, B, F, S, 0, 0, grad_strides[0], grad_strides[1],             \
                               grad_strides[2], grad_strides[3], grad_strides[4],               \
                               grad_strides[5]};                                                \
    void* const forward_tensors[8] = {arguments[0], arguments[1], arguments[2], arguments[3],   \
                                      arguments[4], outputs, cells, gates};                     \
    void* const backward_tensors[14] = {arguments[0], arguments[1], arguments[3], outputs,      \
                                        cells, gates, arguments[5], arguments[6], d_gates,      \
                                        d_inputs, d_weights, d_bias, d_h0, d_c0};               \
    if (lltm_check_pass("sequence_forward", DTYPE, sizes, NULL, forward_tensors) !=             \
            LLTM_SUCCESS ||                                                                     \
        lltm_check_pass("sequence_backward", DTYPE, sizes, NULL, backward_tensors) !=           \
            LLTM_SUCCESS) {                                                                     \
      fprintf(stderr, "a sequence pass (" #SCALAR ") returned an error\n");                     \
      ++failures;                                                                               \
    }                                                                                           \
    compare_norms("outputs", #SCALAR, shape, T * step, outputs, is_double, expected.outputs,    \
                  TOLERANCE);                                                                   \
    compare_norms("cells", #SCALAR, shape, T * step, cells, is_double, expected.cells,          \
                  TOLERANCE);                                                                   \
    compare_norms("d_inputs", #SCALAR, shape, T * B * F, d_inputs, is_double,                   \
                  expected.d_inputs, TOLERANCE);                                                \
    compare_norms("d_weights", #SCALAR, shape, weight_count, d_weights, is_double,              \
                  expected.d_weights, TOLERANCE);                                               \
    compare_norms("d_bias", #SCALAR, shape, 3 * S, d_bias, is_double, expected.d_bias,          \
                  TOLERANCE);                                                                   \
    if (shape.state_grads) {                                                                    \
      compare_norms("d_h0", #SCALAR, shape, step, d_h0, is_double, expected.d_h0, TOLERANCE);   \
      compare_norms("d_c0", #SCALAR, shape, step, d_c0, is_double, expected.d_c0, TOLERANCE);   \
    }                                                                                           \
    free_reference(expected);                                                                   \
    for (int a = 0; a < 7; ++a) free(arguments[a]);                                             \
    double* doubles[7] = {inputs, weights, bias, h0, c0, grad_outputs, grad_cells};             \
    for (int a = 0; a < 7; ++a) free(doubles[a]);                                               \
    SCALAR* results[9] = {outputs, cells, gates, d_gates, d_inputs, d_weights, d_bias, d_h0,    \
                          d_c0};                                                                \
    for (int a = 0; a < 9; ++a) free(results[a]);                                               \
  }

DEFINE_SEQUENCE_CHECK(float, LLTM_FLOAT32, 1e-5)
DEFINE_SEQUENCE_CHECK(double, LLTM_FLOAT64, 1e-12)

static void check_both(int64_t batch, int64_t state, int layout) {
  check_float(batch, state, layout);
  check_double(batch, state, layout);
}

LLTM_CHECK(lltm_cpu_passes) {
  rng_state = seed ? seed : 1;
  /* Every tail length of every vector width, batch 1 included. */
  for (int64_t batch = 1; batch <= 7; ++batch) {
    for (int64_t state = 1; state <= 67; ++state) {
      for (int layout = 0; layout < LAYOUTS; ++layout) check_both(batch, state, layout);
    }
  }
  /* Empty tensors: nothing may be touched (each buffer is one byte). */
  for (int layout = 0; layout < LAYOUTS; ++layout) {
    check_both(0, 5, layout);
    check_both(3, 0, layout);
    check_both(0, 0, layout);
  }
  /* Past LLTM_PARALLEL_MIN_ELEMENTS elements: the OpenMP-parallel row loop. */
  static const int64_t large[][2] = {{129, 257}, {3, 11001}, {200, 167}};
  for (size_t k = 0; k < sizeof large / sizeof large[0]; ++k) {
    check_both(large[k][0], large[k][1], DENSE);
    check_both(large[k][0], large[k][1], BROADCAST_ROWS);
    check_both(large[k][0], large[k][1], EVERY_OTHER);
  }
  /* The sequence passes: one step with and without state gradients, batch
   * 1, sizes short of and past the products' 8 x 32 tiles and 256-deep
   * blocks (3 x 95 gates, 300 input features, 18 x 17 = 306 rows of steps
   * and batch) and the threads' threshold, strided output gradients. */
  static const struct sequence_shape sequences[] = {
      {1, 1, 1, 1, 0, 0},   {1, 3, 2, 5, 1, 0},    {1, 9, 4, 33, 0, 1},  {4, 1, 3, 7, 1, 1},
      {3, 9, 5, 33, 0, 1},  {2, 8, 300, 31, 1, 1}, {5, 17, 3, 40, 0, 1}, {4, 3, 2, 95, 1, 1},
      {18, 17, 6, 64, 0, 1}, {3, 40, 7, 130, 1, 1}, {2, 0, 3, 4, 0, 1},  {3, 2, 0, 4, 1, 1}};
  for (size_t k = 0; k < sizeof sequences / sizeof sequences[0]; ++k) {
    check_sequence_float(sequences[k]);
    check_sequence_double(sequences[k]);
  }
  printf("lltm_cpu_passes: %ld values compared, %ld mismatches; largest error %.1f (float) "
         "and %.1f (double) roundings of the terms, %.0f allowed; sequences' largest relative "
         "error %.2g (float) and %.2g (double)\n",
         checked, failures, worst[0], worst[1], TOLERANCE_ROUNDINGS, worst_sequence[0],
         worst_sequence[1]);
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
        const double cell = c[j] + elu(g[2 * S + j]) * sigmoid(g[j]);
        r.cells[row * S + j] = cell;
        r.outputs[row * S + j] = tanh(cell) * sigmoid(g[S + j]);
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
        const double ig = sigmoid(g[j]), og = sigmoid(g[S + j]), pre = g[2 * S + j];
        const double th = tanh(r.cells[row * S + j]);
        const double dnc = (1.0 - th * th) * og * d_h + d_c;
        dc[j] = dnc;
        d_gates[j] = elu(pre) * dnc * ig * (1.0 - ig);
        d_gates[S + j] = th * d_h * og * (1.0 - og);
        d_gates[2 * S + j] = ig * dnc * d_elu(pre);
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

/* A buffer of `count` elements of float or double holding `values`, or
 * NULL where values is. */
static void* typed_copy(const double* values, int64_t count, int is_double) {
  if (!values) return NULL;
  void* copy = allocate(count, is_double ? sizeof(double) : sizeof(float));
  for (int64_t i = 0; i < count; ++i) {
    if (is_double) {
      ((double*)copy)[i] = values[i];
    } else {
      ((float*)copy)[i] = (float)values[i];
    }
  }
  return copy;
}

static void check_packed(struct packed_shape shape, int is_double) {
  const int64_t T = shape.steps, B = shape.batch, F = shape.input_features, S = shape.state;
  const int dtype = is_double ? LLTM_FLOAT64 : LLTM_FLOAT32;
  const char* type = is_double ? "double" : "float";
  const double tolerance = is_double ? 1e-12 : 1e-5;
  const size_t element = is_double ? sizeof(double) : sizeof(float);
  int64_t* batch_sizes = allocate(T, sizeof(int64_t));
  int64_t* offsets = allocate(T, sizeof(int64_t));
  packed_layout(shape, batch_sizes, offsets);
  const int64_t rows = T ? offsets[T - 1] + batch_sizes[T - 1] : 0;
  const int64_t weight_count = 3 * S * (S + F);
  double* inputs = uniform_values(rows * F, 1.0);
  double* weights = uniform_values(weight_count, 1.7 / sqrt((double)(S + F)));
  double* bias = shape.bias ? uniform_values(3 * S, 0.5) : NULL;
  double* h0 = uniform_values(B * S, 1.0);
  double* c0 = uniform_values(B * S, 1.0);
  /* grad_outputs (rows, S) transposed or dense; grad_cells every other element. */
  const int64_t grad_strides[4] = {shape.strided_grads ? 1 : S, shape.strided_grads ? rows : 1,
                                   2 * S, 2};
  const int64_t grad_cells_count = rows ? (rows - 1) * 2 * S + (S - 1) * 2 + 1 : 0;
  double* grad_outputs = uniform_values(rows * S, 1.0);
  double* grad_cells = shape.strided_grads ? uniform_values(grad_cells_count, 1.0) : NULL;
  double* grad_h_n = shape.final_grads ? uniform_values(B * S, 1.0) : NULL;
  double* grad_c_n = shape.final_grads ? uniform_values(B * S, 1.0) : NULL;
  struct packed_reference expected = reference_packed(
      shape, rows, offsets, inputs, weights, bias, h0, c0, grad_outputs, grad_strides, grad_cells,
      grad_h_n, grad_c_n);
  const double* sources[10] = {inputs, weights, bias, h0, c0, grad_outputs, grad_cells,
                               grad_h_n, grad_c_n, NULL};
  const int64_t counts[10] = {rows * F, weight_count, 3 * S, B * S, B * S, rows * S,
                              grad_cells_count, B * S, B * S, 0};
  void* arguments[10];
  for (int a = 0; a < 10; ++a) arguments[a] = typed_copy(sources[a], counts[a], is_double);
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
  const int64_t sizes[12] = {rows, T, B, F, S, shape.reverse, 0, 0,
                             grad_strides[0], grad_strides[1], grad_strides[2], grad_strides[3]};
  void* const forward_tensors[11] = {arguments[0], arguments[1], arguments[2], arguments[3],
                                     arguments[4], given_sizes, outputs, cells, gates, h_n, c_n};
  void* const backward_tensors[17] = {arguments[0], arguments[1], arguments[3], given_sizes,
                                      outputs, cells, gates, arguments[5], arguments[6],
                                      arguments[7], arguments[8], d_gates, d_inputs, d_weights,
                                      d_bias, d_h0, d_c0};
  if (lltm_check_pass("packed_forward", dtype, sizes, NULL, forward_tensors) != LLTM_SUCCESS ||
      lltm_check_pass("packed_backward", dtype, sizes, NULL, backward_tensors) != LLTM_SUCCESS) {
    fprintf(stderr, "a packed pass (%s) returned an error\n", type);
    ++failures;
  }
  struct sequence_shape named = {T, B, F, S, shape.strided_grads, shape.state_grads};
  const struct {
    const char* name;
    int64_t count;
    const void* got;
    const double* expected;
  } results[] = {{"packed outputs", rows * S, outputs, expected.outputs},
                 {"packed cells", rows * S, cells, expected.cells},
                 {"packed h_n", B * S, h_n, expected.h_n},
                 {"packed c_n", B * S, c_n, expected.c_n},
                 {"packed d_inputs", rows * F, d_inputs, expected.d_inputs},
                 {"packed d_weights", weight_count, d_weights, expected.d_weights},
                 {"packed d_bias", 3 * S, d_bias, expected.d_bias},
                 {"packed d_h0", B * S, d_h0, expected.d_h0},
                 {"packed d_c0", B * S, d_c0, expected.d_c0}};
  for (size_t k = 0; k < sizeof results / sizeof results[0]; ++k) {
    if (!results[k].got) continue;
    compare_norms(results[k].name, type, named, results[k].count, results[k].got, is_double,
                  results[k].expected, tolerance);
  }
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
    const int64_t sizes[12] = {cases[k].rows, cases[k].steps, cases[k].batch, 2, 3, 0, 0, 0,
                               3, 1, 3, 1};
    void* const forward_tensors[11] = {NULL, NULL, NULL, NULL, NULL,
                                       (void*)cases[k].batch_sizes, NULL, NULL, NULL, NULL, NULL};
    void* const backward_tensors[17] = {NULL, NULL, NULL, (void*)cases[k].batch_sizes};
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
  const double worst_before[2] = {worst_sequence[0], worst_sequence[1]};
  worst_sequence[0] = worst_sequence[1] = 0.0;
  rng_state = seed ? seed ^ 0x9e3779b97f4a7c15ULL : 1;
  /* Lengths with 1 and the whole sequence among them, repeated and not; a
   * batch past the 8-row tiles with states past the 32-column tiles; one
   * step; every sequence as long (walked as dense steps); the threads'
   * threshold (40 x 130 elements a step). */
  static const int64_t four[4] = {5, 3, 3, 1}, ones[3] = {1, 1, 1}, full[3] = {4, 4, 4};
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
      {3, 40, 7, 130, forty, 1, 0, 1, 1, 0, 1}};
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; ++k) {
    check_packed(shapes[k], 0);
    check_packed(shapes[k], 1);
  }
  check_packed_refusals();
  printf("lltm_cpu_packed_passes: %ld mismatches; largest relative error %.2g (float) and "
         "%.2g (double)\n",
         failures - failures_before, worst_sequence[0], worst_sequence[1]);
  if (worst_before[0] > worst_sequence[0]) worst_sequence[0] = worst_before[0];
  if (worst_before[1] > worst_sequence[1]) worst_sequence[1] = worst_before[1];
  return failures - failures_before;
}
