/* cuBLAS loaded at run time for the sequence layer's recurrent products
 * (include/lltm_cublas.h): the few functions used, declared here with
 * cuBLAS's own signatures and found with dlsym, so that neither a cuBLAS
 * header nor a cuBLAS library is needed to build. */
#ifdef LLTM_WITH_CUDA

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>

#include "lltm_cublas.h"
#include "lltm_dtype.h"
#include "lltm_ffi.h"

/* cuBLAS's types, as its header declares them: enums are ints, the handle
 * a pointer. */
typedef void* cublas_handle;
typedef int (*create_function)(cublas_handle*);
typedef int (*set_stream_function)(cublas_handle, cudaStream_t);
typedef int (*set_math_mode_function)(cublas_handle, int);
typedef int (*sgemm_function)(cublas_handle, int, int, int, int, int, const float*, const float*,
                              int, const float*, int, const float*, float*, int);
typedef int (*dgemm_function)(cublas_handle, int, int, int, int, int, const double*,
                              const double*, int, const double*, int, const double*, double*,
                              int);

enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 };

static struct {
  create_function create;
  set_stream_function set_stream;
  set_math_mode_function set_math_mode;
  sgemm_function sgemm;
  dgemm_function dgemm;
} cublas;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int loaded;

/* The libcublas torch loaded (newest first), else the first on the library
 * path; the handle is never closed. */
static void load(void) {
  static const char* const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
  const int count = (int)(sizeof(names) / sizeof(names[0]));
  void* library = NULL;
  for (int i = 0; i < count && !library; ++i) library = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
  for (int i = 0; i < count && !library; ++i) library = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!library) return;
  cublas.create = (create_function)dlsym(library, "cublasCreate_v2");
  cublas.set_stream = (set_stream_function)dlsym(library, "cublasSetStream_v2");
  cublas.set_math_mode = (set_math_mode_function)dlsym(library, "cublasSetMathMode");
  cublas.sgemm = (sgemm_function)dlsym(library, "cublasSgemm_v2");
  cublas.dgemm = (dgemm_function)dlsym(library, "cublasDgemm_v2");
  loaded = cublas.create && cublas.set_stream && cublas.set_math_mode && cublas.sgemm &&
           cublas.dgemm;
}

/* A handle per device index, made under the lock and kept. */
#define LLTM_CUBLAS_MAX_DEVICES 64
static cublas_handle handles[LLTM_CUBLAS_MAX_DEVICES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static cublas_handle current;  /* the handle of the pass that holds the lock */

static int cublas_code(int status) { return status ? LLTM_ERROR_CUBLAS - status : LLTM_SUCCESS; }

/* The current device's handle, made now if need be; NULL with *code set
 * when it cannot be. Under the lock. */
static cublas_handle device_handle(cudaStream_t stream, int* code) {
  int device;
  cudaError_t status = cudaGetDevice(&device);
  if (status == cudaSuccess && (device < 0 || device >= LLTM_CUBLAS_MAX_DEVICES)) {
    *code = LLTM_ERROR_NO_CUBLAS;
    return NULL;
  }
  if (status == cudaSuccess && handles[device]) return handles[device];
  enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (status == cudaSuccess) status = cudaStreamIsCapturing(stream, &capture);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    *code = (int)status;
    return NULL;
  }
  if (capture != cudaStreamCaptureStatusNone) {
    *code = LLTM_ERROR_CUBLAS_CAPTURE;
    return NULL;
  }
  *code = cublas_code(cublas.create(&handles[device]));
  if (*code != LLTM_SUCCESS) handles[device] = NULL;
  return handles[device];
}

int lltm_cublas_begin(cudaStream_t stream, int tf32) {
  pthread_once(&load_once, load);
  if (!loaded) return LLTM_ERROR_NO_CUBLAS;
  pthread_mutex_lock(&lock);
  int code = LLTM_SUCCESS;
  cublas_handle handle = device_handle(stream, &code);
  if (handle) code = cublas_code(cublas.set_stream(handle, stream));
  if (code == LLTM_SUCCESS) {
    code = cublas_code(
        cublas.set_math_mode(handle, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  }
  if (code != LLTM_SUCCESS) {
    pthread_mutex_unlock(&lock);
    return code;
  }
  current = handle;
  return LLTM_SUCCESS;
}

int lltm_cublas_gemm(int dtype, int transpose_a, int64_t m, int64_t n, int64_t k, const void* a,
                     int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc) {
  const int op = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (dtype == LLTM_FLOAT64) {
    const double one = 1, zero = 0;
    return cublas_code(cublas.dgemm(current, op, CUBLAS_OP_N, (int)m, (int)n, (int)k, &one, a,
                                    (int)lda, b, (int)ldb, &zero, c, (int)ldc));
  }
  const float one = 1, zero = 0;
  return cublas_code(cublas.sgemm(current, op, CUBLAS_OP_N, (int)m, (int)n, (int)k, &one, a,
                                  (int)lda, b, (int)ldb, &zero, c, (int)ldc));
}

void lltm_cublas_end(void) {
  current = NULL;
  pthread_mutex_unlock(&lock);
}

/* cuBLAS's statuses by number (cublas_api.h). */
static const char* const status_texts[] = {
    [1] = "cuBLAS: CUBLAS_STATUS_NOT_INITIALIZED", [3] = "cuBLAS: CUBLAS_STATUS_ALLOC_FAILED",
    [7] = "cuBLAS: CUBLAS_STATUS_INVALID_VALUE", [8] = "cuBLAS: CUBLAS_STATUS_ARCH_MISMATCH",
    [11] = "cuBLAS: CUBLAS_STATUS_MAPPING_ERROR", [13] = "cuBLAS: CUBLAS_STATUS_EXECUTION_FAILED",
    [14] = "cuBLAS: CUBLAS_STATUS_INTERNAL_ERROR", [15] = "cuBLAS: CUBLAS_STATUS_NOT_SUPPORTED",
    [16] = "cuBLAS: CUBLAS_STATUS_LICENSE_ERROR"};

const char* lltm_cublas_error_string(int code) {
  if (code == LLTM_ERROR_NO_CUBLAS) return "cuBLAS could not be loaded";
  if (code == LLTM_ERROR_CUBLAS_CAPTURE) {
    return "lltm_sequence makes its cuBLAS handle for a device on its first call there, which "
           "cannot happen during a CUDA graph capture: run the sequence once on this device "
           "before capturing (as torch.cuda.graph's warm-up does)";
  }
  const int status = LLTM_ERROR_CUBLAS - code;
  const int known = (int)(sizeof(status_texts) / sizeof(status_texts[0]));
  if (status <= 0 || status >= 1000) return NULL;
  return status < known && status_texts[status] ? status_texts[status]
                                                : "cuBLAS: a call failed with another status";
}

#endif /* LLTM_WITH_CUDA */
