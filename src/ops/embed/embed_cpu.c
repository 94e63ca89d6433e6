/* embed on the CPU: the same rule, layout and arguments as
 * embed_kernel.cu's passes, in plain C (the passes themselves:
 * embed_cpu_impl.h, defined for each element type by lltm_each_dtype.h).
 * Nothing here prints, exits or aborts. */
#include <stdint.h>

#include "lltm_op.h"

#define LLTM_TYPED_FILE "embed_cpu_impl.h"
#define LLTM_TYPED_HALF
#include "lltm_each_dtype.h"

/* The passes, in the argument order of their declarations in embed.py:
 * sizes (index_count, columns, rows), then the tensors. */
LLTM_CPU_PASS_WITH_HALF(embed_forward, embed_forward, args->sizes[0], args->sizes[1],
                        args->sizes[2], args->tensors[0], args->tensors[1], args->tensors[2],
                        args->tensors[3])
LLTM_CPU_PASS_WITH_HALF(embed_backward, embed_backward, args->sizes[0], args->sizes[1],
                        args->sizes[2], args->tensors[0], args->tensors[1], args->tensors[2])
