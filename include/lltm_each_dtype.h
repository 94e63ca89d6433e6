/* Defines a family once per element type: includes the file named by
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
 * SCALAR and round each result once as they store it. In a kernel file
 * SUFFIX is empty and there is no half: the float and double functions are
 * overloads, which a kernel's math_t<Dtype> picks for every element type.
 * The file is found beside the source (build_ffi.py and the Makefile search
 * each source's folder) or in include/. This header undefines all of them,
 * LLTM_TYPED_FILE and LLTM_TYPED_HALF too, so it can be included again for
 * another file:
 *
 *   #define LLTM_TYPED_FILE "embed_cpu_impl.h"
 *   #define LLTM_TYPED_HALF
 *   #include "lltm_each_dtype.h"
 */
#include "lltm_op.h"

/* float and double: stored and computed as themselves. */
#define STORAGE SCALAR
#define LOAD(x) (x)
#define STORE(x) (x)
#ifdef __CUDACC__
#define SUFFIX
#else
#define SUFFIX SCALAR
#endif
#define SCALAR float
#include LLTM_TYPED_FILE
#undef SCALAR
#define SCALAR double
#include LLTM_TYPED_FILE
#undef SCALAR
#undef SUFFIX

#if defined(LLTM_TYPED_HALF) && !defined(__CUDACC__)
/* float16 and bfloat16: stored as their bits (lltm_float16, lltm_bfloat16),
 * computed in float, converted by lltm_half.h's lltm_<SUFFIX>_to_float and
 * lltm_float_to_<SUFFIX>. */
#include "lltm_half.h"
#undef STORAGE
#undef LOAD
#undef STORE
#define STORAGE LLTM_CONCAT(lltm_, SUFFIX)
#define SCALAR float
#define LOAD(x) LLTM_CONCAT(LLTM_CONCAT(lltm_, SUFFIX), _to_float)(x)
#define STORE(x) LLTM_CONCAT(lltm_float_to_, SUFFIX)(x)
#define SUFFIX float16
#include LLTM_TYPED_FILE
#undef SUFFIX
#define SUFFIX bfloat16
#include LLTM_TYPED_FILE
#undef SUFFIX
#endif

#undef STORAGE
#undef SCALAR
#undef LOAD
#undef STORE
#undef LLTM_TYPED_FILE
#undef LLTM_TYPED_HALF
