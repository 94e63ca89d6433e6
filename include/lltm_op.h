/* What an op's C and CUDA sources use: the one shape of a pass, its
 * registration, float and double from one template, and a parallel loop
 * that survives fork().
 *
 * A pass takes its arguments as three arrays that the op's Python
 * declaration fills (lltm_ffi/op.py): sizes (int64_t: shapes, strides,
 * integer options), scalars (double) and tensors (addresses; NULL for a
 * tensor left out), each in the order that declaration passes them. A
 * source file registers its passes by name, one line each:
 *
 *   LLTM_CPU_PASS(round_forward, round_forward, args->sizes[0],
 *                 args->tensors[0], args->tensors[1])
 *
 * defines the CPU version of the pass `round_forward`: LLTM_TYPED_CALL of
 * the family round_forward_float / round_forward_double with the arguments
 * after the second, expressions of `args` (the call's lltm_args).
 * LLTM_CUDA_PASS, in a .cu file, does the same for a CUDA launcher template
 * (round_forward<Dtype>), with `stream` (the call's cudaStream_t) among
 * the expressions, and defines the pass's extern "C" launcher
 * lltm_cuda_<pass>. Both return the function's code: LLTM_SUCCESS, a
 * cudaError_t, or an LLTM_ERROR code of lltm_ffi.h. Registration happens
 * when the module loads; nothing lists the passes by hand.
 *
 * A pass that also takes float16 and bfloat16 registers with
 * LLTM_CPU_PASS_WITH_HALF or LLTM_CUDA_PASS_WITH_HALF instead: in C its
 * family grows function_float16 and function_bfloat16, whose tensors hold
 * the 16-bit patterns (lltm_float16, lltm_bfloat16; include/lltm_half.h
 * converts them); in CUDA C++ the template is also called for __half and
 * __nv_bfloat16. The others' passes refuse those dtypes (lltm_pass_dtypes).
 *
 * Where a function takes the arrays' elements in their order, sizes, then
 * scalars, then tensors (then the stream), as a Caffe launcher does,
 * LLTM_SIZES(n), LLTM_SCALARS(n) and LLTM_TENSORS(n) write the first n of
 * each:
 *
 *   LLTM_CUDA_PASS(round_forward, round_forward, LLTM_SIZES(1), LLTM_TENSORS(2), stream)
 *
 * Under nvcc this header also brings what every kernel file uses:
 * Caffe's launch macros (caffe_cuda_macro.h) and the element types' math
 * types and conversions (lltm_math.cuh). */
#ifndef LLTM_OP_H
#define LLTM_OP_H

#include <stdint.h>

#include "lltm_ffi.h"

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "caffe_cuda_macro.h"
#include "lltm_math.cuh"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The text of an LLTM_ERROR_PATH code (src/plan.c), NULL for another code. */
const char* lltm_path_refusal(int code);

/* One call's arguments; tensors points at as many addresses as the pass
 * takes, each the start of a tensor laid out as the op's declaration
 * says (dense unless it says otherwise). */
typedef struct {
  const int64_t* sizes;
  const double* scalars;
  void* const* tensors;
} lltm_args;

/* A pass for one device. `stream` is the cudaStream_t of a CUDA pass (NULL
 * for the CPU). */
typedef int (*lltm_pass_function)(int dtype, const lltm_args* args, void* stream);

/* Adds the version of the pass `name` for `devices` (LLTM_ON_CPU or
 * LLTM_ON_CUDA); returns 1, or 0 where the name is registered for that
 * device already or the registry is full (lltm_pass_id then reports it).
 * Called by the two macros below, at load. */
int lltm_register_pass(const char* name, int devices, int dtypes, lltm_pass_function function);

/* The dtypes bits (1 << lltm_dtype) of the two kinds of pass. */
#define LLTM_FULL_PRECISION ((1 << LLTM_FLOAT32) | (1 << LLTM_FLOAT64))
#define LLTM_WITH_HALF (LLTM_FULL_PRECISION | (1 << LLTM_FLOAT16) | (1 << LLTM_BFLOAT16))

/* A 16-bit float's bits, as the C families _float16 and _bfloat16 take
 * their tensors' elements. */
typedef uint16_t lltm_float16;
typedef uint16_t lltm_bfloat16;

/* Nonzero while this process may start threads in a CPU pass: false in
 * a child forked from it (see LLTM_FOR_EACH). */
extern int lltm_threads_allowed;

#ifdef __cplusplus
}
#endif

