// The mask: enumeration and counting agree with the pairwise definition, layout generators mean
// what the spec says, and the random layout's hash is the documented one.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <tuple>

#include "compiler/pattern/pattern_stats.hpp"
#include "compiler/pattern/random_layout.hpp"
#include "compiler/support/error.hpp"
#include "tests/unit/random_patterns.hpp"

using namespace attnjit;
using attnjit::testing::CaseGenerator;

TEST_CASE("key enumeration and counting equal the pairwise definition on random patterns", "[mask][property]") {
  CaseGenerator gen(1234);
  for (int n = 0; n < 400; ++n) {
    const auto c = gen.next();
    const MaskContext ctx{c.pattern, c.shape, c.dynamic ? &*c.dynamic : nullptr};
    INFO("case " << n << "\n" << canonical_text(c.pattern) << "seq_q=" << c.shape.seq_q << " seq_k=" << c.shape.seq_k
                 << " heads_q=" << c.shape.heads_q << " q_offset=" << c.shape.q_offset << " k_offset=" << c.shape.k_offset);
    int64_t total = 0;
    for (int64_t h = 0; h < c.shape.heads_q; ++h) {
      for (int64_t i = 0; i < c.shape.seq_q; ++i) {
        for (size_t b = 0; b < c.pattern.branches.size(); ++b) {
          std::vector<int64_t> listed, defined;
          for_each_branch_key(ctx, b, h, i, [&](int64_t j) { listed.push_back(j); });
          for (int64_t j = 0; j < c.shape.seq_k; ++j)
            if (branch_attends(ctx, b, h, i, j)) defined.push_back(j);
          INFO("head " << h << " row " << i << " branch " << b);
          REQUIRE(listed == defined);
          REQUIRE(branch_key_count(ctx, b, h, i) == static_cast<int64_t>(defined.size()));
          total += static_cast<int64_t>(defined.size());
        }
      }
    }
    REQUIRE(pattern_stats(ctx).attended_pairs == total);
  }
}

TEST_CASE("translation_period: moving both positions by a multiple of it changes no pair", "[mask][property]") {
  CaseGenerator gen(2027);
  int periodic = 0, moved_by_one_differs = 0;
  for (int n = 0; n < 400; ++n) {
    const auto c = gen.next();
    const auto sh = gen.shifted(c);
    if (!sh) continue;
    ++periodic;
    const MaskContext a{c.pattern, c.shape, nullptr}, b{c.pattern, sh->moved, nullptr}, one{c.pattern, sh->by_one, nullptr};
    INFO("case " << n << "\n" << canonical_text(c.pattern) << "period=" << sh->period << " seq_q=" << c.shape.seq_q
                 << " seq_k=" << c.shape.seq_k << " q_offset=" << c.shape.q_offset << " k_offset=" << c.shape.k_offset);
    bool differs = false;
    for (int64_t h = 0; h < c.shape.heads_q; ++h)
      for (int64_t i = 0; i < c.shape.seq_q; ++i)
        for (int64_t j = 0; j < c.shape.seq_k; ++j) {
          INFO("head " << h << " row " << i << " key " << j);
          REQUIRE(attend_count(a, h, i, j) == attend_count(b, h, i, j));
          differs |= attend_count(a, h, i, j) != attend_count(one, h, i, j);
        }
    moved_by_one_differs += differs;
  }
  CHECK(periodic > 150);
  // The comparison can fail: a shift by 1 changes the mask of many of the same cases.
  CHECK(moved_by_one_differs > 50);
}

