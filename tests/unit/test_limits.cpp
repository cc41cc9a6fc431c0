// The limits of compiler/pattern/pattern.hpp: positions and spec values below 2^62 (kMaxPosition), sizes
// at most 2^31 - 1 (kMaxSize). Values just inside work, and work exactly as the same call near
// position 0 does; values just beyond are UserErrors naming the field.
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>

#include "compiler/pattern/pattern_stats.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/plan/plan.hpp"
#include "compiler/support/error.hpp"
#include "runtime/cpu/plan_executor.hpp"
#include "attnjit/reference.hpp"
#include "tests/unit/random_patterns.hpp"
#include "tests/unit/test_support.hpp"

using namespace attnjit;
using attnjit::testing::error_of;
using attnjit::testing::CaseGenerator;
using attnjit::testing::random_tensor;

namespace {


Pattern spec_with(const std::string& branch) { return parse_spec(R"({"attnjit": 1, "branches": [)" + branch + "]}"); }

const std::string kLimit = std::to_string(kMaxPosition), kBelow = std::to_string(kMaxPosition - 1);

// The period after which a pattern's mask repeats along both position axes, or 0 when it does
// not repeat (layouts of absolute blocks: global, random, explicit, dynamic) or the period is large.
int64_t layout_period(const Layout& l) {
  switch (l.kind) {
    case Layout::Kind::Global:
    case Layout::Kind::Random:
    case Layout::Kind::Explicit:
    case Layout::Kind::Dynamic: return 0;
    // kb - qb moves when both positions move by the same amount, unless the blocks are square.
    case Layout::Kind::Local:
    case Layout::Kind::Offsets:
      if (l.bq != l.bk) return 0;
      break;
    default: break;
  }
  int64_t p = std::lcm(l.bq, l.kind == Layout::Kind::Strided ? l.bk * l.stride : l.bk);
  for (const Layout& c : l.children) {
    const int64_t cp = layout_period(c);
    if (cp == 0) return 0;
    p = std::lcm(p, cp);
  }
  return p;
}

int64_t mask_period(const Pattern& p) {
  int64_t period = 1;
  for (const Branch& b : p.branches) {
    period = std::lcm(period, b.segment ? *b.segment : b.dilation);
    if (b.layout) {
      const int64_t lp = layout_period(*b.layout);
      if (lp == 0) return 0;
      period = std::lcm(period, lp);
    }
    if (period > (int64_t{1} << 40)) return 0;
  }
  return period;
}

// Every pair of a call, counted three ways: the pairwise definition, the key enumeration and the
// key count. They must agree (and so agree with another call that means the same).
std::vector<int> dense_mask(const MaskContext& c) {
  const Shape& s = c.shape;
  std::vector<int> m;
  for (int64_t h = 0; h < s.heads_q; ++h)
    for (int64_t i = 0; i < s.seq_q; ++i) {
      std::vector<int> row(static_cast<size_t>(s.seq_k), 0);
      for (size_t b = 0; b < c.pattern.branches.size(); ++b) {
        int64_t n = 0;
        for_each_branch_key(c, b, h, i, [&](int64_t j) { ++row[static_cast<size_t>(j)], ++n; });
        REQUIRE(n == branch_key_count(c, b, h, i));
      }
      for (int64_t j = 0; j < s.seq_k; ++j) REQUIRE(row[static_cast<size_t>(j)] == attend_count(c, h, i, j));
      m.insert(m.end(), row.begin(), row.end());
    }
  return m;
}

void require_close(const std::vector<float>& got, const std::vector<double>& want, const char* what) {
  REQUIRE(got.size() == want.size());
  for (size_t x = 0; x < want.size(); ++x) {
    INFO(what << " index " << x);
    REQUIRE_FALSE(std::isnan(got[x]));
    if (std::isinf(want[x])) REQUIRE(got[x] == want[x]);
    else REQUIRE(got[x] == Approx(want[x]).epsilon(1e-5).margin(1e-5));
  }
}

}  // namespace

