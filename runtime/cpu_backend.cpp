// The CPU device: the plan executor on host tensors of any strides and dtype (converted to float32
// in the executor's head-major order, [B, H, S, D], and back).
#include <algorithm>
#include <type_traits>

#include "compiler/support/error.hpp"
#include "runtime/backend.hpp"
#include "runtime/host_tensors.hpp"
#include "runtime/plan_executor.hpp"

namespace attnjit {
namespace {

// Head-major, at the call's positions (the plan may have been lowered for others with the same mask).
ExecutorOptions executor_options(const ForwardOptions& o) {
  return ExecutorOptions{.order = ExecutorOrder::HeadMajor, .offsets = std::pair{o.q_offset, o.k_offset}};
}

class CpuBackend final : public Backend {
public:
  explicit CpuBackend(const Pattern& p) : pattern_(p) {}
  void upload(PlanEntry&, const DynamicLayout*) override {}
  void forward(const PlanEntry& entry, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
               const TensorView* lse, const ForwardOptions& options) override {
    const std::vector<float> qf = gather(head_major(q)), kf = gather(head_major(k)), vf = gather(head_major(v));
    const ExecutorOutput r =
        execute_plan(entry.plan, pattern_, qf.data(), kf.data(), vf.data(), options.dynamic_layout, executor_options(options));
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
                                                      executor_options(options));
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