TEST_CASE("translation_period of each construct", "[mask]") {
  auto period = [](BranchSpec b) { return translation_period(PatternBuilder().branch(b).build()); };
  CHECK(period(BranchSpec().full()) == 1);
  CHECK(period(BranchSpec().full().causal().window(7, 0)) == 1);  // only the difference of positions
  CHECK(period(BranchSpec().full().dilation(3)) == 3);
  CHECK(period(BranchSpec().segment(10).dilation(4)) == 10);  // the in-segment index moves with the segment
  CHECK(period(BranchSpec().full().layout(layouts::local(2, 64, 64))) == 64);
  CHECK(period(BranchSpec().full().layout(layouts::offsets({-1, 3}, 32, 32))) == 32);
  CHECK(period(BranchSpec().full().layout(layouts::strided(4, 1, 16, 32))) == 128);  // kb moves by a multiple of 4
  CHECK(period(BranchSpec().full().layout(layouts::union_of({layouts::local(0, 64, 64), layouts::strided(2, 0, 64, 64)}, 64, 64))) == 128);
  // Absolute positions matter: no period.
  CHECK_FALSE(period(BranchSpec().full().layout(layouts::local(2, 64, 32))));
  CHECK_FALSE(period(BranchSpec().full().layout(layouts::global({0}, 64, 64))));
  CHECK_FALSE(period(BranchSpec().full().layout(layouts::random(0.5, 7, 64, 64))));
  CHECK_FALSE(period(BranchSpec().full().layout(layouts::explicit_blocks({{0, 0}}, 64, 64))));
  CHECK_FALSE(period(BranchSpec().full().layout(layouts::dynamic(64, 64))));
  CHECK_FALSE(period(BranchSpec().full().layout(layouts::intersect_of({layouts::local(0, 64, 64), layouts::global({1}, 64, 64)}, 64, 64))));
  // Branches: the lcm (LongNet's segments 2048/4096/8192 with dilations 1/2/4: 8192).
  const Pattern longnet = PatternBuilder()
                              .branch(BranchSpec().segment(2048).dilation(1))
                              .branch(BranchSpec().segment(4096).dilation(2))
                              .branch(BranchSpec().segment(8192).dilation(4))
                              .build();
  CHECK(translation_period(longnet) == 8192);
  // A period past 2^40 shares nothing: none.
  const Pattern huge = PatternBuilder()
                           .branch(BranchSpec().segment((int64_t{1} << 39) + 1))
                           .branch(BranchSpec().segment((int64_t{1} << 39) + 3))
                           .build();
  CHECK_FALSE(translation_period(huge));
}

TEST_CASE("distinct pairs: each (head, query, key) once, however many branches attend it", "[mask][property]") {
  CaseGenerator gen(4321);
  for (int n = 0; n < 300; ++n) {
    const auto c = gen.next();
    const MaskContext ctx{c.pattern, c.shape, c.dynamic ? &*c.dynamic : nullptr};
    INFO("case " << n << "\n" << canonical_text(c.pattern) << "seq_q=" << c.shape.seq_q << " seq_k=" << c.shape.seq_k);
    int64_t distinct = 0;
    for (int64_t h = 0; h < c.shape.heads_q; ++h)
      for (int64_t i = 0; i < c.shape.seq_q; ++i) {
        int64_t row = 0;
        for (int64_t j = 0; j < c.shape.seq_k; ++j) row += attend_count(ctx, h, i, j) > 0;
        INFO("head " << h << " row " << i);
        REQUIRE(distinct_key_count(ctx, h, i) == row);
        distinct += row;
      }
    const PatternStats st = pattern_stats(ctx);
    REQUIRE(st.distinct_pairs == distinct);
    REQUIRE(st.distinct_pairs <= st.attended_pairs);
    REQUIRE(st.distinct_density <= 1.0);
  }
}

TEST_CASE("pairs_per_row: each query row's attended pairs over the heads, summing to attended_pairs", "[mask][property]") {
  CaseGenerator gen(2718);
  for (int n = 0; n < 200; ++n) {
    const auto c = gen.next();
    const MaskContext ctx{c.pattern, c.shape, c.dynamic ? &*c.dynamic : nullptr};
    INFO("case " << n << "\n" << canonical_text(c.pattern) << "seq_q=" << c.shape.seq_q << " seq_k=" << c.shape.seq_k);
    const std::vector<int64_t> rows = pairs_per_row(ctx);
    REQUIRE(rows.size() == static_cast<size_t>(c.shape.seq_q));
    int64_t total = 0;
    for (int64_t i = 0; i < c.shape.seq_q; ++i) {
      int64_t want = 0;
      for (int64_t h = 0; h < c.shape.heads_q; ++h)
        for (int64_t j = 0; j < c.shape.seq_k; ++j) want += attend_count(ctx, h, i, j);
      INFO("row " << i);
      REQUIRE(rows[static_cast<size_t>(i)] == want);
      total += want;
    }
    REQUIRE(pattern_stats(ctx).attended_pairs == total);
  }
}

