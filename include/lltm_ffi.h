/* Everything the Python package calls, as cffi reads it: build_ffi.py hands
 * this file to cdef() unchanged, so it holds declarations only (no #include,
 * no #ifdef).
 *
 * One entry point per pass. Each takes the element type (an lltm_dtype), the
 * device (LLTM_CPU, or a CUDA device index) and, for CUDA, a cudaStream_t of
 * that device (NULL for the CPU); then sizes, inputs and outputs as raw host
 * or device addresses. Tensors are dense row-major, except grad_h and
 * grad_cell of lltm_backward, which come with their (row, column) strides in
 * elements: the gradients autograd hands over are often broadcast views.
 * A CUDA pass runs on `device` (switched to and back when it is not the
 * calling thread's current one). Every function returns LLTM_SUCCESS or an
 * error code for lltm_error_string: a CUDA error's own code, or one below. */

enum lltm_dtype { LLTM_FLOAT32 = 0, LLTM_FLOAT64 = 1 };

/* The device argument of a CPU pass (a CUDA pass takes the device's index). */
enum { LLTM_CPU = -1 };

enum {
  LLTM_SUCCESS = 0,
  /* A CUDA device was asked of a module built without CUDA. */
  LLTM_ERROR_NO_CUDA = -1,
  /* dtype is not an lltm_dtype. */
  LLTM_ERROR_DTYPE = -2,
  /* lltm_sequence would make its cuBLAS handle during a CUDA graph capture. */
  LLTM_ERROR_CUBLAS_CAPTURE = -3,
  /* cuBLAS could not be loaded (the sequence layer then runs its own
   * kernels: no entry point returns this). */
  LLTM_ERROR_NO_CUBLAS = -4,
  /* A CPU pass could not allocate its scratch memory. */
  LLTM_ERROR_NO_MEMORY = -5,
  /* lltm_sequence_backward was given no d_h0 or d_c0 for more than one
   * step, where they carry the recurrence's gradients. */
  LLTM_ERROR_STATE_GRADIENTS = -6,
  /* A cuBLAS call failed: LLTM_ERROR_CUBLAS minus cuBLAS's status. */
  LLTM_ERROR_CUBLAS = -1000
};

/* lltm_ffi.lltm: new_h and new_cell (batch, state) from the pre-activation
 * gates (batch, 3 * state: input gate, output gate, candidate cell) and
 * old_cell; lltm_backward: d_old_cell and d_gates from the output gradients
 * and what the forward pass saved (new_cell, gates). */
int lltm_forward(int dtype, int device, void* stream, int64_t batch_size, int64_t state_size,
                 const void* gates, const void* old_cell, void* new_h, void* new_cell);
int lltm_backward(int dtype, int device, void* stream, int64_t batch_size, int64_t state_size,
                  int64_t grad_h_row_stride, int64_t grad_h_column_stride,
                  int64_t grad_cell_row_stride, int64_t grad_cell_column_stride,
                  const void* grad_h, const void* grad_cell, const void* new_cell,
                  const void* gates, void* d_old_cell, void* d_gates);

/* lltm_ffi.lltm_sequence: the cell over `steps` time steps, the loop in C.
 * inputs (steps, batch, input_features); weights (3 * state, state +
 * input_features) and bias (3 * state) as for the cell; h0 and c0 (batch,
 * state) the initial state. The forward pass writes every step's new_h
 * (outputs) and new_cell (cells), (steps, batch, state), and its
 * pre-activation gates (steps, batch, 3 * state). The backward pass takes
 * the gradients of outputs and cells (either may be NULL: zeros), read
 * through grad_strides (grad_outputs' step, row and column strides, then
 * grad_cells', in elements), and what the forward pass read and wrote; it
 * writes d_gates (steps, batch, 3 * state: each step's gradient of its
 * gates, scratch to the caller) and the gradients of every argument:
 * d_inputs, d_weights and d_bias may be NULL (not wanted); so may d_h0 and
 * d_c0 where steps is 1 (with more steps they carry the gradients from one
 * step to the one before). A single step (lltm_ffi.lltm's call on a GPU)
 * does not read outputs. `options` (CUDA only): an OR of the flags below. */
enum {
  /* The matrix products of float32 may use TF32 (where they go through
   * cuBLAS), as torch.backends.cuda.matmul.allow_tf32 lets torch's own. */
  LLTM_SEQUENCE_TF32 = 1,
  /* lltm_ffi's own kernels for every matrix product even where cuBLAS can
   * be loaded. */
  LLTM_SEQUENCE_OWN_KERNELS = 2
};
/* On a GPU a single step (steps 1) whose gate product takes at most this
 * many multiply-adds (batch x 3 state x (state + input_features)) runs on
 * lltm_ffi's own kernels, one launch forward and two or three backward:
 * there the launches cost more than the arithmetic. Larger ones go the way
 * of longer sequences. */
enum { LLTM_STEP_MULTIPLY_ADDS = 1073741824 };
int lltm_sequence_forward(int dtype, int device, void* stream, int64_t steps, int64_t batch_size,
                          int64_t input_features, int64_t state_size, int options,
                          const void* inputs, const void* weights, const void* bias,
                          const void* h0, const void* c0, void* outputs, void* cells,
                          void* gates);
int lltm_sequence_backward(int dtype, int device, void* stream, int64_t steps, int64_t batch_size,
                           int64_t input_features, int64_t state_size, int options,
                           const int64_t* grad_strides, const void* inputs, const void* weights,
                           const void* h0, const void* outputs, const void* cells,
                           const void* gates, const void* grad_outputs, const void* grad_cells,
                           void* d_gates, void* d_inputs, void* d_weights, void* d_bias,
                           void* d_h0, void* d_c0);

/* lltm_ffi.round_ste's forward pass: output[i] is 1 where input[i] >= 0.5,
 * else 0, over `count` elements. Its backward pass is the identity. */
int lltm_round_forward(int dtype, int device, void* stream, int64_t count, const void* input,
                       void* output);

/* The text for any code returned here (CUDA's own message for a CUDA error).
 * The string is static; never free it. */
const char* lltm_error_string(int code);

/* What the module was built with, for bug reports and the stale-build check:
 * 1 with CUDA, else 0; the architectures its kernels carry ("sm_75 ...
 * compute_120", "" without CUDA); CUDART_VERSION (13000 for CUDA 13.0, 0
 * without CUDA); the hash of its sources; the package version. */
int lltm_cuda_compiled(void);
const char* lltm_cuda_archs(void);
int lltm_cuda_runtime_version(void);
const char* lltm_source_hash(void);
const char* lltm_package_version(void);
