// The recurrence of a dense sequence pass held in thread-block clusters
// (compute capability 9.0 and newer): its plan (lltm_cluster.h), which the
// plan of a pass (src/plan.c) asks for, and its launch, launch_clusters,
// with the arguments the persistent kernels take too (lltm_recurrence.cuh).
//
// Why clusters. The persistent kernels (persistent_kernel.cu) synchronise the
// whole grid once a step (about 1.1 us on an H200) and stage the whole
// state from global memory every step; and two cooperative launches on two
// streams are serialised by the driver, so the two directions of a
// bidirectional layer cannot overlap. A cluster launch is an ordinary
// launch: two of them run at once, and the state travels between the
// blocks' shared memories (distributed shared memory), never through global
// memory, each block waiting only for the values it needs.
//
// Layout. A cluster of C blocks runs the whole sequence of R batch rows
// (rows are independent in the recurrence, so clusters never wait for one
// another: grid = C x ceil(batch / R)). Block r of a cluster owns state
// columns [r P, (r + 1) P), P = ceil(state / C), and holds in registers
// the hidden weights those columns need, loaded once a pass: forward, the
// rows of their three gates (3P x state); backward, the columns of W_h
// they are (3 state x P). A warp owns kColumns (2, or 1 where a row is
// long) of the block's columns, each lane a kWidth-element vector (float4,
// double2) of every kChunks of a weight row, interleaved so that the warp's
// vector loads of the shared state are consecutive (no bank conflicts).
//
// A forward step, in each block: every warp takes the dot products of its
// columns' 3 x kColumns weight rows with the R rows of the previous h,
// which every block holds whole in shared memory (double-buffered); sums
// them over the warp (warp_reduce_scatter: each lane ends with one of the
// warp's sums, in fewer shuffles than reducing each sum alone); then every
// lane computes the cell of one (row, column) element of the warp's, the
// same element in 32 / (R kColumns) lanes (the redundant copies cost
// nothing in SIMT and let the pushes below fan out): the step's input part
// of the gates was read kPrefetch steps ahead, the old cell is kept in a
// register across steps. The new h goes to the other buffer of every block
// of the cluster (st.async, a lane a destination), each push counting its
// bytes into that block's mailbox (ClusterMailbox): a block starts the
// next step once the whole new state has landed in it, and no block waits
// for another's arrival at a barrier, nor for its own global writes (the
// gates, outputs and cells, issued after the pushes). The double buffer
// makes that enough: a block pushes into a buffer at step n + 1 only after
// the whole state of step n reached it, which every block sent after
// reading that buffer at step n.
//
// A backward step: every block owns the d_gates of its columns' three
// gates (the cell's backward pass needs only its own element's d_h and
// d_cell); it pushes its R x 3P d_gates to every block, so that each holds
// the whole R x 3 state of them, and each computes d_h for its own columns
// (the dot products with its 3 state x P slice of W_h) at the next step.
// The other scheme, each block's partial products over its own gates
// reduce-scattered to the columns' owners, moves a third of the data but
// needs the block's d_gates shared among its warps first: a second barrier
// a step, which costs more than the bytes it saves.
//
// Cost per step, measured on an H200 at T=1024 B=16 S=128 float32 (the
// kernels alone, microseconds, forward and backward): 1.46 and 1.47 with
// a cluster barrier a step; 0.94 and 0.99 with the mailboxes and four
// steps read ahead; 0.71 and 0.72 of that without the cell's math. Registers
// (nvcc 13.0, sm_90, -Xptxas -v): up to 108 forward and the cap of 128
// backward for float at a row a cluster; the cap for double at 4 rows; one
// spill of 4 bytes, in float's backward kernel of two chunks (a state of 129
// to 256) at a row a cluster, none in the other 29 kernels.
//
// Element types: Dtype is the storage type, Math (ClusterMath) the type of
// the arithmetic, the state exchanged and the weights held: the same for
// float and double, float for __half and __nv_bfloat16. The
// state and gradients exchanged are rounded to Dtype first, so that the
// recurrence reads what the tensors saved for the backward pass hold.
//
// Only sm_90 and newer run these kernels: their bodies are compiled only
// there (LLTM_CLUSTER_PTX), empty for older targets, and the plan never
// chooses them on a device older than 9.0 or where the module's code for
// them was compiled for an older target.

#include <limits.h>

#include "lltm_cluster_ptx.cuh"
#include "lltm_plan_queries.cuh"
#include "lltm_recurrence.cuh"