TEST_CASE("pairs_per_row on a long sequence (counted on several threads) is the rows' own counts", "[mask]") {
  const Pattern p = PatternBuilder()
                        .branch(BranchSpec().full().layout(layouts::union_of(
                            {layouts::local(1, 64, 64), layouts::global({0, 7}, 64, 64), layouts::random(0.05, 11, 64, 64)}, 64, 64)))
                        .branch(BranchSpec().segment(4096).dilation(4).offset(OffsetRule::HeadMod))
                        .build();
  Shape s;
  s.batch = 1, s.seq_q = s.seq_k = 20000, s.heads_q = s.heads_kv = 2, s.head_dim = s.head_dim_v = 64;
  const MaskContext ctx{p, s, nullptr};
  const std::vector<int64_t> rows = pairs_per_row(ctx);
  int64_t total = 0;
  for (int64_t n : rows) total += n;
  CHECK(total == pattern_stats(ctx).attended_pairs);
  std::mt19937_64 rng(5);
  for (int n = 0; n < 40; ++n) {
    const int64_t i = n < 4 ? int64_t{n} * 4999 + 3 : static_cast<int64_t>(rng() % 20000);  // each quarter's slice too
    int64_t want = 0;
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t j = 0; j < s.seq_k; ++j) want += attend_count(ctx, h, i, j);
    INFO("row " << i);
    CHECK(rows[static_cast<size_t>(i)] == want);
  }
  CHECK(rows[10] > 4 * total / 20000);  // a global row (block 0) attends every key
}

TEST_CASE("a layout's key intervals for a block row are exactly the keys layout_allows", "[mask][property]") {
  CaseGenerator gen(5150);
  std::mt19937_64 rng(3);
  int layouts_seen = 0;
  for (int n = 0; n < 400; ++n) {
    const auto c = gen.next();
    const DynamicLayout* dyn = c.dynamic ? &*c.dynamic : nullptr;
    for (const Branch& b : c.pattern.branches) {
      if (!b.layout) continue;
      ++layouts_seen;
      const int64_t kend = c.shape.k_offset + c.shape.seq_k;
      for (int trial = 0; trial < 8; ++trial) {
        const int64_t h = static_cast<int64_t>(rng() % uint64_t(c.shape.heads_q));
        const int64_t qpos = c.shape.q_offset + static_cast<int64_t>(rng() % uint64_t(c.shape.seq_q));
        const int64_t lo = static_cast<int64_t>(rng() % uint64_t(kend)), hi = lo + static_cast<int64_t>(rng() % uint64_t(kend - lo + 1));
        std::vector<KeyInterval> got;
        layout_key_intervals(*b.layout, h, qpos, lo, hi, dyn, got);
        std::vector<KeyInterval> want;
        for (int64_t k = lo; k < hi; ++k) {
          if (!layout_allows(*b.layout, h, qpos, k, dyn)) continue;
          if (!want.empty() && want.back().end == k) ++want.back().end;
          else want.push_back({k, k + 1});
        }
        INFO("case " << n << " head " << h << " qpos " << qpos << " keys [" << lo << ", " << hi << ")\n" << canonical_text(c.pattern));
        REQUIRE(got == want);
      }
    }
  }
  REQUIRE(layouts_seen > 100);
}

TEST_CASE("the random layout's per-row hash decides as the per-block one", "[mask]") {
  std::mt19937_64 rng(11);
  for (int n = 0; n < 100000; ++n) {
    const uint64_t seed = rng(), h = rng() % 64, qb = rng() % 100000, kb = rng() % 100000;
    const double density = std::uniform_real_distribution<double>(0, 1)(rng);
    REQUIRE(RandomBlockRow(seed, density, h, qb).kept(kb) == random_block_kept(seed, density, h, qb, kb));
  }
}

