// One step of the cell in lltm_ffi's own kernels, Caffe style: how
// lltm_ffi.lltm's eager call (and lltm_sequence's of one step) runs on a
// GPU while its gate product is small (cell.py's uses_step_kernels). There
// a step's time is the host's launches more than the GPU's arithmetic, so
// the forward pass is one kernel (the gate product, the cell its epilogue)
// and the backward pass two (the cell's backward, cublas_loop_kernel.cu's,
// then one product here for the gradients of the weights and the bias),
// three where the gradients of old_h or the input are wanted (one more
// product).
// Computing the gate gradients inside the product instead, to save the
// first launch, measured no faster on an H100 (each tile of columns
// recomputes them).
//
// Layout as in sequence_kernel.cu: input (batch, input_features), old_h,
// old_cell, new_h, new_cell (batch, state), gates and d_gates (batch,
// 3 * state), weights (3 * state, state + input_features) with the columns
// of old_h first, all dense. Indices are ints: the passes take no tensor of
// more than kMaxElements (2^30) elements, as cell.py's rule keeps them, and
// 64-bit index arithmetic would cost the products a large share of their
// instructions.
//
// The products run in the math type (lltm_math.cuh: float for the 16-bit
// element types): the operands convert each element as they read it, the
// tiles in shared memory and the sums hold the math type, and the epilogues
// round once, as they store.

#include "caffe_cuda_macro.h"
#include "lltm_cell.h"
#include "lltm_kernels.h"
#include "lltm_op.h"

// The product kernel: a block of kThreads computes a tile of C = A B, each
// thread kRows x kColumns of it, over slices kDepth deep staged in shared
// memory; the next slice is read into registers while the block works on
// this one. kColumns is 3 so that in the forward pass a thread holds the
// three gates of a state column for the cell; kRows is 4 or 2
// (launch_product says which).
static const int kThreadsX = 16, kThreadsY = 16, kThreads = kThreadsX * kThreadsY;
static const int kColumns = 3, kTileColumns = kThreadsX * kColumns;
static const int kDepth = 16;

template <int kRows>
struct Tile {
  static const int kTileRows = kThreadsY * kRows;
};

// The operands, read by (row, column) of the product's A (m x k) or B (k x
// n), each element in the math type Math; kAlongColumns: consecutive columns
// are adjacent in memory (else consecutive rows), which decides how a tile
// is staged so that neighbouring threads read neighbouring addresses.

// [old_h, input] (batch, state + input_features), columns from `first` on;
// its column state + input_features is all ones (for the bias's gradient).
template <typename Dtype>
struct StepInputs {
  typedef math_t<Dtype> Math;
  static const bool kAlongColumns = true;
  const Dtype* old_h;
  const Dtype* input;
  int state_size, input_features, first;
  __device__ Math operator()(int row, int column) const {
    column += first;
    if (column < state_size) return to_math(old_h[row * state_size + column]);
    column -= state_size;
    return column < input_features ? to_math(input[row * input_features + column]) : Math(1);
  }
};

// The weights transposed (state + input_features, 3 * state), its columns
// ordered by state column, then gate: column 3 c + g is row g state + c of
// the weights.
template <typename Dtype>
struct GateWeights {
  typedef math_t<Dtype> Math;
  static const bool kAlongColumns = false;
  const Dtype* weights;
  int state_size, row_length;
  __device__ Math operator()(int row, int column) const {
    return to_math(weights[((column % 3) * state_size + column / 3) * row_length + row]);
  }
};

// The weights (3 * state, state + input_features), columns from `first` on.
template <typename Dtype>
struct Weights {
  typedef math_t<Dtype> Math;
  static const bool kAlongColumns = true;
  const Dtype* weights;
  int row_length, first;
  __device__ Math operator()(int row, int column) const {
    return to_math(weights[row * row_length + first + column]);
  }
};

// d_gates (batch, 3 * state), or its transpose.
template <typename Dtype, bool kTransposed>
struct GateGradients {
  typedef math_t<Dtype> Math;
  static const bool kAlongColumns = !kTransposed;
  const Dtype* d_gates;
  int gates_size;
  __device__ Math operator()(int row, int column) const {
    return to_math(kTransposed ? d_gates[column * gates_size + row]
                               : d_gates[row * gates_size + column]);
  }
};

// A slice of an operand, kDepth deep and kExtent wide at (k0, start): for
// A, rows start + e and columns k0 + d; for B, rows k0 + d and columns
// start + e; zeros outside the operand. read() takes it into registers
// (consecutive threads at neighbouring addresses), write() into
// tile[d][e].
template <typename Math, int kExtent, bool kIsA, typename Operand>
struct Slice {
  static const int kCount = kDepth * kExtent / kThreads;
  // Consecutive threads take consecutive depths of one element where the
  // operand's depth runs along memory.
  static const bool kAlongDepth = kIsA == Operand::kAlongColumns;
  Math values[kCount];