/* The one place the element types are instantiated: runs `function` for
 * float or double by the lltm_dtype `dtype` (LLTM_TYPED_CALL), or for
 * those and the two 16-bit types (LLTM_TYPED_CALL_WITH_HALF). In C,
 * `function` names a family function_float / function_double (/
 * function_float16 / function_bfloat16); in CUDA C++, a template
 * function<Dtype>. lltm_run refuses a dtype the pass did not register
 * before the pass is reached. */
#ifdef __cplusplus
#define LLTM_TYPED_CALL(dtype, function, ...) \
  ((dtype) == LLTM_FLOAT64 ? function<double>(__VA_ARGS__) : function<float>(__VA_ARGS__))
#define LLTM_TYPED_CALL_WITH_HALF(dtype, function, ...)                           \
  ((dtype) == LLTM_FLOAT16    ? function<__half>(__VA_ARGS__)                     \
   : (dtype) == LLTM_BFLOAT16 ? function<__nv_bfloat16>(__VA_ARGS__)              \
                              : LLTM_TYPED_CALL(dtype, function, __VA_ARGS__))
#else
#define LLTM_TYPED_CALL(dtype, function, ...) \
  ((dtype) == LLTM_FLOAT64 ? function##_double(__VA_ARGS__) : function##_float(__VA_ARGS__))
#define LLTM_TYPED_CALL_WITH_HALF(dtype, function, ...)                           \
  ((dtype) == LLTM_FLOAT16    ? function##_float16(__VA_ARGS__)                   \
   : (dtype) == LLTM_BFLOAT16 ? function##_bfloat16(__VA_ARGS__)                  \
                              : LLTM_TYPED_CALL(dtype, function, __VA_ARGS__))
#endif

#ifdef __CUDACC__
/* The lltm_dtype of a template's element type, for a call that takes one. */
template <typename Dtype>
constexpr int lltm_dtype_of() {
  return std::is_same<Dtype, double>::value          ? LLTM_FLOAT64
         : std::is_same<Dtype, __half>::value        ? LLTM_FLOAT16
         : std::is_same<Dtype, __nv_bfloat16>::value ? LLTM_BFLOAT16
                                                     : LLTM_FLOAT32;
}
#endif

/* Writing a C family once for both types: define SCALAR (float or double)
 * and SUFFIX (float or double), include a file whose functions are named
 * LLTM_NAME(name_) (name_float, name_double), undefine both, repeat. */
#define LLTM_CONCAT_(a, b) a##b
#define LLTM_CONCAT(a, b) LLTM_CONCAT_(a, b)
#define LLTM_NAME(name) LLTM_CONCAT(name, SUFFIX)

/* The first n elements of the call's sizes, scalars or tensors, in order,
 * as a pass line's arguments (n from 1 to 16). */
#define LLTM_SIZES(n) LLTM_CONCAT(LLTM_ARGS_, n)(sizes)
#define LLTM_SCALARS(n) LLTM_CONCAT(LLTM_ARGS_, n)(scalars)
#define LLTM_TENSORS(n) LLTM_CONCAT(LLTM_ARGS_, n)(tensors)
#define LLTM_ARGS_1(array) args->array[0]
#define LLTM_ARGS_2(array) LLTM_ARGS_1(array), args->array[1]
#define LLTM_ARGS_3(array) LLTM_ARGS_2(array), args->array[2]
#define LLTM_ARGS_4(array) LLTM_ARGS_3(array), args->array[3]
#define LLTM_ARGS_5(array) LLTM_ARGS_4(array), args->array[4]
#define LLTM_ARGS_6(array) LLTM_ARGS_5(array), args->array[5]
#define LLTM_ARGS_7(array) LLTM_ARGS_6(array), args->array[6]
#define LLTM_ARGS_8(array) LLTM_ARGS_7(array), args->array[7]
#define LLTM_ARGS_9(array) LLTM_ARGS_8(array), args->array[8]
#define LLTM_ARGS_10(array) LLTM_ARGS_9(array), args->array[9]
#define LLTM_ARGS_11(array) LLTM_ARGS_10(array), args->array[10]
#define LLTM_ARGS_12(array) LLTM_ARGS_11(array), args->array[11]
#define LLTM_ARGS_13(array) LLTM_ARGS_12(array), args->array[12]
#define LLTM_ARGS_14(array) LLTM_ARGS_13(array), args->array[13]
#define LLTM_ARGS_15(array) LLTM_ARGS_14(array), args->array[14]
#define LLTM_ARGS_16(array) LLTM_ARGS_15(array), args->array[15]

#define LLTM_CPU_PASS_OF(name, dtypes, call, function, ...)                             \
  static int lltm_cpu_##name(int dtype, const lltm_args* args, void* stream) {          \
    (void)stream;                                                                       \
    return (int)call(dtype, function, __VA_ARGS__);                                     \
  }                                                                                     \
  __attribute__((constructor)) static void lltm_register_cpu_##name(void) {             \
    lltm_register_pass(#name, LLTM_ON_CPU, dtypes, lltm_cpu_##name);                    \
  }
