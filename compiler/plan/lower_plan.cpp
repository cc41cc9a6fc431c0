// Lowering: Pattern + Shape + TileConfig -> Plan. See plan.hpp for the structure and the choice
// of one fused online softmax per query tile.
#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <unordered_map>

#include "compiler/plan/plan.hpp"
#include "compiler/plan/plan_geometry.hpp"
#include "compiler/support/error.hpp"

namespace attnjit {
namespace {

constexpr int64_t kMaxResidues = 4096;  // larger lcm(dilations): rows are grouped one residue at a time
// A packed plan's key weights at most (64 MiB): past it, query tiles are left Separate. Segments
// keep the weights' runs few (identical runs are stored once: 698 KB for examples/longnet.json at
// any length); a pattern without segments can make a run per query tile, as long as the sequence.
constexpr size_t kMaxKeyWeights = size_t{1} << 26;

// Do two branches mask a pair alike beyond segment and selection (causal flag and window)? Only
// such branches pack (BranchPacking).
bool same_band(const Branch& a, const Branch& b) { return a.causal == b.causal && a.window == b.window; }

struct HeadBranch {
  int32_t index;
  const Branch* branch;
  int64_t offset;  // off_b(h)
};

// The global positions selected by a branch in the segment holding `pos`, clipped to [lo, hi).
Prog segment_keys(const HeadBranch& hb, int64_t pos, int64_t lo, int64_t hi) {
  const Branch& b = *hb.branch;
  const int64_t seg = b.segment ? pos / *b.segment * *b.segment : 0;
  const int64_t end = b.segment ? std::min(hi, seg + *b.segment) : hi;
  const int64_t base = seg + hb.offset;
  const int64_t first = base + std::max<int64_t>(0, ceil_div(std::max(lo, seg) - base, b.dilation)) * b.dilation;
  if (first >= end) return Prog{first, b.dilation, 0};
  return Prog{first, b.dilation, (end - 1 - first) / b.dilation + 1};
}

bool selected(const HeadBranch& hb, int64_t pos) {
  const Branch& b = *hb.branch;
  const int64_t seg = b.segment ? pos / *b.segment * *b.segment : 0;
  return (pos - seg) % b.dilation == hb.offset;
}

// Rows of a cell that share a branch set: positions first + k*stride, k < count.
struct RowGroup {
  Prog rows;
  uint64_t branches;  // bit k: the head's k-th active branch (validation allows at most 64 branches)
};

// lcm(a, b), or `cap` when that is smaller: dilations reach 2^62, so the lcm can pass int64.
int64_t capped_lcm(int64_t a, int64_t b, int64_t cap) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a / std::gcd(a, b), b, &out) || out > cap) return cap;
  return out;
}

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t k = 1; k * k <= n; ++k) {
    if (n % k) continue;
    d.push_back(k);
    if (k * k != n) d.push_back(n / k);
  }
  std::sort(d.begin(), d.end());
  return d;
}

class PlanBuilder {
public:
  PlanBuilder(const Pattern& p, const Shape& s, const TileConfig& t, const DynamicLayout* d, RandomLayouts random,
              BranchPacking packing)
      : pattern_(p), shape_(s), tiles_(t), geometry_(p, d, random),
        packing_(branches_may_pack(p) ? packing : BranchPacking::Separate) {}

  uint64_t kernel_seeks() const { return geometry_.kernel_seeks(); }

