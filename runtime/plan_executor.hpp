// The CPU plan executor: runs a Plan exactly as a kernel would, tile by tile, with the kernel's
// float32 online softmax (running max, running sum, rescale). It shares nothing with the
// reference beyond tensor layout, so a lowering bug shows up as a mismatch with the reference.
#pragma once

#include <vector>

#include "compiler/plan.hpp"
#include "compiler/plan_backward.hpp"

namespace attnjit {

struct ExecutorOutput {
  std::vector<float> o;    // [batch, seq_q, heads_q, head_dim_v]
  std::vector<float> lse;  // [batch, heads_q, seq_q]
};

// Inputs as for reference_attention (contiguous [B, S, H, D]). Outputs start poisoned (NaN), so a
// row the plan forgets shows. `pattern` and `dynamic` supply the partial-tile predicate.
ExecutorOutput execute_plan(const Plan& plan, const Pattern& pattern, const float* q, const float* k, const float* v,
                            const DynamicLayout* dynamic = nullptr, unsigned threads = 0);

struct ExecutorGradients {
  std::vector<float> dq, dk, dv;  // layouts of q, k, v
};

// The backward pass as the backward kernels compute it, in float32: D = rowsum(dO * O); P =
// exp(S - LSE) recomputed from Q, K and the forward's LSE, dP = f dO V^T, dS = P (dP - D), with f
// the plan's output scale; dQ += scale dS K over the forward plan (query tiles), dK += scale dS^T Q
// and dV += f P^T dO over the key-major plan `bwd` (lower_to_backward_plan(plan)). `o` and `lse` are
// the forward's outputs. dK and dV of a kv head sum over the query heads that read it.
ExecutorGradients execute_plan_backward(const Plan& plan, const BackwardPlan& bwd, const Pattern& pattern, const float* q,
                                        const float* k, const float* v, const float* o, const float* lse,
                                        const float* dout, const DynamicLayout* dynamic = nullptr, unsigned threads = 0);

}  // namespace attnjit
