/* The CPU passes' BLAS, loaded at run time (include/lltm_blas.h): the few
 * functions used, declared here with cblas's own signatures and found with
 * dlsym, so that neither a BLAS header nor a BLAS library is needed to
 * build. */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "lltm_blas.h"
#include "lltm_ffi.h"

/* cblas's enums, as its header declares them. */
enum { CBLAS_ROW_MAJOR = 101 };
enum { CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };

typedef void (*sgemm_function)(int, int, int, int, int, int, float, const float*, int,
                               const float*, int, float, float*, int);
typedef void (*dgemm_function)(int, int, int, int, int, int, double, const double*, int,
                               const double*, int, double, double*, int);
typedef void (*sgemv_function)(int, int, int, int, float, const float*, int, const float*, int,
                               float, float*, int);
typedef void (*dgemv_function)(int, int, int, int, double, const double*, int, const double*,
                               int, double, double*, int);
typedef void (*set_threads_function)(int);
typedef char* (*config_function)(void);

static struct {
  sgemm_function sgemm;
  dgemm_function dgemm;
  sgemv_function sgemv;
  dgemv_function dgemv;
  config_function config;
  int narrow; /* lltm_blas_narrow's answer, known at the load */
} blas;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char* library_path; /* under the lock until the load */
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int loaded;

void lltm_blas_library(const char* path) {
  pthread_mutex_lock(&lock);
  free(library_path);
  library_path = path ? strdup(path) : NULL;
  pthread_mutex_unlock(&lock);
}

/* `name` in the library, with the scipy-openblas wheels' prefix or
 * without (a plain OpenBLAS). */
static void* symbol(void* library, const char* name) {
  char prefixed[64] = "scipy_";
  strncat(prefixed, name, sizeof prefixed - strlen(prefixed) - 1);
  void* found = dlsym(library, prefixed);
  return found ? found : dlsym(library, name);
}

/* Whether kernels named by `corename` (openblas_get_corename; NULL: no
 * such function) are narrower than the CPU's vectors (lltm_blas_narrow). */
static int narrow_kernels(config_function corename) {
  static const char* const avx512_kernels[] = {"skylakex", "cooperlake", "sapphirerapids"};
  const char* name = corename ? corename() : NULL;
  if (!name || !lltm_cpu_avx512()) return 0;
  for (size_t i = 0; i < sizeof avx512_kernels / sizeof *avx512_kernels; ++i) {
    if (strcasecmp(name, avx512_kernels[i]) == 0) return 0;
  }
  return 1;
}

/* The library at the path given, kept open; nothing where none was given,
 * it cannot be opened, or it lacks a function used. */
static void load(void) {
  pthread_mutex_lock(&lock);
  void* library = library_path ? dlopen(library_path, RTLD_NOW | RTLD_LOCAL) : NULL;
  pthread_mutex_unlock(&lock);
  if (!library) return;
  blas.sgemm = (sgemm_function)symbol(library, "cblas_sgemm");
  blas.dgemm = (dgemm_function)symbol(library, "cblas_dgemm");
  blas.sgemv = (sgemv_function)symbol(library, "cblas_sgemv");
  blas.dgemv = (dgemv_function)symbol(library, "cblas_dgemv");
  blas.config = (config_function)symbol(library, "openblas_get_config");
  const set_threads_function set_threads =
      (set_threads_function)symbol(library, "openblas_set_num_threads");
  /* Without the thread setting its calls would start threads of their own
   * inside the passes' parallel regions. */
  if (!blas.sgemm || !blas.dgemm || !blas.sgemv || !blas.dgemv || !set_threads) {
    dlclose(library);
    memset(&blas, 0, sizeof blas);
    return;
  }
  set_threads(1);
  blas.narrow = narrow_kernels((config_function)symbol(library, "openblas_get_corename"));
  loaded = 1;
}

int lltm_blas_loaded(void) {
  pthread_once(&load_once, load);
  return loaded;
}

const char* lltm_blas_config(void) {
  if (!lltm_blas_loaded()) return "";
  return blas.config ? blas.config() : "a BLAS without openblas_get_config";
}

int lltm_blas_narrow(void) { return lltm_blas_loaded() && blas.narrow; }

static int trans(int transpose) { return transpose ? CBLAS_TRANS : CBLAS_NO_TRANS; }

void lltm_blas_sgemm(int transpose_a, int transpose_b, int64_t m, int64_t n, int64_t k,
                     const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                     float* c, int64_t ldc) {
  blas.sgemm(CBLAS_ROW_MAJOR, trans(transpose_a), trans(transpose_b), (int)m, (int)n, (int)k,
             1.0f, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

void lltm_blas_dgemm(int transpose_a, int transpose_b, int64_t m, int64_t n, int64_t k,
                     const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                     double* c, int64_t ldc) {
  blas.dgemm(CBLAS_ROW_MAJOR, trans(transpose_a), trans(transpose_b), (int)m, (int)n, (int)k,
             1.0, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

void lltm_blas_sgemv(int transpose, int64_t m, int64_t n, const float* a, int64_t lda,
                     const float* x, float* y) {
  blas.sgemv(CBLAS_ROW_MAJOR, trans(transpose), (int)m, (int)n, 1.0f, a, (int)lda, x, 1, 0.0f, y,
             1);
}

void lltm_blas_dgemv(int transpose, int64_t m, int64_t n, const double* a, int64_t lda,
                     const double* x, double* y) {
  blas.dgemv(CBLAS_ROW_MAJOR, trans(transpose), (int)m, (int)n, 1.0, a, (int)lda, x, 1, 0.0, y, 1);
}