  void lower_head(int32_t h, Plan& plan) {
    std::vector<HeadBranch> active;
    int64_t lcm = 1;
    for (size_t b = 0; b < pattern_.branches.size(); ++b) {
      if (!branch_has_head(pattern_, b, h, shape_.heads_q)) continue;
      const Branch& br = pattern_.branches[b];
      active.push_back({static_cast<int32_t>(b), &br, branch_offset(br, h, shape_.heads_q)});
      // Capped at 2^31 - 1 >= any cell's row count, where every residue is a row of its own.
      lcm = capped_lcm(lcm, br.dilation, std::numeric_limits<int32_t>::max());
    }
    divisors_of_lcm_ = lcm <= kMaxResidues ? divisors(lcm) : std::vector<int64_t>{};
    const int64_t q0 = shape_.q_offset, q1 = shape_.q_offset + shape_.seq_q;
    for (int64_t pos = q0; pos < q1;) {
      // A cell ends at the next segment boundary of any branch: inside it every branch's
      // segment, and so its key list, is fixed.
      int64_t end = q1;
      for (const HeadBranch& hb : active)
        if (hb.branch->segment) end = std::min(end, (pos / *hb.branch->segment + 1) * *hb.branch->segment);
      for (const RowGroup& g : group_rows(active, pos, end, lcm)) emit_group(h, active, g, plan);
      pos = end;
    }
  }

private:
  // Groups the rows of the cell [c0, c1) by branch set. A row's set depends only on its residue
  // modulo lcm; classes modulo a divisor d of lcm whose residues all share a set become one
  // progression of stride d (coarsest first), the rest stay at stride lcm.
  std::vector<RowGroup> group_rows(const std::vector<HeadBranch>& active, int64_t c0, int64_t c1, int64_t lcm) {
    const int64_t n = c1 - c0;
    auto branch_set = [&](int64_t pos) {
      uint64_t set = 0;
      for (size_t k = 0; k < active.size(); ++k)
        if (selected(active[k], pos)) set |= uint64_t{1} << k;
      return set;
    };
    auto rows_from = [&](int64_t first, int64_t stride) { return Prog{first, stride, (c1 - 1 - first) / stride + 1}; };
    std::vector<RowGroup> groups;
    if (lcm > kMaxResidues || n <= 1) {
      const int64_t stride = std::min(lcm, std::max<int64_t>(n, 1));
      for (int64_t p = c0; p < c0 + std::min(n, lcm); ++p) groups.push_back({rows_from(p, stride), branch_set(p)});
      return groups;
    }
    // Residue r stands for the rows c0 + r, c0 + r + lcm, ... (those with r < n exist).
    const int64_t present = std::min(n, lcm);
    std::vector<uint64_t> sets(static_cast<size_t>(present));
    for (int64_t r = 0; r < present; ++r) sets[static_cast<size_t>(r)] = branch_set(c0 + r);
    std::vector<char> done(static_cast<size_t>(present), 0);
    for (int64_t d : divisors_of_lcm_) {
      for (int64_t c = 0; c < std::min(d, present); ++c) {
        bool whole = true;
        for (int64_t r = c; r < present && whole; r += d)
          whole = !done[static_cast<size_t>(r)] && sets[static_cast<size_t>(r)] == sets[static_cast<size_t>(c)];
        if (!whole) continue;
        for (int64_t r = c; r < present; r += d) done[static_cast<size_t>(r)] = 1;
        groups.push_back({rows_from(c0 + c, std::min(d, n)), sets[static_cast<size_t>(c)]});
      }
    }
    return groups;
  }

  void emit_group(int32_t h, const std::vector<HeadBranch>& active, const RowGroup& g, Plan& plan) {
    const int64_t k0 = shape_.k_offset, k1 = shape_.k_offset + shape_.seq_k;
    keys_.clear();
    bool per_tile = false;  // do the spans depend on the query tile (causal, window, layout)?
    for (int32_t k = 0; k < static_cast<int32_t>(active.size()); ++k) {
      if (!(g.branches >> k & 1)) continue;
      const Prog kp = segment_keys(active[static_cast<size_t>(k)], g.rows.first, k0, k1);
      if (kp.count == 0) continue;
      keys_.emplace_back(&active[static_cast<size_t>(k)], kp);
      const Branch& b = *active[static_cast<size_t>(k)].branch;
      per_tile |= b.causal || !b.window.unbounded() || geometry_.planned_layout(active[static_cast<size_t>(k)].index);
    }
    SpanTotals totals;
    int64_t span_begin = -1, span_end = -1, packed = 0;
    PlanStats& st = plan.stats;
    for (int64_t t = 0; t * tiles_.tile_q < g.rows.count; ++t) {
      WorkItem item;
      item.head = h;
      const Prog q = g.rows.slice(t * tiles_.tile_q, std::min<int64_t>(tiles_.tile_q, g.rows.count - t * tiles_.tile_q));
      item.rows = RowMap{q.first - shape_.q_offset, q.stride, q.count};
      // Query tiles of a group share their spans unless a mask makes them depend on the rows.
      if (per_tile || span_begin < 0) {
        span_begin = static_cast<int64_t>(plan.spans.size());
        for (const auto& [hb, kp] : keys_) geometry_.add_span(h, hb->index, q, kp, tiles_, shape_, plan);
        packed = packing_ == BranchPacking::Packed ? pack_spans(span_begin, plan) : 0;
        span_end = static_cast<int64_t>(plan.spans.size());
        totals = span_totals(plan, span_begin, span_end);
      }
      item.span_begin = span_begin;
      item.span_end = span_end;
      item.cost = totals.visited * tiles_.tile_q * tiles_.tile_k;
      st.full_tiles += totals.full;
      st.partial_tiles += totals.visited - totals.full;
      st.packed_tiles += packed;
      st.weighted_tiles += totals.weighted;
      st.computed_pairs += item.cost;
      st.computed_real_pairs += q.count * totals.keys;
      st.empty_items += span_begin == span_end;
      plan.items.push_back(item);
    }
  }

