// The Plan: its tiles cover exactly the mask (with multiplicity), every row is written once,
// no visited tile is empty, and the plan executor matches the reference (its non-finite values,
// threads and instruction sets: test_plan_executor.cpp).
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <thread>
#include <tuple>

#include <sys/wait.h>
#include <unistd.h>

#include "compiler/pattern/pattern_stats.hpp"
#include "compiler/plan/plan.hpp"
#include "compiler/plan/paged_plan.hpp"
#include "compiler/pattern/spec_json.hpp"
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

namespace {

// Each (head, row, key) was visited as often as the mask counts it (count is [head][row][key]).
void require_mask_counts(const Pattern& p, const Shape& s, const DynamicLayout* dyn, const std::vector<int>& count) {
  const MaskContext ctx{p, s, dyn};
  for (int64_t h = 0; h < s.heads_q; ++h)
    for (int64_t i = 0; i < s.seq_q; ++i)
      for (int64_t j = 0; j < s.seq_k; ++j) {
        INFO("head " << h << " row " << i << " key " << j);
        REQUIRE(count[static_cast<size_t>((h * s.seq_q + i) * s.seq_k + j)] == attend_count(ctx, h, i, j));
      }
}

}  // namespace

// Packed plans (BranchPacking::Packed) too: there a visited pair counts its key's weight, so the
// counts say that every pair is computed as often as the branches that attend it, once or weighted.
TEST_CASE("plan tiles cover exactly the mask, with multiplicity, every row once, no empty tile", "[plan][property]") {
  CaseGenerator gen(777);
  int64_t packed_tiles = 0, packed_plans = 0;
  for (int n = 0; n < 800; ++n) {
    const auto c = gen.next();
    const TileConfig tiles = random_tiles(gen);
    const DynamicLayout* dyn = c.dynamic ? &*c.dynamic : nullptr;
    const BranchPacking packing = n % 2 ? BranchPacking::Packed : BranchPacking::Separate;
    INFO("case " << n << (n % 2 ? " (packed)" : "") << "\n" << describe(c, tiles));
    const Plan plan = lower_to_plan(c.pattern, c.shape, tiles, dyn, nullptr, RandomLayouts::InPlan, packing);
    if (packing == BranchPacking::Separate) REQUIRE_FALSE(plan.packed());
    packed_tiles += plan.stats.packed_tiles;
    packed_plans += plan.packed();
    const Shape& s = c.shape;
    std::vector<int> count(static_cast<size_t>(s.heads_q * s.seq_q * s.seq_k), 0);
    std::vector<int> written(static_cast<size_t>(s.heads_q * s.seq_q), 0);
    for (const WorkItem& item : plan.items) {
      REQUIRE(item.rows.count >= 1);
      REQUIRE(item.rows.count <= tiles.tile_q);
      for (int64_t r = 0; r < item.rows.count; ++r) ++written[static_cast<size_t>(item.head * s.seq_q + item.rows.at(r))];
      for (int64_t sp = item.span_begin; sp < item.span_end; ++sp) {
        const KeySpan& span = plan.spans[static_cast<size_t>(sp)];
        for_each_visited_tile(plan, span, [&](int32_t t, bool full) {
          const RowMap keys = tile_keys(span, t, tiles.tile_k);
          REQUIRE(keys.count >= 1);
          int64_t attended = 0;
          for (int64_t r = 0; r < item.rows.count; ++r)
            for (int64_t kc = 0; kc < keys.count; ++kc) {
              const int64_t i = item.rows.at(r), j = keys.at(kc);
              REQUIRE(i >= 0);
              REQUIRE(i < s.seq_q);
              REQUIRE(j >= 0);
              REQUIRE(j < s.seq_k);
              const int weight = span.weighted() ? plan.key_weights[static_cast<size_t>(span.weight_begin + int64_t{t} * tiles.tile_k + kc)] : 1;
              REQUIRE(weight >= 1);
              if (full || partial_tile_allows(c.pattern, span.branch, item.head, s.q_offset + i, s.k_offset + j, dyn)) {
                count[static_cast<size_t>((item.head * s.seq_q + i) * s.seq_k + j)] += weight;
                ++attended;
              }
            }
          INFO("head " << item.head << " branch " << span.branch << " tile " << t);
          REQUIRE(attended > 0);  // empty tiles never reach the GPU
        });
      }
    }
    for (int v : written) REQUIRE(v == 1);
    require_mask_counts(c.pattern, s, dyn, count);
  }
  // The sweep's patterns overlap often enough that packing must have left tiles out.
  CHECK(packed_plans > 20);
  CHECK(packed_tiles > 100);
}

TEST_CASE("a partial tile's row mask at once equals the predicate asked pair by pair", "[plan][mask][property]") {
  CaseGenerator gen(4242);
  std::mt19937_64 rng(17);
  int64_t kept = 0, dropped = 0;
  for (int n = 0; n < 300; ++n) {
    const auto c = gen.next();
    const DynamicLayout* dyn = c.dynamic ? &*c.dynamic : nullptr;
    const Shape& s = c.shape;
    for (int trial = 0; trial < 16; ++trial) {
      const int32_t branch = static_cast<int32_t>(rng() % c.pattern.branches.size());
      const int32_t head = static_cast<int32_t>(rng() % uint64_t(s.heads_q));
      const int64_t qpos = s.q_offset + static_cast<int64_t>(rng() % uint64_t(s.seq_q));
      const int64_t step = 1 + static_cast<int64_t>(rng() % 4) * static_cast<int64_t>(rng() % 3);
      const int64_t count = 1 + static_cast<int64_t>(rng() % 80);
      const int64_t kpos0 = s.k_offset + static_cast<int64_t>(rng() % uint64_t(s.seq_k));
      std::vector<float> keep(static_cast<size_t>(count), -1.0f);
      partial_tile_row(c.pattern, branch, head, qpos, kpos0, step, count, dyn, keep.data());
      for (int64_t col = 0; col < count; ++col) {
        const bool want = partial_tile_allows(c.pattern, branch, head, qpos, kpos0 + col * step, dyn);
        INFO("case " << n << " branch " << branch << " head " << head << " qpos " << qpos << " keys " << kpos0 << "+" << step
                     << "c, c<" << count << ", column " << col << "\n" << canonical_text(c.pattern));
        REQUIRE(keep[static_cast<size_t>(col)] == (want ? 1.0f : 0.0f));
        ++(want ? kept : dropped);
      }
    }
  }
  REQUIRE(kept > 1000);  // both answers are exercised
  REQUIRE(dropped > 1000);
}

