// The float64 reference gradients against central finite differences of the float64 forward, on
// random patterns of every kind (both combine rules, layouts, dynamic tables, GQA, offsets, rows
// that attend nothing).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>

#include "attnjit/reference.hpp"
#include "tests/unit/random_patterns.hpp"

using namespace attnjit;

namespace {

// L = sum(O * dO), whose gradient with respect to the inputs is what backward computes.
double loss(const Pattern& p, const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
            const std::vector<float>& v, const std::vector<float>& dout, const DynamicLayout* dyn) {
  const ReferenceOutput r = reference_attention(p, s, q.data(), k.data(), v.data(), dyn, 1);
  double l = 0.0;
  for (size_t n = 0; n < r.o.size(); ++n) l += r.o[n] * dout[n];
  return l;
}

// The derivative of loss() along coordinate n of x, by central differences (the step is taken in
// float, and the difference of the perturbed floats is what the quotient divides by).
double numeric(std::vector<float>& x, size_t n, const std::function<double()>& f) {
  const float saved = x[n];
  const float h = std::max(1e-3f, std::abs(saved) * 1e-3f);
  x[n] = saved + h;
  const double up = f();
  const float hi = x[n];
  x[n] = saved - h;
  const double down = f();
  const float lo = x[n];
  x[n] = saved;
  return (up - down) / (static_cast<double>(hi) - lo);
}

}  // namespace

TEST_CASE("reference gradients equal finite differences on random patterns", "[reference][grad][property]") {
  testing::CaseGenerator gen(2024);
  std::mt19937_64 rng(7);
  int checked = 0, with_empty_rows = 0;
  for (int c = 0; c < 120; ++c) {
    testing::RandomCase rc = gen.next();
    const Shape& s = rc.shape;
    const DynamicLayout* dyn = rc.dynamic ? &*rc.dynamic : nullptr;
    std::vector<float> q = testing::random_tensor(size_t(s.batch * s.seq_q * s.heads_q * s.head_dim), 10 * c + 1);
    std::vector<float> k = testing::random_tensor(size_t(s.batch * s.seq_k * s.heads_kv * s.head_dim), 10 * c + 2);
    std::vector<float> v = testing::random_tensor(size_t(s.batch * s.seq_k * s.heads_kv * s.head_dim_v), 10 * c + 3);
    const std::vector<float> dout = testing::random_tensor(size_t(s.batch * s.seq_q * s.heads_q * s.head_dim_v), 10 * c + 4);
    const ReferenceGradients g = reference_attention_backward(rc.pattern, s, q.data(), k.data(), v.data(), dout.data(), dyn, 1);
    const ReferenceOutput fwd = reference_attention(rc.pattern, s, q.data(), k.data(), v.data(), dyn, 1);
    for (double l : fwd.lse) with_empty_rows += std::isinf(l) ? 1 : 0;
    const auto f = [&] { return loss(rc.pattern, s, q, k, v, dout, dyn); };
    INFO("case " << c << "\n" << canonical_text(rc.pattern) << "shape: batch " << s.batch << " seq " << s.seq_q << "x" << s.seq_k
                 << " heads " << s.heads_q << "/" << s.heads_kv << " dims " << s.head_dim << "/" << s.head_dim_v
                 << " offsets " << s.q_offset << "," << s.k_offset);
    auto check = [&](const char* name, std::vector<float>& x, const std::vector<double>& analytic) {
      for (int t = 0; t < 4; ++t) {
        const size_t n = size_t(rng() % x.size());
        const double want = numeric(x, n, f), got = analytic[n];
        INFO(name << "[" << n << "]: analytic " << got << ", numeric " << want);
        CHECK(std::abs(got - want) <= 2e-3 * (1 + std::abs(want)));
        ++checked;
      }
    };
    check("dq", q, g.dq);
    check("dk", k, g.dk);
    check("dv", v, g.dv);
  }
  CHECK(checked == 120 * 12);
  CHECK(with_empty_rows > 0);  // the generator produced rows that attend nothing
}

TEST_CASE("reference gradients of rows that attend nothing are zero, never NaN", "[reference][grad]") {
  // A causal pattern with a negative key offset gap: the first rows see no key.
  const Pattern p = PatternBuilder().branch(BranchSpec().full().causal()).build();
  Shape s;
  s.seq_q = 8, s.seq_k = 8, s.q_offset = 0, s.k_offset = 4, s.head_dim = s.head_dim_v = 4;
  const std::vector<float> q = testing::random_tensor(32, 1), k = testing::random_tensor(32, 2), v = testing::random_tensor(32, 3),
                           dout = testing::random_tensor(32, 4);
  const ReferenceGradients g = reference_attention_backward(p, s, q.data(), k.data(), v.data(), dout.data());
  for (int64_t i = 0; i < 4; ++i)  // rows 0..3 sit before every key
    for (int64_t d = 0; d < 4; ++d) CHECK(g.dq[size_t(i * 4 + d)] == 0.0);
  for (double x : g.dq) CHECK(std::isfinite(x));
  for (double x : g.dk) CHECK(std::isfinite(x));
  // Keys 4..7 sit at positions 8..11, after every query: nothing reads them.
  for (int64_t j = 4; j < 8; ++j)
    for (int64_t d = 0; d < 4; ++d) CHECK(g.dv[size_t(j * 4 + d)] == 0.0);
}