#define LLTM_CPU_PASS(name, function, ...) \
  LLTM_CPU_PASS_OF(name, LLTM_FULL_PRECISION, LLTM_TYPED_CALL, function, __VA_ARGS__)
#define LLTM_CPU_PASS_WITH_HALF(name, function, ...) \
  LLTM_CPU_PASS_OF(name, LLTM_WITH_HALF, LLTM_TYPED_CALL_WITH_HALF, function, __VA_ARGS__)

#ifdef __CUDACC__
#define LLTM_CUDA_PASS_OF(name, dtypes, call, function, ...)                            \
  extern "C" int lltm_cuda_##name(int dtype, const lltm_args* args, void* raw_stream) { \
    cudaStream_t stream = static_cast<cudaStream_t>(raw_stream);                        \
    return (int)call(dtype, function, __VA_ARGS__);                                     \
  }                                                                                     \
  static const int lltm_registered_cuda_##name =                                        \
      lltm_register_pass(#name, LLTM_ON_CUDA, dtypes, lltm_cuda_##name);
#define LLTM_CUDA_PASS(name, function, ...) \
  LLTM_CUDA_PASS_OF(name, LLTM_FULL_PRECISION, LLTM_TYPED_CALL, function, __VA_ARGS__)
#define LLTM_CUDA_PASS_WITH_HALF(name, function, ...) \
  LLTM_CUDA_PASS_OF(name, LLTM_WITH_HALF, LLTM_TYPED_CALL_WITH_HALF, function, __VA_ARGS__)
#endif

/* Below this many elements, waking a second thread costs more than a loop
 * saves; a larger team pays from less (lltm_team_size). */
#define LLTM_PARALLEL_MIN_ELEMENTS 32768

#ifdef __cplusplus
extern "C" {
#endif
/* Called by lltm_run before each CPU pass: the most threads the pass may
 * use (lltm_ffi.h; 0 or less: OpenMP's default), for the calling thread. */
void lltm_start_cpu_pass(int threads);
/* How many threads the calling thread's pass takes for work of `elements`
 * elements: 1 in a forked child (lltm_threads_allowed), where its caller
 * allows one, or below LLTM_PARALLEL_MIN_ELEMENTS times 2 / the team; else
 * as many as its caller allows. src/threads.c. */
int lltm_team_size(int64_t elements);
/* lltm_team_size with min_elements for LLTM_PARALLEL_MIN_ELEMENTS. */
int lltm_team_size_from(int64_t elements, int64_t min_elements);
/* The team a pass of any size could take: what its caller allows, 1 in a
 * forked child. */
int lltm_pass_team(void);
/* Records what took the recurrent products of the calling thread's pass
 * (lltm_cpu_recurrence, lltm_ffi.h). src/threads.c. */
void lltm_note_cpu_recurrence(const char* name);
#ifdef __cplusplus
}
#endif

/* for (int64_t index = 0; index < count; ++index) body, across OpenMP
 * threads, as many as lltm_team_size gives for work of `elements`
 * elements (the work's size), else on the calling thread without entering
 * OpenMP at all. GNU OpenMP's thread pool does not survive fork(): a
 * forked child's first parallel region would wait forever for its
 * parent's threads, so a forked child never enters one here. Compile with
 * -fopenmp. */
#define LLTM_FOR_EACH(index, count, elements, ...) \
  LLTM_FOR_EACH_OF_TEAM(index, count, lltm_team_size(elements), __VA_ARGS__)

/* LLTM_FOR_EACH across a team its caller had from lltm_team_size or
 * lltm_team_size_from (1: the calling thread alone). */
#define LLTM_FOR_EACH_OF_TEAM(index, count, team, ...)                         \
  do {                                                                         \
    const int lltm_team_ = (team);                                             \
    if (lltm_team_ > 1) {                                                      \
      _Pragma("omp parallel for num_threads(lltm_team_) schedule(static)")     \
      for (int64_t index = 0; index < (count); ++index) __VA_ARGS__            \
    } else {                                                                   \
      for (int64_t index = 0; index < (count); ++index) __VA_ARGS__            \
    }                                                                          \
  } while (0)

#endif /* LLTM_OP_H */
