#include "runtime/kernel_params.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <utility>

#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"

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
  kp.dyn_entries = t.dyn_entries;
  kp.dyn_k_blocks = t.dyn_k_blocks;
  kp.seek_branches = plan.kernel_seeks;
  if (const DeviceDynamicLayout* d = options.device_dynamic_layout) {
    // Read where it lies: nothing planned from it, nothing copied.
    kp.dyn_row_offsets = d->row_offsets;
    kp.dyn_cols = d->col_indices;
    kp.dyn_heads = static_cast<int32_t>(d->heads);
    kp.dyn_q_blocks = d->rows / d->heads;
    kp.dyn_entries = d->entries;
    kp.dyn_errors = d->errors;
  }
  kp.doc_base = t.doc_base;
  kp.doc_rows = t.doc_rows;
  kp.key_extra = t.key_extra;
  // FP8 inputs: each factor where the call's view says (device addresses; the emulator rebases them).
  const TensorView* descales[3] = {options.q_descale, options.k_descale, options.v_descale};
  const float** ptrs[3] = {&kp.q_descale, &kp.k_descale, &kp.v_descale};
  for (int n = 0; n < 3; ++n) {
    if (!descales[n]) continue;
    *ptrs[n] = static_cast<const float*>(descales[n]->data);
    kp.descale_strides[2 * n] = descales[n]->shape[0] == 1 ? 0 : descales[n]->strides[0];
    kp.descale_strides[2 * n + 1] = descales[n]->shape[1] == 1 ? 0 : descales[n]->strides[1];
  }
  kp.batch = static_cast<int32_t>(pb.batch);  // at most kMaxSize (2^31 - 1): Problem checks it
  return kp;
}

AjPagedParams paged_params(double softmax_scale, double output_scale, const PagedProblem& pb, const PagedTables& t, const TensorView& q,
                           const TensorView& k_cache, const TensorView& v_cache, const TensorView& o, const TensorView* lse,
                           const int32_t* block_table, int64_t block_table_stride, const float* k_scale,
                           const float* v_scale, int32_t* errors) {
  AjPagedParams pp{};
  KernelParams& kp = pp.fwd;
  kp.q = q.data, kp.k = k_cache.data, kp.v = v_cache.data, kp.o = o.data;
  kp.lse = lse ? static_cast<float*>(lse->data) : nullptr;
  kp.q_row_stride = q.strides[0], kp.q_head_stride = q.strides[1];
  kp.k_batch_stride = k_cache.strides[0], kp.k_row_stride = k_cache.strides[1], kp.k_head_stride = k_cache.strides[2];
  kp.v_batch_stride = v_cache.strides[0], kp.v_row_stride = v_cache.strides[1], kp.v_head_stride = v_cache.strides[2];
  kp.o_row_stride = o.strides[0], kp.o_head_stride = o.strides[1];
  kp.lse_head_stride = lse ? lse->strides[1] : 0;
  kp.heads_per_kv = static_cast<int32_t>(pb.heads_q / pb.heads_kv);
  kp.scale_log2 = static_cast<float>(softmax_scale * 1.4426950408889634);
  kp.output_scale = static_cast<float>(output_scale);
  kp.items = t.items, kp.spans = t.spans, kp.entries = t.entries;
  kp.batch = 1;
  pp.item_request = t.item_request, pp.item_heads = t.item_heads, pp.q_start = t.q_start, pp.q_pos = t.q_pos;
  pp.block_table = block_table;
  pp.part_o = t.part_o, pp.part_lse = t.part_lse;
  pp.table_stride = block_table_stride;
  pp.num_pages = k_cache.shape[0];
  pp.lse_row_stride = lse ? lse->strides[0] : 0;
  pp.page_size = static_cast<int32_t>(k_cache.shape[1]);
  // Rows load 16 bytes at a time where every cache row starts 16-byte aligned.
  auto aligned = [](const TensorView& c) {
    const int64_t e = dtype_bytes(c.dtype);
    return reinterpret_cast<uintptr_t>(c.data) % 16 == 0 && (c.strides[0] * e) % 16 == 0 && (c.strides[1] * e) % 16 == 0 &&
           (c.strides[2] * e) % 16 == 0;
  };
  pp.vec16 = aligned(k_cache) && aligned(v_cache) ? 1 : 0;
  pp.k_scale = k_scale, pp.v_scale = v_scale;
  pp.header = t.header;
  pp.errors = errors;
  return pp;
}

