// The attention weights on the host: q, k and the forward's LSE gathered to float32 (head-major),
// then the plan executor's weights pass over the same plan the forward ran.
#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"
#include "runtime/backend.hpp"
#include "runtime/host_tensors.hpp"
#include "runtime/cpu/plan_executor.hpp"

namespace attnjit {

void Backend::weights(const PlanEntry& entry, const Pattern& pattern, const TensorView& q, const TensorView& k,
                      const TensorView& lse, const TensorView& w, const ForwardOptions& options) {
  const std::vector<float> qf = gather(head_major(q)), kf = gather(head_major(k)), lf = gather(lse);
  execute_plan_weights(entry.plan, pattern, qf.data(), kf.data(), lf.data(), static_cast<float*>(w.data),
                       options.dynamic_layout,
                       ExecutorOptions{.order = ExecutorOrder::HeadMajor, .offsets = std::pair{options.q_offset, options.k_offset}});
}

}  // namespace attnjit