  __device__ __forceinline__ static void place(int i, int* d, int* e) {
    *d = kAlongDepth ? i % kDepth : i / kExtent;
    *e = kAlongDepth ? i / kDepth : i % kExtent;
  }
  __device__ __forceinline__ void read(const Operand& operand, int start, int extent, int k0,
                                       int depth) {
#pragma unroll
    for (int l = 0; l < kCount; ++l) {
      int d, e;
      place(threadIdx.x + l * kThreads, &d, &e);
      const int position = start + e, k = k0 + d;
      values[l] = position < extent && k < depth
          ? (kIsA ? operand(position, k) : operand(k, position)) : Math(0);
    }
  }
  template <int kStride>
  __device__ __forceinline__ void write(Math (*tile)[kStride]) const {
#pragma unroll
    for (int l = 0; l < kCount; ++l) {
      int d, e;
      place(threadIdx.x + l * kThreads, &d, &e);
      tile[d][e] = values[l];
    }
  }
};

// kRows consecutive values of a shared-memory row, 16-byte aligned for
// four floats.
template <int kRows, typename Math>
__device__ __forceinline__ void read_rows(const Math* row, Math (&values)[kRows]) {
  if (kRows == 2 && sizeof(Math) == sizeof(float)) {
    const float2 packed = *reinterpret_cast<const float2*>(row);
    values[0] = (Math)packed.x;
    values[kRows - 1] = (Math)packed.y;
  } else if (kRows == 4 && sizeof(Math) == sizeof(float)) {
    const float4 packed = *reinterpret_cast<const float4*>(row);
    const float unpacked[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
    for (int i = 0; i < kRows; ++i) values[i] = (Math)unpacked[i];
  } else {
#pragma unroll
    for (int i = 0; i < kRows; ++i) values[i] = row[i];
  }
}

// C = A B (m x n, depth k) in the math type Math, each thread's kRows x
// kColumns handed to epilogue(row, first column, values) for rows below m;
// the epilogue checks its columns against n.
template <typename Math, int kRows, typename A, typename B, typename Epilogue>
__global__ void __launch_bounds__(kThreads) lltm_step_product_kernel(
    const int m, const int n, const int k, const A a, const B b, const Epilogue epilogue) {
  const int kTileRows = Tile<kRows>::kTileRows;
  // Padding: rows of a_tile stay 16-byte aligned, and slices staged along
  // the depth write each row's elements into different banks.
  __shared__ __align__(16) Math a_tile[kDepth][kTileRows + 4];
  __shared__ Math b_tile[kDepth][kTileColumns + 1];
  const int tx = threadIdx.x % kThreadsX, ty = threadIdx.x / kThreadsX;
  const int column_tiles = (n + kTileColumns - 1) / kTileColumns;
  const int tiles = (m + kTileRows - 1) / kTileRows * column_tiles;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int row0 = tile / column_tiles * kTileRows;
    const int column0 = tile % column_tiles * kTileColumns;
    Slice<Math, kTileRows, true, A> a_slice;
    Slice<Math, kTileColumns, false, B> b_slice;
    a_slice.read(a, row0, m, 0, k);
    b_slice.read(b, column0, n, 0, k);
    Math sums[kRows][kColumns] = {};
    for (int k0 = 0; k0 < k; k0 += kDepth) {
      a_slice.write(a_tile);
      b_slice.write(b_tile);
      __syncthreads();
      if (k0 + kDepth < k) {
        a_slice.read(a, row0, m, k0 + kDepth, k);
        b_slice.read(b, column0, n, k0 + kDepth, k);
      }
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        Math a_values[kRows], b_values[kColumns];
        read_rows<kRows>(&a_tile[d][ty * kRows], a_values);
#pragma unroll
        for (int j = 0; j < kColumns; ++j) b_values[j] = b_tile[d][tx * kColumns + j];
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
#pragma unroll
          for (int j = 0; j < kColumns; ++j) sums[i][j] += a_values[i] * b_values[j];
        }
      }
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int row = row0 + ty * kRows + i;
      if (row < m) epilogue(row, column0 + tx * kColumns, sums[i]);
    }
  }
}

template <int kRows>
static int tile_count(int m, int n) {
  const int tile_rows = Tile<kRows>::kTileRows;
  return (m + tile_rows - 1) / tile_rows * ((n + kTileColumns - 1) / kTileColumns);
}

