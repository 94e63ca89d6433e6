// The whole-sequence layer's kernels, Caffe style behind extern "C"
// launchers whose loop over the time steps runs here, in C, on the caller's
// stream. Layout: every step's tensors are dense (rows, state) or, for the
// gates, (rows, 3 * state), the steps one after another; a step's rows are
// the whole batch, or a packed sequence's batch size at that step, and the
// steps are visited forwards or backwards (lltm_steps.h walks them).
//
// A pass is its recurrence and, around it, the products that are not on the
// recurrent path: before the forward loop every step's input part of its
// gates, after the backward loop the gradients of the inputs and the weights
// (by cuBLAS, or lltm_ffi's own kernel where cuBLAS cannot be loaded) and of
// the bias. Four paths for the recurrence, chosen per pass (plan_recurrence
// for the first two, then sequence_forward_steps and sequence_backward_steps
// by whether cuBLAS runs): on compute capability 9.0 and newer the cluster
// kernels (cluster_kernel.cu), one ordinary launch a pass, for dense steps
// of a state up to 256; the persistent kernels, one cooperative launch a
// pass, for small batch x state and dense steps (the 16-bit types on tensor
// cores, from compute capability 8.0); otherwise each step's recurrent
// product by cuBLAS and a pointwise kernel for its gate math; and, without
// cuBLAS or for packed steps of a small batch x state, a step-by-step kernel
// that does both.
//
// Every element type: tensors hold it, the arithmetic runs in its math type
// (lltm_math.cuh: float for __half and __nv_bfloat16), converting at each
// load and store. The state a step hands the next (h, the cell, and going
// back their gradients) passes through the tensors that hold it, in the
// element type, on every path alike.

#include <cooperative_groups.h>

#include "caffe_cuda_macro.h"
#include "lltm_cell.h"
#include "lltm_cluster.h"
#include "lltm_cublas.h"
#include "lltm_kernels.h"
#include "lltm_cluster_ptx.cuh"
#include "lltm_op.h"
#include "lltm_steps.h"

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

// Product slices (of the math type) as deep as 48 KB of static shared
// memory allows: fewer slices, fewer waits on memory and barriers in the
// step's critical path.
template <typename Math>
struct Depth {
  static const int kDepth = sizeof(Math) == 4 ? 128 : 64;
};

// Blocks of a grid of `tile` x `tile` tiles over rows x columns, at most as
// many as a grid may have.
static int tile_blocks(int64_t rows, int64_t columns, int64_t tile = kTile) {
  const int64_t tiles = ((rows + tile - 1) / tile) * ((columns + tile - 1) / tile);
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

template <typename Dtype>
__host__ __device__ static const Dtype* offset_or_null(const Dtype* tensor, int64_t offset) {
  return tensor ? tensor + offset : NULL;
}

// The backward pass's output gradients: grad_outputs' and grad_cells' (step,
// row, column) strides, in elements. Autograd often hands over broadcast
// views (stride 0), which the kernels read as they are.
struct GradStrides {
  int64_t outputs[3], cells[3];
};

// Element (row, column) of one step of an output gradient (that step's
// first element at `step`, NULL for zeros), read through its strides: as
// stored, and in the math type.
template <typename Dtype>
__device__ __forceinline__ Dtype stored_gradient_at(const Dtype* step, const int64_t (&strides)[3],
                                                    int64_t row, int64_t column) {
  return step ? step[row * strides[1] + column * strides[2]] : to_storage<Dtype>(0);
}

template <typename Dtype>
__device__ __forceinline__ math_t<Dtype> gradient_at(const Dtype* step,
                                                     const int64_t (&strides)[3], int64_t row,
                                                     int64_t column) {
  return to_math(stored_gradient_at(step, strides, row, column));
}

// One step of a walk (lltm_steps.h) as its forward kernels see it: its row
// r's old state is row r of the previous step's (h, cell) below `carried`,
// of (h0, c0) from there on; its rows from `continued` on end at the step
// and leave their state in (final_h, final_cell) too, where final_h is not
// NULL. Each pointer is the first element of a step's or of the batch's
// dense (rows, state) elements.
template <typename Dtype>
struct StepState {
  const Dtype* h;
  const Dtype* cell;
  const Dtype* h0;
  const Dtype* c0;
  int64_t carried;
  Dtype* final_h;
  Dtype* final_cell;
  int64_t continued;
  __device__ const Dtype* old_h(int64_t row) const { return row < carried ? h : h0; }
  __device__ const Dtype* old_cell(int64_t row) const { return row < carried ? cell : c0; }
};

template <typename Dtype>
static StepState<Dtype> step_state(const lltm_step& step, int64_t state_size, const Dtype* h0,
                                   const Dtype* c0, const Dtype* outputs, const Dtype* cells,
                                   Dtype* final_h, Dtype* final_cell) {
  const int64_t previous = step.previous_offset * state_size;
  const StepState<Dtype> state = {outputs + previous, cells + previous, h0, c0, step.carried,
                                  final_h, final_cell, step.continued};
  return state;
}

// The cell's forward math on element `element` (row `row`) of a step, from
// its three pre-activations; new_h and new_cell are the step's.
template <typename Dtype>
__device__ __forceinline__ void step_cell_forward(const math_t<Dtype> (&pre)[3],
                                                  const StepState<Dtype>& state, int64_t row,
                                                  int64_t element, Dtype* new_h,
                                                  Dtype* new_cell) {
  math_t<Dtype> h_value, cell_value;
  cell_forward(pre[0], pre[1], pre[2], to_math(state.old_cell(row)[element]), &h_value,
               &cell_value);
  const Dtype h = to_storage<Dtype>(h_value), cell = to_storage<Dtype>(cell_value);
  new_h[element] = h;
  new_cell[element] = cell;
  if (state.final_h && row >= state.continued) {
    state.final_h[element] = h;
    state.final_cell[element] = cell;
  }
}

// What a step's backward reads beside what the forward pass saved: its
// output and cell gradients (the step's first element, NULL for zeros, read
// through strides), and the final states' gradients (dense (batch, state),
// NULL for zeros), where its rows from `continued` on, which end at the
// step, start; the rows below start from what the next step carries back.
template <typename Dtype>
struct StepGradients {
  const Dtype* output;
  const Dtype* cell;
  GradStrides strides;
  const Dtype* final_h;
  const Dtype* final_cell;
  int64_t continued;
};

template <typename Dtype>
static StepGradients<Dtype> step_gradients(const lltm_walk& walk, const lltm_step& step,
                                           const Dtype* grad_outputs, const Dtype* grad_cells,
                                           const GradStrides& strides, const Dtype* grad_final_h,
                                           const Dtype* grad_final_cell) {
  const StepGradients<Dtype> gradients = {
      offset_or_null(grad_outputs,
                     lltm_step_start(&walk, &step, strides.outputs[0], strides.outputs[1])),
      offset_or_null(grad_cells, lltm_step_start(&walk, &step, strides.cells[0], strides.cells[1])),
      strides, grad_final_h, grad_final_cell, step.continued};
  return gradients;
}

// The cell's backward math on element `element` (row, column) of a step:
// the gradients reaching its h and cell are carried_h and carried_cell (the
// next step's, read only for the rows it continues) or the final states',
// each plus the step's own. d_cell, where not NULL, takes the gradient
// reaching the old cell.
template <typename Dtype>
__device__ __forceinline__ void step_cell_backward(const StepGradients<Dtype>& gradients,
                                                   int64_t row, int64_t column, int64_t element,
                                                   math_t<Dtype> carried_h,
                                                   const Dtype* carried_cell,
                                                   math_t<Dtype> new_cell, const Dtype* gate,
                                                   int64_t state_size, Dtype* d_cell,
                                                   Dtype* d_gate) {
  typedef math_t<Dtype> Math;
  const bool continues = row < gradients.continued;
  const Math start_h = continues ? carried_h
                       : gradients.final_h ? to_math(gradients.final_h[element])
                                           : Math(0);
  const Math start_cell = continues ? to_math(carried_cell[element])
                          : gradients.final_cell ? to_math(gradients.final_cell[element])
                                                 : Math(0);
  Math d_old_cell, d_input, d_output, d_candidate;
  cell_backward(gradient_at(gradients.output, gradients.strides.outputs, row, column) + start_h,
                gradient_at(gradients.cell, gradients.strides.cells, row, column) + start_cell,
                new_cell, to_math(gate[0]), to_math(gate[state_size]),
                to_math(gate[2 * state_size]), &d_old_cell, &d_input, &d_output, &d_candidate);
  d_gate[0] = to_storage<Dtype>(d_input);
  d_gate[state_size] = to_storage<Dtype>(d_output);
  d_gate[2 * state_size] = to_storage<Dtype>(d_candidate);
  if (d_cell) d_cell[element] = to_storage<Dtype>(d_old_cell);
}

// A step's pre-activation from its sum in the math type: kept in the step's
// gates (rounded, for a 16-bit type) and handed to the cell as kept there,
// as the backward pass, which recomputes from the gates, sees it.
template <typename Dtype>
__device__ __forceinline__ math_t<Dtype> keep_gate(Dtype* gate, math_t<Dtype> sum) {
  const Dtype kept = to_storage<Dtype>(sum);
  *gate = kept;
  return to_math(kept);
}

// Forward step: gates (which hold the step's input part) += bias + old_h
// W^T (all three gates of each element in one thread), then the cell.
// batch_size: the step's rows; bias NULL: none.
template <typename Dtype>
__global__ void lltm_sequence_forward_kernel(
    const int64_t batch_size, const int64_t state_size, const Dtype* __restrict__ bias,
    const Dtype* __restrict__ weights, const int64_t weights_row_stride,
    const StepState<Dtype> state, Dtype* __restrict__ new_h, Dtype* __restrict__ new_cell,
    Dtype* __restrict__ gates) {
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
                               (bias ? to_math(bias[g * state_size + column]) : Math(0)) + sum[g]);
      }
      step_cell_forward(pre, state, row, row * state_size + column, new_h, new_cell);
    }
  }
}

