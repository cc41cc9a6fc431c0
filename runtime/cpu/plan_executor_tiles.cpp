// The plan executor's tile arithmetic (plan_executor_tiles.hpp): each visited (query tile, key
// tile) pair is two small matrix products and a vectorised softmax step, done with Eigen on
// strided views of the [B, S, H, D] tensors (a tile's rows are affine, so a row stride describes
// them and nothing is gathered). The order of operations is the kernels': scores, the mask on
// partial tiles, the online-softmax update (running max, running sum, rescale) in float32.
//
// This file is compiled once per instruction set, with ATTNJIT_CPU_NS naming the namespace and
// `Eigen` renamed on the command line (-DEigen=attnjit_eigen_<isa>): Eigen's templates are then
// distinct symbols per variant, so the linker cannot hand the generic path an AVX2 instantiation.
// Nothing here instantiates a standard-library template out of line (no containers, no threads):
// buffers are Eigen objects, threads belong to plan_executor.cpp.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>

#include "compiler/support/half.hpp"
#include "runtime/cpu/plan_executor_exp.hpp"
#include "runtime/cpu/plan_executor_tiles.hpp"

#ifndef ATTNJIT_CPU_NS
#error "ATTNJIT_CPU_NS names the instruction-set variant (CMakeLists.txt)"
#endif

