// Candidates, pruning and the search. See autotune.hpp.
#include "compiler/tune/autotune.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "compiler/jit/jit.hpp"
#include "compiler/nvrtc/cubin_info.hpp"
#include "compiler/nvrtc/sass_loop.hpp"
#include "compiler/plan/plan.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"

namespace attnjit {

std::string TuneKey::describe() const {
  std::ostringstream os;
  os << gpu << " (" << sm_count << " SMs, sm_" << arch << (arch_specific ? "a" : "") << ") pattern " << pattern_signature << " d=" << head_dim << "/"
     << head_dim_v << " " << to_string(dtype) << " seq<=" << seq_bucket << (backward ? " backward" : "");
  return os.str();
}

int64_t seq_bucket_of(int64_t seq, const std::vector<int64_t>& buckets) {
  if (seq < 1) throw UserError("seq", "a sequence length must be >= 1, got " + std::to_string(seq));
  if (buckets.empty()) {
    int64_t b = 1;
    while (b < seq) b *= 2;
    return b;
  }
  for (size_t n = 0; n < buckets.size(); ++n) {
    if (buckets[n] < 1 || (n > 0 && buckets[n] <= buckets[n - 1]))
      throw UserError("buckets", "sequence buckets must be positive and strictly increasing");
  }
  for (int64_t b : buckets)
    if (b >= seq) return b;
  return buckets.back();
}

std::string pattern_signature(const Pattern& p) { return pattern_hash(p); }

std::string describe(const KernelConfig& c) {
  return std::to_string(c.tile_q) + "x" + std::to_string(c.tile_k) + " s" + std::to_string(c.stages) +
         (c.warps ? " w" + std::to_string(c.warps) : "");
}

namespace {
std::vector<KernelConfig> candidates_of(const KernelRequest& base, bool backward) {
  const auto resolve = backward ? resolve_backward_config : resolve_config;
  KernelRequest r = base;
  r.config = {};
  std::vector<KernelConfig> out = {resolve(r)};  // the default first; throws what no path supports
  auto add = [&](int tq, int tk, int stages, int warps = 0) {
    r.config = {tq, tk, stages, warps};
    try {
      const KernelConfig c = resolve(r);
      if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
    } catch (const UserError&) {
      // Does not fit this arch's shared memory (or the path's limits): not a candidate.
    }
  };
  if (backward && choose_backward_path(r) == KernelPath::Sm80) {
    for (int tq : {32, 64, 128})
      for (int tk : {32, 64, 128}) add(tq, tk, 2);
  } else if (!backward && r.dtype == DType::E4M3 && choose_path(r) == KernelPath::Sm90) {
    for (int tq : {64, 128}) add(tq, 128, 2);  // the FP8 Hopper kernel: 128-key tiles, two stages
  } else if (!backward && r.dtype == DType::E4M3 && choose_path(r) == KernelPath::Sm80) {
    for (int tq : {64, 128}) add(tq, 64, 2);  // the FP8 sm_89 kernel: 64-key tiles, two stages
  } else if (!backward && (choose_path(r) == KernelPath::Sm90 || choose_path(r) == KernelPath::Sm90Tma)) {
    for (int tq : {64, 128, 192})  // 192: three warpgroups, up to head dim 64 (refused past it)
      for (int tk : {64, 128, 176})  // 176: up to head dim 128, no block layouts, two stages (refused otherwise)
        for (int stages : {2, 3}) add(tq, tk, stages);
  } else if (!backward && choose_path(r) == KernelPath::Sm80) {
    for (int tq : {64, 128})
      for (int tk : {32, 64, 128})
        for (int stages : {2, 3}) {
          add(tq, tk, stages);
          if (tq == 128) add(tq, tk, stages, 4);  // two 16-row groups per warp (refused past head dim 128)
        }
    // FlashAttention-2's shape: two row groups per warp, one K and one V buffer (half the shared
    // memory of two stages: two blocks per SM on an A100 at head dim 128).
    for (int tk : {32, 64, 128}) add(128, tk, 1, 4);
  } else {
    for (int tq : {16, 32, 64})
      for (int tk : {16, 32}) add(tq, tk, 1);
  }
  return out;
}
}  // namespace

std::vector<KernelConfig> candidate_configs(const KernelRequest& base) { return candidates_of(base, false); }
std::vector<KernelConfig> candidate_backward_configs(const KernelRequest& base) { return candidates_of(base, true); }

int64_t planned_pairs(const Pattern& p, const Shape& s, const KernelConfig& c, const DynamicLayout* dynamic,
                      BranchPacking packing) {
  Shape one = s;
  one.batch = 1;
  return lower_to_plan(p, one, TileConfig{c.tile_q, c.tile_k}, dynamic, nullptr, RandomLayouts::InPlan, packing).stats.computed_pairs;
}

std::vector<std::string> prune_candidates(const std::vector<KernelConfig>& candidates, const CostModel& cost,
                                          const CompileCheck& compile_check,
                                          const std::function<void(size_t, size_t)>& progress) {
  std::vector<std::string> skip(candidates.size());
  // Cost model. Larger tiles compute more masked-out pairs on partial tiles but load each key
  // tile for more queries; that efficiency gain stays well under 1.5x in practice, so a config
  // computing over 1.5x the pairs of the leanest one cannot win and is not worth compiling.
  if (cost) {
    std::vector<int64_t> pairs(candidates.size(), -1);
    int64_t least = -1;
    for (size_t n = 0; n < candidates.size(); ++n) {
      try {
        pairs[n] = cost(candidates[n]);
        if (least < 0 || pairs[n] < least) least = pairs[n];
      } catch (const std::exception& e) {
        skip[n] = std::string("failed: cannot plan: ") + e.what();
      }
    }
    for (size_t n = 1; n < candidates.size(); ++n) {  // n = 0 is the default: always kept as the baseline
      if (pairs[n] >= 0 && static_cast<double>(pairs[n]) > kMaxPairsRatio * static_cast<double>(least)) {
        skip[n] = "pruned: computes " + std::to_string(pairs[n]) + " pairs, over 1.5x the leanest candidate's " +
                  std::to_string(least) + " (cost model)";
      }
    }
  }
  if (compile_check) {
    for (size_t n = 0; n < candidates.size(); ++n) {
      if (progress) progress(n, candidates.size());
      if (!skip[n].empty()) continue;
      try {
        if (std::optional<std::string> why = compile_check(candidates[n], n == 0)) skip[n] = "pruned: " + *why;
      } catch (const std::exception& e) {
        skip[n] = std::string("failed: ") + e.what();
      }
    }
    if (progress) progress(candidates.size(), candidates.size());
  }
  return skip;
}

CompileCheck kernel_compile_check(const Pattern& p, const KernelRequest& base, KernelCompiler& compiler,
                                  double timeout_s, bool backward) {
  return [&p, base, &compiler, timeout_s, backward](const KernelConfig& c, bool baseline) -> std::optional<std::string> {
    KernelRequest r = base;
    r.config = c;
    // The backward source holds four entry points named after it; the largest block bounds registers.
    KernelSource k;
    if (backward) {
      const BackwardKernels b = generate_backward_kernels(p, r);
      k = b.source;
      k.threads = std::max({b.dq_threads, b.dkdv_threads, b.aux_threads});
    } else {
      k = generate_kernel(p, r);
    }
    const std::shared_ptr<const CompiledKernel> ck = compiler.get(k);
    // A forward kernel's spill is kept when its main loop never touches local memory (ptxas parks
    // values the loop does not read there, reloaded a few times a block); otherwise, without the
    // SASS to tell, and for the backward's several loops, a spill prunes.
    auto spill = [&](const std::string& what) -> std::optional<std::string> {
      if (backward) return what;
      std::optional<SassLoop> loop;
      try {
        loop = find_main_loop(disassemble_cubin(ck->cubin));
      } catch (const UserError&) {
        return what + " (no nvdisasm or cuobjdump to look at the main loop)";
      }
      if (!loop) return what + " (no main loop found in its SASS)";
      if (loop->local_accesses > 0)
        return what + ", " + std::to_string(loop->local_accesses) + " local loads and stores in the main loop";
      return std::nullopt;
    };
    for (const ResourceUsage& u : ck->usage) {
      if (!u.is_kernel || u.kernel.find(k.name) == std::string::npos) {
        if (!baseline && !u.is_kernel && u.spill_store_bytes + u.spill_load_bytes > 0)
          return "device function " + u.kernel + " spills";
        continue;
      }
      if (!baseline && ck->spills_known && u.spill_store_bytes + u.spill_load_bytes > 0) {
        if (auto why = spill("spills " + std::to_string(u.spill_store_bytes) + "B stores, " +
                             std::to_string(u.spill_load_bytes) + "B loads"))
          return why;
      }
      // A kernel found in the cache has no ptxas log; spills live in the stack frame.
      if (!baseline && !ck->spills_known && u.stack_bytes > 0) {
        if (auto why = spill(std::to_string(u.stack_bytes) + "B stack frame (spills)")) return why;
      }
      if (u.registers > 0 && int64_t{u.registers} * k.threads > 65536)
        return std::to_string(u.registers) + " registers x " + std::to_string(k.threads) +
               " threads exceed the 65536 registers of a block";
    }
    if (!ck->cache_hit && ck->seconds > timeout_s) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "compiled in %.1f s, over the %.0f s budget", ck->seconds, timeout_s);
      return std::string(buf);
    }
    return std::nullopt;
  };
}