template <typename Dtype>
static cudaError_t launch_sequence_forward_by_step(
    const lltm_walk& walk, int64_t state_size, int64_t weights_row_stride, const Dtype* bias,
    const Dtype* weights, const Dtype* h0, const Dtype* c0, Dtype* outputs, Dtype* cells,
    Dtype* gates, Dtype* final_h, Dtype* final_cell, cudaStream_t stream) {
  for (lltm_step step = lltm_first_step(&walk);; step = lltm_next_step(&walk, &step)) {
    lltm_sequence_forward_kernel<Dtype>
        <<<tile_blocks(step.rows, state_size), kTileThreads, 0, stream>>>(
            step.rows, state_size, bias, weights, weights_row_stride,
            step_state<Dtype>(step, state_size, h0, c0, outputs, cells, final_h, final_cell),
            outputs + step.offset * state_size, cells + step.offset * state_size,
            gates + step.offset * 3 * state_size);
    CUDA_POST_KERNEL_CHECK;
    if (step.order + 1 == walk.steps) break;
  }
  return cudaSuccess;
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

template <typename Dtype>
static cudaError_t launch_sequence_backward_by_step(
    const lltm_walk& walk, int64_t state_size, int64_t weights_row_stride, const Dtype* weights,
    const Dtype* grad_outputs, const Dtype* grad_cells, const GradStrides& strides,
    const Dtype* grad_final_h, const Dtype* grad_final_cell, const Dtype* cells,
    const Dtype* gates, Dtype* d_gates, Dtype* d_c0, cudaStream_t stream) {
  const int64_t gates_size = 3 * state_size;
  lltm_step step = lltm_last_step(&walk);
  int64_t next_offset = 0;  // the first row of the step visited after `step`
  for (;;) {
    lltm_sequence_backward_kernel<Dtype>
        <<<tile_blocks(step.rows, state_size), kTileThreads, 0, stream>>>(
            step.rows, state_size, weights, weights_row_stride,
            step.continued ? d_gates + next_offset * gates_size : NULL,
            step_gradients<Dtype>(walk, step, grad_outputs, grad_cells, strides,
                                  grad_final_h, grad_final_cell),
            cells + step.offset * state_size, gates + step.offset * gates_size, d_c0,
            d_gates + step.offset * gates_size);
    CUDA_POST_KERNEL_CHECK;
    if (step.order == 0) break;
    next_offset = step.offset;
    step = lltm_previous_step(&walk, &step);
  }
  return cudaSuccess;
}

// The matrix products. product() takes row-major matrices: C (m x n, row
// stride ldc) = op(A) op(B) (+ C where `accumulate`), op(A) (m x k) being A
// or, where a_transposed, the transpose of A as stored (k x m); likewise B.
// Through cuBLAS (only within lltm_cublas_run, with `cublas` true), which
// reads matrices column-major, to which a row-major (rows, columns) matrix
// is its transpose: C^T = op(B)^T op(A)^T. Otherwise, or past the int sizes
// cuBLAS takes, lltm_ffi's own kernel: an element of C a thread.
template <typename Dtype>
__global__ void lltm_product_kernel(const int64_t m, const int64_t n, const int64_t k,
                                    const Dtype* __restrict__ a, const int64_t a_row,
                                    const int64_t a_column, const Dtype* __restrict__ b,
                                    const int64_t b_row, const int64_t b_column,
                                    const bool accumulate, Dtype* c, const int64_t ldc) {
  CUDA_KERNEL_LOOP(index, m * n) {
    const int64_t i = index / n, j = index % n;
    math_t<Dtype> sum = accumulate ? to_math(c[i * ldc + j]) : math_t<Dtype>(0);
    for (int64_t p = 0; p < k; ++p) {
      sum += to_math(a[i * a_row + p * a_column]) * to_math(b[p * b_row + j * b_column]);
    }
    c[i * ldc + j] = to_storage<Dtype>(sum);
  }
}

template <typename Dtype>
static int product(bool cublas, cudaStream_t stream, int64_t m, int64_t n, int64_t k,
                   const Dtype* a, int64_t lda, bool a_transposed, const Dtype* b, int64_t ldb,
                   bool b_transposed, bool accumulate, Dtype* c, int64_t ldc) {
  if (m == 0 || n == 0 || (k == 0 && accumulate)) return LLTM_SUCCESS;
  const int64_t largest = m > n ? (m > k ? m : k) : (n > k ? n : k);
  if (cublas && k > 0 && largest <= INT32_MAX && lda <= INT32_MAX && ldb <= INT32_MAX &&
      ldc <= INT32_MAX) {
    return lltm_cublas_gemm(lltm_dtype_of<Dtype>(), b_transposed, a_transposed, n, m, k, b, ldb, a,
                            lda, accumulate, c, ldc);
  }
  lltm_product_kernel<Dtype><<<CAFFE_GET_BLOCKS(m * n), CAFFE_CUDA_NUM_THREADS, 0, stream>>>(
      m, n, k, a, a_transposed ? 1 : lda, a_transposed ? lda : 1, b, b_transposed ? 1 : ldb,
      b_transposed ? ldb : 1, accumulate, c, ldc);
  CUDA_POST_KERNEL_CHECK;
  return LLTM_SUCCESS;
}

// sums[c] = the sum of column c of a dense (rows, columns) matrix: a block
// of kSumThreads per 32 columns, each thread summing every 32nd row of its
// column, then the block the 32 partial sums: the same order every run,
// all in the math type.
static const int kSumThreads = 1024;

template <typename Dtype>
__global__ void __launch_bounds__(kSumThreads) lltm_column_sums_kernel(
    const int64_t rows, const int64_t columns, const Dtype* __restrict__ matrix,
    Dtype* __restrict__ sums) {
  typedef math_t<Dtype> Math;
  __shared__ Math partial[kSumThreads / 32][33];
  const int lane = threadIdx.x % 32, group = threadIdx.x / 32;
  for (int64_t column0 = (int64_t)blockIdx.x * 32; column0 < columns;
       column0 += (int64_t)gridDim.x * 32) {
    const int64_t column = column0 + lane;
    Math sum = 0;
    if (column < columns) {
#pragma unroll 4
      for (int64_t row = group; row < rows; row += kSumThreads / 32) {
        sum += to_math(matrix[row * columns + column]);
      }
    }
    partial[group][lane] = sum;
    __syncthreads();
    if (group == 0 && column < columns) {
      Math total = 0;
      for (int g = 0; g < kSumThreads / 32; ++g) total += partial[g][lane];
      sums[column] = to_storage<Dtype>(total);
    }
    __syncthreads();
  }
}

// The cuBLAS path of the recurrence: each step's recurrent product by cuBLAS,
// then one pointwise kernel for the step's gate math.

// Forward step's gate math: gates holds the step's input part plus old_h
// W^T; the kernel adds the bias (NULL: none), keeps the sum (the
// pre-activations) in gates and applies the cell. index runs over the
// step's (row, state column) elements.
template <typename Dtype>
__global__ void lltm_sequence_gates_forward_kernel(
    const int64_t count, const int64_t state_size, const Dtype* __restrict__ bias,
    const StepState<Dtype> state, Dtype* __restrict__ gates, Dtype* __restrict__ new_h,
    Dtype* __restrict__ new_cell) {
  typedef math_t<Dtype> Math;
  CUDA_KERNEL_LOOP(index, count) {
    const int64_t row = index / state_size, column = index - row * state_size;
    const int64_t gate = index + 2 * row * state_size;  // row * 3 * state + column
    Math pre[3];
#pragma unroll
    for (int g = 0; g < 3; ++g) {
      pre[g] = keep_gate(&gates[gate + g * state_size],
                         to_math(gates[gate + g * state_size]) +
                             (bias ? to_math(bias[g * state_size + column]) : Math(0)));
    }
    step_cell_forward(pre, state, row, index, new_h, new_cell);
  }
}

// A step's old h times the hidden weights, added to its gates: the rows it
// carries from the previous step and those that start from h0, each block
// of rows one product.
template <typename Dtype>
static int sequence_forward_cublas_steps(const lltm_walk& walk, int64_t state_size,
                                         int64_t weights_row_stride, const Dtype* bias,
                                         const Dtype* weights, const Dtype* h0, const Dtype* c0,
                                         Dtype* outputs, Dtype* cells, Dtype* gates,
                                         Dtype* final_h, Dtype* final_cell, cudaStream_t stream) {
  const int64_t gates_size = 3 * state_size;
  for (lltm_step step = lltm_first_step(&walk);; step = lltm_next_step(&walk, &step)) {
    Dtype* step_gates = gates + step.offset * gates_size;
    int code = LLTM_SUCCESS;
    if (step.carried) {
      code = product<Dtype>(true, stream, step.carried, gates_size, state_size,
                            outputs + step.previous_offset * state_size, state_size, false,
                            weights, weights_row_stride, true, true, step_gates, gates_size);
    }
    if (code == LLTM_SUCCESS && step.carried < step.rows) {
      code = product<Dtype>(true, stream, step.rows - step.carried, gates_size, state_size,
                            h0 + step.carried * state_size, state_size, false, weights,
                            weights_row_stride, true, true,
                            step_gates + step.carried * gates_size, gates_size);
    }
    if (code != LLTM_SUCCESS) return code;
    const int64_t elements = step.rows * state_size;
    lltm_sequence_gates_forward_kernel<Dtype>
        <<<CAFFE_GET_BLOCKS(elements), CAFFE_CUDA_NUM_THREADS, 0, stream>>>(
            elements, state_size, bias,
            step_state<Dtype>(step, state_size, h0, c0, outputs, cells, final_h, final_cell),
            step_gates, outputs + step.offset * state_size, cells + step.offset * state_size);
    CUDA_POST_KERNEL_CHECK;
    if (step.order + 1 == walk.steps) break;
  }
  return LLTM_SUCCESS;
}

// Backward step's gate math: d_h_next holds the gradient reaching h from the
// next step (its d_gates times W, by cuBLAS) for the rows it continues;
// d_cell carries the gradient reaching each cell, as in the step-by-step
// kernel (NULL: a single step's d_c0, not wanted).
template <typename Dtype>
__global__ void lltm_sequence_gates_backward_kernel(
    const int64_t count, const int64_t state_size, const Dtype* __restrict__ d_h_next,
    const StepGradients<Dtype> gradients, const Dtype* __restrict__ cells,
    const Dtype* __restrict__ gates, Dtype* __restrict__ d_cell, Dtype* __restrict__ d_gates) {
  CUDA_KERNEL_LOOP(index, count) {
    const int64_t row = index / state_size, column = index - row * state_size;
    const int64_t gate = index + 2 * row * state_size;
    step_cell_backward(gradients, row, column, index,
                       row < gradients.continued ? to_math(d_h_next[index]) : math_t<Dtype>(0),
                       d_cell, to_math(cells[index]), gates + gate, state_size, d_cell,
                       d_gates + gate);
  }
}

// One step's gate math backward over its `count` (rows x state) elements:
// the kernel above, launched.
template <typename Dtype>
static cudaError_t launch_gates_backward(int64_t count, int64_t state_size, const Dtype* d_h_next,
                                         const StepGradients<Dtype>& gradients,
                                         const Dtype* cells, const Dtype* gates, Dtype* d_cell,
                                         Dtype* d_gates, cudaStream_t stream) {
  lltm_sequence_gates_backward_kernel<Dtype>
      <<<CAFFE_GET_BLOCKS(count), CAFFE_CUDA_NUM_THREADS, 0, stream>>>(
          count, state_size, d_h_next, gradients, cells, gates, d_cell, d_gates);
  CUDA_POST_KERNEL_CHECK;
  return cudaSuccess;
}

// d_h0 holds the gradient reaching each step's h from the step after it;
// the gradient of h0 itself comes after the loop (initial_state_grads).
template <typename Dtype>
static int sequence_backward_cublas_steps(const lltm_walk& walk, int64_t state_size,
                                          int64_t weights_row_stride, const Dtype* weights,
                                          const Dtype* grad_outputs, const Dtype* grad_cells,
                                          const GradStrides& strides, const Dtype* grad_final_h,
                                          const Dtype* grad_final_cell, const Dtype* cells,
                                          const Dtype* gates, Dtype* d_gates, Dtype* d_h0,
                                          Dtype* d_c0, cudaStream_t stream) {
  const int64_t gates_size = 3 * state_size;
  lltm_step step = lltm_last_step(&walk);
  int64_t next_offset = 0;  // the first row of the step visited after `step`
  for (;;) {
    if (step.continued) {
      const int code = product<Dtype>(true, stream, step.continued, state_size, gates_size,
                                      d_gates + next_offset * gates_size, gates_size, false,
                                      weights, weights_row_stride, false, false, d_h0,
                                      state_size);
      if (code != LLTM_SUCCESS) return code;
    }
    const cudaError_t status = launch_gates_backward<Dtype>(
        step.rows * state_size, state_size, d_h0,
        step_gradients<Dtype>(walk, step, grad_outputs, grad_cells, strides, grad_final_h,
                              grad_final_cell),
        cells + step.offset * state_size, gates + step.offset * gates_size, d_c0,
        d_gates + step.offset * gates_size, stream);
    if (status != cudaSuccess) return status;
    if (step.order == 0) break;
    next_offset = step.offset;
    step = lltm_previous_step(&walk, &step);
  }
  return LLTM_SUCCESS;
}

// The persistent path: one cooperative launch runs every step of a pass. Each
// block owns `columns` state columns for every batch row and keeps the rows
// of the hidden weights that meet them in shared memory for the whole
// sequence; the grid synchronises once a step, when every block has written
// its part of the state the next step reads. A step costs no launch, and the
// weights are read from memory once a pass instead of once a step.
//
// float and double compute the products on CUDA cores (persistent_step), the
// 16-bit types on tensor cores (mma_step); the two share the kernels' steps,
// the cell's math and what a step reads and writes.
//
// Shared memory holds rows padded to a multiple of the vector width (plus one
// vector, so that the rows of a warp's lanes fall into different banks; for
// the tensor cores, mma_padded).
//
// The weights and the staged state stay in the element type there, a 16-bit
// one too: half the bytes of float, so a 16-bit pass fits the persistent
// kernels at larger sizes than a float32 one (plan_persistent sizes by
// sizeof(Dtype)), and staging the state is a plain copy. The products read
// the elements as they are and sum in the math type.
template <typename Dtype>
struct Vector;
template <>
struct Vector<float> {
  typedef float4 type;
  static const int kWidth = 4;
};
template <>
struct Vector<double> {
  typedef double2 type;
  static const int kWidth = 2;
};
template <>
struct Vector<__half> {
  typedef uint4 type;
  static const int kWidth = 8;
};
template <>
struct Vector<__nv_bfloat16> {
  typedef uint4 type;
  static const int kWidth = 8;
};

template <typename Dtype>
__host__ __device__ static int64_t padded(int64_t length) {
  const int64_t width = Vector<Dtype>::kWidth;
  return (length + width - 1) / width * width + width;
}

// sums[r * kRows + n] += a_r . b_n over this lane's share of `length` (a
// multiple of the vector width): vector `part`, part + parts, ...; a_r is row
// r of `a` (the first `rows` of kRowsA, `a_stride` apart), b_n row n of `b`
// (kRows rows, `b_stride` apart). a and b are shared memory, 16-byte
// aligned, each row too. Each vector of b is read once for the kRowsA rows
// of a: shared memory's bandwidth bounds these products, and a tile of rows
// reads a fraction of the bytes that a row at a time does.
template <typename Dtype, int kRowsA, int kRows>
__device__ __forceinline__ void dot_tile(const Dtype* a, int64_t a_stride, int rows,
                                         const Dtype* b, int64_t b_stride, int64_t length,
                                         int part, int parts,
                                         math_t<Dtype> (&sums)[kRowsA * kRows]) {
  typedef typename Vector<Dtype>::type V;
  const int kWidth = Vector<Dtype>::kWidth;
  for (int64_t k = part * kWidth; k < length; k += parts * kWidth) {
    math_t<Dtype> y[kRows][kWidth];
#pragma unroll
    for (int n = 0; n < kRows; ++n) {
      const V vector = *reinterpret_cast<const V*>(b + n * b_stride + k);
      const Dtype* ys = reinterpret_cast<const Dtype*>(&vector);
#pragma unroll
      for (int w = 0; w < kWidth; ++w) y[n][w] = to_math(ys[w]);
    }
#pragma unroll
    for (int r = 0; r < kRowsA; ++r) {
      if (r >= rows) break;
      const V vector = *reinterpret_cast<const V*>(a + r * a_stride + k);
      const Dtype* xs = reinterpret_cast<const Dtype*>(&vector);
#pragma unroll
      for (int w = 0; w < kWidth; ++w) {
        const math_t<Dtype> x = to_math(xs[w]);
#pragma unroll
        for (int n = 0; n < kRows; ++n) sums[r * kRows + n] += x * y[n][w];
      }
    }
  }
}

// The sums of the `parts` consecutive lanes (a power of two, at most a warp)
// that each hold a share of the same dot products, in every one of them; in
// the math type.
template <typename Math, int kRows>
__device__ __forceinline__ void sum_parts(int parts, Math (&sums)[kRows]) {
  static_assert(IsMath<Math>::value, "partial sums are shuffled in float or double");
  for (int offset = parts / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int n = 0; n < kRows; ++n) sums[n] += __shfl_xor_sync(0xffffffffu, sums[n], offset);
  }
}

