// What the cluster kernels (cluster_kernel.cu) and the tensor-core
// persistent kernels' shared staging (lltm_persistent.cuh) share of a
// thread-block cluster: this block's rank in it, its size, the cluster's
// barrier, and an mbarrier's address, set-up, arming and wait; and, on the
// host, the configuration of a launch in clusters. Compute capability 9.0
// and newer; for older targets, whose kernels run no cluster, a block is
// rank 0 of 1 and never waits.
#ifndef LLTM_CLUSTER_PTX_CUH
#define LLTM_CLUSTER_PTX_CUH

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