// A table that stays on the device is not seen by the planner: the plan is lowered with every block
// kept (DynamicLayout::every_block) and the kernels skip, per tile, what the table does not keep.
// Its tiles must hold every pair of any table, and a tile it calls full must be full for every
// table, except in a branch whose layout is the table itself, where the kernel narrows "full" to
// tiles inside one query block and one key block that the table keeps (as here).
TEST_CASE("a plan whose layouts the kernels decide (tables on the device, random in the kernels) covers every mask, with multiplicity",
          "[plan][property][device_table][random_in_kernel]") {
  CaseGenerator gen(778);
  int tables = 0, randoms = 0;
  for (int n = 0; n < 3000 && (tables < 120 || randoms < 120); ++n) {
    const auto c = gen.next();
    const bool random = c.pattern.has_layout_kind(Layout::Kind::Random);
    if (!c.dynamic && !random) continue;
    tables += c.dynamic.has_value(), randoms += random;
    const TileConfig tiles = random_tiles(gen);
    const DynamicLayout* dyn = c.dynamic ? &*c.dynamic : nullptr;
    INFO("case " << n << "\n" << describe(c, tiles));
    const Plan plan = lower_to_plan(c.pattern, c.shape, tiles, dyn ? &DynamicLayout::every_block() : nullptr, nullptr,
                                    RandomLayouts::InKernel);
    // The branches left to the kernels: those whose layouts hold the table or a random node.
    uint64_t seeks = 0;
    for (size_t b = 0; b < c.pattern.branches.size(); ++b) {
      const auto& l = c.pattern.branches[b].layout;
      if (l && (layout_has_kind(*l, Layout::Kind::Dynamic) || layout_has_kind(*l, Layout::Kind::Random))) seeks |= uint64_t{1} << b;
    }
    REQUIRE(plan.kernel_seeks == seeks);
    const Shape& s = c.shape;
    std::vector<int> count(static_cast<size_t>(s.heads_q * s.seq_q * s.seq_k), 0);
    for (const WorkItem& item : plan.items) {
      for (int64_t sp = item.span_begin; sp < item.span_end; ++sp) {
        const KeySpan& span = plan.spans[static_cast<size_t>(sp)];
        // A tile of a branch the kernels decide is never full here (they take it whole only where
        // the layout keeps it whole): every pair is asked, as a kernel's mask does.
        for_each_visited_tile(plan, span, [&](int32_t t, bool full) {
          if (plan.kernel_seeks_branch(span.branch)) REQUIRE_FALSE(full);
          const RowMap keys = tile_keys(span, t, tiles.tile_k);
          for (int64_t r = 0; r < item.rows.count; ++r)
            for (int64_t kc = 0; kc < keys.count; ++kc) {
              const int64_t i = item.rows.at(r), j = keys.at(kc);
              if (full || partial_tile_allows(c.pattern, span.branch, item.head, s.q_offset + i, s.k_offset + j, dyn))
                ++count[static_cast<size_t>((item.head * s.seq_q + i) * s.seq_k + j)];
            }
        });
      }
    }
    require_mask_counts(c.pattern, s, dyn, count);
  }
  REQUIRE(tables >= 50);
  REQUIRE(randoms >= 50);
}

TEST_CASE("a key-major plan too large to hold is a clear error, not an allocation", "[plan][grad][errors][random_in_kernel]") {
  // BigBird at a million tokens, its random blocks left to the kernels: 4 G band tiles.
  const Pattern p = PatternBuilder()
                        .layout(layouts::union_of({layouts::local(1, 128, 128), layouts::global({0, 1}, 128, 128),
                                                   layouts::random(0.025, 2020, 128, 128)}, 128, 128))
                        .branch(BranchSpec().full())
                        .build();
  Shape s;
  s.seq_q = s.seq_k = int64_t{1} << 20;
  s.heads_q = s.heads_kv = 16;
  const Plan plan = lower_to_plan(p, s, TileConfig{64, 64}, nullptr, nullptr, RandomLayouts::InKernel);
  CHECK(plan.stats.full_tiles + plan.stats.partial_tiles > kMaxBackwardEntries);
  CHECK_THROWS_WITH(lower_to_backward_plan(plan), Catch::Contains("would list 4294967296 (query tile, key tile) pairs") &&
                                                      Catch::Contains("decided in the kernels"));
  // Under the limit it is made as before.
  s.seq_q = s.seq_k = 4096;
  CHECK(lower_to_backward_plan(lower_to_plan(p, s, TileConfig{64, 64}, nullptr, nullptr, RandomLayouts::InKernel)).pairs ==
        16 * 64 * 64);
}

TEST_CASE("offsets a pattern cannot tell apart give the same plan in local rows", "[plan][property]") {
  // What lets a runtime share one plan (and its device tables) between such offsets: the plan in
  // local rows, forward and key-major, is the same; only the positions passed to the kernel differ.
  auto body = [](const std::string& text) { return text.substr(text.find('\n') + 1); };  // past the shape line
  CaseGenerator gen(4242);
  int periodic = 0, moved_by_one_differs = 0;
  for (int n = 0; n < 400; ++n) {
    const auto c = gen.next();
    const auto sh = gen.shifted(c);
    if (!sh) continue;
    ++periodic;
    const TileConfig tiles = random_tiles(gen);
    INFO("case " << n << "\n" << describe(c, tiles) << " period=" << sh->period << " moved to q_offset=" << sh->moved.q_offset);
    const Plan a = lower_to_plan(c.pattern, c.shape, tiles), b = lower_to_plan(c.pattern, sh->moved, tiles);
    REQUIRE(body(print_plan(a, -1)) == body(print_plan(b, -1)));
    REQUIRE(body(print_backward_plan(lower_to_backward_plan(a), -1)) == body(print_backward_plan(lower_to_backward_plan(b), -1)));
    moved_by_one_differs += body(print_plan(a, -1)) != body(print_plan(lower_to_plan(c.pattern, sh->by_one, tiles), -1));
  }
  CHECK(periodic > 150);
  CHECK(moved_by_one_differs > 50);  // the comparison can fail
}