  // BranchPacking::Packed over the spans [begin, end) of one query tile (plan.hpp). Spans are
  // taken densest first (smallest key stride, then most keys); a tile of span j is left out when
  // one earlier span i of the same band, with no layout, holds every key of the tile in tiles it
  // keeps. Then each of those keys counts one more branch in i's weights. The rows are the same
  // for every span (one query tile), so "i holds the key" means i attends every pair j does: the
  // masks of a band are the same predicate in both, evaluated in i's tile.
  // Returns the number of tiles left out. The answer depends only on the spans' geometry relative to
  // the first one's first key, which repeats from cell to cell and head to head: it is computed once
  // per such geometry and replayed (at a million tokens LongNet has 65,536 query groups and a few
  // dozen geometries).
  int64_t pack_spans(int64_t begin, Plan& plan) {
    const int64_t end = static_cast<int64_t>(plan.spans.size());
    if (end - begin < 2) return 0;
    const int64_t base = plan.spans[static_cast<size_t>(begin)].keys.start;
    std::vector<int64_t> shape;
    for (int64_t s = begin; s < end; ++s) {
      const KeySpan& sp = plan.spans[static_cast<size_t>(s)];
      shape.insert(shape.end(), {sp.keys.start - base, sp.keys.stride, sp.keys.count, sp.branch, sp.tile_begin, sp.tile_end,
                                 sp.full_begin, sp.full_end, sp.entry_begin, sp.entry_end});
    }
    if (const auto it = packed_by_shape_.find(shape); it != packed_by_shape_.end()) {
      plan.spans.resize(static_cast<size_t>(begin));
      for (KeySpan sp : it->second.spans) {
        sp.keys.start += base;
        plan.spans.push_back(sp);
      }
      return it->second.left_out;
    }
    const int64_t left_out = pack_spans_once(begin, plan);
    PackedShape& memo = packed_by_shape_[std::move(shape)];
    memo.left_out = left_out;
    for (size_t s = static_cast<size_t>(begin); s < plan.spans.size(); ++s) {
      memo.spans.push_back(plan.spans[s]);
      memo.spans.back().keys.start -= base;
    }
    return left_out;
  }

