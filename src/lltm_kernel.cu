// The LLTM cell's two fused pointwise passes, Caffe style. The matrix products
// around them stay in torch; these kernels see only raw pointers.
//
// Layout: gates is (batch, 3 * state) with the input gate, output gate and
// candidate cell pre-activations side by side in each row; every other tensor
// is (batch, state). The backward pass recomputes the activations from gates
// instead of reading them back, which moves fewer bytes than saving them.

#include "caffe_cuda_macro.h"
#include "lltm_cell.h"
#include "lltm_op.h"

// The kernels move Pack<Dtype, kWidth>: kWidth consecutive elements of a row
// in one access, 16 bytes when the row length and every pointer allow it
// (more bytes in flight per thread), else one element. Each element is
// computed in its math type (lltm_math.cuh).
template <typename Dtype, int kWidth>
struct alignas(sizeof(Dtype) * kWidth) Pack {
  Dtype value[kWidth];
};

template <typename Dtype>
struct Wide {
  static const int kWidth = 16 / sizeof(Dtype);
};

template <typename Dtype>
static bool packs_fit(int64_t state_size, const void* const* pointers, int count) {
  if (state_size % Wide<Dtype>::kWidth != 0) return false;
  for (int i = 0; i < count; ++i) {
    if (reinterpret_cast<uintptr_t>(pointers[i]) % 16 != 0) return false;
  }
  return true;
}

// The input gate, output gate and candidate cell pre-activations of one pack:
// the same columns of the three thirds of a gates row.
template <typename P>
struct GatePacks {
  P input, output, candidate;

  template <typename Index>
  __device__ __forceinline__ GatePacks(const P* gates, Index gate_index, Index packs_per_row)
      : input(gates[gate_index]),
        output(gates[gate_index + packs_per_row]),
        candidate(gates[gate_index + 2 * packs_per_row]) {}
};

// Row and column arithmetic in 32 bits when every gates index fits: a 64-bit
// division costs several times a 32-bit one.
static inline bool fits_int32(int64_t value) { return value <= INT32_MAX; }

// One kernel variant: kWidth elements per access, Index for the arithmetic.
template <int Width, typename IndexType>
struct Variant {
  static const int kWidth = Width;
  typedef IndexType Index;
};

// Calls launch(Variant<...>()) with 16-byte packs when `wide`, and 32-bit
// indices when `small`.
template <typename Dtype, typename Launch>
static void with_variant(bool wide, bool small, Launch launch) {
  const int kWide = Wide<Dtype>::kWidth;
  if (wide && small) {
    launch(Variant<kWide, int32_t>());
  } else if (wide) {
    launch(Variant<kWide, int64_t>());
  } else if (small) {
    launch(Variant<1, int32_t>());
  } else {
    launch(Variant<1, int64_t>());
  }
}

template <typename Dtype, int kWidth, typename Index>
__global__ void lltm_forward_kernel(const int64_t count, const Index packs_per_row,
                                    const Dtype* __restrict__ gates,
                                    const Dtype* __restrict__ old_cell,
                                    Dtype* __restrict__ new_h, Dtype* __restrict__ new_cell) {
  typedef Pack<Dtype, kWidth> P;
  const P* gate_packs = reinterpret_cast<const P*>(gates);
  CUDA_KERNEL_LOOP(index, count) {
    const Index row = (Index)index / packs_per_row;
    const Index column = (Index)index - row * packs_per_row;
    const GatePacks<P> pre(gate_packs, row * 3 * packs_per_row + column, packs_per_row);
    const P old = reinterpret_cast<const P*>(old_cell)[index];
    P h, cell;
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      math_t<Dtype> h_value, cell_value;
      cell_forward_(to_math(pre.input.value[k]), to_math(pre.output.value[k]),
                    to_math(pre.candidate.value[k]), to_math(old.value[k]), &h_value,
                    &cell_value);
      h.value[k] = to_storage<Dtype>(h_value);
      cell.value[k] = to_storage<Dtype>(cell_value);
    }
    reinterpret_cast<P*>(new_cell)[index] = cell;
    reinterpret_cast<P*>(new_h)[index] = h;
  }
}

template <typename Dtype>
static cudaError_t launch_forward(int64_t batch_size, int64_t state_size, const void* gates,
                                  const void* old_cell, void* new_h, void* new_cell,
                                  cudaStream_t stream) {
  const int64_t count = batch_size * state_size;
  if (count == 0) return cudaSuccess;
  const int kWide = Wide<Dtype>::kWidth;
  const void* pointers[] = {gates, old_cell, new_h, new_cell};
  const bool wide = packs_fit<Dtype>(state_size, pointers, 4);
  const bool small = fits_int32(3 * count);
  const int64_t width = wide ? kWide : 1;
  const int64_t packs = count / width;
  const int64_t packs_per_row = state_size / width;
  with_variant<Dtype>(wide, small, [&](auto variant) {
    typedef decltype(variant) V;
    typedef typename V::Index Index;
    lltm_forward_kernel<Dtype, V::kWidth, Index>
        <<<CAFFE_GET_BLOCKS(packs), CAFFE_CUDA_NUM_THREADS, 0, stream>>>(
            packs, (Index)packs_per_row, as<Dtype>(gates), as<Dtype>(old_cell), as<Dtype>(new_h),
            as<Dtype>(new_cell));
  });
  CUDA_POST_KERNEL_CHECK;
  return cudaSuccess;
}

