// What the cluster kernels (cluster_kernel.cu) and the tensor-core
// persistent kernels' shared staging (sequence_kernel.cu) share of a
// thread-block cluster: this block's rank in it, its size and the wait on
// an mbarrier. Compute capability 9.0 and newer; for older targets, whose
// kernels run no cluster, a block is rank 0 of 1 and never waits.
#ifndef LLTM_CLUSTER_PTX_CUH
#define LLTM_CLUSTER_PTX_CUH

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LLTM_CLUSTER_PTX 1
#else
#define LLTM_CLUSTER_PTX 0
#endif

// This block's rank in its cluster, and the cluster's size (1 where the
// launch has no clusters).
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned rank = 0;
#if LLTM_CLUSTER_PTX
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
#endif
  return rank;
}

__device__ __forceinline__ unsigned cluster_blocks() {
  unsigned size = 1;
#if LLTM_CLUSTER_PTX
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(size));
#endif
  return size;
}

// Returns once the phase of parity `parity` of the mbarrier at `barrier`
// (its shared-memory address) has completed.
__device__ __forceinline__ void mbarrier_wait(unsigned barrier, unsigned parity) {
#if LLTM_CLUSTER_PTX
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "waiting:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra waiting;\n"
      "}\n" ::"r"(barrier), "r"(parity) : "memory");
#endif
}

#endif  // LLTM_CLUSTER_PTX_CUH
