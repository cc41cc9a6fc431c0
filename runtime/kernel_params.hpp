// The argument block of a forward kernel (AjParams), filled the same way for every device that
// launches the generated kernel (a GPU, the emulator); only where the tables live differs.
#pragma once

#include "attnjit/attnjit.hpp"
#include "compiler/codegen/codegen.hpp"
#include "compiler/plan/device_plan.hpp"
#include "compiler/plan/paged_plan.hpp"

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
  const int64_t* doc_base = nullptr;  // packed documents (null: none), doc_rows entries
  int64_t doc_rows = 0;
  int64_t dyn_entries = 0;   // entries of dyn_cols
  int64_t dyn_k_blocks = 0;  // the pattern's key blocks for this call (dynamic_key_blocks)
  const float* key_extra = nullptr;  // a packed plan's weights less one (DevicePlan::key_extra; null: none)
};

// The call's table, where a DeviceDynamicLayout in `options` overrides the uploaded one.
KernelParams kernel_params(const Plan& plan, const Problem& pb, const KernelTables& t, const TensorView& q,
                           const TensorView& k, const TensorView& v, const TensorView& o, const TensorView* lse,
                           const ForwardOptions& options);

// The paged forward's argument block (AjPagedParams): the packed paged plan's tables where the
// device keeps them, the call's tensors (device addresses), `splits` blocks per item, and for
// splits > 1 the partial buffers ([items, splits, tile_q, head_dim_v] and [items, splits, tile_q]).
struct PagedTables {
  const DeviceItem* items = nullptr;
  const DeviceSpan* spans = nullptr;
  const int32_t* entries = nullptr;
  const int32_t* item_request = nullptr;
  const int32_t* item_heads = nullptr;
  const int64_t* q_start = nullptr;
  const int64_t* q_pos = nullptr;
  float* part_o = nullptr;
  float* part_lse = nullptr;
  const int32_t* header = nullptr;  // {items, splits} of the plan
};
// `softmax_scale` and `output_scale` are the pattern's (a plan's; PagedState keeps them).
AjPagedParams paged_params(double softmax_scale, double output_scale, const PagedProblem& pb, const PagedTables& t, const TensorView& q,
                           const TensorView& k_cache, const TensorView& v_cache, const TensorView& o, const TensorView* lse,
                           const int32_t* block_table, int64_t block_table_stride, const float* k_scale,
                           const float* v_scale, int32_t* errors);

// The tables the paged kernels read, in one workspace: the header {items, splits}, then the tables
// and the partial buffers at offsets fixed by a capacity (each 256-byte aligned). An eager call's
// workspace has the capacity of its own plan (paged_capacity_of); a CUDA graph's is sized ahead
// (PagedAttention::plan/run). `tables_bytes` is what a plan writes (header and tables), `total`
// the workspace's size.
struct PagedWorkspace {
  size_t header = 0, items = 0, spans = 0, entries = 0, item_request = 0, item_heads = 0, q_start = 0, q_pos = 0;
  size_t part_o = 0, part_lse = 0, tables_bytes = 0, total = 0;
};
PagedWorkspace paged_workspace(const PagedCapacity& cap, int32_t tile_q, int64_t head_dim_v);
// What `plan` run with `splits` takes.
PagedCapacity paged_capacity_of(const PagedPlan& plan, int32_t splits);
// The header and tables of `plan` laid out as `w` says (tables_bytes bytes); the plan must fit `cap`
// (a UserError naming the count otherwise).
std::vector<uint8_t> pack_paged_workspace(const PagedPlan& plan, int32_t splits, const PagedCapacity& cap,
                                          const PagedWorkspace& w);
// The kernels' view of a workspace at `base` (device, or image, addresses).
PagedTables paged_workspace_tables(void* base, const PagedWorkspace& w);

