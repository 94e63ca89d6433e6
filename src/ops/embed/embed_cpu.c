/* embed on the CPU: the same rule, layout and arguments as
 * embed_kernel.cu's passes, in plain C (the passes themselves:
 * embed_cpu_impl.h, defined for each element type by lltm_each_dtype.h).
 * Nothing here prints, exits or aborts. */
#define LLTM_TYPED_FILE "embed_cpu_impl.h"
#define LLTM_TYPED_HALF
#include "lltm_each_dtype.h"

/* The passes, in the argument order of their declarations in embed.py:
 * sizes (index_count, columns, rows), then the tensors. */
LLTM_CPU_PASS_WITH_HALF(embed_forward, embed_forward, LLTM_SIZES(3), LLTM_TENSORS(4))
LLTM_CPU_PASS_WITH_HALF(embed_backward, embed_backward, LLTM_SIZES(3), LLTM_TENSORS(3))
