// The wait on an mbarrier that the cluster kernels' mailboxes
// (cluster_kernel.cu) and the tensor-core persistent kernels' shared
// staging (sequence_kernel.cu) take: compute capability 9.0 and newer (the
// body is empty for older targets, whose kernels never wait on one).
#ifndef LLTM_MBARRIER_CUH
#define LLTM_MBARRIER_CUH

// Returns once the phase of parity `parity` of the mbarrier at `barrier`
// (its shared-memory address) has completed.
__device__ __forceinline__ void mbarrier_wait(unsigned barrier, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "waiting:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra waiting;\n"
      "}\n" ::"r"(barrier), "r"(parity) : "memory");
#endif
}

#endif  // LLTM_MBARRIER_CUH