// The plan's thresholds. Measured on an H200 (lltm_sequence forward and
// backward in float32, F = 32, microseconds a step: the cluster kernels,
// then the paths without them (LLTM_CLUSTER=0), then nn.GRU): T=64 B=16
// S=128 6.8, 12.9, 15.3; B=64 S=128 8.6, 16.7, 13.0; B=16 S=256 11.3,
// 16.1, 37.5; T=1024 B=16 S=128 1.8, 9.1, 2.5; B=1 S=128 13.0, 13.4, 19.7
// and B=16 S=32 12.0, 11.6, 16.0, where the host's time per call dominates
// either way. Where one wave of clusters does not hold the batch (B=128
// and 256 at S=128, B=64 at S=256) the plan keeps the other paths.
//
// Columns a block: 16, so that S=128 takes a cluster of 8 (portable).
static const int kClusterBlockColumns = 16;
// Clusters up to this size are portable; larger ones (to kClusterMaxSize)
// only where a block's weights would not fit in registers otherwise.
static const int kClusterPortableSize = 8;
static const int kClusterMaxSize = 16;
// The largest state the weights-in-registers scheme takes: 256 is 48
// registers of weights a lane in a block of at most kClusterMaxThreads.
static const int64_t kClusterMaxState = 256;
// float16 and bfloat16 forward passes take the tensor-core kernel
// (cluster_mma_kernel.cu) past kClusterMaxState, to this state: a block's
// weights there, 221 KB, half in its warps' registers and half in shared
// memory; at a state of 1024 they would be 393 KB.
static const int64_t kClusterMmaMaxState = 768;
// One step already gains: it saves the cuBLAS loop's launches.
static const int64_t kClusterMinSteps = 1;
// One wave of clusters at most: past one, each wave would run the whole
// sequence after the one before.
static const int kClusterMaxWaves = 1;

// Steps whose inputs a lane reads ahead: a read from global memory takes
// longer than a step. On an H200 at T=1024 B=16 S=128 (float32, forward and
// backward kernels, microseconds a step): one step ahead 0.99 and 1.19, four
// 0.94 and 0.99. Double takes one step: its weights leave no registers for
// more.
template <typename Math>
__host__ __device__ constexpr int cluster_prefetch() { return sizeof(Math) == 8 ? 1 : 4; }

// A block's threads at most: 16 warps of kColumns columns each. Registers
// are then at most 128 a thread (__launch_bounds__).
static const int kClusterMaxThreads = 512;

namespace {

// The arithmetic's type for a storage type (see the header comment).
template <typename Dtype>
struct ClusterMath {
  typedef Dtype type;
};
template <>
struct ClusterMath<__half> {
  typedef float type;
};
template <>
struct ClusterMath<__nv_bfloat16> {
  typedef float type;
};

}  // namespace

// Columns a warp owns, by kChunks (vectors a lane holds of each weight row):
// 2, or 1 for 4 chunks, so that a lane's weights are 24 or 48 registers
// (3 gates x kColumns x kChunks x kWidth elements).
__host__ __device__ constexpr int cluster_warp_columns(int chunks) { return chunks <= 2 ? 2 : 1; }

// The layout of the kernels of kChunks chunks and kRows rows a cluster for
// the storage type Dtype (see the header comment): the arithmetic's type,
// and the sizes both kernels build on (a lane reads the shared state a
// Vector<Math> at a time, kWidth elements).
template <typename Dtype, int kChunks, int kRows>
struct ClusterLayout {
  typedef typename ClusterMath<Dtype>::type Math;
  static constexpr int kWidth = Vector<Math>::kWidth;
  static constexpr int kColumns = cluster_warp_columns(kChunks);
  static constexpr int kElements = kColumns * kRows;  // a warp's (row, column) elements
  static constexpr int kSpan = kChunks * 32 * kWidth;  // a state row in shared memory
  static constexpr int kPrefetch = cluster_prefetch<Math>();
};

#if LLTM_CLUSTER_PTX

// One level of warp_reduce_scatter: lanes whose bit `offset` is set keep
// the upper half of their kCount values, the others the lower half, each
// adding its partner's copy of the half it keeps (one shuffle a kept value).
template <int kCount, int kHalf>
struct ReduceLevel {
  template <typename T>
  static __device__ __forceinline__ void run(T (&values)[kCount], int lane) {
    const int offset = 32 * kHalf / kCount;
    const bool upper = (lane & offset) != 0;
#pragma unroll
    for (int i = 0; i < kHalf; ++i) {
      const T send = upper ? values[i] : values[i + kHalf];
      const T keep = upper ? values[i + kHalf] : values[i];
      values[i] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
    }
    ReduceLevel<kCount, kHalf / 2>::run(values, lane);
  }
};

