// The LLTM cell's two fused pointwise passes, Caffe style. The matrix products
// around them stay in torch; these kernels see only raw pointers.
//
// Layout: gates is (batch, 3 * state) with the input gate, output gate and
// candidate cell pre-activations side by side in each row; every other tensor
// is (batch, state). The backward pass recomputes the activations from gates
// instead of reading them back, which moves fewer bytes than saving them.

#include "caffe_cuda_macro.h"
#include "lltm_dtype.h"
#include "lltm_ffi.h"
#include "lltm_kernel.h"

// Overloads rather than one generic call: float math stays in float and
// double math in double (no float-only intrinsic ever sees a double).
__device__ __forceinline__ float exp_of(float z) { return expf(z); }
__device__ __forceinline__ double exp_of(double z) { return exp(z); }
__device__ __forceinline__ float expm1_of(float z) { return expm1f(z); }
__device__ __forceinline__ double expm1_of(double z) { return expm1(z); }
__device__ __forceinline__ float tanh_of(float z) { return tanhf(z); }
__device__ __forceinline__ double tanh_of(double z) { return tanh(z); }
// Correctly rounded, so equal to 1 / z, in fewer instructions than a division.
__device__ __forceinline__ float reciprocal_of(float z) { return __frcp_rn(z); }
__device__ __forceinline__ double reciprocal_of(double z) { return __drcp_rn(z); }

template <typename Dtype>
__device__ __forceinline__ Dtype sigmoid(Dtype z) {
  return reciprocal_of(Dtype(1) + exp_of(-z));
}

// ELU with alpha = 1; expm1 keeps its accuracy near zero.
template <typename Dtype>
__device__ __forceinline__ Dtype elu(Dtype z) {
  return z > Dtype(0) ? z : expm1_of(z);
}

template <typename Dtype>
__device__ __forceinline__ Dtype d_elu(Dtype z) {
  return z > Dtype(0) ? Dtype(1) : exp_of(z);
}

// One element of the forward pass: new_h and new_cell from the three gate
// pre-activations and old_cell.
template <typename Dtype>
__device__ __forceinline__ void cell_forward(Dtype input_pre, Dtype output_pre,
                                             Dtype candidate_pre, Dtype old_cell, Dtype* new_h,
                                             Dtype* new_cell) {
  const Dtype cell = old_cell + elu(candidate_pre) * sigmoid(input_pre);
  *new_cell = cell;
  *new_h = tanh_of(cell) * sigmoid(output_pre);
}

// One element of the backward pass: d_old_cell and the three gate gradients
// from the output gradients, new_cell and the gate pre-activations.
template <typename Dtype>
__device__ __forceinline__ void cell_backward(Dtype d_h, Dtype d_cell, Dtype new_cell,
                                              Dtype input_pre, Dtype output_pre,
                                              Dtype candidate_pre, Dtype* d_old_cell,
                                              Dtype* d_input, Dtype* d_output,
                                              Dtype* d_candidate) {
  const Dtype input_gate = sigmoid(input_pre);
  const Dtype output_gate = sigmoid(output_pre);
  const Dtype tanh_new_cell = tanh_of(new_cell);
  const Dtype d_new_cell =
      (Dtype(1) - tanh_new_cell * tanh_new_cell) * output_gate * d_h + d_cell;
  *d_old_cell = d_new_cell;
  *d_input = elu(candidate_pre) * d_new_cell * input_gate * (Dtype(1) - input_gate);
  *d_output = tanh_new_cell * d_h * output_gate * (Dtype(1) - output_gate);
  *d_candidate = input_gate * d_new_cell * d_elu(candidate_pre);
}

// The kernels move Pack<Dtype, kWidth>: kWidth consecutive elements of a row
// in one access, 16 bytes when the row length and every pointer allow it
// (more bytes in flight per thread), else one element.
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

// The launchers take untyped pointers (one C signature for both element
// types); the kernels take typed ones.
template <typename Dtype>
static inline const Dtype* as(const void* pointer) { return static_cast<const Dtype*>(pointer); }
template <typename Dtype>
static inline Dtype* as(void* pointer) { return static_cast<Dtype*>(pointer); }

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
      cell_forward(pre.input.value[k], pre.output.value[k], pre.candidate.value[k],
                   old.value[k], &h.value[k], &cell.value[k]);
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