// How many lanes share one task's dot products (persistent_step): as many
// as the block has threads for, so that each lane's share is short.
__device__ __forceinline__ int parts_per_task(int64_t tasks) {
  int parts = 1;
  while (parts < 32 && tasks * parts * 2 <= (int64_t)blockDim.x) parts *= 2;
  return parts;
}

// Copies the first `rows` rows of a (., length) row-major matrix into
// shared memory rows `stride` apart, zero-padded; bypasses L1, since other
// blocks wrote them during this launch. Whole vectors where the rows allow
// it: on compute capability 8.0 and newer as asynchronous copies
// (cp.async), every one of the thread's in flight at once, so that a step
// waits for about one round trip to L2 (at B=16 S=768 a backward step
// stages 147 KB a block: 10 us of its 24 with eight loads a thread in
// flight, on an H200); before 8.0 eight loads at a time.
template <typename Dtype>
__device__ __forceinline__ void stage_rows(const Dtype* source, int rows, int64_t length,
                                           Dtype* target, int64_t stride) {
  typedef typename Vector<Dtype>::type V;
  const int kWidth = Vector<Dtype>::kWidth;
  if (length % kWidth == 0 && reinterpret_cast<uintptr_t>(source) % sizeof(V) == 0) {
    const int width = (int)(stride / kWidth), total = rows * width;
    const int length_vectors = (int)(length / kWidth);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
      const int r = i / width, k = i - r * width;
      V* slot = reinterpret_cast<V*>(target) + i;
      if (k < length_vectors) {
        const unsigned address = shared_address(slot);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(address),
                     "l"(reinterpret_cast<const V*>(source + r * length) + k)
                     : "memory");
      } else {
        *slot = V{};
      }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
#else
#pragma unroll 8
    for (int i = threadIdx.x; i < total; i += blockDim.x) {
      const int r = i / width, k = i - r * width;
      V value = {};
      if (k < length_vectors) value = __ldcg(reinterpret_cast<const V*>(source + r * length) + k);
      reinterpret_cast<V*>(target)[i] = value;
    }
#endif
    return;
  }
  const int width = (int)stride, total = rows * width;
#pragma unroll 8
  for (int i = threadIdx.x; i < total; i += blockDim.x) {
    const int r = i / width, k = i - r * width;
    target[i] = k < length ? __ldcg(source + r * length + k) : to_storage<Dtype>(0);
  }
}

// Element e of a block's batch_size x kColumns (batch row, state column)
// elements: its row, its state column, whether it is one of the block's (e
// below elements) and of the state (column below state_size), and its index.
template <int kColumns>
struct BlockElement {
  int64_t column;
  int row;
  bool active;
  int64_t element;  // row * state_size + column: its index in a step's (batch, state) tensors
  __device__ BlockElement(int64_t e, int64_t column0, int64_t elements, int64_t state_size)
      : column(column0 + e % kColumns), row((int)(e / kColumns)),
        active(e < elements && column < state_size), element(row * state_size + column) {}
};

static const int kPersistentThreads = 256;
static const int64_t kPersistentElements = 16384;

// Batch rows a group of lanes takes together (dot_tile's kRowsA). On an
// H200 at T=64 B=16 S=768 (float32, microseconds a step), four rows took the
// forward kernel from 16.4 to 12.0, the backward from 24.1 to 24.4: its
// time goes elsewhere.
static const int kPersistentRows = 4;

// One step of a persistent kernel. The block's (batch row, column) elements
// go in tasks of kPersistentRows rows of one column, each task to a group
// of `parts` lanes: the products of its rows of the staged state with its
// column's weights (product(column, first_row, rows, part, parts, sums),
// then summed over the group's lanes), then, for each of its rows, on one
// lane of the group, finish(at, sums of that row, inputs) with what
// load(at, inputs) read for the element. A lane's first element's inputs
// are loaded before stage() (the wait for the other blocks' state), so that
// their latency hides behind it: as stored (Stored, the element type), so
// that no arithmetic on them waits for the loads before finish converts
// them (at T=256 B=16 S=768 float16 on an H200 the tensor-core kernels took
// 3.89 and 4.82 us a step, forward and backward, when load added the bias
// in float, 3.52 and 4.02 since). Every lane runs the same iterations, for
// the shuffles in sum_parts. Sums are of the math type Math.
template <typename Math, int kColumns, int kSums, int kInputs, typename Stored, typename Load,
          typename Stage, typename Product, typename Finish>
__device__ __forceinline__ void persistent_step(int64_t column0, int64_t batch_size,
                                                int64_t state_size, Load load, Stage stage,
                                                Product product, Finish finish) {
  const int64_t row_groups = (batch_size + kPersistentRows - 1) / kPersistentRows;
  const int64_t tasks = row_groups * kColumns;
  const int parts = parts_per_task(tasks), part = threadIdx.x % parts;
  const int64_t elements = batch_size * kColumns;
  // Task i: column i % kColumns, rows from i / kColumns * kPersistentRows;
  // its row r is element (first row + r) * kColumns + column.
  auto element_of = [&](int64_t task, int r) {
    return (task / kColumns * kPersistentRows + r) * kColumns + task % kColumns;
  };
  Stored first[kInputs] = {};
  const BlockElement<kColumns> first_element(
      part < kPersistentRows ? element_of(threadIdx.x / parts, part) : elements, column0,
      elements, state_size);
  if (first_element.active) load(first_element, first);
  stage();
  for (int64_t t0 = 0; t0 < tasks; t0 += blockDim.x / parts) {
    const int64_t task = t0 + threadIdx.x / parts;
    const int64_t column = column0 + task % kColumns;
    const int64_t first_row = task / kColumns * kPersistentRows;
    const int rows = (int)(batch_size - first_row < kPersistentRows ? batch_size - first_row
                                                                    : kPersistentRows);
    Math sums[kPersistentRows * kSums] = {};
    if (task < tasks && column < state_size) product(column, first_row, rows, part, parts, sums);
    sum_parts(parts, sums);
    // This lane's rows: part, part + parts, ... (r a constant, so that the
    // sums stay in registers).
#pragma unroll
    for (int r = 0; r < kPersistentRows; ++r) {
      if (r < part || ((r - part) & (parts - 1))) continue;
      const BlockElement<kColumns> at(task < tasks ? element_of(task, r) : elements, column0,
                                      elements, state_size);
      if (!at.active) continue;
      Stored inputs[kInputs];
      Math row_sums[kSums];
#pragma unroll
      for (int i = 0; i < kInputs; ++i) inputs[i] = first[i];
      if (t0 || r != part) load(at, inputs);
#pragma unroll
      for (int n = 0; n < kSums; ++n) row_sums[n] = sums[r * kSums + n];
      finish(at, row_sums, inputs);
    }
  }
}

// The 16-bit element types take their products on tensor cores (compute
// capability 8.0 and newer; plan_persistent gives them no other persistent
// plan): mma.sync m16n8k16, 16-bit operands summed in float. A block owns
// kMmaColumns state columns, an mma tile's width, so that its rows of the
// weights are whole tiles (forward one a gate, backward one); the batch rows
// are the tiles' 16 rows, padded with zero rows to whole tiles; the block's
// warps split the products' depth, and the lanes that finish the elements
// add the warps' partial sums from shared memory (mma_step).
//
// Measured on an H200, T=256 B=16 S=768 float16, the kernels alone,
// microseconds a step forward and backward: 4.51 and 5.77 with these tiles
// (the CUDA-core kernels above took 22.7 for both at T=1024); 3.89 and 4.82
// with the clusters' shared staging (MulticastStage); 3.52 and 4.02 with
// the inputs loaded as stored (persistent_step). A forward step then, by
// the clock of one block: the grid's barrier 1.0, staging 0.7, the products
// 0.45, the partial sums and the cell 0.4. A barrier of our own (an atomic
// counter, release and acquire) measured 0.90 against grid.sync's 0.97:
// not worth a counter that every launch would have to own. Nor was a
// flagged exchange instead of barrier and staging (each block writing its
// values beside a step flag into a workspace, each block of a cluster
// polling its share of the rows and copying them into the others): 4.44
// and 6.94 against 3.53 and 4.10. Its polls waited about 1.2 us for the
// slowest block, as long as the barrier, and spreading the rows within the
// cluster cost more than the multicast (issuing a block's 14 copies alone
// took 0.8 us).
static const int kMmaColumns = 8;
static const int kMmaRows = 16;
static const int kMmaDepth = 16;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define LLTM_MMA_ARCH 1
#else
#define LLTM_MMA_ARCH 0
#endif