TEST_CASE("the intersection of two arithmetic progressions", "[mask]") {
  std::mt19937_64 rng(7);
  for (int n = 0; n < 20000; ++n) {
    auto draw = [&] {
      KeyProgression p;
      p.step = static_cast<int64_t>(rng() % 12) + 1;
      p.first = static_cast<int64_t>(rng() % 60);
      p.last = p.first + static_cast<int64_t>(rng() % 80) - 10;  // sometimes empty
      if (!p.empty()) p.last = p.first + (p.last - p.first) / p.step * p.step;
      return p;
    };
    const KeyProgression a = draw(), b = draw(), x = intersect(a, b);
    std::vector<int64_t> want, got;
    for (int64_t j = a.first; j <= a.last; j += a.step)
      if (j >= b.first && j <= b.last && (j - b.first) % b.step == 0) want.push_back(j);
    for (int64_t j = x.first; j <= x.last; j += x.step) got.push_back(j);
    INFO("a = " << a.first << ".." << a.last << " step " << a.step << ", b = " << b.first << ".." << b.last << " step " << b.step);
    REQUIRE(got == want);
    if (!x.empty()) REQUIRE((x.last - x.first) % x.step == 0);
  }
}

TEST_CASE("selection follows seg = floor(p / w), l = p - seg*w, l mod r == off(h)", "[mask]") {
  const Pattern p = PatternBuilder().branch(BranchSpec().segment(6).dilation(4)).build();  // head_mod offsets
  Shape s;
  s.seq_q = s.seq_k = 14;
  s.heads_q = s.heads_kv = 4;
  const MaskContext c{p, s};
  // head 1: offset 1. Segments [0,6), [6,12), [12,14). Selected: 1, 5, 7, 11, 13.
  std::vector<int64_t> keys;
  for_each_branch_key(c, 0, 1, 5, [&](int64_t j) { keys.push_back(j); });
  CHECK(keys == std::vector<int64_t>{1, 5});
  keys.clear();
  for_each_branch_key(c, 0, 1, 13, [&](int64_t j) { keys.push_back(j); });
  CHECK(keys == std::vector<int64_t>{13});  // the last segment is shorter, not padded
  CHECK(branch_key_count(c, 0, 1, 6) == 0);  // row 6 has l = 0: not selected for offset 1
  CHECK(branch_key_count(c, 0, 3, 12) == 0);  // head 3 offset 3: segment [12,14) has no l = 3
}

TEST_CASE("offset rules", "[mask]") {
  Branch b;
  b.dilation = 4;
  b.offset = {OffsetRule::HeadMod, 0};
  CHECK(branch_offset(b, 6, 8) == 2);
  b.offset = {OffsetRule::HeadBlock, 0};
  CHECK(branch_offset(b, 6, 8) == 3);  // floor(6 * 4 / 8)
  CHECK(branch_offset(b, 1, 8) == 0);
  b.offset = {OffsetRule::Fixed, 3};
  CHECK(branch_offset(b, 6, 8) == 3);
}