PagedCapacity paged_capacity_of(const PagedPlan& plan, int32_t splits) {
  PagedCapacity cap;
  cap.requests = static_cast<int64_t>(plan.requests.size());
  cap.items = static_cast<int64_t>(plan.tables.items.size());
  cap.spans = static_cast<int64_t>(plan.tables.spans.size());
  cap.entries = static_cast<int64_t>(plan.tables.tile_entries.size());
  cap.splits = splits;
  return cap;
}

PagedWorkspace paged_workspace(const PagedCapacity& cap, int32_t tile_q, int64_t head_dim_v) {
  // The kernels index the tables with 32-bit counts, and the sizes below must not wrap: a capacity
  // past them is a mistake, named before any byte is laid out.
  for (const auto& [name, n] : {std::pair<const char*, int64_t>{"requests", cap.requests}, {"items", cap.items},
                                {"spans", cap.spans}, {"entries", cap.entries}})
    if (n < 0 || n > INT32_MAX)
      throw UserError(std::string("PagedCapacity.") + name,
                      "is " + std::to_string(n) + "; expected 0 to 2^31 - 1 (size it with needs(call))");
  if (cap.splits < 1 || cap.splits > 64)
    throw UserError("PagedCapacity.splits", "is " + std::to_string(cap.splits) + "; expected 1 to 64");
  PagedWorkspace w;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t here = at;
    at = (at + bytes + 255) / 256 * 256;
    return here;
  };
  const size_t items = size_t(cap.items), requests = size_t(cap.requests);
  w.header = take(16);
  w.items = take(items * sizeof(DeviceItem));
  w.spans = take(size_t(cap.spans) * sizeof(DeviceSpan));
  w.entries = take(size_t(cap.entries) * 4);
  w.item_request = take(items * 4);
  w.item_heads = take(items * 4);
  w.q_start = take(requests * 8);
  w.q_pos = take(requests * 8);
  w.tables_bytes = at;
  // The partial buffers only where blocks share items (one split writes O itself).
  const size_t rows = cap.splits > 1 ? items * size_t(cap.splits) * size_t(tile_q) : 0;
  w.part_o = take(rows * size_t(head_dim_v) * 4);
  w.part_lse = take(rows * 4);
  w.total = at;
  return w;
}

std::vector<uint8_t> pack_paged_workspace(const PagedPlan& plan, int32_t splits, const PagedCapacity& cap,
                                          const PagedWorkspace& w) {
  const DevicePlan d = pack_plan(plan.tables);
  for (const auto& [name, need, have] : {std::tuple<const char*, size_t, int64_t>{"requests", plan.requests.size(), cap.requests},
                                         {"items", d.items.size(), cap.items}, {"spans", d.spans.size(), cap.spans},
                                         {"entries", d.entries.size(), cap.entries}, {"splits", size_t(splits), cap.splits}}) {
    if (int64_t(need) > have)
      throw UserError(std::string("PagedCapacity.") + name, "the step's plan needs " + std::to_string(need) +
                                                                 ", the workspace holds " + std::to_string(have) +
                                                                 "; size it from needs() at the largest batch and lengths served");
  }
  std::vector<uint8_t> out(w.tables_bytes, 0);
  auto put = [&](size_t offset, const auto& vec) {
    if (!vec.empty()) std::memcpy(out.data() + offset, vec.data(), vec.size() * sizeof(vec[0]));
  };
  const int32_t header[4] = {static_cast<int32_t>(d.items.size()), splits, 0, 0};
  std::memcpy(out.data() + w.header, header, sizeof header);
  put(w.items, d.items);
  put(w.spans, d.spans);
  put(w.entries, d.entries);
  put(w.item_request, plan.item_request);
  put(w.item_heads, plan.item_heads);
  put(w.q_start, plan.q_start);
  put(w.q_pos, plan.q_pos);
  return out;
}