// A row of a tensor-core kernel's shared operands: its length padded to
// whole mma depths, plus half a depth, so that the 32-bit loads of a
// warp's fragments (8 rows, 4 words each) fall into 32 different banks.
__host__ __device__ static int64_t mma_padded(int64_t length) {
  return (length + kMmaDepth - 1) / kMmaDepth * kMmaDepth + kMmaDepth / 2;
}

// c += a b, an m16n8k16 tile, with a (16 x 16, row-major) and b (16 x 8,
// column-major) as the PTX ISA's mma fragments of Dtype, c in float.
#define LLTM_MMA_16X8X16(type)                                                         \
  asm("mma.sync.aligned.m16n8k16.row.col.f32." type "." type ".f32 {%0, %1, %2, %3}, " \
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                                   \
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))

template <typename Dtype>
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1) {
#if LLTM_MMA_ARCH
  if constexpr (std::is_same<Dtype, __half>::value) {
    LLTM_MMA_16X8X16("f16");
  } else {
    LLTM_MMA_16X8X16("bf16");
  }
#endif
}

// Two 16-bit elements of shared memory as one word.
template <typename Dtype>
__device__ __forceinline__ uint32_t pair_at(const Dtype* element) {
  return *reinterpret_cast<const uint32_t*>(element);
}

// acc[n] += the kMmaRows rows of `a` times rows n kMmaColumns to (n + 1)
// kMmaColumns - 1 of `b`, transposed, over depth [begin, end) (multiples of
// kMmaDepth): one warp's tiles. Both operands are row-major in shared
// memory, rows a_stride and b_stride elements apart (mma_padded).
template <typename Dtype, int kTiles>
__device__ __forceinline__ void mma_rows(const Dtype* a, int64_t a_stride, const Dtype* b,
                                         int64_t b_stride, int begin, int end,
                                         float (&acc)[kTiles][4]) {
  const int lane = threadIdx.x % 32;
  const Dtype* a_lane = a + lane / 4 * a_stride + lane % 4 * 2;
  const Dtype* b_lane = b + lane / 4 * b_stride + lane % 4 * 2;
  const int64_t lower = 8 * a_stride;  // the fragment's rows 8 to 15
  for (int k = begin; k < end; k += kMmaDepth) {
    const uint32_t fragment[4] = {pair_at(a_lane + k), pair_at(a_lane + lower + k),
                                  pair_at(a_lane + k + 8), pair_at(a_lane + lower + k + 8)};
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
      const Dtype* column = b_lane + n * kMmaColumns * b_stride + k;
      mma_16x8x16<Dtype>(acc[n], fragment, pair_at(column), pair_at(column + 8));
    }
  }
}

// On compute capability 9.0 and newer the tensor-core kernels run in
// clusters of kMmaCluster blocks, which stage the state together: each
// block copies its share of the rows (rank, rank + kMmaCluster, ...) from
// global memory into the shared memory of every block of its cluster at
// once (a bulk copy multicast to the cluster), and each block's mbarrier
// counts the bytes that land in it. L2 then serves each row once a cluster,
// not once a block.
static const int kMmaCluster = 8;

// A block's staging of the state: its mbarrier (in shared memory), the
// parity of the phase its next multicast staging completes, and whether the
// block runs in a cluster (prepare's finding).
struct MulticastStage {
  uint64_t* barrier;
  unsigned parity;
  bool clustered;

  // Every thread of every block, once, before the first step: whether the
  // block runs in a cluster (tensor_cores, and a cluster launch); the zeros
  // of `staged` (rows rows of `stride` elements, the first batch_size of
  // them the state's): the tiles' padding rows, and in a cluster the
  // state's rows too, whose padding the copies leave as it is; then, in a
  // cluster, open().
  template <typename Dtype>
  __device__ void prepare(Dtype* staged, int64_t batch_size, int64_t rows, int64_t stride,
                          bool tensor_cores) {
    clustered = tensor_cores && cluster_blocks() > 1;
    for (int64_t i = (clustered ? 0 : batch_size * stride) + threadIdx.x; i < rows * stride;
         i += blockDim.x) {
      staged[i] = to_storage<Dtype>(0);
    }
    if (clustered) open();
  }

  // A step's staging: the first `rows` rows of `source` (rows of `length`
  // elements) into `target`'s rows, `stride` apart. In a cluster by copy()
  // where the rows take bulk copies and `bulk` allows them (the forward
  // stages h0 itself), else by this block's own copies (stage_rows), which
  // in a cluster are then ordered before the next copy's.
  template <typename Dtype>
  __device__ void stage(const Dtype* source, int rows, int64_t length, Dtype* target,
                        int64_t stride, bool bulk) {
    if (clustered && bulk && takes(source, length)) {
      copy(source, rows, length, target, stride);
    } else {
      stage_rows(source, rows, length, target, stride);
      if (clustered) after_own_writes();
    }
  }

  // Every thread of every block of the cluster, once, after the block's
  // own writes to the shared memory that the copies fill: the barrier set
  // up, those writes ordered before the copies' (another proxy's), and the
  // whole cluster past that before any block copies.
  __device__ void open() {
#if LLTM_CLUSTER_PTX
    if (threadIdx.x == 0) {
      mbarrier_init(shared_address(barrier));
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
    cluster_arrive();
    cluster_wait();
  }

  // Whether staging `source` (rows of `length` elements) can take bulk
  // copies: 16-byte aligned rows. The same answer in every block.
  template <typename Dtype>
  __device__ static bool takes(const Dtype* source, int64_t length) {
    return reinterpret_cast<uintptr_t>(source) % 16 == 0 && length * sizeof(Dtype) % 16 == 0;
  }

  // The first `rows` rows of `source` into `target`'s rows, `stride` apart
  // (their padding stays as it is: zeros), in every block of the cluster;
  // returns once this block's have landed.
  template <typename Dtype>
  __device__ void copy(const Dtype* source, int rows, int64_t length, Dtype* target,
                       int64_t stride) {
#if LLTM_CLUSTER_PTX
    const unsigned blocks = cluster_blocks();
    const unsigned row_bytes = (unsigned)(length * sizeof(Dtype));
    if (threadIdx.x == 0) mbarrier_arrive_expecting(shared_address(barrier), row_bytes * rows);
    const int64_t row = cluster_rank() + (int64_t)blocks * threadIdx.x;
    if (row < rows) {
      // The other blocks' stores of the rows reached this thread through
      // the grid's barrier; the copies read them through the async proxy.
      asm volatile("fence.proxy.async;" ::: "memory");
      const unsigned short mask = (unsigned short)((1u << blocks) - 1);
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
          " [%0], [%1], %2, [%3], %4;"
          ::"r"(shared_address(target + row * stride)), "l"(source + row * length),
          "r"(row_bytes), "r"(shared_address(barrier)), "h"(mask) : "memory");
    }
    mbarrier_wait(shared_address(barrier), parity);
    parity ^= 1;
#endif
  }

  // After a block's own staging of the buffer that the copies fill: its
  // writes ordered before the copies'.
  __device__ static void after_own_writes() {
#if LLTM_CLUSTER_PTX
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
  }

  // Before the block exits: no block leaves while its cluster may still
  // write into it.
  __device__ void close() const {
    if (!clustered) return;
    cluster_arrive();
    cluster_wait();
  }
};

// One step of a tensor-core persistent kernel, persistent_step's contract
// with the products by tile: product(m, begin, end, acc) adds this warp's
// share of the depth, [begin, end) of `length`, to the kSums tiles of
// batch rows m kMmaRows on; `partial` (shared memory, a Math per warp,
// batch row and sum) collects them, and lane e of the block (and e +
// blockDim.x, ...) finishes element e.
template <typename Math, int kSums, int kInputs, typename Stored, typename Load, typename Stage,
          typename Product, typename Finish>
__device__ __forceinline__ void mma_step(int64_t column0, int64_t batch_size, int64_t state_size,
                                         int64_t length, Math* partial, Load load, Stage stage,
                                         Product product, Finish finish) {
  const int kWidth = kSums * kMmaColumns;  // a partial row's sums
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tiles = (int)((batch_size + kMmaRows - 1) / kMmaRows), rows = tiles * kMmaRows;
  const int depth = (int)((length + kMmaDepth - 1) / kMmaDepth);
  const int begin = depth * warp / warps * kMmaDepth, end = depth * (warp + 1) / warps * kMmaDepth;
  const int64_t elements = batch_size * kMmaColumns;
  Stored first[kInputs] = {};
  const BlockElement<kMmaColumns> first_element(threadIdx.x, column0, elements, state_size);
  if (first_element.active) load(first_element, first);
  stage();
  for (int m = 0; m < tiles; ++m) {
    float acc[kSums][4] = {};
    product(m, begin, end, acc);
    // The accumulator's layout: rows lane / 4 and lane / 4 + 8, columns
    // lane % 4 * 2 and the one after.
    Math* sums = partial + (warp * rows + m * kMmaRows + lane / 4) * kWidth + lane % 4 * 2;
#pragma unroll
    for (int n = 0; n < kSums; ++n) {
      sums[n * kMmaColumns] = acc[n][0];
      sums[n * kMmaColumns + 1] = acc[n][1];
      sums[8 * kWidth + n * kMmaColumns] = acc[n][2];
      sums[8 * kWidth + n * kMmaColumns + 1] = acc[n][3];
    }
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < elements; e += blockDim.x) {
    const BlockElement<kMmaColumns> at(e, column0, elements, state_size);
    if (!at.active) continue;
    Stored inputs[kInputs];
    Math sums[kSums] = {};
#pragma unroll
    for (int i = 0; i < kInputs; ++i) inputs[i] = first[i];
    if (e != threadIdx.x) load(at, inputs);
    for (int w = 0; w < warps; ++w) {
      const Math* row = partial + (w * rows + at.row) * kWidth + e % kMmaColumns;
#pragma unroll
      for (int n = 0; n < kSums; ++n) sums[n] += row[n * kMmaColumns];
    }
    finish(at, sums, inputs);
  }
}