template <typename Math, int kRows, typename A, typename B, typename Epilogue>
static cudaError_t launch_tiles(int m, int n, int k, const A& a, const B& b,
                               const Epilogue& epilogue, cudaStream_t stream) {
  const int tiles = tile_count<kRows>(m, n);
  const int blocks = tiles < CAFFE_MAXIMUM_NUM_BLOCKS ? tiles : CAFFE_MAXIMUM_NUM_BLOCKS;
  lltm_step_product_kernel<Math, kRows><<<blocks, kThreads, 0, stream>>>(m, n, k, a, b,
                                                                         epilogue);
  CUDA_POST_KERNEL_CHECK;
  return cudaSuccess;
}

// Tiles of 64 rows where they still give a block to every multiprocessor
// twice over on the largest GPUs (132 on an H100), else of 32: on an H100
// at 256x256x512 the forward product took 43 us in 256 tiles of 32 rows,
// the weights' gradient 37 us in 408 tiles of 64; tiles of 128 rows made
// both slower. The product runs in A's math type, which is B's.
template <typename A, typename B, typename Epilogue>
static cudaError_t launch_product(int m, int n, int k, const A& a, const B& b,
                                  const Epilogue& epilogue, cudaStream_t stream) {
  typedef typename A::Math Math;
  static_assert(std::is_same<Math, typename B::Math>::value, "one math type a product");
  if (m == 0 || n == 0) return cudaSuccess;
  if (tile_count<4>(m, n) >= 256) return launch_tiles<Math, 4>(m, n, k, a, b, epilogue, stream);
  return launch_tiles<Math, 2>(m, n, k, a, b, epilogue, stream);
}

// The forward pass's epilogue: the three gates of state column
// first_column / 3 of a batch row, plus the bias, kept in gates, then the
// cell. The cell takes the pre-activations as gates keeps them (rounded, for
// a 16-bit type), as the backward pass, which recomputes from gates, does.
template <typename Dtype>
struct CellEpilogue {
  typedef math_t<Dtype> Math;
  int state_size;
  const Dtype* bias;
  const Dtype* old_cell;
  Dtype* new_h;
  Dtype* new_cell;
  Dtype* gates;
  __device__ void operator()(int row, int first_column, const Math (&values)[kColumns]) const {
    const int column = first_column / 3;
    if (column >= state_size) return;
    const int element = row * state_size + column, gate = row * 3 * state_size + column;
    Math pre[3];
#pragma unroll
    for (int g = 0; g < 3; ++g) {
      const Dtype kept = to_storage<Dtype>(values[g] + to_math(bias[g * state_size + column]));
      gates[gate + g * state_size] = kept;
      pre[g] = to_math(kept);
    }
    Math h, cell;
    cell_forward_(pre[0], pre[1], pre[2], to_math(old_cell[element]), &h, &cell);
    new_h[element] = to_storage<Dtype>(h);
    new_cell[element] = to_storage<Dtype>(cell);
  }
};

// A backward product's columns first to last - 1 split between two
// outputs, either of which may be NULL: those below `split` to `low` (rows
// low_length long), the rest to `high` (rows high_length long, from its
// column 0). The weights' gradient (row: a gate row) is `low` beside the
// bias's (the ones column, one long); old_h's (row: a batch row) is `low`
// beside the input's.
template <typename Dtype>
struct SplitEpilogue {
  int first, last, split;
  Dtype* low;
  int low_length;
  Dtype* high;
  int high_length;
  __device__ void operator()(int row, int first_column,
                             const math_t<Dtype> (&values)[kColumns]) const {
#pragma unroll
    for (int j = 0; j < kColumns; ++j) {
      const int column = first + first_column + j;
      if (column >= last) return;
      if (column < split) {
        if (low) low[row * low_length + column] = to_storage<Dtype>(values[j]);
      } else if (high) {
        high[row * high_length + column - split] = to_storage<Dtype>(values[j]);
      }
    }
  }
};

template <typename Dtype>
static cudaError_t launch_step_forward(int batch_size, int input_features, int state_size,
                                       const void* input,
                                       const void* weights, const void* bias, const void* old_h,
                                       const void* old_cell, void* new_h, void* new_cell,
                                       void* gates, cudaStream_t stream) {
  const StepInputs<Dtype> x = {as<Dtype>(old_h), as<Dtype>(input), state_size, input_features, 0};
  const GateWeights<Dtype> w = {as<Dtype>(weights), state_size, state_size + input_features};
  const CellEpilogue<Dtype> cell = {state_size,       as<Dtype>(bias),     as<Dtype>(old_cell),
                                    as<Dtype>(new_h), as<Dtype>(new_cell), as<Dtype>(gates)};
  return launch_product(batch_size, 3 * state_size, state_size + input_features, x, w, cell,
                        stream);
}

