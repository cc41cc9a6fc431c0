// The argument block of a forward kernel (AjParams), filled the same way for every device that
// launches the generated kernel (a GPU, the emulator); only where the tables live differs.
#pragma once

#include "attnjit/attnjit.hpp"
#include "compiler/device_plan.hpp"

namespace attnjit {

// Where a device keeps a plan's packed tables (device or host addresses).
struct KernelTables {
  const DeviceItem* items = nullptr;
  const DeviceSpan* spans = nullptr;
  const int32_t* entries = nullptr;
  const int64_t* dyn_row_offsets = nullptr;
  const int32_t* dyn_cols = nullptr;
  int32_t num_items = 0;
  int64_t dyn_q_blocks = 0;
  int32_t dyn_heads = 1;
};

KernelParams kernel_params(const Plan& plan, const Problem& pb, const KernelTables& t, const TensorView& q,
                           const TensorView& k, const TensorView& v, const TensorView& o, const TensorView* lse,
                           const ForwardOptions& options);

}  // namespace attnjit
