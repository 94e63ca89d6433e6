/* Checks round_ste's CPU pass (round_cpu.c) for `make asan` and `make
 * valgrind` (tests/c/run_checks.c): every dtype, every count from 0 to 70
 * (each vector tail), values on both sides of 0.5 and exactly 0.5, NaN and
 * the infinities; each buffer of exactly its elements' bytes. Also the
 * conversions of include/lltm_half.h, which every float16 and bfloat16 pass
 * uses. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lltm_check.h"
#include "lltm_half.h"

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

/* The 16-bit types: inputs are the type's own values (the random ones
 * rounded to it; 0.5 itself and its two neighbours in the type), the
 * expected output 1 or 0 in the type. */
static long check_round_half(int dtype, int64_t count, uint64_t* state) {
  const int is_bfloat16 = dtype == LLTM_BFLOAT16;
  const char* type = is_bfloat16 ? "bfloat16" : "float16";
  const uint16_t half = is_bfloat16 ? 0x3f00 : 0x3800; /* 0.5 */
  const uint16_t one = is_bfloat16 ? 0x3f80 : 0x3c00;
  const uint16_t special[8] = {half, (uint16_t)(half - 1), (uint16_t)(half + 1), 0x8000, one,
                               is_bfloat16 ? 0x7fc0 : 0x7e00, is_bfloat16 ? 0x7f80 : 0x7c00,
                               is_bfloat16 ? 0xff80 : 0xfc00};
  uint16_t* input = malloc(count ? (size_t)count * sizeof(uint16_t) : 1);
  uint16_t* output = malloc(count ? (size_t)count * sizeof(uint16_t) : 1);
  long failures = 0;
  if (!input || !output) return 1;
  for (int64_t i = 0; i < count; ++i) {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    const float u = (float)((double)(*state >> 11) / 9007199254740992.0) * 2.0f - 0.5f;
    input[i] = i % 5 == 0 ? special[(*state >> 3) % 8]
               : is_bfloat16 ? lltm_float_to_bfloat16(u)
                             : lltm_float_to_float16(u);
    output[i] = 0xffff; /* NaN in either type */
  }
  const int64_t sizes[1] = {count};
  void* const tensors[2] = {input, output};
  if (lltm_check_pass("round_forward", dtype, sizes, NULL, tensors) != LLTM_SUCCESS) {
    fprintf(stderr, "round_forward (%s) returned an error\n", type);
    ++failures;
  }
  for (int64_t i = 0; i < count; ++i) {
    const float value =
        is_bfloat16 ? lltm_bfloat16_to_float(input[i]) : lltm_float16_to_float(input[i]);
    const uint16_t expected = value >= 0.5f ? one : 0;
    if (output[i] != expected) {
      if (failures < 10) {
        fprintf(stderr, "round_forward (%s) count %lld index %lld: %g gave bits %04x\n", type,
                (long long)count, (long long)i, (double)value, output[i]);
      }
      ++failures;
    }
  }
  free(input);
  free(output);
  return failures;
}

LLTM_CHECK(round_cpu_pass) {
  uint64_t state = seed;
  long failures = 0;
  for (int64_t count = 0; count <= 70; ++count) {
    failures += check_round_float(count, &state) + check_round_double(count, &state) +
                check_round_half(LLTM_FLOAT16, count, &state) +
                check_round_half(LLTM_BFLOAT16, count, &state);
  }
  return failures;
}

/* The conversions of lltm_half.h against plain arithmetic in double. */
struct half_format {
  const char* name;
  int mantissa_bits;   /* stored: 10 for float16, 7 for bfloat16 */
  int exponent_bias;   /* 15, 127 */
  float (*to_float)(uint16_t);
  uint16_t (*from_float)(float);
};

static float float16_to_float(uint16_t bits) { return lltm_float16_to_float(bits); }
static uint16_t float_to_float16(float value) { return lltm_float_to_float16(value); }
static float bfloat16_to_float(uint16_t bits) { return lltm_bfloat16_to_float(bits); }
static uint16_t float_to_bfloat16(float value) { return lltm_float_to_bfloat16(value); }

static const struct half_format kFormats[2] = {
    {"float16", 10, 15, float16_to_float, float_to_float16},
    {"bfloat16", 7, 127, bfloat16_to_float, float_to_bfloat16}};

static int is_nan_bits(const struct half_format* format, uint16_t bits) {
  const uint16_t exponent_mask = (uint16_t)(0x7fff & ~((1u << format->mantissa_bits) - 1));
  return (bits & exponent_mask) == exponent_mask && (bits & ((1u << format->mantissa_bits) - 1));
}

/* The value of a pattern, from its fields. */
static double value_of(const struct half_format* format, uint16_t bits) {
  const int m = format->mantissa_bits;
  const int exponent = (bits & 0x7fff) >> m, mantissa = bits & ((1 << m) - 1);
  const int top = (1 << (15 - m)) - 1;
  double magnitude;
  if (exponent == top) {
    magnitude = mantissa ? NAN : INFINITY;
  } else if (exponent == 0) {
    magnitude = ldexp(mantissa, 1 - format->exponent_bias - m);
  } else {
    magnitude = ldexp((1 << m) + mantissa, exponent - format->exponent_bias - m);
  }
  return bits & 0x8000 ? -magnitude : magnitude;
}

/* What a finite float rounds to, to nearest even, as a value: rint (in
 * the default rounding mode, to nearest even) of the value in units of the
 * format's last place at its exponent; past the largest finite value's
 * midpoint with the next power of two, inf. */