CandidateTimer::~CandidateTimer() = default;

namespace {

// Linear interpolation between the closest ranks of sorted samples.
double quantile(const std::vector<double>& sorted, double q) {
  const double at = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(at)), hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (at - static_cast<double>(lo));
}

void time_candidate(CandidateResult& c, CandidateTimer& timer, const TuneBudget& budget) {
  std::vector<double> samples;
  try {
    samples = timer.time_ms(c.config, budget.warmup, budget.max_iterations);
  } catch (const std::exception& e) {
    c.status = std::string("failed: ") + e.what();
    return;
  }
  samples.erase(std::remove_if(samples.begin(), samples.end(), [](double s) { return !std::isfinite(s) || s < 0; }),
                samples.end());
  if (samples.empty()) {
    c.status = "failed: no valid timing samples";
    return;
  }
  std::sort(samples.begin(), samples.end());
  c.status = "ok";
  c.median_ms = quantile(samples, 0.5);
  c.p20_ms = quantile(samples, 0.2);
  c.p80_ms = quantile(samples, 0.8);
}

}  // namespace

TuneResult tune(const std::vector<KernelConfig>& candidates, CandidateTimer& timer, const TuneBudget& budget,
                std::function<void(size_t, size_t)> progress) {
  return tune(candidates, {}, timer, budget, std::move(progress));
}