extern "C" cudaError_t lltm_launch_forward(int dtype, int64_t batch_size, int64_t state_size,
                                           const void* gates, const void* old_cell, void* new_h,
                                           void* new_cell, cudaStream_t stream) {
  return LLTM_TYPED_CALL(dtype, launch_forward, batch_size, state_size, gates, old_cell, new_h,
                         new_cell, stream);
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
      cell_backward(d_h.value[k], d_cell.value[k], cell.value[k], pre.input.value[k],
                    pre.output.value[k], pre.candidate.value[k], &d_old.value[k],
                    &d_input_gate.value[k], &d_output_gate.value[k],
                    &d_candidate_cell.value[k]);
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

extern "C" cudaError_t lltm_launch_backward(int dtype, int64_t batch_size, int64_t state_size,
                                            const int64_t grad_strides[4], const void* grad_h,
                                            const void* grad_cell, const void* new_cell,
                                            const void* gates, void* d_old_cell, void* d_gates,
                                            cudaStream_t stream) {
  return LLTM_TYPED_CALL(dtype, launch_backward, batch_size, state_size, grad_strides, grad_h,
                         grad_cell, new_cell, gates, d_old_cell, d_gates, stream);
}

// The whole-sequence layer: one launch a time step each way, from a loop in
// the launcher. A step's recurrent matrix product and its gate math are one
// kernel: each block computes tiles of kTile x kTile (batch row, state
// column) elements, accumulating the product over kDepth-wide slices staged
// in shared memory, then applies the cell to its own elements.
//
// weights are the hidden columns of the cell's weights: (3 * state, state)
// with row stride weights_row_stride; every other tensor is dense.
static const int kTile = 16;
static const int kTileThreads = kTile * kTile;

// Product slices as deep as 48 KB of static shared memory allows: fewer
// slices, fewer waits on memory and barriers in the step's critical path.
template <typename Dtype>
struct Depth {
  static const int kDepth = sizeof(Dtype) == 4 ? 128 : 64;
};

static int tile_blocks(int64_t batch_size, int64_t state_size) {
  const int64_t tiles = ((batch_size + kTile - 1) / kTile) * ((state_size + kTile - 1) / kTile);
  return (int)(tiles < CAFFE_MAXIMUM_NUM_BLOCKS ? tiles : CAFFE_MAXIMUM_NUM_BLOCKS);
}

// A grid-stride loop over the (batch, state) tiles, CUDA_KERNEL_LOOP's shape
// for kernels that work a tile a block.
#define TILE_LOOP(row0, column0, batch_size, state_size)                                 \
  for (int64_t tile = blockIdx.x,                                                        \
               column_tiles = ((state_size) + kTile - 1) / kTile,                        \
               tiles = (((batch_size) + kTile - 1) / kTile) * column_tiles,              \
               row0 = (tile / column_tiles) * kTile, column0 = (tile % column_tiles) * kTile; \
       tile < tiles;                                                                     \
       tile += gridDim.x, row0 = (tile / column_tiles) * kTile,                          \
               column0 = (tile % column_tiles) * kTile)

// Forward step t: gates = projected + old_h W^T (all three gates of each
// element in one thread), then the cell.
template <typename Dtype>
__global__ void lltm_sequence_forward_kernel(
    const int64_t batch_size, const int64_t state_size, const Dtype* __restrict__ projected,
    const Dtype* __restrict__ weights, const int64_t weights_row_stride,
    const Dtype* __restrict__ old_h, const Dtype* __restrict__ old_cell,
    Dtype* __restrict__ new_h, Dtype* __restrict__ new_cell, Dtype* __restrict__ gates) {
  const int kDepth = Depth<Dtype>::kDepth;
  __shared__ Dtype h_slice[kTile][kDepth];
  __shared__ Dtype w_slice[3][kTile][kDepth + 1];
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  TILE_LOOP(row0, column0, batch_size, state_size) {
    Dtype sum[3] = {0, 0, 0};
    for (int64_t k0 = 0; k0 < state_size; k0 += kDepth) {
      for (int i = threadIdx.x; i < kTile * kDepth; i += kTileThreads) {
        const int r = i / kDepth, k = i % kDepth;
        const bool k_in = k0 + k < state_size;
        const int64_t row = row0 + r, column = column0 + r;
        h_slice[r][k] = k_in && row < batch_size ? old_h[row * state_size + k0 + k] : Dtype(0);
#pragma unroll
        for (int g = 0; g < 3; ++g) {
          w_slice[g][r][k] = k_in && column < state_size
              ? weights[(g * state_size + column) * weights_row_stride + k0 + k] : Dtype(0);
        }
      }
      __syncthreads();
#pragma unroll 8
      for (int k = 0; k < kDepth; ++k) {
        const Dtype h = h_slice[ty][k];
#pragma unroll
        for (int g = 0; g < 3; ++g) sum[g] += h * w_slice[g][tx][k];
      }
      __syncthreads();
    }
    const int64_t row = row0 + ty, column = column0 + tx;
    if (row < batch_size && column < state_size) {
      const int64_t gate = row * 3 * state_size + column, element = row * state_size + column;
      Dtype pre[3];
#pragma unroll
      for (int g = 0; g < 3; ++g) {
        pre[g] = projected[gate + g * state_size] + sum[g];
        gates[gate + g * state_size] = pre[g];
      }
      cell_forward(pre[0], pre[1], pre[2], old_cell[element], &new_h[element],
                   &new_cell[element]);
    }
  }
}

template <typename Dtype>
static cudaError_t launch_sequence_forward(int64_t steps, int64_t batch_size, int64_t state_size,
                                           int64_t weights_row_stride, const void* projected,
                                           const void* weights, const void* h0, const void* c0,
                                           void* outputs, void* cells, void* gates,
                                           cudaStream_t stream) {
  const int64_t step = batch_size * state_size;
  if (step == 0) return cudaSuccess;
  for (int64_t t = 0; t < steps; ++t) {
    const Dtype* old_h = t ? as<Dtype>(outputs) + (t - 1) * step : as<Dtype>(h0);
    const Dtype* old_cell = t ? as<Dtype>(cells) + (t - 1) * step : as<Dtype>(c0);
    lltm_sequence_forward_kernel<Dtype>
        <<<tile_blocks(batch_size, state_size), kTileThreads, 0, stream>>>(
            batch_size, state_size, as<Dtype>(projected) + t * 3 * step, as<Dtype>(weights),
            weights_row_stride, old_h, old_cell, as<Dtype>(outputs) + t * step,
            as<Dtype>(cells) + t * step, as<Dtype>(gates) + t * 3 * step);
    CUDA_POST_KERNEL_CHECK;
  }
  return cudaSuccess;
}

extern "C" cudaError_t lltm_launch_sequence_forward(
    int dtype, int64_t steps, int64_t batch_size, int64_t state_size, int64_t weights_row_stride,
    const void* projected, const void* weights, const void* h0, const void* c0, void* outputs,
    void* cells, void* gates, cudaStream_t stream) {
  return LLTM_TYPED_CALL(dtype, launch_sequence_forward, steps, batch_size, state_size,
                         weights_row_stride, projected, weights, h0, c0, outputs, cells, gates,
                         stream);
}

// Backward step t: d_h = grad_output + d_gates_next W (the gradient reaching
// h_t from step t + 1; none after the last step), then the cell's backward
// pass with d_cell (the gradient reaching c_t from step t + 1, kept in place)
// plus grad_cell. With cells == NULL it only writes d_h (the gradient of h0).
template <typename Dtype>
__global__ void lltm_sequence_backward_kernel(
    const int64_t batch_size, const int64_t state_size, const Dtype* __restrict__ weights,
    const int64_t weights_row_stride, const Dtype* __restrict__ d_gates_next,
    const Dtype* __restrict__ grad_output, const Dtype* __restrict__ grad_cell,
    const Dtype* __restrict__ cells, const Dtype* __restrict__ gates,
    Dtype* __restrict__ d_cell, Dtype* __restrict__ d_gates, Dtype* __restrict__ d_h_out) {
  const int kDepth = Depth<Dtype>::kDepth;
  __shared__ Dtype g_slice[kTile][kDepth];
  __shared__ Dtype w_slice[kDepth][kTile + 1];
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int64_t gates_size = 3 * state_size;
  TILE_LOOP(row0, column0, batch_size, state_size) {
    Dtype sum = 0;
    for (int64_t k0 = 0; d_gates_next && k0 < gates_size; k0 += kDepth) {
      for (int i = threadIdx.x; i < kTile * kDepth; i += kTileThreads) {
        const int r = i / kDepth, k = i % kDepth;
        const int64_t row = row0 + r;
        g_slice[r][k] = row < batch_size && k0 + k < gates_size
            ? d_gates_next[row * gates_size + k0 + k] : Dtype(0);
        const int kw = i / kTile, c = i % kTile;
        w_slice[kw][c] = column0 + c < state_size && k0 + kw < gates_size
            ? weights[(k0 + kw) * weights_row_stride + column0 + c] : Dtype(0);
      }
      __syncthreads();
#pragma unroll 8
      for (int k = 0; k < kDepth; ++k) sum += g_slice[ty][k] * w_slice[k][tx];
      __syncthreads();
    }
    const int64_t row = row0 + ty, column = column0 + tx;
    if (row < batch_size && column < state_size) {
      const int64_t element = row * state_size + column, gate = row * gates_size + column;
      if (cells == NULL) {
        d_h_out[element] = sum;
      } else {
        const Dtype carried = d_gates_next ? d_cell[element] : Dtype(0);
        cell_backward(grad_output[element] + sum, carried + grad_cell[element], cells[element],
                      gates[gate], gates[gate + state_size], gates[gate + 2 * state_size],
                      &d_cell[element], &d_gates[gate], &d_gates[gate + state_size],
                      &d_gates[gate + 2 * state_size]);
      }
    }
  }
}

template <typename Dtype>
static cudaError_t launch_sequence_backward(int64_t steps, int64_t batch_size, int64_t state_size,
                                            int64_t weights_row_stride, const void* weights,
                                            const void* grad_outputs, const void* grad_cells,
                                            const void* cells, const void* gates, void* d_gates,
                                            void* d_h0, void* d_c0, cudaStream_t stream) {
  const int64_t step = batch_size * state_size;
  if (step == 0) return cudaSuccess;
  const int blocks = tile_blocks(batch_size, state_size);
  for (int64_t t = steps - 1; t >= -1; --t) {
    const Dtype* d_gates_next = t + 1 < steps ? as<Dtype>(d_gates) + (t + 1) * 3 * step : NULL;
    const bool cell = t >= 0;
    lltm_sequence_backward_kernel<Dtype><<<blocks, kTileThreads, 0, stream>>>(
        batch_size, state_size, as<Dtype>(weights), weights_row_stride, d_gates_next,
        cell ? as<Dtype>(grad_outputs) + t * step : NULL,
        cell ? as<Dtype>(grad_cells) + t * step : NULL,
        cell ? as<Dtype>(cells) + t * step : NULL, cell ? as<Dtype>(gates) + t * 3 * step : NULL,
        as<Dtype>(d_c0), cell ? as<Dtype>(d_gates) + t * 3 * step : NULL, as<Dtype>(d_h0));
    CUDA_POST_KERNEL_CHECK;
  }
  return cudaSuccess;
}

extern "C" cudaError_t lltm_launch_sequence_backward(
    int dtype, int64_t steps, int64_t batch_size, int64_t state_size, int64_t weights_row_stride,
    const void* weights, const void* grad_outputs, const void* grad_cells, const void* cells,
    const void* gates, void* d_gates, void* d_h0, void* d_c0, cudaStream_t stream) {
  return LLTM_TYPED_CALL(dtype, launch_sequence_backward, steps, batch_size, state_size,
                         weights_row_stride, weights, grad_outputs, grad_cells, cells, gates,
                         d_gates, d_h0, d_c0, stream);
}
