// The Plan: what the GPU will compute for one (Pattern, Shape, tile size), as plain data that a
// kernel (or the CPU plan executor) walks. docs/architecture.md, "Plan".
//
// Dilation is addressing: a query tile is an affine map of query rows (start + k*stride), and a
// key span is an affine map of key rows cut into tiles of tile_k keys. Nothing is copied.
//
// Under the softmax combine every query tile holds rows that take part in the same set of
// branches and share each branch's key list, so one online softmax runs over the spans of all
// its branches and no merge pass is needed. Rows are grouped per "cell" (an interval inside one
// segment of every branch) by residue modulo L = lcm(dilations): within a cell a row's branch
// set and its key lists depend only on that residue. Residue classes with the same branch set
// are merged when their union is again an arithmetic progression (e.g. all odd rows), which
// keeps tiles full. The alternative, one pass per branch plus an LSE merge, computes the same
// number of pairs for the example patterns but adds a partial-output buffer per branch and a
// merge launch; bench/plan_bench measures the waste this strategy leaves (docs/plan.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compiler/pattern/mask.hpp"
#include "compiler/pattern/pattern.hpp"

namespace attnjit {

struct TileConfig {
  int32_t tile_q = 64;
  int32_t tile_k = 64;
};

// Rows start, start + stride, ..., start + (count - 1) * stride (local row indices).
struct RowMap {
  int64_t start = 0;
  int64_t stride = 1;
  int64_t count = 0;
  int64_t at(int64_t k) const { return start + k * stride; }
};

// One visited key tile of a span that is listed explicitly (spans with a layout).
struct TileEntry {
  int32_t tile = 0;  // index of the tile within its span
  bool full = false;
};

// The keys one branch offers a query tile, cut into tiles of tile_k keys. Without a layout the
// visited tiles are the range [tile_begin, tile_end) and those in [full_begin, full_end) need no
// mask; with a layout (or a dynamic table) the visited tiles are listed in
// Plan::tile_entries[entry_begin, entry_end).
struct KeySpan {
  RowMap keys;
  int32_t branch = 0;
  int32_t tile_begin = 0, tile_end = 0;
  int32_t full_begin = 0, full_end = 0;
  int64_t entry_begin = -1, entry_end = -1;  // -1: no list, use the ranges
  // Packed plans (BranchPacking::Packed): key c of the span (keys.at(c)) stands for
  // Plan::key_weights[weight_begin + c] branches: its term of the softmax counts w times (w exp(s));
  // -1: every key stands for its own branch alone (weight 1).
  int64_t weight_begin = -1;
  bool listed() const { return entry_begin >= 0; }
  bool weighted() const { return weight_begin >= 0; }
};

// One query tile of one head: its rows, and the spans to visit (a range of Plan::spans, shared
// between query tiles whose key lists are the same). An item with no spans writes O = 0 and
// LSE = -inf for its rows.
struct WorkItem {
  int32_t head = 0;
  RowMap rows;
  int64_t span_begin = 0, span_end = 0;
  int64_t cost = 0;  // computed pairs (tile_q * tile_k per visited tile), for scheduling
};

struct PlanStats {
  int64_t attended_pairs = 0;      // pairs the pattern attends (with multiplicity), batch 1
  int64_t computed_pairs = 0;      // tile_q * tile_k per visited tile, batch 1: what the hardware computes
  int64_t computed_real_pairs = 0; // rows * keys actually present in visited tiles
  int64_t work_items = 0, empty_items = 0;
  int64_t full_tiles = 0, partial_tiles = 0;
  int64_t spans = 0, tile_entries = 0;
  int64_t table_bytes = 0;         // bytes of items, spans, tile entries and key weights
  int64_t packed_tiles = 0;        // packed plans: key tiles not visited because another branch's visit covers them
  int64_t weighted_tiles = 0;      // packed plans: visited tiles whose keys carry weights (an add per score)
  double waste() const { return attended_pairs ? double(computed_pairs) / double(attended_pairs) : 0.0; }
};

struct Plan {
  Shape shape;
  TileConfig tiles;
  Combine combine = Combine::Softmax;
  double output_scale = 1.0;  // head_groups with group_scale "mean": 1 / groups
  double softmax_scale = 1.0;
  std::vector<WorkItem> items;  // heaviest first
  std::vector<KeySpan> spans;
  std::vector<TileEntry> tile_entries;
  PlanStats stats;
  // Packed documents: their cu_seqlens, and for every row the row where its document starts (a
  // mask on a partial tile sees position row - doc_base[row]). Empty without documents.
  std::vector<int64_t> documents;
  std::vector<int64_t> doc_base;
  // Bit b: branch b's layout is decided by the kernels, not by the plan (a dynamic table that
  // stays on the device, random layouts lowered RandomLayouts::InKernel). Such a branch's spans
  // are planned as if it had no layout: every tile its band allows is visited (range form), and
  // a tile's full flag speaks for the band only. The kernels seek through the layout themselves
  // (templates/mask_lib.cuh) and take a tile whole only where the layout keeps it whole; the CPU
  // paths mask every such tile (for_each_visited_tile).
  uint64_t kernel_seeks = 0;
  bool kernel_seeks_branch(int32_t b) const { return (kernel_seeks >> b & 1) != 0; }
  // Packed plans: the multiplicities their weighted spans point into (KeySpan::weight_begin), one
  // byte per key of such a span, identical runs shared, each starting at an even offset. Empty in a
  // plan lowered Separate.
  std::vector<uint8_t> key_weights;
  bool packed() const { return !key_weights.empty(); }
};

inline int64_t span_tile_count(const Plan& plan, const KeySpan& s) {
  return s.listed() ? s.entry_end - s.entry_begin : s.tile_end - s.tile_begin;
}

// The keys of tile `t` of a span (local key rows).
inline RowMap tile_keys(const KeySpan& s, int32_t t, int32_t tile_k) {
  const int64_t from = int64_t{t} * tile_k;
  return RowMap{s.keys.at(from), s.keys.stride, std::min<int64_t>(tile_k, s.keys.count - from)};
}

// Calls f(tile, full) for each visited tile of a span, in increasing tile order, with the flags
// as the plan holds them (the kernels' view: for a branch the kernels seek through, full as far as
// the band goes).
template <typename F>
void for_each_planned_tile(const Plan& plan, const KeySpan& s, F&& f) {
  if (s.listed()) {
    for (int64_t e = s.entry_begin; e < s.entry_end; ++e) f(plan.tile_entries[static_cast<size_t>(e)].tile, plan.tile_entries[static_cast<size_t>(e)].full);
  } else {
    for (int32_t t = s.tile_begin; t < s.tile_end; ++t) f(t, t >= s.full_begin && t < s.full_end);
  }
}

// The same with `full` meaning "every pair attended" (what the CPU paths need): a tile of a branch
// the kernels seek through is never full here.
template <typename F>
void for_each_visited_tile(const Plan& plan, const KeySpan& s, F&& f) {
  const bool seek = plan.kernel_seeks_branch(s.branch);
  for_each_planned_tile(plan, s, [&](int32_t t, bool full) { f(t, full && !seek); });
}

// What a lowering does with a pair of positions that several branches attend, as LongNet's do (a
// dense branch of segment w and a dilated one of segment 2w share every second key of the first
// w). Under the softmax combine such a pair is one term per branch in the one softmax, so
// computing it once with its score raised by ln(branches) gives the same output and LSE.
//   Separate: every branch's span visits its tiles (each such pair computed once per branch).
//   Packed: a key tile of a span is left out when every key in it lies in a tile that a denser
//     span of the same band (causal flag and window; no layout on either) keeps for the same
//     rows; the keeping span's keys then carry the multiplicity (KeySpan::weight_begin). Spans
//     may be split (one span per kept range of tiles). Only the softmax combine packs; layouts,
//     tables and the kernels' seeks are never packed.
// The forward takes either. A packed plan's key-major transpose would need the weights in the
// backward too: the backward lowers Separate.
enum class BranchPacking { Separate, Packed };
// Can a packed plan of `p` leave anything out (two branches of one band, neither with a layout,
// under the softmax combine)? Only then do the forward kernels carry the key weights (AJ_KEY_WEIGHTS),
// and only then does lowering Packed differ from Separate.
bool branches_may_pack(const Pattern& p);

// Who decides a random layout's blocks: the plan (each kept block listed: a hash per head, query
// block and key block, 1 G of them for BigBird at a million tokens) or the kernels (Plan::kernel_seeks).
enum class RandomLayouts { InPlan, InKernel };

// Hashes a plan of the pattern's random layouts would take: heads_q x query blocks x key blocks
// over every random node of every branch (0 without random layouts). The runtime lowers random
// layouts InKernel above a threshold (RuntimeOptions::random_in_kernel_above).
int64_t random_layout_hashes(const Pattern& p, const Shape& s);

// Lowers a pattern for one shape and tile size. `dynamic` is required iff the pattern has a
// dynamic layout; it is validated here (the every-block stand-in: a table the kernels read on the
// device, not planned from). `documents` (cu_seqlens): packed documents, each lowered as a call of
// its own (mask.hpp, check_documents). Throws UserError on a bad shape, tile, table or cu_seqlens.
Plan lower_to_plan(const Pattern& p, const Shape& s, const TileConfig& tiles, const DynamicLayout* dynamic = nullptr,
                   const std::vector<int64_t>* documents = nullptr, RandomLayouts random = RandomLayouts::InPlan,
                   BranchPacking packing = BranchPacking::Separate);

// The key rows a plan attends: uint8 [heads_kv * seq_k], 1 where some query head reading that kv
// head attends the key in a visited tile (full tiles whole, partial tiles asked per pair, as the
// kernels' masks are), i.e. exactly the keys the pattern attends. `p` and `dynamic` are what the
// plan was lowered from. Ring attention sends only these rows of a K/V shard
// (python/attnjit/distributed.py).
std::vector<uint8_t> plan_key_rows(const Plan& plan, const Pattern& p, const DynamicLayout* dynamic = nullptr);

// The query rows a plan computes: uint8 [heads_q * seq_q], 1 for the rows of work items that visit
// a tile (a superset of the rows that attend a key, and it depends on the tiles); every other row
// comes out as O = 0, LSE = -inf.
std::vector<uint8_t> plan_query_rows(const Plan& plan);

// The query rows that attend a key by the plan: uint8 [heads_q * seq_q], 1 where a visited tile
// holds a pair of the row that the pattern attends (full tiles whole, partial tiles asked per pair,
// as plan_key_rows), i.e. exactly the rows the pattern lets attend something. Every plan of the
// call writes these rows whatever its tiles; ring attention merges only these rows of a step.
std::vector<uint8_t> plan_attending_rows(const Plan& plan, const Pattern& p, const DynamicLayout* dynamic = nullptr);

// How many leading work items hold every item that visits a tile: a launch over items [0, n)
// writes exactly the rows plan_query_rows marks and leaves every other row of O and the LSE as it
// was (ForwardOptions::rows_with_work_only). Items are scheduled heaviest first, so the items that
// visit nothing come last and n is usually the count of those that visit something.
int64_t work_item_prefix(const Plan& plan);

// Does the mask of `branch` allow the global positions (qpos, kpos) inside a partial tile? This is
// the per-element predicate a kernel evaluates: causal, window and layout (segments and
// selection are already in the row maps).
bool partial_tile_allows(const Pattern& p, int32_t branch, int32_t head, int64_t qpos, int64_t kpos,
                         const DynamicLayout* dynamic);
// The same for one query row of a partial tile at once: keep[c] = 1 if the pair (qpos, kpos0 + c *
// step) is allowed, else 0, for c < count (step >= 1). The band is two bounds and a layout its kept
// intervals (layout_key_intervals), so a row costs about as much as its intervals, not its keys.
void partial_tile_row(const Pattern& p, int32_t branch, int32_t head, int64_t qpos, int64_t kpos0, int64_t step,
                      int64_t count, const DynamicLayout* dynamic, float* keep);

// Readable text: a summary, then the tables (the first `max_items` work items; all with -1).
std::string print_plan(const Plan& plan, int64_t max_items);
// One comment line: which calls share a plan of pattern `p` made for shape `s` (the runtime keys
// plans by q_offset mod the translation period and q_offset - k_offset), or that it serves its
// offsets only.
std::string print_plan_sharing(const Pattern& p, const Shape& s);

TileConfig parse_tile_config(const std::string& text);  // "64x64"; UserError if malformed

}  // namespace attnjit
