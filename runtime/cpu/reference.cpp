#include "attnjit/reference.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>

#include "compiler/support/error.hpp"

namespace attnjit {

namespace {

struct Row {
  std::vector<double> p;  // scores, then probabilities
  std::vector<int64_t> keys;
  double lse = 0;
};

// One (batch, head, query row): one softmax over the keys of every branch the row takes part in,
// a key counted once per branch that attends it. Leaves the probabilities in row.p (empty when the
// row attends nothing; lse is then -inf).
template <class T>
void row_softmax(const MaskContext& c, const T* q, const T* k, int64_t bi, int64_t h, int64_t i, double scale,
                 Row& row) {
  const Shape& s = c.shape;
  const int64_t kvh = h / (s.heads_q / s.heads_kv);
  const T* qrow = q + ((bi * s.seq_q + i) * s.heads_q + h) * s.head_dim;
  row.p.clear();
  row.keys.clear();
  for (size_t b = 0; b < c.pattern.branches.size(); ++b) {
    for_each_branch_key(c, b, h, i, [&](int64_t j) {
      const T* krow = k + ((bi * s.seq_k + j) * s.heads_kv + kvh) * s.head_dim;
      double dot = 0.0;
      for (int64_t d = 0; d < s.head_dim; ++d) dot += static_cast<double>(qrow[d]) * krow[d];
      row.p.push_back(scale * dot);
      row.keys.push_back(j);
    });
  }
  if (row.p.empty()) {
    row.lse = -std::numeric_limits<double>::infinity();
    return;
  }
  const double m = *std::max_element(row.p.begin(), row.p.end());
  double sum = 0.0;
  for (double& x : row.p) sum += (x = std::exp(x - m));
  for (double& x : row.p) x /= sum;
  row.lse = m + std::log(sum);
}

// head_groups with group_scale "mean" divides the output by the number of groups, as the seed
// project does; the factor multiplies O and so every gradient.
double output_factor(const Pattern& p) {
  return p.combine == Combine::HeadGroups && p.group_scale == GroupScale::Mean ? 1.0 / static_cast<double>(p.branches.size())
                                                                                 : 1.0;
}

template <class T>
void reference_row(const MaskContext& c, const T* q, const T* k, const T* v, int64_t bi, int64_t h,
                   int64_t i, double scale, Row& row, ReferenceOutput& out) {
  const Shape& s = c.shape;
  const int64_t kvh = h / (s.heads_q / s.heads_kv);
  row_softmax(c, q, k, bi, h, i, scale, row);
  double* orow = out.o.data() + ((bi * s.seq_q + i) * s.heads_q + h) * s.head_dim_v;
  std::fill(orow, orow + s.head_dim_v, 0.0);
  out.lse[(bi * s.heads_q + h) * s.seq_q + i] = row.lse;
  const double f = output_factor(c.pattern);
  for (size_t n = 0; n < row.p.size(); ++n) {
    const T* vrow = v + ((bi * s.seq_k + row.keys[n]) * s.heads_kv + kvh) * s.head_dim_v;
    for (int64_t d = 0; d < s.head_dim_v; ++d) orow[d] += f * row.p[n] * vrow[d];
  }
}

// Runs f(unit) for units 0..n-1 on up to `threads` threads (0: hardware concurrency).
template <typename F>
void parallel_units(int64_t n, unsigned threads, F&& f) {
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t u; (u = next++) < n;) f(u);
  };
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

void check_reference_inputs(const Pattern& p, const Shape& s, const DynamicLayout* dynamic,
                            const std::vector<int64_t>* documents) {
  check_pattern_fits(p, s);
  if (p.has_dynamic_layout() && !dynamic) {
    throw UserError("dynamic layout", "the pattern has a \"dynamic\" layout; supply its CSR table (CLI: --dynamic FILE)");
  }
  if (dynamic) check_dynamic_layout(p, s, *dynamic, "dynamic layout");
  if (documents) check_documents(p, s, *documents, dynamic != nullptr, "cu_seqlens");
}

template <class T>
ReferenceOutput reference_forward(const Pattern& p, const Shape& s, const T* q, const T* k, const T* v,
                                  const DynamicLayout* dynamic, unsigned threads,
                                  const std::vector<int64_t>* documents) {
  check_reference_inputs(p, s, dynamic, documents);
  const MaskContext c{p, s, dynamic, documents};
  ReferenceOutput out;
  out.o.resize(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim_v));
  out.lse.resize(static_cast<size_t>(s.batch * s.heads_q * s.seq_q));
  const double scale = softmax_scale(p, s);
  // Rows are independent; threads take (batch, head) pairs.
  parallel_units(s.batch * s.heads_q, threads, [&](int64_t u) {
    Row row;
    for (int64_t i = 0; i < s.seq_q; ++i) reference_row(c, q, k, v, u / s.heads_q, u % s.heads_q, i, scale, row, out);
  });
  return out;
}

template <class T>
std::vector<double> reference_weights_of(const Pattern& p, const Shape& s, const T* q, const T* k,
                                         const DynamicLayout* dynamic, unsigned threads,
                                  const std::vector<int64_t>* documents) {
  check_reference_inputs(p, s, dynamic, documents);
  const MaskContext c{p, s, dynamic, documents};
  std::vector<double> w(static_cast<size_t>(s.batch * s.heads_q * s.seq_q * s.seq_k), 0.0);
  const double scale = softmax_scale(p, s), f = output_factor(p);
  parallel_units(s.batch * s.heads_q, threads, [&](int64_t u) {
    Row row;
    for (int64_t i = 0; i < s.seq_q; ++i) {
      row_softmax(c, q, k, u / s.heads_q, u % s.heads_q, i, scale, row);
      double* wrow = w.data() + (u * s.seq_q + i) * s.seq_k;
      for (size_t n = 0; n < row.p.size(); ++n) wrow[row.keys[n]] += f * row.p[n];
    }
  });
  return w;
}

