// What the cluster kernels (cluster_kernel.cu, cluster_mma_kernel.cu) and
// the tensor-core persistent kernels' shared staging (lltm_persistent.cuh)
// share of a thread-block cluster: this block's rank in it, its size, the
// cluster's barrier, an mbarrier's address, set-up, arming and wait, and
// the cluster kernels' mailbox; and, on the host, the configuration of a
// launch in clusters. Compute capability 9.0
// and newer; for older targets, whose kernels run no cluster, a block is
// rank 0 of 1 and never waits.
#ifndef LLTM_CLUSTER_PTX_CUH
#define LLTM_CLUSTER_PTX_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LLTM_CLUSTER_PTX 1
#else
#define LLTM_CLUSTER_PTX 0
#endif

#if LLTM_CLUSTER_PTX

// This block's rank in its cluster, and the cluster's size (1 where the
// launch has no clusters).
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned rank;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}

__device__ __forceinline__ unsigned cluster_blocks() {
  unsigned size;
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(size));
  return size;
}

// The cluster barrier: arriving publishes this thread's earlier writes
// (release, cluster scope); the wait returns once every thread of the
// cluster has arrived and makes their writes visible (acquire). Every
// thread of every block takes part in each barrier.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
}

// Sets up the mbarrier at `barrier` (its shared-memory address) for one
// arrival a phase. One thread, before any other use of it; the cluster sees
// it once that thread's fence.mbarrier_init has been followed by a cluster
// barrier.
__device__ __forceinline__ void mbarrier_init(unsigned barrier) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(barrier) : "memory");
}

// This thread's arrival on the current phase of the mbarrier at `barrier`,
// which then completes once `bytes` of copies have also landed.
__device__ __forceinline__ void mbarrier_arrive_expecting(unsigned barrier, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               ::"r"(barrier), "r"(bytes) : "memory");
}

// Returns once the phase of parity `parity` of the mbarrier at `barrier`
// (its shared-memory address) has completed.
__device__ __forceinline__ void mbarrier_wait(unsigned barrier, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "waiting:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra waiting;\n"
      "}\n" ::"r"(barrier), "r"(parity) : "memory");
}

#else  // older targets: no clusters, a block is rank 0 of 1 and never waits

__device__ __forceinline__ unsigned cluster_rank() { return 0; }
__device__ __forceinline__ unsigned cluster_blocks() { return 1; }
__device__ __forceinline__ void cluster_sync() {}
__device__ __forceinline__ void mbarrier_init(unsigned) {}
__device__ __forceinline__ void mbarrier_arrive_expecting(unsigned, unsigned) {}
__device__ __forceinline__ void mbarrier_wait(unsigned, unsigned) {}

#endif  // LLTM_CLUSTER_PTX

// The shared-memory address of `pointer` (into this block's shared memory),
// as the PTX of mbarriers and copies takes it.
__device__ __forceinline__ unsigned shared_address(const void* pointer) {
  return (unsigned)__cvta_generic_to_shared(pointer);
}

#if LLTM_CLUSTER_PTX

// Which cluster of the grid this block's is (its rank and the cluster's
// size: above).
__device__ __forceinline__ unsigned cluster_index() {
  unsigned index;
  asm("mov.u32 %0, %%clusterid.x;" : "=r"(index));
  return index;
}

// A block's mailbox: the two mbarriers of its double buffer, in shared
// memory after the buffers. Exchange n, the values every block pushes at
// the n-th step it visits, lands in buffer (n + 1) % 2 and completes a
// phase of barrier (n + 1) % 2; the next step waits for that phase alone.
// A phase expects the bytes the cluster pushes into this block (each push,
// st.async or a bulk copy, counts its bytes in as it lands) and one
// arrival: this block's thread 0 arming it, for exchanges 0 and 1 before
// the first step and for exchange n + 2 once it has received exchange n.
// A push can never come before its arming: a block pushes exchange n + 2
// only after receiving exchange n + 1 from every block, which each block
// sends after its thread 0 armed (cluster_kernel.cu: thread 0 sends a part
// of it; cluster_mma_kernel.cu: a block barrier comes between).
struct ClusterMailbox {
  uint64_t* barriers;  // two
  unsigned bytes;      // a phase's: what the cluster pushes into this block

