/* Checks embed's CPU passes (embed_cpu.c) for `make asan` and `make
 * valgrind` (tests/c/run_checks.c): every dtype, 200 random shapes and one
 * past LLTM_PARALLEL_MIN_ELEMENTS (the OpenMP loop), indices inside and
 * outside the rows, with and without a bias, each buffer of exactly its
 * elements' bytes. The forward pass against the rule computed in double and
 * rounded as the pass rounds (a sum in the math type, stored once); the
 * backward pass against sums in double, within the bound of a sum in the
 * math type, and the same bits on a second run (it is serial). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lltm_check.h"
#include "lltm_half.h"

static const int kDtypes[] = {LLTM_FLOAT32, LLTM_FLOAT64, LLTM_FLOAT16, LLTM_BFLOAT16};
static const char* const kDtypeNames[] = {"float32", "float64", "float16", "bfloat16"};

static uint64_t next_random(uint64_t* state) {
  *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
  return *state >> 11;
}

/* A multiple of 2^-20 in [-2, 2): exact in float, and so are sums of two. */
static double random_value(uint64_t* state) {
  return ldexp((double)(next_random(state) % (1u << 22)), -20) - 2.0;
}

static size_t element_size(int dtype) {
  return dtype == LLTM_FLOAT64 ? 8 : dtype == LLTM_FLOAT32 ? 4 : 2;
}

static double get(int dtype, const void* data, int64_t i) {
  switch (dtype) {
    case LLTM_FLOAT32: return ((const float*)data)[i];
    case LLTM_FLOAT64: return ((const double*)data)[i];
    case LLTM_FLOAT16: return lltm_float16_to_float(((const uint16_t*)data)[i]);
    default: return lltm_bfloat16_to_float(((const uint16_t*)data)[i]);
  }
}

/* Stores `value` (a float's value, for every dtype but float64) rounded once. */
static void put(int dtype, void* data, int64_t i, double value) {
  switch (dtype) {
    case LLTM_FLOAT32: ((float*)data)[i] = (float)value; break;
    case LLTM_FLOAT64: ((double*)data)[i] = value; break;
    case LLTM_FLOAT16: ((uint16_t*)data)[i] = lltm_float_to_float16((float)value); break;
    default: ((uint16_t*)data)[i] = lltm_float_to_bfloat16((float)value); break;
  }
}

static void* allocate(size_t bytes) { return malloc(bytes ? bytes : 1); }

