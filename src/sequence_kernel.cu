// The whole-sequence layer's kernels, Caffe style behind extern "C"
// launchers whose loop over the time steps runs here, in C, on the caller's
// stream. Layout: every step's tensors are dense (batch, state) or, for the
// gates, (batch, 3 * state), the steps one after another.

#include "caffe_cuda_macro.h"
#include "lltm_cell.h"
#include "lltm_dtype.h"
#include "lltm_ffi.h"
#include "lltm_kernel.h"

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