TEST_CASE("the key-major backward plan covers exactly the mask, with multiplicity", "[plan][grad][property]") {
  CaseGenerator gen(1717);
  int overlapping = 0, uncovered = 0, direct = 0;
  for (int n = 0; n < 300; ++n) {
    const auto c = gen.next();
    const TileConfig tiles = random_tiles(gen);
    const DynamicLayout* dyn = c.dynamic ? &*c.dynamic : nullptr;
    INFO("case " << n << "\n" << describe(c, tiles));
    const Plan plan = lower_to_plan(c.pattern, c.shape, tiles, dyn);
    const BackwardPlan bwd = lower_to_backward_plan(plan);
    const Shape& s = c.shape;
    std::vector<int> count(static_cast<size_t>(s.heads_q * s.seq_q * s.seq_k), 0);
    std::vector<int> key_cover(static_cast<size_t>(s.heads_kv * s.seq_k), 0);
    int64_t pairs = 0;
    for (const KeyItem& k : bwd.items) {
      REQUIRE(k.keys.count >= 1);
      REQUIRE(k.keys.count <= tiles.tile_k);
      REQUIRE(k.entry_end > k.entry_begin);
      for (int64_t kc = 0; kc < k.keys.count; ++kc) ++key_cover[static_cast<size_t>(k.kv_head * s.seq_k + k.keys.at(kc))];
      for (int64_t e = k.entry_begin; e < k.entry_end; ++e) {
        const QueryEntry& q = bwd.entries[static_cast<size_t>(e)];
        REQUIRE(q.head / (s.heads_q / s.heads_kv) == k.kv_head);
        ++pairs;
        for (int64_t r = 0; r < q.rows.count; ++r)
          for (int64_t kc = 0; kc < k.keys.count; ++kc) {
            const int64_t i = q.rows.at(r), j = k.keys.at(kc);
            if (q.full || partial_tile_allows(c.pattern, q.branch, q.head, s.q_offset + i, s.k_offset + j, dyn))
              ++count[static_cast<size_t>((q.head * s.seq_q + i) * s.seq_k + j)];
          }
      }
    }
    CHECK(pairs == bwd.pairs);
    // Layers partition the items, and no two items of a layer share a key row of a kv head.
    REQUIRE(bwd.layers.size() >= 1);
    CHECK(bwd.layers.front() == 0);
    CHECK(bwd.layers.back() == static_cast<int64_t>(bwd.items.size()));
    for (size_t l = 0; l + 1 < bwd.layers.size(); ++l) {
      CHECK(bwd.layers[l] < bwd.layers[l + 1]);
      std::vector<char> taken(static_cast<size_t>(s.heads_kv * s.seq_k), 0);
      for (int64_t it = bwd.layers[l]; it < bwd.layers[l + 1]; ++it) {
        const KeyItem& k = bwd.items[static_cast<size_t>(it)];
        for (int64_t kc = 0; kc < k.keys.count; ++kc) {
          char& t = taken[static_cast<size_t>(k.kv_head * s.seq_k + k.keys.at(kc))];
          INFO("layer " << l << " item " << it << " key " << k.keys.at(kc));
          CHECK(t == 0);
          t = 1;
        }
      }
    }
    const bool disjoint = std::all_of(key_cover.begin(), key_cover.end(), [](int v) { return v <= 1; });
    CHECK(bwd.keys_disjoint == disjoint);
    CHECK(bwd.keys_disjoint == (bwd.layers.size() <= 2));
    // Covering every key row once: the kernels then store dK and dV themselves.
    const bool covered = std::all_of(key_cover.begin(), key_cover.end(), [](int v) { return v == 1; });
    CHECK(bwd.keys_cover_all == covered);
    overlapping += !disjoint;
    uncovered += disjoint && !covered;
    direct += covered;
    require_mask_counts(c.pattern, s, dyn, count);
  }
  CHECK(overlapping > 0);  // the generator made patterns whose key tiles overlap
  CHECK(uncovered > 0);    // ... disjoint ones that leave keys out
  CHECK(direct > 0);       // ... and ones whose key tiles cover every key once
}

namespace {

// [B, S, H, D] <-> [B, H, S, D] (`to_head_major` false: the inverse).
std::vector<float> permute(const std::vector<float>& x, int64_t batch, int64_t seq, int64_t heads, int64_t width,
                           bool to_head_major) {
  std::vector<float> out(x.size());
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < seq; ++i)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < width; ++d) {
          const size_t sm = static_cast<size_t>(((b * seq + i) * heads + h) * width + d);
          const size_t hm = static_cast<size_t>(((b * heads + h) * seq + i) * width + d);
          if (to_head_major) out[hm] = x[sm];
          else out[sm] = x[hm];
        }
  return out;
}

}  // namespace

TEST_CASE("the plan executor matches the reference (float32 tolerance)", "[plan][executor][property]") {
  const auto variants = simd_variants();
  CaseGenerator gen(4242);
  for (int n = 0; n < 300; ++n) {
    const auto c = gen.next();
    const TileConfig tiles = random_tiles(gen);
    const DynamicLayout* dyn = c.dynamic ? &*c.dynamic : nullptr;
    const Shape& s = c.shape;
    const auto q = random_tensor(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim), 10 * n + 1);
    const auto k = random_tensor(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim), 10 * n + 2);
    const auto v = random_tensor(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim_v), 10 * n + 3);
    // Every third case with its random layouts left to the kernels: the executor masks those tiles.
    // Every other case packed (the CPU device's plans): a weighted key's score raised by ln(weight).
    const Plan plan = lower_to_plan(c.pattern, s, tiles, dyn, nullptr, n % 3 == 2 ? RandomLayouts::InKernel : RandomLayouts::InPlan,
                                    n % 4 < 2 ? BranchPacking::Packed : BranchPacking::Separate);
    const ReferenceOutput want = reference_attention(c.pattern, s, q.data(), k.data(), v.data(), dyn, 1);
    // Each variant, in both orders (cases alternate between them), on 1 or 2 threads.
    for (const CpuSimd simd : variants) {
      const bool head_major = n % 2 == 1;
      INFO("case " << n << " (" << cpu_simd_name(simd) << (head_major ? ", head-major" : ", seq-major") << ")\n"
                   << describe(c, tiles));
      const ExecutorOptions opts{.threads = 1u + static_cast<unsigned>(n % 3 == 0), .simd = simd,
                                 .order = head_major ? ExecutorOrder::HeadMajor : ExecutorOrder::SeqMajor};
      ExecutorOutput got;
      if (head_major) {
        got = execute_plan(plan, c.pattern, permute(q, s.batch, s.seq_q, s.heads_q, s.head_dim, true).data(),
                           permute(k, s.batch, s.seq_k, s.heads_kv, s.head_dim, true).data(),
                           permute(v, s.batch, s.seq_k, s.heads_kv, s.head_dim_v, true).data(), dyn, opts);
        got.o = permute(got.o, s.batch, s.seq_q, s.heads_q, s.head_dim_v, false);
      } else {
        got = execute_plan(plan, c.pattern, q.data(), k.data(), v.data(), dyn, opts);
      }
      for (size_t x = 0; x < want.lse.size(); ++x) {
        INFO("lse index " << x);
        REQUIRE_FALSE(std::isnan(got.lse[x]));
        if (std::isinf(want.lse[x])) REQUIRE(got.lse[x] == want.lse[x]);
        else REQUIRE(got.lse[x] == Approx(want.lse[x]).epsilon(1e-5).margin(1e-5));
      }
      for (size_t x = 0; x < want.o.size(); ++x) {
        INFO("o index " << x);
        REQUIRE_FALSE(std::isnan(got.o[x]));
        REQUIRE(got.o[x] == Approx(want.o[x]).epsilon(1e-5).margin(1e-5));
      }
    }
  }
}

