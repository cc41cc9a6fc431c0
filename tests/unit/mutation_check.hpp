// The mutation tests' check (tests/unit/test_mutations.cpp): runs a template set's kernels on the
// emulator against the float64 reference, on inputs chosen to show a class of defects.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "attnjit/attnjit.hpp"
#include "compiler/codegen/templates.hpp"

namespace attnjit::testing {

// Runs `templates`' kernels on the emulator; "" when they match the reference (O and LSE, and with
// `backward` dQ, dK, dV too), else what went wrong.
std::string check_kernel(const std::shared_ptr<const TemplateSet>& templates, DType dt, bool backward = false,
                         bool deterministic = false, int64_t d = 64, bool sm90a = false, bool tma = true,
                         bool far_below = false, bool device_table = false, bool random_in_kernel = false, bool folded = false,
                         const KernelConfig& config = {}, bool nonfinite_v = false, bool extreme = false,
                         char nonfinite_in = 0, bool causal = false, bool lazy = false, bool poly = false,
                         bool packed = false, int persistent = 0);

}  // namespace attnjit::testing
