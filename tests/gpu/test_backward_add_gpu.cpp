// Attention::backward_add on the device under test: the gradients added into fp32 accumulators
// (one step of ring attention's backward) against the float64 reference on every kernel path, and
// deliberately broken adds that must fail (backward_cases.hpp runs the calls).
#include <catch2/catch.hpp>

#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "attnjit/attnjit.hpp"
#include "tests/gpu/backward_cases.hpp"
#include "tests/gpu/test_target.hpp"
#include "tests/unit/template_mutation.hpp"

using namespace attnjit;
using namespace attnjit::gradtest;

// Attention::backward_add, one step of ring attention's backward: the gradients added into fp32
// accumulators that hold earlier steps' sums, with D given, on every kernel path: the sm_80 single
// pass (dQ atomically added by _dkdv) and two-pass form (deterministic: _dq adds, bitwise
// repeatable), the SIMT kernels (fp32), the sm_90a wgmma kernels (TMA and cp.async). Patterns: keys
// after most queries (whole query tiles attend nothing, whole key tiles are attended by nobody),
// a dilated branch (its other residues idle), dense (keys that cover every row: the plain backward
// stores dK, dV, the add must not), overlapping branches (atomic dK/dV), and the lse's gradient.
TEST_CASE("backward_add: the gradients added into fp32 accumulators match the reference, on every kernel path",
          "[gpu][emu][grad][backward_add]") {
  if (on_gpu()) shared_context(0).make_current();
  struct Path {
    const char* name;
    int arch;
    bool tma;
    DType dt;
    int64_t d;
    bool deterministic;
  };
  std::vector<Path> paths = {{"sm80 single pass", 80, false, DType::BF16, 64, false},
                             {"sm80 two-pass", 80, false, DType::F16, 128, true},
                             {"sm80 column slices (head dim 256)", 80, false, DType::BF16, 256, false},
                             {"simt", 80, false, DType::F32, 32, false},
                             {"simt deterministic", 80, false, DType::F32, 32, true}};
  if (gputest::target() == gputest::Target::Emu || (on_gpu() && device_info(0).cc_major == 9)) {
    paths.push_back({"sm90a wgmma tma", 90, true, DType::BF16, 64, false});
    paths.push_back({"sm90a wgmma cp.async", 90, false, DType::BF16, 128, false});
    paths.push_back({"sm90a two-pass, tma", 90, true, DType::BF16, 128, true});  // bwd_sm90_dq.cuh adds dQ
    paths.push_back({"sm90a two-pass, cp.async", 90, false, DType::F16, 64, true});
  }
  const std::vector<std::tuple<std::string, Pattern, int64_t>> patterns = {
      {"causal-keys-later", PatternBuilder().branch(BranchSpec().full().causal()).build(), 200},
      {"dilated", PatternBuilder().branch(BranchSpec().segment(128).dilation(4).offset(OffsetRule::HeadMod)).build(), 0},
      {"dense", PatternBuilder().branch(BranchSpec().full()).build(), 0},
      {"overlapping", PatternBuilder()
                          .branch(BranchSpec().segment(64).dilation(1))
                          .branch(BranchSpec().segment(128).dilation(2).offset(OffsetRule::HeadMod).causal())
                          .build(),
       0},
  };
  uint64_t seed = 7300;
  for (const Path& path : paths) {
    RuntimeOptions ro;
    ro.device = gputest::target() == gputest::Target::Emu ? Device::emu(path.arch, path.arch == 90) : device_under_test();
    ro.tma = path.tma;
    Runtime rt(ro);
    for (const auto& [pname, p, k_offset] : patterns)
      for (const bool dlse : {false, true}) {
        Shape s;
        s.seq_q = s.seq_k = 300, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = path.d, s.k_offset = k_offset;
        INFO(path.name << " " << pname << (dlse ? " with dlse" : ""));
        std::vector<uint8_t> first, again;
        CHECK(check_backward(rt, p, s, path.dt, nullptr, seed, path.deterministic, &first, false, false, false, {}, dlse, true) == "");
        if (path.deterministic) {
          CHECK(check_backward(rt, p, s, path.dt, nullptr, seed, true, &again, false, false, false, {}, dlse, true) == "");
          CHECK(again == first);
        }
        ++seed;
      }
  }
}