  // Before the kernel's first cluster barrier, in every thread: sets up the
  // barriers and arms those of the exchanges that happen of the first two.
  __device__ void open(bool first, bool second) const {
    if (threadIdx.x != 0) return;
    for (int b = 0; b < 2; ++b) mbarrier_init(shared_address(barriers + b));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    if (first) arm(1);
    if (second) arm(0);
  }

  __device__ void arm(int barrier) const {
    mbarrier_arrive_expecting(shared_address(barriers + barrier), bytes);
  }

  // Waits until exchange n has landed whole; then thread 0 arms its barrier
  // for exchange n + 2 where that one happens (`again`).
  __device__ void receive(int64_t n, bool again) const {
    const int barrier = (int)((n + 1) & 1);
    const unsigned parity = (unsigned)((n >> 1) & 1);
    mbarrier_wait(shared_address(barriers + barrier), parity);
    if (again && threadIdx.x == 0) arm(barrier);
  }

  // In block `rank` of the cluster: `local`'s place (*target) and the
  // barrier of exchange n (*barrier), as the cluster's shared addresses.
  __device__ void remote(const void* local, unsigned rank, int64_t n, unsigned* target,
                         unsigned* barrier) const {
    asm("mapa.shared::cluster.u32 %0, %1, %2;"
        : "=r"(*target) : "r"(shared_address(local)), "r"(rank));
    asm("mapa.shared::cluster.u32 %0, %1, %2;"
        : "=r"(*barrier) : "r"(shared_address(barriers + ((n + 1) & 1))), "r"(rank));
  }

  // Pushes `value` of exchange n to `local`'s place in block `rank` of the
  // cluster (this block's own too).
  template <typename T>
  __device__ void send(T* local, unsigned rank, T value, int64_t n) const {
    unsigned target, barrier;
    remote(local, rank, n, &target, &barrier);
    push(target, value, barrier);
  }

  // A bulk copy of `bytes` (a multiple of 16) of this block's shared
  // memory at `local`, as exchange n, to the same place in block `rank`
  // (another block): this block's writes there must precede it in the
  // async proxy (fence.proxy.async.shared::cta).
  __device__ void copy(const void* local, unsigned rank, unsigned bytes, int64_t n) const {
    unsigned target, barrier;
    remote(local, rank, n, &target, &barrier);
    asm volatile(
        "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, "
        "[%3];" ::"r"(target), "r"(shared_address(local)), "r"(bytes), "r"(barrier) : "memory");
  }

  __device__ static void push(unsigned target, float value, unsigned barrier) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                 ::"r"(target), "r"(__float_as_uint(value)), "r"(barrier) : "memory");
  }
  __device__ static void push(unsigned target, double value, unsigned barrier) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];"
                 ::"r"(target), "l"(__double_as_longlong(value)), "r"(barrier) : "memory");
  }
};

#endif  // LLTM_CLUSTER_PTX

// The configuration of a launch of `blocks` blocks of `threads` threads and
// `shared_bytes` of dynamic shared memory each, in clusters of `cluster`
// blocks, on `stream`: its one attribute, the clusters' size, written to
// attributes[0]; a caller may add more after it (and count them in
// numAttrs).
static inline cudaLaunchConfig_t cluster_launch_config(unsigned blocks, unsigned threads,
                                                       size_t shared_bytes, unsigned cluster,
                                                       cudaStream_t stream,
                                                       cudaLaunchAttribute* attributes) {
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = cluster;
  attributes[0].val.clusterDim.y = 1;
  attributes[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = 1;
  return config;
}

#endif  // LLTM_CLUSTER_PTX_CUH