TEST_CASE("spec values below 2^62 are accepted, at 2^62 the error names the field and the fix", "[limits][pattern][errors]") {
  CHECK_NOTHROW(spec_with(R"({"segment": )" + kBelow + R"(, "dilation": )" + kBelow + "}"));
  CHECK_THAT(error_of([] { spec_with(R"({"segment": )" + kLimit + "}"); }),
             Catch::StartsWith("/branches/0/segment: segment length 4611686018427387904 is beyond the largest position "
                               "attnjit supports (2^62 = 4611686018427387904); use \"full\""));
  CHECK_THAT(error_of([] { spec_with(R"({"segment": "full", "dilation": )" + kLimit + "}"); }),
             Catch::StartsWith("/branches/0/dilation: dilation 4611686018427387904 is beyond"));
  const std::vector<std::pair<std::string, std::string>> layouts = {
      {R"({"block": )" + kLimit + R"(, "local": 0})", "/branches/0/layout/block: block size"},
      {R"({"block": [1, )" + kLimit + R"(], "local": 0})", "/branches/0/layout/block: block size"},
      {R"({"local": )" + kLimit + "}", "/branches/0/layout/local: max block distance"},
      {R"({"global": [0, )" + kLimit + "]}", "/branches/0/layout/global/1: block index"},
      {R"({"offsets": [-)" + kLimit + "]}", "/branches/0/layout/offsets/0: block offset"},
      {R"({"strided": {"stride": )" + kLimit + "}}", "/branches/0/layout/strided/stride: stride"},
      {R"({"explicit": {"blocks": [[0, )" + kLimit + "]]}}", "/branches/0/layout/explicit/blocks/0: block index"},
      {R"({"hierarchical": [{"stride": )" + kLimit + "}]}", "/branches/0/layout/hierarchical/0/stride: stride 4611686018427387904 is beyond the largest position"},
  };
  for (const auto& [layout, error] : layouts) {
    INFO(layout);
    CHECK_THAT(error_of([&] { spec_with(R"({"segment": "full", "layout": )" + layout + "}"); }), Catch::StartsWith(error));
  }
  // Just inside, each of them is fine.
  for (const std::string& layout : {R"({"block": )" + kBelow + R"(, "local": )" + kBelow + "}",
                                   R"({"global": [)" + kBelow + "]}", R"({"offsets": [-)" + kBelow + ", " + kBelow + "]}",
                                   R"({"strided": {"stride": )" + kBelow + "}}", R"({"explicit": {"blocks": [[0, )" + kBelow + "]]}}"}) {
    INFO(layout);
    CHECK_NOTHROW(spec_with(R"({"segment": "full", "layout": )" + layout + "}"));
  }
  // The builder goes through the same check.
  CHECK_THAT(error_of([] { PatternBuilder().branch(BranchSpec().segment(kMaxPosition)).build(); }),
             Catch::StartsWith("/branches/0/segment"));
}

TEST_CASE("window extents of 2^62 or more are unbounded: they mean, print and hash as -1", "[limits][pattern]") {
  const Pattern huge = spec_with(R"({"segment": "full", "window": [0, 9223372036854775807]})");
  const Pattern unbounded = spec_with(R"({"segment": "full", "window": [0, -1]})");
  CHECK(huge == unbounded);
  CHECK(pattern_hash(huge) == pattern_hash(unbounded));
  CHECK(spec_with(R"({"segment": "full", "window": [)" + kLimit + ", 3]}").branches[0].window == Window{-1, 3});
  CHECK(spec_with(R"({"segment": "full", "window": [)" + kBelow + ", 3]}").branches[0].window == Window{kMaxPosition - 1, 3});
  CHECK(parse_spec(R"({"attnjit": 1, "window": [)" + kLimit + R"(, 0], "branches": [{"segment": "full"}]})").branches[0].window ==
        Window{-1, 0});
  CHECK(PatternBuilder().window(INT64_MAX, INT64_MAX).branch(BranchSpec().full()).build().branches[0].window.unbounded());
  // A hierarchical level's window too.
  CHECK(spec_with(R"({"segment": "full", "layout": {"hierarchical": [{"window": )" + kLimit + R"(, "stride": 2}]}})") ==
        spec_with(R"({"segment": "full", "layout": {"hierarchical": [{"stride": 2}]}})"));

  // The mask at seq 4: key j >= query i, on both executors.
  Shape s;
  s.seq_q = s.seq_k = 4;
  s.heads_q = s.heads_kv = 1;
  s.head_dim = s.head_dim_v = 4;
  const MaskContext c{huge, s};
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 4; ++j) CHECK(attend_count(c, 0, i, j) == int(j >= i));
  const auto q = random_tensor(16, 1), k = random_tensor(16, 2), v = random_tensor(16, 3);
  const ReferenceOutput want = reference_attention(huge, s, q.data(), k.data(), v.data());
  const ExecutorOutput got = execute_plan(lower_to_plan(huge, s, TileConfig{2, 2}), huge, q.data(), k.data(), v.data());
  require_close(got.o, want.o, "o");
  require_close(got.lse, want.lse, "lse");
}

