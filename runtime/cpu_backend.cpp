// The CPU device: the plan executor on host tensors of any strides and dtype (converted to float).
#include "compiler/error.hpp"
#include "runtime/backend.hpp"
#include "runtime/npy.hpp"
#include "runtime/plan_executor.hpp"

namespace attnjit {
namespace {

float load_element(const void* base, DType dt, int64_t index) {
  switch (dt) {
    case DType::F32: return static_cast<const float*>(base)[index];
    case DType::F16: return half_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::BF16: return bfloat16_to_float(static_cast<const uint16_t*>(base)[index]);
  }
  return 0.0f;
}

void store_element(void* base, DType dt, int64_t index, float value) {
  switch (dt) {
    case DType::F32: static_cast<float*>(base)[index] = value; return;
    case DType::F16: static_cast<uint16_t*>(base)[index] = float_to_half(value); return;
    case DType::BF16: static_cast<uint16_t*>(base)[index] = float_to_bfloat16(value); return;
  }
}

// Calls f(n, offset) for every element of a view in row-major order (n counts, offset is in the view).
template <typename F>
void for_each_element(const TensorView& t, F&& f) {
  std::vector<int64_t> idx(t.shape.size(), 0);
  const int64_t total = [&] { int64_t n = 1; for (int64_t d : t.shape) n *= d; return n; }();
  for (int64_t n = 0; n < total; ++n) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * t.strides[d];
    f(static_cast<size_t>(n), off);
    for (size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
}

// A view -> contiguous float, and back.
std::vector<float> gather(const TensorView& t) {
  std::vector<float> out;
  for_each_element(t, [&](size_t, int64_t off) { out.push_back(load_element(t.data, t.dtype, off)); });
  return out;
}
void scatter(const TensorView& t, const std::vector<float>& values) {
  for_each_element(t, [&](size_t n, int64_t off) { store_element(t.data, t.dtype, off, values[n]); });
}

class CpuBackend final : public Backend {
public:
  explicit CpuBackend(const Pattern& p) : pattern_(p) {}
  void upload(PlanEntry&, const DynamicLayout*) override {}
  void forward(const PlanEntry& entry, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView* lse, const ForwardOptions& options) override {
    const std::vector<float> qf = gather(q), kf = gather(k), vf = gather(v);
    const ExecutorOutput r = execute_plan(entry.plan, pattern_, qf.data(), kf.data(), vf.data(), options.dynamic_layout);
    scatter(o, r.o);
    if (lse) scatter(*lse, r.lse);
  }
  void backward(const PlanEntry& entry, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, const ForwardOptions& options) override {
    const std::vector<float> qf = gather(q), kf = gather(k), vf = gather(v), of = gather(o), lf = gather(lse),
                             df = gather(dout);
    const BackwardPlans& plans = entry.backward_plans(pattern_, options.dynamic_layout, entry.plan.tiles);
    const ExecutorGradients g = execute_plan_backward(plans.query_major, plans.key_major, pattern_, qf.data(), kf.data(),
                                                      vf.data(), of.data(), lf.data(), df.data(), options.dynamic_layout);
    scatter(dq, g.dq);
    scatter(dk, g.dk);
    scatter(dv, g.dv);
  }
  std::string kernel_name() const override { return "cpu plan executor"; }
  TileConfig tiles() const override { return TileConfig{64, 64}; }
  int alignment() const override { return 1; }

private:
  const Pattern& pattern_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Pattern& p, const Problem&) { return std::make_unique<CpuBackend>(p); }

}  // namespace attnjit
