// The CPU reference against formulas computed here, independently: plain attention, the paper's
// branch mix, per-group attention, chunks with offsets (and key chunks merged by LSE), GQA.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>

#include "attnjit/reference.hpp"
#include "tests/unit/random_patterns.hpp"

using namespace attnjit;
using attnjit::testing::CaseGenerator;
using attnjit::testing::random_tensor;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Inputs {
  std::vector<float> q, k, v;
  explicit Inputs(const Shape& s, uint64_t seed)
      : q(random_tensor(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim), seed)),
        k(random_tensor(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim), seed + 1)),
        v(random_tensor(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim_v), seed + 2)) {}
};

// Masked attention of one (batch, head, row), dense over every key: returns the unnormalised
// sum of exp(score) * v, the sum of exp(score) and their max-free form (scores are small here).
struct RowSums {
  std::vector<double> weighted;  // sum_j m(j) exp(s_j) v_j
  double denom = 0.0;            // sum_j m(j) exp(s_j)
};

RowSums naive_row(const Shape& s, const Inputs& in, double scale, int64_t b, int64_t h, int64_t i,
                  const std::function<int(int64_t)>& multiplicity) {
  const int64_t kvh = h / (s.heads_q / s.heads_kv);
  RowSums r;
  r.weighted.assign(static_cast<size_t>(s.head_dim_v), 0.0);
  for (int64_t j = 0; j < s.seq_k; ++j) {
    const int m = multiplicity(j);
    if (m == 0) continue;
    double dot = 0.0;
    for (int64_t d = 0; d < s.head_dim; ++d)
      dot += static_cast<double>(in.q[((b * s.seq_q + i) * s.heads_q + h) * s.head_dim + d]) *
             in.k[((b * s.seq_k + j) * s.heads_kv + kvh) * s.head_dim + d];
    const double e = m * std::exp(scale * dot);
    r.denom += e;
    for (int64_t d = 0; d < s.head_dim_v; ++d)
      r.weighted[static_cast<size_t>(d)] += e * in.v[((b * s.seq_k + j) * s.heads_kv + kvh) * s.head_dim_v + d];
  }
  return r;
}

void require_row(const ReferenceOutput& out, const Shape& s, int64_t b, int64_t h, int64_t i, const std::vector<double>& o,
                 double lse) {
  INFO("batch " << b << " head " << h << " row " << i);
  const double got_lse = out.lse[static_cast<size_t>((b * s.heads_q + h) * s.seq_q + i)];
  if (std::isinf(lse)) {
    REQUIRE(got_lse == -kInf);
  } else {
    REQUIRE(got_lse == Approx(lse).epsilon(1e-12).margin(1e-12));
  }
  for (int64_t d = 0; d < s.head_dim_v; ++d) {
    const double got = out.o[static_cast<size_t>(((b * s.seq_q + i) * s.heads_q + h) * s.head_dim_v + d)];
    REQUIRE_FALSE(std::isnan(got));
    REQUIRE(got == Approx(o[static_cast<size_t>(d)]).epsilon(1e-10).margin(1e-12));
  }
}

std::vector<double> divided(std::vector<double> v, double by) {
  for (double& x : v) x = by == 0.0 ? 0.0 : x / by;
  return v;
}

}  // namespace

TEST_CASE("one full branch with dilation 1 is plain (causal) attention", "[reference][property]") {
  CaseGenerator gen(11);
  for (int n = 0; n < 150; ++n) {
    Shape s = gen.random_shape();
    const bool causal = gen.coin();
    const Pattern p = PatternBuilder().causal(causal).branch(BranchSpec().full()).build();
    const Inputs in(s, 100 + n);
    const ReferenceOutput out = reference_attention(p, s, in.q.data(), in.k.data(), in.v.data());
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads_q; ++h)
        for (int64_t i = 0; i < s.seq_q; ++i) {
          const RowSums r = naive_row(s, in, scale, b, h, i, [&](int64_t j) {
            return !causal || s.k_offset + j <= s.q_offset + i;
          });
          require_row(out, s, b, h, i, divided(r.weighted, r.denom), r.denom > 0 ? std::log(r.denom) : -kInf);
        }
  }
}

TEST_CASE("softmax combine equals the paper's mix sum_b alpha_b O_b, alpha_b = s_b / sum s", "[reference][property]") {
  CaseGenerator gen(22);
  int checked = 0;
  while (checked < 150) {
    auto c = gen.next();
    if (c.pattern.combine != Combine::Softmax) continue;
    ++checked;
    const Shape& s = c.shape;
    const Inputs in(s, 200 + checked);
    const DynamicLayout* dyn = c.dynamic ? &*c.dynamic : nullptr;
    const ReferenceOutput out = reference_attention(c.pattern, s, in.q.data(), in.k.data(), in.v.data(), dyn);
    const MaskContext ctx{c.pattern, s, dyn};
    const double scale = softmax_scale(c.pattern, s);
    INFO(canonical_text(c.pattern));
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads_q; ++h)
        for (int64_t i = 0; i < s.seq_q; ++i) {
          // Per-branch attention O_b with its softmax denominator s_b, then the mix.
          std::vector<double> mixed(static_cast<size_t>(s.head_dim_v), 0.0);
          double total = 0.0;
          std::vector<RowSums> per_branch;
          for (size_t br = 0; br < c.pattern.branches.size(); ++br) {
            per_branch.push_back(naive_row(s, in, scale, b, h, i, [&](int64_t j) { return int(branch_attends(ctx, br, h, i, j)); }));
            total += per_branch.back().denom;
          }
          for (const RowSums& r : per_branch) {
            if (r.denom == 0.0) continue;
            const std::vector<double> o_b = divided(r.weighted, r.denom);
            for (size_t d = 0; d < mixed.size(); ++d) mixed[d] += (r.denom / total) * o_b[d];
          }
          require_row(out, s, b, h, i, mixed, total > 0 ? std::log(total) : -kInf);
        }
  }
}