// The check above fails for kernels that store where backward_add must add, or that skip key tiles
// with work.
TEST_CASE("backward_add: every deliberately broken add fails in the emulator", "[emu][grad][backward_add][mutation]") {
  if (gputest::target() != gputest::Target::Emu) {
    WARN("SKIPPED: the mutations run in the emulator (ATTNJIT_GPU_TESTS_DEVICE=emu)");
    return;
  }
  struct M {
    const char* name;
    const char* file;
    const char* from;
    const char* to;
    DType dt;
    bool deterministic;
  };
  const M mutations[] = {
      {"tensor-core two-pass dQ: the accumulator stored, not added to", "bwd_sm80.cuh",
       "acc[h][j * 8] += dq[j][2 * h] * bp.scale, acc[h][j * 8 + 1] += dq[j][2 * h + 1] * bp.scale;",
       "acc[h][j * 8] = dq[j][2 * h] * bp.scale, acc[h][j * 8 + 1] = dq[j][2 * h + 1] * bp.scale;", DType::BF16, true},
      {"tensor-core two-pass dQ: the exact sum stored, not added to", "bwd_sm80.cuh",
       "acc[h][j * 8] += x0 * bp.scale, acc[h][j * 8 + 1] += x1 * bp.scale;", "acc[h][j * 8] = x0 * bp.scale, acc[h][j * 8 + 1] = x1 * bp.scale;",
       DType::BF16, true},
      {"SIMT dQ: the accumulator stored, not added to", "bwd_simt.cuh", "acc[lane + AJ_SIMT_LANES * x] += dq[x] * bp.scale;",
       "acc[lane + AJ_SIMT_LANES * x] = dq[x] * bp.scale;", DType::F32, true},
      {"every key tile skipped as if no query attended it", "bwd_common.cuh",
       "return ki.entry_begin == ki.entry_end && bp.plain_add != 2;", "return bp.plain_add != 2;", DType::BF16, false},
      {"tensor-core dQ: rows whose exact sum runs added twice", "bwd_sm80.cuh", "(h ? valid1 : valid0) && !(redo >> h & 1)",
       "(h ? valid1 : valid0)", DType::BF16, true},
  };
  const Pattern p = PatternBuilder()
                        .branch(BranchSpec().segment(64).dilation(1).causal())
                        .branch(BranchSpec().segment(128).dilation(2).offset(OffsetRule::HeadMod).causal())
                        .build();
  Shape s;
  s.seq_q = s.seq_k = 200, s.heads_q = 2, s.heads_kv = 1, s.k_offset = 30;
  // A NaN in K at keys some rows mask: the tensor-core dQ sums those rows again, exactly.
  auto at = [&](int64_t row) { return size_t(row * 64 + 1); };
  const std::vector<Poke> pokes = {{'k', at(180), std::numeric_limits<float>::quiet_NaN()}, {'k', at(60), std::numeric_limits<float>::quiet_NaN()}};
  for (const bool mutated : {false, true})
    for (const M& m : mutations) {
      INFO((mutated ? "mutation: " : "unmutated, for: ") << m.name);
      RuntimeOptions ro;
      ro.device = Device::emu(80);
      if (mutated) {
        const auto t = testing::mutated_templates(m.file, m.from, m.to);
        REQUIRE(t);  // the template changed: update the mutation
        ro.templates = t;
      }
      Runtime rt(ro);
      s.head_dim = s.head_dim_v = m.dt == DType::F32 ? 32 : 64;
      const std::string outcome = check_backward(rt, p, s, m.dt, nullptr, 91, m.deterministic, nullptr, false, false, false,
                                                 m.dt == DType::F32 ? std::vector<Poke>{} : pokes, false, true);
      INFO("outcome: " << outcome);
      CHECK(outcome.empty() != mutated);
    }
}