// Forward, the steps in the walk's order (reverse: last to first): the
// lanes of a group compute the three gates of one (batch row, column)
// element of the block's, one of them the cell. The last step visited
// leaves its state in final_h and final_cell too, where final_h is not
// NULL. Dense steps only (lltm_steps.h); bias NULL: none.
template <typename Dtype, int kColumns>
__global__ void __launch_bounds__(kPersistentThreads) lltm_sequence_forward_persistent_kernel(
    const int64_t steps, const int64_t batch_size, const int64_t state_size,
    const int64_t weights_row_stride, const int reverse, const Dtype* __restrict__ bias,
    const Dtype* __restrict__ weights, const Dtype* h0, const Dtype* c0, Dtype* outputs,
    Dtype* cells, Dtype* gates, Dtype* final_h, Dtype* final_cell) {
  typedef math_t<Dtype> Math;
  constexpr bool kTensorCores = !IsMath<Dtype>::value;
  static_assert(!kTensorCores || kColumns == kMmaColumns, "a tensor-core block owns a tile");
  extern __shared__ __align__(16) unsigned char shared[];
  const int64_t stride = kTensorCores ? mma_padded(state_size) : padded<Dtype>(state_size);
  const int64_t rows = kTensorCores ? (batch_size + kMmaRows - 1) / kMmaRows * kMmaRows
                                    : batch_size;
  Dtype* w = reinterpret_cast<Dtype*>(shared);  // row g * kColumns + c: gate g of column c
  Dtype* h = w + 3 * kColumns * stride;         // the previous step's h, every batch row
  Math* partial = reinterpret_cast<Math*>(h + rows * stride);  // tensor cores: mma_step's
  const int64_t column0 = (int64_t)blockIdx.x * kColumns;
  for (int64_t i = threadIdx.x; i < 3 * kColumns * stride; i += blockDim.x) {
    const int64_t row = i / stride, k = i % stride;
    const int64_t column = column0 + row % kColumns, gate_row = row / kColumns * state_size;
    w[i] = k < state_size && column < state_size
        ? weights[(gate_row + column) * weights_row_stride + k] : to_storage<Dtype>(0);
  }
  __shared__ uint64_t multicast_barrier;
  MulticastStage multicast = {&multicast_barrier, 0, false};
  multicast.prepare(h, batch_size, rows, stride, kTensorCores);
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  const int64_t step = batch_size * state_size;
  for (int64_t order = 0; order < steps; ++order) {
    const int64_t t = reverse ? steps - 1 - order : order;
    const int64_t previous = reverse ? t + 1 : t - 1;
    const Dtype* old_h = order ? outputs + previous * step : h0;
    const Dtype* old_cell = order ? cells + previous * step : c0;
    Dtype* final_h_now = order + 1 == steps ? final_h : NULL;
    // An element's input part of its gates, the bias and its old cell,
    // which this lane wrote: as stored, so that nothing waits for them
    // before finish.
    auto load = [&](const BlockElement<kColumns>& at, Dtype (&inputs)[7]) {
      const int64_t gate = t * 3 * step + at.row * 3 * state_size + at.column;
#pragma unroll
      for (int g = 0; g < 3; ++g) {
        inputs[g] = gates[gate + g * state_size];
        inputs[3 + g] = bias ? bias[g * state_size + at.column] : to_storage<Dtype>(0);
      }
      inputs[6] = old_cell[at.element];
    };
    auto stage = [&] {
      __syncthreads();
      multicast.stage(old_h, (int)batch_size, state_size, h, stride, order > 0);
      __syncthreads();
    };
    auto finish = [&](const BlockElement<kColumns>& at, const Math (&sums)[3],
                      const Dtype (&inputs)[7]) {
      const int64_t gate = t * 3 * step + at.row * 3 * state_size + at.column;
      Math pre[3];
#pragma unroll
      for (int g = 0; g < 3; ++g) {
        pre[g] = keep_gate(&gates[gate + g * state_size],
                           to_math(inputs[g]) + to_math(inputs[3 + g]) + sums[g]);
      }
      Math h_value, cell_value;
      cell_forward(pre[0], pre[1], pre[2], to_math(inputs[6]), &h_value, &cell_value);
      const Dtype new_h = to_storage<Dtype>(h_value), new_cell = to_storage<Dtype>(cell_value);
      outputs[t * step + at.element] = new_h;
      cells[t * step + at.element] = new_cell;
      if (final_h_now) {
        final_h_now[at.element] = new_h;
        final_cell[at.element] = new_cell;
      }
    };
    if constexpr (kTensorCores) {
      auto product = [&](int m, int begin, int end, float (&acc)[3][4]) {
        mma_rows<Dtype, 3>(h + m * kMmaRows * stride, stride, w, stride, begin, end, acc);
      };
      mma_step<Math, 3, 7, Dtype>(column0, batch_size, state_size, state_size, partial, load, stage,
                           product, finish);
    } else {
      auto product = [&](int64_t column, int64_t first_row, int rows, int part, int parts,
                         Math (&sums)[kPersistentRows * 3]) {
        dot_tile<Dtype, kPersistentRows, 3>(h + first_row * stride, stride, rows,
                                            w + (column - column0) * stride, kColumns * stride,
                                            stride, part, parts, sums);
      };
      persistent_step<Math, kColumns, 3, 7, Dtype>(column0, batch_size, state_size, load, stage,
                                            product, finish);
    }
    grid.sync();
  }
  multicast.close();
}

// Backward, the steps in the reverse of the walk's order, then the gradient
// of h0: the gradient reaching a step's h from the step visited after it
// (that step's d_gates times the hidden weights), or the final h's at the
// last step visited, then the cell's backward pass; d_c0 carries the
// gradient reaching each cell, starting from the final cell's. Dense steps
// only.
template <typename Dtype, int kColumns>
__global__ void __launch_bounds__(kPersistentThreads) lltm_sequence_backward_persistent_kernel(
    const int64_t steps, const int64_t batch_size, const int64_t state_size,
    const int64_t weights_row_stride, const int reverse, const Dtype* __restrict__ weights,
    const Dtype* __restrict__ grad_outputs, const Dtype* __restrict__ grad_cells,
    const GradStrides strides, const Dtype* __restrict__ grad_final_h,
    const Dtype* __restrict__ grad_final_cell, const Dtype* __restrict__ cells,
    const Dtype* __restrict__ gates, Dtype* d_gates, Dtype* d_h0, Dtype* d_c0) {
  typedef math_t<Dtype> Math;
  constexpr bool kTensorCores = !IsMath<Dtype>::value;
  static_assert(!kTensorCores || kColumns == kMmaColumns, "a tensor-core block owns a tile");
  extern __shared__ __align__(16) unsigned char shared[];
  const int64_t gates_size = 3 * state_size;
  const int64_t stride = kTensorCores ? mma_padded(gates_size) : padded<Dtype>(gates_size);
  const int64_t rows = kTensorCores ? (batch_size + kMmaRows - 1) / kMmaRows * kMmaRows
                                    : batch_size;
  Dtype* w = reinterpret_cast<Dtype*>(shared);  // row c: column c of the hidden weights
  Dtype* g = w + kColumns * stride;             // the next step's d_gates, every batch row
  Math* partial = reinterpret_cast<Math*>(g + rows * stride);  // tensor cores: mma_step's
  const int64_t column0 = (int64_t)blockIdx.x * kColumns;
  for (int64_t i = threadIdx.x; i < kColumns * stride; i += blockDim.x) {
    const int64_t c = i / stride, k = i % stride;
    w[i] = k < gates_size && column0 + c < state_size
        ? weights[k * weights_row_stride + column0 + c] : to_storage<Dtype>(0);
  }
  __shared__ uint64_t multicast_barrier;
  MulticastStage multicast = {&multicast_barrier, 0, false};
  multicast.prepare(g, batch_size, rows, stride, kTensorCores);
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  const int64_t step = batch_size * state_size;
  for (int64_t order = steps - 1; order >= -1; --order) {
    // t: the step at `order` (-1: h0's gradient); next: the one visited after it.
    const int64_t t = order < 0 ? -1 : reverse ? steps - 1 - order : order;
    const int64_t next = order + 1 >= steps ? -1 : reverse ? steps - 2 - order : order + 1;
    const Dtype* d_gates_next = next >= 0 ? d_gates + next * 3 * step : NULL;
    const Dtype* grad_output =
        t >= 0 ? offset_or_null(grad_outputs, t * strides.outputs[0]) : NULL;
    const Dtype* grad_cell = t >= 0 ? offset_or_null(grad_cells, t * strides.cells[0]) : NULL;
    // An element's output and cell gradients (with the final states' at the
    // last step visited), its cell, its gates and the gradient carried to
    // its cell, which this lane wrote.
    auto load = [&](const BlockElement<kColumns>& at, Dtype (&inputs)[8]) {
      if (t < 0) return;
      const int64_t gate = t * 3 * step + at.row * gates_size + at.column;
      inputs[0] = stored_gradient_at(grad_output, strides.outputs, at.row, at.column);
      inputs[1] = stored_gradient_at(grad_cell, strides.cells, at.row, at.column);
      inputs[2] = cells[t * step + at.element];
#pragma unroll
      for (int g = 0; g < 3; ++g) inputs[3 + g] = gates[gate + g * state_size];
      if (d_gates_next) {
        inputs[6] = d_c0[at.element];
      } else {
        inputs[6] = grad_final_cell ? grad_final_cell[at.element] : to_storage<Dtype>(0);
        inputs[7] = grad_final_h ? grad_final_h[at.element] : to_storage<Dtype>(0);
      }
    };
    auto stage = [&] {
      if (!d_gates_next) return;
      __syncthreads();
      multicast.stage(d_gates_next, (int)batch_size, gates_size, g, stride, true);
      __syncthreads();
    };
    auto finish = [&](const BlockElement<kColumns>& at, const Math (&sums)[1],
                      const Dtype (&inputs)[8]) {
      if (t < 0) {
        d_h0[at.element] = to_storage<Dtype>(sums[0]);
        return;
      }
      const int64_t gate = t * 3 * step + at.row * gates_size + at.column;
      const Math grad_h =
          d_gates_next ? to_math(inputs[0]) : to_math(inputs[0]) + to_math(inputs[7]);
      Math d_old_cell, d_input, d_output, d_candidate;
      cell_backward(grad_h + sums[0], to_math(inputs[6]) + to_math(inputs[1]), to_math(inputs[2]),
                    to_math(inputs[3]), to_math(inputs[4]), to_math(inputs[5]), &d_old_cell,
                    &d_input, &d_output, &d_candidate);
      d_c0[at.element] = to_storage<Dtype>(d_old_cell);
      d_gates[gate] = to_storage<Dtype>(d_input);
      d_gates[gate + state_size] = to_storage<Dtype>(d_output);
      d_gates[gate + 2 * state_size] = to_storage<Dtype>(d_candidate);
    };
    if constexpr (kTensorCores) {
      auto product = [&](int m, int begin, int end, float (&acc)[1][4]) {
        if (d_gates_next) {
          mma_rows<Dtype, 1>(g + m * kMmaRows * stride, stride, w, stride, begin, end, acc);
        }
      };
      mma_step<Math, 1, 8, Dtype>(column0, batch_size, state_size, gates_size, partial, load, stage,
                           product, finish);
    } else {
      auto product = [&](int64_t column, int64_t first_row, int rows, int part, int parts,
                         Math (&sums)[kPersistentRows]) {
        if (d_gates_next) {
          dot_tile<Dtype, kPersistentRows, 1>(g + first_row * stride, stride, rows,
                                              w + (column - column0) * stride, stride, stride,
                                              part, parts, sums);
        }
      };
      persistent_step<Math, kColumns, 1, 8, Dtype>(column0, batch_size, state_size, load, stage,
                                            product, finish);
    }
    grid.sync();
  }
  multicast.close();
}

// How a persistent launch is laid out, or blocks == 0 where the step-by-step
// kernels serve better or it cannot run here. Every block reads the whole
// batch's state each step, so past kPersistentElements (batch x state) that
// traffic outgrows the launches it saves; and it needs shared memory for a
// block's weights and the whole batch, and no more blocks than the device
// holds at once (a cooperative launch needs every block resident).
struct PersistentPlan {
  const void* kernel;  // the kernel for the plan's columns a block
  int blocks;
  size_t shared_bytes;
  int cluster;  // blocks a cluster (MulticastStage), or 1: no clusters
};

// True (with the runtime's last error cleared) when a query failed: the plan
// then falls back to the step-by-step path instead of failing the pass.
static bool failed(cudaError_t status) {
  if (status == cudaSuccess) return false;
  (void)cudaGetLastError();
  return true;
}

// The persistent kernel of a pass (backward or forward) for `columns`
// columns a block: 1, 2, 4 or 8 for float and double, kMmaColumns for the
// 16-bit types.
template <typename Dtype>
static const void* persistent_kernel(bool backward, int columns) {
  if constexpr (IsMath<Dtype>::value) {
    switch (columns) {
      case 1:
        return backward ? (const void*)lltm_sequence_backward_persistent_kernel<Dtype, 1>
                        : (const void*)lltm_sequence_forward_persistent_kernel<Dtype, 1>;
      case 2:
        return backward ? (const void*)lltm_sequence_backward_persistent_kernel<Dtype, 2>
                        : (const void*)lltm_sequence_forward_persistent_kernel<Dtype, 2>;
      case 4:
        return backward ? (const void*)lltm_sequence_backward_persistent_kernel<Dtype, 4>
                        : (const void*)lltm_sequence_forward_persistent_kernel<Dtype, 4>;
      default:
        return backward ? (const void*)lltm_sequence_backward_persistent_kernel<Dtype, 8>
                        : (const void*)lltm_sequence_forward_persistent_kernel<Dtype, 8>;
    }
  } else {
    (void)columns;
    return backward ? (const void*)lltm_sequence_backward_persistent_kernel<Dtype, kMmaColumns>
                    : (const void*)lltm_sequence_forward_persistent_kernel<Dtype, kMmaColumns>;
  }
}