TEST_CASE("the plan executor's backward matches the reference gradients (float32 tolerance)", "[plan][executor][grad][property]") {
  const auto variants = simd_variants();
  CaseGenerator gen(777);
  for (int n = 0; n < 200; ++n) {
    const auto c = gen.next();
    const TileConfig tiles = random_tiles(gen);
    const DynamicLayout* dyn = c.dynamic ? &*c.dynamic : nullptr;
    const Shape& s = c.shape;
    const auto q = random_tensor(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim), 10 * n + 1);
    const auto k = random_tensor(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim), 10 * n + 2);
    const auto v = random_tensor(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim_v), 10 * n + 3);
    const auto dout = random_tensor(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim_v), 10 * n + 4);
    const Plan plan = lower_to_plan(c.pattern, s, tiles, dyn, nullptr, n % 3 == 2 ? RandomLayouts::InKernel : RandomLayouts::InPlan);
    const BackwardPlan bwd = lower_to_backward_plan(plan);
    // Half the cases take O and LSE from a packed forward, as the CPU device does (its backward
    // plans are Separate): the LSE is the same softmax's.
    const bool packed_forward = n % 8 < 4;
    const Plan fwd_plan = packed_forward ? lower_to_plan(c.pattern, s, tiles, dyn, nullptr,
                                                         n % 3 == 2 ? RandomLayouts::InKernel : RandomLayouts::InPlan, BranchPacking::Packed)
                                         : plan;
    const ReferenceGradients want = reference_attention_backward(c.pattern, s, q.data(), k.data(), v.data(), dout.data(), dyn, 1);
    for (const CpuSimd simd : variants) {
      const bool head_major = n % 2 == 1;
      INFO("case " << n << " (" << cpu_simd_name(simd) << (head_major ? ", head-major" : ", seq-major") << ")\n"
                   << describe(c, tiles));
      // Both schedules (cases alternate, independently of the order).
      const BackwardSchedule schedule = n % 4 < 2 ? BackwardSchedule::Fused : BackwardSchedule::Split;
      INFO((schedule == BackwardSchedule::Fused ? "fused" : "split") << " schedule" << (packed_forward ? ", packed forward" : ""));
      const ExecutorOptions opts{.threads = 1u + static_cast<unsigned>(n % 2), .simd = simd,
                                 .order = head_major ? ExecutorOrder::HeadMajor : ExecutorOrder::SeqMajor,
                                 .schedule = schedule};
      ExecutorGradients got;
      if (head_major) {
        const auto qh = permute(q, s.batch, s.seq_q, s.heads_q, s.head_dim, true);
        const auto kh = permute(k, s.batch, s.seq_k, s.heads_kv, s.head_dim, true);
        const auto vh = permute(v, s.batch, s.seq_k, s.heads_kv, s.head_dim_v, true);
        const auto dh = permute(dout, s.batch, s.seq_q, s.heads_q, s.head_dim_v, true);
        const ExecutorOutput fwd = execute_plan(fwd_plan, c.pattern, qh.data(), kh.data(), vh.data(), dyn, opts);
        got = execute_plan_backward(plan, bwd, c.pattern, qh.data(), kh.data(), vh.data(), fwd.o.data(), fwd.lse.data(),
                                    dh.data(), dyn, opts);
        got.dq = permute(got.dq, s.batch, s.seq_q, s.heads_q, s.head_dim, false);
        got.dk = permute(got.dk, s.batch, s.seq_k, s.heads_kv, s.head_dim, false);
        got.dv = permute(got.dv, s.batch, s.seq_k, s.heads_kv, s.head_dim_v, false);
      } else {
        const ExecutorOutput fwd = execute_plan(fwd_plan, c.pattern, q.data(), k.data(), v.data(), dyn, opts);
        got = execute_plan_backward(plan, bwd, c.pattern, q.data(), k.data(), v.data(), fwd.o.data(), fwd.lse.data(),
                                    dout.data(), dyn, opts);
      }
      auto compare = [](const char* name, const std::vector<float>& g, const std::vector<double>& w) {
        REQUIRE(g.size() == w.size());
        for (size_t x = 0; x < w.size(); ++x) {
          INFO(name << " index " << x);
          REQUIRE_FALSE(std::isnan(g[x]));
          REQUIRE(g[x] == Approx(w[x]).epsilon(1e-4).margin(1e-4));
        }
      };
      compare("dq", got.dq, want.dq);
      compare("dk", got.dk, want.dk);
      compare("dv", got.dv, want.dv);
    }
  }
}

