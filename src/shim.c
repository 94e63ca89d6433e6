/* The C shim cffi binds (include/lltm_ffi.h): the registry of passes that
 * every op's sources fill at load (include/lltm_op.h), and lltm_run, the
 * one entry point, which refuses an unknown pass or dtype, then runs the
 * pass's CPU version or, on a CUDA device, its CUDA version with the
 * calling thread switched to that device for the call. A build without
 * CUDA answers every CUDA device with LLTM_ERROR_NO_CUDA. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "lltm_op.h"

#ifdef LLTM_WITH_CUDA
#include <cuda_runtime_api.h>

#include "lltm_cublas.h"
#endif

/* Ops register passes by name; lltm_pass_id hands out the index. */
#define LLTM_MAX_PASSES 128
static struct {
  const char* name;
  lltm_pass_function on_cpu, on_cuda;
  int cpu_dtypes, cuda_dtypes; /* bit (1 << dtype) for each dtype taken */
} passes[LLTM_MAX_PASSES];
static int pass_count;
static const char* conflict;
static int registry_full;

/* Runs while the module loads, from the constructors of each source's
 * LLTM_CPU_PASS and LLTM_CUDA_PASS, one after another on one thread. */
int lltm_register_pass(const char* name, int devices, int dtypes, lltm_pass_function function) {
  int index = 0;
  while (index < pass_count && strcmp(passes[index].name, name) != 0) ++index;
  if (index == pass_count) {
    if (pass_count == LLTM_MAX_PASSES) {
      registry_full = 1;
      return 0;
    }
    passes[pass_count++].name = name;
  }
  lltm_pass_function* slot =
      devices == LLTM_ON_CUDA ? &passes[index].on_cuda : &passes[index].on_cpu;
  if (*slot) {
    conflict = name;
    return 0;
  }
  *slot = function;
  if (devices == LLTM_ON_CUDA) {
    passes[index].cuda_dtypes = dtypes;
  } else {
    passes[index].cpu_dtypes = dtypes;
  }
  return 1;
}

int lltm_pass_id(const char* name) {
  for (int index = 0; index < pass_count; ++index) {
    if (strcmp(passes[index].name, name) == 0) return index;
  }
  return LLTM_ERROR_NO_PASS;
}

int lltm_pass_devices(int pass) {
  if (pass < 0 || pass >= pass_count) return 0;
  return (passes[pass].on_cpu ? LLTM_ON_CPU : 0) | (passes[pass].on_cuda ? LLTM_ON_CUDA : 0);
}

int lltm_pass_dtypes(int pass, int devices) {
  if (pass < 0 || pass >= pass_count) return 0;
  return devices == LLTM_ON_CUDA ? passes[pass].cuda_dtypes
         : devices == LLTM_ON_CPU ? passes[pass].cpu_dtypes
                                  : 0;
}

int lltm_pass_count(void) { return pass_count; }

const char* lltm_pass_name(int pass) {
  return pass >= 0 && pass < pass_count ? passes[pass].name : NULL;
}

const char* lltm_pass_conflict(void) {
  return conflict ? conflict : registry_full ? "(more passes than the registry holds)" : NULL;
}

static const char* own_error_string(int code) {
  switch (code) {
    case LLTM_ERROR_NO_CUDA:
      return "lltm_ffi was built without CUDA support; put nvcc on PATH (or set CUDA_HOME) "
             "and rebuild with `make clean && make`";
    case LLTM_ERROR_DTYPE:
      return "an element type the pass does not take on this device (lltm_pass_dtypes says "
             "which it takes)";
    case LLTM_ERROR_NO_MEMORY:
      return "out of host memory for a CPU pass's scratch space";
    case LLTM_ERROR_ARGUMENTS:
      return "the pass was given sizes or tensors it cannot take";
    case LLTM_ERROR_NO_PASS:
      return "no pass of the compiled module has this id";
    case LLTM_ERROR_NO_DEVICE_PASS:
      return "the op has no pass for this device in the compiled module";
    default:
      return lltm_path_refusal(code);
  }
}

#ifdef LLTM_WITH_CUDA

int lltm_cuda_compiled(void) { return 1; }
int lltm_cuda_runtime_version(void) { return CUDART_VERSION; }

const char* lltm_error_string(int code) {
  const char* own = own_error_string(code);
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
static int run_on_device(lltm_pass_function function, int dtype, int device,
                         const lltm_args* args, void* stream) {
  int previous;
  cudaError_t status = cleared(cudaGetDevice(&previous));
  if (status == cudaSuccess && previous != device) status = cleared(cudaSetDevice(device));
  if (status != cudaSuccess) return (int)status;
  int code = function(dtype, args, stream);
  if (previous != device) {
    const cudaError_t restore = cleared(cudaSetDevice(previous));
    if (code == LLTM_SUCCESS) code = (int)restore;
  }
  return code;
}

#else /* CPU-only build */

int lltm_cuda_compiled(void) { return 0; }
int lltm_cuda_runtime_version(void) { return 0; }

const char* lltm_error_string(int code) {
  const char* own = own_error_string(code);
  return own ? own : "unknown lltm_ffi error code";
}

#endif /* LLTM_WITH_CUDA */

int lltm_run(int pass, int dtype, int device, intptr_t stream, const int64_t* sizes,
             const double* scalars, const intptr_t* tensors) {
  if (pass < 0 || pass >= pass_count) return LLTM_ERROR_NO_PASS;
  if (dtype < LLTM_FLOAT32 || dtype > LLTM_BFLOAT16) return LLTM_ERROR_DTYPE;
  /* The addresses come as integers (cffi converts a Python list of them
   * without a cast each) and are read as pointers of the same size. */
  _Static_assert(sizeof(intptr_t) == sizeof(void*), "addresses are pointer-sized");
  const lltm_args args = {sizes, scalars, (void* const*)tensors};
  if (device == LLTM_CPU) {
    if (!passes[pass].on_cpu) return LLTM_ERROR_NO_DEVICE_PASS;
    if (!(passes[pass].cpu_dtypes & (1 << dtype))) return LLTM_ERROR_DTYPE;
    lltm_start_cpu_pass(stream > 0 && stream < 65536 ? (int)stream : 0);
    return passes[pass].on_cpu(dtype, &args, NULL);
  }
#ifdef LLTM_WITH_CUDA
  if (!passes[pass].on_cuda) return LLTM_ERROR_NO_DEVICE_PASS;
  if (!(passes[pass].cuda_dtypes & (1 << dtype))) return LLTM_ERROR_DTYPE;
  return run_on_device(passes[pass].on_cuda, dtype, device, &args, (void*)stream);
#else
  (void)stream;
  return LLTM_ERROR_NO_CUDA;
#endif
}
