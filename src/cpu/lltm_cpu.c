/* The LLTM's passes on the CPU, the cell's and the whole sequence's, registered:
 * the same math, layout and arguments as the CUDA passes of lltm_kernel.cu and
 * sequence_kernel.cu, in plain C. The passes themselves are lltm_cpu_impl.h,
 * compiled once an element type (lltm_cpu_float.c, lltm_cpu_double.c,
 * lltm_cpu_float16.c, lltm_cpu_bfloat16.c) so that the build compiles the
 * four side by side; lltm_cpu_math.h holds what they share. float16 and
 * bfloat16 tensors compute in float (lltm_half.h converts), their products
 * on AMX where the CPU has it (lltm_amx.h). */
#include "lltm_op.h"

/* Each element type's entry points (lltm_cpu_impl.h). */
#define LLTM_CPU_ENTRIES(pass)               \
  int pass##_float(const lltm_args* args);   \
  int pass##_double(const lltm_args* args);  \
  int pass##_float16(const lltm_args* args); \
  int pass##_bfloat16(const lltm_args* args);

LLTM_CPU_ENTRIES(lltm_forward_pass)
LLTM_CPU_ENTRIES(lltm_backward_pass)
LLTM_CPU_ENTRIES(lltm_packed_forward)
LLTM_CPU_ENTRIES(lltm_packed_backward)

LLTM_CPU_PASS_WITH_HALF(forward_pass, lltm_forward_pass, args)
LLTM_CPU_PASS_WITH_HALF(backward_pass, lltm_backward_pass, args)
LLTM_CPU_PASS_WITH_HALF(packed_forward, lltm_packed_forward, args)
LLTM_CPU_PASS_WITH_HALF(packed_backward, lltm_packed_backward, args)