// A block per group of `columns` state columns: for float and double
// enough blocks to spread the work over the device, no more than it holds
// at once; for the 16-bit types kMmaColumns, on compute capability 8.0 and
// newer only (the tensor cores' mma), where the kernels hold code for it,
// in clusters where `clusters` allows them.
template <typename Dtype>
static PersistentPlan plan_persistent(bool backward, int64_t steps, int64_t batch_size,
                                      int64_t state_size, bool clusters) {
  PersistentPlan plan = {NULL, 0, 0, 1};
  const bool tensor_cores = !IsMath<Dtype>::value;
  // The rows of the hidden weights a column needs, and their length.
  const int64_t weight_rows = backward ? 1 : 3;
  const int64_t length = backward ? 3 * state_size : state_size;
  // A single step keeps nothing on chip for a next one; its plan's queries
  // and a cooperative launch would cost the host more than the launches
  // they save.
  if (steps < 2 || batch_size * state_size > kPersistentElements) return plan;
  int device, processors, max_shared, major;
  if (failed(cudaGetDevice(&device)) ||
      failed(cudaDeviceGetAttribute(&processors, cudaDevAttrMultiProcessorCount, device)) ||
      failed(cudaDeviceGetAttribute(&max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                    device)) ||
      failed(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device))) {
    return plan;
  }
  int64_t columns, shared_bytes;
  if (tensor_cores) {
    if (major < 8) return plan;
    columns = kMmaColumns;
    const int64_t rows = (batch_size + kMmaRows - 1) / kMmaRows * kMmaRows;
    const int64_t warps = kPersistentThreads / 32;
    shared_bytes = (weight_rows * columns + rows) * mma_padded(length) * (int64_t)sizeof(Dtype) +
                   warps * rows * weight_rows * columns * (int64_t)sizeof(float);
  } else {
    const int64_t wanted = (batch_size * state_size + 31) / 32;
    const int64_t target = wanted < processors ? (wanted > 0 ? wanted : 1) : processors;
    columns = 1;
    while (columns < 8 && columns * target < state_size) columns *= 2;
    if ((state_size + columns - 1) / columns > processors) return plan;
    shared_bytes = (weight_rows * columns + batch_size) * padded<Dtype>(length) *
                   (int64_t)sizeof(Dtype);
  }
  if (shared_bytes > max_shared) return plan;
  const void* kernel = persistent_kernel<Dtype>(backward, (int)columns);
  cudaFuncAttributes attributes;
  int resident = 0;
  // ptxVersion is the virtual architecture the kernel's code came from: an
  // older one than 8.0 compiled the mma away.
  if (failed(cudaFuncGetAttributes(&attributes, kernel)) ||
      (tensor_cores && attributes.ptxVersion < 80) ||
      failed(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)shared_bytes)) ||
      failed(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kPersistentThreads,
                                                           (size_t)shared_bytes))) {
    return plan;
  }
  int64_t blocks = (state_size + columns - 1) / columns;
  if (blocks > (int64_t)resident * processors) return plan;
  plan.kernel = kernel;
  plan.blocks = (int)blocks;
  plan.shared_bytes = (size_t)shared_bytes;
  // Clusters for the tensor-core kernels where the device and the kernel's
  // code have them (9.0) and the clustered grid is resident at once; the
  // grid grows to whole clusters, its extra blocks owning no column.
  if (tensor_cores && clusters && major == 9 && attributes.ptxVersion >= 90) {
    blocks = (blocks + kMmaCluster - 1) / kMmaCluster * kMmaCluster;
    cudaLaunchAttribute attribute[1];
    const cudaLaunchConfig_t config = cluster_launch_config(
        (unsigned)blocks, kPersistentThreads, (size_t)shared_bytes, kMmaCluster, 0, attribute);
    int clusters = 0;
    if (!failed(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config)) &&
        (int64_t)clusters * kMmaCluster >= blocks) {
      plan.blocks = (int)blocks;
      plan.cluster = kMmaCluster;
    }
  }
  return plan;
}

static int launch_persistent(const PersistentPlan& plan, void** arguments, cudaStream_t stream) {
  if (plan.cluster == 1) {
    return cudaLaunchCooperativeKernel(plan.kernel, plan.blocks, kPersistentThreads, arguments,
                                       plan.shared_bytes, stream);
  }
  cudaLaunchAttribute attributes[2];
  cudaLaunchConfig_t config = cluster_launch_config(
      (unsigned)plan.blocks, kPersistentThreads, plan.shared_bytes, (unsigned)plan.cluster,
      stream, attributes);
  attributes[1].id = cudaLaunchAttributeCooperative;
  attributes[1].val.cooperative = 1;
  config.numAttrs = 2;
  return cudaLaunchKernelExC(&config, plan.kernel, arguments);
}

// Packed steps of a small batch x state (what the persistent kernels would
// take were the steps dense) run the step-by-step kernels, one fused launch
// a step each way, also where cuBLAS runs: cuBLAS's product and a gate
// kernel a step cost more there.
static bool fused_steps_serve(const lltm_walk& walk, int64_t state_size) {
  return walk.batch_sizes && walk.batch_size * state_size <= kPersistentElements;
}

// The path of a pass's recurrence, decided here alone: the cluster kernels
// where lltm_plan_cluster lays them out (dense steps, compute capability 9.0
// and newer, a state of at most 256, every cluster resident at once; its
// thresholds are in cluster_kernel.cu) and the options allow them (not
// LLTM_SEQUENCE_NO_CLUSTER); else the persistent kernels where
// plan_persistent lays them out; else (neither plan set) the cuBLAS loop
// where cuBLAS runs, or the step-by-step kernels.
struct RecurrencePlan {
  lltm_cluster_plan cluster;
  PersistentPlan persistent;
};

template <typename Dtype>
static RecurrencePlan plan_recurrence(bool backward, const lltm_walk& walk, int64_t state_size,
                                      int options) {
  RecurrencePlan plan = {{NULL, 0, 0, 0, 0}, {NULL, 0, 0, 1}};
  if (walk.batch_sizes) return plan;
  if (!(options & LLTM_SEQUENCE_NO_CLUSTER)) {
    plan.cluster = lltm_plan_cluster(lltm_dtype_of<Dtype>(), backward, walk.steps,
                                     walk.batch_size, state_size);
    if (plan.cluster.kernel) return plan;
  }
  plan.persistent = plan_persistent<Dtype>(backward, walk.steps, walk.batch_size, state_size,
                                           !(options & LLTM_SEQUENCE_NO_CLUSTER));
  return plan;
}

static int64_t address(const void* pointer) { return (int64_t)(uintptr_t)pointer; }

// The options a pass's graph depends on, for its key: TF32 changes the
// products, no-cluster the recurrence's kernels (own kernels record no graph).
static int64_t key_options(int options) {
  return options & (LLTM_SEQUENCE_TF32 | LLTM_SEQUENCE_NO_CLUSTER);
}

// Runs steps(cublas, stream), a pass's launches, through lltm_cublas_run
// (cublas true) where the options allow and cuBLAS can be loaded, else
// directly (cublas false).
template <typename Steps>
static int call_steps(void* steps, cudaStream_t stream) {
  return (*static_cast<Steps*>(steps))(true, stream);
}

template <typename Steps>
static int run_pass(const lltm_pass_key& key, int dtype, cudaStream_t stream, int options,
                    Steps steps) {
  if (!(options & LLTM_SEQUENCE_OWN_KERNELS)) {
    const int code = lltm_cublas_run(&key, dtype, stream, options & LLTM_SEQUENCE_TF32,
                                     call_steps<Steps>, &steps);
    if (code != LLTM_ERROR_NO_CUBLAS) return code;
  }
  return steps(false, stream);
}

// The forward pass: every step's input part of its gates, then the
// recurrence by the path plan_recurrence gives. final_h NULL: no final
// state kept.
template <typename Dtype>
static int sequence_forward_steps(bool cublas, cudaStream_t stream, int options,
                                  const lltm_walk& walk, int64_t input_features,
                                  int64_t state_size,
                                  const Dtype* inputs, const Dtype* weights, const Dtype* bias,
                                  const Dtype* h0, const Dtype* c0, Dtype* outputs, Dtype* cells,
                                  Dtype* gates, Dtype* final_h, Dtype* final_cell) {
  int64_t columns = state_size + input_features;  // the weights' row stride
  const int code = product<Dtype>(cublas, stream, walk.rows, 3 * state_size, input_features,
                                  inputs, input_features, false, weights + state_size, columns,
                                  true, false, gates, 3 * state_size);
  if (code != LLTM_SUCCESS) return code;
  const RecurrencePlan plan = plan_recurrence<Dtype>(false, walk, state_size, options);
  if (plan.cluster.kernel) {
    return lltm_launch_cluster_forward(&plan.cluster, lltm_dtype_of<Dtype>(), walk.steps,
                                       walk.batch_size, state_size, columns, walk.reverse, bias,
                                       weights, h0, c0, outputs, cells, gates, final_h,
                                       final_cell, stream);
  }
  if (plan.persistent.blocks) {
    int64_t steps = walk.steps, batch_size = walk.batch_size;
    int reverse = walk.reverse;
    void* arguments[] = {&steps,   &batch_size, &state_size, &columns, &reverse,
                         &bias,    &weights,    &h0,         &c0,      &outputs,
                         &cells,   &gates,      &final_h,    &final_cell};
    return launch_persistent(plan.persistent, arguments, stream);
  }
  if (cublas && !fused_steps_serve(walk, state_size)) {
    return sequence_forward_cublas_steps<Dtype>(walk, state_size, columns, bias, weights, h0, c0,
                                                outputs, cells, gates, final_h, final_cell,
                                                stream);
  }
  return launch_sequence_forward_by_step<Dtype>(walk, state_size, columns, bias, weights, h0, c0,
                                                outputs, cells, gates, final_h, final_cell,
                                                stream);
}

// The gradient of h0: each row's sequence starts there, so it is that row
// of its first step's d_gates times the hidden weights, one product a block
// of rows that start at one step (lltm_state_block).
template <typename Dtype>
static int initial_state_grads(bool cublas, cudaStream_t stream, const lltm_walk& walk,
                               int64_t state_size, int64_t weights_row_stride,
                               const Dtype* weights, const Dtype* d_gates, Dtype* d_h0) {
  const int64_t gates_size = 3 * state_size;
  lltm_block_cursor cursor = lltm_first_block(&walk);
  lltm_state_block block;
  int code = LLTM_SUCCESS;
  while (code == LLTM_SUCCESS && lltm_next_block(&walk, &cursor, &block)) {
    if (!block.initial) continue;
    code = product<Dtype>(cublas, stream, block.rows, state_size, gates_size,
                          d_gates + block.gate_row * gates_size, gates_size, false, weights,
                          weights_row_stride, false, false, d_h0 + block.state_row * state_size,
                          state_size);
  }
  return code;
}

// Up to kMax blocks of state (lltm_state_block), as a kernel argument.
struct StateBlocks {
  static const int kMax = 48;
  int64_t gate_row[kMax], state_row[kMax], rows[kMax];
  int initial[kMax];
  int count;
};

