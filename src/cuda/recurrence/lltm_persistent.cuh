// What the persistent kernels (persistent_kernel.cu) are made of: the products
// of a block's staged state with its weights, on CUDA cores (dot_tile) or on
// tensor cores (mma_rows); the staging of the state, in clusters of blocks on
// compute capability 9.x (MulticastStage); and a step of each, persistent_step
// and mma_step.
#ifndef LLTM_PERSISTENT_CUH
#define LLTM_PERSISTENT_CUH

#include "lltm_cluster_ptx.cuh"
#include "lltm_recurrence.cuh"

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
// shared memory rows `stride` apart (16-byte aligned), zero-padded, in
// chunks of Chunk (16, 8 or 4 bytes) that divide the rows' bytes and their
// start: on compute capability 8.0 and newer as asynchronous copies
// (cp.async), every one of the thread's in flight at once, so that a step
// waits for about one round trip to L2 (at B=16 S=768 a backward step
// stages 147 KB a block: 10 us of its 24 with eight loads a thread in
// flight, on an H200); before 8.0 eight loads at a time. Other blocks
// wrote the rows during this launch: 16-byte copies bypass L1 (.cg);
// cp.async takes 8 and 4 bytes through L1 only (.ca), which the grid's
// barrier before each staging keeps from holding stale lines.
template <typename Dtype, typename Chunk>
__device__ __forceinline__ void stage_chunks(const Dtype* source, int rows, int64_t length,
                                             Dtype* target, int64_t stride) {
  static_assert(sizeof(Chunk) % sizeof(Dtype) == 0, "a chunk holds whole elements");
  const int kChunk = (int)(sizeof(Chunk) / sizeof(Dtype));
  const int width = (int)(stride / kChunk), total = rows * width;
  const int length_chunks = (int)(length / kChunk);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  for (int i = threadIdx.x; i < total; i += blockDim.x) {
    const int r = i / width, k = i - r * width;
    Chunk* slot = reinterpret_cast<Chunk*>(target) + i;
    if (k < length_chunks) {
      const Chunk* from = reinterpret_cast<const Chunk*>(source + r * length) + k;
      if constexpr (sizeof(Chunk) == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_address(slot)),
                     "l"(from) : "memory");
      } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(shared_address(slot)),
                     "l"(from), "n"((int)sizeof(Chunk)) : "memory");
      }
    } else {
      *slot = Chunk{};
    }
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
#else
#pragma unroll 8
  for (int i = threadIdx.x; i < total; i += blockDim.x) {
    const int r = i / width, k = i - r * width;
    Chunk value = {};
    if (k < length_chunks) value = __ldcg(reinterpret_cast<const Chunk*>(source + r * length) + k);
    reinterpret_cast<Chunk*>(target)[i] = value;
  }
#endif
}

// stage_chunks in the widest chunk the rows allow, element by element only
// for rows of an odd number of 16-bit elements. Element by element, eight
// loads a thread in flight, a float32 state of 650 (rows of 2,600 bytes,
// the backward's of 7,800) took the persistent kernels' training step at
// B=16 T=64 from 32 us at a state of 640 to 70 (H200); in 8-byte chunks 36.
template <typename Dtype>
__device__ __forceinline__ void stage_rows(const Dtype* source, int rows, int64_t length,
                                           Dtype* target, int64_t stride) {
  const uintptr_t start = reinterpret_cast<uintptr_t>(source);
  const uint64_t bytes = (uint64_t)length * sizeof(Dtype);
  if (bytes % 16 == 0 && start % 16 == 0) {
    stage_chunks<Dtype, uint4>(source, rows, length, target, stride);
    return;
  }
  if (bytes % 8 == 0 && start % 8 == 0) {
    stage_chunks<Dtype, uint2>(source, rows, length, target, stride);
    return;
  }
  if constexpr (sizeof(Dtype) < 8) {
    if (bytes % 4 == 0 && start % 4 == 0) {
      stage_chunks<Dtype, unsigned>(source, rows, length, target, stride);
      return;
    }
  }
  const int width = (int)stride, total = rows * width;
#pragma unroll 8
  for (int i = threadIdx.x; i < total; i += blockDim.x) {
    const int r = i / width, k = i - r * width;
    target[i] = k < length ? __ldcg(source + r * length + k) : to_storage<Dtype>(0);
  }
}

// Where the rows a step stages are not whole 16 bytes (a 16-bit state of
// 650: rows of 1,300 bytes), the kernels stage them not from the tensor
// that holds them but from a ring of two copies whose rows are rounded up
// to whole 16 bytes, zeros after the row: the step that computes the rows
// writes the copy beside them, into slot `order & 1` (its place in the
// walk), and the next step stages that slot in 16-byte copies, in a
// cluster as bulk copies multicast to it. A bfloat16 state of 650 (H200,
// T=64 B=16, us a step) trained at 16.5 staged in 4-byte copies by each
// block, 11.2 through the ring, a state of 768 at 10.6.
template <typename Dtype>
struct StagingRing {
  Dtype* ring;          // NULL: the kernel stages from the tensor itself
  int64_t rows, length;  // the tensor's rows and their length
  int64_t ring_length;   // length rounded up to whole 16 bytes

  __device__ StagingRing(Dtype* ring, int64_t rows, int64_t length)
      : ring(ring), rows(rows), length(length), ring_length(rounded_length(length)) {}

  __host__ __device__ static int64_t rounded_length(int64_t length) {
    const int64_t chunk = 16 / (int64_t)sizeof(Dtype);
    return (length + chunk - 1) / chunk * chunk;
  }

  __device__ Dtype* slot(int64_t order) const { return ring + (order & 1) * rows * ring_length; }

  // Every block, before the first step: the zeros after each row of both
  // slots (the grid's barrier after the first step orders them before any
  // staging).
  __device__ void zero_padding() const {
    if (!ring) return;
    const int64_t pad = ring_length - length, total = 2 * rows * pad;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
      ring[i / pad * ring_length + length + i % pad] = to_storage<Dtype>(0);
    }
  }

  // Where the step at `order` keeps what it computes, element (row,
  // column) at row * ring_length + column; NULL without a ring. Taken once
  // a step, before the kernels' finish: a call per element that tested for
  // the ring and found the slot took the bfloat16 forward kernel from 3.82
  // to 3.90 ms (H200, T=1024 B=16 S=768, autocast training).
  __device__ Dtype* kept_rows(int64_t order) const { return ring ? slot(order) : NULL; }
};

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

  // The block's staging, called by every thread of every block once before
  // the first step (its mbarrier a shared variable of the kernel): whether
  // the block runs in a cluster (tensor_cores, and a cluster launch); the
  // zeros of `staged` (rows rows of `stride` elements, the first batch_size
  // of them the state's): the tiles' padding rows, and in a cluster the
  // state's rows too, whose padding the copies leave as it is; then, in a
  // cluster, open().
  template <typename Dtype>
  __device__ static MulticastStage prepared(Dtype* staged, int64_t batch_size, int64_t rows,
                                            int64_t stride, bool tensor_cores) {
    __shared__ uint64_t block_barrier;
    MulticastStage stage = {&block_barrier, 0, tensor_cores && cluster_blocks() > 1};
    for (int64_t i = (stage.clustered ? 0 : batch_size * stride) + threadIdx.x;
         i < rows * stride; i += blockDim.x) {
      staged[i] = to_storage<Dtype>(0);
    }
    if (stage.clustered) stage.open();
    return stage;
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
    cluster_sync();
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
    cluster_sync();
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

#endif  // LLTM_PERSISTENT_CUH
