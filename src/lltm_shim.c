/* The C shim cffi binds: the entry points of include/lltm_ffi.h. Each one
 * refuses an unknown dtype, then runs the CPU pass (lltm_cpu.h) or, on a
 * CUDA device, the kernel launcher with the calling thread switched to that
 * device for the call. A build without CUDA answers every CUDA device with
 * LLTM_ERROR_NO_CUDA from the same entry points. */
#include <stddef.h>
#include <stdint.h>

#include "lltm_cpu.h"
#include "lltm_ffi.h"

#ifdef LLTM_WITH_CUDA
#include "lltm_cublas.h"
#include "lltm_kernel.h"
#endif

#ifndef LLTM_SOURCE_HASH
#error "build_ffi.py defines LLTM_SOURCE_HASH"
#endif
#ifndef LLTM_PACKAGE_VERSION
#error "build_ffi.py defines LLTM_PACKAGE_VERSION"
#endif

const char* lltm_source_hash(void) { return LLTM_SOURCE_HASH; }
const char* lltm_package_version(void) { return LLTM_PACKAGE_VERSION; }

static const char* lltm_own_error_string(int code) {
  switch (code) {
    case LLTM_ERROR_NO_CUDA:
      return "lltm_ffi was built without CUDA support; put nvcc on PATH (or set CUDA_HOME) "
             "and rebuild with `make clean && make`";
    case LLTM_ERROR_DTYPE:
      return "unknown element type (lltm_ffi passes take LLTM_FLOAT32 or LLTM_FLOAT64)";
    case LLTM_ERROR_NO_MEMORY:
      return "out of host memory for a CPU pass's scratch space";
    case LLTM_ERROR_STATE_GRADIENTS:
      return "lltm_sequence_backward needs d_h0 and d_c0 for more than one step";
    default:
      return NULL;
  }
}

#ifdef LLTM_WITH_CUDA

int lltm_cuda_compiled(void) { return 1; }

#ifndef LLTM_CUDA_ARCHS
#error "build_ffi.py defines LLTM_CUDA_ARCHS in a CUDA build"
#endif
const char* lltm_cuda_archs(void) { return LLTM_CUDA_ARCHS; }
int lltm_cuda_runtime_version(void) { return CUDART_VERSION; }

const char* lltm_error_string(int code) {
  const char* own = lltm_own_error_string(code);
  if (!own) own = lltm_cublas_error_string(code);
  return own ? own : cudaGetErrorString((cudaError_t)code);
}

/* A failed runtime call also leaves its error as the runtime's last error;
 * clear it so the next launch's CUDA_POST_KERNEL_CHECK does not report it. */
static cudaError_t cleared(cudaError_t status) {
  if (status != cudaSuccess) (void)cudaGetLastError();
  return status;
}

/* The stream belongs to `device`; a launch on it from another device fails,
 * so switch for the call and restore the caller's device after it. */
static cudaError_t enter_device(int device, int* previous) {
  const cudaError_t status = cleared(cudaGetDevice(previous));
  if (status != cudaSuccess) return status;
  return *previous == device ? cudaSuccess : cleared(cudaSetDevice(device));
}

/* status: a CUDA error code or one of lltm_ffi.h's. */
static int leave_device(int device, int previous, int status) {
  if (previous != device) {
    const cudaError_t restore = cleared(cudaSetDevice(previous));
    if (status == LLTM_SUCCESS) status = (int)restore;
  }
  return status;
}

/* Runs `launch` (an expression giving a cudaError_t, or an int code of
 * lltm_ffi.h's) on `device` and returns its code, or the device switch's. */
#define LLTM_ON_DEVICE(device, launch)                                    \
  do {                                                                    \
    int previous_device;                                                  \
    const cudaError_t entered = enter_device((device), &previous_device); \
    if (entered != cudaSuccess) return (int)entered;                      \
    return leave_device((device), previous_device, (int)(launch));        \
  } while (0)

#else /* CPU-only build */

int lltm_cuda_compiled(void) { return 0; }
const char* lltm_cuda_archs(void) { return ""; }
int lltm_cuda_runtime_version(void) { return 0; }

const char* lltm_error_string(int code) {
  const char* own = lltm_own_error_string(code);
  return own ? own : "unknown lltm_ffi error code";
}

/* `launch` is never compiled: there is no launcher to call. */
#define LLTM_ON_DEVICE(device, launch) return LLTM_ERROR_NO_CUDA