// The hidden columns of d_weights (row stride `columns`; plus what they
// hold where `accumulate`) = d_gates^T times each block's old h, every
// block's product summed in the math type and stored once. A block of
// kTileThreads threads takes a kGradTile x kGradTile tile of (gate row, state
// column) elements, each thread kGradPer x kGradPer of them (rows ty + kTile
// i, columns tx + kTile j), the blocks' rows staged kGradDepth at a time: a
// value read from shared memory serves kGradPer sums, not one (a thread an
// element made a two-layer bidirectional bf16 training step at B=256 S=512
// on an H200 four times as slow as with cuBLAS's 16-bit products).
static const int kGradPer = 4;
static const int kGradTile = kTile * kGradPer;
static const int kGradDepth = 32;

template <typename Dtype>
__global__ void __launch_bounds__(kTileThreads) lltm_hidden_weight_grads_kernel(
    const int64_t state_size, const int64_t columns, const StateBlocks blocks,
    const bool accumulate, const Dtype* __restrict__ d_gates, const Dtype* __restrict__ h0,
    const Dtype* __restrict__ outputs, Dtype* __restrict__ d_weights) {
  typedef math_t<Dtype> Math;
  __shared__ Math g_slice[kGradDepth][kGradTile];  // [k][r]: d_gates' column row0 + r
  __shared__ Math h_slice[kGradDepth][kGradTile];  // [k][c]: the old h's column column0 + c
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int64_t gates_size = 3 * state_size;
  const int64_t column_tiles = (state_size + kGradTile - 1) / kGradTile;
  const int64_t tiles = (gates_size + kGradTile - 1) / kGradTile * column_tiles;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t row0 = tile / column_tiles * kGradTile, column0 = tile % column_tiles * kGradTile;
    Math sum[kGradPer][kGradPer] = {};
    for (int b = 0; b < blocks.count; ++b) {
      const Dtype* gate = d_gates + blocks.gate_row[b] * gates_size;
      const Dtype* state = (blocks.initial[b] ? h0 : outputs) + blocks.state_row[b] * state_size;
      for (int64_t k0 = 0; k0 < blocks.rows[b]; k0 += kGradDepth) {
        for (int i = threadIdx.x; i < kGradDepth * kGradTile; i += kTileThreads) {
          const int k = i / kGradTile, e = i % kGradTile;
          const bool k_in = k0 + k < blocks.rows[b];
          g_slice[k][e] = k_in && row0 + e < gates_size
              ? to_math(gate[(k0 + k) * gates_size + row0 + e]) : Math(0);
          h_slice[k][e] = k_in && column0 + e < state_size
              ? to_math(state[(k0 + k) * state_size + column0 + e]) : Math(0);
        }
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < kGradDepth; ++k) {
          Math g[kGradPer], h[kGradPer];
#pragma unroll
          for (int i = 0; i < kGradPer; ++i) {
            g[i] = g_slice[k][ty + kTile * i];
            h[i] = h_slice[k][tx + kTile * i];
          }
#pragma unroll
          for (int i = 0; i < kGradPer; ++i) {
#pragma unroll
            for (int j = 0; j < kGradPer; ++j) sum[i][j] += g[i] * h[j];
          }
        }
        __syncthreads();
      }
    }
#pragma unroll
    for (int i = 0; i < kGradPer; ++i) {
#pragma unroll
      for (int j = 0; j < kGradPer; ++j) {
        const int64_t row = row0 + ty + kTile * i, column = column0 + tx + kTile * j;
        if (row < gates_size && column < state_size) {
          Dtype* element = d_weights + row * columns + column;
          *element = to_storage<Dtype>(accumulate ? to_math(*element) + sum[i][j] : sum[i][j]);
        }
      }
    }
  }
}

// The walk's blocks of state (lltm_state_block), counted.
static int64_t count_state_blocks(const lltm_walk& walk) {
  lltm_block_cursor cursor = lltm_first_block(&walk);
  lltm_state_block block;
  int64_t count = 0;
  while (lltm_next_block(&walk, &cursor, &block)) ++count;
  return count;
}

// hidden_weight_grads for a 16-bit element type with more than two blocks
// (a packed walk): a product a block would round d_weights to 16 bits
// once a block, so the kernel above sums kMax blocks at a time in float.
template <typename Dtype>
static int summed_hidden_weight_grads(cudaStream_t stream, const lltm_walk& walk,
                                      int64_t state_size, int64_t columns, const Dtype* d_gates,
                                      const Dtype* h0, const Dtype* outputs, Dtype* d_weights) {
  lltm_block_cursor cursor = lltm_first_block(&walk);
  lltm_state_block block;
  StateBlocks blocks;
  blocks.count = 0;
  bool more = lltm_next_block(&walk, &cursor, &block), first = true;
  while (more) {
    blocks.gate_row[blocks.count] = block.gate_row;
    blocks.state_row[blocks.count] = block.state_row;
    blocks.rows[blocks.count] = block.rows;
    blocks.initial[blocks.count] = block.initial;
    ++blocks.count;
    more = lltm_next_block(&walk, &cursor, &block);
    if (blocks.count == StateBlocks::kMax || !more) {
      lltm_hidden_weight_grads_kernel<Dtype>
          <<<tile_blocks(3 * state_size, state_size, kGradTile), kTileThreads, 0, stream>>>(
              state_size, columns, blocks, !first, d_gates, h0, outputs, d_weights);
      CUDA_POST_KERNEL_CHECK;
      blocks.count = 0;
      first = false;
    }
  }
  return LLTM_SUCCESS;
}

// The hidden columns of d_weights: d_gates^T times each step's old h, one
// product a block of steps whose old states lie one after another in the
// outputs or in h0 (lltm_state_block), the first writing, the others
// adding; zeros where no step has a row.
template <typename Dtype>
static int hidden_weight_grads(bool cublas, cudaStream_t stream, const lltm_walk& walk,
                               int64_t state_size, int64_t columns, const Dtype* d_gates,
                               const Dtype* h0, const Dtype* outputs, Dtype* d_weights) {
  if (!IsMath<Dtype>::value && count_state_blocks(walk) > 2) {
    return summed_hidden_weight_grads<Dtype>(stream, walk, state_size, columns, d_gates, h0,
                                             outputs, d_weights);
  }
  const int64_t gates_size = 3 * state_size;
  lltm_block_cursor cursor = lltm_first_block(&walk);
  lltm_state_block block;
  int code = LLTM_SUCCESS;
  bool first = true;
  while (code == LLTM_SUCCESS && lltm_next_block(&walk, &cursor, &block)) {
    code = product<Dtype>(cublas, stream, gates_size, state_size, block.rows,
                          d_gates + block.gate_row * gates_size, gates_size, true,
                          (block.initial ? h0 : outputs) + block.state_row * state_size,
                          state_size, false, !first, d_weights, columns);
    first = false;
  }
  if (code == LLTM_SUCCESS && first) {
    code = product<Dtype>(cublas, stream, gates_size, state_size, 0, d_gates, gates_size, true,
                          h0, state_size, false, false, d_weights, columns);
  }
  return code;
}

// The backward pass: the recurrence as in the forward pass, then the
// gradients of h0 (where the cluster or persistent kernel has not given
// it), the inputs (d_gates times the input weights), the weights (d_gates^T
// times each step's [old h, x]) and the bias (d_gates summed over every
// row), each where wanted.
template <typename Dtype>
static int sequence_backward_steps(bool cublas, cudaStream_t stream, int options,
                                   const lltm_walk& walk, int64_t input_features,
                                   int64_t state_size,
                                   const Dtype* inputs, const Dtype* weights, const Dtype* h0,
                                   const Dtype* outputs, const Dtype* cells, const Dtype* gates,
                                   const Dtype* grad_outputs, const Dtype* grad_cells,
                                   GradStrides strides, const Dtype* grad_final_h,
                                   const Dtype* grad_final_cell, Dtype* d_gates,
                                   Dtype* d_inputs, Dtype* d_weights, Dtype* d_bias, Dtype* d_h0,
                                   Dtype* d_c0) {
  int64_t columns = state_size + input_features;
  const int64_t gates_size = 3 * state_size;
  const RecurrencePlan plan = plan_recurrence<Dtype>(true, walk, state_size, options);
  int code;
  if (plan.cluster.kernel) {
    const int64_t grad_strides[6] = {strides.outputs[0], strides.outputs[1], strides.outputs[2],
                                     strides.cells[0],   strides.cells[1],   strides.cells[2]};
    code = lltm_launch_cluster_backward(&plan.cluster, lltm_dtype_of<Dtype>(), walk.steps,
                                        walk.batch_size, state_size, columns, walk.reverse,
                                        weights, grad_outputs, grad_cells, grad_strides,
                                        grad_final_h, grad_final_cell, cells, gates, d_gates,
                                        d_h0, d_c0, stream);
  } else if (plan.persistent.blocks) {
    int64_t steps = walk.steps, batch_size = walk.batch_size;
    int reverse = walk.reverse;
    void* arguments[] = {&steps,      &batch_size,   &state_size,      &columns,
                         &reverse,    &weights,      &grad_outputs,    &grad_cells,
                         &strides,    &grad_final_h, &grad_final_cell, &cells,
                         &gates,      &d_gates,      &d_h0,            &d_c0};
    code = launch_persistent(plan.persistent, arguments, stream);
  } else {
    code = cublas && !fused_steps_serve(walk, state_size)
               ? sequence_backward_cublas_steps<Dtype>(
                     walk, state_size, columns, weights, grad_outputs, grad_cells, strides,
                     grad_final_h, grad_final_cell, cells, gates, d_gates, d_h0, d_c0, stream)
               : launch_sequence_backward_by_step<Dtype>(
                     walk, state_size, columns, weights, grad_outputs, grad_cells, strides,
                     grad_final_h, grad_final_cell, cells, gates, d_gates, d_c0, stream);
    if (code == LLTM_SUCCESS && d_h0) {
      code = initial_state_grads<Dtype>(cublas, stream, walk, state_size, columns, weights,
                                        d_gates, d_h0);
    }
  }
  if (code == LLTM_SUCCESS && d_inputs) {
    code = product<Dtype>(cublas, stream, walk.rows, input_features, gates_size, d_gates,
                          gates_size, false, weights + state_size, columns, false, false,
                          d_inputs, input_features);
  }
  if (code == LLTM_SUCCESS && d_weights) {
    code = hidden_weight_grads<Dtype>(cublas, stream, walk, state_size, columns, d_gates, h0,
                                      outputs, d_weights);
    if (code == LLTM_SUCCESS) {
      code = product<Dtype>(cublas, stream, gates_size, input_features, walk.rows, d_gates,
                            gates_size, true, inputs, input_features, false, false,
                            d_weights + state_size, columns);
    }
  }
  if (code == LLTM_SUCCESS && d_bias) {
    const int64_t blocks = (gates_size + 31) / 32;
    lltm_column_sums_kernel<Dtype>
        <<<blocks < CAFFE_MAXIMUM_NUM_BLOCKS ? (int)blocks : CAFFE_MAXIMUM_NUM_BLOCKS,
           kSumThreads, 0, stream>>>(walk.rows, gates_size, d_gates, d_bias);
    CUDA_POST_KERNEL_CHECK;
  }
  return code;
}

// The launchers of the passes. sequence_forward and sequence_backward:
// dense steps in the forward direction, each step's cell gradients given,
// no final state; their key is (1 or 2, the sizes, the addresses).
// packed_forward and packed_backward: dense or packed steps in either
// direction (sizes: rows, steps, batch, input_features, state, reverse, then
// the two options; backward, then grad_outputs' and grad_cells' row and
// column strides), with the final states; their key holds the batch sizes
// too.
template <typename Dtype>
static int launch_forward(const lltm_pass_key& key, const lltm_walk& walk, int options,
                          int64_t input_features, int64_t state_size, const void* inputs,
                          const void* weights, const void* bias, const void* h0, const void* c0,
                          void* outputs, void* cells, void* gates, void* final_h,
                          void* final_cell, cudaStream_t stream) {
  if (walk.rows * state_size == 0) return LLTM_SUCCESS;
  return run_pass(key, lltm_dtype_of<Dtype>(), stream, options, [&](bool cublas, cudaStream_t on) {
    return sequence_forward_steps<Dtype>(cublas, on, options, walk, input_features, state_size,
                                         as<Dtype>(inputs), as<Dtype>(weights), as<Dtype>(bias),
                                         as<Dtype>(h0), as<Dtype>(c0), as<Dtype>(outputs),
                                         as<Dtype>(cells), as<Dtype>(gates), as<Dtype>(final_h),
                                         as<Dtype>(final_cell));
  });
}