TEST_CASE("shape limits: offset + length at most 2^62, sizes at most 2^31 - 1, tensors below 2^62 elements", "[limits][errors]") {
  Shape s;
  s.seq_q = s.seq_k = 8;
  s.q_offset = s.k_offset = kMaxPosition - 8;  // the last rows sit at 2^62 - 1
  CHECK_NOTHROW(check_shape(s, ""));
  s.q_offset = kMaxPosition - 7;
  CHECK_THAT(error_of([&] { check_shape(s, ""); }),
             Catch::StartsWith("q_offset: 4611686018427387897 + seq_q 8 goes past the largest position attnjit supports "
                               "(2^62 = 4611686018427387904); use an offset of at most 4611686018427387896"));
  s.q_offset = 0;
  s.k_offset = INT64_MAX;
  CHECK_THAT(error_of([&] { check_shape(s, "problem."); }), Catch::StartsWith("problem.k_offset: 9223372036854775807 + seq_k 8"));
  s.k_offset = 0;
  s.seq_q = kMaxSize;
  CHECK_NOTHROW(check_shape(s, ""));
  s.seq_q = kMaxSize + 1;
  CHECK_THAT(error_of([&] { check_shape(s, ""); }),
             Catch::StartsWith("seq_q: 2147483648 is larger than attnjit supports (at most 2147483647 = 2^31 - 1"));
  s.seq_q = 8;
  s.heads_kv = kMaxSize + 1;
  CHECK_THAT(error_of([&] { check_shape(s, ""); }), Catch::StartsWith("heads_kv: 2147483648 is larger"));
  s.heads_kv = 1;
  s.batch = s.seq_q = s.heads_q = s.heads_kv = kMaxSize;
  CHECK_THAT(error_of([&] { check_shape(s, ""); }),
             Catch::StartsWith("shape: the queries would hold batch * seq_q * heads_q * head_dim = more than 2^62 elements"));
  // The plan checks the shape before it sizes anything.
  const Pattern p = spec_with(R"({"segment": 8})");
  Shape big;
  big.seq_q = big.seq_k = kMaxPosition;
  CHECK_THAT(error_of([&] { lower_to_plan(p, big, TileConfig{}); }), Catch::StartsWith("seq_q: 4611686018427387904 is larger"));
}

TEST_CASE("at the position limit the mask, the counts, the reference and the plan executor equal the same call near 0",
          "[limits][property]") {
  // A pattern without absolute blocks repeats with the lcm of its segments, dilations and blocks:
  // moving a call by a multiple of it up to the last positions below 2^62 changes nothing.
  CaseGenerator gen(262);
  int checked = 0;
  for (int n = 0; n < 400 && checked < 60; ++n) {
    auto c = gen.next();
    const int64_t period = c.dynamic ? 0 : mask_period(c.pattern);
    if (period == 0) continue;
    ++checked;
    Shape near = c.shape, far = c.shape;
    const int64_t shift = (kMaxPosition - 4096) / period * period;
    // Half the cases end exactly at the limit: the last query or key sits at 2^62 - 1.
    if (gen.coin()) near.q_offset = kMaxPosition - far.seq_q - shift;
    if (gen.coin()) near.k_offset = kMaxPosition - far.seq_k - shift;
    far.q_offset = near.q_offset + shift;
    far.k_offset = near.k_offset + shift;
    INFO("case " << n << " period " << period << "\n" << canonical_text(c.pattern) << "seq_q=" << near.seq_q
                 << " seq_k=" << near.seq_k << " heads_q=" << near.heads_q << " q_offset=" << near.q_offset << " (+"
                 << shift << ") k_offset=" << near.k_offset);
    REQUIRE(far.q_offset + far.seq_q <= kMaxPosition);
    REQUIRE(far.k_offset + far.seq_k <= kMaxPosition);
    REQUIRE_NOTHROW(check_pattern_fits(c.pattern, far));
    const MaskContext mn{c.pattern, near}, mf{c.pattern, far};
    REQUIRE(dense_mask(mf) == dense_mask(mn));
    const PatternStats sn = pattern_stats(mn), sf = pattern_stats(mf);
    REQUIRE(sf.attended_pairs == sn.attended_pairs);
    REQUIRE(sf.distinct_pairs == sn.distinct_pairs);
    REQUIRE(sf.empty_rows == sn.empty_rows);

    const Shape& s = near;
    const auto q = random_tensor(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim), 3 * n + 1);
    const auto k = random_tensor(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim), 3 * n + 2);
    const auto v = random_tensor(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim_v), 3 * n + 3);
    const ReferenceOutput want = reference_attention(c.pattern, near, q.data(), k.data(), v.data(), nullptr, 1);
    const ReferenceOutput far_ref = reference_attention(c.pattern, far, q.data(), k.data(), v.data(), nullptr, 1);
    REQUIRE(far_ref.o == want.o);
    REQUIRE(far_ref.lse == want.lse);
    const TileConfig tiles{static_cast<int32_t>(gen.uniform(1, 9)), static_cast<int32_t>(gen.uniform(1, 9))};
    const ExecutorOutput got = execute_plan(lower_to_plan(c.pattern, far, tiles), c.pattern, q.data(), k.data(), v.data());
    require_close(got.o, want.o, "o");
    require_close(got.lse, want.lse, "lse");
  }
  REQUIRE(checked >= 40);
}

