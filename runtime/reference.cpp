#include "runtime/reference.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>

#include "compiler/error.hpp"

namespace attnjit {

namespace {

struct Row {
  std::vector<double> scores;
  std::vector<int64_t> keys;
};

// One (batch, head, query row): one softmax over the keys of every branch the row takes part in,
// a key counted once per branch that attends it.
void reference_row(const MaskContext& c, const float* q, const float* k, const float* v, int64_t bi, int64_t h,
                   int64_t i, double scale, Row& row, ReferenceOutput& out) {
  const Shape& s = c.shape;
  const int64_t kvh = h / (s.heads_q / s.heads_kv);
  const float* qrow = q + ((bi * s.seq_q + i) * s.heads_q + h) * s.head_dim;
  row.scores.clear();
  row.keys.clear();
  for (size_t b = 0; b < c.pattern.branches.size(); ++b) {
    for_each_branch_key(c, b, h, i, [&](int64_t j) {
      const float* krow = k + ((bi * s.seq_k + j) * s.heads_kv + kvh) * s.head_dim;
      double dot = 0.0;
      for (int64_t d = 0; d < s.head_dim; ++d) dot += static_cast<double>(qrow[d]) * krow[d];
      row.scores.push_back(scale * dot);
      row.keys.push_back(j);
    });
  }
  double* orow = out.o.data() + ((bi * s.seq_q + i) * s.heads_q + h) * s.head_dim_v;
  double& lse = out.lse[(bi * s.heads_q + h) * s.seq_q + i];
  std::fill(orow, orow + s.head_dim_v, 0.0);
  if (row.scores.empty()) {
    lse = -std::numeric_limits<double>::infinity();
    return;
  }
  const double m = *std::max_element(row.scores.begin(), row.scores.end());
  double sum = 0.0;
  for (size_t n = 0; n < row.scores.size(); ++n) {
    const double p = std::exp(row.scores[n] - m);
    sum += p;
    const float* vrow = v + ((bi * s.seq_k + row.keys[n]) * s.heads_kv + kvh) * s.head_dim_v;
    for (int64_t d = 0; d < s.head_dim_v; ++d) orow[d] += p * vrow[d];
  }
  double divisor = sum;
  // head_groups with group_scale "mean" divides by the number of groups, as the seed project does.
  if (c.pattern.combine == Combine::HeadGroups && c.pattern.group_scale == GroupScale::Mean)
    divisor *= static_cast<double>(c.pattern.branches.size());
  for (int64_t d = 0; d < s.head_dim_v; ++d) orow[d] /= divisor;
  lse = m + std::log(sum);
}

}  // namespace

ReferenceOutput reference_attention(const Pattern& p, const Shape& s, const float* q, const float* k, const float* v,
                                    const DynamicLayout* dynamic, unsigned threads) {
  check_pattern_fits(p, s);
  if (p.has_dynamic_layout() && !dynamic) {
    throw UserError("dynamic layout", "the pattern has a \"dynamic\" layout; supply its CSR table (CLI: --dynamic FILE)");
  }
  if (dynamic) check_dynamic_layout(p, s, *dynamic, "dynamic layout");
  const MaskContext c{p, s, dynamic};
  ReferenceOutput out;
  out.o.resize(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim_v));
  out.lse.resize(static_cast<size_t>(s.batch * s.heads_q * s.seq_q));
  const double scale = softmax_scale(p, s);
  // Rows are independent; threads take (batch, head) pairs from a shared counter.
  const int64_t units = s.batch * s.heads_q;
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    Row row;
    for (int64_t u; (u = next++) < units;) {
      for (int64_t i = 0; i < s.seq_q; ++i) reference_row(c, q, k, v, u / s.heads_q, u % s.heads_q, i, scale, row, out);
    }
  };
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<int64_t>(threads, units));
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  return out;
}

}  // namespace attnjit