template <class T>
ReferenceGradients reference_backward(const Pattern& p, const Shape& s, const T* q, const T* k, const T* v, const T* dout,
                                      const DynamicLayout* dynamic, unsigned threads,
                                  const std::vector<int64_t>* documents, const T* dlse) {
  check_reference_inputs(p, s, dynamic, documents);
  const MaskContext c{p, s, dynamic, documents};
  ReferenceGradients g;
  g.dq.assign(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim), 0.0);
  g.dk.assign(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim), 0.0);
  g.dv.assign(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim_v), 0.0);
  const double scale = softmax_scale(p, s), f = output_factor(p);
  const int64_t group = s.heads_q / s.heads_kv;
  // A (batch, kv head) unit owns dK and dV of that head and dQ of the query heads that read it.
  parallel_units(s.batch * s.heads_kv, threads, [&](int64_t u) {
    const int64_t bi = u / s.heads_kv, kvh = u % s.heads_kv;
    Row row;
    std::vector<double> dp;
    for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h)
      for (int64_t i = 0; i < s.seq_q; ++i) {
        row_softmax(c, q, k, bi, h, i, scale, row);
        if (row.p.empty()) continue;  // attends nothing: O = 0, no gradient
        const T* qrow = q + ((bi * s.seq_q + i) * s.heads_q + h) * s.head_dim;
        const T* dorow = dout + ((bi * s.seq_q + i) * s.heads_q + h) * s.head_dim_v;
        double* dqrow = g.dq.data() + ((bi * s.seq_q + i) * s.heads_q + h) * s.head_dim;
        // O = f * sum_n P_n V_n: dP_n = f * dO . V_n, dS_n = P_n (dP_n - sum_m P_m dP_m + dLSE),
        // since d LSE / d S_n = P_n.
        dp.assign(row.p.size(), 0.0);
        double dot_pdp = 0.0;
        const double dl = dlse ? static_cast<double>(dlse[(bi * s.heads_q + h) * s.seq_q + i]) : 0.0;
        for (size_t n = 0; n < row.p.size(); ++n) {
          const T* vrow = v + ((bi * s.seq_k + row.keys[n]) * s.heads_kv + kvh) * s.head_dim_v;
          double x = 0.0;
          for (int64_t d = 0; d < s.head_dim_v; ++d) x += static_cast<double>(dorow[d]) * vrow[d];
          dp[n] = f * x;
          dot_pdp += row.p[n] * dp[n];
        }
        for (size_t n = 0; n < row.p.size(); ++n) {
          const int64_t j = row.keys[n];
          const T* krow = k + ((bi * s.seq_k + j) * s.heads_kv + kvh) * s.head_dim;
          double* dkrow = g.dk.data() + ((bi * s.seq_k + j) * s.heads_kv + kvh) * s.head_dim;
          double* dvrow = g.dv.data() + ((bi * s.seq_k + j) * s.heads_kv + kvh) * s.head_dim_v;
          const double ds = row.p[n] * (dp[n] - dot_pdp + dl) * scale;
          for (int64_t d = 0; d < s.head_dim; ++d) {
            dqrow[d] += ds * krow[d];
            dkrow[d] += ds * qrow[d];
          }
          for (int64_t d = 0; d < s.head_dim_v; ++d) dvrow[d] += f * row.p[n] * dorow[d];
        }
      }
  });
  return g;
}

}  // namespace

ReferenceOutput reference_attention(const Pattern& p, const Shape& s, const float* q, const float* k, const float* v,
                                    const DynamicLayout* dynamic, unsigned threads,
                                  const std::vector<int64_t>* documents) {
  return reference_forward(p, s, q, k, v, dynamic, threads, documents);
}
ReferenceOutput reference_attention(const Pattern& p, const Shape& s, const double* q, const double* k, const double* v,
                                    const DynamicLayout* dynamic, unsigned threads,
                                  const std::vector<int64_t>* documents) {
  return reference_forward(p, s, q, k, v, dynamic, threads, documents);
}
std::vector<double> reference_weights(const Pattern& p, const Shape& s, const float* q, const float* k,
                                      const DynamicLayout* dynamic, unsigned threads,
                                  const std::vector<int64_t>* documents) {
  return reference_weights_of(p, s, q, k, dynamic, threads, documents);
}
std::vector<double> reference_weights(const Pattern& p, const Shape& s, const double* q, const double* k,
                                      const DynamicLayout* dynamic, unsigned threads,
                                  const std::vector<int64_t>* documents) {
  return reference_weights_of(p, s, q, k, dynamic, threads, documents);
}
ReferenceGradients reference_attention_backward(const Pattern& p, const Shape& s, const float* q, const float* k,
                                                const float* v, const float* dout, const DynamicLayout* dynamic,
                                                unsigned threads, const std::vector<int64_t>* documents, const float* dlse) {
  return reference_backward(p, s, q, k, v, dout, dynamic, threads, documents, dlse);
}
ReferenceGradients reference_attention_backward(const Pattern& p, const Shape& s, const double* q, const double* k,
                                                const double* v, const double* dout, const DynamicLayout* dynamic,
                                                unsigned threads, const std::vector<int64_t>* documents, const double* dlse) {
  return reference_backward(p, s, q, k, v, dout, dynamic, threads, documents, dlse);
}

}  // namespace attnjit
