/* The LLTM's CPU passes in float16 (lltm_cpu_impl.h; lltm_cpu.c registers
 * them): one source an element type, so that the build compiles them side
 * by side. */
#include "lltm_cpu_math.h"

#define SCALAR float
#define STORAGE lltm_float16
#define SUFFIX float16
#define AMX_DTYPE LLTM_FLOAT16
#define LOAD(x) lltm_float16_to_float(x)
#define STORE(x) lltm_float_to_float16(x)
#include "lltm_cpu_impl.h"
