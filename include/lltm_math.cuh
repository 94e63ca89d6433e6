// CUDA device code: the type each element type's arithmetic runs in (its
// math type) and the conversions at loads and stores. float and double
// compute in themselves; __half and __nv_bfloat16 are storage only: a value
// is widened to float when loaded and rounded to nearest once when stored,
// so the cell's nonlinearities and every sum run in float32. Nothing here
// does arithmetic on a 16-bit type: CUDA offers its operators for some
// architectures only, and each would round its result to 16 bits.
#ifndef LLTM_MATH_CUH
#define LLTM_MATH_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

template <typename Dtype>
struct MathOf {
  typedef Dtype type;
};
template <>
struct MathOf<__half> {
  typedef float type;
};
template <>
struct MathOf<__nv_bfloat16> {
  typedef float type;
};

// float for float, __half and __nv_bfloat16; double for double.
template <typename Dtype>
using math_t = typename MathOf<Dtype>::type;

// Whether Math is a math type, for the code that must never see a 16-bit
// one (warp shuffles of partial sums). The cell's math (lltm_cell.h) is
// defined for float and double alone.
template <typename Math>
struct IsMath {
  static const bool value = std::is_same<Math, float>::value || std::is_same<Math, double>::value;
};

__device__ __forceinline__ float to_math(float value) { return value; }
__device__ __forceinline__ double to_math(double value) { return value; }
__device__ __forceinline__ float to_math(__half value) { return __half2float(value); }
__device__ __forceinline__ float to_math(__nv_bfloat16 value) { return __bfloat162float(value); }

template <typename Dtype>
__device__ __forceinline__ Dtype to_storage(math_t<Dtype> value);
template <>
__device__ __forceinline__ float to_storage<float>(float value) {
  return value;
}
template <>
__device__ __forceinline__ double to_storage<double>(double value) {
  return value;
}
template <>
__device__ __forceinline__ __half to_storage<__half>(float value) {
  return __float2half_rn(value);
}
template <>
__device__ __forceinline__ __nv_bfloat16 to_storage<__nv_bfloat16>(float value) {
  return __float2bfloat16_rn(value);
}

#endif /* LLTM_MATH_CUH */
