// The sequence passes' matrix products, by cuBLAS or by lltm_ffi's own kernels
// (product), and the gradient of the hidden weights (hidden_weight_grads).

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
};

// Each block's old states (blockIdx.y: its index in `blocks`) copied into
// `previous` beside its rows of d_gates: row gate_row + k of previous is
// row state_row + k of h0 (initial) or of the outputs, rows of row_units
// copies of Unit each.
template <typename Unit>
__global__ void lltm_gather_states_kernel(const int64_t row_units, const StateBlocks blocks,
                                          const Unit* __restrict__ h0,
                                          const Unit* __restrict__ outputs,
                                          Unit* __restrict__ previous) {
  const int b = blockIdx.y;
  const Unit* from = (blocks.initial[b] ? h0 : outputs) + blocks.state_row[b] * row_units;
  Unit* to = previous + blocks.gate_row[b] * row_units;
  CUDA_KERNEL_LOOP(i, blocks.rows[b] * row_units) { to[i] = from[i]; }
}

// The walk's old states gathered into `previous` (lltm_gather_states_kernel),
// kMax blocks of them a launch, in 16-byte copies where the rows and the
// tensors allow them. A launch's blocks each copy kGatherBlocks x
// CAFFE_CUDA_NUM_THREADS units at a time.
static const int kGatherBlocks = 32;

template <typename Dtype>
static int gather_states(cudaStream_t stream, const lltm_walk& walk, int64_t state_size,
                          const Dtype* h0, const Dtype* outputs, Dtype* previous) {
  const bool vectors = state_size * sizeof(Dtype) % 16 == 0 &&
                       (reinterpret_cast<uintptr_t>(h0) | reinterpret_cast<uintptr_t>(outputs) |
                        reinterpret_cast<uintptr_t>(previous)) % 16 == 0;
  const int64_t row_units = vectors ? state_size * (int64_t)sizeof(Dtype) / 16 : state_size;
  lltm_block_cursor cursor = lltm_first_block(&walk);
  lltm_state_block block;
  StateBlocks blocks;
  int count = 0;
  int64_t most_rows = 0;
  bool more = lltm_next_block(&walk, &cursor, &block);
  while (more) {
    blocks.gate_row[count] = block.gate_row;
    blocks.state_row[count] = block.state_row;
    blocks.rows[count] = block.rows;
    blocks.initial[count] = block.initial;
    most_rows = block.rows > most_rows ? block.rows : most_rows;
    more = lltm_next_block(&walk, &cursor, &block);
    if (++count < StateBlocks::kMax && more) continue;
    const int x = CAFFE_GET_BLOCKS(most_rows * row_units);
    const dim3 grid(x < kGatherBlocks ? x : kGatherBlocks, count);
    if (vectors) {
      lltm_gather_states_kernel<uint4><<<grid, CAFFE_CUDA_NUM_THREADS, 0, stream>>>(
          row_units, blocks, reinterpret_cast<const uint4*>(h0),
          reinterpret_cast<const uint4*>(outputs), reinterpret_cast<uint4*>(previous));
    } else {
      lltm_gather_states_kernel<Dtype><<<grid, CAFFE_CUDA_NUM_THREADS, 0, stream>>>(
          row_units, blocks, h0, outputs, previous);
    }
    CUDA_POST_KERNEL_CHECK;
    count = 0;
    most_rows = 0;
  }
  return LLTM_SUCCESS;
}

// The hidden columns of d_weights: d_gates^T times each step's old h. Dense
// steps' old states lie in two blocks (lltm_state_block), h0's rows and
// the outputs': a product each, the second adding. Packed steps' lie in a
// block or two a step: they are gathered into `previous` (rows, state),
// beside their rows of d_gates, for one product, as many launches as a
// copy takes and d_weights rounded once (a product a block would round a
// 16-bit d_weights once a block; two bidirectional bfloat16 layers trained
// on a packed batch, 64x256x256x512 on an H200, at 169 to 206 us a step
// with a kernel that summed the blocks in float, 74 to 91 so). Zeros
// where no step has a row.
template <typename Dtype>
int hidden_weight_grads(bool cublas, cudaStream_t stream, const lltm_walk& walk,
                        int64_t state_size, int64_t columns, const Dtype* d_gates,
                        const Dtype* h0, const Dtype* outputs, Dtype* previous,
                        Dtype* d_weights) {
  const int64_t gates_size = 3 * state_size;
  if (walk.batch_sizes) {
    const int code = gather_states<Dtype>(stream, walk, state_size, h0, outputs, previous);
    if (code != LLTM_SUCCESS) return code;
    return product<Dtype>(cublas, stream, gates_size, state_size, walk.rows, d_gates, gates_size,
                          true, previous, state_size, false, false, d_weights, columns);
  }
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
                                          Dtype*, Dtype*);
LLTM_FOR_EVERY_DTYPE(LLTM_INSTANTIATE)