template <typename Dtype>
static int launch_backward(const lltm_pass_key& key, const lltm_walk& walk, int options,
                           int64_t input_features, int64_t state_size,
                           const GradStrides& strides, const void* inputs, const void* weights,
                           const void* h0, const void* outputs, const void* cells,
                           const void* gates, const void* grad_outputs, const void* grad_cells,
                           const void* grad_final_h, const void* grad_final_cell, void* d_gates,
                           void* d_inputs, void* d_weights, void* d_bias, void* d_h0, void* d_c0,
                           cudaStream_t stream) {
  // Past one step d_h0 and d_c0 carry the gradients between steps.
  if (walk.steps > 1 && (!d_h0 || !d_c0)) return LLTM_ERROR_ARGUMENTS;
  if (walk.rows * state_size == 0) return LLTM_SUCCESS;
  return run_pass(key, lltm_dtype_of<Dtype>(), stream, options, [&](bool cublas, cudaStream_t on) {
    return sequence_backward_steps<Dtype>(
        cublas, on, options, walk, input_features, state_size, as<Dtype>(inputs),
        as<Dtype>(weights), as<Dtype>(h0), as<Dtype>(outputs), as<Dtype>(cells), as<Dtype>(gates),
        as<Dtype>(grad_outputs), as<Dtype>(grad_cells), strides, as<Dtype>(grad_final_h),
        as<Dtype>(grad_final_cell), as<Dtype>(d_gates), as<Dtype>(d_inputs),
        as<Dtype>(d_weights), as<Dtype>(d_bias), as<Dtype>(d_h0), as<Dtype>(d_c0));
  });
}

template <typename Dtype>
static int launch_sequence_forward(int64_t steps, int64_t batch_size, int64_t input_features,
                                   int64_t state_size, int options, const void* inputs,
                                   const void* weights, const void* bias, const void* h0,
                                   const void* c0, void* outputs, void* cells, void* gates,
                                   cudaStream_t stream) {
  lltm_walk walk;
  if (!lltm_make_walk(NULL, steps, batch_size, steps * batch_size, 0, &walk)) {
    return LLTM_ERROR_ARGUMENTS;
  }
  const lltm_pass_key key = {{1, lltm_dtype_of<Dtype>(), steps, batch_size, input_features,
                              state_size, key_options(options), address(inputs),
                              address(weights), address(bias), address(h0), address(c0),
                              address(outputs), address(cells), address(gates)}};
  return launch_forward<Dtype>(key, walk, options, input_features, state_size, inputs, weights,
                               bias, h0, c0, outputs, cells, gates, NULL, NULL, stream);
}

template <typename Dtype>
static int launch_sequence_backward(int64_t steps, int64_t batch_size, int64_t input_features,
                                    int64_t state_size, int options,
                                    const int64_t* grad_strides, const void* inputs,
                                    const void* weights, const void* h0, const void* outputs,
                                    const void* cells, const void* gates,
                                    const void* grad_outputs, const void* grad_cells,
                                    void* d_gates, void* d_inputs, void* d_weights, void* d_bias,
                                    void* d_h0, void* d_c0, cudaStream_t stream) {
  lltm_walk walk;
  if (!lltm_make_walk(NULL, steps, batch_size, steps * batch_size, 0, &walk)) {
    return LLTM_ERROR_ARGUMENTS;
  }
  const GradStrides strides = {{grad_strides[0], grad_strides[1], grad_strides[2]},
                               {grad_strides[3], grad_strides[4], grad_strides[5]}};
  const lltm_pass_key key = {{2, lltm_dtype_of<Dtype>(), steps, batch_size, input_features,
                              state_size, key_options(options), address(inputs),
                              address(weights), address(h0), address(outputs), address(cells),
                              address(gates), address(grad_outputs), address(grad_cells),
                              address(d_gates), address(d_inputs), address(d_weights),
                              address(d_bias), address(d_h0), address(d_c0), grad_strides[0],
                              grad_strides[1], grad_strides[2], grad_strides[3], grad_strides[4],
                              grad_strides[5]}};
  return launch_backward<Dtype>(key, walk, options, input_features, state_size, strides, inputs,
                                weights, h0, outputs, cells, gates, grad_outputs, grad_cells,
                                NULL, NULL, d_gates, d_inputs, d_weights, d_bias, d_h0, d_c0,
                                stream);
}

// The options of a pass whose sizes hold tf32 and kernels at `flags`:
// kernels' bit 0 is own kernels, bit 1 no cluster kernels (sequence.py's
// _options).
static int options_at(const int64_t* flags) {
  return (flags[0] ? LLTM_SEQUENCE_TF32 : 0) | (flags[1] & 1 ? LLTM_SEQUENCE_OWN_KERNELS : 0) |
         (flags[1] & 2 ? LLTM_SEQUENCE_NO_CLUSTER : 0);
}

template <typename Dtype>
static int launch_packed_forward(const int64_t* sizes, const void* batch_sizes,
                                 const void* inputs, const void* weights, const void* bias,
                                 const void* h0, const void* c0, void* outputs, void* cells,
                                 void* gates, void* final_h, void* final_cell,
                                 cudaStream_t stream) {
  lltm_walk walk;
  if (!lltm_packed_walk(sizes, as<int64_t>(batch_sizes), &walk)) return LLTM_ERROR_ARGUMENTS;
  const int options = options_at(sizes + 6);
  const lltm_pass_key key = {{3, lltm_dtype_of<Dtype>(), walk.rows, walk.steps, walk.batch_size,
                              sizes[3], sizes[4], key_options(options), walk.reverse,
                              address(inputs), address(weights), address(bias), address(h0),
                              address(c0), address(outputs), address(cells), address(gates),
                              address(final_h), address(final_cell)},
                             walk.batch_sizes,
                             walk.batch_sizes ? walk.steps : 0};
  return launch_forward<Dtype>(key, walk, options, sizes[3], sizes[4], inputs, weights, bias, h0,
                               c0, outputs, cells, gates, final_h, final_cell, stream);
}

template <typename Dtype>
static int launch_packed_backward(const int64_t* sizes, const void* batch_sizes,
                                  const void* inputs, const void* weights, const void* h0,
                                  const void* outputs, const void* cells, const void* gates,
                                  const void* grad_outputs, const void* grad_cells,
                                  const void* grad_final_h, const void* grad_final_cell,
                                  void* d_gates, void* d_inputs, void* d_weights, void* d_bias,
                                  void* d_h0, void* d_c0, cudaStream_t stream) {
  lltm_walk walk;
  if (!lltm_packed_walk(sizes, as<int64_t>(batch_sizes), &walk)) return LLTM_ERROR_ARGUMENTS;
  const int options = options_at(sizes + 6);
  const int64_t* row_strides = sizes + 8;  // grad_outputs' (row, column), grad_cells'
  const GradStrides strides = {{sizes[2] * row_strides[0], row_strides[0], row_strides[1]},
                               {sizes[2] * row_strides[2], row_strides[2], row_strides[3]}};
  const lltm_pass_key key = {{4, lltm_dtype_of<Dtype>(), walk.rows, walk.steps, walk.batch_size,
                              sizes[3], sizes[4], key_options(options), walk.reverse,
                              address(inputs), address(weights), address(h0), address(outputs),
                              address(cells), address(gates), address(grad_outputs),
                              address(grad_cells), address(grad_final_h),
                              address(grad_final_cell), address(d_gates), address(d_inputs),
                              address(d_weights), address(d_bias), address(d_h0), address(d_c0),
                              row_strides[0], row_strides[1], row_strides[2], row_strides[3]},
                             walk.batch_sizes,
                             walk.batch_sizes ? walk.steps : 0};
  return launch_backward<Dtype>(key, walk, options, sizes[3], sizes[4], strides, inputs, weights,
                                h0, outputs, cells, gates, grad_outputs, grad_cells, grad_final_h,
                                grad_final_cell, d_gates, d_inputs, d_weights, d_bias, d_h0, d_c0,
                                stream);
}

// A single step's cell backward pass, for step_kernel.cu (lltm_kernels.h).
template <typename Dtype>
static cudaError_t step_gates_backward(int64_t batch_size, int64_t state_size,
                                       const int64_t* grad_strides, const void* grad_h,
                                       const void* grad_cell, const void* new_cell,
                                       const void* gates, void* d_old_cell, void* d_gates,
                                       cudaStream_t stream) {
  const StepGradients<Dtype> gradients = {
      as<Dtype>(grad_h), as<Dtype>(grad_cell),
      {{0, grad_strides[1], grad_strides[2]}, {0, grad_strides[4], grad_strides[5]}}, NULL, NULL,
      0};
  return launch_gates_backward<Dtype>(batch_size * state_size, state_size, NULL, gradients,
                                      as<Dtype>(new_cell), as<Dtype>(gates),
                                      as<Dtype>(d_old_cell), as<Dtype>(d_gates), stream);
}

extern "C" cudaError_t lltm_launch_step_gates_backward(
    int dtype, int64_t batch_size, int64_t state_size, const int64_t* grad_strides,
    const void* grad_h, const void* grad_cell, const void* new_cell, const void* gates,
    void* d_old_cell, void* d_gates, cudaStream_t stream) {
  return LLTM_TYPED_CALL_WITH_HALF(dtype, step_gates_backward, batch_size, state_size,
                                   grad_strides, grad_h, grad_cell, new_cell, gates, d_old_cell,
                                   d_gates, stream);
}

// The passes, in the argument order of their declarations in sequence.py;
// every element type.
LLTM_CUDA_PASS_WITH_HALF(sequence_forward, launch_sequence_forward, args->sizes[0],
                         args->sizes[1], args->sizes[2], args->sizes[3],
                         options_at(args->sizes + 4), args->tensors[0], args->tensors[1],
                         args->tensors[2], args->tensors[3], args->tensors[4], args->tensors[5],
                         args->tensors[6], args->tensors[7], stream)
LLTM_CUDA_PASS_WITH_HALF(sequence_backward, launch_sequence_backward, args->sizes[0],
                         args->sizes[1], args->sizes[2], args->sizes[3],
                         options_at(args->sizes + 4), args->sizes + 6, args->tensors[0],
                         args->tensors[1], args->tensors[2], args->tensors[3], args->tensors[4],
                         args->tensors[5], args->tensors[6], args->tensors[7], args->tensors[8],
                         args->tensors[9], args->tensors[10], args->tensors[11],
                         args->tensors[12], args->tensors[13], stream)
LLTM_CUDA_PASS_WITH_HALF(packed_forward, launch_packed_forward, args->sizes, args->tensors[5],
                         args->tensors[0], args->tensors[1], args->tensors[2], args->tensors[3],
                         args->tensors[4], args->tensors[6], args->tensors[7], args->tensors[8],
                         args->tensors[9], args->tensors[10], stream)
LLTM_CUDA_PASS_WITH_HALF(packed_backward, launch_packed_backward, args->sizes, args->tensors[3],
                         args->tensors[0], args->tensors[1], args->tensors[2], args->tensors[4],
                         args->tensors[5], args->tensors[6], args->tensors[7], args->tensors[8],
                         args->tensors[9], args->tensors[10], args->tensors[11],
                         args->tensors[12], args->tensors[13], args->tensors[14],
                         args->tensors[15], args->tensors[16], stream)
