// The plan executor with values that are not ordinary: NaN and inf at masked and attended pairs
// (forward and gradients), extreme finite scores; and its threads and instruction-set variants.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <thread>
#include <tuple>

#include <sys/wait.h>
#include <unistd.h>

#include "compiler/plan/plan.hpp"
#include "compiler/plan/plan_backward.hpp"
#include "compiler/support/error.hpp"
#include "runtime/cpu/plan_executor.hpp"
#include "attnjit/reference.hpp"
#include "tests/unit/plan_test_support.hpp"
#include "tests/unit/random_patterns.hpp"

using namespace attnjit;
using attnjit::testing::CaseGenerator;
using attnjit::testing::describe;
using attnjit::testing::random_tensor;
using attnjit::testing::random_tiles;
using attnjit::testing::simd_variants;

TEST_CASE("the plan executor: a masked pair contributes exactly nothing, whatever its value", "[plan][executor]") {
  // Causal, 4x4 tiles: key 3 is masked for rows 0-2 inside the first (partial) tile. Its value is
  // huge, so a masked probability that were merely tiny would show.
  const Pattern p = PatternBuilder().causal().branch(BranchSpec().full()).build();
  Shape s;
  s.seq_q = s.seq_k = 8;
  s.heads_q = s.heads_kv = 1;
  s.head_dim = s.head_dim_v = 4;
  const Plan plan = lower_to_plan(p, s, TileConfig{4, 4});
  std::vector<float> q(32, 0.25f), k(32, 0.5f), v(32, 1.0f);
  for (int x = 0; x < 4; ++x) v[static_cast<size_t>(3 * 4 + x)] = 1e38f;
  for (const CpuSimd simd : simd_variants()) {
    INFO(cpu_simd_name(simd));
    const ExecutorOutput got = execute_plan(plan, p, q.data(), k.data(), v.data(), nullptr, {.simd = simd});
    for (size_t x = 0; x < 3 * 4; ++x) REQUIRE(got.o[x] == 1.0f);  // rows 0-2 average values that are all 1
    const ExecutorGradients g = execute_plan_backward(plan, lower_to_backward_plan(plan), p, q.data(), k.data(), v.data(),
                                                      got.o.data(), got.lse.data(), q.data(), nullptr, {.simd = simd});
    for (float x : g.dq) REQUIRE(std::isfinite(x));
  }
}

// A full tile (no mask, so no `keep` to zero anything): a score 1000 below the row's maximum has
// a weight of exactly 0 in float (e^-1000), as in the reference and the kernels' flushed ex2; a
// weight of 1.2e-38 (exp's argument clamped, not its result) made O 2.2 where the reference's is 1,
// through a V of 1e38. And a key of -inf's score at a query of +1 is -inf: its probability is 0,
// its dS 0, and dQ meets 0 * -inf, NaN as in the reference (a tiny probability made it -inf).
TEST_CASE("the plan executor: a score far below the maximum weighs exactly 0 in a tile without a mask", "[plan][executor]") {
  const Pattern p = PatternBuilder().scale(1.0).branch(BranchSpec().full()).build();
  Shape s;
  s.seq_q = 1;
  s.seq_k = 2;
  s.heads_q = s.heads_kv = 1;
  s.head_dim = s.head_dim_v = 1;
  const Plan plan = lower_to_plan(p, s, TileConfig{16, 16});
  const std::vector<float> q{1.0f}, v{1.0f, 1e38f}, dout{1.0f};
  for (const float far : {-1000.0f, -std::numeric_limits<float>::infinity()}) {
    const std::vector<float> k{0.0f, far};
    const ReferenceOutput want = reference_attention(p, s, q.data(), k.data(), v.data());
    const ReferenceGradients want_g = reference_attention_backward(p, s, q.data(), k.data(), v.data(), dout.data());
    for (const CpuSimd simd : simd_variants()) {
      INFO(cpu_simd_name(simd) << ", key " << far);
      const ExecutorOutput got = execute_plan(plan, p, q.data(), k.data(), v.data(), nullptr, {.simd = simd});
      REQUIRE(want.o[0] == 1.0);
      REQUIRE(got.o[0] == 1.0f);
      REQUIRE(got.lse[0] == 0.0f);
      const ExecutorGradients g = execute_plan_backward(plan, lower_to_backward_plan(plan), p, q.data(), k.data(), v.data(),
                                                        got.o.data(), got.lse.data(), dout.data(), nullptr, {.simd = simd});
      INFO("dq " << g.dq[0] << ", reference " << want_g.dq[0]);
      REQUIRE(std::isnan(g.dq[0]) == std::isnan(want_g.dq[0]));
      if (!std::isnan(want_g.dq[0])) CHECK(g.dq[0] == Approx(want_g.dq[0]).margin(1e-6));
      for (size_t e = 0; e < 2; ++e) {
        INFO("dk/dv element " << e << ": " << g.dk[e] << " " << g.dv[e] << ", reference " << want_g.dk[e] << " " << want_g.dv[e]);
        CHECK(g.dk[e] == Approx(want_g.dk[e]).margin(1e-6));
        CHECK(g.dv[e] == Approx(want_g.dv[e]).margin(1e-6));
      }
    }
  }
}