template <int kCount>
struct ReduceLevel<kCount, 0> {
  template <typename T>
  static __device__ __forceinline__ void run(T (&)[kCount], int) {}
};

// The sums over the warp's 32 lanes of each of kCount values (a power of two,
// at most 32): lane l ends with sum number l / (32 / kCount), returned.
// kCount - 1 + log2(32 / kCount) shuffles instead of 5 kCount.
template <int kCount, typename T>
__device__ __forceinline__ T warp_reduce_scatter(T (&values)[kCount], int lane) {
  static_assert(kCount >= 1 && kCount <= 32 && (kCount & (kCount - 1)) == 0,
                "a power of two, at most a warp");
  ReduceLevel<kCount, kCount / 2>::run(values, lane);
  T sum = values[0];
#pragma unroll
  for (int offset = 16 / kCount; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  }
  return sum;
}

// A lane that holds sum number `index` after warp_reduce_scatter<kCount>.
template <int kCount>
__device__ __forceinline__ int holder_of(int index) {
  return index * (32 / kCount);
}

#endif  // LLTM_CLUSTER_PTX

// Where a lane is in the layout (see the header comment): its block's
// columns, its warp's first column, and the (row, column) element whose
// cell it computes, the lane's element.
template <int kColumns, int kRows>
struct ClusterLane {
  int lane;
  unsigned rank, blocks;
  int64_t block_columns;  // P
  int64_t warp_column;    // the warp's first column among its block's
  int64_t first_column;   // the warp's first column among the state's
  int64_t first_row;      // the cluster's first batch row
  int64_t rows;           // the cluster's rows that are the batch's
  int element, unit, row_offset;
  int64_t column, row;
  bool active;  // its element is the state's and the batch's

#if LLTM_CLUSTER_PTX
  __device__ ClusterLane(int64_t state_size, int64_t batch_size)
      : lane((int)(threadIdx.x % 32)), rank(cluster_rank()), blocks(cluster_blocks()),
        block_columns((state_size + blocks - 1) / blocks),
        warp_column((int64_t)(threadIdx.x / 32) * kColumns),
        first_column(rank * block_columns + warp_column),
        first_row((int64_t)cluster_index() * kRows),
        rows(batch_size - first_row < kRows ? batch_size - first_row : kRows),
        element(lane % (kColumns * kRows)),
        unit(element % kColumns), row_offset(element / kColumns), column(first_column + unit),
        row(first_row + row_offset),
        active(owns(unit, state_size) && row < batch_size) {}
#endif

  // Whether the warp's column `u` is one of its block's and of the state's.
  __device__ bool owns(int u, int64_t state_size) const {
    return warp_column + u < block_columns && first_column + u < state_size;
  }
};

// This lane's vectors of the hidden weights its warp's columns need, loaded
// once a pass: w[u][g][c][v] = weight(u, g, k) for column u, gate g and
// state element k = (lane + 32 c) kWidth + v; zero past the state and for a
// column that is not the block's.
template <int kColumns, int kRows, int kChunks, int kWidth, typename Math, typename Weight>
__device__ __forceinline__ void load_lane_weights(const ClusterLane<kColumns, kRows>& at,
                                                  int64_t state_size,
                                                  Math (&w)[kColumns][3][kChunks][kWidth],
                                                  Weight weight) {
#pragma unroll
  for (int u = 0; u < kColumns; ++u) {
    const bool owned = at.owns(u, state_size);
#pragma unroll
    for (int g = 0; g < 3; ++g) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
#pragma unroll
        for (int v = 0; v < kWidth; ++v) {
          const int64_t k = (int64_t)(at.lane + 32 * c) * kWidth + v;
          w[u][g][c][v] = owned && k < state_size ? weight(u, g, k) : Math(0);
        }
      }
    }
  }
}

