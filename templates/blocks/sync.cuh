// Building blocks (templates/blocks/base.cuh says how they work): synchronisation. Block and named
// barriers, warp shuffles, and the mbarriers of the Hopper kernels.

#ifndef AJ_EMULATE  // ---- hardware bodies (inline PTX) ----

__device__ __forceinline__ void aj_syncthreads() { __syncthreads(); }
// Named barrier `id` (1..15) of `count` threads (a multiple of 32, whole warps): sync waits for
// all of them, arrive counts itself and goes on.
__device__ __forceinline__ void aj_named_sync(int id, int count) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory"); }
__device__ __forceinline__ void aj_named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}
// The warp's 32 lanes meet, and what one wrote to shared memory before is seen by the others
// after: the barrier for a buffer private to a warp.
__device__ __forceinline__ void aj_syncwarp() { __syncwarp(); }
// Every lane of the warp takes part; lane i receives `v` of lane i ^ lane_mask.
__device__ __forceinline__ float aj_shfl_xor(float v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }
// Lane 0's value in every lane (shfl.sync.idx from lane 0). Besides broadcasting, it tells ptxas that
// the value is the same across the warp, so what is computed from it (a warpgroup's wgmma
// descriptors, say) can live in uniform registers instead of being converted before every use.
__device__ __forceinline__ int aj_warp_uniform(int v) { return __shfl_sync(0xffffffffu, v, 0); }

// mbarriers (sm_90): one (8 bytes of shared memory, 8-byte aligned) counts `count` arrivals per
// phase plus a transaction count of bytes; a phase completes when all arrivals have come and the
// bytes announced with aj_mbarrier_arrive_expect_tx have landed. aj_mbarrier_wait(bar, parity)
// returns once the phase of that parity has completed (phase k has parity k % 2; a wait on parity
// 1 before any phase completed returns at once). Other threads use an mbarrier only after a
// barrier that follows its init.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void aj_mbarrier_init(aj_u64* bar, aj_u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(aj_smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void aj_mbarrier_arrive(aj_u64* bar) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" ::"r"(aj_smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void aj_mbarrier_arrive_expect_tx(aj_u64* bar, aj_u32 bytes) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" ::"r"(aj_smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void aj_mbarrier_wait(aj_u64* bar, aj_u32 parity) {
  asm volatile(
      "{ .reg .pred p; AJ_MBAR_WAIT: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1; @!p bra AJ_MBAR_WAIT; }" ::"r"(
          aj_smem_addr(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ bool aj_mbarrier_test_wait(aj_u64* bar, aj_u32 parity) {
  aj_u32 r;
  asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
               : "=r"(r)
               : "r"(aj_smem_addr(bar)), "r"(parity)
               : "memory");
  return r != 0;
}
#endif  // __CUDA_ARCH__ >= 900

#else  // ---- emulation twins (the emulator's runtime, emulator/emu_abi.h) ----

__device__ __forceinline__ void aj_syncthreads() { aj_emu_syncthreads(); }
__device__ __forceinline__ void aj_named_sync(int id, int count) { aj_emu_named_barrier(id, count, 1); }
__device__ __forceinline__ void aj_named_arrive(int id, int count) { aj_emu_named_barrier(id, count, 0); }
__device__ __forceinline__ void aj_syncwarp() { aj_emu_warp_sync(); }
__device__ __forceinline__ float aj_shfl_xor(float v, int lane_mask) {
  aj_u32 u;
  __builtin_memcpy(&u, &v, 4);
  u = aj_emu_shfl_xor(u, lane_mask);
  __builtin_memcpy(&v, &u, 4);
  return v;
}
// Lane 0's value, by five butterfly steps: after step m, lanes that differ only in bits below m
// hold the value of the lowest of them.
__device__ __forceinline__ int aj_warp_uniform(int v) {
  const int lane = aj_thread_idx() % 32;
  for (int m = 1; m < 32; m <<= 1) {
    const int other = (int)aj_emu_shfl_xor((aj_u32)v, m);
    if (lane & m) v = other;
  }
  return v;
}

__device__ __forceinline__ void aj_mbarrier_init(aj_u64* bar, aj_u32 count) { aj_emu_mbarrier_init(bar, count); }
__device__ __forceinline__ void aj_mbarrier_arrive(aj_u64* bar) { aj_emu_mbarrier_arrive(bar, 0, 1); }
__device__ __forceinline__ void aj_mbarrier_arrive_expect_tx(aj_u64* bar, aj_u32 bytes) { aj_emu_mbarrier_arrive(bar, bytes, 1); }
__device__ __forceinline__ void aj_mbarrier_wait(aj_u64* bar, aj_u32 parity) { aj_emu_mbarrier_wait(bar, parity); }
__device__ __forceinline__ bool aj_mbarrier_test_wait(aj_u64* bar, aj_u32 parity) { return aj_emu_mbarrier_test_wait(bar, parity) != 0; }

#endif  // AJ_EMULATE