PagedTables paged_workspace_tables(void* base, const PagedWorkspace& w) {
  auto at = [&](size_t offset) { return static_cast<void*>(static_cast<char*>(base) + offset); };
  PagedTables t;
  t.items = static_cast<const DeviceItem*>(at(w.items));
  t.spans = static_cast<const DeviceSpan*>(at(w.spans));
  t.entries = static_cast<const int32_t*>(at(w.entries));
  t.item_request = static_cast<const int32_t*>(at(w.item_request));
  t.item_heads = static_cast<const int32_t*>(at(w.item_heads));
  t.q_start = static_cast<const int64_t*>(at(w.q_start));
  t.q_pos = static_cast<const int64_t*>(at(w.q_pos));
  t.part_o = static_cast<float*>(at(w.part_o));
  t.part_lse = static_cast<float*>(at(w.part_lse));
  t.header = static_cast<const int32_t*>(at(w.header));
  return t;
}

void set_device_planning(AjPagedParams& pp, const DevicePlanning& d, const PagedCapacity& cap, int64_t total_q) {
  pp.dev_kv_lens = d.kv_lens;
  pp.dev_cu_seqlens_q = d.cu_seqlens_q;
  pp.requests = static_cast<int32_t>(d.requests);
  pp.total_q = static_cast<int32_t>(total_q);
  pp.cap_items = static_cast<int32_t>(cap.items);
  pp.cap_splits = cap.splits;
  pp.target_blocks = static_cast<int32_t>(std::min<int64_t>(d.target_blocks, 1 << 30));
  pp.fixed_splits = d.fixed_splits;
  pp.fwd.seek_branches = d.seek_branches;
}

PagedCapacity device_planned_capacity(const std::vector<PagedHeadClass>& classes, int64_t branches, int32_t tile_q,
                                      int64_t requests, int64_t total_q, int32_t splits, int64_t target_blocks) {
  int64_t fewest = 0;  // items when every run is as long as a class's items allow
  for (const PagedHeadClass& c : classes) {
    const int64_t rows = std::max<int64_t>(1, tile_q / c.heads);
    fewest += (total_q + rows - 1) / rows;
  }
  PagedCapacity cap;
  cap.requests = requests;
  cap.items = total_q * static_cast<int64_t>(classes.size());
  cap.spans = cap.items * branches;
  cap.entries = 0;
  cap.splits = splits > 0 ? splits
                          : static_cast<int32_t>(std::clamp<int64_t>((target_blocks + std::max<int64_t>(fewest, 1) - 1) /
                                                                         std::max<int64_t>(fewest, 1), 1, 64));
  return cap;
}

BatchGrid batch_grid(int64_t batch) {
  constexpr int64_t kMaxY = 65535;  // AJ_GRID_Y_MAX
  return {static_cast<unsigned>(std::min(batch, kMaxY)), static_cast<unsigned>((batch + kMaxY - 1) / kMaxY)};
}

LaunchGrid item_grid(int64_t items, int64_t batch, bool persistent, int persistent_blocks, int64_t sms) {
  if (!persistent) {
    const BatchGrid b = batch_grid(batch);
    return {static_cast<unsigned>(items), b.y, b.z};
  }
  const int64_t units = items * batch, most = persistent_blocks < 0 ? sms : int64_t{persistent_blocks};
  if (units > int64_t{INT32_MAX}) {  // the persistent backward's consumers count units in 32 bits
    throw UserError("RuntimeOptions.persistent_blocks",
                    "a persistent launch holds " + std::to_string(units) + " work units (items x batch entries), more than 2^31 - 1; "
                    "set persistent_blocks to 0 (ATTNJIT_PERSISTENT=0) for this call, or split the batch");
  }
  return {static_cast<unsigned>(std::max<int64_t>(1, std::min(units, most))), 1, 1};
}

