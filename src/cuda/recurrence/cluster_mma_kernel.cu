// The forward recurrence of a float16 or bfloat16 dense pass at states the
// cluster kernels' registers do not hold (kClusterMaxState to
// kClusterMmaMaxState), on tensor cores, in clusters of 16 blocks (compute
// capability 9.0 and newer): the cluster path's forward there
// (plan_cluster, cluster_kernel.cu, plans it).
// Its backward takes the rows below the cluster row: a backward kernel in
// this layout (each block d_h of its columns, a product of depth three
// states; each warp's d_gates of three gates copied to every block) trained
// at T=1024 B=16 under bfloat16 autocast in 7.61 us a step at a state of
// 512 and 6.32 at 384, against 6.82 and 6.34 with the persistent kernels'
// backward (H200, separate runs).
//
// Why. The persistent kernels pay each step a barrier of the whole grid
// and a staging of the whole state from global memory: on an H200, at
// T=1024 B=16 and a bfloat16 state of 512, 4.2 us a forward step, where
// cuDNN's LSTM infers at about 2. Here, as in the cluster kernels, the state
// travels between the blocks of a cluster, and a block waits for nothing
// but the values it needs: 2.0 us a step there.
//
// Layout. A cluster runs kMmaRows (16) batch rows, an mma tile's rows,
// for the whole sequence (grid: 16 blocks x ceil(batch / 16)). A state of
// S takes G = ceil(S / 128) groups of kMmaColumns (8) columns a block, so
// that 16 blocks of 8 G columns cover it (the columns past S are zeros).
// A group's columns are one mma tile a gate; two warps share its depth
// (kMmaSplits), each holding its half of the three tiles' hidden weights
// (the mma's B operand, loaded once a pass): 4 G depth tiles, 24 G
// registers, for G up to 4. Past that (states 513 to 768, 10 and 12 warps
// a block, three to a scheduler: 168 registers a lane at most) a warp
// keeps 12 depth tiles in registers (72) and the rest in shared memory (61
// and 111 KB a block), read each step beside the state; all in registers
// spilled, from 8 of them on with the weights' loads unrolled. The batch
// rows' old h, in shared memory (double-buffered, ClusterMmaLayout), is
// the A operand.
//
// A step, in each block: each warp's products over its half of the depth
// (two sums a gate, alternating depth tiles, for the tensor cores'
// latency); the two warps of a group swap through shared memory the sums
// of each other's rows (a block barrier between), so that each
// lane holds the three gates of two (row, column) elements and takes their
// cells (the input part of the gates read kMmaPrefetch steps ahead, the
// cells kept in registers). Each warp writes its eight rows of its group's
// new h into its own buffer (128 bytes) and copies them whole (a bulk
// copy) into the other 15 blocks, each copy counting its bytes into that
// block's mailbox: a block starts the next step once every other block's
// copies are in, and a block barrier then orders its own warps' writes.
// The block barrier of the step orders each copy after the arming of its
// exchange by thread 0 (at the step's start), as the mailbox's protocol
// needs (lltm_cluster_ptx.cuh).
//
// Measured on an H200, T=1024 B=16 bfloat16 (the forward alone, us a
// step) at states of 384 and 512: 2.56 and 2.90 with each lane's values
// pushed to every block (st.async, 1,024 arrivals on a block's mailbox a
// step), 2.17 and 2.34 with a group's bulk copies, 1.77 and 2.04 with the
// two warps of a group sharing the cells (one warp took them before); 2.04
// and 2.06 with the block barrier after each mailbox wait (before, the
// warps' own arrivals on the mailbox ordered their writes, which
// compute-sanitizer's racecheck does not follow). Past 512, bfloat16
// autocast, us a step against the persistent kernels (BENCHMARKS.md's
// sweep): T=1024 B=16 inference 3.6 against 4.2 at a state of 650 and
// 3.7 against 4.2 at 768. A forward
// that keeps its gates and cells is slower than theirs there (GPU time a
// step, T=1024 B=16: 3.97 against 3.74 at 650, 4.49 against 3.83 at 768;
// at 512, every weight in registers, 2.65 against 3.65), so the plan gives
// it to them where they take the batch (src/plan.c,
// LLTM_SAVED_CLUSTER_STATE). At T=64 B=64, where they do not and the
// cuBLAS loop did, 650 trains at 28.8 against 31.4 and infers at 5.9
// against 12.3.

#include "lltm_cluster_ptx.cuh"
#include "lltm_persistent.cuh"

// Blocks a cluster (a non-portable size: the plan allows it) and warps a
// group's depth.
static const int kMmaClusterBlocks = 16;
static const int kMmaSplits = 2;
// Steps whose inputs a lane reads ahead.
[[maybe_unused]] static const int kMmaPrefetch = 2;

