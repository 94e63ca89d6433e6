/* The sequence layer's matrix products through cuBLAS
 * (src/cuda/cublas.c), found at run time: the libcublas that torch has
 * already loaded, else one on the library path. Nothing here needs a cuBLAS
 * header or links cuBLAS, so the module builds where there is none; where
 * none can be loaded, lltm_cublas_run says so and the sequence layer runs its
 * own kernels.
 *
 * One handle per device, made on its first use and kept for the process;
 * a pass holds it for its launches, so threads take turns. Matrices are
 * column-major, as cuBLAS reads them. */
#ifndef LLTM_CUBLAS_H
#define LLTM_CUBLAS_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What identifies a pass for the graph of its launches: every size,
 * option and address it uses, the unused tail zero, and a packed
 * sequence's batch sizes (batch_sizes_count of them, compared by value;
 * NULL and 0 for dense steps). A key whose first value is 0 identifies
 * none: its pass is never recorded. */
typedef struct {
  int64_t values[40];
  const int64_t* batch_sizes;
  int64_t batch_sizes_count;
} lltm_pass_key;

/* 1 where cuBLAS can be loaded and has products of the lltm_dtype `dtype`
 * (what lltm_cublas_run needs to run a pass), else 0. */
int lltm_cublas_usable(int dtype);

/* Runs steps(context, stream), the launches of one pass (lltm_cublas_gemm
 * and kernels, all on the stream given), whose products are of the
 * lltm_dtype `dtype`, holding the current device's handle set to strict
 * float32 or (tf32 != 0) TF32 products (16-bit products use tensor cores
 * either way), and returns its code. Launching a pass's dozens of kernels
 * costs the host more than the GPU spends at middling sizes, so a pass whose
 * key comes again on the same stream is recorded as a CUDA graph (on a
 * stream of its own) the second time and replayed on that stream from then
 * on (the 64 passes seen last are kept); a pass on a stream that
 * is capturing a graph already, or whose key identifies none, runs its
 * launches there. LLTM_ERROR_NO_CUBLAS, having run nothing, where cuBLAS
 * cannot be loaded or has no product for `dtype` (float16 and bfloat16 need
 * cublasGemmEx); LLTM_ERROR_CUBLAS_CAPTURE where the handle would be made
 * while `stream` is capturing. */
int lltm_cublas_run(const lltm_pass_key* key, int dtype, cudaStream_t stream, int tf32,
                    int (*steps)(void* context, cudaStream_t stream), void* context);

/* C (m x n, leading dimension ldc) = op(A) op(B) (+ C where accumulate),
 * op(X) = X^T where transpose_x (A is then k x m, B n x k), else X (A m x k,
 * B k x n). float, double, float16 or bfloat16 by `dtype` (an lltm_dtype);
 * the 16-bit types by cublasGemmEx, summed in float32 (on tensor cores) and
 * C rounded once. Only within the steps of lltm_cublas_run; every size must
 * fit an int, and k be positive. LLTM_SUCCESS or the cuBLAS status as an
 * error code (CUBLAS_STATUS_NOT_SUPPORTED for a dtype this cuBLAS has no
 * product for). */
int lltm_cublas_gemm(int dtype, int transpose_a, int transpose_b, int64_t m, int64_t n,
                     int64_t k, const void* a, int64_t lda, const void* b, int64_t ldb,
                     int accumulate, void* c, int64_t ldc);
/* The text for a code lltm_cublas_gemm returned, or NULL for other codes. */
const char* lltm_cublas_error_string(int code);

#ifdef __cplusplus
}
#endif

#endif /* LLTM_CUBLAS_H */
