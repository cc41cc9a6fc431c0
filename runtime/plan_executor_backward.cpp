// The plan executor's backward pass (see plan_executor.hpp): the forward plan walked again, tile by
// tile, in float32, recomputing P from the forward's LSE as a FlashAttention-2 backward kernel does.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>

#include "runtime/plan_executor.hpp"

namespace attnjit {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

class BackwardExecutor {
public:
  BackwardExecutor(const Plan& plan, const Pattern& p, const float* q, const float* k, const float* v, const float* o,
                   const float* lse, const float* dout, const DynamicLayout* d, ExecutorGradients& g)
      : plan_(plan), pattern_(p), s_(plan.shape), q_(q), k_(k), v_(v), o_(o), lse_(lse), dout_(dout), dynamic_(d), g_(g) {}

  // Every item of batch b whose query head reads kv head kvh: the caller owns dK, dV of (b, kvh).
  void run(int64_t b, int64_t kvh) const {
    const int64_t group = s_.heads_q / s_.heads_kv;
    std::vector<float> delta;
    for (const WorkItem& item : plan_.items) {
      if (item.head / group != kvh) continue;
      // D = rowsum(dO * O) per row of the item.
      delta.assign(static_cast<size_t>(item.rows.count), 0.0f);
      for (int64_t r = 0; r < item.rows.count; ++r) {
        const int64_t off = ((b * s_.seq_q + item.rows.at(r)) * s_.heads_q + item.head) * s_.head_dim_v;
        for (int64_t x = 0; x < s_.head_dim_v; ++x) delta[size_t(r)] += dout_[off + x] * o_[off + x];
      }
      for (int64_t sp = item.span_begin; sp < item.span_end; ++sp) {
        const KeySpan& span = plan_.spans[static_cast<size_t>(sp)];
        for_each_visited_tile(plan_, span, [&](int32_t t, bool full) {
          visit_tile(item, b, kvh, span.branch, tile_keys(span, t, plan_.tiles.tile_k), full, delta);
        });
      }
    }
  }

private:
  void visit_tile(const WorkItem& item, int64_t b, int64_t kvh, int32_t branch, const RowMap& keys, bool full,
                  const std::vector<float>& delta) const {
    const int64_t d = s_.head_dim, dv = s_.head_dim_v;
    const float scale = static_cast<float>(plan_.softmax_scale), f = static_cast<float>(plan_.output_scale);
    for (int64_t r = 0; r < item.rows.count; ++r) {
      const int64_t i = item.rows.at(r);
      const float lse = lse_[(b * s_.heads_q + item.head) * s_.seq_q + i];
      if (lse == kNegInf) continue;  // the row attends nothing
      const int64_t qoff = ((b * s_.seq_q + i) * s_.heads_q + item.head);
      const float* qrow = q_ + qoff * d;
      const float* dorow = dout_ + qoff * dv;
      float* dqrow = g_.dq.data() + qoff * d;
      for (int64_t c = 0; c < keys.count; ++c) {
        const int64_t j = keys.at(c);
        if (!full && !partial_tile_allows(pattern_, branch, item.head, s_.q_offset + i, s_.k_offset + j, dynamic_)) continue;
        const int64_t koff = (b * s_.seq_k + j) * s_.heads_kv + kvh;
        const float* krow = k_ + koff * d;
        const float* vrow = v_ + koff * dv;
        float dot = 0.0f, dp = 0.0f;
        for (int64_t x = 0; x < d; ++x) dot += qrow[x] * krow[x];
        for (int64_t x = 0; x < dv; ++x) dp += dorow[x] * vrow[x];
        const float p = std::exp(scale * dot - lse);
        const float ds = p * (f * dp - delta[size_t(r)]) * scale;
        float* dkrow = g_.dk.data() + koff * d;
        float* dvrow = g_.dv.data() + koff * dv;
        for (int64_t x = 0; x < d; ++x) {
          dqrow[x] += ds * krow[x];
          dkrow[x] += ds * qrow[x];
        }
        for (int64_t x = 0; x < dv; ++x) dvrow[x] += f * p * dorow[x];
      }
    }
  }

  const Plan& plan_;
  const Pattern& pattern_;
  const Shape& s_;
  const float *q_, *k_, *v_, *o_, *lse_, *dout_;
  const DynamicLayout* dynamic_;
  ExecutorGradients& g_;
};

}  // namespace

ExecutorGradients execute_plan_backward(const Plan& plan, const Pattern& pattern, const float* q, const float* k,
                                        const float* v, const float* o, const float* lse, const float* dout,
                                        const DynamicLayout* dynamic, unsigned threads) {
  const Shape& s = plan.shape;
  ExecutorGradients g;
  g.dq.assign(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim), 0.0f);
  g.dk.assign(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim), 0.0f);
  g.dv.assign(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim_v), 0.0f);
  const BackwardExecutor ex(plan, pattern, q, k, v, o, lse, dout, dynamic, g);
  // A (batch, kv head) unit owns dK and dV of that head and dQ of the heads that read it.
  const int64_t units = s.batch * s.heads_kv;
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t u; (u = next++) < units;) ex.run(u / s.heads_kv, u % s.heads_kv);
  };
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads && t < units; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  return g;
}

}  // namespace attnjit