namespace attnjit {
namespace ATTNJIT_CPU_NS {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Rows = Eigen::Map<const Matrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using MutableRows = Eigen::Map<Matrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using Column = Eigen::Map<const Eigen::ArrayXf, Eigen::Unaligned, Eigen::InnerStride<>>;

// The rows `map` of head `head`, batch b, as a (rows x width) matrix.
template <typename View, typename T>
View rows_of(T* base, const RowLayout& at, int64_t b, int64_t head, int64_t width, const RowMap& map) {
  T* first = base + (b * at.batch + map.start * at.pos + head * at.head) * width;
  return View(first, map.count, width, Eigen::OuterStride<>(map.stride * at.pos * width));
}

// A per-row statistic of `map` in a [B, heads, seq] tensor (the LSE, D).
Column row_values(const float* base, int64_t b, int64_t seq, int64_t heads, int64_t head, const RowMap& map) {
  return Column(base + (b * heads + head) * seq + map.start, map.count, Eigen::InnerStride<>(map.stride));
}

// The mask of a partial tile: keep(r, c) = 1 where the pair is attended, else 0, and the score of
// a removed pair becomes -inf (so the row max ignores it). The exp gives -inf exactly 0, but a row
// whose LSE is NaN (it attended a NaN) would give NaN there too, so the exp selects 0 where `keep` is 0.
void apply_mask(const ExecutorJob& job, int32_t branch, int32_t head, const RowMap& rows, const RowMap& keys, Matrix& s,
                Matrix& keep) {
  // Positions: within the row's document when documents are packed (a tile never crosses one).
  const int64_t* base = job.plan->doc_base.empty() ? nullptr : job.plan->doc_base.data();
  auto pos = [&](int64_t row) { return base ? row - base[row] : row; };
  keep.resize(rows.count, keys.count);
  // The tile's key positions are kpos0 + c * stride (one document), so partial_tile_row gives a
  // row's mask whole.
  const int64_t kpos0 = job.k_offset + pos(keys.at(0));
  for (int64_t r = 0; r < rows.count; ++r) {
    partial_tile_row(*job.pattern, branch, head, job.q_offset + pos(rows.at(r)), kpos0, keys.stride, keys.count, job.dynamic,
                     keep.row(r).data());
  }
  s = (keep.array() == 0.0f).select(kNegInf, s.array());
}

// acc += A B over the attended pairs only (keep != 0), for a partial tile whose B holds a NaN or an
// inf: the product would multiply it by the zero weight (P or dS) of the pairs that mask it (0 * NaN
// is NaN), and a pair that is not attended must have no effect. The forward's P V, the backward's
// dS K, dS^T Q and P^T dO (A and keep transposed for the last two). Rare: only such inputs get here.
template <typename A, typename Keep, typename B, typename Acc>
void masked_product(const A& a, const Keep& keep, const B& b, Acc& acc) {
  for (Eigen::Index r = 0; r < a.rows(); ++r)
    for (Eigen::Index c = 0; c < a.cols(); ++c)
      if (keep(r, c) != 0.0f) acc.row(r) += a(r, c) * b.row(c);
}

// acc += A B, selecting (masked_product) where the tile is partial and B is not finite.
template <typename A, typename Keep, typename B, typename Acc>
void product(bool full, const A& a, const Keep& keep, const B& b, Acc&& acc) {
  if (full || b.allFinite()) acc.noalias() += a * b;
  else masked_product(a, keep, b, acc);
}

// A packed plan's weights of tile t of a span (null where every key stands for one branch).
const uint8_t* tile_weights(const Plan& plan, const KeySpan& span, int32_t t) {
  return span.weighted() ? plan.key_weights.data() + span.weight_begin + int64_t{t} * plan.tiles.tile_k : nullptr;
}

// Probabilities of a tile whose key c stands for w[c] branches (plan.hpp, BranchPacking): w[c] P,
// the pair's term once for each branch. After the exponential, as the kernels do: ln w added to a
// score would be lost in its rounding at scores past 2^21. Returns what the row sums gain, row by
// row, into `extra` (sized by the caller). A masked pair's P is 0 and stays 0.
void weigh_probabilities(const uint8_t* w, Matrix& p, Eigen::ArrayXf* extra) {
  if (!w) return;
  for (Eigen::Index c = 0; c < p.cols(); ++c) {
    if (w[c] <= 1) continue;
    if (extra) *extra += p.col(c).array() * static_cast<float>(w[c] - 1);
    p.col(c) *= static_cast<float>(w[c]);
  }
}

// P V's operand on FP8 inputs: each probability times 2^8 rounded to e4m3 (the kernels' P8), and
// back by 2^-8 (exact: a power of two), so the product and the epilogue read probabilities. A
// masked pair's 0 stays 0; a NaN stays NaN.
void round_probabilities_e4m3(Matrix& p) {
  for (Eigen::Index c = 0; c < p.cols(); ++c)
    for (Eigen::Index r = 0; r < p.rows(); ++r)
      p(r, c) = e4m3_to_float(float_to_e4m3(p(r, c) * kP8Scale)) * (1.0f / kP8Scale);
}

// Fp8Arithmetic::tensor_core_sums: Hopper's FP8 tensor core's sums (e4m3_fused_dot_add), as the
// wgmma kernel takes them. S = Q K^T over the head dim in steps of 32, each step added to the
// running score; P8 V over the tile's keys in steps of 32 into the running O (at P8's own scale,
// 2^8 P, so that e4m3's subnormals align as in the kernel). Finite operands only: where a NaN or
// an infinity is about the callers take the ordinary products, whose special values are the
// model's too.
constexpr int kTensorCoreStep = 32;

void tensor_core_scores(const Rows& q, const Rows& k, Matrix& s) {
  const Eigen::Index dim = q.cols();
  double a[kTensorCoreStep], b[kTensorCoreStep];
  for (Eigen::Index r = 0; r < q.rows(); ++r)
    for (Eigen::Index c = 0; c < k.rows(); ++c) {
      float acc = 0.0f;
      for (Eigen::Index d0 = 0; d0 < dim; d0 += kTensorCoreStep) {
        const int n = static_cast<int>(std::min<Eigen::Index>(kTensorCoreStep, dim - d0));
        for (int d = 0; d < n; ++d) a[d] = q(r, d0 + d), b[d] = k(c, d0 + d);
        acc = e4m3_fused_dot_add(a, 1, b, 1, n, acc, d0 > 0);
      }
      s(r, c) = acc;
    }
}

void tensor_core_product(const Matrix& p, const Rows& v, Matrix& acc) {
  const Eigen::Index keys = p.cols();
  double a[kTensorCoreStep], b[kTensorCoreStep];
  for (Eigen::Index r = 0; r < p.rows(); ++r)
    for (Eigen::Index d = 0; d < v.cols(); ++d) {
      float o = acc(r, d) * kP8Scale;
      for (Eigen::Index k0 = 0; k0 < keys; k0 += kTensorCoreStep) {
        const int n = static_cast<int>(std::min<Eigen::Index>(kTensorCoreStep, keys - k0));
        for (int k = 0; k < n; ++k) a[k] = double(p(r, k0 + k)) * kP8Scale, b[k] = v(k0 + k, d);
        o = e4m3_fused_dot_add(a, 1, b, 1, n, o, true);
      }
      acc(r, d) = o * (1.0f / kP8Scale);
    }
}

// One query tile's running state and its scratch, reused across the units a worker takes.
struct ForwardState {
  Matrix scores, keep, acc;
  Eigen::ArrayXf m, l, extra;
};

void forward_item(const ExecutorJob& job, const WorkItem& item, int64_t b, ForwardState& st) {
  const Plan& plan = *job.plan;
  const Shape& s = plan.shape;
  const int64_t n = item.rows.count, kvh = item.head / (s.heads_q / s.heads_kv);
  const int64_t fp8_at = b * s.heads_kv + kvh;  // the descale factors of (b, kv head) on FP8 inputs
  const float scale = job.fp8 ? static_cast<float>(plan.softmax_scale) * job.fp8->qk[size_t(fp8_at)]
                              : static_cast<float>(plan.softmax_scale);
  const Rows q = rows_of<Rows>(job.q, job.q_layout, b, item.head, s.head_dim, item.rows);
  st.acc.setZero(n, s.head_dim_v);
  st.m.setConstant(n, kNegInf);
  st.l.setZero(n);
  for (int64_t sp = item.span_begin; sp < item.span_end; ++sp) {
    const KeySpan& span = plan.spans[static_cast<size_t>(sp)];
    for_each_visited_tile(plan, span, [&](int32_t t, bool full) {
      const RowMap keys = tile_keys(span, t, plan.tiles.tile_k);
      const Rows k = rows_of<Rows>(job.k, job.k_layout, b, kvh, s.head_dim, keys);
      const Rows v = rows_of<Rows>(job.v, job.v_layout, b, kvh, s.head_dim_v, keys);
      st.scores.resize(n, keys.count);
      const bool tensor_core = job.fp8 && job.fp8->tensor_core_sums;
      if (tensor_core && q.allFinite() && k.allFinite()) tensor_core_scores(q, k, st.scores);
      else st.scores.noalias() = q * k.transpose();
      // Scaled in a pass of its own, so that each exponent is the rounded scaled score minus the
      // rounded maximum (the maximum's weight exactly 1 at any score), whatever the compiler fuses.
      st.scores *= scale;
      if (!full) apply_mask(job, span.branch, item.head, item.rows, keys, st.scores, st.keep);
      // The online-softmax step, a row at a time (rows are contiguous, so Eigen vectorises exp). A
      // row that has seen no key yet (max -inf) keeps its empty state.
      for (int64_t r = 0; r < n; ++r) {
        auto row = st.scores.row(r).array();
        const float tile_max = row.maxCoeff();
        const float m_new = st.m(r) > tile_max ? st.m(r) : tile_max;
        if (m_new == kNegInf) {
          // maxCoeff may skip a NaN (e.g. after a masked -inf): a row that has a NaN score is NaN
          // from here on (its m and l stay NaN through later tiles), never an empty row.
          if (row.hasNaN()) {
            row.setConstant(std::numeric_limits<float>::quiet_NaN());
            st.m(r) = st.l(r) = std::numeric_limits<float>::quiet_NaN();
          } else {
            row.setZero();
          }
          continue;
        }
        const float sum = exp_row(row.data(), full ? nullptr : st.keep.row(r).data(), keys.count, 1.0f, m_new);
        if (m_new != st.m(r)) {
          const float alpha = std::exp(st.m(r) - m_new);
          st.l(r) *= alpha;
          st.acc.row(r) *= alpha;
          st.m(r) = m_new;
        }
        st.l(r) += sum;
      }
      if (const uint8_t* w = tile_weights(plan, span, t)) {  // a packed plan's weighted keys: w P
        st.extra.setZero(n);
        weigh_probabilities(w, st.scores, &st.extra);
        st.l += st.extra;
      }
      if (job.fp8) round_probabilities_e4m3(st.scores);  // after the row sums took them unrounded
      if (tensor_core && v.allFinite() && st.scores.allFinite()) tensor_core_product(st.scores, v, st.acc);
      else product(full, st.scores, st.keep, v, st.acc);
    });
  }
  // The epilogue: O = acc / l (scaled under head_groups), LSE = m + log l; empty rows 0 and -inf.
  MutableRows o = rows_of<MutableRows>(job.o, job.o_layout, b, item.head, s.head_dim_v, item.rows);
  float* lse = job.lse_out + (b * s.heads_q + item.head) * s.seq_q;
  const float out_scale = job.fp8 ? static_cast<float>(plan.output_scale) * job.fp8->v[size_t(fp8_at)]
                                  : static_cast<float>(plan.output_scale);
  for (int64_t r = 0; r < n; ++r) {
    const float l = st.l(r);
    if (l == 0.0f) {
      o.row(r).setZero();
      lse[item.rows.at(r)] = kNegInf;
    } else {
      o.row(r) = st.acc.row(r) * (out_scale / l);
      lse[item.rows.at(r)] = st.m(r) + std::log(l);
    }
  }
}

// P and dS of one (query rows, key rows) pair of tiles: S = scale Q K^T (masked), P = exp(S - LSE)
// (0 where masked or where the row attends nothing), dP = dO V^T, dS = scale P (f dP - D).
struct BackwardScratch {
  Matrix p, ds, keep;
};

// P = exp(scale Q K^T - LSE) of one pair of tiles into sc.p: 0 where masked or where the row
// attends nothing.
void probabilities(const ExecutorJob& job, int64_t b, int32_t head, int64_t kvh, int32_t branch, const RowMap& rows,
                   const RowMap& keys, bool full, BackwardScratch& sc, const uint8_t* weights = nullptr) {
  const Plan& plan = *job.plan;
  const Shape& s = plan.shape;
  const float scale = static_cast<float>(plan.softmax_scale);
  const Rows q = rows_of<Rows>(job.q, job.q_layout, b, head, s.head_dim, rows);
  const Rows k = rows_of<Rows>(job.k, job.k_layout, b, kvh, s.head_dim, keys);
  const Column lse = row_values(job.lse, b, s.seq_q, s.heads_q, head, rows);
  sc.p.resize(rows.count, keys.count);
  sc.p.noalias() = q * k.transpose();
  sc.p *= scale;  // rounded before the exp, as the forward's (its LSE holds the rounded maximum)
  if (!full) apply_mask(job, branch, head, rows, keys, sc.p, sc.keep);
  for (int64_t r = 0; r < rows.count; ++r) {
    auto row = sc.p.row(r).array();
    if (lse(r) == kNegInf) {
      row.setZero();  // the row attends nothing
      continue;
    }
    exp_row(row.data(), full ? nullptr : sc.keep.row(r).data(), keys.count, 1.0f, lse(r));
  }
  weigh_probabilities(weights, sc.p, nullptr);
}

void probabilities_and_ds(const ExecutorJob& job, int64_t b, int32_t head, int64_t kvh, int32_t branch, const RowMap& rows,
                          const RowMap& keys, bool full, BackwardScratch& sc, const uint8_t* weights = nullptr) {
  const Plan& plan = *job.plan;
  const Shape& s = plan.shape;
  const float scale = static_cast<float>(plan.softmax_scale), f = static_cast<float>(plan.output_scale);
  const Rows dout = rows_of<Rows>(job.dout, job.q_layout, b, head, s.head_dim_v, rows);
  const Rows v = rows_of<Rows>(job.v, job.k_layout, b, kvh, s.head_dim_v, keys);
  const Column delta = row_values(job.delta, b, s.seq_q, s.heads_q, head, rows);
  probabilities(job, b, head, kvh, branch, rows, keys, full, sc, weights);
  sc.ds.resize(rows.count, keys.count);
  sc.ds.noalias() = dout * v.transpose();
  for (int64_t r = 0; r < rows.count; ++r) {
    sc.ds.row(r).array() = sc.p.row(r).array() * (sc.ds.row(r).array() * f - delta(r)) * scale;
  }
  // A masked pair's dS is 0, selected: its dP (dO V^T) may be NaN where V holds a NaN or an inf.
  if (!full) sc.ds = (sc.keep.array() == 0.0f).select(0.0f, sc.ds.array());
}

}  // namespace

void forward_worker(const ExecutorJob& job, std::atomic<int64_t>& next) {
  const Plan& plan = *job.plan;
  const int64_t n_items = job.items, units = plan.shape.batch * n_items;
  ForwardState st;
  for (int64_t u; (u = next++) < units;) forward_item(job, plan.items[static_cast<size_t>(u % n_items)], u / n_items, st);
}

void weights_worker(const ExecutorJob& job, std::atomic<int64_t>& next) {
  using Strided = Eigen::Map<Matrix, Eigen::Unaligned, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>>;
  const Plan& plan = *job.plan;
  const Shape& s = plan.shape;
  const float f = static_cast<float>(plan.output_scale);
  const int64_t n_items = static_cast<int64_t>(plan.items.size()), units = s.batch * n_items;
  BackwardScratch sc;
  for (int64_t u; (u = next++) < units;) {
    const WorkItem& item = plan.items[static_cast<size_t>(u % n_items)];
    const int64_t b = u / n_items, kvh = item.head / (s.heads_q / s.heads_kv);
    float* w_head = job.w + (b * s.heads_q + item.head) * s.seq_q * s.seq_k;
    for (int64_t sp = item.span_begin; sp < item.span_end; ++sp) {
      const KeySpan& span = plan.spans[static_cast<size_t>(sp)];
      for_each_visited_tile(plan, span, [&](int32_t t, bool full) {
        const RowMap keys = tile_keys(span, t, plan.tiles.tile_k);
        probabilities(job, b, item.head, kvh, span.branch, item.rows, keys, full, sc, tile_weights(plan, span, t));
        // W[rows, keys] += f P: a key another branch (or span) also reaches adds up. Items own their
        // rows, so no other unit writes these elements.
        Strided w(w_head + item.rows.start * s.seq_k + keys.start, item.rows.count, keys.count,
                  Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>(item.rows.stride * s.seq_k, keys.stride));
        w += f * sc.p;
      });
    }
  }
}

void dq_worker(const ExecutorJob& job, std::atomic<int64_t>& next) {
  const Plan& plan = *job.plan;
  const Shape& s = plan.shape;
  const int64_t n_items = static_cast<int64_t>(plan.items.size()), units = s.batch * n_items;
  BackwardScratch sc;
  Matrix dq_tile;
  for (int64_t u; (u = next++) < units;) {
    const WorkItem& item = plan.items[static_cast<size_t>(u % n_items)];
    const int64_t b = u / n_items, kvh = item.head / (s.heads_q / s.heads_kv);
    dq_tile.setZero(item.rows.count, s.head_dim);
    for (int64_t sp = item.span_begin; sp < item.span_end; ++sp) {
      const KeySpan& span = plan.spans[static_cast<size_t>(sp)];
      for_each_visited_tile(plan, span, [&](int32_t t, bool full) {
        const RowMap keys = tile_keys(span, t, plan.tiles.tile_k);
        probabilities_and_ds(job, b, item.head, kvh, span.branch, item.rows, keys, full, sc, tile_weights(plan, span, t));
        product(full, sc.ds, sc.keep, rows_of<Rows>(job.k, job.k_layout, b, kvh, s.head_dim, keys), dq_tile);
      });
    }
    // A query tile owns its rows: no other unit writes them.
    rows_of<MutableRows>(job.dq, job.q_layout, b, item.head, s.head_dim, item.rows) += dq_tile;
  }
}

namespace {

// dK and dV (and, with `with_dq`, dQ) of one (batch, kv head) unit.
void dkdv_unit(const ExecutorJob& job, int64_t b, int64_t kvh, bool with_dq, BackwardScratch& sc, Matrix& dk_tile,
               Matrix& dv_tile) {
  const Plan& plan = *job.plan;
  const BackwardPlan& bwd = *job.bwd;
  const Shape& s = plan.shape;
  const float f = static_cast<float>(plan.output_scale);
  // Key items of one kv head may share rows (overlapping branches): this unit adds them in order.
  for (const KeyItem& item : bwd.items) {
    if (item.kv_head != kvh) continue;
    dk_tile.setZero(item.keys.count, s.head_dim);
    dv_tile.setZero(item.keys.count, s.head_dim_v);
    const Rows k = rows_of<Rows>(job.k, job.k_layout, b, kvh, s.head_dim, item.keys);
    for (int64_t e = item.entry_begin; e < item.entry_end; ++e) {
      const QueryEntry& qe = bwd.entries[static_cast<size_t>(e)];
      // The entry's flag is the kernels' (band only, for a branch they seek through): masked here.
      const bool full = qe.full && !plan.kernel_seeks_branch(qe.branch);
      probabilities_and_ds(job, b, qe.head, kvh, qe.branch, qe.rows, item.keys, full, sc);
      // A NaN or inf in the Q or dO row of a query that masks some of these keys, or in a K row some
      // of these queries mask, must not reach them: product() selects for such partial tiles.
      const auto keep_t = sc.keep.transpose();
      product(full, sc.ds.transpose(), keep_t, rows_of<Rows>(job.q, job.q_layout, b, qe.head, s.head_dim, qe.rows), dk_tile);
      product(full, (f * sc.p).transpose(), keep_t, rows_of<Rows>(job.dout, job.q_layout, b, qe.head, s.head_dim_v, qe.rows), dv_tile);
      if (with_dq) product(full, sc.ds, sc.keep, k, rows_of<MutableRows>(job.dq, job.q_layout, b, qe.head, s.head_dim, qe.rows));
    }
    rows_of<MutableRows>(job.dk, job.k_layout, b, kvh, s.head_dim, item.keys) += dk_tile;
    rows_of<MutableRows>(job.dv, job.k_layout, b, kvh, s.head_dim_v, item.keys) += dv_tile;
  }
}

template <bool WithDq>
void kv_head_units(const ExecutorJob& job, std::atomic<int64_t>& next) {
  const Shape& s = job.plan->shape;
  BackwardScratch sc;
  Matrix dk_tile, dv_tile;
  for (int64_t u; (u = next++) < s.batch * s.heads_kv;) dkdv_unit(job, u / s.heads_kv, u % s.heads_kv, WithDq, sc, dk_tile, dv_tile);
}

}  // namespace

void dkdv_worker(const ExecutorJob& job, std::atomic<int64_t>& next) { kv_head_units<false>(job, next); }
void fused_worker(const ExecutorJob& job, std::atomic<int64_t>& next) { kv_head_units<true>(job, next); }

}  // namespace ATTNJIT_CPU_NS
}  // namespace attnjit
