// The plan executor's driver: outputs, threads, and the choice of instruction set. The arithmetic
// is in plan_executor_tiles.cpp, compiled once per instruction set.
#include "runtime/cpu/plan_executor.hpp"

#include <algorithm>
#include <atomic>
#include <limits>
#include <thread>

#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"
#include "runtime/cpu/plan_executor_tiles.hpp"

namespace attnjit {
namespace {

using Worker = void (*)(const ExecutorJob&, std::atomic<int64_t>&);

struct Workers {
  Worker forward, dq, dkdv, fused, weights;
};

bool cpu_has_avx2() {
#if defined(ATTNJIT_HAVE_CPU_AVX2)
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// F, DQ, VL and BW: what the variant is compiled with (libgcc also checks that the OS saves the
// registers).
bool cpu_has_avx512() {
#if defined(ATTNJIT_HAVE_CPU_AVX512)
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
#else
  return false;
#endif
}

bool cpu_runs(CpuSimd simd) {
  switch (simd) {
    case CpuSimd::Avx2: return cpu_has_avx2();
    case CpuSimd::Avx512: return cpu_has_avx512();
    default: return true;
  }
}

CpuSimd resolve(CpuSimd simd) {
  if (simd == CpuSimd::Auto) simd = knobs().cpu_simd;
  if (simd == CpuSimd::Auto) {
    simd = cpu_has_avx512() ? CpuSimd::Avx512 : cpu_has_avx2() ? CpuSimd::Avx2 : CpuSimd::Generic;
  }
  if (!cpu_runs(simd)) {
    const bool avx512 = simd == CpuSimd::Avx512;
    throw UserError("ATTNJIT_CPU_SIMD",
                    std::string(cpu_simd_name(simd)) + " was asked for but " +
                        (!cpu_simd_available(simd) ? std::string("this build has no ") + (avx512 ? "AVX-512" : "AVX2") + " variant"
                         : avx512                  ? "this CPU lacks AVX-512 (F, DQ, VL and BW)"
                                                   : "this CPU lacks AVX2 and FMA") +
                        "; use auto or generic");
  }
  return simd;
}

#define ATTNJIT_WORKERS(NS) Workers{NS::forward_worker, NS::dq_worker, NS::dkdv_worker, NS::fused_worker, NS::weights_worker}

Workers workers_for(CpuSimd simd) {
  switch (resolve(simd)) {  // throws for a variant this build or CPU lacks
#if defined(ATTNJIT_HAVE_CPU_AVX512)
    case CpuSimd::Avx512: return ATTNJIT_WORKERS(cpu_avx512);
#endif
#if defined(ATTNJIT_HAVE_CPU_AVX2)
    case CpuSimd::Avx2: return ATTNJIT_WORKERS(cpu_avx2);
#endif
    default: return ATTNJIT_WORKERS(cpu_generic);
  }
}

#undef ATTNJIT_WORKERS

unsigned cores() { return std::max(1u, std::thread::hardware_concurrency()); }

// Each thread past the first gets at least this much work (FLOP of the tile products): starting it
// and waiting for it costs tens of microseconds (more on a shared VM), about what one core computes
// of this. A call on 16 tokens had its two threads cost more than its arithmetic.
constexpr int64_t kMinFlopPerThread = int64_t{1} << 24;

// Runs `worker` on `threads` threads (this one included), never more threads than units.
void run_workers(Worker worker, const ExecutorJob& job, int64_t units, unsigned threads) {
  std::atomic<int64_t> next{0};
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads && t < units; ++t) pool.emplace_back([&] { worker(job, next); });
  worker(job, next);
  for (auto& t : pool) t.join();
}

ExecutorJob job_for(const Plan& plan, const ExecutorOptions& options) {
  const Shape& s = plan.shape;
  ExecutorJob job;
  job.plan = &plan;
  job.q_offset = options.offsets ? options.offsets->first : s.q_offset;
  job.k_offset = options.offsets ? options.offsets->second : s.k_offset;
  if (options.order == ExecutorOrder::SeqMajor) {
    job.q_layout = {s.seq_q * s.heads_q, s.heads_q, 1};
    job.k_layout = {s.seq_k * s.heads_kv, s.heads_kv, 1};
  } else {
    job.q_layout = {s.heads_q * s.seq_q, 1, s.seq_q};
    job.k_layout = {s.heads_kv * s.seq_k, 1, s.seq_k};
  }
  job.v_layout = job.k_layout;
  job.o_layout = job.q_layout;
  return job;
}

}  // namespace

unsigned executor_threads(const Plan& plan, unsigned requested) {
  if (requested) return requested;
  const Shape& s = plan.shape;
  const int64_t flop = 2 * plan.stats.computed_real_pairs * s.batch * (s.head_dim + s.head_dim_v);
  return static_cast<unsigned>(std::clamp<int64_t>(flop / kMinFlopPerThread, 1, cores()));
}

bool cpu_simd_available(CpuSimd simd) {
  switch (simd) {
    case CpuSimd::Auto:
    case CpuSimd::Generic: return true;
    case CpuSimd::Avx2:
#if defined(ATTNJIT_HAVE_CPU_AVX2)
      return true;
#else
      return false;
#endif
    case CpuSimd::Avx512:
#if defined(ATTNJIT_HAVE_CPU_AVX512)
      return true;
#else
      return false;
#endif
  }
  return false;
}

bool cpu_simd_runs_here(CpuSimd simd) { return cpu_runs(simd); }

CpuSimd cpu_simd_selected() { return resolve(CpuSimd::Auto); }

ExecutorOutput execute_plan(const Plan& plan, const Pattern& pattern, const float* q, const float* k, const float* v,
                            const DynamicLayout* dynamic, const ExecutorOptions& options) {
  const Shape& s = plan.shape;
  ExecutorOutput out;
  // Outputs start poisoned, so a row the plan forgets shows.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  out.o.assign(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim_v), nan);
  out.lse.assign(static_cast<size_t>(s.batch * s.heads_q * s.seq_q), nan);
  execute_plan_onto(plan, pattern, q, k, v, out, dynamic, options);
  return out;
}

void execute_plan_onto(const Plan& plan, const Pattern& pattern, const float* q, const float* k, const float* v,
                       ExecutorOutput& out, const DynamicLayout* dynamic, const ExecutorOptions& options) {
  const ExecutorJob layouts = job_for(plan, options);
  execute_plan_into(plan, pattern, {q, layouts.q_layout}, {k, layouts.k_layout}, {v, layouts.v_layout}, out.o.data(),
                    layouts.o_layout, out.lse.data(), dynamic, options);
}

void execute_plan_into(const Plan& plan, const Pattern& pattern, RowsAt q, RowsAt k, RowsAt v, float* o, RowLayout o_rows,
                       float* lse, const DynamicLayout* dynamic, const ExecutorOptions& options) {
  const Shape& s = plan.shape;
  const Workers w = workers_for(options.simd);
  ExecutorJob job = job_for(plan, options);
  job.q_layout = q.rows, job.k_layout = k.rows, job.v_layout = v.rows, job.o_layout = o_rows;
  job.pattern = &pattern;
  job.dynamic = dynamic;
  job.q = q.data, job.k = k.data, job.v = v.data;
  job.o = o, job.lse_out = lse;
  job.fp8 = options.fp8;
  job.items = options.rows_with_work_only ? work_item_prefix(plan) : static_cast<int64_t>(plan.items.size());
  // Work items write disjoint rows, so workers take (batch, item) units from a shared counter.
  run_workers(w.forward, job, s.batch * job.items, executor_threads(plan, options.threads));
}

void execute_plan_weights(const Plan& plan, const Pattern& pattern, const float* q, const float* k, const float* lse,
                          float* w, const DynamicLayout* dynamic, const ExecutorOptions& options) {
  const Shape& s = plan.shape;
  const Workers workers = workers_for(options.simd);
  std::fill(w, w + s.batch * s.heads_q * s.seq_q * s.seq_k, 0.0f);
  ExecutorJob job = job_for(plan, options);
  job.pattern = &pattern;
  job.dynamic = dynamic;
  job.q = q, job.k = k, job.lse = lse, job.w = w;
  run_workers(workers.weights, job, s.batch * static_cast<int64_t>(plan.items.size()), executor_threads(plan, options.threads));
}

ExecutorGradients execute_plan_backward(const Plan& plan, const BackwardPlan& bwd, const Pattern& pattern, const float* q,
                                        const float* k, const float* v, const float* o, const float* lse,
                                        const float* dout, const DynamicLayout* dynamic, const ExecutorOptions& options,
                                        const float* dlse, const float* given_delta) {
  const Shape& s = plan.shape;
  const Workers w = workers_for(options.simd);
  ExecutorGradients g;
  g.dq.assign(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim), 0.0f);
  g.dk.assign(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim), 0.0f);
  g.dv.assign(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim_v), 0.0f);
  ExecutorJob job = job_for(plan, options);
  // D = rowsum(dO * O) - dlse, [batch, heads_q, seq_q] like the LSE (or the caller's).
  std::vector<float> delta(given_delta ? 0 : static_cast<size_t>(s.batch * s.heads_q * s.seq_q), 0.0f);
  for (int64_t b = 0; b < (given_delta ? 0 : s.batch); ++b)
    for (int64_t i = 0; i < s.seq_q; ++i)
      for (int64_t h = 0; h < s.heads_q; ++h) {
        const int64_t off = (b * job.q_layout.batch + i * job.q_layout.pos + h * job.q_layout.head) * s.head_dim_v;
        float sum = 0.0f;
        for (int64_t x = 0; x < s.head_dim_v; ++x) sum += dout[off + x] * o[off + x];
        const size_t at = static_cast<size_t>((b * s.heads_q + h) * s.seq_q + i);
        delta[at] = dlse && lse[at] != -std::numeric_limits<float>::infinity() ? sum - dlse[at] : sum;  // not for empty rows
      }
  job.bwd = &bwd;
  job.pattern = &pattern;
  job.dynamic = dynamic;
  job.q = q, job.k = k, job.v = v;
  job.lse = lse, job.dout = dout, job.delta = given_delta ? given_delta : delta.data();
  job.dq = g.dq.data(), job.dk = g.dk.data(), job.dv = g.dv.data();
  // A (batch, kv head) unit adds the key tiles of that head one after another (they may overlap).
  const int64_t kv_units = s.batch * s.heads_kv;
  const unsigned threads = executor_threads(plan, options.threads);
  const bool fused = options.schedule == BackwardSchedule::Fused ||
                     (options.schedule == BackwardSchedule::Auto && kv_units >= threads);
  if (fused) {
    run_workers(w.fused, job, kv_units, threads);
  } else {
    run_workers(w.dq, job, s.batch * static_cast<int64_t>(plan.items.size()), threads);
    run_workers(w.dkdv, job, kv_units, threads);
  }
  return g;
}

}  // namespace attnjit
