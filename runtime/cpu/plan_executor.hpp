// The CPU plan executor: runs a Plan exactly as a kernel would, tile by tile, with the kernel's
// float32 online softmax (running max, running sum, rescale); each tile pair is two small matrix
// products (Eigen, vectorised for the CPU it runs on) and one vectorised softmax step. It shares nothing with the
// reference beyond tensor layout, so a lowering bug shows up as a mismatch with the reference.
#pragma once

#include <vector>

#include "compiler/plan/plan.hpp"
#include "compiler/plan/plan_backward.hpp"
#include "compiler/support/knobs.hpp"

namespace attnjit {

// Where row (batch b, position i, head h) of a tensor starts, in rows of its width (head_dim or
// head_dim_v): b * batch + i * pos + h * head. [B, S, H, D] is {S * H, H, 1}; [B, H, S, D] is {H * S, 1, S}.
struct RowLayout {
  int64_t batch = 0, pos = 0, head = 0;
};

struct ExecutorOutput {
  std::vector<float> o;    // [batch, seq_q, heads_q, head_dim_v] (HeadMajor: [batch, heads_q, seq_q, head_dim_v])
  std::vector<float> lse;  // [batch, heads_q, seq_q]
};

// How the executor's tensors are laid out: the contract's [B, S, H, D] (q, k, v, O, dO and the
// gradients alike), or [B, H, S, D], where each head's rows are contiguous (faster tile loads; the
// CPU device converts to it). The LSE is [B, H, S] either way.
enum class ExecutorOrder { SeqMajor, HeadMajor };

// How the backward is split into parallel work: Split runs dQ over the forward plan's query tiles
// and then dK/dV over (batch, kv head) units, as the kernels do; Fused adds dQ in the dK/dV units
// (a unit owns every query head that reads its kv head), computing P and dS once instead of twice.
// Auto: Fused when there are at least as many (batch, kv head) units as threads.
enum class BackwardSchedule { Auto, Fused, Split };

// The forward's arithmetic on FP8 inputs (docs/spec.md, "FP8 inputs"), as the kernels do it: the
// scores of (batch b, kv head h) are multiplied by qk[b * heads_kv + h] (q_descale * k_descale) with
// the softmax scale, P is rounded to e4m3 after a factor 2^8 (kP8Scale) for the P V product while
// the row sums take it unrounded, and O is multiplied by v[b * heads_kv + h] (v_descale).
struct Fp8Arithmetic {
  std::vector<float> qk, v;  // [batch * heads_kv] each
  // Q K^T and P V summed as Hopper's FP8 tensor core sums them (steps of 32 terms, truncated:
  // e4m3_fused_dot_add), where the FP8 wgmma kernel is to be matched (its tests); false: the
  // contract's fp32 sums (docs/spec.md, "FP8 inputs").
  bool tensor_core_sums = false;
};
// P's factor before it is rounded to e4m3: the largest probability, 1, becomes 256 (e4m3 reaches
// 448), and e4m3's subnormals (2^-9 apart) hold probabilities down to 2^-17.
constexpr float kP8Scale = 256.0f;

struct ExecutorOptions {
  unsigned threads = 0;             // 0: one per core
  CpuSimd simd = CpuSimd::Auto;     // the compiled variant of the tile arithmetic (Auto: ATTNJIT_CPU_SIMD,
                                    // by default the best this CPU runs); one this build or CPU lacks is a UserError
  ExecutorOrder order = ExecutorOrder::SeqMajor;
  BackwardSchedule schedule = BackwardSchedule::Auto;
  // The call's positions (q_offset, k_offset) where they differ from the plan's: a plan serves
  // every pair of offsets its pattern cannot tell apart (translation_period), and the partial
  // tiles' predicate takes the call's. nullopt: the plan's own.
  std::optional<std::pair<int64_t, int64_t>> offsets = std::nullopt;
  // The forward on FP8 inputs (their values already decoded); null: the 16/32-bit arithmetic.
  const Fp8Arithmetic* fp8 = nullptr;
  // The forward runs only the work items that visit a tile (work_item_prefix): rows that attend
  // nothing keep what O and the LSE held (ForwardOptions::rows_with_work_only).
  bool rows_with_work_only = false;
};

// Inputs as for reference_attention (contiguous [B, S, H, D], or [B, H, S, D] by `options`).
// Outputs start poisoned (NaN), so a row the plan forgets shows. `pattern` and `dynamic` supply
// the partial-tile predicate.
ExecutorOutput execute_plan(const Plan& plan, const Pattern& pattern, const float* q, const float* k, const float* v,
                            const DynamicLayout* dynamic = nullptr, const ExecutorOptions& options = {});

// The same into outputs the caller sized and filled (out.o and out.lse in the layouts of
// `options.order`): the rows the forward writes are overwritten, the others kept.
void execute_plan_onto(const Plan& plan, const Pattern& pattern, const float* q, const float* k, const float* v,
                       ExecutorOutput& out, const DynamicLayout* dynamic = nullptr, const ExecutorOptions& options = {});

// A float32 tensor read (or written) in place: its first element and its row layout.
struct RowsAt {
  const float* data = nullptr;
  RowLayout rows;
};

// The forward on tensors of any row layout, read and written in place (the CPU device's path for
// float32 tensors): O by `o_rows` (which must not overlap the inputs), the LSE into `lse`
// ([B, Hq, Sq], contiguous). `options.order` is not used. Nothing is poisoned: every row of O
// and the LSE is written (those the work items cover, with options.rows_with_work_only).
void execute_plan_into(const Plan& plan, const Pattern& pattern, RowsAt q, RowsAt k, RowsAt v, float* o,
                       RowLayout o_rows, float* lse, const DynamicLayout* dynamic = nullptr,
                       const ExecutorOptions& options = {});

// The attention weights of the forward: W [batch, heads_q, seq_q, seq_k] (written whole, zeros
// where nothing is attended) with W[b, h, i, j] = f * sum over the visits of (i, j) of
// exp(scale q_i . k_j - LSE_i), f the plan's output scale: a key two branches attend appears once
// with its summed weight, and O = W V. `lse` is the forward's ([B, Hq, Sq]); q and k follow
// `options.order`; W does not.
void execute_plan_weights(const Plan& plan, const Pattern& pattern, const float* q, const float* k, const float* lse,
                          float* w, const DynamicLayout* dynamic = nullptr, const ExecutorOptions& options = {});

struct ExecutorGradients {
  std::vector<float> dq, dk, dv;  // layouts of q, k, v (the options' order)
};

// The backward pass as the backward kernels compute it, in float32: D = rowsum(dO * O); P =
// exp(S - LSE) recomputed from Q, K and the forward's LSE, dP = f dO V^T, dS = P (dP - D), with f
// the plan's output scale; dQ += scale dS K over the forward plan (query tiles), dK += scale dS^T Q
// and dV += f P^T dO over the key-major plan `bwd` (lower_to_backward_plan(plan)). `o` and `lse` are
// the forward's outputs; `dlse` ([batch, heads_q, seq_q], or null) the gradient of lse, which joins
// D (dS = P (f dP - D + dlse)). dK and dV of a kv head sum over the query heads that read it.
// `delta` ([batch, heads_q, seq_q], or null): D given by the caller; o and dlse are then not read.
ExecutorGradients execute_plan_backward(const Plan& plan, const BackwardPlan& bwd, const Pattern& pattern, const float* q,
                                        const float* k, const float* v, const float* o, const float* lse,
                                        const float* dout, const DynamicLayout* dynamic = nullptr,
                                        const ExecutorOptions& options = {}, const float* dlse = nullptr,
                                        const float* delta = nullptr);

// The threads a call on `plan` uses: `requested` (ExecutorOptions::threads) when non-zero, else one
// per core but no more than the call's work fills (each thread past the first gets at least 2^24
// FLOP of tile products: handing a thread its share costs tens of microseconds).
unsigned executor_threads(const Plan& plan, unsigned requested);

// Was the variant compiled into this build (Auto and Generic always are)? Does this CPU run it?
bool cpu_simd_available(CpuSimd simd);
bool cpu_simd_runs_here(CpuSimd simd);
// The variant CpuSimd::Auto runs (ATTNJIT_CPU_SIMD resolved against the build and this CPU); a
// UserError if the knob asks for one that is missing.
CpuSimd cpu_simd_selected();

}  // namespace attnjit