// torchscale's rule by its own construction: the heads padded with zeros to a multiple of r,
// split as (r2 h) with r2 of size r, and head r2 * (Hp / r) + h' keeps the residue r2 (the
// diagonal of the (l r1) x (r2 h) rearrangement).
TEST_CASE("the torchscale offset rule is torchscale's padded-heads split for every heads and dilation", "[mask]") {
  Branch b;
  b.offset = {OffsetRule::Torchscale, 0};
  for (int64_t r = 1; r <= 12; ++r) {
    b.dilation = r;
    for (int64_t heads = 1; heads <= 40; ++heads) {
      const int64_t padded = (heads + r - 1) / r * r;
      std::vector<int64_t> want(static_cast<size_t>(padded));
      for (int64_t r2 = 0; r2 < r; ++r2)
        for (int64_t hh = 0; hh < padded / r; ++hh) want[static_cast<size_t>(r2 * (padded / r) + hh)] = r2;
      for (int64_t h = 0; h < heads; ++h) {
        INFO("heads " << heads << " dilation " << r << " head " << h);
        REQUIRE(branch_offset(b, h, heads) == want[static_cast<size_t>(h)]);
      }
    }
  }
  // At H = 6, r = 4 and H = 4, r = 8 the rule is not head_block's floor(h * r / H).
  b.dilation = 4;
  const std::vector<int64_t> six = {0, 0, 1, 1, 2, 2};  // H = 6, r = 4: ceil(6/4) = 2 heads per offset; 3 unused
  for (int64_t h = 0; h < 6; ++h) CHECK(branch_offset(b, h, 6) == six[static_cast<size_t>(h)]);
  Branch hb = b;
  hb.offset = {OffsetRule::HeadBlock, 0};
  CHECK(branch_offset(hb, 3, 6) == 2);  // floor(3 * 4 / 6)
  CHECK(branch_offset(b, 3, 6) == 1);
  b.dilation = 8;  // H = 4, r = 8: one head per offset, offsets 0..3
  for (int64_t h = 0; h < 4; ++h) CHECK(branch_offset(b, h, 4) == h);
  hb.dilation = 8;
  CHECK(branch_offset(hb, 1, 4) == 2);
  // Sizes near the limits do not overflow.
  b.dilation = 3;
  CHECK(branch_offset(b, kMaxSize - 1, kMaxSize) == 2);
}

TEST_CASE("the torchscale rule's mask equals its definition (H = 6 with r = 4, H = 4 with r = 8)", "[mask]") {
  for (const auto& [heads, r, w] : {std::tuple<int64_t, int64_t, int64_t>{6, 4, 8}, {4, 8, 16}, {5, 3, 7}}) {
    const Pattern p = PatternBuilder().branch(BranchSpec().segment(w).dilation(r).offset(OffsetRule::Torchscale)).build();
    Shape s;
    s.seq_q = s.seq_k = 2 * w + 3;
    s.heads_q = s.heads_kv = heads;
    const MaskContext ctx{p, s, nullptr};
    const int64_t per = (heads + r - 1) / r;
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < s.seq_q; ++i)
        for (int64_t j = 0; j < s.seq_k; ++j) {
          const bool want = i / w == j / w && (i % w) % r == h / per && (j % w) % r == h / per;
          INFO("heads " << heads << " r " << r << " head " << h << " q " << i << " k " << j);
          REQUIRE(branch_attends(ctx, 0, h, i, j) == want);
        }
  }
  const Pattern p = PatternBuilder()
                        .combine(Combine::HeadGroups)
                        .branch(BranchSpec().segment(8).dilation(2))
                        .branch(BranchSpec().segment(8).dilation(3))
                        .branch(BranchSpec().segment(8).dilation(3))
                        .build();
  CHECK(p.branches[1].offset == Offset{OffsetRule::Fixed, 1});  // group: branch index mod dilation
  CHECK(p.branches[2].offset == Offset{OffsetRule::Fixed, 2});
}

TEST_CASE("head groups: contiguous, the first heads_q mod k one larger", "[mask]") {
  // 8 heads in 3 groups: sizes 3, 3, 2.
  const std::vector<int64_t> expect = {0, 0, 0, 1, 1, 1, 2, 2};
  for (int64_t h = 0; h < 8; ++h) CHECK(head_group(h, 8, 3) == expect[static_cast<size_t>(h)]);
  for (int64_t heads = 1; heads <= 20; ++heads) {
    for (int64_t k = 1; k <= heads; ++k) {
      std::vector<int64_t> size(static_cast<size_t>(k), 0);
      int64_t prev = 0;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t g = head_group(h, heads, k);
        REQUIRE(g >= prev);
        prev = g;
        ++size[static_cast<size_t>(g)];
      }
      for (int64_t g = 0; g < k; ++g) REQUIRE(size[static_cast<size_t>(g)] == heads / k + (g < heads % k ? 1 : 0));
    }
  }
}