// A scaled score past fp32's range is +inf: its row is NaN (the maximum +inf, inf - inf), never a
// finite row unlike the reference's; rows whose scores stay finite are the reference's.
TEST_CASE("the plan executor: a row whose scores overflow fp32 is NaN, the others the reference's", "[plan][executor]") {
  const Pattern p = PatternBuilder().scale(1e38).causal().branch(BranchSpec().full()).build();
  Shape s;
  s.seq_q = s.seq_k = 4;
  s.heads_q = s.heads_kv = 1;
  s.head_dim = s.head_dim_v = 1;
  // Scores scale * q_i * k_j: row 2 meets key 2 at 4e38 (past 3.4e38); rows 0, 1 and 3 stay finite
  // (row 3 meets keys 0..3 at 0, ±1e38 and 1e38 * 0.5).
  const std::vector<float> q{1.0f, 1.0f, 2.0f, 1.0f}, k{0.0f, 1.0f, 2.0f, -0.5f}, v{1.0f, 2.0f, 3.0f, 4.0f};
  const ReferenceOutput want = reference_attention(p, s, q.data(), k.data(), v.data());
  for (const CpuSimd simd : simd_variants()) {
    INFO(cpu_simd_name(simd));
    const ExecutorOutput got = execute_plan(lower_to_plan(p, s, TileConfig{16, 16}), p, q.data(), k.data(), v.data(), nullptr, {.simd = simd});
    for (int r = 0; r < 4; ++r) {
      INFO("row " << r << ": o " << got.o[size_t(r)] << " lse " << got.lse[size_t(r)] << ", reference " << want.o[size_t(r)]);
      REQUIRE(std::isfinite(want.o[size_t(r)]));
      if (r == 2) {
        CHECK(std::isnan(got.o[size_t(r)]));
        CHECK(std::isnan(got.lse[size_t(r)]));
      } else {
        CHECK(got.o[size_t(r)] == Approx(want.o[size_t(r)]).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("the plan executor: a NaN input shows in the output rows it reaches, never hidden", "[plan][executor]") {
  // The vectorised exp clamps its argument; a NaN must come through it (and through the row max).
  const Pattern p = PatternBuilder().branch(BranchSpec().full()).build();
  Shape s;
  s.seq_q = s.seq_k = 24;  // keys not a multiple of the packet width: the scalar tail too
  s.heads_q = s.heads_kv = 1;
  s.head_dim = s.head_dim_v = 8;
  const Plan plan = lower_to_plan(p, s, TileConfig{8, 16});
  std::vector<float> q(24 * 8, 0.25f), k(24 * 8, 0.5f), v(24 * 8, 1.0f);
  q[5 * 8 + 3] = std::numeric_limits<float>::quiet_NaN();  // query row 5
  for (const CpuSimd simd : simd_variants()) {
    INFO(cpu_simd_name(simd));
    const ExecutorOutput got = execute_plan(plan, p, q.data(), k.data(), v.data(), nullptr, {.simd = simd});
    for (int64_t i = 0; i < 24; ++i) {
      INFO("row " << i);
      CHECK(std::isnan(got.o[static_cast<size_t>(i * 8)]) == (i == 5));
    }
  }
}

TEST_CASE("a NaN input is NaN in the rows that attend it on the reference and the plan executor, partial tiles too", "[plan][executor]") {
  // Causal: the diagonal tiles are partial, so a row's masked scores (-inf) sit beside its NaN
  // ones, and a row maximum that skips the NaN would leave the row looking empty (O = 0, LSE = -inf).
  const Pattern p = PatternBuilder().causal().branch(BranchSpec().full()).build();
  Shape s;
  s.seq_q = s.seq_k = 8;
  s.heads_q = s.heads_kv = 1;
  s.head_dim = s.head_dim_v = 4;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const bool in_key : {false, true}) {
    std::vector<float> q = random_tensor(32, 1), k = random_tensor(32, 2), v = random_tensor(32, 3);
    // A NaN in query row 1 reaches row 1; one in key row 2 reaches the rows that attend it (2..7).
    (in_key ? k : q)[in_key ? 2 * 4 + 1 : 1 * 4 + 2] = nan;
    auto reached = [&](int64_t i) { return in_key ? i >= 2 : i == 1; };
    const ReferenceOutput want = reference_attention(p, s, q.data(), k.data(), v.data());
    for (int64_t i = 0; i < 8; ++i) {
      INFO((in_key ? "NaN key, " : "NaN query, ") << "reference row " << i);
      CHECK(std::isnan(want.o[static_cast<size_t>(i * 4)]) == reached(i));
      CHECK(std::isnan(want.lse[static_cast<size_t>(i)]) == reached(i));
    }
    for (const CpuSimd simd : simd_variants()) {
      for (const TileConfig tiles : {TileConfig{4, 4}, TileConfig{2, 8}, TileConfig{8, 3}, TileConfig{1, 1}, TileConfig{8, 8}}) {
        const ExecutorOutput got = execute_plan(lower_to_plan(p, s, tiles), p, q.data(), k.data(), v.data(), nullptr, {.simd = simd});
        for (int64_t i = 0; i < 8; ++i) {
          INFO((in_key ? "NaN key, " : "NaN query, ") << cpu_simd_name(simd) << ", tile " << tiles.tile_q << "x" << tiles.tile_k
                                                     << ", row " << i);
          CHECK(std::isnan(got.o[static_cast<size_t>(i * 4)]) == reached(i));
          CHECK(std::isnan(got.lse[static_cast<size_t>(i)]) == reached(i));
        }
      }
    }
  }
}

TEST_CASE("a NaN in a query, key or value row makes exactly the reference's rows NaN on the plan executor", "[plan][executor][property]") {
  // Random patterns: masked scores (-inf) may come before or after the NaN ones in a partial tile,
  // in any order the row maximum sees them. A NaN in V reaches the rows that attend its key and no
  // other, though rows that mask the key share its tile (0 * NaN must not happen).
  const auto variants = simd_variants();
  CaseGenerator gen(1717);
  for (int n = 0; n < 300; ++n) {
    const auto c = gen.next();
    const TileConfig tiles = random_tiles(gen);
    const DynamicLayout* dyn = c.dynamic ? &*c.dynamic : nullptr;
    const Shape& s = c.shape;
    auto q = random_tensor(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim), 10 * n + 1);
    auto k = random_tensor(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim), 10 * n + 2);
    auto v = random_tensor(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim_v), 10 * n + 3);
    const int which = static_cast<int>(gen.uniform(0, 2));
    const bool in_key = which == 1;
    std::vector<float>& t = which == 0 ? q : which == 1 ? k : v;
    t[static_cast<size_t>(gen.uniform(0, static_cast<int64_t>(t.size()) - 1))] = std::numeric_limits<float>::quiet_NaN();
    const ReferenceOutput want = reference_attention(c.pattern, s, q.data(), k.data(), v.data(), dyn, 1);
    const Plan plan = lower_to_plan(c.pattern, s, tiles, dyn);
    for (const CpuSimd simd : variants) {
      const ExecutorOutput got = execute_plan(plan, c.pattern, q.data(), k.data(), v.data(), dyn, {.simd = simd});
      INFO("case " << n << " (" << cpu_simd_name(simd) << (which == 2 ? ", NaN value" : in_key ? ", NaN key" : ", NaN query") << ")\n"
                    << describe(c, tiles));
      for (size_t x = 0; x < want.lse.size(); ++x) {
        INFO("lse index " << x << ": reference " << want.lse[x] << ", plan executor " << got.lse[x]);
        REQUIRE(std::isnan(got.lse[x]) == std::isnan(want.lse[x]));
      }
      for (size_t x = 0; x < want.o.size(); ++x) {
        INFO("o index " << x);
        REQUIRE(std::isnan(got.o[x]) == std::isnan(want.o[x]));
      }
    }
  }
}

// A non-finite V at a key that rows of its tile mask: a window [5, 0] with a NaN at key 40 makes
// rows 40..45 NaN and no other; a causal mask with an inf at key 63 only row 63 on (the rows
// before it share the tile). Before, every row of the key's tile came out NaN (0 * NaN in P V).
// The gradients of the rows that mask the key stay finite too (dS of a masked pair is 0, selected).
TEST_CASE("the plan executor: a NaN or inf in V reaches only the rows that attend its key", "[plan][executor]") {
  Shape s;
  s.seq_q = s.seq_k = 100;
  s.heads_q = s.heads_kv = 1;
  s.head_dim = s.head_dim_v = 8;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Probe {
    const char* name;
    Pattern p;
    int64_t key;
    float value;
    int64_t first, last;  // the rows the reference makes non-finite
  };
  const Probe probes[] = {
      {"window [5, 0], NaN at key 40", PatternBuilder().branch(BranchSpec().full().window(5, 0)).build(), 40, nan, 40, 45},
      {"causal, inf at key 63", PatternBuilder().causal().branch(BranchSpec().full()).build(), 63, inf, 63, 99},
  };
  for (const Probe& pr : probes) {
    std::vector<float> q = random_tensor(800, 1), k = random_tensor(800, 2), v = random_tensor(800, 3), dout = random_tensor(800, 4);
    v[static_cast<size_t>(pr.key * 8 + 2)] = pr.value;
    const ReferenceOutput want = reference_attention(pr.p, s, q.data(), k.data(), v.data());
    const ReferenceGradients want_g = reference_attention_backward(pr.p, s, q.data(), k.data(), v.data(), dout.data());
    for (const CpuSimd simd : simd_variants())
      for (const TileConfig tiles : {TileConfig{64, 64}, TileConfig{16, 32}, TileConfig{8, 3}}) {
        INFO(pr.name << ", " << cpu_simd_name(simd) << ", tile " << tiles.tile_q << "x" << tiles.tile_k);
        const Plan plan = lower_to_plan(pr.p, s, tiles);
        const ExecutorOutput got = execute_plan(plan, pr.p, q.data(), k.data(), v.data(), nullptr, {.simd = simd});
        for (int64_t i = 0; i < 100; ++i) {
          INFO("row " << i);
          const bool reached = i >= pr.first && i <= pr.last;
          REQUIRE(std::isfinite(want.o[static_cast<size_t>(i * 8 + 2)]) == !reached);
          CHECK(std::isfinite(got.o[static_cast<size_t>(i * 8 + 2)]) == !reached);
          for (int64_t d = 0; d < 8; ++d)
            if (d != 2) CHECK(std::abs(got.o[static_cast<size_t>(i * 8 + d)] - want.o[static_cast<size_t>(i * 8 + d)]) < (reached ? INFINITY : 1e-5));
        }
        const ExecutorGradients g = execute_plan_backward(plan, lower_to_backward_plan(plan), pr.p, q.data(), k.data(), v.data(),
                                                          got.o.data(), got.lse.data(), dout.data(), nullptr, {.simd = simd});
        for (const auto& [name, x, w] : {std::tuple<const char*, const std::vector<float>*, const std::vector<double>*>{"dq", &g.dq, &want_g.dq},
                                         {"dk", &g.dk, &want_g.dk}, {"dv", &g.dv, &want_g.dv}})
          for (size_t e = 0; e < x->size(); ++e) {
            INFO(name << " element " << e << ": " << (*x)[e] << ", reference " << (*w)[e]);
            CHECK(std::isfinite((*x)[e]) == std::isfinite((*w)[e]));
          }
      }
  }
}

// The same for a NaN or inf in Q, K or dO: the products dK += dS^T Q, dV += P^T dO and dQ += dS K
// would multiply it by the zero weight of the pairs that mask it. Window [5, 0]: a NaN in query
// row 10 (attending keys 5..10), in key 40 (attended by rows 40..45), an inf in dO of row 70; the
// gradients are non-finite exactly where the reference's are, and close elsewhere, in both
// backward schedules.
TEST_CASE("the plan executor: a NaN or inf in Q or K or dO reaches only the gradients the reference gives it", "[plan][executor]") {
  Shape s;
  s.seq_q = s.seq_k = 100;
  s.heads_q = s.heads_kv = 1;
  s.head_dim = s.head_dim_v = 8;
  const Pattern p = PatternBuilder().branch(BranchSpec().full().window(5, 0)).build();
  std::vector<float> q = random_tensor(800, 1), k = random_tensor(800, 2), v = random_tensor(800, 3), dout = random_tensor(800, 4);
  q[10 * 8 + 1] = std::numeric_limits<float>::quiet_NaN();
  k[40 * 8 + 5] = std::numeric_limits<float>::quiet_NaN();
  dout[70 * 8 + 3] = std::numeric_limits<float>::infinity();
  const ReferenceGradients want_g = reference_attention_backward(p, s, q.data(), k.data(), v.data(), dout.data());
  for (const CpuSimd simd : simd_variants())
    for (const TileConfig tiles : {TileConfig{64, 64}, TileConfig{16, 32}, TileConfig{8, 3}})
      for (const BackwardSchedule schedule : {BackwardSchedule::Fused, BackwardSchedule::Split}) {
        INFO(cpu_simd_name(simd) << ", tile " << tiles.tile_q << "x" << tiles.tile_k << (schedule == BackwardSchedule::Fused ? ", fused" : ", split"));
        const Plan plan = lower_to_plan(p, s, tiles);
        const ExecutorOutput got = execute_plan(plan, p, q.data(), k.data(), v.data(), nullptr, {.simd = simd});
        const ExecutorGradients g = execute_plan_backward(plan, lower_to_backward_plan(plan), p, q.data(), k.data(), v.data(), got.o.data(),
                                                          got.lse.data(), dout.data(), nullptr, {.simd = simd, .schedule = schedule});
        size_t reached = 0;
        for (const auto& [name, x, w] : {std::tuple<const char*, const std::vector<float>*, const std::vector<double>*>{"dq", &g.dq, &want_g.dq},
                                         {"dk", &g.dk, &want_g.dk}, {"dv", &g.dv, &want_g.dv}})
          for (size_t e = 0; e < x->size(); ++e) {
            INFO(name << " element " << e << ": " << (*x)[e] << ", reference " << (*w)[e]);
            REQUIRE(std::isfinite((*x)[e]) == std::isfinite((*w)[e]));
            if (std::isfinite((*w)[e])) CHECK(std::abs((*x)[e] - (*w)[e]) < 1e-4 * (1 + std::abs((*w)[e])));
            else ++reached;
          }
        CHECK(reached > 0);  // the inputs do reach the gradients of the pairs that attend them
      }
}

// Scores of about 1e30: an exponent fused with the scale (s * scale - max in one fma) is off by
// the product's rounding error, far past exp's range (the executor's exp clamps its argument, so
// one such term stays finite, two overflow the sum). Each exponent is the rounded scaled score minus
// the rounded maximum: O is the value of the row's largest score, as in the reference.
TEST_CASE("the plan executor: extreme finite scores keep the maximum's weight at exactly 1", "[plan][executor]") {
  const Pattern p = PatternBuilder().causal().branch(BranchSpec().full()).build();
  Shape s;
  s.seq_q = s.seq_k = 40;
  s.heads_q = s.heads_kv = 1;
  s.head_dim = s.head_dim_v = 16;
  std::vector<float> q = random_tensor(640, 5), k = random_tensor(640, 6);
  const std::vector<float> v = random_tensor(640, 7);
  for (float& x : q) x *= 1e15f;
  for (float& x : k) x *= 1e15f;
  const ReferenceOutput want = reference_attention(p, s, q.data(), k.data(), v.data());
  for (const CpuSimd simd : simd_variants()) {
    INFO(cpu_simd_name(simd));
    const ExecutorOutput got = execute_plan(lower_to_plan(p, s, TileConfig{16, 16}), p, q.data(), k.data(), v.data(), nullptr, {.simd = simd});
    for (size_t x = 0; x < got.o.size(); ++x) {
      INFO("o index " << x);
      REQUIRE(std::abs(got.o[x] - want.o[x]) < 1e-5);
    }
    for (size_t x = 0; x < got.lse.size(); ++x) CHECK(std::abs(got.lse[x] - want.lse[x]) <= 1e-6 * std::abs(want.lse[x]));
  }
}

// A packed plan weights a key that two branches attend by 2. Scores near 2^22 that differ by less
// than one (float spacing 0.5 there): ln 2 added to such a score would round to 0.5 (a weight of
// 1.65); the executor multiplies the probability instead, so O weighs the shared keys exactly twice.
TEST_CASE("the plan executor: a packed plan's weights stay exact at large scores", "[plan][executor]") {
  const Pattern p = PatternBuilder().scale(1.0).branch(BranchSpec().full()).branch(BranchSpec().full().dilation(2)).build();
  Shape s;
  s.seq_q = s.seq_k = 32;
  s.heads_q = s.heads_kv = 1;
  s.head_dim = s.head_dim_v = 4;
  std::vector<float> q(128, 0.0f), k(128, 0.0f);
  const std::vector<float> v = random_tensor(128, 9);
  for (int64_t i = 0; i < 32; ++i) {
    q[size_t(i * 4)] = 4194304.0f;                                     // 2^22
    k[size_t(i * 4)] = 1.0f + float((i * 7) % 11) * 1.1920929e-7f;    // scores 2^22 + 0.5 * (0..10)
  }
  const ReferenceOutput want = reference_attention(p, s, q.data(), k.data(), v.data());
  const Plan plan = lower_to_plan(p, s, TileConfig{8, 8}, nullptr, nullptr, RandomLayouts::InPlan, BranchPacking::Packed);
  REQUIRE(plan.stats.packed_tiles > 0);
  for (const CpuSimd simd : simd_variants()) {
    INFO(cpu_simd_name(simd));
    const ExecutorOutput got = execute_plan(plan, p, q.data(), k.data(), v.data(), nullptr, {.simd = simd});
    for (size_t x = 0; x < got.o.size(); ++x) {
      INFO("o index " << x);
      REQUIRE(std::abs(got.o[x] - want.o[x]) < 1e-5);
    }
  }
}

TEST_CASE("the plan executor uses one thread for a small call and every core for a large one", "[plan][executor]") {
  const Pattern p = PatternBuilder().branch(BranchSpec().full()).build();
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  Shape tiny;
  tiny.seq_q = tiny.seq_k = 16, tiny.heads_q = tiny.heads_kv = 2, tiny.head_dim = tiny.head_dim_v = 16;
  CHECK(executor_threads(lower_to_plan(p, tiny, TileConfig{128, 128}), 0) == 1);
  CHECK(executor_threads(lower_to_plan(p, tiny, TileConfig{128, 128}), 3) == 3);  // asked for: given
  Shape big;  // 2^33 FLOP of tile products: 512 threads' worth
  big.seq_q = big.seq_k = 2048, big.heads_q = big.heads_kv = 8, big.head_dim = big.head_dim_v = 64;
  CHECK(executor_threads(lower_to_plan(p, big, TileConfig{128, 128}), 0) == std::min(cores, 512u));
  Shape mid = big;  // 2^25 FLOP: two threads at most
  mid.seq_q = mid.seq_k = 128;
  CHECK(executor_threads(lower_to_plan(p, mid, TileConfig{128, 128}), 0) == std::min(cores, 2u));
}

// Callers on several threads at once each get their own answer, and a forked child (which has none
// of the parent's threads) runs the executor on threads of its own.
TEST_CASE("the plan executor's threads: concurrent callers and a forked child", "[plan][executor]") {
  const Pattern p = PatternBuilder().causal().branch(BranchSpec().segment(64).dilation(2)).branch(BranchSpec().full()).build();
  Shape s;
  s.seq_q = s.seq_k = 192, s.heads_q = s.heads_kv = 4, s.head_dim = s.head_dim_v = 16;
  const Plan plan = lower_to_plan(p, s, TileConfig{32, 32});
  const size_t n = static_cast<size_t>(s.seq_q * s.heads_q * s.head_dim);
  std::vector<std::vector<float>> inputs;
  for (int i = 0; i < 4; ++i) inputs.push_back(random_tensor(n, 100 + i));
  auto run = [&](int i, unsigned threads) {
    const auto& x = inputs[static_cast<size_t>(i)];
    return execute_plan(plan, p, x.data(), x.data(), x.data(), nullptr, {.threads = threads}).o;
  };
  std::vector<std::vector<float>> want;
  for (int i = 0; i < 4; ++i) want.push_back(run(i, 1));
  std::vector<std::vector<float>> got(4);
  std::vector<std::thread> callers;
  for (int i = 0; i < 4; ++i) callers.emplace_back([&, i] {
    for (int rep = 0; rep < 5; ++rep) got[static_cast<size_t>(i)] = run(i, 3);
  });
  for (auto& t : callers) t.join();
  for (int i = 0; i < 4; ++i) REQUIRE(got[static_cast<size_t>(i)] == want[static_cast<size_t>(i)]);

  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    alarm(60);  // a child that waited on threads it does not have would hang: end it instead
    _exit(run(1, 3) == want[1] ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  INFO("child status " << status);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
}

TEST_CASE("the plan executor's instruction-set choice: the knob, and a clear error for a missing variant", "[plan][executor][errors]") {
  CHECK(cpu_simd_available(CpuSimd::Generic));
  CHECK(cpu_simd_runs_here(CpuSimd::Generic));
  const Pattern p = PatternBuilder().branch(BranchSpec().full()).build();
  Shape s;
  s.seq_q = s.seq_k = 8;
  const Plan plan = lower_to_plan(p, s, TileConfig{4, 4});
  const std::vector<float> x(static_cast<size_t>(8 * s.heads_q * s.head_dim), 0.5f);
  const ExecutorOutput a = execute_plan(plan, p, x.data(), x.data(), x.data(), nullptr, {.simd = CpuSimd::Generic});
  for (const CpuSimd simd : {CpuSimd::Avx2, CpuSimd::Avx512}) {
    INFO(cpu_simd_name(simd));
    if (!(cpu_simd_available(simd) && cpu_simd_runs_here(simd))) {
      CHECK_THROWS_WITH(execute_plan(plan, p, x.data(), x.data(), x.data(), nullptr, {.simd = simd}),
                        Catch::Contains("ATTNJIT_CPU_SIMD") && Catch::Contains(std::string(cpu_simd_name(simd)) + " was asked for") &&
                            Catch::Contains("use auto or generic"));
    } else {
      // Every variant gives the same output on the same plan (to float32 rounding).
      const ExecutorOutput b = execute_plan(plan, p, x.data(), x.data(), x.data(), nullptr, {.simd = simd});
      for (size_t i = 0; i < a.o.size(); ++i) REQUIRE(a.o[i] == Approx(b.o[i]).epsilon(1e-6));
    }
  }
  // Auto takes the widest variant this build and CPU run (unless ATTNJIT_CPU_SIMD names one).
  if (knobs().cpu_simd != CpuSimd::Auto) return;
  const CpuSimd widest = cpu_simd_runs_here(CpuSimd::Avx512) && cpu_simd_available(CpuSimd::Avx512) ? CpuSimd::Avx512
                         : cpu_simd_runs_here(CpuSimd::Avx2) && cpu_simd_available(CpuSimd::Avx2) ? CpuSimd::Avx2
                                                                                                    : CpuSimd::Generic;
  CHECK(cpu_simd_selected() == widest);
}