#endif /* LLTM_WITH_CUDA */

/* The body of every entry point. */
#define LLTM_RUN(dtype, device, cpu_pass, cuda_launch)                         \
  do {                                                                         \
    if ((dtype) != LLTM_FLOAT32 && (dtype) != LLTM_FLOAT64) return LLTM_ERROR_DTYPE; \
    if ((device) == LLTM_CPU) return (cpu_pass);                               \
    LLTM_ON_DEVICE((device), (cuda_launch));                                   \
  } while (0)

int lltm_forward(int dtype, int device, void* stream, int64_t batch_size, int64_t state_size,
                 const void* gates, const void* old_cell, void* new_h, void* new_cell) {
  LLTM_RUN(dtype, device,
           lltm_cpu_forward(dtype, batch_size, state_size, gates, old_cell, new_h, new_cell),
           lltm_launch_forward(dtype, batch_size, state_size, gates, old_cell, new_h, new_cell,
                               (cudaStream_t)stream));
}

int lltm_backward(int dtype, int device, void* stream, int64_t batch_size, int64_t state_size,
                  int64_t grad_h_row_stride, int64_t grad_h_column_stride,
                  int64_t grad_cell_row_stride, int64_t grad_cell_column_stride,
                  const void* grad_h, const void* grad_cell, const void* new_cell,
                  const void* gates, void* d_old_cell, void* d_gates) {
  const int64_t grad_strides[4] = {grad_h_row_stride, grad_h_column_stride,
                                   grad_cell_row_stride, grad_cell_column_stride};
  LLTM_RUN(dtype, device,
           lltm_cpu_backward(dtype, batch_size, state_size, grad_strides, grad_h, grad_cell,
                             new_cell, gates, d_old_cell, d_gates),
           lltm_launch_backward(dtype, batch_size, state_size, grad_strides, grad_h, grad_cell,
                                new_cell, gates, d_old_cell, d_gates, (cudaStream_t)stream));
}

int lltm_sequence_forward(int dtype, int device, void* stream, int64_t steps, int64_t batch_size,
                          int64_t input_features, int64_t state_size, int options,
                          const void* inputs, const void* weights, const void* bias,
                          const void* h0, const void* c0, void* outputs, void* cells,
                          void* gates) {
  LLTM_RUN(dtype, device,
           lltm_cpu_sequence_forward(dtype, steps, batch_size, input_features, state_size, inputs,
                                     weights, bias, h0, c0, outputs, cells, gates),
           lltm_launch_sequence_forward(dtype, steps, batch_size, input_features, state_size,
                                        options, inputs, weights, bias, h0, c0, outputs, cells,
                                        gates, (cudaStream_t)stream));
}

int lltm_sequence_backward(int dtype, int device, void* stream, int64_t steps, int64_t batch_size,
                           int64_t input_features, int64_t state_size, int options,
                           const int64_t* grad_strides, const void* inputs, const void* weights,
                           const void* h0, const void* outputs, const void* cells,
                           const void* gates, const void* grad_outputs, const void* grad_cells,
                           void* d_gates, void* d_inputs, void* d_weights, void* d_bias,
                           void* d_h0, void* d_c0) {
  /* Refused after the dtype and the device, as any pass's arguments. */
  const int carriers_missing = steps > 1 && (!d_h0 || !d_c0);
  LLTM_RUN(dtype, device,
           carriers_missing
               ? LLTM_ERROR_STATE_GRADIENTS
               : lltm_cpu_sequence_backward(dtype, steps, batch_size, input_features, state_size,
                                            grad_strides, inputs, weights, h0, outputs, cells,
                                            gates, grad_outputs, grad_cells, d_gates, d_inputs,
                                            d_weights, d_bias, d_h0, d_c0),
           carriers_missing
               ? LLTM_ERROR_STATE_GRADIENTS
               : lltm_launch_sequence_backward(dtype, steps, batch_size, input_features,
                                               state_size, options, grad_strides, inputs,
                                               weights, h0, outputs, cells, gates, grad_outputs,
                                               grad_cells, d_gates, d_inputs, d_weights, d_bias,
                                               d_h0, d_c0, (cudaStream_t)stream));
}

int lltm_round_forward(int dtype, int device, void* stream, int64_t count, const void* input,
                       void* output) {
  LLTM_RUN(dtype, device, lltm_cpu_round_forward(dtype, count, input, output),
           lltm_launch_round_forward(dtype, count, input, output, (cudaStream_t)stream));
}
