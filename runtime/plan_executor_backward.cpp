// The plan executor's backward pass (see plan_executor.hpp), organised as the backward kernels
// are: D = rowsum(dO * O) first; dQ over the forward plan (each query tile owns its rows); dK and
// dV over the key-major plan (each key tile's gradients accumulated over the query tiles that
// attend it, then added to dK and dV, since key tiles of different branches may share rows). P is
// recomputed from Q, K and the forward's LSE; float32 throughout.
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
  BackwardExecutor(const Plan& plan, const BackwardPlan& bwd, const Pattern& p, const float* q, const float* k,
                   const float* v, const float* lse, const float* dout, const std::vector<float>& delta,
                   const DynamicLayout* d, ExecutorGradients& g)
      : plan_(plan), bwd_(bwd), pattern_(p), s_(plan.shape), q_(q), k_(k), v_(v), lse_(lse), dout_(dout), delta_(delta),
        dynamic_(d), g_(g) {}

  // dQ of one query tile: its rows belong to no other tile.
  void dq_item(const WorkItem& item, int64_t b) const {
    const int64_t kvh = item.head / (s_.heads_q / s_.heads_kv);
    for (int64_t sp = item.span_begin; sp < item.span_end; ++sp) {
      const KeySpan& span = plan_.spans[static_cast<size_t>(sp)];
      for_each_visited_tile(plan_, span, [&](int32_t t, bool full) {
        const RowMap keys = tile_keys(span, t, plan_.tiles.tile_k);
        for_each_pair(b, item.head, kvh, span.branch, item.rows, keys, full, [&](int64_t i, int64_t j, float ds) {
          float* dqrow = g_.dq.data() + ((b * s_.seq_q + i) * s_.heads_q + item.head) * s_.head_dim;
          const float* krow = k_ + ((b * s_.seq_k + j) * s_.heads_kv + kvh) * s_.head_dim;
          for (int64_t x = 0; x < s_.head_dim; ++x) dqrow[x] += ds * krow[x];
        });
      });
    }
  }

  // dK and dV of one key tile, accumulated in a tile buffer and added to the outputs.
  void dkdv_item(const KeyItem& item, int64_t b, std::vector<float>& dk_tile, std::vector<float>& dv_tile) const {
    const int64_t d = s_.head_dim, dv = s_.head_dim_v, n = item.keys.count;
    dk_tile.assign(static_cast<size_t>(n * d), 0.0f);
    dv_tile.assign(static_cast<size_t>(n * dv), 0.0f);
    const float f = static_cast<float>(plan_.output_scale);
    for (int64_t e = item.entry_begin; e < item.entry_end; ++e) {
      const QueryEntry& q = bwd_.entries[static_cast<size_t>(e)];
      for_each_pair(b, q.head, item.kv_head, q.branch, q.rows, item.keys, q.full, [&](int64_t i, int64_t j, float ds, float p, int64_t c) {
        const int64_t qoff = (b * s_.seq_q + i) * s_.heads_q + q.head;
        const float* qrow = q_ + qoff * d;
        const float* dorow = dout_ + qoff * dv;
        for (int64_t x = 0; x < d; ++x) dk_tile[static_cast<size_t>(c * d + x)] += ds * qrow[x];
        for (int64_t x = 0; x < dv; ++x) dv_tile[static_cast<size_t>(c * dv + x)] += f * p * dorow[x];
        (void)j;
      });
    }
    for (int64_t c = 0; c < n; ++c) {
      const int64_t koff = (b * s_.seq_k + item.keys.at(c)) * s_.heads_kv + item.kv_head;
      for (int64_t x = 0; x < d; ++x) g_.dk[static_cast<size_t>(koff * d + x)] += dk_tile[static_cast<size_t>(c * d + x)];
      for (int64_t x = 0; x < dv; ++x) g_.dv[static_cast<size_t>(koff * dv + x)] += dv_tile[static_cast<size_t>(c * dv + x)];
    }
  }

