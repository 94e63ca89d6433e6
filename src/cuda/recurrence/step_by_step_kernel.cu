// The step-by-step path of the sequence's recurrence: one launch a time step
// each way, from a loop in the launcher, for dense or packed steps in either
// direction (lltm_steps.h walks them). A step's recurrent matrix product and
// its gate math are one kernel: each block computes tiles of kTile x kTile
// (batch row, state column) elements, accumulating the product over
// kDepth-wide slices staged in shared memory, then applies the cell to its
// own elements.
//
// weights are the hidden columns of the cell's weights: (3 * state, state)
// with row stride weights_row_stride; every other tensor is dense.

#include "lltm_recurrence.cuh"

// Product slices (of the math type) as deep as 48 KB of static shared
// memory allows: fewer slices, fewer waits on memory and barriers in the
// step's critical path.
template <typename Math>
struct Depth {
  static const int kDepth = sizeof(Math) == 4 ? 128 : 64;
};

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

// Forward step: gates (which hold the step's input part) += bias + old_h
// W^T (all three gates of each element in one thread; written back where
// keep_gates), then the cell. batch_size: the step's rows; bias NULL: none.
// new_cell may be the old cell's memory (step_cells), so not __restrict__.
template <typename Dtype>
__global__ void lltm_sequence_forward_kernel(
    const int64_t batch_size, const int64_t state_size, const Dtype* __restrict__ bias,
    const Dtype* __restrict__ weights, const int64_t weights_row_stride,
    const StepState<Dtype> state, Dtype* __restrict__ new_h, Dtype* new_cell,
    Dtype* __restrict__ gates, const bool keep_gates) {
  typedef math_t<Dtype> Math;
  const int kDepth = Depth<Math>::kDepth;
  __shared__ Math h_slice[kTile][kDepth];
  __shared__ Math w_slice[3][kTile][kDepth + 1];
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  TILE_LOOP(row0, column0, batch_size, state_size) {
    Math sum[3] = {0, 0, 0};
    for (int64_t k0 = 0; k0 < state_size; k0 += kDepth) {
      for (int i = threadIdx.x; i < kTile * kDepth; i += kTileThreads) {
        const int r = i / kDepth, k = i % kDepth;
        const bool k_in = k0 + k < state_size;
        const int64_t row = row0 + r, column = column0 + r;
        h_slice[r][k] = k_in && row < batch_size
            ? to_math(state.old_h(row)[row * state_size + k0 + k]) : Math(0);
#pragma unroll
        for (int g = 0; g < 3; ++g) {
          w_slice[g][r][k] = k_in && column < state_size
              ? to_math(weights[(g * state_size + column) * weights_row_stride + k0 + k])
              : Math(0);
        }
      }
      __syncthreads();
#pragma unroll 8
      for (int k = 0; k < kDepth; ++k) {
        const Math h = h_slice[ty][k];
#pragma unroll
        for (int g = 0; g < 3; ++g) sum[g] += h * w_slice[g][tx][k];
      }
      __syncthreads();
    }
    const int64_t row = row0 + ty, column = column0 + tx;
    if (row < batch_size && column < state_size) {
      const int64_t gate = row * 3 * state_size + column;
      Math pre[3];
#pragma unroll
      for (int g = 0; g < 3; ++g) {
        pre[g] = keep_gate(&gates[gate + g * state_size],
                           to_math(gates[gate + g * state_size]) +
                               (bias ? to_math(bias[g * state_size + column]) : Math(0)) + sum[g],
                           keep_gates);
      }
      step_cell_forward(pre, state, row, row * state_size + column, new_h, new_cell);
    }
  }
}

template <typename Dtype>
int launch_sequence_forward_by_step(const ForwardRecurrence<Dtype>& r, cudaStream_t stream) {
  const int64_t state_size = r.state_size;
  return for_each_step(r.walk, [&](const lltm_step& step) -> int {
    lltm_sequence_forward_kernel<Dtype>
        <<<tile_blocks(step.rows, state_size), kTileThreads, 0, stream>>>(
            step.rows, state_size, r.bias, r.weights, r.weights_row_stride, step_state(r, step),
            r.outputs + step.offset * state_size, step_cells(r, step.offset),
            r.gates + step.offset * 3 * state_size, r.cells != NULL);
    CUDA_POST_KERNEL_CHECK;
    return cudaSuccess;
  });
}