TEST_CASE("the plan executor's attention weights match the reference's, and O = W V", "[plan][executor][weights][property]") {
  const auto variants = simd_variants();
  CaseGenerator gen(9090);
  for (int n = 0; n < 200; ++n) {
    const auto c = gen.next();
    const TileConfig tiles = random_tiles(gen);
    const DynamicLayout* dyn = c.dynamic ? &*c.dynamic : nullptr;
    const Shape& s = c.shape;
    const auto q = random_tensor(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim), 10 * n + 1);
    const auto k = random_tensor(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim), 10 * n + 2);
    const auto v = random_tensor(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim_v), 10 * n + 3);
    // Every other case packed: a weighted key's W is its branches' sum, as the reference's.
    const Plan plan = lower_to_plan(c.pattern, s, tiles, dyn, nullptr, RandomLayouts::InPlan,
                                    n % 2 ? BranchPacking::Packed : BranchPacking::Separate);
    const std::vector<double> want = reference_weights(c.pattern, s, q.data(), k.data(), dyn, 1);
    for (const CpuSimd simd : variants) {
      const bool head_major = n % 2 == 1;
      INFO("case " << n << " (" << cpu_simd_name(simd) << (head_major ? ", head-major" : ", seq-major") << ")\n"
                   << describe(c, tiles));
      const ExecutorOptions opts{.threads = 1u + static_cast<unsigned>(n % 2), .simd = simd,
                                 .order = head_major ? ExecutorOrder::HeadMajor : ExecutorOrder::SeqMajor};
      std::vector<float> w(want.size(), std::numeric_limits<float>::quiet_NaN());  // every element must be written
      ExecutorOutput fwd;
      if (head_major) {
        const auto qh = permute(q, s.batch, s.seq_q, s.heads_q, s.head_dim, true);
        const auto kh = permute(k, s.batch, s.seq_k, s.heads_kv, s.head_dim, true);
        fwd = execute_plan(plan, c.pattern, qh.data(), kh.data(), permute(v, s.batch, s.seq_k, s.heads_kv, s.head_dim_v, true).data(),
                           dyn, opts);
        fwd.o = permute(fwd.o, s.batch, s.seq_q, s.heads_q, s.head_dim_v, false);
        execute_plan_weights(plan, c.pattern, qh.data(), kh.data(), fwd.lse.data(), w.data(), dyn, opts);
      } else {
        fwd = execute_plan(plan, c.pattern, q.data(), k.data(), v.data(), dyn, opts);
        execute_plan_weights(plan, c.pattern, q.data(), k.data(), fwd.lse.data(), w.data(), dyn, opts);
      }
      for (size_t x = 0; x < want.size(); ++x) {
        INFO("w index " << x);
        REQUIRE(w[x] == Approx(want[x]).epsilon(1e-5).margin(1e-6));
      }
      // O = W V, row by row, against the executor's own O.
      const int64_t group = s.heads_q / s.heads_kv;
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t h = 0; h < s.heads_q; ++h)
          for (int64_t i = 0; i < s.seq_q; ++i)
            for (int64_t d = 0; d < s.head_dim_v; ++d) {
              double wv = 0.0;
              for (int64_t j = 0; j < s.seq_k; ++j)
                wv += double(w[size_t(((b * s.heads_q + h) * s.seq_q + i) * s.seq_k + j)]) *
                      v[size_t(((b * s.seq_k + j) * s.heads_kv + h / group) * s.head_dim_v + d)];
              INFO("O[" << b << "," << i << "," << h << "," << d << "]");
              REQUIRE(fwd.o[size_t(((b * s.seq_q + i) * s.heads_q + h) * s.head_dim_v + d)] == Approx(wv).epsilon(1e-5).margin(1e-5));
            }
    }
  }
}

// The geometric LongNet (segments w, 2w, 4w; dilations 1, 2, 4).
TEST_CASE("LongNet: dilated rows gather into full tiles, and packed, each distinct pair is computed once", "[plan]") {
  const Pattern p = PatternBuilder()
                        .branch(BranchSpec().segment(256).dilation(1))
                        .branch(BranchSpec().segment(512).dilation(2))
                        .branch(BranchSpec().segment(1024).dilation(4))
                        .build();
  Shape s;
  s.seq_q = s.seq_k = 2048;
  s.heads_q = s.heads_kv = 4;
  const Plan plan = lower_to_plan(p, s, TileConfig{16, 16});
  // Every tile is full: rows of one residue class share their branches and key lists exactly.
  CHECK(plan.stats.partial_tiles == 0);
  CHECK(plan.stats.computed_pairs == plan.stats.computed_real_pairs);
  // Packed: a pair the dilated branches share with the dense one is left to the dense one's tile.
  const PatternStats st = pattern_stats(MaskContext{p, s, nullptr});
  REQUIRE(st.distinct_pairs < st.attended_pairs);
  CHECK(plan.stats.computed_pairs == st.attended_pairs);
  CHECK(plan.stats.packed_tiles == 0);
  const Plan packed = lower_to_plan(p, s, TileConfig{16, 16}, nullptr, nullptr, RandomLayouts::InPlan, BranchPacking::Packed);
  CHECK(packed.stats.computed_pairs == st.distinct_pairs);
  CHECK(packed.stats.packed_tiles * 16 * 16 == st.attended_pairs - st.distinct_pairs);
  // A key of the dense branch that the two dilated ones also reach (for rows in all three) counts 3.
  CHECK(*std::max_element(packed.key_weights.begin(), packed.key_weights.end()) == 3);
  // The backward's key-major plan is made from Separate plans only (its entries carry no weights).
  REQUIRE_THROWS_WITH(lower_to_backward_plan(packed), Catch::Contains("BranchPacking::Separate"));
}

// Without segments a causal pair of branches makes a weight run per query tile as long as its
// keys: the runs stop at 64 MiB and the query tiles past that stay Separate (still exact).
TEST_CASE("packing: the key weights stop at their budget, the rest of the plan stays Separate", "[plan]") {
  const Pattern p = PatternBuilder().causal().branch(BranchSpec().full()).branch(BranchSpec().full().dilation(2)).build();
  Shape s;
  s.seq_q = s.seq_k = 65536;
  s.heads_q = s.heads_kv = 1;
  const Plan separate = lower_to_plan(p, s, TileConfig{8, 8});
  const Plan packed = lower_to_plan(p, s, TileConfig{8, 8}, nullptr, nullptr, RandomLayouts::InPlan, BranchPacking::Packed);
  int64_t dilated_tiles = 0;
  for (const WorkItem& item : separate.items)
    for (int64_t sp = item.span_begin; sp < item.span_end; ++sp)
      if (separate.spans[size_t(sp)].branch == 1) dilated_tiles += span_tile_count(separate, separate.spans[size_t(sp)]);
  CHECK(packed.key_weights.size() <= size_t{1} << 26);
  CHECK(packed.key_weights.size() > size_t{1} << 25);  // the budget was reached
  CHECK(packed.stats.packed_tiles > 0);
  CHECK(packed.stats.packed_tiles < dilated_tiles);  // uncapped, every dilated tile would be left out
  CHECK(packed.stats.full_tiles + packed.stats.partial_tiles + packed.stats.packed_tiles ==
        separate.stats.full_tiles + separate.stats.partial_tiles);
}

