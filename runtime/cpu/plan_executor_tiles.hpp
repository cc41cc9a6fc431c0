// The plan executor's tile arithmetic, compiled once per CPU instruction set (CMakeLists.txt:
// runtime/cpu/plan_executor_tiles.cpp becomes attnjit::cpu_generic and, on x86-64, attnjit::cpu_avx2
// with -mavx2 -mfma and attnjit::cpu_avx512 with AVX-512 F/DQ/VL/BW where the compiler has them).
// plan_executor.cpp owns the outputs and the threads and picks the variant at run time
// (ATTNJIT_CPU_SIMD); a worker takes work units from the shared counter until none is left.
#pragma once

#include <atomic>
#include <cstdint>

#include "compiler/plan/plan.hpp"
#include "compiler/plan/plan_backward.hpp"
#include "runtime/cpu/plan_executor.hpp"

namespace attnjit {

// Everything a worker reads and writes. q/dout/dq follow `q_layout`, k/dk/dv `k_layout`; the
// forward reads v by `v_layout` and writes o by `o_layout` (the same as k's and q's unless the
// tensors are read in place, execute_plan_into); lse/delta are [B, Hq, Sq].
struct ExecutorJob {
  RowLayout q_layout, k_layout, v_layout, o_layout;
  const Plan* plan = nullptr;
  const BackwardPlan* bwd = nullptr;  // backward only
  const Pattern* pattern = nullptr;
  const DynamicLayout* dynamic = nullptr;
  int64_t q_offset = 0, k_offset = 0;  // the call's positions (ExecutorOptions::offsets)
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  const float *lse = nullptr, *dout = nullptr, *delta = nullptr;  // backward inputs
  float *o = nullptr, *lse_out = nullptr;                         // forward outputs
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;              // backward outputs (zeroed by the caller)
  float* w = nullptr;  // attention weights [B, Hq, Sq, Sk] (zeroed by the caller); read q, k, lse
  const Fp8Arithmetic* fp8 = nullptr;  // the forward on FP8 inputs (ExecutorOptions::fp8)
  int64_t items = 0;  // forward: the work items run, plan->items[0, items)
};

#define ATTNJIT_DECLARE_EXECUTOR_TILES(NS)                                                          \
  namespace NS {                                                                                    \
  /* Units (batch, work item < job.items): u = b * items + item. Writes O and the item's LSE. */   \
  void forward_worker(const ExecutorJob& job, std::atomic<int64_t>& next);                          \
  /* Units (batch, work item): adds f exp(S - LSE) of the item's visited tiles to W. */             \
  void weights_worker(const ExecutorJob& job, std::atomic<int64_t>& next);                          \
  /* Units (batch, work item) of the forward plan: dQ of the item's rows. */                        \
  void dq_worker(const ExecutorJob& job, std::atomic<int64_t>& next);                               \
  /* Units (batch, kv head): adds dK and dV of that head's key items, one item after another. */    \
  void dkdv_worker(const ExecutorJob& job, std::atomic<int64_t>& next);                             \
  /* As dkdv_worker, and adds dQ too (a unit owns every query head that reads its kv head). */       \
  void fused_worker(const ExecutorJob& job, std::atomic<int64_t>& next);                            \
  }

ATTNJIT_DECLARE_EXECUTOR_TILES(cpu_generic)
#if defined(ATTNJIT_HAVE_CPU_AVX2)
ATTNJIT_DECLARE_EXECUTOR_TILES(cpu_avx2)
#endif
#if defined(ATTNJIT_HAVE_CPU_AVX512)
ATTNJIT_DECLARE_EXECUTOR_TILES(cpu_avx512)
#endif
#undef ATTNJIT_DECLARE_EXECUTOR_TILES

}  // namespace attnjit
