/* The LLTM's CPU passes in bfloat16 (lltm_cpu_impl.h; lltm_cpu.c registers
 * them): one source an element type, so that the build compiles them side
 * by side. */
#include "lltm_cpu_math.h"

#define SCALAR float
#define STORAGE lltm_bfloat16
#define SUFFIX bfloat16
#define AMX_DTYPE LLTM_BFLOAT16
#define LOAD(x) lltm_bfloat16_to_float(x)
#define STORE(x) lltm_float_to_bfloat16(x)
#include "lltm_cpu_impl.h"