// grad_h and grad_cell are read through (row, column) strides, in units of P:
// autograd often hands over broadcast views (stride 0) that need no copy.
template <typename Dtype, int kWidth, typename Index>
__global__ void lltm_backward_kernel(const int64_t count, const Index packs_per_row,
                                     const Index grad_h_row, const Index grad_h_column,
                                     const Index grad_cell_row, const Index grad_cell_column,
                                     const Dtype* __restrict__ grad_h,
                                     const Dtype* __restrict__ grad_cell,
                                     const Dtype* __restrict__ new_cell,
                                     const Dtype* __restrict__ gates,
                                     Dtype* __restrict__ d_old_cell, Dtype* __restrict__ d_gates) {
  typedef Pack<Dtype, kWidth> P;
  const P* gate_packs = reinterpret_cast<const P*>(gates);
  P* d_gate_packs = reinterpret_cast<P*>(d_gates);
  CUDA_KERNEL_LOOP(index, count) {
    const Index row = (Index)index / packs_per_row;
    const Index column = (Index)index - row * packs_per_row;
    const Index gate_index = row * 3 * packs_per_row + column;
    const GatePacks<P> pre(gate_packs, gate_index, packs_per_row);
    const P cell = reinterpret_cast<const P*>(new_cell)[index];
    const P d_h = reinterpret_cast<const P*>(grad_h)[row * grad_h_row + column * grad_h_column];
    const P d_cell =
        reinterpret_cast<const P*>(grad_cell)[row * grad_cell_row + column * grad_cell_column];
    P d_old, d_input_gate, d_output_gate, d_candidate_cell;
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      math_t<Dtype> d_old_value, d_input_value, d_output_value, d_candidate_value;
      cell_backward_(to_math(d_h.value[k]), to_math(d_cell.value[k]), to_math(cell.value[k]),
                     to_math(pre.input.value[k]), to_math(pre.output.value[k]),
                     to_math(pre.candidate.value[k]), &d_old_value, &d_input_value,
                     &d_output_value, &d_candidate_value);
      d_old.value[k] = to_storage<Dtype>(d_old_value);
      d_input_gate.value[k] = to_storage<Dtype>(d_input_value);
      d_output_gate.value[k] = to_storage<Dtype>(d_output_value);
      d_candidate_cell.value[k] = to_storage<Dtype>(d_candidate_value);
    }
    reinterpret_cast<P*>(d_old_cell)[index] = d_old;
    d_gate_packs[gate_index] = d_input_gate;
    d_gate_packs[gate_index + packs_per_row] = d_output_gate;
    d_gate_packs[gate_index + 2 * packs_per_row] = d_candidate_cell;
  }
}

// grad_strides: grad_h's row and column strides, then grad_cell's, in elements.
template <typename Dtype>
static cudaError_t launch_backward(int64_t batch_size, int64_t state_size,
                                   const int64_t* grad_strides, const void* grad_h,
                                   const void* grad_cell, const void* new_cell, const void* gates,
                                   void* d_old_cell, void* d_gates, cudaStream_t stream) {
  const int64_t count = batch_size * state_size;
  if (count == 0) return cudaSuccess;
  const int64_t grad_h_row_stride = grad_strides[0], grad_h_column_stride = grad_strides[1];
  const int64_t grad_cell_row_stride = grad_strides[2], grad_cell_column_stride = grad_strides[3];
  const int kWide = Wide<Dtype>::kWidth;
  const void* pointers[] = {grad_h, grad_cell, new_cell, gates, d_old_cell, d_gates};
  // Packs need whole packs along each gradient's rows: unit column strides.
  const bool wide = packs_fit<Dtype>(state_size, pointers, 6) &&
                    grad_h_column_stride == 1 && grad_h_row_stride % kWide == 0 &&
                    grad_cell_column_stride == 1 && grad_cell_row_stride % kWide == 0;
  const int64_t last_row = batch_size - 1, last_column = state_size - 1;
  const bool small = fits_int32(3 * count) &&
                     fits_int32(last_row * grad_h_row_stride + last_column * grad_h_column_stride) &&
                     fits_int32(last_row * grad_cell_row_stride + last_column * grad_cell_column_stride);
  const int64_t width = wide ? kWide : 1;
  const int64_t packs = count / width;
  const int64_t packs_per_row = state_size / width;
  const int64_t h_row = grad_h_row_stride / width, h_column = wide ? 1 : grad_h_column_stride;
  const int64_t c_row = grad_cell_row_stride / width, c_column = wide ? 1 : grad_cell_column_stride;
  with_variant<Dtype>(wide, small, [&](auto variant) {
    typedef decltype(variant) V;
    typedef typename V::Index Index;
    lltm_backward_kernel<Dtype, V::kWidth, Index>
        <<<CAFFE_GET_BLOCKS(packs), CAFFE_CUDA_NUM_THREADS, 0, stream>>>(
            packs, (Index)packs_per_row, (Index)h_row, (Index)h_column, (Index)c_row,
            (Index)c_column, as<Dtype>(grad_h), as<Dtype>(grad_cell), as<Dtype>(new_cell),
            as<Dtype>(gates), as<Dtype>(d_old_cell), as<Dtype>(d_gates));
  });
  CUDA_POST_KERNEL_CHECK;
  return cudaSuccess;
}

// The passes, in the argument order of their declarations in cell.py; every
// element type, the 16-bit ones computing in float (lltm_math.cuh).
LLTM_CUDA_PASS_WITH_HALF(forward_pass, launch_forward, args->sizes[0], args->sizes[1],
                         args->tensors[0], args->tensors[1], args->tensors[2], args->tensors[3],
                         stream)
LLTM_CUDA_PASS_WITH_HALF(backward_pass, launch_backward, args->sizes[0], args->sizes[1],
                         args->sizes + 2, args->tensors[0], args->tensors[1], args->tensors[2],
                         args->tensors[3], args->tensors[4], args->tensors[5], stream)