/* The failures of both passes on one shape. */
static long check_shape(int d, int64_t index_count, int64_t columns, int64_t rows, int with_bias,
                        uint64_t* state) {
  const int dtype = kDtypes[d];
  const size_t size = element_size(dtype);
  /* The 16-bit passes compute in float, as the float32 ones do. */
  const int math_is_double = dtype == LLTM_FLOAT64;
  const size_t math_size = math_is_double ? 8 : 4;
  void* weight = allocate((size_t)(rows * columns) * size);
  void* bias = with_bias ? allocate((size_t)columns * size) : NULL;
  int64_t* indices = allocate((size_t)index_count * sizeof(int64_t));
  void* output = allocate((size_t)(index_count * columns) * size);
  void* grad_output = allocate((size_t)(index_count * columns) * size);
  void* grad_weight = allocate((size_t)(rows * columns) * math_size);
  void* again = allocate((size_t)(rows * columns) * math_size);
  double* sums = allocate((size_t)(rows * columns) * 2 * sizeof(double));
  int64_t* terms = allocate((size_t)(rows * columns) * sizeof(int64_t));
  long failures = 0;
  if (!weight || (with_bias && !bias) || !indices || !output || !grad_output || !grad_weight ||
      !again || !sums || !terms) {
    failures = 1;
    goto done;
  }
  for (int64_t i = 0; i < rows * columns; ++i) put(dtype, weight, i, random_value(state));
  for (int64_t i = 0; with_bias && i < columns; ++i) put(dtype, bias, i, random_value(state));
  for (int64_t i = 0; i < index_count * columns; ++i) {
    put(dtype, grad_output, i, random_value(state));
  }
  /* Mostly inside, some at each edge and beyond it. */
  for (int64_t n = 0; n < index_count; ++n) {
    indices[n] = (int64_t)(next_random(state) % (uint64_t)(rows + 4)) - 2;
  }
  const int64_t sizes[3] = {index_count, columns, rows};
  void* const forward_tensors[4] = {weight, indices, bias, output};
  if (lltm_check_pass("embed_forward", dtype, sizes, NULL, forward_tensors) != LLTM_SUCCESS) {
    fprintf(stderr, "embed_forward (%s) returned an error\n", kDtypeNames[d]);
    ++failures;
  }
  for (int64_t n = 0; n < index_count; ++n) {
    const int inside = indices[n] >= 0 && indices[n] < rows;
    for (int64_t column = 0; column < columns; ++column) {
      double expected = inside ? get(dtype, weight, indices[n] * columns + column) : 0.0;
      if (with_bias) {
        const double sum = expected + get(dtype, bias, column); /* exact: multiples of 2^-20 */
        expected = math_is_double ? sum : (double)(float)sum;
      }
      unsigned char rounded[8];
      put(dtype, rounded, 0, expected);
      const double got = get(dtype, output, n * columns + column);
      if (got != get(dtype, rounded, 0)) {
        if (failures < 10) {
          fprintf(stderr, "embed_forward (%s) %lldx%lld of %lld rows, index %lld, column %lld: "
                  "%g, expected %g\n", kDtypeNames[d], (long long)index_count, (long long)columns,
                  (long long)rows, (long long)indices[n], (long long)column, got,
                  get(dtype, rounded, 0));
        }
        ++failures;
      }
    }
  }
  memset(grad_weight, 0, (size_t)(rows * columns) * math_size);
  memset(again, 0, (size_t)(rows * columns) * math_size);
  void* const backward_tensors[3] = {grad_output, indices, grad_weight};
  void* const again_tensors[3] = {grad_output, indices, again};
  if (lltm_check_pass("embed_backward", dtype, sizes, NULL, backward_tensors) != LLTM_SUCCESS ||
      lltm_check_pass("embed_backward", dtype, sizes, NULL, again_tensors) != LLTM_SUCCESS) {
    fprintf(stderr, "embed_backward (%s) returned an error\n", kDtypeNames[d]);
    ++failures;
  }
  if (memcmp(grad_weight, again, (size_t)(rows * columns) * math_size) != 0) {
    fprintf(stderr, "embed_backward (%s) gave other bits on a second run\n", kDtypeNames[d]);
    ++failures;
  }
  memset(sums, 0, (size_t)(rows * columns) * 2 * sizeof(double));
  memset(terms, 0, (size_t)(rows * columns) * sizeof(int64_t));
  for (int64_t n = 0; n < index_count; ++n) {
    if (indices[n] < 0 || indices[n] >= rows) continue;
    for (int64_t column = 0; column < columns; ++column) {
      const int64_t element = indices[n] * columns + column;
      const double term = get(dtype, grad_output, n * columns + column);
      sums[2 * element] += term;
      sums[2 * element + 1] += fabs(term);
      ++terms[element];
    }
  }
  /* A sum of k terms in the math type is within (k - 1) u sum |term| of the
   * exact one (u: its unit roundoff); the sums in double here are exact. */
  const double roundoff = math_is_double ? ldexp(1.0, -53) : ldexp(1.0, -24);
  for (int64_t element = 0; element < rows * columns; ++element) {
    const double got = math_is_double ? ((double*)grad_weight)[element]
                                      : ((float*)grad_weight)[element];
    const double bound = (double)(terms[element] > 1 ? terms[element] - 1 : 0) * roundoff *
                         sums[2 * element + 1];
    if (!(fabs(got - sums[2 * element]) <= bound)) {
      if (failures < 10) {
        fprintf(stderr, "embed_backward (%s) element %lld: %.17g, expected %.17g within %g\n",
                kDtypeNames[d], (long long)element, got, sums[2 * element], bound);
      }
      ++failures;
    }
  }
done:
  free(weight);
  free(bias);
  free(indices);
  free(output);
  free(grad_output);
  free(grad_weight);
  free(again);
  free(sums);
  free(terms);
  return failures;
}

LLTM_CHECK(embed_cpu_passes) {
  uint64_t state = seed;
  long failures = 0;
  for (int d = 0; d < 4; ++d) {
    for (int shape = 0; shape < 200; ++shape) {
      const int64_t index_count = (int64_t)(next_random(&state) % 40);
      const int64_t columns = 1 + (int64_t)(next_random(&state) % 9);
      const int64_t rows = 1 + (int64_t)(next_random(&state) % 7);
      failures += check_shape(d, index_count, columns, rows, shape % 2, &state);
    }
    failures += check_shape(d, LLTM_PARALLEL_MIN_ELEMENTS / 8 + 5, 8, 50, 1, &state);
  }
  return failures;
}
