/* The sequence layer's recurrent matrix products through cuBLAS
 * (src/lltm_cublas.c), found at run time: the libcublas that torch has
 * already loaded, else one on the library path. Nothing here needs a cuBLAS
 * header or links cuBLAS, so the module builds where there is none; where
 * none can be loaded, lltm_cublas_begin says so and the sequence layer runs
 * its own kernels.
 *
 * One handle per device, made on its first use and kept for the process;
 * a pass holds it from lltm_cublas_begin to lltm_cublas_end, so threads
 * take turns. Matrices are column-major, as cuBLAS reads them. */
#ifndef LLTM_CUBLAS_H
#define LLTM_CUBLAS_H

#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* LLTM_SUCCESS with the current device's handle set to `stream` and to
 * strict float32 or (tf32 != 0) TF32 products; LLTM_ERROR_NO_CUBLAS where
 * cuBLAS cannot be loaded (nothing held); another error code where the
 * handle cannot be made, LLTM_ERROR_CUBLAS_CAPTURE when it would be made
 * while `stream` is capturing a CUDA graph (nothing held either way). */
int lltm_cublas_begin(cudaStream_t stream, int tf32);

/* C (m x n, leading dimension ldc) = op(A) B, op(A) = A^T when transpose_a
 * (A is k x m) or A (m x k); B is k x n. float or double by `dtype`. Only
 * between lltm_cublas_begin and lltm_cublas_end; every size must fit an int.
 * LLTM_SUCCESS or the cuBLAS status as an error code. */
int lltm_cublas_gemm(int dtype, int transpose_a, int64_t m, int64_t n, int64_t k, const void* a,
                     int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc);

/* Lets the next pass have the handle. */
void lltm_cublas_end(void);

/* The text for a code lltm_cublas_gemm returned, or NULL for other codes. */
const char* lltm_cublas_error_string(int code);

#ifdef __cplusplus
}
#endif

#endif /* LLTM_CUBLAS_H */
