// Plan quality and planning time (no GPU needed):
//   waste = computed pairs (tile_q * tile_k per visited tile) / attended pairs, and the median
//   planning time, per spec at --seq;
//   planning time and plan memory for every spec at --big-seq (a million tokens by default).
// Targets: bigbird at 32K tokens, 16 heads <= 20 ms; every example at 1M <= 100 ms.
// Plans are made as the GPU and emulator devices make them: random layouts whose plan would hash
// more blocks than the ATTNJIT_RANDOM_IN_KERNEL knob (default 2^26) are left to the kernels
// (column "random": plan or kernel; such a plan's visited tiles are what the band allows), and
// packed where the ATTNJIT_PACK_BRANCHES knob allows (a pair several branches attend computed
// once: a LongNet's waste is then below 1, its computed pairs near its distinct ones).
// Usage: attnjit_plan_bench [--seq N] [--big-seq N] [--heads H] [--tile QxK] [--repeat R] SPEC...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "compiler/pattern/pattern_stats.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/plan/plan.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"

using namespace attnjit;

namespace {

// Where the devices that run kernels decide the pattern's random layouts (runtime.cpp, prepare).
RandomLayouts random_for(const Pattern& p, const Shape& s) {
  return random_layout_hashes(p, s) > knobs().random_in_kernel_above ? RandomLayouts::InKernel : RandomLayouts::InPlan;
}

double plan_ms(const Pattern& p, const Shape& s, const TileConfig& t, int repeat, Plan* keep) {
  std::vector<double> ms;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    Plan plan = lower_to_plan(p, s, t, nullptr, nullptr, random_for(p, s),
                              knobs().pack_branches ? BranchPacking::Packed : BranchPacking::Separate);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (r == repeat - 1 && keep) *keep = std::move(plan);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t seq = 32768, big_seq = 1048576, heads = 16;
  int repeat = 5;
  TileConfig tile{64, 64};
  std::vector<std::string> specs;
  try {
    for (int a = 1; a < argc; ++a) {
      const std::string arg = argv[a];
      auto value = [&]() -> std::string {
        if (a + 1 >= argc) throw UserError(arg, "needs a value");
        return argv[++a];
      };
      if (arg == "--seq") seq = std::stoll(value());
      else if (arg == "--big-seq") big_seq = std::stoll(value());
      else if (arg == "--heads") heads = std::stoll(value());
      else if (arg == "--repeat") repeat = std::stoi(value());
      else if (arg == "--tile") tile = parse_tile_config(value());
      else specs.push_back(arg);
    }
    if (specs.empty()) throw UserError("usage", "attnjit_plan_bench [--seq N] [--big-seq N] [--heads H] [--tile QxK] SPEC...");

    std::printf("plan waste at seq=%lld heads=%lld tile=%dx%d (waste = computed pairs / attended pairs)\n",
                static_cast<long long>(seq), static_cast<long long>(heads), tile.tile_q, tile.tile_k);
    std::printf("%-20s %8s %14s %14s %9s %9s %9s %10s %9s\n", "spec", "waste", "attended", "computed", "items",
                "full", "partial", "tables_kB", "plan_ms");
    for (const std::string& path : specs) {
      const Pattern p = load_spec_file(path);
      Shape s;
      s.seq_q = s.seq_k = seq;
      s.heads_q = s.heads_kv = heads;
      s.head_dim = s.head_dim_v = 128;
      if (p.has_dynamic_layout()) {
        std::printf("%-20s skipped: needs a run-time table\n", base_name(path).c_str());
        continue;
      }
      Plan plan;
      const double ms = plan_ms(p, s, tile, repeat, &plan);
      plan.stats.attended_pairs = pattern_stats(MaskContext{p, s}).attended_pairs;
      const PlanStats& st = plan.stats;
      std::printf("%-20s %8.4f %14lld %14lld %9lld %9lld %9lld %10.1f %9.2f\n", base_name(path).c_str(), st.waste(),
                  static_cast<long long>(st.attended_pairs), static_cast<long long>(st.computed_pairs),
                  static_cast<long long>(st.work_items), static_cast<long long>(st.full_tiles),
                  static_cast<long long>(st.partial_tiles), st.table_bytes / 1024.0, ms);
    }

    // Planning time and plan memory at a million tokens, every spec (one run when a run takes over
    // a second).
    std::printf("\nplanning at seq=%lld heads=%lld tile=%dx%d (median of %d runs, one core)\n", static_cast<long long>(big_seq),
                static_cast<long long>(heads), tile.tile_q, tile.tile_k, repeat);
    std::printf("%-20s %10s %12s %14s %12s %8s\n", "spec", "plan_ms", "tables_MB", "visited_tiles", "bytes/tile", "random");
    for (const std::string& path : specs) {
      const Pattern p = load_spec_file(path);
      if (p.has_dynamic_layout()) continue;
      Shape s;
      s.seq_q = s.seq_k = big_seq;
      s.heads_q = s.heads_kv = heads;
      s.head_dim = s.head_dim_v = 128;
      Plan plan;
      double ms = plan_ms(p, s, tile, 1, &plan);
      if (ms < 1000.0 && repeat > 1) ms = plan_ms(p, s, tile, repeat, &plan);
      const int64_t visited = plan.stats.full_tiles + plan.stats.partial_tiles;
      std::printf("%-20s %10.2f %12.2f %14lld %12.3f %8s\n", base_name(path).c_str(), ms, plan.stats.table_bytes / 1048576.0,
                  static_cast<long long>(visited), double(plan.stats.table_bytes) / double(std::max<int64_t>(visited, 1)),
                  !p.has_layout_kind(Layout::Kind::Random) ? "-" : plan.kernel_seeks ? "kernel" : "plan");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
