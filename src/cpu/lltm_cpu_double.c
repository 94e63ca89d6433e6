/* The LLTM's CPU passes in float64 (lltm_cpu_impl.h; lltm_cpu.c registers
 * them): one source an element type, so that the build compiles them side
 * by side. */
#include "lltm_cpu_math.h"

#define SCALAR double
#define STORAGE double
#define SUFFIX double
#define LOAD(x) (x)
#define STORE(x) (x)
#include "lltm_cpu_impl.h"