TEST_CASE("packing leaves branches with other bands, layouts, or the head_groups combine alone", "[plan]") {
  Shape s;
  s.seq_q = s.seq_k = 512;
  s.heads_q = s.heads_kv = 2;
  const auto packed = [&](const Pattern& p) {
    return lower_to_plan(p, s, TileConfig{16, 16}, nullptr, nullptr, RandomLayouts::InPlan, BranchPacking::Packed).stats.packed_tiles;
  };
  // The dense branch is causal, the dilated one not: a pair the dilated one attends above the
  // diagonal is not the dense one's, so nothing may be left out on the strength of the dense tile.
  CHECK(packed(PatternBuilder().branch(BranchSpec().segment(256).dilation(1).causal()).branch(BranchSpec().segment(512).dilation(2)).build()) == 0);
  // Both causal: the same band, packed.
  CHECK(packed(PatternBuilder().branch(BranchSpec().segment(256).dilation(1).causal()).branch(BranchSpec().segment(512).dilation(2).causal()).build()) > 0);
  // A layout decides per block: never packed.
  CHECK(packed(PatternBuilder().branch(BranchSpec().segment(256).layout(layouts::local(1, 16, 16))).branch(BranchSpec().segment(512).dilation(2)).build()) == 0);
  // head_groups: the branches are separate outputs, not one softmax.
  Pattern groups = PatternBuilder().branch(BranchSpec().segment(256).dilation(1)).branch(BranchSpec().segment(512).dilation(2)).build();
  groups.combine = Combine::HeadGroups;
  CHECK(packed(groups) == 0);
}

TEST_CASE("bad tiles and tables are rejected", "[plan][errors]") {
  const Pattern p = PatternBuilder().branch(BranchSpec().full().layout(layouts::dynamic(4, 4))).build();
  Shape s;
  s.seq_q = s.seq_k = 8;
  CHECK_THROWS_WITH(lower_to_plan(p, s, TileConfig{0, 64}), Catch::Contains("tile sizes must lie in [1, 1024]"));
  CHECK_THROWS_WITH(lower_to_plan(p, s, TileConfig{64, 64}), Catch::Contains("supply its CSR table"));
  DynamicLayout unsorted{1, {0, 2, 2}, {1, 0}};
  CHECK_THROWS_WITH(lower_to_plan(p, s, TileConfig{64, 64}, &unsorted), Catch::Contains("not sorted"));
  CHECK_THROWS_WITH(parse_tile_config("64by64"), Catch::Contains("expected QxK"));
  CHECK(parse_tile_config("128x64").tile_q == 128);
}

TEST_CASE("plan tile sizes are read whole and range checked, never wrapped", "[plan][errors][parse]") {
  CHECK(parse_tile_config("1024x1").tile_q == 1024);
  CHECK(parse_tile_config("16x8").tile_k == 8);
  // 4294967312 is 2^32 + 16: sscanf("%d") read it as 16; 99999999999 came back as 1215752191.
  CHECK_THROWS_WITH(parse_tile_config("4294967312x16"), Catch::Contains("--tile 4294967312x16: tile sizes must lie in [1, 1024], got 4294967312"));
  CHECK_THROWS_WITH(parse_tile_config("99999999999x1"), Catch::Contains("got 99999999999"));
  CHECK_THROWS_WITH(parse_tile_config("16x1025"), Catch::Contains("got 1025"));
  CHECK_THROWS_WITH(parse_tile_config("0x16"), Catch::Contains("got 0"));
  for (const char* bad : {"16", "x16", "16x", "16x16x16", "16x 16", " 16x16", "+16x16", "16x16 "})
    CHECK_THROWS_WITH(parse_tile_config(bad), Catch::Contains("expected QxK with positive sizes"));
}