// The forward recurrence (ForwardRecurrence, lltm_recurrence.cuh): the
// layout and the step as the header comment says; cells NULL, the
// outputs alone written (the cell stays in its register). Shared memory:
// the state of the cluster's rows, twice (kRows rows of kSpan elements
// each).
template <typename Dtype, int kChunks, int kRows>
__global__ void __launch_bounds__(kClusterMaxThreads, 1) lltm_sequence_forward_cluster_kernel(
    const int64_t steps, const int64_t batch_size, const int64_t state_size,
    const int64_t weights_row_stride, const int reverse, const Dtype* __restrict__ bias,
    const Dtype* __restrict__ weights, const Dtype* __restrict__ h0,
    const Dtype* __restrict__ c0, Dtype* outputs, Dtype* cells, Dtype* gates, Dtype* final_h,
    Dtype* final_cell) {
#if LLTM_CLUSTER_PTX
  typedef ClusterLayout<Dtype, kChunks, kRows> Layout;
  typedef typename Layout::Math Math;
  extern __shared__ __align__(16) unsigned char shared[];
  Math* buffers = reinterpret_cast<Math*>(shared);
  const int kSums = 4 * Layout::kElements;  // a warp's gate sums, 3 used of each 4
  const ClusterLane<Layout::kColumns, kRows> at(state_size, batch_size);
  const int64_t gates_size = 3 * state_size;

  // Row g * state + column of W_h, this lane's vectors of it.
  Math w[Layout::kColumns][3][kChunks][Layout::kWidth];
  load_lane_weights(at, state_size, w, [&](int u, int g, int64_t k) {
    return static_cast<Math>(
        weights[(g * state_size + at.first_column + u) * weights_row_stride + k]);
  });
  // Buffer 0 holds h0's rows; everything else (the columns past the state,
  // rows past the batch) zeros, which stay so.
  for (int i = threadIdx.x; i < 2 * kRows * Layout::kSpan; i += blockDim.x) {
    const int64_t row = at.first_row + i / Layout::kSpan % kRows, k = i % Layout::kSpan;
    buffers[i] = i < kRows * Layout::kSpan && k < state_size && row < batch_size
        ? static_cast<Math>(h0[row * state_size + k]) : Math(0);
  }
  Math bias_of[3];
#pragma unroll
  for (int g = 0; g < 3; ++g) {
    bias_of[g] = at.active && bias ? static_cast<Math>(bias[g * state_size + at.column]) : Math(0);
  }
  // The input part of the gates of the step at `order`, as stored: they are
  // converted where used, kPrefetch steps later.
  auto load_inputs = [&](int64_t order, Dtype(&values)[3]) {
    const int64_t t = reverse ? steps - 1 - order : order;
    const int64_t gate = (t * batch_size + at.row) * gates_size + at.column;
#pragma unroll
    for (int g = 0; g < 3; ++g) values[g] = at.active ? gates[gate + g * state_size] : Dtype(0);
  };
  Dtype ahead[Layout::kPrefetch][3];
#pragma unroll
  for (int j = 0; j < Layout::kPrefetch; ++j) {
    if (j < steps) load_inputs(j, ahead[j]);
  }
  Math cell = at.active ? static_cast<Math>(c0[at.row * state_size + at.column]) : Math(0);
  // Exchange n (the new h of step n) happens for every step but the last.
  const ClusterMailbox mailbox = {
      reinterpret_cast<uint64_t*>(buffers + 2 * kRows * Layout::kSpan),
      (unsigned)(at.rows * state_size * sizeof(Math))};
  mailbox.open(steps > 1, steps > 2);
  // Every block of the cluster runs, its buffers and mailbox ready, before
  // any block pushes into another's.
  cluster_sync();

  // The steps kPrefetch at a time, so that the inputs read ahead have
  // registers of their own (ahead[j] is step base + j's).
  for (int64_t base = 0; base < steps; base += Layout::kPrefetch) {
#pragma unroll
    for (int j = 0; j < Layout::kPrefetch; ++j) {
      const int64_t order = base + j;
      if (order >= steps) break;
      const int64_t t = reverse ? steps - 1 - order : order;
      const bool last = order + 1 == steps;
      const Math* h = buffers + (order & 1) * kRows * Layout::kSpan;
      Math* h_next = buffers + ((order + 1) & 1) * kRows * Layout::kSpan;
      if (order > 0) mailbox.receive(order - 1, order + 2 < steps);
      // sums[g * kElements + e]: gate g of element e (row e / kColumns,
      // column e % kColumns of the warp's).
      Math sums[kSums];
#pragma unroll
      for (int i = 0; i < kSums; ++i) sums[i] = Math(0);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const typename Vector<Math>::type x =
              *reinterpret_cast<const typename Vector<Math>::type*>(
                  h + r * Layout::kSpan + (at.lane + 32 * c) * Layout::kWidth);
          const Math* xs = reinterpret_cast<const Math*>(&x);
#pragma unroll
          for (int u = 0; u < Layout::kColumns; ++u) {
#pragma unroll
            for (int g = 0; g < 3; ++g) {
#pragma unroll
              for (int v = 0; v < Layout::kWidth; ++v) {
                sums[g * Layout::kElements + r * Layout::kColumns + u] += xs[v] * w[u][g][c][v];
              }
            }
          }
        }
      }
      const Math sum = warp_reduce_scatter(sums, at.lane);
      Math pre[3];
#pragma unroll
      for (int g = 0; g < 3; ++g) {
        pre[g] = static_cast<Math>(ahead[j][g]) + bias_of[g] +
                 __shfl_sync(0xffffffffu, sum,
                             holder_of<kSums>(g * Layout::kElements + at.element));
      }
      Math new_h, new_cell;
      cell_forward_(pre[0], pre[1], pre[2], cell, &new_h, &new_cell);
      const Dtype stored_h = static_cast<Dtype>(new_h);
      const Dtype stored_cell = static_cast<Dtype>(new_cell);
      if (!last && at.active) {
        Math* target = h_next + at.row_offset * Layout::kSpan + at.column;
        for (unsigned rank = at.lane / Layout::kElements; rank < at.blocks;
             rank += 32 / Layout::kElements) {
          mailbox.send(target, rank, static_cast<Math>(stored_h), order);
        }
      }
      if (order + Layout::kPrefetch < steps) load_inputs(order + Layout::kPrefetch, ahead[j]);
      if (at.active && at.lane < Layout::kElements) {
        const int64_t element = (t * batch_size + at.row) * state_size + at.column;
        outputs[element] = stored_h;
        if (cells) {  // kept for a backward
          const int64_t gate = (t * batch_size + at.row) * gates_size + at.column;
#pragma unroll
          for (int g = 0; g < 3; ++g) gates[gate + g * state_size] = static_cast<Dtype>(pre[g]);
          cells[element] = stored_cell;
        }
        if (last && final_h) {
          final_h[at.row * state_size + at.column] = stored_h;
          final_cell[at.row * state_size + at.column] = stored_cell;
        }
      }
      cell = static_cast<Math>(stored_cell);
    }
  }
  // A push completes asynchronously: no block leaves while its last ones
  // may be on their way.
  cluster_sync();
