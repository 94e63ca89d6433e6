/* The C shim cffi binds: the functions declared in include/lltm_ffi.h. The
 * CPU passes live in lltm_cpu.c; the CUDA entry points here put the calling
 * thread on the tensors' device, call the launcher, and put it back. */
#include <stdint.h>

#include "lltm_ffi.h"

#ifdef LLTM_WITH_CUDA
#include "lltm_kernel.h"
#include "round_kernel.h"
#endif

#ifndef LLTM_SOURCE_HASH
#error "build_ffi.py defines LLTM_SOURCE_HASH"
#endif
#ifndef LLTM_PACKAGE_VERSION
#error "build_ffi.py defines LLTM_PACKAGE_VERSION"
#endif

const char* lltm_source_hash(void) { return LLTM_SOURCE_HASH; }
const char* lltm_package_version(void) { return LLTM_PACKAGE_VERSION; }

static const char no_cuda_message[] =
    "lltm_ffi was built without CUDA support; put nvcc on PATH (or set "
    "CUDA_HOME) and rebuild with `make clean && make`";

#ifdef LLTM_WITH_CUDA

int lltm_cuda_compiled(void) { return 1; }

#ifndef LLTM_CUDA_ARCHS
#error "build_ffi.py defines LLTM_CUDA_ARCHS in a CUDA build"
#endif
const char* lltm_cuda_archs(void) { return LLTM_CUDA_ARCHS; }
int lltm_cuda_runtime_version(void) { return CUDART_VERSION; }

const char* lltm_error_string(int code) {
  if (code == LLTM_ERROR_NO_CUDA) return no_cuda_message;
  return cudaGetErrorString((cudaError_t)code);
}

/* The stream belongs to `device`; a launch on it from another device fails,
 * so switch for the call and restore the caller's device after it. */
/* A failed runtime call also leaves its error as the runtime's last error;
 * clear it so the next launch's CUDA_POST_KERNEL_CHECK does not report it. */
static cudaError_t cleared(cudaError_t status) {
  if (status != cudaSuccess) (void)cudaGetLastError();
  return status;
}

static cudaError_t enter_device(int device, int* previous) {
  const cudaError_t status = cleared(cudaGetDevice(previous));
  if (status != cudaSuccess) return status;
  return *previous == device ? cudaSuccess : cleared(cudaSetDevice(device));
}

static int leave_device(int device, int previous, cudaError_t status) {
  if (previous != device) {
    const cudaError_t restore = cleared(cudaSetDevice(previous));
    if (status == cudaSuccess) status = restore;
  }
  return (int)status;
}

/* The body of every CUDA entry point: run `launch` (a cudaError_t expression)
 * on `device` and return its code, or the device switch's. */
#define LLTM_ON_DEVICE(device, launch)                                   \
  do {                                                                   \
    int previous_device;                                                 \
    const cudaError_t entered = enter_device((device), &previous_device); \
    if (entered != cudaSuccess) return (int)entered;                     \
    return leave_device((device), previous_device, (launch));            \
  } while (0)

int lltm_forward_cuda_float(int64_t batch_size, int64_t state_size,
                            const float* gates, const float* old_cell,
                            float* new_h, float* new_cell,
                            int device, void* stream) {
  LLTM_ON_DEVICE(device, lltm_launch_forward_float(batch_size, state_size, gates, old_cell,
                                                   new_h, new_cell, (cudaStream_t)stream));
}

int lltm_forward_cuda_double(int64_t batch_size, int64_t state_size,
                             const double* gates, const double* old_cell,
                             double* new_h, double* new_cell,
                             int device, void* stream) {
  LLTM_ON_DEVICE(device, lltm_launch_forward_double(batch_size, state_size, gates, old_cell,
                                                    new_h, new_cell, (cudaStream_t)stream));
}

int lltm_backward_cuda_float(int64_t batch_size, int64_t state_size,
                             int64_t grad_h_row_stride, int64_t grad_h_column_stride,
                             int64_t grad_cell_row_stride, int64_t grad_cell_column_stride,
                             const float* grad_h, const float* grad_cell,
                             const float* new_cell, const float* gates,
                             float* d_old_cell, float* d_gates,
                             int device, void* stream) {
  LLTM_ON_DEVICE(device, lltm_launch_backward_float(batch_size, state_size, grad_h_row_stride,
                                                    grad_h_column_stride, grad_cell_row_stride,
                                                    grad_cell_column_stride, grad_h, grad_cell,
                                                    new_cell, gates, d_old_cell, d_gates,
                                                    (cudaStream_t)stream));
}