BackwardGrids backward_grids(const Problem& pb, const BackwardKernels& k, size_t items, const BackwardPlan& key_major,
                             bool deterministic, bool add) {
  const uint64_t aux = static_cast<uint64_t>(k.aux_threads);
  BackwardGrids g;
  g.single_pass = k.single_pass && !deterministic && knobs().bwd_single_pass;
  g.pre = add ? 0 : (static_cast<uint64_t>(pb.seq_q * pb.heads_q) + aux - 1) / aux;
  g.dq = g.single_pass ? 0 : items;
  g.direct_dkdv = key_major.keys_cover_all && !add;
  const int64_t cvt_elems = add ? 0
                                : (g.direct_dkdv ? 0 : pb.batch * pb.seq_k * pb.heads_kv * (pb.head_dim + pb.head_dim_v)) +
                                      (g.single_pass ? pb.batch * pb.seq_q * pb.heads_q * pb.head_dim : 0);
  g.cvt = (static_cast<uint64_t>(cvt_elems) + aux - 1) / aux;
  if (key_major.keys_disjoint || deterministic) {
    for (size_t l = 0; l + 1 < key_major.layers.size(); ++l) {
      g.dkdv.push_back({static_cast<int32_t>(key_major.layers[l]),
                        static_cast<uint64_t>(key_major.layers[l + 1] - key_major.layers[l]), g.direct_dkdv ? 2 : 1});
    }
  } else if (!key_major.items.empty()) {
    g.dkdv.push_back({0, key_major.items.size(), 0});
  }
  return g;
}

KernelBwdParams backward_params(const Plan& plan, const Problem& pb, const KernelTables& t, const BackwardTables& bt,
                                const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                                const TensorView& lse, const TensorView& dout, const TensorView& dq, const TensorView& dk,
                                const TensorView& dv, const ForwardOptions& options) {
  KernelBwdParams bp{};
  bp.fwd = kernel_params(plan, pb, t, q, k, v, o, &lse, options);
  bp.dout = dout.data, bp.dq = dq.data, bp.dk = dk.data, bp.dv = dv.data;
  bp.delta = bt.delta, bp.dk_acc = bt.dk_acc, bp.dv_acc = bt.dv_acc;
  bp.dq_acc = bt.dq_acc;
  if (options.dlse) {
    bp.dlse = static_cast<const float*>(options.dlse->data);
    bp.dlse_batch_stride = options.dlse->strides[0], bp.dlse_head_stride = options.dlse->strides[1];
  }
  bp.key_items = bt.key_items, bp.query_entries = bt.query_entries;
  bp.do_batch_stride = dout.strides[0], bp.do_row_stride = dout.strides[1], bp.do_head_stride = dout.strides[2];
  bp.dq_batch_stride = dq.strides[0], bp.dq_row_stride = dq.strides[1], bp.dq_head_stride = dq.strides[2];
  bp.dk_batch_stride = dk.strides[0], bp.dk_row_stride = dk.strides[1], bp.dk_head_stride = dk.strides[2];
  bp.dv_batch_stride = dv.strides[0], bp.dv_row_stride = dv.strides[1], bp.dv_head_stride = dv.strides[2];
  bp.batch = pb.batch, bp.seq_q = pb.seq_q, bp.seq_k = pb.seq_k;
  bp.heads_q = static_cast<int32_t>(pb.heads_q), bp.heads_kv = static_cast<int32_t>(pb.heads_kv);
  bp.scale = static_cast<float>(plan.softmax_scale);
  bp.num_key_items = bt.num_key_items;
  return bp;
}

}  // namespace attnjit
