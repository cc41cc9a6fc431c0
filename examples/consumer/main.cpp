// A program built against the installed attnjit (examples/consumer/CMakeLists.txt): runs a pattern
// spec on the CPU device with small random inputs and checks O and LSE against the library's
// float64 reference; exits non-zero on a mismatch.
//   attnjit_consumer SPEC.json
#include <attnjit/attnjit.hpp>
#include <attnjit/reference.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

namespace aj = attnjit;

namespace {

std::vector<float> random_normal(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& e : x) e = normal(rng);
  return x;
}

// Compares float32 results with the float64 reference: |got - want| <= 1e-4 + 1e-4 |want|; two
// -inf (a row that attends nothing) agree, a NaN never does. Names the first mismatches.
struct Comparison {
  double worst = 0;  // the largest error as a fraction of the tolerance
  int mismatches = 0;

  void check(const std::string& where, float got, double want) {
    double ratio = std::abs(got - want) / (1e-4 + 1e-4 * std::abs(want));
    if (std::isinf(want) && got == want) ratio = 0;
    if (std::isnan(ratio)) ratio = INFINITY;
    worst = std::max(worst, ratio);
    if (ratio > 1 && mismatches++ < 5) std::fprintf(stderr, "%s = %g, the reference says %g\n", where.c_str(), got, want);
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s SPEC.json\n", argv[0]);
    return 2;
  }
  try {
    const aj::Pattern pattern = aj::load_spec_file(argv[1]);
    const int64_t seq = 300, heads_q = 4, heads_kv = 2, dim = 32;  // batch 1
    const aj::Problem problem{1, seq, seq, heads_q, heads_kv, dim, dim, aj::DType::F32};
    std::vector<float> q = random_normal(seq * heads_q * dim, 1);
    std::vector<float> k = random_normal(seq * heads_kv * dim, 2);
    std::vector<float> v = random_normal(seq * heads_kv * dim, 3);
    std::vector<float> o(q.size()), lse(heads_q * seq);

    aj::Runtime runtime;  // the CPU device: the plan executor
    aj::Attention op = runtime.prepare(pattern, problem);
    auto view = [](std::vector<float>& x, std::vector<int64_t> shape) {
      return aj::TensorView::contiguous(x.data(), aj::DType::F32, std::move(shape));
    };
    const aj::TensorView lse_view = view(lse, {1, heads_q, seq});
    op.forward(view(q, {1, seq, heads_q, dim}), view(k, {1, seq, heads_kv, dim}), view(v, {1, seq, heads_kv, dim}),
               view(o, {1, seq, heads_q, dim}), &lse_view);

    const aj::Shape shape{1, seq, seq, heads_q, heads_kv, dim, dim};
    const aj::ReferenceOutput want = aj::reference_attention(pattern, shape, q.data(), k.data(), v.data());
    Comparison c;
    for (int64_t i = 0; i < seq; ++i)  // O [1, seq, heads_q, dim]
      for (int64_t h = 0; h < heads_q; ++h)
        for (int64_t d = 0; d < dim; ++d) {
          const size_t x = static_cast<size_t>((i * heads_q + h) * dim + d);
          c.check("O[0, " + std::to_string(i) + ", " + std::to_string(h) + ", " + std::to_string(d) + "]", o[x], want.o[x]);
        }
    for (int64_t h = 0; h < heads_q; ++h)  // LSE [1, heads_q, seq]
      for (int64_t i = 0; i < seq; ++i) {
        const size_t x = static_cast<size_t>(h * seq + i);
        c.check("LSE[0, " + std::to_string(h) + ", " + std::to_string(i) + "]", lse[x], want.lse[x]);
      }
    std::printf("%s: %s on %s against the float64 reference: worst error %.3f of the tolerance, %d mismatches: %s\n",
                argv[1], op.kernel_name().c_str(), runtime.device().describe().c_str(), c.worst, c.mismatches,
                c.mismatches == 0 ? "OK" : "MISMATCH");
    return c.mismatches == 0 ? 0 : 1;
  } catch (const aj::UserError& e) {  // a bad spec or shape: names the field and the fix
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