#endif
}

// The backward recurrence (BackwardRecurrence, lltm_recurrence.cuh): the
// steps in the reverse of the walk's order, then d_h0. Shared memory:
// the d_gates of the cluster's rows, twice (kRows x 3 gates x kSpan
// elements, each gate's state columns from the start of its span).
template <typename Dtype, int kChunks, int kRows>
__global__ void __launch_bounds__(kClusterMaxThreads, 1) lltm_sequence_backward_cluster_kernel(
    const int64_t steps, const int64_t batch_size, const int64_t state_size,
    const int64_t weights_row_stride, const int reverse, const Dtype* __restrict__ weights,
    const Dtype* __restrict__ grad_outputs, const Dtype* __restrict__ grad_cells,
    const GradStrides strides, const Dtype* __restrict__ grad_final_h,
    const Dtype* __restrict__ grad_final_cell, const Dtype* __restrict__ cells,
    const Dtype* __restrict__ gates, Dtype* d_gates, Dtype* d_h0, Dtype* d_c0) {
#if LLTM_CLUSTER_PTX
  typedef ClusterLayout<Dtype, kChunks, kRows> Layout;
  typedef typename Layout::Math Math;
  extern __shared__ __align__(16) unsigned char shared[];
  Math* buffers = reinterpret_cast<Math*>(shared);
  const int kRowSpan = 3 * Layout::kSpan;  // a row's d_gates in shared memory
  const ClusterLane<Layout::kColumns, kRows> at(state_size, batch_size);
  const int64_t gates_size = 3 * state_size;

  // Column `column` of W_h, rows g * state + k: this lane's vectors of it.
  Math w[Layout::kColumns][3][kChunks][Layout::kWidth];
  load_lane_weights(at, state_size, w, [&](int u, int g, int64_t k) {
    return static_cast<Math>(
        weights[(g * state_size + k) * weights_row_stride + at.first_column + u]);
  });
  for (int i = threadIdx.x; i < 2 * kRows * kRowSpan; i += blockDim.x) buffers[i] = Math(0);
  // What the cell's backward pass reads at the step at `order`, as stored
  // (converted where used, kPrefetch steps later): the output and
  // cell gradients, the new cell and the three pre-activations.
  auto load_inputs = [&](int64_t order, Dtype(&values)[6]) {
    const int64_t t = reverse ? steps - 1 - order : order;
#pragma unroll
    for (int i = 0; i < 6; ++i) values[i] = Dtype(0);
    if (!at.active) return;
    if (grad_outputs) {
      values[0] = grad_outputs[t * strides.outputs[0] + at.row * strides.outputs[1] +
                               at.column * strides.outputs[2]];
    }
    if (grad_cells) {
      values[1] = grad_cells[t * strides.cells[0] + at.row * strides.cells[1] +
                             at.column * strides.cells[2]];
    }
    values[2] = cells[(t * batch_size + at.row) * state_size + at.column];
    const int64_t gate = (t * batch_size + at.row) * gates_size + at.column;
#pragma unroll
    for (int g = 0; g < 3; ++g) values[3 + g] = gates[gate + g * state_size];
  };
  // d_h of the lane's element from the d_gates in `d_next`: their dot
  // product with its column of W_h, summed over the warp.
  auto product = [&](const Math* d_next) {
    Math sums[Layout::kElements];
#pragma unroll
    for (int i = 0; i < Layout::kElements; ++i) sums[i] = Math(0);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int g = 0; g < 3; ++g) {
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const typename Vector<Math>::type x =
              *reinterpret_cast<const typename Vector<Math>::type*>(
                  d_next + r * kRowSpan + g * Layout::kSpan + (at.lane + 32 * c) * Layout::kWidth);
          const Math* xs = reinterpret_cast<const Math*>(&x);
#pragma unroll
          for (int u = 0; u < Layout::kColumns; ++u) {
#pragma unroll
            for (int v = 0; v < Layout::kWidth; ++v) {
              sums[r * Layout::kColumns + u] += xs[v] * w[u][g][c][v];
            }
          }
        }
      }
    }
    const Math sum = warp_reduce_scatter(sums, at.lane);
    return __shfl_sync(0xffffffffu, sum, holder_of<Layout::kElements>(at.element));
  };
  const int64_t state_element = at.row * state_size + at.column;
  const Math d_h_final =
      at.active && grad_final_h ? static_cast<Math>(grad_final_h[state_element]) : Math(0);
  // The gradient carried to the lane's cell, from the final cell's.
  Math d_cell =
      at.active && grad_final_cell ? static_cast<Math>(grad_final_cell[state_element]) : Math(0);
  Dtype ahead[Layout::kPrefetch][6];
