/* A BLAS for the CPU passes' matrix products, loaded at run time
 * (src/blas.c): OpenBLAS, from the scipy-openblas32 wheel where Python
 * finds one (lltm_ffi/_extension.py hands its path to
 * lltm_blas_library, lltm_ffi.h), or any OpenBLAS whose path is given so.
 * Nothing links it and no BLAS header is needed to build; without one the
 * passes take their own products (lltm_cpu_impl.h says where each path
 * runs).
 *
 * The library is loaded on the first product that asks for it, and told
 * to run every call on its calling thread: the passes split each product
 * into one call a thread themselves, on the OpenMP threads torch's
 * get_num_threads() gives them (lltm_team_size, lltm_op.h), so that no
 * second pool of threads competes with torch's. That setting is the
 * library's own: anything else in the process that calls the same file
 * (not numpy's or scipy's, which carry copies of their own) runs on one
 * thread too. */
#ifndef LLTM_BLAS_H
#define LLTM_BLAS_H

#include <stdint.h>

/* 1 where the library could be loaded and has the functions used (loading
 * it on the first call), else 0. */
int lltm_blas_loaded(void);

/* c = a b + beta c, row-major, through the loaded library's cblas_sgemm
 * and cblas_dgemm: a (m x k) with row stride lda, or its transpose where
 * transpose_a (a then k x m); b (k x n) with row stride ldb, or its
 * transpose where transpose_b. Only where lltm_blas_loaded, with every
 * size and stride below LLTM_BLAS_MAX (the library's ints are 32 bits),
 * on the calling thread. */
#define LLTM_BLAS_MAX ((int64_t)0x7fffffff)
void lltm_blas_sgemm(int transpose_a, int transpose_b, int64_t m, int64_t n, int64_t k,
                     const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                     float* c, int64_t ldc);
void lltm_blas_dgemm(int transpose_a, int transpose_b, int64_t m, int64_t n, int64_t k,
                     const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                     double* c, int64_t ldc);

/* y = a x (or a^T x where `transpose`), row-major, through cblas_sgemv and
 * cblas_dgemv: a (m x n) with row stride lda, x and y dense; as above. */
void lltm_blas_sgemv(int transpose, int64_t m, int64_t n, const float* a, int64_t lda,
                     const float* x, float* y);
void lltm_blas_dgemv(int transpose, int64_t m, int64_t n, const double* a, int64_t lda,
                     const double* x, double* y);

#endif /* LLTM_BLAS_H */
