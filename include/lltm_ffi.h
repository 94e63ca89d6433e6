/* Everything the Python package calls, as cffi reads it: build_ffi.py hands
 * this file to cdef() unchanged, so it holds declarations only (no #include,
 * no #ifdef). Pointers are raw device or host addresses; sizes come first,
 * then inputs, then outputs, then (CUDA only) the device and the stream.
 * Every tensor is dense row-major, except grad_h and grad_cell in the backward
 * passes, which come with their row and column strides (in elements): the
 * gradients autograd hands over are often broadcast views (stride 0).
 * Every function returns 0 on success or an error code for lltm_error_string. */

enum {
  LLTM_SUCCESS = 0,
  /* A CUDA entry point was called in a module built without CUDA. */
  LLTM_ERROR_NO_CUDA = -1
};

/* 1 when the module was built with nvcc and the CUDA passes, else 0. */
int lltm_cuda_compiled(void);

/* What the CUDA part was built with, for bug reports (`python -m lltm_ffi`):
 * the architectures the kernels carry ("sm_75 ... compute_120") and
 * CUDART_VERSION (13000 for CUDA 13.0). A CPU-only build gives "" and 0. */
const char* lltm_cuda_archs(void);
int lltm_cuda_runtime_version(void);

/* The text for a code returned by any function here (CUDA's own message for a
 * CUDA error). The string is static; never free it. */
const char* lltm_error_string(int code);

/* What the module was built from: the hash of its sources and the package
 * version, compared at import to catch a stale build. */
const char* lltm_source_hash(void);
const char* lltm_package_version(void);

int lltm_forward_cpu_float(int64_t batch_size, int64_t state_size,
                           const float* gates, const float* old_cell,
                           float* new_h, float* new_cell);
int lltm_forward_cpu_double(int64_t batch_size, int64_t state_size,
                            const double* gates, const double* old_cell,
                            double* new_h, double* new_cell);
int lltm_backward_cpu_float(int64_t batch_size, int64_t state_size,
                            int64_t grad_h_row_stride, int64_t grad_h_column_stride,
                            int64_t grad_cell_row_stride, int64_t grad_cell_column_stride,
                            const float* grad_h, const float* grad_cell,
                            const float* new_cell, const float* gates,
                            float* d_old_cell, float* d_gates);
int lltm_backward_cpu_double(int64_t batch_size, int64_t state_size,
                             int64_t grad_h_row_stride, int64_t grad_h_column_stride,
                             int64_t grad_cell_row_stride, int64_t grad_cell_column_stride,
                             const double* grad_h, const double* grad_cell,
                             const double* new_cell, const double* gates,
                             double* d_old_cell, double* d_gates);

/* The CUDA passes run on `device` (switched to and back when it is not the
 * calling thread's current one) and on `stream`, a cudaStream_t of that device. */
int lltm_forward_cuda_float(int64_t batch_size, int64_t state_size,
                            const float* gates, const float* old_cell,
                            float* new_h, float* new_cell,
                            int device, void* stream);
int lltm_forward_cuda_double(int64_t batch_size, int64_t state_size,
                             const double* gates, const double* old_cell,
                             double* new_h, double* new_cell,
                             int device, void* stream);
int lltm_backward_cuda_float(int64_t batch_size, int64_t state_size,
                             int64_t grad_h_row_stride, int64_t grad_h_column_stride,
                             int64_t grad_cell_row_stride, int64_t grad_cell_column_stride,
                             const float* grad_h, const float* grad_cell,
                             const float* new_cell, const float* gates,
                             float* d_old_cell, float* d_gates,
                             int device, void* stream);
int lltm_backward_cuda_double(int64_t batch_size, int64_t state_size,
                              int64_t grad_h_row_stride, int64_t grad_h_column_stride,
                              int64_t grad_cell_row_stride, int64_t grad_cell_column_stride,
                              const double* grad_h, const double* grad_cell,
                              const double* new_cell, const double* gates,
                              double* d_old_cell, double* d_gates,
                              int device, void* stream);

/* The differentiable round's forward pass (lltm_ffi.round_ste): output[i] is 1
 * where input[i] >= 0.5, else 0, over `count` dense elements. Its backward
 * pass is the identity and has no C function. */
int lltm_round_forward_cpu_float(int64_t count, const float* input, float* output);
int lltm_round_forward_cpu_double(int64_t count, const double* input, double* output);
int lltm_round_forward_cuda_float(int64_t count, const float* input, float* output,
                                  int device, void* stream);
int lltm_round_forward_cuda_double(int64_t count, const double* input, double* output,
                                   int device, void* stream);