#pragma unroll
  for (int j = 0; j < Layout::kPrefetch; ++j) {
    if (j < steps) load_inputs(steps - 1 - j, ahead[j]);
  }
  // Exchange n (the d_gates of the n-th step visited) happens for every step
  // but the last visited, and for that one too where d_h0 is wanted.
  auto exchanged = [&](int64_t n) { return n < steps - 1 || (n == steps - 1 && d_h0); };
  const ClusterMailbox mailbox = {
      reinterpret_cast<uint64_t*>(buffers + 2 * kRows * kRowSpan),
      (unsigned)(at.rows * 3 * state_size * sizeof(Math))};
  mailbox.open(exchanged(0), exchanged(1));
  cluster_sync();

  // kPrefetch steps at a time, as in the forward kernel.
  for (int64_t base = 0; base < steps; base += Layout::kPrefetch) {
#pragma unroll
    for (int j = 0; j < Layout::kPrefetch; ++j) {
      const int64_t visited = base + j;  // steps done before this one
      if (visited >= steps) break;
      const int64_t order = steps - 1 - visited;
      const int64_t t = reverse ? steps - 1 - order : order;
      // The d_gates of the step visited before this one (none for the first
      // visited), and where this one's go.
      const Math* d_next = buffers + (visited & 1) * kRows * kRowSpan;
      Math* d_here = buffers + ((visited + 1) & 1) * kRows * kRowSpan;
      if (visited > 0) mailbox.receive(visited - 1, exchanged(visited + 1));
      Math inputs[6];
#pragma unroll
      for (int i = 0; i < 6; ++i) inputs[i] = static_cast<Math>(ahead[j][i]);
      const Math d_h = inputs[0] + (visited == 0 ? d_h_final : product(d_next));
      Math d_old_cell, d_gate[3];
      cell_backward_(d_h, d_cell + inputs[1], inputs[2], inputs[3], inputs[4], inputs[5],
                     &d_old_cell, &d_gate[0], &d_gate[1], &d_gate[2]);
      Dtype stored[3];
#pragma unroll
      for (int g = 0; g < 3; ++g) stored[g] = static_cast<Dtype>(d_gate[g]);
      if (exchanged(visited) && at.active) {
        Math* target = d_here + at.row_offset * kRowSpan + at.column;
        for (unsigned rank = at.lane / Layout::kElements; rank < at.blocks;
             rank += 32 / Layout::kElements) {
#pragma unroll
          for (int g = 0; g < 3; ++g) {
            mailbox.send(target + g * Layout::kSpan, rank, static_cast<Math>(stored[g]), visited);
          }
        }
      }
      if (visited + Layout::kPrefetch < steps) load_inputs(order - Layout::kPrefetch, ahead[j]);
      if (at.active && at.lane < Layout::kElements) {
        const int64_t gate = (t * batch_size + at.row) * gates_size + at.column;
#pragma unroll
        for (int g = 0; g < 3; ++g) d_gates[gate + g * state_size] = stored[g];
      }
      d_cell = d_old_cell;
    }
  }
  if (d_h0) {
    mailbox.receive(steps - 1, false);
    const Math d_h = product(buffers + (steps & 1) * kRows * kRowSpan);
    if (at.active && at.lane < Layout::kElements) d_h0[state_element] = static_cast<Dtype>(d_h);
  }
  if (d_c0 && at.active && at.lane < Layout::kElements) {
    d_c0[state_element] = static_cast<Dtype>(d_cell);
  }
  // As in the forward kernel.
  cluster_sync();
