/* Checks float's activations of the CPU passes (src/cpu/lltm_cpu_math.h)
 * against libm in double, for `make asan` and `make valgrind`
 * (tests/c/run_checks.c): exp, expm1 and tanh within MAX_ULPS units in the
 * last place over a fine grid (every 2^-9) wherever exp's result is a
 * normal float, and at the edges: exp inf and 0 past its bounds and at
 * the infinities, tanh +-1 and expm1 -1 there, NaN kept by all three. */
#include <math.h>
#include <stdio.h>

#include "lltm_check.h"
#include "lltm_cpu_math.h"

/* The most units in the last place the activations may be off by (they
 * are at most 0.95, 1.55 and 1.60 on this grid). */
#define MAX_ULPS 3.0

/* How many of float's units in the last place at `expected` lie between
 * it and `got`. */
static double ulps_apart(float got, double expected) {
  const double magnitude = fabs(expected);
  const double unit = magnitude < 0x1p-126 ? 0x1p-149 : ldexp(1.0, ilogb(magnitude) - 23);
  return fabs((double)got - expected) / unit;
}

static long failures;

static void expect_close(const char* name, double x, float got, double expected,
                         double* worst) {
  const double apart = ulps_apart(got, expected);
  if (apart > *worst) *worst = apart;
  if (apart <= MAX_ULPS) return;
  if (failures < 20) {
    fprintf(stderr, "MISMATCH %s(%.9g) = %.9g, libm %.9g: %.1f ulps apart\n", name, x, got,
            expected, apart);
  }
  ++failures;
}

static void expect_equal(const char* name, float x, float got, float expected) {
  if (got == expected || (isnan(got) && isnan(expected))) return;
  if (failures < 20) fprintf(stderr, "MISMATCH %s(%g) = %g, not %g\n", name, x, got, expected);
  ++failures;
}

LLTM_CHECK(lltm_cpu_activations) {
  (void)seed;
  failures = 0;
  double worst[3] = {0, 0, 0};
  for (int i = (int)(-87.6 * 512); i <= (int)(88.3 * 512); ++i) {
    const float x = (float)i / 512.0f;
    expect_close("exp", x, exp_float(x), exp((double)x), &worst[0]);
    if (fabsf(x) <= 20.0f) {
      expect_close("expm1", x, expm1_float(x), expm1((double)x), &worst[1]);
      expect_close("tanh", x, tanh_float(x), tanh((double)x), &worst[2]);
    }
  }
  static const float edges[] = {88.4f, 1e3f, -87.7f, -1e3f, INFINITY, -INFINITY, NAN};
  for (size_t i = 0; i < sizeof edges / sizeof edges[0]; ++i) {
    const float x = edges[i];
    expect_equal("exp", x, exp_float(x), isnan(x) ? NAN : x > 0 ? INFINITY : 0.0f);
    expect_equal("expm1", x, expm1_float(x), isnan(x) ? NAN : x > 0 ? INFINITY : -1.0f);
    expect_equal("tanh", x, tanh_float(x), isnan(x) ? NAN : x > 0 ? 1.0f : -1.0f);
  }
  printf("lltm_cpu_activations: exp, expm1, tanh at most %.2f, %.2f, %.2f ulps from libm; "
         "%ld mismatches\n",
         worst[0], worst[1], worst[2], failures);
  return failures;
}
