// The Plan packed for a kernel: flat arrays of the kernel ABI's AjItem, AjSpan and entry words
// (templates/kernel_abi.h). Uploaded once per (pattern, shape) and reused by every launch.
#pragma once

#include <cstdint>
#include <vector>

#include "compiler/plan/plan.hpp"
#include "compiler/plan/plan_backward.hpp"

// The kernel arguments and tables, declared once for the kernels and the host.
typedef int64_t aj_i64;
typedef uint64_t aj_u64;
#include "templates/kernel_abi.h"

namespace attnjit {

// The kernel ABI (templates/kernel_abi.h) under the host's names.
using DeviceItem = AjItem;
using DeviceSpan = AjSpan;
using KernelParams = AjParams;  // passed to the forward kernels by value; pointers are device addresses
using DeviceKeyItem = AjKeyItem;
using DeviceQueryEntry = AjQueryEntry;
using KernelBwdParams = AjBwdParams;  // passed to the backward kernels by value

struct DeviceBackwardPlan {
  std::vector<DeviceKeyItem> items;
  std::vector<DeviceQueryEntry> entries;
};
DeviceBackwardPlan pack_backward_plan(const BackwardPlan& plan);

struct DevicePlan {
  std::vector<DeviceItem> items;
  std::vector<DeviceSpan> spans;
  std::vector<int32_t> entries;  // tile << 1 | full
  std::vector<int64_t> doc_base;  // Plan::doc_base (empty without packed documents)
  std::vector<float> key_extra;   // AjParams::key_extra: Plan::key_weights less one, then 256 zeros (empty: not packed)
  size_t bytes() const;
};

// Packs a plan; a plan whose tables do not fit 32-bit indices is a UserError (split the call).
DevicePlan pack_plan(const Plan& plan);

}  // namespace attnjit