#endif
}

// The host side: the plan and the launch.

// The kernel for a plan's chunks and rows, or NULL where it has none
// (4 chunks of float would be a state past kClusterMaxState).
template <typename Dtype, int kChunks>
static const void* cluster_kernel_of_rows(bool backward, int rows) {
  if (backward) {
    return rows == 1   ? (const void*)lltm_sequence_backward_cluster_kernel<Dtype, kChunks, 1>
           : rows == 2 ? (const void*)lltm_sequence_backward_cluster_kernel<Dtype, kChunks, 2>
                       : (const void*)lltm_sequence_backward_cluster_kernel<Dtype, kChunks, 4>;
  }
  return rows == 1   ? (const void*)lltm_sequence_forward_cluster_kernel<Dtype, kChunks, 1>
         : rows == 2 ? (const void*)lltm_sequence_forward_cluster_kernel<Dtype, kChunks, 2>
                     : (const void*)lltm_sequence_forward_cluster_kernel<Dtype, kChunks, 4>;
}

template <typename Dtype>
static const void* cluster_kernel(bool backward, int chunks, int rows) {
  typedef typename ClusterMath<Dtype>::type Math;
  if (chunks == 1) return cluster_kernel_of_rows<Dtype, 1>(backward, rows);
  if (chunks == 2) return cluster_kernel_of_rows<Dtype, 2>(backward, rows);
  if constexpr (Vector<Math>::kWidth == 2) {
    if (chunks == 4) return cluster_kernel_of_rows<Dtype, 4>(backward, rows);
  }
  return NULL;
}

// How many clusters of `blocks` blocks of `threads` the device holds at
// once for `kernel`, 0 where it cannot run them (its code here is not
// sm_90's, or a query failed); asked once for a device and a layout, and
// the kernel's attributes set then.
static int active_clusters(int device, const void* kernel, int blocks, int threads,
                           size_t shared_bytes) {
  static KeptAnswers<int> kept;
  return kept.get({device, (int64_t)(intptr_t)kernel, blocks, threads, 0}, [&](int* active) {
    *active = 0;
    cudaFuncAttributes attributes;
    if (query_failed(cudaFuncGetAttributes(&attributes, kernel))) return false;
    // ptxVersion is the virtual architecture the kernel's code came from:
    // an older one compiled its body away.
    if (attributes.ptxVersion < 90 || attributes.maxThreadsPerBlock < threads) return true;
    cudaLaunchAttribute attribute[1];
    const cudaLaunchConfig_t config = cluster_launch_config(
        (unsigned)blocks, (unsigned)threads, shared_bytes, (unsigned)blocks, 0, attribute);
    return !query_failed(cudaFuncSetAttribute(
               kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared_bytes)) &&
           (blocks <= kClusterPortableSize ||
            !query_failed(cudaFuncSetAttribute(
                kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1))) &&
           !query_failed(cudaOccupancyMaxActiveClusters(active, kernel, &config));
  });
}

// The tensor-core forward kernel's plan (cluster_mma_kernel.cu): a cluster
// for each 16 batch rows, every one resident at once.
template <typename Dtype>
static lltm_cluster_plan plan_cluster_mma(int device, int64_t batch_size, int64_t state_size) {
  lltm_cluster_plan plan = {NULL, 0, 0, 0, 0};
  if constexpr (sizeof(Dtype) == 2) {
    const ClusterMmaKernel mma = cluster_mma_forward<Dtype>(state_size);
    if (!mma.kernel) return plan;
    const int64_t clusters = (batch_size + mma.rows - 1) / mma.rows;
    const int active =
        active_clusters(device, mma.kernel, mma.cluster_size, mma.threads, mma.shared_bytes);
    if (active < 1 || clusters > (int64_t)active * kClusterMaxWaves) return plan;
    plan = {mma.kernel, mma.cluster_size, (int)clusters, mma.threads, mma.shared_bytes};
  }
  return plan;
}