TEST_CASE("layout generators on block coordinates", "[mask][layout]") {
  auto allows = [](const Layout& l, int64_t h, int64_t qb, int64_t kb) {
    return layout_allows(l, h, qb * l.bq, kb * l.bk, nullptr);
  };
  const Layout local = layouts::local(1, 4, 4);
  CHECK(allows(local, 0, 5, 4));
  CHECK(allows(local, 0, 5, 6));
  CHECK_FALSE(allows(local, 0, 5, 7));
  const Layout global = layouts::global({2}, 4, 4);
  CHECK(allows(global, 0, 2, 9));
  CHECK(allows(global, 0, 9, 2));
  CHECK_FALSE(allows(global, 0, 9, 3));
  const Layout strided = layouts::strided(3, 1, 4, 4);
  CHECK(allows(strided, 0, 0, 4));
  CHECK_FALSE(allows(strided, 0, 0, 5));
  const Layout offsets = layouts::offsets({-2, 0}, 4, 4);
  CHECK(allows(offsets, 0, 5, 3));
  CHECK(allows(offsets, 0, 5, 5));
  CHECK_FALSE(allows(offsets, 0, 5, 4));
  const Layout ex = layouts::explicit_per_head({{{0, 1}}, {{1, 0}}}, 4, 4);
  CHECK(allows(ex, 0, 0, 1));
  CHECK_FALSE(allows(ex, 1, 0, 1));
  CHECK(allows(ex, 1, 1, 0));
  const Layout u = layouts::union_of({layouts::local(0, 4, 4), layouts::strided(2, 0, 4, 4)}, 4, 4);
  const Layout x = layouts::intersect_of({layouts::local(2, 4, 4), layouts::strided(2, 0, 4, 4)}, 4, 4);
  CHECK(allows(u, 0, 3, 3));
  CHECK(allows(u, 0, 3, 8));
  CHECK_FALSE(allows(x, 0, 3, 3));
  CHECK(allows(x, 0, 3, 2));
  // Rectangular blocks: query blocks of 2 positions, key blocks of 8.
  const Layout rect = layouts::local(0, 2, 8);
  CHECK(layout_allows(rect, 0, 3, 9, nullptr));      // qb 1, kb 1
  CHECK_FALSE(layout_allows(rect, 0, 3, 1, nullptr));  // qb 1, kb 0
}

TEST_CASE("random layout: the documented splitmix64 hash", "[mask][layout][random]") {
  // Values computed from docs/spec.md's definition by an independent implementation.
  CHECK(splitmix64(0) == 0xe220a8397b1dcdafull);
  CHECK(splitmix64(1) == 0x910a2dec89025cc1ull);
  CHECK(splitmix64(0xdeadbeef) == 0x4adfb90f68c9eb9bull);
  CHECK(random_block_uniform(0, 0, 0, 0) == 0.13870941014555427);
  CHECK(random_block_uniform(2020, 3, 17, 5) == 0.8245490624933912);
  CHECK(random_block_uniform(42, 1, 0, 9) == 0.19884187918759066);
  CHECK(random_block_uniform(uint64_t{1} << 63, 7, 1000, 999) == 0.6104324920504901);
}

TEST_CASE("random layout reaches its density within statistical bounds, the same every run", "[mask][layout][random]") {
  for (double density : {0.01, 0.1, 0.5, 0.9}) {
    const Layout l = layouts::random(density, 77, 1, 1);
    const int64_t n = 400;
    int64_t kept = 0, kept_again = 0;
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t qb = 0; qb < n; ++qb)
        for (int64_t kb = 0; kb < n; ++kb) {
          kept += layout_allows(l, h, qb, kb, nullptr);
          kept_again += layout_allows(l, h, qb, kb, nullptr);
        }
    const double trials = 4.0 * n * n, mean = density * trials, sd = std::sqrt(trials * density * (1 - density));
    INFO("density " << density << " kept " << kept << " of " << trials);
    CHECK(std::abs(static_cast<double>(kept) - mean) < 5 * sd);
    CHECK(kept_again == kept);
  }
  CHECK_FALSE(layout_allows(layouts::random(0.0, 1, 1, 1), 0, 0, 0, nullptr));
  CHECK(layout_allows(layouts::random(1.0, 1, 1, 1), 0, 0, 0, nullptr));
}