// The layout of G groups: a warp's depth tiles, the state a block's shared
// buffers hold (every block's columns), in chunks of kMmaColumns columns of
// the cluster's kMmaRows rows, each 256 contiguous bytes (row by row), so
// that a group's new h is one chunk, copied whole to the other blocks, and
// the eight rows of an A fragment's loads fall into different banks.
template <int kGroups>
struct ClusterMmaLayout {
  static constexpr int kDepthTiles = 4 * kGroups;
  static constexpr int kRegisterTiles = kGroups <= 4 ? kDepthTiles : 12;
  static constexpr int kSharedTiles = kDepthTiles - kRegisterTiles;
  static_assert(kSharedTiles % 2 == 0, "the shared tiles' loop takes them two at a time");
  static constexpr int kSpan = kMmaClusterBlocks * kMmaColumns * kGroups;
  static constexpr int kChunk = kMmaRows * kMmaColumns;  // elements
  static constexpr int kBuffer = kMmaRows * kSpan;
  static constexpr int kThreads = 32 * kMmaSplits * kGroups;
  // The floats a lane of a group hands over a step: each warp's sums of
  // its two elements' three gates.
  static constexpr int kHanded = kMmaSplits * 3 * 2;
  static constexpr size_t kWeightBytes = (size_t)kThreads * 3 * kSharedTiles * sizeof(uint2);
  // The shared weights, the two buffers (16-bit elements), the sums handed
  // over, the mailbox's two barriers.
  static constexpr size_t kSharedBytes = kWeightBytes + 2 * kBuffer * 2 +
      kGroups * 32 * kHanded * sizeof(float) + 2 * sizeof(uint64_t);
};

// Element (row, k) of a buffer.
template <int kGroups>
__host__ __device__ constexpr int chunked(int row, int k) {
  return k / kMmaColumns * ClusterMmaLayout<kGroups>::kChunk + row * kMmaColumns +
         k % kMmaColumns;
}

#if LLTM_CLUSTER_PTX
template <typename Dtype>
__device__ __forceinline__ uint32_t bits_of(Dtype value) {
  return *reinterpret_cast<const unsigned short*>(&value);
}
#endif

