// Helpers shared by the plan tests (test_plan.cpp) and the plan executor's (test_plan_executor.cpp).
#pragma once

#include <catch2/catch.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "compiler/plan/plan.hpp"
#include "runtime/cpu/plan_executor.hpp"
#include "tests/unit/random_patterns.hpp"

namespace attnjit::testing {

inline TileConfig random_tiles(CaseGenerator& gen) {
  TileConfig t;
  t.tile_q = static_cast<int32_t>(gen.coin(0.3) ? 64 : gen.uniform(1, 12));
  t.tile_k = static_cast<int32_t>(gen.coin(0.3) ? 64 : gen.uniform(1, 12));
  return t;
}

inline std::string describe(const attnjit::testing::RandomCase& c, const TileConfig& t) {
  std::ostringstream os;
  os << canonical_text(c.pattern) << "seq_q=" << c.shape.seq_q << " seq_k=" << c.shape.seq_k << " heads_q=" << c.shape.heads_q
     << " heads_kv=" << c.shape.heads_kv << " q_offset=" << c.shape.q_offset << " k_offset=" << c.shape.k_offset
     << " tile=" << t.tile_q << "x" << t.tile_k << (c.dynamic ? " dynamic" : "");
  return os.str();
}

// Every compiled variant of the executor's tile arithmetic that this CPU runs; the one it cannot
// run is reported, not silently dropped.
inline std::vector<CpuSimd> simd_variants() {
  std::vector<CpuSimd> out{CpuSimd::Generic};
  for (const CpuSimd simd : {CpuSimd::Avx2, CpuSimd::Avx512}) {
    if (cpu_simd_available(simd) && cpu_simd_runs_here(simd)) out.push_back(simd);
    else WARN("the " << cpu_simd_name(simd) << " variant of the plan executor is not tested: "
                     << (cpu_simd_available(simd) ? "this CPU lacks it" : "not in this build"));
  }
  return out;
}

}  // namespace attnjit::testing
