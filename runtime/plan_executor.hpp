// The CPU plan executor: runs a Plan exactly as a kernel would, tile by tile, with the kernel's
// float32 online softmax (running max, running sum, rescale). It shares nothing with the
// reference beyond tensor layout, so a lowering bug shows up as a mismatch with the reference.
#pragma once

#include <vector>

#include "compiler/plan.hpp"

namespace attnjit {

struct ExecutorOutput {
  std::vector<float> o;    // [batch, seq_q, heads_q, head_dim_v]
  std::vector<float> lse;  // [batch, heads_q, seq_q]
};

// Inputs as for reference_attention (contiguous [B, S, H, D]). Outputs start poisoned (NaN), so a
// row the plan forgets shows. `pattern` and `dynamic` supply the partial-tile predicate.
ExecutorOutput execute_plan(const Plan& plan, const Pattern& pattern, const float* q, const float* k, const float* v,
                            const DynamicLayout* dynamic = nullptr, unsigned threads = 0);

}  // namespace attnjit