template <typename Dtype, int kGroups>
__global__ void __launch_bounds__(ClusterMmaLayout<kGroups>::kThreads, 1)
    lltm_sequence_forward_cluster_mma_kernel(
        const int64_t steps, const int64_t batch_size, const int64_t state_size,
        const int64_t weights_row_stride, const int reverse, const Dtype* __restrict__ bias,
        const Dtype* __restrict__ weights, const Dtype* __restrict__ h0,
        const Dtype* __restrict__ c0, Dtype* outputs, Dtype* cells, Dtype* gates,
        Dtype* final_h, Dtype* final_cell) {
#if LLTM_CLUSTER_PTX
  typedef ClusterMmaLayout<kGroups> Layout;
  const int kDepth = Layout::kDepthTiles;
  extern __shared__ __align__(16) unsigned char shared[];
  const int kRegisters = Layout::kRegisterTiles, kShared = Layout::kSharedTiles;
  uint2* shared_weights = reinterpret_cast<uint2*>(shared);
  Dtype* buffers = reinterpret_cast<Dtype*>(shared + Layout::kWeightBytes);
  float* handed = reinterpret_cast<float*>(buffers + 2 * Layout::kBuffer);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp % kGroups, split = warp / kGroups;
  const unsigned rank = cluster_rank();
  const int64_t group_column = ((int64_t)rank * kGroups + group) * kMmaColumns;
  const int64_t first_row = (int64_t)cluster_index() * kMmaRows;
  const int64_t gates_size = 3 * state_size;
  const int first_tile = split * kDepth;

  // Gate g's weights of this lane's column (the fragment's n, lane / 4) at
  // depth tile first_tile + i: b0 at k = 16 (first_tile + i) + 2 (lane % 4),
  // b1 eight further, two elements each.
  uint32_t w[3][kRegisters][2];
  // The rest of the warp's tiles, lane after lane, in shared memory.
  uint2* warp_weights = shared_weights + warp * 3 * kShared * 32 + lane;
  {
    const int64_t column = group_column + lane / 4;
    auto pair_of = [&](int g, int i) {
      const Dtype* row = weights + (g * state_size + column) * weights_row_stride;
      uint32_t pair[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t k = (int64_t)(first_tile + i) * kMmaDepth + half * 8 + 2 * (lane % 4);
        const bool in = column < state_size;
        const uint32_t low = in && k < state_size ? bits_of(row[k]) : 0u;
        const uint32_t high = in && k + 1 < state_size ? bits_of(row[k + 1]) : 0u;
        pair[half] = low | high << 16;
      }
      return make_uint2(pair[0], pair[1]);
    };
#pragma unroll
    for (int g = 0; g < 3; ++g) {
#pragma unroll
      for (int i = 0; i < kRegisters; ++i) {
        const uint2 pair = pair_of(g, i);
        w[g][i][0] = pair.x;
        w[g][i][1] = pair.y;
      }
#pragma unroll 1
      for (int i = kRegisters; i < kDepth; ++i) {
        warp_weights[(g * kShared + i - kRegisters) * 32] = pair_of(g, i);
      }
    }
  }
  auto weight_pair = [&](int g, int i) {
    if (i < kRegisters) return make_uint2(w[g][i][0], w[g][i][1]);
    return warp_weights[(g * kShared + i - kRegisters) * 32];
  };
  // Buffer 0 holds h0's rows, zeros past the batch and the state; buffer 1
  // zeros until the first exchange fills it.
  for (int i = threadIdx.x; i < 2 * Layout::kBuffer; i += blockDim.x) {
    const int r = i % Layout::kChunk / kMmaColumns;
    const int64_t row = first_row + r;
    const int64_t k = i % Layout::kBuffer / Layout::kChunk * kMmaColumns + i % kMmaColumns;
    buffers[i] = i < Layout::kBuffer && k < state_size && row < batch_size
                     ? h0[row * state_size + k]
                     : to_storage<Dtype>(0.0f);
  }
  // Each lane takes the cells of two elements: row lane / 4 (the first warp
  // of its group) or lane / 4 + 8 (the second), columns 2 (lane % 4) and
  // the next (the accumulator's layout: its elements 2 split + c).
  const int64_t row = first_row + lane / 4 + 8 * split;
  int64_t column_of[2];
  column_of[0] = group_column + 2 * (lane % 4);
  column_of[1] = column_of[0] + 1;
  auto active = [&](int c) { return row < batch_size && column_of[c] < state_size; };
  float bias_of[3][2], cell[2];
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    cell[c] = active(c) ? to_math(c0[row * state_size + column_of[c]]) : 0.0f;
#pragma unroll
    for (int g = 0; g < 3; ++g) {
      bias_of[g][c] = bias && column_of[c] < state_size
                          ? to_math(bias[g * state_size + column_of[c]])
                          : 0.0f;
    }
  }
  auto load_inputs = [&](int64_t order, Dtype(&values)[3][2]) {
    const int64_t t = reverse ? steps - 1 - order : order;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int64_t gate = (t * batch_size + row) * gates_size + column_of[c];
#pragma unroll
      for (int g = 0; g < 3; ++g) {
        values[g][c] = active(c) ? gates[gate + g * state_size] : to_storage<Dtype>(0.0f);
      }
    }
  };
  Dtype ahead[kMmaPrefetch][3][2];
