/* The LLTM's CPU passes in float32 (lltm_cpu_impl.h; lltm_cpu.c registers
 * them): one source an element type, so that the build compiles them side
 * by side. */
#include "lltm_cpu_math.h"

#define SCALAR float
#define STORAGE float
#define SUFFIX float
#define LOAD(x) (x)
#define STORE(x) (x)
#include "lltm_cpu_impl.h"
