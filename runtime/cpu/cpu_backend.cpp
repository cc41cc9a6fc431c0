// The CPU device: the plan executor on host tensors of any strides and dtype. The forward reads
// float32 tensors in place where their rows allow it and writes a contiguous float32 O directly;
// everything else is converted to float32 in the executor's head-major order, [B, H, S, D], and back.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "compiler/support/error.hpp"
#include "runtime/backend.hpp"
#include "runtime/host_tensors.hpp"
#include "runtime/cpu/plan_executor.hpp"

namespace attnjit {
namespace {

// Head-major, at the call's positions (the plan may have been lowered for others with the same mask).
ExecutorOptions executor_options(const ForwardOptions& o) {
  return ExecutorOptions{.order = ExecutorOrder::HeadMajor,
                         .offsets = std::pair{o.q_offset, o.k_offset},
                         .rows_with_work_only = o.rows_with_work_only};
}

// A float32 [B, S, H, width] view's rows as the executor reads them in place: the last dimension
// contiguous and every other stride a non-negative whole number of rows (a dimension of size 1
// has no stride that matters).
std::optional<RowLayout> rows_in_place(const TensorView& t) {
  const int64_t width = t.shape[3];
  if (t.dtype != DType::F32 || (width > 1 && t.strides[3] != 1) || width <= 0) return std::nullopt;
  int64_t rows[3];
  for (int d = 0; d < 3; ++d) {
    const int64_t stride = t.shape[d] == 1 ? 0 : t.strides[d];
    if (stride < 0 || stride % width != 0) return std::nullopt;
    rows[d] = stride / width;
  }
  return RowLayout{rows[0], rows[1], rows[2]};
}

bool contiguous_f32(const TensorView& t) {
  if (t.dtype != DType::F32) return false;
  int64_t expect = 1;
  for (size_t d = t.shape.size(); d-- > 0;) {
    if (t.shape[d] != 1 && t.strides[d] != expect) return false;
    expect *= t.shape[d];
  }
  return true;
}

// The descale factors of an FP8 call (ForwardOptions::q_descale, ...: host fp32 [batch, heads_kv]
// views) as the executor's per-(batch, kv head) factors; null for other dtypes.
std::optional<Fp8Arithmetic> fp8_arithmetic(const ForwardOptions& o) {
  if (!o.q_descale) return std::nullopt;
  Fp8Arithmetic a;
  const std::vector<float> q = gather(*o.q_descale), k = gather(*o.k_descale);
  a.v = gather(*o.v_descale);
  a.qk.resize(q.size());
  for (size_t i = 0; i < q.size(); ++i) a.qk[i] = q[i] * k[i];  // as the kernels: one fp32 product
  return a;
}

class CpuBackend final : public Backend {
public:
  explicit CpuBackend(const Pattern& p) : pattern_(p) {}
  void upload(PlanEntry&, const DynamicLayout*) override {}
  void forward(const PlanEntry& entry, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView* lse, const ForwardOptions& options) override {
    const auto qr = rows_in_place(q), kr = rows_in_place(k), vr = rows_in_place(v);
    // (check_forward_inputs has refused an O that overlaps an input.)
    const bool in_place = qr && kr && vr && contiguous_f32(o);
    if (!in_place) {
      // FP8 codes decode exactly to float32 here; the executor applies the descales and rounds P.
      const std::optional<Fp8Arithmetic> fp8 = fp8_arithmetic(options);
      ExecutorOptions eo = executor_options(options);
      eo.fp8 = fp8 ? &*fp8 : nullptr;
      const std::vector<float> qf = gather(head_major(q)), kf = gather(head_major(k)), vf = gather(head_major(v));
      ExecutorOutput r;
      if (options.rows_with_work_only) {  // the rows without work keep what o and lse hold
        const Shape& s = entry.plan.shape;
        r.o = gather(head_major(o));
        r.lse = lse ? gather(*lse) : std::vector<float>(static_cast<size_t>(s.batch * s.heads_q * s.seq_q));
        execute_plan_onto(entry.plan, pattern_, qf.data(), kf.data(), vf.data(), r, options.dynamic_layout, eo);
      } else {
        r = execute_plan(entry.plan, pattern_, qf.data(), kf.data(), vf.data(), options.dynamic_layout, eo);
      }
      scatter(head_major(o), r.o);
      if (lse) scatter(*lse, r.lse);
      return;
    }
    // O contiguous [B, S, H, Dv]: rows {S * H, H, 1}. The LSE goes straight to a contiguous float32 one.
    const Shape& s = entry.plan.shape;
    const bool lse_direct = lse && contiguous_f32(*lse);
    std::vector<float> lse_tmp = lse_direct                             ? std::vector<float>{}
                                 : lse && options.rows_with_work_only ? gather(*lse)
                                                                      : std::vector<float>(size_t(s.batch * s.heads_q * s.seq_q));
    float* lse_out = lse_direct ? static_cast<float*>(lse->data) : lse_tmp.data();
    execute_plan_into(entry.plan, pattern_, {static_cast<const float*>(q.data), *qr}, {static_cast<const float*>(k.data), *kr},
                      {static_cast<const float*>(v.data), *vr}, static_cast<float*>(o.data),
                      RowLayout{s.seq_q * s.heads_q, s.heads_q, 1}, lse_out, options.dynamic_layout, executor_options(options));
    if (lse && !lse_direct) scatter(*lse, lse_tmp);
  }
  void backward(const PlanEntry& entry, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, const ForwardOptions& options, const GradientSink* sink) override {
    const std::vector<float> qf = gather(head_major(q)), kf = gather(head_major(k)), vf = gather(head_major(v)),
                             of = sink ? std::vector<float>{} : gather(head_major(o)), lf = gather(lse),
                             df = gather(head_major(dout));
    const std::vector<float> dlf = options.dlse ? gather(*options.dlse) : std::vector<float>{};
    const BackwardPlans& plans = entry.backward_plans(pattern_, options.dynamic_layout, entry.plan.tiles);
    const ExecutorGradients g = execute_plan_backward(
        plans.query_major, plans.key_major, pattern_, qf.data(), kf.data(), vf.data(), of.data(), lf.data(), df.data(),
        options.dynamic_layout, executor_options(options), options.dlse ? dlf.data() : nullptr,
        sink ? static_cast<const float*>(sink->delta->data) : nullptr);
    // backward_add: the gradients of every row added (rows without work add zeros), in float32.
    auto put = [&](const TensorView& out, const std::vector<float>& grad) {
      if (!sink) return scatter(head_major(out), grad);
      std::vector<float> sum = gather(head_major(out));
      for (size_t x = 0; x < sum.size(); ++x) sum[x] += grad[x];
      scatter(head_major(out), sum);
    };
    put(dq, g.dq);
    put(dk, g.dk);
    put(dv, g.dv);
  }
  std::string kernel_name() const override { return "cpu plan executor"; }
  // 128x128: the tile products are large enough for Eigen's GEMM to run near its peak, small enough
  // that causal and window diagonals waste little (docs/performance.md, "The CPU device").
  TileConfig tiles() const override { return TileConfig{128, 128}; }
  bool reads_key_weights() const override { return true; }
  int alignment() const override { return 1; }

private:
  const Pattern& pattern_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Pattern& p, const Problem&) { return std::make_unique<CpuBackend>(p); }

}  // namespace attnjit