TEST_CASE("a plan's key rows are exactly the keys the pattern attends, its attending rows exactly the rows that attend, its query rows hold them, dilated: the selected rows", "[plan][key_rows][property]") {
  CaseGenerator gen(4242);
  for (int n = 0; n < 200; ++n) {
    const auto c = gen.next();
    const TileConfig tiles = random_tiles(gen);
    const DynamicLayout* dyn = c.dynamic ? &*c.dynamic : nullptr;
    INFO("case " << n << "\n" << describe(c, tiles));
    const Shape& s = c.shape;
    const std::vector<uint8_t> rows = plan_key_rows(lower_to_plan(c.pattern, s, tiles, dyn), c.pattern, dyn);
    REQUIRE(rows.size() == static_cast<size_t>(s.heads_kv * s.seq_k));
    const MaskContext ctx{c.pattern, s, dyn};
    const int64_t group = s.heads_q / s.heads_kv;
    std::vector<uint8_t> any(rows.size(), 0);
    for (int64_t h = 0; h < s.heads_q; ++h)
      for (int64_t j = 0; j < s.seq_k; ++j) {
        bool attended = false;
        for (int64_t i = 0; i < s.seq_q && !attended; ++i) attended = attend_count(ctx, h, i, j) > 0;
        INFO("head " << h << " key " << j);
        if (attended) REQUIRE(rows[static_cast<size_t>((h / group) * s.seq_k + j)] == 1);
        any[static_cast<size_t>((h / group) * s.seq_k + j)] |= attended;
      }
    CHECK(rows == any);
    // Every query row that attends a key is computed (a superset: a row may share a tile and attend
    // nothing); the attending rows are exactly those, whatever the tiles.
    const Plan plan = lower_to_plan(c.pattern, s, tiles, dyn);
    const std::vector<uint8_t> queries = plan_query_rows(plan), attending = plan_attending_rows(plan, c.pattern, dyn);
    std::vector<uint8_t> want(attending.size(), 0);
    for (int64_t h = 0; h < s.heads_q; ++h)
      for (int64_t i = 0; i < s.seq_q; ++i) {
        bool attends = false;
        for (int64_t j = 0; j < s.seq_k && !attends; ++j) attends = attend_count(ctx, h, i, j) > 0;
        INFO("head " << h << " row " << i);
        if (attends) REQUIRE(queries[static_cast<size_t>(h * s.seq_q + i)] == 1);
        want[static_cast<size_t>(h * s.seq_q + i)] = attends;
      }
    CHECK(attending == want);
    // The items past work_item_prefix visit no tile: their rows are the query rows of no item before.
    const int64_t n_work = work_item_prefix(plan);
    REQUIRE(n_work <= static_cast<int64_t>(plan.items.size()));
    Plan head = plan;
    head.items.resize(static_cast<size_t>(n_work));
    CHECK(plan_query_rows(head) == queries);
    if (n_work > 0) {  // the prefix is the shortest: its last item visits a tile
      head.items.erase(head.items.begin(), head.items.end() - 1);
      const std::vector<uint8_t> last = plan_query_rows(head);
      CHECK(std::count(last.begin(), last.end(), uint8_t{1}) > 0);
    }
  }
  // A dilated branch reads its selected rows only: rate 4 at head offset h mod 4, in one segment.
  const Pattern p = PatternBuilder().branch(BranchSpec().segment(1024).dilation(4)).build();
  Shape s;
  s.seq_q = s.seq_k = 512;
  s.heads_q = s.heads_kv = 4;
  s.k_offset = 512;  // the second half of the segment, as a ring step sees it
  const std::vector<uint8_t> rows = plan_key_rows(lower_to_plan(p, s, TileConfig{64, 64}), p);
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t j = 0; j < 512; ++j) {
      INFO("head " << h << " key " << j);
      CHECK(rows[static_cast<size_t>(h * 512 + j)] == ((512 + j) % 4 == h ? 1 : 0));
    }
  // ... and computes the selected query rows only (the plan's rows and the attending rows alike).
  const Plan dilated = lower_to_plan(p, s, TileConfig{64, 64});
  const std::vector<uint8_t> queries = plan_query_rows(dilated);
  CHECK(plan_attending_rows(dilated, p) == queries);
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t i = 0; i < 512; ++i) {
      INFO("head " << h << " row " << i);
      CHECK(queries[static_cast<size_t>(h * 512 + i)] == (i % 4 == h ? 1 : 0));
    }
  // Keys in another segment are not read at all.
  s.k_offset = 1024;
  const std::vector<uint8_t> none = plan_key_rows(lower_to_plan(p, s, TileConfig{64, 64}), p);
  CHECK(std::count(none.begin(), none.end(), uint8_t{1}) == 0);
  const Plan far = lower_to_plan(p, s, TileConfig{64, 64});
  const std::vector<uint8_t> no_queries = plan_query_rows(far);
  CHECK(std::count(no_queries.begin(), no_queries.end(), uint8_t{1}) == 0);
  CHECK(plan_attending_rows(far, p) == no_queries);
  CHECK(work_item_prefix(far) == 0);
}

TEST_CASE("the attending rows do not depend on the tiles, and a causal diagonal tile holds rows that attend nothing", "[plan][key_rows]") {
  // Causal with keys after the queries: in the tile on the diagonal, rows before the first key
  // attend nothing. The plan's rows depend on the tile size; the attending rows do not.
  const Pattern p = PatternBuilder().branch(BranchSpec().full().causal()).build();
  Shape s;
  s.seq_q = s.seq_k = 256;
  s.heads_q = s.heads_kv = 2;
  s.k_offset = 40;  // key j sits at 40 + j: query i attends from i >= 40 on
  std::vector<uint8_t> first;
  for (const TileConfig tiles : {TileConfig{64, 64}, TileConfig{128, 64}, TileConfig{16, 32}}) {
    INFO("tiles " << tiles.tile_q << "x" << tiles.tile_k);
    const Plan plan = lower_to_plan(p, s, tiles);
    const std::vector<uint8_t> attending = plan_attending_rows(plan, p), queries = plan_query_rows(plan);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 256; ++i) {
        INFO("head " << h << " row " << i);
        CHECK(attending[static_cast<size_t>(h * 256 + i)] == (i >= 40 ? 1 : 0));
      }
    // With 64 or 128 rows a tile, rows 0..39 share the diagonal tile: computed, attending nothing.
    if (tiles.tile_q >= 64) CHECK(queries[0] == 1);
    if (first.empty()) first = attending;
    CHECK(attending == first);
  }
}

// ---- the paged plan ----------------------------------------------------------------------------

