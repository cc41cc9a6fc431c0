#include "runtime/plan_executor.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <thread>

namespace attnjit {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The running state of one query tile: per row the max, the sum of exp, and the weighted values.
struct TileState {
  std::vector<float> m, l, acc, scores;
  void reset(int64_t rows, int64_t dv, int64_t tile_k) {
    m.assign(static_cast<size_t>(rows), kNegInf);
    l.assign(static_cast<size_t>(rows), 0.0f);
    acc.assign(static_cast<size_t>(rows * dv), 0.0f);
    scores.resize(static_cast<size_t>(rows * tile_k));
  }
};

class Executor {
public:
  Executor(const Plan& plan, const Pattern& p, const float* q, const float* k, const float* v, const DynamicLayout* d,
           ExecutorOutput& out)
      : plan_(plan), pattern_(p), s_(plan.shape), q_(q), k_(k), v_(v), dynamic_(d), out_(out) {}

  void run_item(const WorkItem& item, int64_t b, TileState& st) const {
    const int64_t rows = item.rows.count, dv = s_.head_dim_v;
    st.reset(rows, dv, plan_.tiles.tile_k);
    const int64_t kvh = item.head / (s_.heads_q / s_.heads_kv);
    for (int64_t sp = item.span_begin; sp < item.span_end; ++sp) {
      const KeySpan& span = plan_.spans[static_cast<size_t>(sp)];
      for_each_visited_tile(plan_, span, [&](int32_t t, bool full) {
        visit_tile(item, b, kvh, span.branch, tile_keys(span, t, plan_.tiles.tile_k), full, st);
      });
    }
    write_rows(item, b, st);
  }

private:
  // S = scale * Q K^T for the tile, the mask on partial tiles, then the online-softmax update.
  void visit_tile(const WorkItem& item, int64_t b, int64_t kvh, int32_t branch, const RowMap& keys, bool full,
                  TileState& st) const {
    const int64_t rows = item.rows.count, d = s_.head_dim, dv = s_.head_dim_v;
    const float scale = static_cast<float>(plan_.softmax_scale);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = item.rows.at(r);
      const float* qrow = q_ + ((b * s_.seq_q + i) * s_.heads_q + item.head) * d;
      float* srow = st.scores.data() + r * keys.count;
      float row_max = kNegInf;
      for (int64_t c = 0; c < keys.count; ++c) {
        const int64_t j = keys.at(c);
        if (!full && !partial_tile_allows(pattern_, branch, item.head, s_.q_offset + i, s_.k_offset + j, dynamic_)) {
          srow[c] = kNegInf;
          continue;
        }
        const float* krow = k_ + ((b * s_.seq_k + j) * s_.heads_kv + kvh) * d;
        float dot = 0.0f;
        for (int64_t x = 0; x < d; ++x) dot += qrow[x] * krow[x];
        srow[c] = scale * dot;
        row_max = std::max(row_max, srow[c]);
      }
      const float m_new = std::max(st.m[static_cast<size_t>(r)], row_max);
      if (m_new == kNegInf) continue;  // nothing seen yet in this row: keep the empty state
      const float rescale = std::exp(st.m[static_cast<size_t>(r)] - m_new);
      float* acc = st.acc.data() + r * dv;
      float sum = 0.0f;
      for (int64_t x = 0; x < dv; ++x) acc[x] *= rescale;
      for (int64_t c = 0; c < keys.count; ++c) {
        if (srow[c] == kNegInf) continue;
        const float p = std::exp(srow[c] - m_new);
        sum += p;
        const float* vrow = v_ + ((b * s_.seq_k + keys.at(c)) * s_.heads_kv + kvh) * dv;
        for (int64_t x = 0; x < dv; ++x) acc[x] += p * vrow[x];
      }
      st.l[static_cast<size_t>(r)] = st.l[static_cast<size_t>(r)] * rescale + sum;
      st.m[static_cast<size_t>(r)] = m_new;
    }
  }

  // The epilogue: O = acc / l (scaled under head_groups), LSE = m + log l; empty rows 0 and -inf.
  void write_rows(const WorkItem& item, int64_t b, const TileState& st) const {
    const int64_t dv = s_.head_dim_v;
    for (int64_t r = 0; r < item.rows.count; ++r) {
      const int64_t i = item.rows.at(r);
      const float l = st.l[static_cast<size_t>(r)];
      float* orow = out_.o.data() + ((b * s_.seq_q + i) * s_.heads_q + item.head) * dv;
      float& lse = out_.lse[static_cast<size_t>((b * s_.heads_q + item.head) * s_.seq_q + i)];
      if (l == 0.0f) {
        std::fill(orow, orow + dv, 0.0f);
        lse = kNegInf;
        continue;
      }
      const float inv = static_cast<float>(plan_.output_scale) / l;
      for (int64_t x = 0; x < dv; ++x) orow[x] = st.acc[static_cast<size_t>(r * dv + x)] * inv;
      lse = st.m[static_cast<size_t>(r)] + std::log(l);
    }
  }

  const Plan& plan_;
  const Pattern& pattern_;
  const Shape& s_;
  const float *q_, *k_, *v_;
  const DynamicLayout* dynamic_;
  ExecutorOutput& out_;
};

}  // namespace

ExecutorOutput execute_plan(const Plan& plan, const Pattern& pattern, const float* q, const float* k, const float* v,
                            const DynamicLayout* dynamic, unsigned threads) {
  const Shape& s = plan.shape;
  ExecutorOutput out;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  out.o.assign(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim_v), nan);
  out.lse.assign(static_cast<size_t>(s.batch * s.heads_q * s.seq_q), nan);
  const Executor ex(plan, pattern, q, k, v, dynamic, out);
  // Work items write disjoint rows, so threads take (batch, item) units from a shared counter.
  const int64_t units = s.batch * static_cast<int64_t>(plan.items.size());
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    TileState st;
    for (int64_t u; (u = next++) < units;) {
      ex.run_item(plan.items[static_cast<size_t>(u % static_cast<int64_t>(plan.items.size()))],
                  u / static_cast<int64_t>(plan.items.size()), st);
    }
  };
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads && t < units; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  return out;
}

}  // namespace attnjit
