#include "runtime/kernel_params.hpp"

namespace attnjit {

KernelParams kernel_params(const Plan& plan, const Problem& pb, const KernelTables& t, const TensorView& q,
                           const TensorView& k, const TensorView& v, const TensorView& o, const TensorView* lse,
                           const ForwardOptions& options) {
  KernelParams kp{};
  kp.q = q.data;
  kp.k = k.data;
  kp.v = v.data;
  kp.o = o.data;
  kp.lse = lse ? static_cast<float*>(lse->data) : nullptr;
  kp.q_batch_stride = q.strides[0], kp.q_row_stride = q.strides[1], kp.q_head_stride = q.strides[2];
  kp.k_batch_stride = k.strides[0], kp.k_row_stride = k.strides[1], kp.k_head_stride = k.strides[2];
  kp.v_batch_stride = v.strides[0], kp.v_row_stride = v.strides[1], kp.v_head_stride = v.strides[2];
  kp.o_batch_stride = o.strides[0], kp.o_row_stride = o.strides[1], kp.o_head_stride = o.strides[2];
  kp.lse_batch_stride = lse ? lse->strides[0] : 0;
  kp.lse_head_stride = lse ? lse->strides[1] : 0;
  kp.q_offset = options.q_offset;
  kp.k_offset = options.k_offset;
  kp.heads_per_kv = static_cast<int32_t>(pb.heads_q / pb.heads_kv);
  kp.num_items = t.num_items;
  kp.scale_log2 = static_cast<float>(plan.softmax_scale * 1.4426950408889634);  // scores live in the exp2 domain
  kp.output_scale = static_cast<float>(plan.output_scale);
  kp.items = t.items;
  kp.spans = t.spans;
  kp.entries = t.entries;
  kp.dyn_row_offsets = t.dyn_row_offsets;
  kp.dyn_cols = t.dyn_cols;
  kp.dyn_q_blocks = t.dyn_q_blocks;
  kp.dyn_heads = t.dyn_heads;
  return kp;
}

}  // namespace attnjit
