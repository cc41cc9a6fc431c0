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

// [B, S, H, D] view -> contiguous float.
std::vector<float> gather(const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.shape[0] * t.shape[1] * t.shape[2] * t.shape[3]));
  size_t n = 0;
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t s = 0; s < t.shape[1]; ++s)
      for (int64_t h = 0; h < t.shape[2]; ++h)
        for (int64_t d = 0; d < t.shape[3]; ++d)
          out[n++] = load_element(t.data, t.dtype, b * t.strides[0] + s * t.strides[1] + h * t.strides[2] + d);
  return out;
}

class CpuBackend final : public Backend {
public:
  explicit CpuBackend(const Pattern& p) : pattern_(p) {}
  void upload(PlanEntry&, const DynamicLayout*) override {}
  void forward(const PlanEntry& entry, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView* lse, const ForwardOptions& options) override {
    const std::vector<float> qf = gather(q), kf = gather(k), vf = gather(v);
    const ExecutorOutput r = execute_plan(entry.plan, pattern_, qf.data(), kf.data(), vf.data(), options.dynamic_layout);
    size_t n = 0;
    for (int64_t b = 0; b < o.shape[0]; ++b)
      for (int64_t s = 0; s < o.shape[1]; ++s)
        for (int64_t h = 0; h < o.shape[2]; ++h)
          for (int64_t d = 0; d < o.shape[3]; ++d)
            store_element(o.data, o.dtype, b * o.strides[0] + s * o.strides[1] + h * o.strides[2] + d, r.o[n++]);
    if (lse) {
      n = 0;
      for (int64_t b = 0; b < lse->shape[0]; ++b)
        for (int64_t h = 0; h < lse->shape[1]; ++h)
          for (int64_t s = 0; s < lse->shape[2]; ++s)
            static_cast<float*>(lse->data)[b * lse->strides[0] + h * lse->strides[1] + s] = r.lse[n++];
    }
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
