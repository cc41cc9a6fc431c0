// Every input of a forward call is checked before anything runs: shapes against the problem and
// each other, dtypes, a contiguous last dimension, alignment the kernel relies on, aliasing.
#pragma once

#include "attnjit/attnjit.hpp"
#include "compiler/codegen/codegen.hpp"

namespace attnjit {

// `align_bytes` > 1: base pointers and every stride (in bytes) must be multiples of it (the
// tensor-core path loads 16-byte chunks).
void check_forward_inputs(const Problem& pb, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& o, const TensorView* lse, int align_bytes);

// A backward call: the forward's inputs and outputs (lse required), dout shaped like o, and the
// gradients dq, dk, dv shaped like q, k, v, aliasing nothing else.
// dlse: the optional gradient of lse (ForwardOptions::dlse), checked like lse when given.
void check_backward_inputs(const Problem& pb, const TensorView& q, const TensorView& k, const TensorView& v,
                           const TensorView& o, const TensorView& lse, const TensorView& dout, const TensorView& dq,
                           const TensorView& dk, const TensorView& dv, int align_bytes, const TensorView* dlse = nullptr);
// backward_add(): the inputs as backward()'s, and delta and the accumulators float32 and
// contiguous (the kernels address them as their workspaces), the accumulators apart from the rest.
void check_backward_add_inputs(const Problem& pb, const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& lse, const TensorView& dout, const TensorView& delta, const TensorView& dq_acc,
                               const TensorView& dk_acc, const TensorView& dv_acc, int align_bytes);

// A weights call: q, k and the forward's lse as for backward, w float32 contiguous
// [batch, heads_q, seq_q, seq_k] aliasing none of them, and no more than ATTNJIT_MAX_WEIGHTS elements.
void check_weights_inputs(const Problem& pb, const TensorView& q, const TensorView& k, const TensorView& lse,
                          const TensorView& w, int align_bytes);

// The weights' size against ATTNJIT_MAX_WEIGHTS: a UserError naming the knob above it.
void check_weights_size(int64_t batch, int64_t heads_q, int64_t seq_q, int64_t seq_k);

// The bytes a view's elements span from its data pointer (0 for a view with no elements): a
// UserError naming the view when its strides reach past any memory (2^56 bytes) or the arithmetic
// would wrap. Strides of size-1 dimensions are not used.
uint64_t view_span_bytes(const char* name, const TensorView& t);

// An output's elements must each have their own memory: a UserError naming the view when two
// indices land on one element (a stride 0 over more than one index, strides that interleave).
void check_no_self_overlap(const char* name, const TensorView& t);

// The Shape of a call of this problem at these offsets.
Shape problem_shape(const Problem& pb, int64_t q_offset, int64_t k_offset);

// The kernel request of this problem on a GPU of compute capability `arch` (10 * major + minor),
// its arch-specific kernels or not: head dims and dtype from the problem, everything else the
// request's defaults (the caller sets tiles, TMA, seeks).
KernelRequest problem_request(const Problem& pb, int arch, bool arch_specific);

// The problem itself: sizes >= 1, heads_kv divides heads_q, an out_dtype only for fp8_e4m3 inputs.
void check_problem(const Problem& pb);

// `call` ("backward", "weights") refused for fp8_e4m3 inputs, which are forward only.
void check_forward_only(const Problem& pb, const char* call);

// A forward call's descale factors (ForwardOptions::q_descale, ...): fp32 [batch, heads_kv] views,
// each required with fp8_e4m3 inputs and refused otherwise.
void check_descales(const Problem& pb, const ForwardOptions& options, const TensorView& q, const TensorView& k,
                    const TensorView& v, const TensorView& o);

}  // namespace attnjit