private:
  // For every attended pair (i, j) of a (query tile, key tile): P = exp(S - LSE) and
  // dS = scale * P (f dO . V_j - D_i); calls f(i, j, dS[, P, column]).
  template <typename F>
  void for_each_pair(int64_t b, int64_t h, int64_t kvh, int32_t branch, const RowMap& rows, const RowMap& keys, bool full,
                     F&& fn) const {
    const int64_t d = s_.head_dim, dv = s_.head_dim_v;
    const float scale = static_cast<float>(plan_.softmax_scale), f = static_cast<float>(plan_.output_scale);
    for (int64_t r = 0; r < rows.count; ++r) {
      const int64_t i = rows.at(r);
      const int64_t row = (b * s_.heads_q + h) * s_.seq_q + i;
      const float lse = lse_[row];
      if (lse == kNegInf) continue;  // the row attends nothing
      const int64_t qoff = (b * s_.seq_q + i) * s_.heads_q + h;
      const float* qrow = q_ + qoff * d;
      const float* dorow = dout_ + qoff * dv;
      for (int64_t c = 0; c < keys.count; ++c) {
        const int64_t j = keys.at(c);
        if (!full && !partial_tile_allows(pattern_, branch, static_cast<int32_t>(h), s_.q_offset + i, s_.k_offset + j, dynamic_)) continue;
        const int64_t koff = (b * s_.seq_k + j) * s_.heads_kv + kvh;
        const float* krow = k_ + koff * d;
        const float* vrow = v_ + koff * dv;
        float dot = 0.0f, dp = 0.0f;
        for (int64_t x = 0; x < d; ++x) dot += qrow[x] * krow[x];
        for (int64_t x = 0; x < dv; ++x) dp += dorow[x] * vrow[x];
        const float p = std::exp(scale * dot - lse);
        const float ds = p * (f * dp - delta_[static_cast<size_t>(row)]) * scale;
        if constexpr (std::is_invocable_v<F, int64_t, int64_t, float, float, int64_t>) fn(i, j, ds, p, c);
        else fn(i, j, ds);
      }
    }
  }

  const Plan& plan_;
  const BackwardPlan& bwd_;
  const Pattern& pattern_;
  const Shape& s_;
  const float *q_, *k_, *v_, *lse_, *dout_;
  const std::vector<float>& delta_;
  const DynamicLayout* dynamic_;
  ExecutorGradients& g_;
};

// Runs f(unit) for units 0..n-1 on up to `threads` threads (0: hardware concurrency).
template <typename F>
void parallel_units(int64_t n, unsigned threads, F&& f) {
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t u; (u = next++) < n;) f(u);
  };
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads && t < n; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

}  // namespace

ExecutorGradients execute_plan_backward(const Plan& plan, const BackwardPlan& bwd, const Pattern& pattern, const float* q,
                                        const float* k, const float* v, const float* o, const float* lse,
                                        const float* dout, const DynamicLayout* dynamic, unsigned threads) {
  const Shape& s = plan.shape;
  ExecutorGradients g;
  g.dq.assign(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim), 0.0f);
  g.dk.assign(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim), 0.0f);
  g.dv.assign(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim_v), 0.0f);
  // D = rowsum(dO * O), [batch, heads_q, seq_q] like the LSE.
  std::vector<float> delta(static_cast<size_t>(s.batch * s.heads_q * s.seq_q), 0.0f);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.seq_q; ++i)
      for (int64_t h = 0; h < s.heads_q; ++h) {
        const int64_t off = ((b * s.seq_q + i) * s.heads_q + h) * s.head_dim_v;
        float sum = 0.0f;
        for (int64_t x = 0; x < s.head_dim_v; ++x) sum += dout[off + x] * o[off + x];
        delta[static_cast<size_t>((b * s.heads_q + h) * s.seq_q + i)] = sum;
      }
  const BackwardExecutor ex(plan, bwd, pattern, q, k, v, lse, dout, delta, dynamic, g);
  const int64_t n_items = static_cast<int64_t>(plan.items.size());
  if (n_items > 0) parallel_units(s.batch * n_items, threads, [&](int64_t u) { ex.dq_item(plan.items[static_cast<size_t>(u % n_items)], u / n_items); });
  // A (batch, kv head) unit adds the key tiles of that head one after another (they may overlap).
  parallel_units(s.batch * s.heads_kv, threads, [&](int64_t u) {
    std::vector<float> dk_tile, dv_tile;
    for (const KeyItem& item : bwd.items)
      if (item.kv_head == u % s.heads_kv) ex.dkdv_item(item, u / s.heads_kv, dk_tile, dv_tile);
  });
  return g;
}

}  // namespace attnjit