#pragma unroll
  for (int j = 0; j < kMmaPrefetch; ++j) {
    if (j < steps) load_inputs(j, ahead[j]);
  }
  // Exchange n (the new h of step n) happens for every step but the last:
  // each block's chunks copied to the 15 others.
  const ClusterMailbox mailbox = {
      reinterpret_cast<uint64_t*>(handed + kGroups * 32 * Layout::kHanded),
      (unsigned)((kMmaClusterBlocks - 1) * kGroups * Layout::kChunk * sizeof(Dtype))};
  mailbox.open(steps > 1, steps > 2);
  cluster_sync();

  for (int64_t base = 0; base < steps; base += kMmaPrefetch) {
#pragma unroll
    for (int j = 0; j < kMmaPrefetch; ++j) {
      const int64_t order = base + j;
      if (order >= steps) break;
      const int64_t t = reverse ? steps - 1 - order : order;
      const bool last = order + 1 == steps;
      const Dtype* h = buffers + (order & 1) * Layout::kBuffer;
      Dtype* h_next = buffers + ((order + 1) & 1) * Layout::kBuffer;
      if (order > 0) {
        mailbox.receive(order - 1, order + 2 < steps);
        // The block's own writes of the last step (its chunks of h, the
        // sums handed over) ordered before what this step reads and
        // overwrites.
        __syncthreads();
      }

      float acc[2][3][4] = {};
      // Rows lane / 4 and 8 more, depth 2 (lane % 4) and 8 more of each tile.
      const Dtype* a_lane = h + chunked<kGroups>(lane / 4, 2 * (lane % 4));
      const int lower = 8 * kMmaColumns;
      auto tile_product = [&](int i, float(&sums)[3][4]) {
        const Dtype* tile = a_lane + (first_tile + i) * 2 * Layout::kChunk;
        const uint32_t fragment[4] = {pair_at(tile), pair_at(tile + lower),
                                      pair_at(tile + Layout::kChunk),
                                      pair_at(tile + Layout::kChunk + lower)};
#pragma unroll
        for (int g = 0; g < 3; ++g) {
          const uint2 b = weight_pair(g, i);
          mma_16x8x16<Dtype>(sums[g], fragment, b.x, b.y);
        }
      };
#pragma unroll
      for (int i = 0; i < kRegisters; ++i) tile_product(i, acc[i & 1]);
#pragma unroll 1
      for (int i = kRegisters; i < kDepth; i += 2) {
        tile_product(i, acc[0]);
        tile_product(i + 1, acc[1]);
      }
      float sums[3][4];
#pragma unroll
      for (int g = 0; g < 3; ++g) {
#pragma unroll
        for (int e = 0; e < 4; ++e) sums[g][e] = acc[0][g][e] + acc[1][g][e];
      }
      // Each warp hands the other the sums of the other's row, through
      // shared memory (6 floats a lane each way).
      float* hand = handed + group * 32 * Layout::kHanded + lane;
#pragma unroll
      for (int g = 0; g < 3; ++g) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          hand[((split * 3 + g) * 2 + c) * 32] = split ? sums[g][c] : sums[g][2 + c];
        }
      }
      __syncthreads();
      Dtype stored_h[2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int64_t column = column_of[c];
        float pre[3];
#pragma unroll
        for (int g = 0; g < 3; ++g) {
          pre[g] = (split ? sums[g][2 + c] : sums[g][c]) +
                   hand[(((1 - split) * 3 + g) * 2 + c) * 32] + bias_of[g][c] +
                   to_math(ahead[j][g][c]);
        }
        float new_h, new_cell;
        cell_forward_(pre[0], pre[1], pre[2], cell[c], &new_h, &new_cell);
        stored_h[c] = to_storage<Dtype>(active(c) ? new_h : 0.0f);
        const Dtype stored_cell = to_storage<Dtype>(new_cell);
        if (active(c)) {
          const int64_t element = (t * batch_size + row) * state_size + column;
          outputs[element] = stored_h[c];
          if (cells) {  // kept for a backward
            const int64_t gate = (t * batch_size + row) * gates_size + column;
#pragma unroll
            for (int g = 0; g < 3; ++g) gates[gate + g * state_size] = to_storage<Dtype>(pre[g]);
            cells[element] = stored_cell;
          }
          if (last && final_h) {
            final_h[row * state_size + column] = stored_h[c];
            final_cell[row * state_size + column] = stored_cell;
          }
        }
        cell[c] = to_math(stored_cell);
      }
      if (!last) {
        // This warp's half (its eight rows) of the group's chunk of the new
        // h here, then copied to the other blocks.
        Dtype* half = h_next + (rank * kGroups + group) * Layout::kChunk + split * 8 * kMmaColumns;
        reinterpret_cast<uint32_t*>(half + (lane / 4) * kMmaColumns)[lane % 4] =
            bits_of(stored_h[0]) | bits_of(stored_h[1]) << 16;
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncwarp();
        if (lane < kMmaClusterBlocks && lane != (int)rank) {
          mailbox.copy(half, (unsigned)lane, Layout::kChunk / 2 * sizeof(Dtype), order);
        }
      }
      if (order + kMmaPrefetch < steps) load_inputs(order + kMmaPrefetch, ahead[j]);
    }
  }
  // A push completes asynchronously: no block leaves while its last ones
  // may be on their way.
  cluster_sync();
#endif
}

template <typename Dtype>
ClusterMmaKernel cluster_mma_forward(int64_t state_size) {
  ClusterMmaKernel kernel = {NULL, 0, 0, kMmaClusterBlocks, kMmaRows};
  const int64_t groups = (state_size + kMmaClusterBlocks * kMmaColumns - 1) /
                         (kMmaClusterBlocks * kMmaColumns);
#define LLTM_CLUSTER_MMA_GROUPS(G)                                                         \
  if (groups == G) {                                                                       \
    kernel.kernel = (const void*)lltm_sequence_forward_cluster_mma_kernel<Dtype, G>;       \
    kernel.threads = ClusterMmaLayout<G>::kThreads;                                        \
    kernel.shared_bytes = ClusterMmaLayout<G>::kSharedBytes;                               \
  }
  LLTM_CLUSTER_MMA_GROUPS(3)
  LLTM_CLUSTER_MMA_GROUPS(4)
  LLTM_CLUSTER_MMA_GROUPS(5)
  LLTM_CLUSTER_MMA_GROUPS(6)
#undef LLTM_CLUSTER_MMA_GROUPS
  return kernel;
}

template ClusterMmaKernel cluster_mma_forward<__half>(int64_t);
template ClusterMmaKernel cluster_mma_forward<__nv_bfloat16>(int64_t);