  int64_t pack_spans_once(int64_t begin, Plan& plan) {
    const int64_t end = static_cast<int64_t>(plan.spans.size());
    std::vector<int64_t> order;
    for (int64_t s = begin; s < end; ++s) {
      const KeySpan& sp = plan.spans[static_cast<size_t>(s)];
      if (!sp.listed() && !geometry_.planned_layout(sp.branch) && !plan.kernel_seeks_branch(sp.branch) && sp.tile_end > sp.tile_begin)
        order.push_back(s);
    }
    if (order.size() < 2) return 0;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      const KeySpan &x = plan.spans[static_cast<size_t>(a)], &y = plan.spans[static_cast<size_t>(b)];
      return x.keys.stride != y.keys.stride ? x.keys.stride < y.keys.stride : x.keys.count > y.keys.count;
    });
    const int64_t tk = tiles_.tile_k;
    const size_t n = order.size();
    std::vector<std::vector<char>> kept(n);
    std::vector<std::vector<uint8_t>> weights(n);
    int64_t left_out = 0;
    for (size_t j = 0; j < n; ++j) {
      const KeySpan& sj = plan.spans[static_cast<size_t>(order[j])];
      kept[j].assign(static_cast<size_t>(sj.tile_end - sj.tile_begin), 1);
      for (int32_t t = sj.tile_begin; t < sj.tile_end; ++t) {
        const RowMap keys = tile_keys(sj, t, tiles_.tile_k);
        for (size_t i = 0; i < j; ++i) {
          const KeySpan& si = plan.spans[static_cast<size_t>(order[i])];
          if (!same_band(si.branch, sj.branch)) continue;
          // Key keys.at(m) is si's key c0 + m * step; every tile of si it falls in must be kept.
          const int64_t from = keys.start - si.keys.start;
          if (from < 0 || from % si.keys.stride || (keys.count > 1 && keys.stride % si.keys.stride)) continue;
          const int64_t c0 = from / si.keys.stride, step = keys.count > 1 ? keys.stride / si.keys.stride : 1;
          const int64_t c1 = c0 + (keys.count - 1) * step;
          if (c1 >= si.keys.count || c0 / tk < si.tile_begin || c1 / tk >= si.tile_end) continue;
          bool all_kept = true;
          for (int64_t u = c0 / tk; u <= c1 / tk && all_kept; ++u) all_kept = kept[i][static_cast<size_t>(u - si.tile_begin)] != 0;
          std::vector<uint8_t>& w = weights[i];
          if (w.empty()) w.assign(static_cast<size_t>(si.keys.count), 1);
          for (int64_t c = c0; c <= c1 && all_kept; c += step) all_kept = w[static_cast<size_t>(c)] < 255;
          if (!all_kept) continue;
          for (int64_t c = c0; c <= c1; c += step) ++w[static_cast<size_t>(c)];
          kept[j][static_cast<size_t>(t - sj.tile_begin)] = 0;
          ++left_out;
          break;
        }
      }
    }
    if (!left_out) return 0;
    // The weights' runs first: past the budget this query tile stays Separate (spans untouched).
    std::vector<int64_t> run_at(n, -1);
    for (size_t j = 0; j < n; ++j) {
      if (weights[j].empty() || std::none_of(weights[j].begin(), weights[j].end(), [](uint8_t w) { return w > 1; })) continue;
      run_at[j] = intern_weights(weights[j], plan);
      if (run_at[j] < 0) return 0;
    }
    // The spans again, in their order, each cut into its kept runs of tiles.
    std::vector<KeySpan> out;
    for (int64_t s = begin; s < end; ++s) {
      const KeySpan& sp = plan.spans[static_cast<size_t>(s)];
      const size_t j = static_cast<size_t>(std::find(order.begin(), order.end(), s) - order.begin());
      if (j == n) {
        out.push_back(sp);
        continue;
      }
      KeySpan piece = sp;
      piece.weight_begin = run_at[j];
      for (int32_t t = sp.tile_begin; t < sp.tile_end;) {
        if (!kept[j][static_cast<size_t>(t - sp.tile_begin)]) {
          ++t;
          continue;
        }
        int32_t u = t;
        while (u < sp.tile_end && kept[j][static_cast<size_t>(u - sp.tile_begin)]) ++u;
        piece.tile_begin = t, piece.tile_end = u;
        out.push_back(piece);
        t = u;
      }
    }
    plan.spans.resize(static_cast<size_t>(begin));
    plan.spans.insert(plan.spans.end(), out.begin(), out.end());
    return left_out;
  }

  bool same_band(int32_t a, int32_t b) const {
    return attnjit::same_band(pattern_.branches[static_cast<size_t>(a)], pattern_.branches[static_cast<size_t>(b)]);
  }

  // The offset of `w` in plan.key_weights, appended unless the same run is there already; -1 when it
  // would take the weights past kMaxKeyWeights. Runs start at even offsets (a kernel reads a tile's
  // weights two keys at a time, 8-byte aligned).
  int64_t intern_weights(const std::vector<uint8_t>& w, Plan& plan) {
    std::string key(w.begin(), w.end());
    if (const auto it = weight_runs_.find(key); it != weight_runs_.end()) return it->second;
    if (plan.key_weights.size() + w.size() + 1 > kMaxKeyWeights) return -1;
    if (plan.key_weights.size() % 2) plan.key_weights.push_back(1);
    const int64_t at = static_cast<int64_t>(plan.key_weights.size());
    plan.key_weights.insert(plan.key_weights.end(), w.begin(), w.end());
    weight_runs_.emplace(std::move(key), at);
    return at;
  }

  // Visited tiles, full tiles and keys in visited tiles over a range of spans.
  struct SpanTotals {
    int64_t visited = 0, full = 0, keys = 0, weighted = 0;
  };
  SpanTotals span_totals(const Plan& plan, int64_t begin, int64_t end) const {
    SpanTotals t;
    const int64_t tk = tiles_.tile_k;
    for (int64_t s = begin; s < end; ++s) {
      const KeySpan& span = plan.spans[static_cast<size_t>(s)];
      t.visited += span_tile_count(plan, span);
      if (span.weighted()) t.weighted += span_tile_count(plan, span);
      if (span.listed()) {
        for (int64_t e = span.entry_begin; e < span.entry_end; ++e) {
          const TileEntry& te = plan.tile_entries[static_cast<size_t>(e)];
          t.full += te.full;
          t.keys += tile_keys(span, te.tile, tiles_.tile_k).count;
        }
      } else {
        t.full += std::max(0, std::min(span.full_end, span.tile_end) - std::max(span.full_begin, span.tile_begin));
        t.keys += std::min<int64_t>(int64_t{span.tile_end} * tk, span.keys.count) - int64_t{span.tile_begin} * tk;
      }
    }
    return t;
  }

  const Pattern& pattern_;
  const Shape& shape_;
  const TileConfig& tiles_;
  SpanGeometry geometry_;
  BranchPacking packing_;
  std::unordered_map<std::string, int64_t> weight_runs_;  // packed plans: key_weights runs by content
  struct PackedShape {
    std::vector<KeySpan> spans;  // keys.start relative to the first span's
    int64_t left_out = 0;
  };
  std::map<std::vector<int64_t>, PackedShape> packed_by_shape_;  // pack_spans by the spans' relative geometry
  std::vector<int64_t> divisors_of_lcm_;
  std::vector<std::pair<const HeadBranch*, Prog>> keys_;  // reused across groups
};