// A step's argument gradients from its gate gradients (d_gates, which
// cublas_loop_kernel.cu's cell backward pass wrote): one product for those of
// the weights and the bias (the ones column of StepInputs), one for those
// of old_h and the input, each where wanted.
template <typename Dtype>
static cudaError_t launch_step_gradients(int batch_size, int input_features, int state_size,
                                         const void* input, const void* weights,
                                         const void* old_h, const void* d_gates, void* d_input,
                                         void* d_weights, void* d_bias, void* d_old_h,
                                         cudaStream_t stream) {
  const int gates_size = 3 * state_size, row_length = state_size + input_features;
  cudaError_t status = cudaSuccess;
  if (d_weights || d_bias) {
    const int first = d_weights ? 0 : row_length;
    const int columns = (d_weights ? row_length : 0) + (d_bias ? 1 : 0);
    const GateGradients<Dtype, true> g = {as<Dtype>(d_gates), gates_size};
    const StepInputs<Dtype> x = {as<Dtype>(old_h), as<Dtype>(input), state_size, input_features,
                                 first};
    const SplitEpilogue<Dtype> epilogue = {first, first + columns, row_length,
                                           as<Dtype>(d_weights), row_length,
                                           as<Dtype>(d_bias), 1};
    status = launch_product(gates_size, columns, batch_size, g, x, epilogue, stream);
  }
  if (status == cudaSuccess && (d_old_h || d_input)) {
    const int first = d_old_h ? 0 : state_size;
    const int last = d_input ? row_length : state_size;
    const GateGradients<Dtype, false> g = {as<Dtype>(d_gates), gates_size};
    const Weights<Dtype> w = {as<Dtype>(weights), row_length, first};
    const SplitEpilogue<Dtype> epilogue = {first, last, state_size,
                                           as<Dtype>(d_old_h), state_size,
                                           as<Dtype>(d_input), input_features};
    status = launch_product(batch_size, last - first, gates_size, g, w, epilogue, stream);
  }
  return status;
}

// The largest tensor of a step the passes take: every index fits an int.
static const int64_t kMaxElements = int64_t(1) << 30;

static bool step_fits(int64_t batch_size, int64_t input_features, int64_t state_size) {
  const int64_t row_length = state_size + input_features, gates_size = 3 * state_size;
  return batch_size * row_length <= kMaxElements && batch_size * gates_size <= kMaxElements &&
         gates_size * row_length <= kMaxElements;
}

template <typename Dtype>
static int step_forward(int64_t batch_size, int64_t input_features, int64_t state_size,
                        void* const* tensors, cudaStream_t stream) {
  if (!step_fits(batch_size, input_features, state_size)) return LLTM_ERROR_ARGUMENTS;
  return launch_step_forward<Dtype>((int)batch_size, (int)input_features, (int)state_size,
                                    tensors[0], tensors[1], tensors[2], tensors[3], tensors[4],
                                    tensors[5], tensors[6], tensors[7], stream);
}

// The cell's backward pass (d_gates and d_old_cell), then the products.
template <typename Dtype>
static int step_backward(int64_t batch_size, int64_t input_features, int64_t state_size,
                         const int64_t* grad_strides, void* const* tensors, cudaStream_t stream) {
  if (!step_fits(batch_size, input_features, state_size)) return LLTM_ERROR_ARGUMENTS;
  void* d_gates = tensors[7];
  const cudaError_t status = lltm_launch_step_gates_backward(
      lltm_dtype_of<Dtype>(), batch_size, state_size, grad_strides, tensors[5], tensors[6],
      tensors[3], tensors[4], tensors[12], d_gates, stream);
  if (status != cudaSuccess) return status;
  return launch_step_gradients<Dtype>((int)batch_size, (int)input_features, (int)state_size,
                                      tensors[0], tensors[1], tensors[2], d_gates, tensors[8],
                                      tensors[9], tensors[10], tensors[11], stream);
}

// The passes, in the argument order of their declarations in cell.py; every
// element type.
LLTM_CUDA_PASS_WITH_HALF(step_forward, step_forward, args->sizes[0], args->sizes[1],
                         args->sizes[2], args->tensors, stream)
LLTM_CUDA_PASS_WITH_HALF(step_backward, step_backward, args->sizes[0], args->sizes[1],
                         args->sizes[2], args->sizes + 3, args->tensors, stream)