static double rounded_value(const struct half_format* format, float value) {
  const int m = format->mantissa_bits;
  const int min_exponent = 1 - format->exponent_bias;
  const int max_exponent = (1 << (15 - m)) - 2 - format->exponent_bias;
  int exponent;
  frexp(value, &exponent);
  exponent -= 1; /* value in [2^exponent, 2^(exponent + 1)) */
  if (exponent < min_exponent) exponent = min_exponent;
  const double rounded = ldexp(rint(ldexp(value, m - exponent)), exponent - m);
  if (fabs(rounded) >= ldexp(1.0, max_exponent + 1)) return value < 0 ? -INFINITY : INFINITY;
  return rounded;
}

static long check_from_float(const struct half_format* format, float value, long* failures) {
  const uint16_t bits = format->from_float(value);
  const double got = value_of(format, bits);
  int right;
  if (isnan(value)) {
    /* Quiet (the top mantissa bit set), the sign kept. */
    right = is_nan_bits(format, bits) && (bits >> (format->mantissa_bits - 1) & 1) &&
            (bits >> 15) == (lltm_bits_of_float(value) >> 31);
  } else {
    const double expected = rounded_value(format, value);
    right = got == expected && !signbit(got) == !signbit(expected);
  }
  if (!right) {
    if (*failures < 10) {
      fprintf(stderr, "%s of float %a (bits %08x) gave %04x\n", format->name, (double)value,
              lltm_bits_of_float(value), bits);
    }
    ++*failures;
  }
  return 1;
}

LLTM_CHECK(half_conversions) {
  long failures = 0, checked = 0;
  uint64_t state = seed ? seed : 1;
  for (int f = 0; f < 2; ++f) {
    const struct half_format* format = &kFormats[f];
    for (uint32_t pattern = 0; pattern < 65536; ++pattern) {
      const uint16_t bits = (uint16_t)pattern;
      const float value = format->to_float(bits);
      const double expected = value_of(format, bits);
      /* Exact, NaN to NaN; then back: the same pattern, a NaN's quieted. */
      const int exact = isnan(expected) ? isnan(value) != 0
                                        : (double)value == expected &&
                                              !signbit(value) == !signbit(expected);
      const uint16_t quiet = is_nan_bits(format, bits)
                                 ? (uint16_t)(bits | 1u << (format->mantissa_bits - 1))
                                 : bits;
      const uint16_t back = format->from_float(value);
      if (!exact || back != quiet) {
        if (failures < 10) {
          fprintf(stderr, "%s %04x: to float %a (expected %a), back %04x\n", format->name, bits,
                  (double)value, expected, back);
        }
        ++failures;
      }
      ++checked;
      if (isnan(expected) || isinf(expected) || (bits & 0x7fff) == 0x7fff) continue;
      /* The midpoint with the next pattern up in magnitude (the largest
       * finite value's: with inf, as if the exponent went on), exact in
       * float, ties to even; a float's last place either side of it goes
       * to the nearer. */
      const uint16_t next = (uint16_t)(bits + 1);
      const double upper = isinf(value_of(format, next))
                               ? 2 * expected - value_of(format, (uint16_t)(bits - 1))
                               : value_of(format, next);
      const float midpoint = (float)((expected + upper) / 2);
      checked += check_from_float(format, midpoint, &failures);
      checked += check_from_float(format, nextafterf(midpoint, 0.0f), &failures);
      checked += check_from_float(format, nextafterf(midpoint, 2.0f * midpoint), &failures);
    }
    /* Past the range, under the smallest subnormal's half, NaNs with a
     * payload in float's low bits only (signalling), random floats. */
    static const uint32_t special[] = {0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0x00000001u,
                                       0x80000001u, 0x33000000u, 0x33000001u, 0x7f800001u,
                                       0xff800001u, 0x7fc00000u, 0x477ff000u, 0x477fefffu};
    for (size_t k = 0; k < sizeof special / sizeof special[0]; ++k) {
      checked += check_from_float(format, lltm_float_of_bits(special[k]), &failures);
    }
    for (int k = 0; k < 1 << 20; ++k) {
      state ^= state >> 12;
      state ^= state << 25;
      state ^= state >> 27;
      checked += check_from_float(format, lltm_float_of_bits((uint32_t)(state >> 32)), &failures);
    }
  }
#ifdef LLTM_HAS_NATIVE_FLOAT16
  /* The compiler's own conversions give the same bits. */
  for (uint32_t pattern = 0; pattern < 65536; ++pattern) {
    const uint16_t bits = (uint16_t)pattern;
    const float value = lltm_float16_to_float(bits);
    const float values[3] = {value, nextafterf(value, INFINITY), nextafterf(value, -INFINITY)};
    int same = lltm_bits_of_float(value) ==
               lltm_bits_of_float(lltm_float16_to_float_native(bits));
    for (int k = 0; k < 3; ++k) {
      same &= lltm_float_to_float16(values[k]) == lltm_float_to_float16_native(values[k]);
      /* The midpoint with the next pattern, where there is one. */
      const float midpoint = (value + lltm_float16_to_float((uint16_t)(bits + 1))) / 2;
      same &= lltm_float_to_float16(midpoint) == lltm_float_to_float16_native(midpoint);
    }
    if (!same) {
      if (failures < 10) fprintf(stderr, "float16 %04x: software and _Float16 differ\n", bits);
      ++failures;
    }
    ++checked;
  }
#endif
  printf("half_conversions: %ld conversions checked, %ld wrong\n", checked, failures);
  return failures;
}
