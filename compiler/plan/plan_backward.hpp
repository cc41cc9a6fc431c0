// The key-major plan of the backward pass: for each key tile of each kv head, the query tiles
// (with their row maps and full/partial flags) that attend it. A backward kernel keeps dK and dV of
// one key tile in registers while it walks these entries; dQ is computed over the forward plan.
//
// It is the forward plan transposed: every (query tile, visited key tile) pair of the forward plan
// appears once here, under the key tile with exactly the same row map. Dilation stays addressing
// (key and query tiles are affine row maps). Key tiles of different branches may share key rows
// (a dense branch and a dilated one): `keys_disjoint` says whether any kv head's key tiles
// overlap, and `layers` groups the items into sets whose key tiles do not.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/plan/plan.hpp"

namespace attnjit {

// A query tile that attends a key tile.
struct QueryEntry {
  int32_t head = 0;     // query head (reads the key tile's kv head)
  int32_t branch = 0;
  RowMap rows;          // query rows (count <= tile_q)
  bool full = false;    // every pair attended: no mask
};

// One key tile of one kv head and the query tiles that attend it, entries[entry_begin, entry_end).
struct KeyItem {
  int32_t kv_head = 0;
  RowMap keys;          // key rows (count <= tile_k)
  int64_t entry_begin = 0, entry_end = 0;
  int64_t cost = 0;     // tile_q * tile_k per entry, for scheduling
};

struct BackwardPlan {
  Shape shape;
  TileConfig tiles;
  double softmax_scale = 1.0, output_scale = 1.0;
  // Items come in layers: no two items of one layer share a key row of the same kv head, so a
  // layer's dK/dV can be added without atomics, and layers run in order give bitwise-reproducible
  // sums (the deterministic mode). Layer L is items[layers[L], layers[L + 1]); heaviest first within.
  std::vector<KeyItem> items;
  std::vector<int64_t> layers;  // layer boundaries; {0, items.size()} when the key tiles are disjoint
  std::vector<QueryEntry> entries;
  bool keys_disjoint = true;   // no key row is in two key items of the same kv head (one layer)
  // Disjoint, and every key row of every kv head is in an item: each row of dK and dV is written by
  // exactly one block, so the kernels store them in the storage type (no fp32 workspace to zero,
  // nothing to convert after).
  bool keys_cover_all = false;
  int64_t pairs = 0;           // (query tile, key tile) pairs: the forward plan's visited tiles, summed over heads
  // The distinct row strides of the entries of more than one row, first seen first: what the TMA
  // backward's maps of Q and dO are chosen by, kept here so that a call does not walk every entry
  // (524,288 of them for 16 heads of dense attention at 16K tokens).
  std::vector<int64_t> entry_row_strides;
};

// The most query entries a key-major plan holds (2^28, about 10 GB of host tables).
constexpr int64_t kMaxBackwardEntries = int64_t{1} << 28;

// The key-major plan of a forward plan (same shape, tiles and pattern). UserError when it would
// hold more than kMaxBackwardEntries entries.
BackwardPlan lower_to_backward_plan(const Plan& forward);

// Readable text, as print_plan: a summary, then the first `max_items` key items (all with -1).
std::string print_backward_plan(const BackwardPlan& plan, int64_t max_items);

}  // namespace attnjit