TEST_CASE("values at the limit: huge segments, dilations, windows and blocks at the last positions", "[limits]") {
  // Each spec at q_offset = k_offset = 2^62 - 16 (so the last row is 2^62 - 1): the three ways of
  // counting agree, the plan executor matches the reference, and nothing takes long (a local
  // layout of 16-blocks here once ran for minutes through an overflowed interval).
  const std::vector<std::string> specs = {
      R"({"segment": 8})",
      R"({"segment": )" + kBelow + "}",
      R"({"segment": "full", "dilation": 4611686018427387903})",
      R"({"segment": 4611686018427387902, "dilation": 2305843009213693951, "offset": "head_block"})",
      R"({"segment": 4611686018427387902, "dilation": 3, "offset": "head_block", "causal": true})",
      R"({"segment": "full", "window": [4611686018427387903, 2]})",
      R"({"segment": "full", "window": [3, 9223372036854775807]})",
      R"({"segment": "full", "layout": {"block": 16, "local": 0}})",
      R"({"segment": "full", "layout": {"block": [4, 16], "local": 4611686018427387903}})",
      R"({"segment": "full", "layout": {"block": 4611686018427387903, "local": 0}})",
      R"({"segment": "full", "layout": {"block": 2, "strided": {"stride": 4611686018427387903, "phase": 4611686018427387902}}})",
      R"({"segment": "full", "layout": {"block": 4, "offsets": [-4611686018427387903, 0, 4611686018427387903]}})",
      R"({"segment": "full", "layout": {"block": 4, "global": [1152921504606846975]}})",
      R"({"segment": "full", "layout": {"block": 4, "explicit": {"blocks": [[1152921504606846975, 1152921504606846972]]}}})",
      R"({"segment": "full", "layout": {"block": 8, "hierarchical": [{"window": 0}, {"window": 4611686018427387903, "stride": 3}]}})",
  };
  for (const std::string& branch : specs) {
    INFO(branch);
    const Pattern p = spec_with(branch + R"(, {"segment": 4, "dilation": 2})");
    Shape s;
    s.seq_q = s.seq_k = 16;
    s.heads_q = s.heads_kv = 2;
    s.head_dim = s.head_dim_v = 4;
    s.q_offset = s.k_offset = kMaxPosition - 16;
    const MaskContext c{p, s};
    dense_mask(c);
    const PatternStats st = pattern_stats(c);
    REQUIRE(st.distinct_pairs <= s.heads_q * s.seq_q * s.seq_k);
    const auto q = random_tensor(128, 1), k = random_tensor(128, 2), v = random_tensor(128, 3);
    const ReferenceOutput want = reference_attention(p, s, q.data(), k.data(), v.data());
    for (const TileConfig tiles : {TileConfig{4, 4}, TileConfig{3, 5}, TileConfig{64, 64}}) {
      const ExecutorOutput got = execute_plan(lower_to_plan(p, s, tiles), p, q.data(), k.data(), v.data());
      require_close(got.o, want.o, "o");
      require_close(got.lse, want.lse, "lse");
    }
  }
}

TEST_CASE("progressions with steps near 2^62 intersect without overflow", "[limits][mask]") {
  const int64_t a_step = (int64_t{1} << 61) - 1, b_step = (int64_t{1} << 61) + 1;  // coprime: the lcm is past int64
  const KeyProgression a{5, 5, a_step}, b{5, 5, b_step};
  const KeyProgression x = intersect(a, b);
  CHECK(x.count() == 1);
  CHECK(x.first == 5);
  CHECK(intersect(KeyProgression{3, 3 + a_step, a_step}, KeyProgression{7, 7, b_step}).empty());
  CHECK(intersect(KeyProgression{0, 2 * a_step, a_step}, KeyProgression{a_step, a_step, b_step}).count() == 1);
}
