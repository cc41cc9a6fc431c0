// The Plan packed for a kernel: flat arrays whose layout matches AjItem, AjSpan and the entry
// words in templates/common.cuh. Uploaded once per (pattern, shape) and reused by every launch.
#pragma once

#include <cstdint>
#include <vector>

#include "compiler/plan/plan.hpp"
#include "compiler/plan/plan_backward.hpp"

namespace attnjit {

struct DeviceItem {  // = AjItem
  int64_t rows_start, rows_stride;
  int32_t rows_count, head, span_begin, span_end;
};
struct DeviceSpan {  // = AjSpan
  int64_t keys_start, keys_stride;
  int32_t keys_count, branch, tile_begin, tile_end, full_begin, full_end, entry_begin, entry_end;
};
static_assert(sizeof(DeviceItem) == 32 && sizeof(DeviceSpan) == 48, "must match templates/common.cuh");

// = AjParams, passed to the kernel by value. Pointers are device addresses.
struct KernelParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_head_stride;
  int64_t q_offset, k_offset;
  int32_t heads_per_kv;
  int32_t num_items;
  float scale_log2;
  float output_scale;
  const DeviceItem* items;
  const DeviceSpan* spans;
  const int32_t* entries;
  const int64_t* dyn_row_offsets;
  const int32_t* dyn_cols;
  int64_t dyn_q_blocks;
  int32_t dyn_heads;
  int32_t batch;            // blocks past it (the last slice of grid z) do nothing
  const int64_t* doc_base;  // packed documents: where each row's document starts (null: none)
  int64_t doc_rows;
  int64_t dyn_entries;      // entries of dyn_cols
  int64_t dyn_k_blocks;     // key blocks in range (the device table's check)
  int32_t* dyn_errors;      // the device table's check counts problems here (null: none)
  uint64_t seek_branches;   // Plan::kernel_seeks: the branches whose layouts the kernel decides per tile
};
static_assert(sizeof(KernelParams) == 288, "must match AjParams in templates/common.cuh");

// = AjKeyItem and AjQueryEntry (templates/bwd_common.cuh): the key-major plan of the backward pass.
struct DeviceKeyItem {
  int64_t keys_start, keys_stride;
  int32_t keys_count, kv_head, entry_begin, entry_end;
};
struct DeviceQueryEntry {
  int64_t rows_start, rows_stride;
  int32_t rows_count, head, branch, full;
};
static_assert(sizeof(DeviceKeyItem) == 32 && sizeof(DeviceQueryEntry) == 32, "must match templates/bwd_common.cuh");

// = AjBwdParams, passed to the backward kernels by value.
struct KernelBwdParams {
  KernelParams fwd;
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  float* delta;
  float* dk_acc;
  float* dv_acc;
  float* dq_acc;  // the single pass's fp32 dQ accumulator; null in the two-pass form
  const float* dlse;  // the lse output's gradient, or null
  int64_t dlse_batch_stride, dlse_head_stride;
  const DeviceKeyItem* key_items;
  const DeviceQueryEntry* query_entries;
  int64_t do_batch_stride, do_row_stride, do_head_stride;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
  int64_t batch, seq_q, seq_k;
  int32_t heads_q, heads_kv;
  float scale;
  int32_t num_key_items;
  int32_t key_item_base;
  int32_t plain_add;
};
static_assert(sizeof(KernelBwdParams) == 536, "must match AjBwdParams in templates/bwd_common.cuh");

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
  size_t bytes() const;
};

// Packs a plan; a plan whose tables do not fit 32-bit indices is a UserError (split the call).
DevicePlan pack_plan(const Plan& plan);

}  // namespace attnjit