// Heaviest first, so the last wave of a launch is short; equal costs keep (head, row) order.
// Costs take few distinct values, so a stable bucket placement beats a comparison sort.
void schedule_heavy_first(std::vector<WorkItem>& items) {
  std::unordered_map<int64_t, int64_t> count;
  for (const WorkItem& it : items) ++count[it.cost];
  std::vector<int64_t> costs;
  for (const auto& [c, n] : count) costs.push_back(c);
  std::sort(costs.begin(), costs.end(), std::greater<>());
  std::unordered_map<int64_t, int64_t> next;
  int64_t at = 0;
  for (int64_t c : costs) {
    next[c] = at;
    at += count[c];
  }
  std::vector<WorkItem> sorted(items.size());
  for (const WorkItem& it : items) sorted[static_cast<size_t>(next[it.cost]++)] = it;
  items.swap(sorted);
}

}  // namespace

namespace {

// A plan for shape `s` with no work yet: what every plan states about the call.
Plan empty_plan(const Pattern& p, const Shape& s, const TileConfig& tiles) {
  Plan plan;
  plan.shape = s;
  plan.tiles = tiles;
  plan.combine = p.combine;
  plan.softmax_scale = softmax_scale(p, s);
  if (p.combine == Combine::HeadGroups && p.group_scale == GroupScale::Mean) plan.output_scale = 1.0 / double(p.branches.size());
  return plan;
}

// Packed documents: each document lowered as a call of its own, then moved to its rows (row maps
// and key maps shifted by its start). No tile crosses a document; masks on partial tiles see
// positions within the document through Plan::doc_base.
Plan lower_documents(const Pattern& p, const Shape& s, const TileConfig& tiles, const std::vector<int64_t>& cu,
                     RandomLayouts random, BranchPacking packing) {
  Plan plan = empty_plan(p, s, tiles);
  for (size_t d = 0; d + 1 < cu.size(); ++d) {
    const int64_t start = cu[d], len = cu[d + 1] - cu[d];
    if (len == 0) continue;
    Shape sub = s;
    sub.seq_q = sub.seq_k = len;
    const Plan one = lower_to_plan(p, sub, tiles, nullptr, nullptr, random, packing);
    plan.kernel_seeks |= one.kernel_seeks;
    const int64_t span_base = static_cast<int64_t>(plan.spans.size()), entry_base = static_cast<int64_t>(plan.tile_entries.size());
    if (plan.key_weights.size() % 2) plan.key_weights.push_back(1);  // runs start at even offsets
    const int64_t weight_base = static_cast<int64_t>(plan.key_weights.size());
    for (WorkItem it : one.items) {
      it.rows.start += start;
      it.span_begin += span_base, it.span_end += span_base;
      plan.items.push_back(it);
    }
    for (KeySpan sp : one.spans) {
      sp.keys.start += start;
      if (sp.listed()) sp.entry_begin += entry_base, sp.entry_end += entry_base;
      if (sp.weighted()) sp.weight_begin += weight_base;
      plan.spans.push_back(sp);
    }
    plan.key_weights.insert(plan.key_weights.end(), one.key_weights.begin(), one.key_weights.end());
    plan.tile_entries.insert(plan.tile_entries.end(), one.tile_entries.begin(), one.tile_entries.end());
    PlanStats& st = plan.stats;
    st.computed_pairs += one.stats.computed_pairs;
    st.computed_real_pairs += one.stats.computed_real_pairs;
    st.empty_items += one.stats.empty_items;
    st.full_tiles += one.stats.full_tiles;
    st.partial_tiles += one.stats.partial_tiles;
    st.packed_tiles += one.stats.packed_tiles;
    st.weighted_tiles += one.stats.weighted_tiles;
  }
  plan.documents = cu;
  plan.doc_base.resize(static_cast<size_t>(s.seq_q));
  for (size_t d = 0; d + 1 < cu.size(); ++d)
    std::fill(plan.doc_base.begin() + cu[d], plan.doc_base.begin() + cu[d + 1], cu[d]);
  return plan;
}

void finish_plan(Plan& plan) {
  schedule_heavy_first(plan.items);
  PlanStats& st = plan.stats;
  st.work_items = static_cast<int64_t>(plan.items.size());
  st.spans = static_cast<int64_t>(plan.spans.size());
  st.tile_entries = static_cast<int64_t>(plan.tile_entries.size());
  st.table_bytes = static_cast<int64_t>(plan.items.size() * sizeof(WorkItem) + plan.spans.size() * sizeof(KeySpan) +
                                        plan.tile_entries.size() * sizeof(TileEntry) + plan.key_weights.size());
}

}  // namespace