TuneResult tune(const std::vector<KernelConfig>& candidates, const std::vector<std::string>& skip,
                CandidateTimer& timer, const TuneBudget& budget, std::function<void(size_t, size_t)> progress) {
  ATTNJIT_CHECK(skip.empty() || skip.size() == candidates.size(), "tune: one skip reason per candidate (or none)");
  const auto t0 = std::chrono::steady_clock::now();
  TuneResult r;
  for (size_t n = 0; n < candidates.size(); ++n) {
    if (progress) progress(n, candidates.size());
    CandidateResult c;
    c.config = candidates[n];
    if (!skip.empty() && !skip[n].empty()) {
      c.status = skip[n];
    } else {
      time_candidate(c, timer, budget);
    }
    r.candidates.push_back(std::move(c));
  }
  if (progress) progress(candidates.size(), candidates.size());

  if (!r.candidates.empty()) {
    r.best = r.candidates[0].config;
    r.default_ms = r.candidates[0].median_ms;
  }
  double fastest = kInfMs;
  for (const CandidateResult& c : r.candidates) fastest = std::min(fastest, c.median_ms);
  // The earliest candidate within the tolerance of the fastest: timing noise between runs then
  // cannot flip the choice between near-equal configs.
  for (const CandidateResult& c : r.candidates) {
    if (std::isfinite(fastest) && c.median_ms <= fastest * (1.0 + budget.tie_tolerance)) {
      r.best = c.config;
      r.best_ms = c.median_ms;
      break;
    }
  }
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bool print = false;
  try {
    print = knobs().print_autotuning;
  } catch (const UserError&) {
  }
  if (print) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "attnjit: autotuning finished after %.2f s over %zu candidates; best config %s (%.4f ms, default "
                  "%.4f ms)\n",
                  r.wall_s, r.candidates.size(), describe(r.best).c_str(), r.best_ms, r.default_ms);
    std::fputs(line, stderr);
  }
  return r;
}

std::string format_tune_table(const TuneResult& r) {
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "  %-14s %10s %10s %10s  %s\n", "candidate", "median ms", "p20 ms", "p80 ms", "status");
  os << line;
  auto ms = [](double v) {
    char b[32];
    if (std::isfinite(v)) std::snprintf(b, sizeof b, "%.4f", v);
    else std::snprintf(b, sizeof b, "inf");
    return std::string(b);
  };
  for (size_t n = 0; n < r.candidates.size(); ++n) {
    const CandidateResult& c = r.candidates[n];
    const bool best = r.found() && c.config == r.best;
    std::snprintf(line, sizeof line, "%c %-14s %10s %10s %10s  %s%s\n", best ? '*' : ' ', describe(c.config).c_str(),
                  ms(c.median_ms).c_str(), ms(c.p20_ms).c_str(), ms(c.p80_ms).c_str(), c.status.c_str(),
                  n == 0 ? " (default)" : "");
    os << line;
  }
  return os.str();
}

}  // namespace attnjit
