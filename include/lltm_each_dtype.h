/* Defines a C family once per element type: includes the file named by
 * LLTM_TYPED_FILE (a quoted file name, defined before this header) once for
 * float and once for double, the families LLTM_CPU_PASS calls, and where
 * LLTM_TYPED_HALF is defined, once more for float16 and for bfloat16, those
 * LLTM_CPU_PASS_WITH_HALF adds. Each time the file sees
 *
 *   STORAGE   the tensors' element type: float, double, lltm_float16, lltm_bfloat16
 *   SCALAR    the type it computes in:   float, double, float,        float
 *   SUFFIX    float, double, float16, bfloat16, which LLTM_NAME(name_) appends
 *   LOAD(x)   an element x as SCALAR;  STORE(x)  a SCALAR x rounded once to STORAGE
 *
 * so that its functions, named LLTM_NAME(...), load each element, compute in
 * SCALAR and round each result once as they store it. This header undefines
 * all of them, LLTM_TYPED_FILE and LLTM_TYPED_HALF too, so it can be included
 * again for another file:
 *
 *   #define LLTM_TYPED_FILE "embed_cpu_impl.h"
 *   #define LLTM_TYPED_HALF
 *   #include "lltm_each_dtype.h"
 */
#include "lltm_half.h"
#include "lltm_op.h"

#define STORAGE float
#define SCALAR float
#define SUFFIX float
#define LOAD(x) (x)
#define STORE(x) (x)
#include LLTM_TYPED_FILE
#undef STORAGE
#undef SCALAR
#undef SUFFIX
#undef LOAD
#undef STORE

#define STORAGE double
#define SCALAR double
#define SUFFIX double
#define LOAD(x) (x)
#define STORE(x) (x)
#include LLTM_TYPED_FILE
#undef STORAGE
#undef SCALAR
#undef SUFFIX
#undef LOAD
#undef STORE

#ifdef LLTM_TYPED_HALF
#define STORAGE lltm_float16
#define SCALAR float
#define SUFFIX float16
#define LOAD(x) lltm_float16_to_float(x)
#define STORE(x) lltm_float_to_float16(x)
#include LLTM_TYPED_FILE
#undef STORAGE
#undef SCALAR
#undef SUFFIX
#undef LOAD
#undef STORE

#define STORAGE lltm_bfloat16
#define SCALAR float
#define SUFFIX bfloat16
#define LOAD(x) lltm_bfloat16_to_float(x)
#define STORE(x) lltm_float_to_bfloat16(x)
#include LLTM_TYPED_FILE
#undef STORAGE
#undef SCALAR
#undef SUFFIX
#undef LOAD
#undef STORE
#undef LLTM_TYPED_HALF
#endif

#undef LLTM_TYPED_FILE