TEST_CASE("a paged plan is each request's plan at its positions, concatenated", "[plan][paged]") {
  const Pattern p = parse_spec(R"({"attnjit": 1, "branches": [{"segment": 64, "dilation": 1, "causal": true},
                                                             {"segment": 256, "dilation": 4}]})");
  const std::vector<PagedRequest> requests{{1, 300}, {0, 50}, {5, 70}, {1, 300}};
  const PagedPlan pp = lower_paged_plan(p, 4, 2, 32, 32, requests, TileConfig{16, 32});
  CHECK(pp.q_start == std::vector<int64_t>{0, 1, 1, 6});
  CHECK(pp.q_pos == std::vector<int64_t>{299, 50, 65, 299});
  REQUIRE(pp.request_plans.size() == 4);
  CHECK(pp.request_plans[1] == nullptr);               // no queries, no plan
  CHECK(pp.request_plans[0] == pp.request_plans[3]);   // one lowering per (queries, kv_len)
  CHECK(pp.tables.shape.seq_q == 7);
  CHECK(pp.tables.shape.seq_k == 300);
  // Every (head, rows) of a request's own plan is in exactly one packed item: its heads consecutive
  // in one kv group, heads x rows within tile_q, and the packed item's spans (tables moved) those
  // of each of its heads' own items.
  size_t at = 0;
  int64_t pairs = 0;
  auto same_spans = [&](const Plan& one, const WorkItem& own, const WorkItem& got) {
    if (got.span_end - got.span_begin != own.span_end - own.span_begin) return false;
    for (int64_t s = 0; s < own.span_end - own.span_begin; ++s) {
      const KeySpan& a = pp.tables.spans[got.span_begin + s];
      const KeySpan& e = one.spans[own.span_begin + s];
      if (a.keys.start != e.keys.start || a.keys.stride != e.keys.stride || a.keys.count != e.keys.count || a.branch != e.branch)
        return false;
      std::vector<std::pair<int32_t, bool>> ta, te;
      for_each_planned_tile(pp.tables, a, [&](int32_t t, bool f) { ta.emplace_back(t, f); });
      for_each_planned_tile(one, e, [&](int32_t t, bool f) { te.emplace_back(t, f); });
      if (ta != te) return false;
    }
    return true;
  };
  int packed = 0;
  for (int32_t b : {0, 2, 3}) {
    const Plan& one = *pp.request_plans[b];
    CHECK(one.shape.q_offset == requests[b].kv_len - requests[b].queries);
    pairs += one.stats.attended_pairs;
    std::vector<int> covered(one.items.size(), 0);
    for (; at < pp.tables.items.size() && pp.item_request[at] == b; ++at) {
      const WorkItem& got = pp.tables.items[at];
      const int32_t heads = pp.item_heads[at];
      CHECK(heads >= 1);
      CHECK(got.rows.count * heads <= 16);
      CHECK(got.head / 2 == (got.head + heads - 1) / 2);  // one kv group (4 heads over 2)
      packed += heads > 1;
      for (int32_t h = got.head; h < got.head + heads; ++h) {
        int found = 0;
        for (size_t i = 0; i < one.items.size(); ++i) {
          const WorkItem& own = one.items[i];
          if (own.head == h && own.rows.start == got.rows.start && own.rows.stride == got.rows.stride &&
              own.rows.count == got.rows.count && same_spans(one, own, got)) {
            ++covered[i], ++found;
          }
        }
        CHECK(found == 1);
      }
    }
    CHECK(std::all_of(covered.begin(), covered.end(), [](int c) { return c == 1; }));
  }
  CHECK(packed > 0);  // decode rows of the two heads of a kv group share their items
  CHECK(at == pp.tables.items.size());
  CHECK(pp.tables.stats.attended_pairs == pairs);
  CHECK(pp.max_item_tiles > 0);
  const std::string text = print_paged_plan(pp, 4);
  CHECK(text.find("request 2: queries=5 kv_len=70 first row=1 first position=65") != std::string::npos);
  CHECK(text.find("items (request:heads): 0:" + std::to_string(pp.item_heads[0]) + " ") != std::string::npos);
}

TEST_CASE("paged splits fill the target without idle blocks, and bad requests are refused by name", "[plan][paged][errors]") {
  const Pattern dense = parse_spec(R"({"attnjit": 1, "branches": [{"segment": "full", "causal": true}]})");
  const PagedPlan one = lower_paged_plan(dense, 1, 1, 32, 32, {{1, 1000}}, TileConfig{16, 32});
  CHECK(one.max_item_tiles == 32);  // 1000 keys in tiles of 32
  CHECK(paged_splits(one, 264) == 32);  // no more splits than tiles
  CHECK(paged_splits(one, 8) == 8);
  const PagedPlan many = lower_paged_plan(dense, 8, 1, 32, 32, std::vector<PagedRequest>(64, {1, 5000}), TileConfig{16, 32});
  CHECK(std::all_of(many.item_heads.begin(), many.item_heads.end(), [](int32_t h) { return h == 8; }));
  CHECK(many.tables.items.size() == 64);  // a decode row of eight heads of one kv group: one item each
  CHECK(paged_splits(many, 264) == 5);    // 64 items x 5 splits fill 264 blocks
  CHECK(paged_splits(lower_paged_plan(dense, 1, 1, 32, 32, {}, TileConfig{16, 32}), 264) == 1);
  CHECK_THROWS_WITH(lower_paged_plan(dense, 1, 1, 32, 32, {{1, 5}, {6, 5}}, TileConfig{16, 32}),
                    Catch::Contains("request 1") && Catch::Contains("append the queries' own K/V"));
  CHECK_THROWS_WITH(lower_paged_plan(dense, 1, 1, 32, 32, {{0, -1}}, TileConfig{16, 32}), Catch::Contains(">= 0"));
  const Pattern table = parse_spec(R"({"attnjit": 1, "branches": [{"segment": "full", "layout": {"dynamic": true}}]})");
  CHECK_THROWS_WITH(lower_paged_plan(table, 1, 1, 32, 32, {{1, 5}}, TileConfig{16, 32}), Catch::Contains("dynamic layout"));
}

TEST_CASE("the device planner's head classes: consecutive heads of a kv group that plan alike", "[plan][paged]") {
  // Dense: every head of a kv group in one class, at most tile_q heads each.
  const Pattern dense = parse_spec(R"({"attnjit": 1, "branches": [{"segment": "full", "causal": true}]})");
  std::vector<PagedHeadClass> c = paged_head_classes(dense, 8, 2, 16);
  REQUIRE(c.size() == 2);
  CHECK((c[0].head == 0 && c[0].heads == 4 && c[1].head == 4 && c[1].heads == 4));
  CHECK(c[0].offsets == std::vector<int64_t>{0});
  c = paged_head_classes(dense, 8, 1, 3);  // tile_q 3: classes of 3, 3, 2
  REQUIRE(c.size() == 3);
  CHECK((c[0].heads == 3 && c[1].heads == 3 && c[2].head == 6 && c[2].heads == 2));
  // LongNet's head_mod offsets: heads h and h + 1 differ at dilation 2, so each head alone; the
  // offsets are branch_offset's, -1 for a branch that does not take part.
  const Pattern longnet = parse_spec(R"({"attnjit": 1, "branches": [{"segment": 8, "dilation": 1},
      {"segment": 16, "dilation": 2, "offset": "head_mod"}, {"segment": "full", "dilation": 1, "heads": [1, 3]}]})");
  c = paged_head_classes(longnet, 4, 2, 16);
  REQUIRE(c.size() == 4);
  for (int h = 0; h < 4; ++h) {
    CHECK(c[size_t(h)].head == h);
    CHECK(c[size_t(h)].offsets == std::vector<int64_t>{0, h % 2, h % 2 ? 0 : -1});
  }
  // A random layout hashes the head: no two heads share a class, even with equal offsets.
  const Pattern random = parse_spec(R"({"attnjit": 1, "branches": [{"segment": "full", "layout": {"random": {"density": 0.5, "seed": 3}}}]})");
  c = paged_head_classes(random, 4, 1, 16);
  CHECK(c.size() == 4);
  const Pattern local = parse_spec(R"({"attnjit": 1, "branches": [{"segment": "full", "layout": {"local": 1}}]})");
  CHECK(paged_head_classes(local, 4, 1, 16).size() == 1);
}