TEST_CASE("head_groups equals per-group attention, zeros on unselected rows", "[reference][property]") {
  CaseGenerator gen(33);
  int checked = 0;
  while (checked < 150) {
    auto c = gen.next();
    if (c.pattern.combine != Combine::HeadGroups) continue;
    ++checked;
    const Shape& s = c.shape;
    const Inputs in(s, 300 + checked);
    const DynamicLayout* dyn = c.dynamic ? &*c.dynamic : nullptr;
    const ReferenceOutput out = reference_attention(c.pattern, s, in.q.data(), in.k.data(), in.v.data(), dyn);
    const MaskContext ctx{c.pattern, s, dyn};
    const int64_t groups = static_cast<int64_t>(c.pattern.branches.size());
    const double divide = c.pattern.group_scale == GroupScale::Mean ? static_cast<double>(groups) : 1.0;
    INFO(canonical_text(c.pattern));
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads_q; ++h) {
        const size_t g = static_cast<size_t>(head_group(h, s.heads_q, groups));
        for (int64_t i = 0; i < s.seq_q; ++i) {
          const RowSums r = naive_row(s, in, softmax_scale(c.pattern, s), b, h, i,
                                      [&](int64_t j) { return int(branch_attends(ctx, g, h, i, j)); });
          require_row(out, s, b, h, i, divided(r.weighted, r.denom * divide), r.denom > 0 ? std::log(r.denom) : -kInf);
        }
      }
  }
}

TEST_CASE("a query chunk with q_offset equals the matching rows of the whole computation", "[reference][property]") {
  CaseGenerator gen(44);
  for (int n = 0; n < 100; ++n) {
    auto c = gen.next();
    if (c.dynamic) continue;
    Shape whole = c.shape;
    whole.q_offset = whole.k_offset = 0;
    whole.seq_k = whole.seq_q = std::max<int64_t>(whole.seq_q, 2);
    if (!c.pattern.branches.empty()) {
      try { check_pattern_fits(c.pattern, whole); } catch (...) { continue; }
    }
    const Inputs in(whole, 400 + n);
    const ReferenceOutput full = reference_attention(c.pattern, whole, in.q.data(), in.k.data(), in.v.data());
    const int64_t a = gen.uniform(0, whole.seq_q - 1), len = gen.uniform(1, whole.seq_q - a);
    Shape chunk = whole;
    chunk.seq_q = len;
    chunk.q_offset = a;
    // The chunk's Q rows, batch by batch.
    std::vector<float> qc;
    for (int64_t b = 0; b < whole.batch; ++b) {
      const auto begin = in.q.begin() + (b * whole.seq_q + a) * whole.heads_q * whole.head_dim;
      qc.insert(qc.end(), begin, begin + len * whole.heads_q * whole.head_dim);
    }
    const ReferenceOutput part = reference_attention(c.pattern, chunk, qc.data(), in.k.data(), in.v.data());
    for (int64_t b = 0; b < whole.batch; ++b)
      for (int64_t h = 0; h < whole.heads_q; ++h)
        for (int64_t i = 0; i < len; ++i) {
          std::vector<double> o(full.o.begin() + ((b * whole.seq_q + a + i) * whole.heads_q + h) * whole.head_dim_v,
                                full.o.begin() + ((b * whole.seq_q + a + i) * whole.heads_q + h + 1) * whole.head_dim_v);
          require_row(part, chunk, b, h, i, o, full.lse[static_cast<size_t>((b * whole.heads_q + h) * whole.seq_q + a + i)]);
        }
  }
}

