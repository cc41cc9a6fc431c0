// The Plan packed for a kernel: flat arrays whose layout matches AjItem, AjSpan and the entry
// words in templates/common.cuh. Uploaded once per (pattern, shape) and reused by every launch.
#pragma once

#include <cstdint>
#include <vector>

#include "compiler/plan.hpp"

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
};
static_assert(sizeof(KernelParams) == 240, "must match AjParams in templates/common.cuh");

struct DevicePlan {
  std::vector<DeviceItem> items;
  std::vector<DeviceSpan> spans;
  std::vector<int32_t> entries;  // tile << 1 | full
  size_t bytes() const;
};

// Packs a plan; a plan whose tables do not fit 32-bit indices is a UserError (split the call).
DevicePlan pack_plan(const Plan& plan);

}  // namespace attnjit
