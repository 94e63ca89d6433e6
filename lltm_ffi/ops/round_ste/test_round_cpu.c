/* Checks round_ste's CPU pass (round_cpu.c) for `make asan` and `make
 * valgrind` (tests/c/run_checks.c): float and double, every count from 0 to
 * 70 (each vector tail), values on both sides of 0.5 and exactly 0.5, NaN
 * and the infinities; each buffer of exactly its elements' bytes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lltm_check.h"

static const double kSpecial[] = {0.5, 0.49999999, 0.50000001, -0.0, 1.0, NAN, INFINITY, -INFINITY};

#define DEFINE_ROUND_CHECK(SCALAR, DTYPE)                                                    \
  static long check_round_##SCALAR(int64_t count, uint64_t* state) {                         \
    SCALAR* input = malloc(count ? (size_t)count * sizeof(SCALAR) : 1);                      \
    SCALAR* output = malloc(count ? (size_t)count * sizeof(SCALAR) : 1);                     \
    long failures = 0;                                                                       \
    if (!input || !output) return 1;                                                         \
    for (int64_t i = 0; i < count; ++i) {                                                    \
      *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;                     \
      const double u = (double)(*state >> 11) / 9007199254740992.0;                          \
      input[i] = (SCALAR)(i % 5 == 0 ? kSpecial[(*state >> 3) % 8] : u * 2.0 - 0.5);        \
      output[i] = (SCALAR)NAN;                                                               \
    }                                                                                        \
    const int64_t sizes[1] = {count};                                                        \
    void* const tensors[2] = {input, output};                                                \
    if (lltm_check_pass("round_forward", DTYPE, sizes, NULL, tensors) != LLTM_SUCCESS) {     \
      fprintf(stderr, "round_forward (" #SCALAR ") returned an error\n");                     \
      ++failures;                                                                            \
    }                                                                                        \
    for (int64_t i = 0; i < count; ++i) {                                                    \
      const SCALAR expected = input[i] >= (SCALAR)0.5 ? (SCALAR)1 : (SCALAR)0;               \
      if (output[i] != expected) {                                                           \
        if (failures < 10) {                                                                 \
          fprintf(stderr, "round_forward (" #SCALAR ") count %lld index %lld: %g gave %g\n",  \
                  (long long)count, (long long)i, (double)input[i], (double)output[i]);      \
        }                                                                                    \
        ++failures;                                                                          \
      }                                                                                      \
    }                                                                                        \
    free(input);                                                                             \
    free(output);                                                                            \
    return failures;                                                                         \
  }

DEFINE_ROUND_CHECK(float, LLTM_FLOAT32)
DEFINE_ROUND_CHECK(double, LLTM_FLOAT64)

LLTM_CHECK(round_cpu_pass) {
  uint64_t state = seed;
  long failures = 0;
  for (int64_t count = 0; count <= 70; ++count) {
    failures += check_round_float(count, &state) + check_round_double(count, &state);
  }
  return failures;
}