// Backward step: d_h = d_gates_next W (the gradient reaching h from the
// next step, for the rows it continues; none where d_gates_next is NULL),
// then the cell's backward pass (step_cell_backward), the gradient reaching
// each cell carried in d_cell (NULL: a single step whose d_c0 is not
// wanted). batch_size: the step's rows.
template <typename Dtype>
__global__ void lltm_sequence_backward_kernel(
    const int64_t batch_size, const int64_t state_size, const Dtype* __restrict__ weights,
    const int64_t weights_row_stride, const Dtype* __restrict__ d_gates_next,
    const StepGradients<Dtype> gradients, const Dtype* __restrict__ cells,
    const Dtype* __restrict__ gates, Dtype* __restrict__ d_cell, Dtype* __restrict__ d_gates) {
  typedef math_t<Dtype> Math;
  const int kDepth = Depth<Math>::kDepth;
  __shared__ Math g_slice[kTile][kDepth];
  __shared__ Math w_slice[kDepth][kTile + 1];
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int64_t gates_size = 3 * state_size;
  TILE_LOOP(row0, column0, batch_size, state_size) {
    Math sum = 0;
    for (int64_t k0 = 0; d_gates_next && k0 < gates_size; k0 += kDepth) {
      for (int i = threadIdx.x; i < kTile * kDepth; i += kTileThreads) {
        const int r = i / kDepth, k = i % kDepth;
        const int64_t row = row0 + r;
        g_slice[r][k] = row < gradients.continued && k0 + k < gates_size
            ? to_math(d_gates_next[row * gates_size + k0 + k]) : Math(0);
        const int kw = i / kTile, c = i % kTile;
        w_slice[kw][c] = column0 + c < state_size && k0 + kw < gates_size
            ? to_math(weights[(k0 + kw) * weights_row_stride + column0 + c]) : Math(0);
      }
      __syncthreads();
#pragma unroll 8
      for (int k = 0; k < kDepth; ++k) sum += g_slice[ty][k] * w_slice[k][tx];
      __syncthreads();
    }
    const int64_t row = row0 + ty, column = column0 + tx;
    if (row < batch_size && column < state_size) {
      const int64_t element = row * state_size + column, gate = row * gates_size + column;
      step_cell_backward(gradients, row, column, element, sum, d_cell, to_math(cells[element]),
                         gates + gate, state_size, d_cell, d_gates + gate);
    }
  }
}

// d_h0 is left alone (initial_state_grads gives it after the loop).
template <typename Dtype>
int launch_sequence_backward_by_step(const BackwardRecurrence<Dtype>& r, cudaStream_t stream) {
  const int64_t state_size = r.state_size, gates_size = 3 * state_size;
  return for_each_step_backward(r.walk, [&](const lltm_step& step, int64_t next_offset) -> int {
    lltm_sequence_backward_kernel<Dtype>
        <<<tile_blocks(step.rows, state_size), kTileThreads, 0, stream>>>(
            step.rows, state_size, r.weights, r.weights_row_stride,
            step.continued ? r.d_gates + next_offset * gates_size : NULL, step_gradients(r, step),
            r.cells + step.offset * state_size, r.gates + step.offset * gates_size, r.d_c0,
            r.d_gates + step.offset * gates_size);
    CUDA_POST_KERNEL_CHECK;
    return cudaSuccess;
  });
}

// What the other files of the recurrence call (lltm_recurrence.cuh), for
// every element type.
#define LLTM_INSTANTIATE(Dtype)                                                              \
  template int launch_sequence_forward_by_step<Dtype>(const ForwardRecurrence<Dtype>&,       \
                                                      cudaStream_t);                         \
  template int launch_sequence_backward_by_step<Dtype>(const BackwardRecurrence<Dtype>&,     \
                                                       cudaStream_t);
LLTM_FOR_EVERY_DTYPE(LLTM_INSTANTIATE)
