// The forward plan transposed into the key-major plan of the backward pass (see the header).
#include "compiler/plan/plan_backward.hpp"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include "compiler/support/error.hpp"

namespace attnjit {

BackwardPlan lower_to_backward_plan(const Plan& fwd) {
  // A query entry carries no key weights: transposing a packed plan would drop them.
  ATTNJIT_CHECK(!fwd.packed(), "the key-major plan is made from a plan lowered BranchPacking::Separate");
  // One query entry (32 bytes on the device, more on the host) per visited tile of the forward.
  // A layout the kernels decide visits every tile its band allows: at a million tokens without a
  // band that is billions of entries, refused here rather than allocated.
  const int64_t entries = fwd.stats.full_tiles + fwd.stats.partial_tiles;
  if (entries > kMaxBackwardEntries) {
    throw UserError("backward", "the key-major plan would list " + std::to_string(entries) +
                                    " (query tile, key tile) pairs, over the limit of " + std::to_string(kMaxBackwardEntries) +
                                    (fwd.kernel_seeks ? "; its random or device-table layouts are decided in the kernels, which "
                                                        "visit every tile their band allows: a causal or window band, or a "
                                                        "shorter sequence, keeps the backward within it"
                                                      : "; a shorter sequence or a sparser pattern keeps the backward within it"));
  }
  BackwardPlan out;
  out.shape = fwd.shape;
  out.tiles = fwd.tiles;
  out.softmax_scale = fwd.softmax_scale;
  out.output_scale = fwd.output_scale;
  const Shape& s = fwd.shape;
  const int64_t group = s.heads_q / s.heads_kv;
  // Key tiles are identified by their kv head and row map; buckets keep the order of discovery.
  std::map<std::tuple<int32_t, int64_t, int64_t, int64_t>, size_t> index;
  std::vector<KeyItem> items;
  std::vector<std::vector<QueryEntry>> buckets;
  for (const WorkItem& item : fwd.items) {
    const int32_t kvh = static_cast<int32_t>(item.head / group);
    for (int64_t sp = item.span_begin; sp < item.span_end; ++sp) {
      const KeySpan& span = fwd.spans[static_cast<size_t>(sp)];
      for_each_planned_tile(fwd, span, [&](int32_t t, bool full) {
        const RowMap keys = tile_keys(span, t, fwd.tiles.tile_k);
        const auto key = std::make_tuple(kvh, keys.start, keys.stride, keys.count);
        auto [it, fresh] = index.emplace(key, items.size());
        if (fresh) {
          KeyItem k;
          k.kv_head = kvh;
          k.keys = keys;
          items.push_back(k);
          buckets.emplace_back();
        }
        buckets[it->second].push_back(QueryEntry{item.head, span.branch, item.rows, full});
        items[it->second].cost += int64_t{fwd.tiles.tile_q} * fwd.tiles.tile_k;
        ++out.pairs;
      });
    }
  }
  // Heaviest first, ties in order of discovery: the same plan on every machine.
  std::vector<size_t> order(items.size());
  for (size_t n = 0; n < order.size(); ++n) order[n] = n;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return items[a].cost > items[b].cost; });
  // Layers, greedily: each item goes to the first layer none of whose items has one of its key rows.
  std::vector<std::vector<char>> taken;  // per layer: kv_head * seq_k + key row
  std::vector<int> layer_of(items.size());
  for (size_t n : order) {
    const KeyItem& k = items[n];
    size_t layer = 0;
    for (;; ++layer) {
      if (layer == taken.size()) taken.emplace_back(static_cast<size_t>(s.heads_kv * s.seq_k), 0);
      bool free = true;
      for (int64_t c = 0; c < k.keys.count && free; ++c) free = !taken[layer][static_cast<size_t>(k.kv_head * s.seq_k + k.keys.at(c))];
      if (free) break;
    }
    for (int64_t c = 0; c < k.keys.count; ++c) taken[layer][static_cast<size_t>(k.kv_head * s.seq_k + k.keys.at(c))] = 1;
    layer_of[n] = static_cast<int>(layer);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return layer_of[a] < layer_of[b]; });
  for (size_t n : order) {
    if (out.layers.size() <= static_cast<size_t>(layer_of[n])) out.layers.push_back(static_cast<int64_t>(out.items.size()));
    KeyItem k = items[n];
    k.entry_begin = static_cast<int64_t>(out.entries.size());
    out.entries.insert(out.entries.end(), buckets[n].begin(), buckets[n].end());
    k.entry_end = static_cast<int64_t>(out.entries.size());
    out.items.push_back(k);
  }
  out.layers.push_back(static_cast<int64_t>(out.items.size()));
  out.keys_disjoint = out.layers.size() <= 2;
  out.keys_cover_all = out.keys_disjoint && !taken.empty() && std::all_of(taken[0].begin(), taken[0].end(), [](char c) { return c != 0; });
  for (const QueryEntry& e : out.entries)
    if (e.rows.count > 1 && std::find(out.entry_row_strides.begin(), out.entry_row_strides.end(), e.rows.stride) == out.entry_row_strides.end())
      out.entry_row_strides.push_back(e.rows.stride);
  return out;
}

std::string print_backward_plan(const BackwardPlan& plan, int64_t max_items) {
  const Shape& s = plan.shape;
  auto rows = [](const RowMap& m) {
    std::ostringstream os;
    os << m.start << "+" << m.stride << "k,k<" << m.count;
    return os.str();
  };
  std::ostringstream os;
  os << "backward plan (key-major): batch=" << s.batch << " seq_q=" << s.seq_q << " seq_k=" << s.seq_k
     << " heads_q=" << s.heads_q << " heads_kv=" << s.heads_kv << " head_dim=" << s.head_dim
     << " head_dim_v=" << s.head_dim_v << " q_offset=" << s.q_offset << " k_offset=" << s.k_offset << "\n";
  os << "tile: " << plan.tiles.tile_q << "x" << plan.tiles.tile_k << "\n";
  os << "key items: " << plan.items.size() << ", query entries: " << plan.entries.size() << " (= the forward plan's "
     << plan.pairs << " visited tiles)\n";
  os << "key tiles: "
     << (plan.keys_cover_all  ? "disjoint, every key in one (dK, dV stored directly)"
         : plan.keys_disjoint ? "disjoint, some keys in none (dK, dV added once into zeroed fp32)"
                              : "overlapping (dK, dV accumulated)")
     << ", " << plan.layers.size() - 1 << " layer(s) of disjoint key tiles\n";
  const int64_t total = static_cast<int64_t>(plan.items.size());
  const int64_t n = max_items < 0 ? total : std::min(max_items, total);
  os << "items (" << n << " of " << total << ", heaviest first):\n";
  for (int64_t i = 0; i < n; ++i) {
    const KeyItem& k = plan.items[static_cast<size_t>(i)];
    os << "  item " << i << ": kv_head=" << k.kv_head << " keys=" << rows(k.keys) << " cost=" << k.cost << "\n";
    for (int64_t e = k.entry_begin; e < k.entry_end; ++e) {
      const QueryEntry& q = plan.entries[static_cast<size_t>(e)];
      os << "    query head=" << q.head << " branch=" << q.branch << " rows=" << rows(q.rows) << (q.full ? " full" : " partial")
         << "\n";
    }
  }
  return os.str();
}

}  // namespace attnjit