// The layout (see the header comment): the state padded to whole chunks of
// 32 lanes' vectors; the smallest cluster (a power of two, 2 at least) whose blocks
// own about kClusterBlockColumns columns, larger where they would own more
// than a block's warps hold; the fewest rows a cluster (1, 2 or 4) with
// which every cluster is resident at once (kClusterMaxWaves).
template <typename Dtype>
static lltm_cluster_plan plan_cluster(int backward, int64_t steps, int64_t batch_size,
                                      int64_t state_size) {
  typedef typename ClusterMath<Dtype>::type Math;
  lltm_cluster_plan plan = {NULL, 0, 0, 0, 0};
  const bool tensor_cores = sizeof(Dtype) == 2 && !backward && state_size > kClusterMaxState &&
                            state_size <= kClusterMmaMaxState;
  if (steps < kClusterMinSteps || batch_size < 1 || state_size < 1 ||
      (state_size > kClusterMaxState && !tensor_cores)) {
    return plan;
  }
  int device, major;
  if (query_failed(cudaGetDevice(&device)) ||
      query_failed(
          cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)) ||
      major < 9) {
    return plan;
  }
  if (tensor_cores) return plan_cluster_mma<Dtype>(device, batch_size, state_size);
  const int width = Vector<Math>::kWidth;
  int chunks = (int)((state_size + 32 * width - 1) / (32 * width));
  if (chunks > 2) chunks = 4;
  const int columns = cluster_warp_columns(chunks);
  const int64_t most_block_columns = (int64_t)(kClusterMaxThreads / 32) * columns;
  // Two blocks at least: a push (st.async) goes to a block of a cluster of
  // two or more; in a cluster of one, compute-sanitizer's memcheck finds
  // the push into the block's own shared memory invalid.
  int blocks = 2;
  while (blocks < kClusterPortableSize && blocks * kClusterBlockColumns < state_size) blocks *= 2;
  while (blocks < kClusterMaxSize && (state_size + blocks - 1) / blocks > most_block_columns) {
    blocks *= 2;
  }
  const int64_t block_columns = (state_size + blocks - 1) / blocks;
  if (block_columns > most_block_columns) return plan;
  const int threads = (int)((block_columns + columns - 1) / columns) * 32;
  for (int rows = 1; rows <= 4; rows *= 2) {
    const void* kernel = cluster_kernel<Dtype>(backward != 0, chunks, rows);
    if (!kernel) return plan;
    // The two buffers, then the mailbox's two barriers.
    const size_t shared_bytes =
        (size_t)2 * rows * (backward ? 3 : 1) * chunks * 32 * width * sizeof(Math) +
        2 * sizeof(uint64_t);
    const int64_t clusters = (batch_size + rows - 1) / rows;
    const int active = active_clusters(device, kernel, blocks, threads, shared_bytes);
    if (active < 1) return plan;
    if (clusters <= (int64_t)active * kClusterMaxWaves && clusters * blocks <= INT_MAX) {
      plan.kernel = kernel;
      plan.cluster_size = blocks;
      plan.clusters = (int)clusters;
      plan.threads = threads;
      plan.shared_bytes = shared_bytes;
      return plan;
    }
  }
  return plan;
}

extern "C" lltm_cluster_plan lltm_plan_cluster(int dtype, int backward, int64_t steps,
                                               int64_t batch_size, int64_t state_size) {
  return LLTM_TYPED_CALL_WITH_HALF(dtype, plan_cluster, backward, steps, batch_size, state_size);
}

cudaError_t launch_clusters(const lltm_cluster_plan& plan, void** arguments,
                            cudaStream_t stream) {
  cudaLaunchAttribute attribute[1];
  const cudaLaunchConfig_t config = cluster_launch_config(
      (unsigned)(plan.cluster_size * plan.clusters), (unsigned)plan.threads, plan.shared_bytes,
      (unsigned)plan.cluster_size, stream, attribute);
  const cudaError_t status = cudaLaunchKernelExC(&config, plan.kernel, arguments);
  if (status != cudaSuccess) (void)cudaGetLastError();
  return status;
}
