/* Checks the CPU passes of src/lltm_cpu.c on their own, for `make asan` and
 * `make valgrind`: lltm_cpu_forward and lltm_cpu_backward, in float and
 * double, on random inputs over many odd sizes
 * (batch 1..7 and state 1..67, so that every vector tail length occurs, plus
 * sizes past the OpenMP threshold), with the output gradients in several
 * layouts (dense, broadcast rows, one broadcast value, column-major, every
 * other element). Each tensor lives in its own malloc'd buffer of exactly the
 * bytes its elements span, so that the tool catches any read or write past
 * either end. Results are compared with a plain double-precision reference.
 *
 *   cc -Iinclude tests/c/cpu_passes_check.c src/lltm_cpu.c -fopenmp -lm
 *   ./a.out [seed]      exit status 0: all agree; 1: a mismatch (the first ones are printed)
 */
#include <stdint.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lltm_cpu.h"
#include "lltm_ffi.h"

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
    const int64_t grad_strides[4] = {row_stride, column_stride, row_stride, column_stride};   \
    if (lltm_cpu_forward(DTYPE, batch, state, gates, old_cell, new_h, new_cell) !=            \
        LLTM_SUCCESS) {                                                                       \
      fprintf(stderr, "lltm_cpu_forward (" #SCALAR ") returned an error\n");                  \
      ++failures;                                                                             \
    }                                                                                         \
    if (lltm_cpu_backward(DTYPE, batch, state, grad_strides, grad_h, grad_cell, new_cell,     \
                          gates, d_old_cell, d_gates) != LLTM_SUCCESS) {                      \
      fprintf(stderr, "lltm_cpu_backward (" #SCALAR ") returned an error\n");                 \
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

static void check_both(int64_t batch, int64_t state, int layout) {
  check_float(batch, state, layout);
  check_double(batch, state, layout);
}

int main(int argc, char** argv) {
  const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 20240531u;
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
  /* Past LLTM_CPU_PARALLEL_MIN elements: the OpenMP-parallel row loop. */
  static const int64_t large[][2] = {{129, 257}, {3, 11001}, {200, 167}};
  for (size_t k = 0; k < sizeof large / sizeof large[0]; ++k) {
    check_both(large[k][0], large[k][1], DENSE);
    check_both(large[k][0], large[k][1], BROADCAST_ROWS);
    check_both(large[k][0], large[k][1], EVERY_OTHER);
  }
  printf("cpu_passes_check (seed %llu): %ld values compared, %ld mismatches; largest error "
         "%.1f (float) and %.1f (double) roundings of the terms, %.0f allowed\n",
         (unsigned long long)seed, checked, failures, worst[0], worst[1], TOLERANCE_ROUNDINGS);
  return failures ? 1 : 0;
}