int lltm_backward_cuda_double(int64_t batch_size, int64_t state_size,
                              int64_t grad_h_row_stride, int64_t grad_h_column_stride,
                              int64_t grad_cell_row_stride, int64_t grad_cell_column_stride,
                              const double* grad_h, const double* grad_cell,
                              const double* new_cell, const double* gates,
                              double* d_old_cell, double* d_gates,
                              int device, void* stream) {
  LLTM_ON_DEVICE(device, lltm_launch_backward_double(batch_size, state_size, grad_h_row_stride,
                                                     grad_h_column_stride, grad_cell_row_stride,
                                                     grad_cell_column_stride, grad_h, grad_cell,
                                                     new_cell, gates, d_old_cell, d_gates,
                                                     (cudaStream_t)stream));
}

int lltm_round_forward_cuda_float(int64_t count, const float* input, float* output,
                                  int device, void* stream) {
  LLTM_ON_DEVICE(device, lltm_launch_round_forward_float(count, input, output,
                                                         (cudaStream_t)stream));
}

int lltm_round_forward_cuda_double(int64_t count, const double* input, double* output,
                                   int device, void* stream) {
  LLTM_ON_DEVICE(device, lltm_launch_round_forward_double(count, input, output,
                                                          (cudaStream_t)stream));
}

#else /* CPU-only build: the CUDA entry points exist and refuse. */

int lltm_cuda_compiled(void) { return 0; }
const char* lltm_cuda_archs(void) { return ""; }
int lltm_cuda_runtime_version(void) { return 0; }

const char* lltm_error_string(int code) {
  if (code == LLTM_ERROR_NO_CUDA) return no_cuda_message;
  return "unknown lltm_ffi error code";
}

int lltm_forward_cuda_float(int64_t batch_size, int64_t state_size,
                            const float* gates, const float* old_cell,
                            float* new_h, float* new_cell,
                            int device, void* stream) {
  (void)batch_size; (void)state_size; (void)gates; (void)old_cell;
  (void)new_h; (void)new_cell; (void)device; (void)stream;
  return LLTM_ERROR_NO_CUDA;
}

int lltm_forward_cuda_double(int64_t batch_size, int64_t state_size,
                             const double* gates, const double* old_cell,
                             double* new_h, double* new_cell,
                             int device, void* stream) {
  (void)batch_size; (void)state_size; (void)gates; (void)old_cell;
  (void)new_h; (void)new_cell; (void)device; (void)stream;
  return LLTM_ERROR_NO_CUDA;
}

int lltm_backward_cuda_float(int64_t batch_size, int64_t state_size,
                             int64_t grad_h_row_stride, int64_t grad_h_column_stride,
                             int64_t grad_cell_row_stride, int64_t grad_cell_column_stride,
                             const float* grad_h, const float* grad_cell,
                             const float* new_cell, const float* gates,
                             float* d_old_cell, float* d_gates,
                             int device, void* stream) {
  (void)batch_size; (void)state_size; (void)grad_h_row_stride; (void)grad_h_column_stride;
  (void)grad_cell_row_stride; (void)grad_cell_column_stride;
  (void)grad_h; (void)grad_cell; (void)new_cell;
  (void)gates; (void)d_old_cell; (void)d_gates; (void)device; (void)stream;
  return LLTM_ERROR_NO_CUDA;
}

int lltm_backward_cuda_double(int64_t batch_size, int64_t state_size,
                              int64_t grad_h_row_stride, int64_t grad_h_column_stride,
                              int64_t grad_cell_row_stride, int64_t grad_cell_column_stride,
                              const double* grad_h, const double* grad_cell,
                              const double* new_cell, const double* gates,
                              double* d_old_cell, double* d_gates,
                              int device, void* stream) {
  (void)batch_size; (void)state_size; (void)grad_h_row_stride; (void)grad_h_column_stride;
  (void)grad_cell_row_stride; (void)grad_cell_column_stride;
  (void)grad_h; (void)grad_cell; (void)new_cell;
  (void)gates; (void)d_old_cell; (void)d_gates; (void)device; (void)stream;
  return LLTM_ERROR_NO_CUDA;
}

int lltm_round_forward_cuda_float(int64_t count, const float* input, float* output,
                                  int device, void* stream) {
  (void)count; (void)input; (void)output; (void)device; (void)stream;
  return LLTM_ERROR_NO_CUDA;
}

int lltm_round_forward_cuda_double(int64_t count, const double* input, double* output,
                                   int device, void* stream) {
  (void)count; (void)input; (void)output; (void)device; (void)stream;
  return LLTM_ERROR_NO_CUDA;
}

#endif /* LLTM_WITH_CUDA */
