// The sequence passes' matrix products, by cuBLAS or by lltm_ffi's own kernels
// (product), and the gradient of the hidden weights, whose 16-bit packed walks
// sum every block of steps in float (hidden_weight_grads).

#include "lltm_cublas.h"
#include "lltm_recurrence.cuh"

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
int product(bool cublas, cudaStream_t stream, int64_t m, int64_t n, int64_t k,
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
int hidden_weight_grads(bool cublas, cudaStream_t stream, const lltm_walk& walk,
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

// What the other files of the recurrence call (lltm_recurrence.cuh), for
// every element type.
#define LLTM_INSTANTIATE(Dtype)                                                              \
  template int product<Dtype>(bool, cudaStream_t, int64_t, int64_t, int64_t, const Dtype*,   \
                              int64_t, bool, const Dtype*, int64_t, bool, bool, Dtype*,      \
                              int64_t);                                                      \
  template int hidden_weight_grads<Dtype>(bool, cudaStream_t, const lltm_walk&, int64_t,     \
                                          int64_t, const Dtype*, const Dtype*, const Dtype*, \
                                          Dtype*);
LLTM_FOR_EVERY_DTYPE(LLTM_INSTANTIATE)