bool branches_may_pack(const Pattern& p) {
  if (p.combine != Combine::Softmax) return false;
  for (size_t i = 0; i < p.branches.size(); ++i)
    for (size_t j = i + 1; j < p.branches.size(); ++j) {
      const Branch &a = p.branches[i], &b = p.branches[j];
      if (!a.layout && !b.layout && same_band(a, b)) return true;
    }
  return false;
}

int64_t random_layout_hashes(const Pattern& p, const Shape& s) {
  int64_t total = 0;
  auto add = [&](auto&& self, const Layout& l) -> void {
    if (l.kind == Layout::Kind::Random) {
      const int64_t qb = ceil_div(s.q_offset + s.seq_q, l.bq), kb = ceil_div(s.k_offset + s.seq_k, l.bk);
      int64_t n = 0;
      if (__builtin_mul_overflow(s.heads_q, qb, &n) || __builtin_mul_overflow(n, kb, &n) || __builtin_add_overflow(total, n, &total))
        total = std::numeric_limits<int64_t>::max();
    }
    for (const Layout& c : l.children) self(self, c);
  };
  for (const Branch& b : p.branches)
    if (b.layout) add(add, *b.layout);
  return total;
}

Plan lower_to_plan(const Pattern& p, const Shape& s, const TileConfig& tiles, const DynamicLayout* dynamic,
                   const std::vector<int64_t>* documents, RandomLayouts random, BranchPacking packing) {
  check_pattern_fits(p, s);
  if (tiles.tile_q < 1 || tiles.tile_k < 1 || tiles.tile_q > 1024 || tiles.tile_k > 1024) {
    throw UserError("--tile", "tile sizes must lie in [1, 1024], got " + std::to_string(tiles.tile_q) + "x" +
                                  std::to_string(tiles.tile_k));
  }
  if (p.has_dynamic_layout() && !dynamic) {
    throw UserError("dynamic layout", "the pattern has a \"dynamic\" layout; supply its CSR table (CLI: --dynamic FILE)");
  }
  if (documents) {
    check_documents(p, s, *documents, dynamic != nullptr, "cu_seqlens");
    Plan plan = lower_documents(p, s, tiles, *documents, random, packing);
    finish_plan(plan);
    return plan;
  }
  if (dynamic && dynamic->standin == DynamicLayout::Standin::None) check_dynamic_layout(p, s, *dynamic, "dynamic layout");
  Plan plan = empty_plan(p, s, tiles);
  PlanBuilder builder(p, s, tiles, dynamic, random, packing);
  plan.kernel_seeks = builder.kernel_seeks();
  // A first guess at the tables' size (heads_q * seq_q < 2^62, check_shape); a shape whose tables
  // cannot fit in memory fails here, at once, rather than after planning most of it.
  plan.items.reserve(static_cast<size_t>(s.heads_q * (s.seq_q / tiles.tile_q + 16)) * 2);
  plan.spans.reserve(plan.items.capacity());
  for (int32_t h = 0; h < s.heads_q; ++h) builder.lower_head(h, plan);
  finish_plan(plan);
  return plan;
}

}  // namespace attnjit