TEST_CASE("key chunks with k_offset, merged by LSE, equal the whole computation", "[reference][property]") {
  // The ring-attention identity: attention over keys [0, c) and [c, S) merged with
  // m = max(l1, l2), O = (e^(l1-m) O1 + e^(l2-m) O2) / (e^(l1-m) + e^(l2-m)).
  CaseGenerator gen(55);
  int checked = 0;
  while (checked < 100) {
    auto c = gen.next();
    if (c.dynamic || c.pattern.combine != Combine::Softmax) continue;
    Shape whole = c.shape;
    whole.k_offset = 0;
    whole.seq_k = std::max<int64_t>(whole.seq_k, 2);
    try { check_pattern_fits(c.pattern, whole); } catch (...) { continue; }
    ++checked;
    const Inputs in(whole, 500 + checked);
    const ReferenceOutput full = reference_attention(c.pattern, whole, in.q.data(), in.k.data(), in.v.data());
    const int64_t cut = gen.uniform(1, whole.seq_k - 1);
    auto keys = [&](const std::vector<float>& t, int64_t dim, int64_t from, int64_t len) {
      std::vector<float> out;
      for (int64_t b = 0; b < whole.batch; ++b) {
        const auto begin = t.begin() + (b * whole.seq_k + from) * whole.heads_kv * dim;
        out.insert(out.end(), begin, begin + len * whole.heads_kv * dim);
      }
      return out;
    };
    Shape s1 = whole, s2 = whole;
    s1.seq_k = cut;
    s2.seq_k = whole.seq_k - cut;
    s2.k_offset = cut;
    const ReferenceOutput r1 = reference_attention(c.pattern, s1, in.q.data(), keys(in.k, whole.head_dim, 0, cut).data(),
                                                   keys(in.v, whole.head_dim_v, 0, cut).data());
    const ReferenceOutput r2 = reference_attention(c.pattern, s2, in.q.data(), keys(in.k, whole.head_dim, cut, s2.seq_k).data(),
                                                   keys(in.v, whole.head_dim_v, cut, s2.seq_k).data());
    for (int64_t b = 0; b < whole.batch; ++b)
      for (int64_t h = 0; h < whole.heads_q; ++h)
        for (int64_t i = 0; i < whole.seq_q; ++i) {
          const size_t li = static_cast<size_t>((b * whole.heads_q + h) * whole.seq_q + i);
          const double l1 = r1.lse[li], l2 = r2.lse[li];
          const double m = std::max(l1, l2);
          std::vector<double> o(static_cast<size_t>(whole.head_dim_v), 0.0);
          double lse = -kInf;
          if (m != -kInf) {
            const double w1 = std::exp(l1 - m), w2 = std::exp(l2 - m);
            for (int64_t d = 0; d < whole.head_dim_v; ++d) {
              const size_t oi = static_cast<size_t>(((b * whole.seq_q + i) * whole.heads_q + h) * whole.head_dim_v + d);
              o[static_cast<size_t>(d)] = (w1 * r1.o[oi] + w2 * r2.o[oi]) / (w1 + w2);
            }
            lse = m + std::log(w1 + w2);
          }
          require_row(full, whole, b, h, i, o, lse);
        }
  }
}

TEST_CASE("GQA reads kv head h / (heads_q / heads_kv)", "[reference]") {
  CaseGenerator gen(66);
  for (int n = 0; n < 50; ++n) {
    auto c = gen.next();
    Shape s = c.shape;
    if (s.heads_kv == s.heads_q) continue;
    const DynamicLayout* dyn = c.dynamic ? &*c.dynamic : nullptr;
    const Inputs in(s, 600 + n);
    const ReferenceOutput gqa = reference_attention(c.pattern, s, in.q.data(), in.k.data(), in.v.data(), dyn);
    // Repeat each kv head for its query heads and run as plain multi-head attention.
    Shape mha = s;
    mha.heads_kv = s.heads_q;
    const int64_t per = s.heads_q / s.heads_kv;
    auto repeat = [&](const std::vector<float>& t, int64_t dim) {
      std::vector<float> out;
      for (int64_t row = 0; row < s.batch * s.seq_k; ++row)
        for (int64_t h = 0; h < s.heads_q; ++h) {
          const auto begin = t.begin() + (row * s.heads_kv + h / per) * dim;
          out.insert(out.end(), begin, begin + dim);
        }
      return out;
    };
    const ReferenceOutput rep = reference_attention(c.pattern, mha, in.q.data(), repeat(in.k, s.head_dim).data(),
                                                    repeat(in.v, s.head_dim_v).data(), dyn);
    REQUIRE(gqa.o == rep.o);
    REQUIRE(gqa.lse == rep.lse);
  }
}

TEST_CASE("rows that attend nothing give O = 0 and LSE = -inf, never NaN", "[reference]") {
  // Dilation 4 with a fixed offset 3 in segments of 4: rows 0, 1, 2 of each segment are not selected.
  const Pattern p = PatternBuilder().branch(BranchSpec().segment(4).dilation(4).offset(3)).build();
  Shape s;
  s.seq_q = s.seq_k = 8;
  s.head_dim = s.head_dim_v = 2;
  const Inputs in(s, 7);
  const ReferenceOutput out = reference_attention(p, s, in.q.data(), in.k.data(), in.v.data());
  for (int64_t i = 0; i < 8; ++i) {
    INFO("row " << i);
    const bool selected = i % 4 == 3;
    CHECK(std::isinf(out.lse[static_cast<size_t>(i)]) == !selected);
    for (int64_t d = 0; d < 2; ++d) {
      const double o = out.o[static_cast<size_t>(i * 2 + d)];
      CHECK_FALSE(std::isnan(o));
      if (!selected) CHECK(o == 0.0);
    }
  }
  // Rows selected but alone in their segment attend themselves only: O is their own V row.
  CHECK(out.o[6] == Approx(in.v[6]));
}