// A call planned on the device (PagedCall::device_kv_lens; the _plan kernel, templates/plan_paged.cuh):
// its lengths (device, or image, addresses), how many, and what the planner is to aim for.
struct DevicePlanning {
  const int32_t* kv_lens = nullptr;
  const int32_t* cu_seqlens_q = nullptr;  // null: one query per request
  int64_t requests = 0;
  int32_t fixed_splits = 0;     // the call's splits (0: automatic)
  int64_t target_blocks = 1;    // blocks that fill the device
  uint64_t seek_branches = 0;   // the pattern's branches with a layout: the forward seeks through them
};
// `pp` (a call's paged_params over a workspace of capacity `cap`) with the planner's fields set.
void set_device_planning(AjPagedParams& pp, const DevicePlanning& d, const PagedCapacity& cap, int64_t total_q);
// The most a call planned on the device can need: every query row its own item in every class of
// heads (`classes`, paged_head_classes), each with a span per branch; splits the call's, or what
// the fewest items the rows can make would take to fill `target_blocks` (at most 64).
PagedCapacity device_planned_capacity(const std::vector<PagedHeadClass>& classes, int64_t branches, int32_t tile_q,
                                      int64_t requests, int64_t total_q, int32_t splits, int64_t target_blocks);

// The argument block of the backward kernels (AjBwdParams): the forward's over `plan` (the
// backward's query-major plan), the key-major tables, the gradient tensors and the workspaces
// (delta [batch, heads_q, seq_q]; dk_acc, dv_acc contiguous [batch, seq_k, heads_kv, d], zeroed).
struct BackwardTables {
  const DeviceKeyItem* key_items = nullptr;
  const DeviceQueryEntry* query_entries = nullptr;
  int32_t num_key_items = 0;
  float* delta = nullptr;
  float* dk_acc = nullptr;
  float* dv_acc = nullptr;
  float* dq_acc = nullptr;  // zeroed; set only when the grids run the single pass (else the two-pass form)
};
KernelBwdParams backward_params(const Plan& plan, const Problem& pb, const KernelTables& t, const BackwardTables& bt,
                                const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                                const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                                const TensorView& dv, const ForwardOptions& options);

// The grid's y and z for a batch: y holds up to 65535 batch entries (the hardware's limit), z the
// slices of 65535 (templates/common.cuh, aj_batch_index(); blocks past the batch return at once).
struct BatchGrid {
  unsigned y = 1, z = 1;
};
BatchGrid batch_grid(int64_t batch);

// The grid of a launch over work items (the forward's query items, a _dkdv launch's key items): a
// block per item in x and the batch in y and z; for a persistent kernel (KernelSource::persistent:
// blocks take the items x batch entries in turn) at most `persistent_blocks` blocks in x (-1: one
// per SM of `sms`), never more than those units, never none; UserError past 2^31 - 1 units (the
// persistent backward's consumers count them in 32 bits).
struct LaunchGrid {
  unsigned x = 1, y = 1, z = 1;
};
LaunchGrid item_grid(int64_t items, int64_t batch, bool persistent, int persistent_blocks, int64_t sms);

// The grids of the backward launches (x dimension; pre, dq and dkdv have `batch` rows of blocks,
// cvt one). A zero means the launch has nothing to do. dK/dV take one launch per layer of disjoint
// key tiles (plain adds, bitwise reproducible) when the key tiles are disjoint or `deterministic`
// asks for it, else one launch of every key tile with atomic adds.
struct DkdvLaunch {
  int32_t key_item_base = 0;
  uint64_t blocks = 0;
  int32_t plain_add = 0;  // AjBwdParams::plain_add: 0 atomic adds, 1 plain adds, 2 stores in the storage type
};
// The launches of one backward: _pre, then _dq (none in the single pass, where _dkdv adds dQ into
// its fp32 accumulator: the tensor-core kernels, unless deterministic or ATTNJIT_BWD_SINGLE_PASS=0),
// _dkdv by layers, _cvt. With `add` (Attention::backward_add: D given, the gradients added into the
// caller's fp32 accumulators) neither _pre nor _cvt runs and _dkdv never stores; `items` is then
// the forward plan's items with work (work_item_prefix), the blocks of _dq.
struct BackwardGrids {
  bool single_pass = false;
  // dK and dV stored by _dkdv in the storage type (BackwardPlan::keys_cover_all): their fp32
  // workspaces are neither zeroed nor converted (_cvt converts dQ alone, with plain_add = 2).
  bool direct_dkdv = false;
  uint64_t pre = 0, dq = 0, cvt = 0;
  std::vector<DkdvLaunch> dkdv;
};
BackwardGrids backward_grids(const Problem& pb, const BackwardKernels& k, size_t items, const BackwardPlan& key_major,
                             bool deterministic, bool add = false);

}  // namespace attnjit
