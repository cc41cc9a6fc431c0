// The CPU device: the plan executor on host tensors of any strides and dtype (converted to float32
// in the executor's head-major order, [B, H, S, D], and back).
#include <algorithm>
#include <type_traits>

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

// Calls f(n, offset, count, stride) for each innermost run of a view in row-major order: `count`
// elements from `offset` (in the view) `stride` apart, the first of them element n of the run order.
template <typename F>
void for_each_run(const TensorView& t, F&& f) {
  if (t.shape.empty()) return f(size_t{0}, int64_t{0}, int64_t{1}, int64_t{1});
  const size_t last = t.shape.size() - 1;
  const int64_t count = t.shape[last], stride = t.strides[last];
  int64_t runs = 1;
  for (size_t d = 0; d < last; ++d) runs *= t.shape[d];
  if (count == 0) return;
  std::vector<int64_t> idx(last, 0);
  for (int64_t n = 0; n < runs; ++n) {
    int64_t off = 0;
    for (size_t d = 0; d < last; ++d) off += idx[d] * t.strides[d];
    f(static_cast<size_t>(n * count), off, count, stride);
    for (size_t d = last; d-- > 0;) {
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
}

// Calls f(Element{}) with the C++ type behind `dt`'s storage, so loops convert without a switch
// per element.
template <typename F>
void with_storage(DType dt, F&& f) {
  switch (dt) {
    case DType::F32: return f(float{});
    case DType::F16:
    case DType::BF16: return f(uint16_t{});
  }
}

// A view -> contiguous float, and back.
std::vector<float> gather(const TensorView& t) {
  int64_t total = 1;
  for (int64_t d : t.shape) total *= d;
  std::vector<float> out(static_cast<size_t>(total));
  with_storage(t.dtype, [&](auto element) {
    using E = decltype(element);
    const E* base = static_cast<const E*>(t.data);
    for_each_run(t, [&](size_t n, int64_t off, int64_t count, int64_t stride) {
      float* dst = out.data() + n;
      if constexpr (std::is_same_v<E, float>) {
        if (stride == 1) return static_cast<void>(std::copy(base + off, base + off + count, dst));
      }
      for (int64_t x = 0; x < count; ++x) dst[x] = load_element(t.data, t.dtype, off + x * stride);
    });
  });
  return out;
}
void scatter(const TensorView& t, const std::vector<float>& values) {
  with_storage(t.dtype, [&](auto element) {
    using E = decltype(element);
    E* base = static_cast<E*>(t.data);
    for_each_run(t, [&](size_t n, int64_t off, int64_t count, int64_t stride) {
      const float* src = values.data() + n;
      if constexpr (std::is_same_v<E, float>) {
        if (stride == 1) return static_cast<void>(std::copy(src, src + count, base + off));
      }
      for (int64_t x = 0; x < count; ++x) store_element(t.data, t.dtype, off + x * stride, src[x]);
    });
  });
}

// A [B, S, H, D] view seen as [B, H, S, D]: gathering it gives the executor's HeadMajor order.
TensorView head_major(const TensorView& t) {
  TensorView h = t;
  std::swap(h.shape[1], h.shape[2]);
  std::swap(h.strides[1], h.strides[2]);
  return h;
}

constexpr ExecutorOptions kHeadMajor{.order = ExecutorOrder::HeadMajor};

class CpuBackend final : public Backend {
public:
  explicit CpuBackend(const Pattern& p) : pattern_(p) {}
  void upload(PlanEntry&, const DynamicLayout*) override {}
  void forward(const PlanEntry& entry, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView* lse, const ForwardOptions& options) override {
    const std::vector<float> qf = gather(head_major(q)), kf = gather(head_major(k)), vf = gather(head_major(v));
    const ExecutorOutput r =
        execute_plan(entry.plan, pattern_, qf.data(), kf.data(), vf.data(), options.dynamic_layout, kHeadMajor);
    scatter(head_major(o), r.o);
    if (lse) scatter(*lse, r.lse);
  }
  void backward(const PlanEntry& entry, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                const TensorView& dv, const ForwardOptions& options) override {
    const std::vector<float> qf = gather(head_major(q)), kf = gather(head_major(k)), vf = gather(head_major(v)),
                             of = gather(head_major(o)), lf = gather(lse), df = gather(head_major(dout));
    const BackwardPlans& plans = entry.backward_plans(pattern_, options.dynamic_layout, entry.plan.tiles);
    const ExecutorGradients g = execute_plan_backward(plans.query_major, plans.key_major, pattern_, qf.data(), kf.data(),
                                                      vf.data(), of.data(), lf.data(), df.data(), options.dynamic_layout,
                                                      kHeadMajor);
    scatter(head_major(dq), g.dq);
    scatter(head_major(dk), g.dk);
    scatter(head_major(dv), g.dv);
  }
  std::string kernel_name() const override { return "cpu plan executor"; }
  // 128x128: the tile products are large enough for Eigen's GEMM to run near its peak, small enough
  // that causal and window diagonals waste little (bench/NOTES.md, "The CPU device").
  TileConfig tiles() const override { return TileConfig{128, 128}; }
  int alignment() const override { return 1; }

private:
  const Pattern& pattern_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const Pattern& p, const Problem&) { return std::make_unique<CpuBackend>(p); }

}  // namespace attnjit
