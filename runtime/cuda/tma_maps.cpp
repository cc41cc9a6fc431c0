#include "runtime/cuda/tma_maps.hpp"

#include <algorithm>

#include "runtime/cuda/cuda_driver.hpp"

namespace attnjit {
namespace {

constexpr int64_t kMaxElementStride = 8;

// Dilated rows a box of stride r brings: the most that divide tile_k, are a multiple of 8 (each box
// lands on a 1024-byte boundary, as the 128-byte swizzle needs) and span r x rows <= 256 rows. For
// tiles of 64 and 128 keys a power of two; a 176-key tile takes boxes of 88 or 16 rows.
int32_t rows_per_box(int64_t r, int tile_k) {
  for (int32_t rows = tile_k; rows >= 8; --rows)
    if (tile_k % rows == 0 && rows % 8 == 0 && rows * r <= 256) return rows;
  return 8;
}

// The fold of a stride above 8: the least f dividing both r and seq_k with r / f <= 8 (0: none).
// Row first + i r = (first mod f) + f (first / f + i r / f): with the rows folded by f, a tile's
// rows are one fold's, every (r / f)-th, which TMA's element stride reaches.
int64_t fold_for(int64_t r, int64_t seq) {
  for (int64_t f = (r + kMaxElementStride - 1) / kMaxElementStride; f <= r; ++f)
    if (r % f == 0 && seq % f == 0) return f;
  return 0;
}

// One tensor's map for row stride r (key rows, or the backward's query rows), boxes of 64 columns (one 128-byte swizzled column block) and
// one head and batch entry. Up to stride 8, dimensions (innermost first) head dim, head, row,
// batch, the row traversed with element stride r (fold f = 0); beyond, head dim, head, row mod f,
// row / f, batch (f = fold_for(r, seq_k)), the fourth traversed with element stride r / f.
emu::TensorMapSpec map_for(const TensorView& t, const Problem& pb, int64_t heads, int64_t dim, int64_t r, int64_t f,
                           int tile_k) {
  emu::TensorMapSpec s;
  s.type = pb.dtype == DType::F16 ? emu::TensorMapType::F16 : emu::TensorMapType::BF16;
  s.address = reinterpret_cast<uintptr_t>(t.data);
  const int64_t eb = 2, batch = t.shape[0], seq = t.shape[1];
  // A dimension of size 1 never moves: any valid stride will do (the tensor's may be anything).
  auto stride = [&](int64_t size, int64_t elements) { return uint64_t(size == 1 ? 16 : elements * eb); };
  s.swizzle = 128;
  if (f == 0) {
    s.rank = 4;
    s.dims = {uint64_t(dim), uint64_t(heads), uint64_t(seq), uint64_t(batch)};
    s.strides = {0, stride(heads, t.strides[2]), stride(seq, t.strides[1]), stride(batch, t.strides[0])};
    s.box = {64, 1, uint32_t(rows_per_box(r, tile_k) * r), 1};
    s.element_strides = {1, 1, uint32_t(r), 1, 1};
    return s;
  }
  const int64_t e = r / f;
  s.rank = 5;
  s.dims = {uint64_t(dim), uint64_t(heads), uint64_t(f), uint64_t(seq / f), uint64_t(batch)};
  s.strides = {0, stride(heads, t.strides[2]), stride(f, t.strides[1]), stride(seq / f, f * t.strides[1]),
               stride(batch, t.strides[0])};
  s.box = {64, 1, 1, uint32_t(rows_per_box(e, tile_k) * e), 1};
  s.element_strides = {1, 1, 1, uint32_t(e), 1};
  return s;
}

}  // namespace

namespace {

// The specs for rows of the given strides (in order of first use) of tensors a and b (heads,
// head dims da and db; b may be absent: no v maps), tiles of `tile` rows along a sequence of `seq`
// rows.
std::optional<TmaMapSpecs> specs_for(const std::vector<int64_t>& row_strides, const char* rows, const char* seq_name, const Problem& pb,
                                     const TensorView& a, const TensorView* b, int64_t heads, int64_t da, int64_t db, int64_t seq,
                                     int tile, std::string* why) {
  auto refuse = [&](const std::string& reason) -> std::optional<TmaMapSpecs> {
    if (why) *why = reason;
    return std::nullopt;
  };
  TmaMapSpecs out;
  for (const int64_t r : row_strides) {  // the kernel picks a tile's map by its stride, whatever the count
    if (std::find(out.strides, out.strides + out.used, r) != out.strides + out.used) continue;
    if (r < 1) return refuse(std::string("a ") + rows + " stride of " + std::to_string(r));
    if (out.used == kTmaMaps) return refuse("more than " + std::to_string(kTmaMaps) + " " + rows + " strides");
    const int64_t f = r <= kMaxElementStride ? 0 : fold_for(r, seq);
    if (r > kMaxElementStride && f == 0)
      return refuse(std::string(rows) + " stride " + std::to_string(r) + " (above 8) has no divisor f of " + seq_name + " " +
                    std::to_string(seq) + " with stride / f <= 8 (TMA's element strides end at 8)");
    out.rows[out.used] = rows_per_box(f ? r / f : r, tile);
    out.fold[out.used] = int32_t(f);
    out.strides[out.used++] = r;
  }
  if (out.used == 0) out.strides[0] = 1, out.rows[0] = tile, out.used = 1;
  for (int i = 0; i < out.used; ++i) {
    out.k[i] = map_for(a, pb, heads, da, out.strides[i], out.fold[i], tile);
    if (const std::string p = emu::tensor_map_problem(out.k[i]); !p.empty()) return refuse(p);
    if (!b) continue;
    out.v[i] = map_for(*b, pb, heads, db, out.strides[i], out.fold[i], tile);
    if (const std::string p = emu::tensor_map_problem(out.v[i]); !p.empty()) return refuse(p);
  }
  return out;
}

}  // namespace

std::optional<TmaMapSpecs> tma_map_specs(const Plan& plan, const Problem& pb, const TensorView& k, const TensorView& v, int tile_k,
                                         std::string* why) {
  std::vector<int64_t> strides;
  strides.reserve(plan.spans.size());
  for (const KeySpan& s : plan.spans) strides.push_back(s.keys.stride);
  return specs_for(strides, "key", "seq_k", pb, k, &v, pb.heads_kv, pb.head_dim, pb.head_dim_v, pb.seq_k, tile_k, why);
}

namespace {

// The row strides of the plan's items of more than one row: a one-row item's stride is whatever
// its rows' spacing was and takes no map (as the backward's one-row entries).
std::vector<int64_t> item_row_strides(const Plan& plan) {
  std::vector<int64_t> strides;
  for (const WorkItem& it : plan.items)
    if (it.rows.count > 1 && std::find(strides.begin(), strides.end(), it.rows.stride) == strides.end())
      strides.push_back(it.rows.stride);
  return strides;
}

}  // namespace

std::optional<TmaMapSpecs> query_tma_map_specs(const Plan& plan, const Problem& pb, const TensorView& q, int tile_q,
                                               std::string* why) {
  return specs_for(item_row_strides(plan), "query", "seq_q", pb, q, nullptr, pb.heads_q, pb.head_dim, 0, pb.seq_q, tile_q, why);
}

std::optional<TmaMapSpecs> output_tma_map_specs(const Plan& plan, const Problem& pb, const TensorView& o, int rows,
                                                std::string* why) {
  return specs_for(item_row_strides(plan), "query", "seq_q", pb, o, nullptr, pb.heads_q, pb.head_dim_v, 0, pb.seq_q, rows, why);
}

std::optional<TmaForwardSpecs> forward_tma_map_specs(const Plan& plan, const Problem& pb, const TensorView& q, const TensorView& k,
                                                     const TensorView& v, const TensorView* o, int tile_q, int tile_k,
                                                     std::string* why) {
  auto kv = tma_map_specs(plan, pb, k, v, tile_k, why);
  if (!kv) return std::nullopt;
  auto qs = query_tma_map_specs(plan, pb, q, tile_q, why);
  if (!qs) return std::nullopt;
  TmaForwardSpecs out{*kv, *qs, std::nullopt};
  if (o) {
    out.o = output_tma_map_specs(plan, pb, *o, std::min(tile_q, 64), why);  // a warpgroup's rows (AJ_WG_ROWS)
    if (!out.o) return std::nullopt;
  }
  return out;
}

std::optional<TmaMapSpecs> backward_tma_map_specs(const BackwardPlan& key_major, const Problem& pb, const TensorView& q,
                                                  const TensorView& dout, int tile_q, std::string* why) {
  // An entry of one row reads it right through any map (row `first` is the box's first), so its
  // stride, which the key-major plan leaves as whatever the rows' spacing was, takes none: the
  // plan's entry_row_strides leave them out.
  return specs_for(key_major.entry_row_strides, "query", "seq_q", pb, q, &dout, pb.heads_q, pb.head_dim, pb.head_dim_v, pb.seq_q,
                   tile_q, why);
}

namespace {

emu::TensorMapBytes encode(const emu::TensorMapSpec& m, bool emulated) {
  return emulated ? emu::encode_emulated_tensor_map(m) : encode_tensor_map(m);
}
void rows_of(const TmaMapSpecs& s, TmaRows& out) {
  for (int i = 0; i < s.used; ++i) out.stride[i] = s.strides[i], out.rows[i] = s.rows[i], out.fold[i] = s.fold[i];
}

}  // namespace

TmaMaps encode_tma_maps(const TmaMapSpecs& specs, bool emulated, const TmaMapSpecs* query) {
  TmaMaps maps{};
  for (int i = 0; i < specs.used; ++i) maps.k[i] = encode(specs.k[i], emulated), maps.v[i] = encode(specs.v[i], emulated);
  rows_of(specs, maps.kv);
  if (query) {
    for (int i = 0; i < query->used; ++i) maps.q[i] = encode(query->k[i], emulated);
    rows_of(*query, maps.qr);
  }
  return maps;  // unused entries: stride 0, never chosen (a tile's stride is at least 1)
}

TmaForwardMaps encode_forward_tma_maps(const TmaForwardSpecs& specs, bool emulated) {
  TmaForwardMaps maps{};
  maps.in = encode_tma_maps(specs.kv, emulated, &specs.q);
  if (specs.o) {
    for (int i = 0; i < specs.o->used; ++i) maps.o[i] = encode(specs.o->k[i], emulated);
    rows_of(*specs.o, maps.orows);
  }
  return maps;
}

}  // namespace attnjit