TEST_CASE("dynamic layouts are read from the CSR table and checked", "[mask][layout][dynamic]") {
  const Pattern p = PatternBuilder().branch(BranchSpec().full().layout(layouts::dynamic(4, 4))).build();
  Shape s;
  s.seq_q = s.seq_k = 8;  // 2 query blocks, 2 key blocks
  DynamicLayout d;
  d.row_offsets = {0, 1, 3};
  d.col_indices = {1, 0, 1};
  REQUIRE_NOTHROW(check_dynamic_layout(p, s, d, "t"));
  const MaskContext c{p, s, &d};
  CHECK_FALSE(branch_attends(c, 0, 0, 0, 0));
  CHECK(branch_attends(c, 0, 0, 0, 4));
  CHECK(branch_attends(c, 0, 0, 5, 0));
  const MaskContext missing{p, s, nullptr};
  CHECK_THROWS_AS(branch_attends(missing, 0, 0, 0, 0), UserError);

  auto rejects = [&](DynamicLayout bad, const std::string& words) {
    try {
      check_dynamic_layout(p, s, bad, "t");
      FAIL("accepted a bad table; expected: " << words);
    } catch (const UserError& e) {
      CHECK_THAT(e.what(), Catch::Contains(words));
    }
  };
  rejects({1, {0, 2, 3}, {1, 0, 1}}, "not sorted");
  rejects({1, {0, 1, 3}, {1, 0, 2}}, "outside [0, 2)");
  rejects({1, {0, 1}, {1}}, "needs heads * query_blocks + 1");
  rejects({1, {0, 2, 1}, {0, 1}}, "must start at 0 and end");
  rejects({1, {0, 2, 1, 3}, {0, 1, 1}}, "row_offsets has 4 entries");
  rejects({1, {0, 3, 2}, {0, 1}}, "decreases at row 1");
  rejects({3, {0, 0, 0, 0, 0, 0, 0}, {}}, "tables for 3 heads");
}

TEST_CASE("a device table is sanitised as the kernels count its problems", "[mask][layout][dynamic]") {
  DynamicLayout out;
  // Row 0 repeats a block (0 after 1), row 2 names block 7 of 4: two problems, both entries dropped.
  const std::vector<int64_t> offsets{0, 2, 2, 5};
  const std::vector<int32_t> cols{1, 0, 0, 3, 7};
  CHECK(sanitize_dynamic_table(offsets.data(), 3, cols.data(), 5, 4, out) == 2);
  CHECK(out.row_offsets == std::vector<int64_t>{0, 1, 1, 3});
  CHECK(out.col_indices == std::vector<int32_t>{1, 0, 3});

  // Offsets wrong everywhere: the first is not 0 (one problem for the ends), row 0 ends past the
  // entries, row 1 starts past them, row 2 starts below 0 (one each); clamped, row 0 reads [1, 3)
  // and row 2 reads [0, 3), each dropping its decreasing entry.
  const std::vector<int64_t> wild{1, 5, -2, 3};
  const std::vector<int32_t> cols2{0, 2, 1};
  CHECK(sanitize_dynamic_table(wild.data(), 3, cols2.data(), 3, 4, out) == 6);
  CHECK(out.row_offsets == std::vector<int64_t>{0, 1, 1, 3});
  CHECK(out.col_indices == std::vector<int32_t>{2, 0, 2});

  // A good table passes unchanged with no problems.
  const std::vector<int64_t> good{0, 1, 3};
  const std::vector<int32_t> cols3{1, 0, 1};
  CHECK(sanitize_dynamic_table(good.data(), 2, cols3.data(), 3, 2, out) == 0);
  CHECK(out.row_offsets == good);
  CHECK(out.col_indices == cols3);
}
