// Tile classification for the lowering: visited or not, full or partial.
#include "compiler/plan/plan_geometry.hpp"

#include <numeric>

namespace attnjit {
namespace {

// The layout is constant on position granules of the gcd of its block sizes.
int64_t granule(const Layout& l, bool query) {
  int64_t g = query ? l.bq : l.bk;
  for (const Layout& c : l.children) g = std::gcd(g, granule(c, query));
  return g;
}

// Granule ids (position / g) that hold at least one member of p, increasing.
std::vector<int64_t> granules_of(const Prog& p, int64_t g) {
  std::vector<int64_t> out;
  if (p.stride >= g) {
    for (int64_t k = 0; k < p.count; ++k) out.push_back(p.at(k) / g);  // one granule per member
  } else {
    for (int64_t id = p.first / g; id <= p.last() / g; ++id) out.push_back(id);  // gaps shorter than a granule
  }
  return out;
}

}  // namespace

// The band of keys a query may see: q - left <= k <= q + right (either side possibly unbounded).
struct SpanGeometry::Interval {
  bool any = false, has_left = false, has_right = false;
  int64_t left = 0, right = 0;
  explicit Interval(const Branch& b) {
    has_left = b.window.left >= 0;
    left = b.window.left;
    has_right = b.window.right >= 0 || b.causal;
    right = b.window.right >= 0 ? b.window.right : 0;
    if (b.causal) right = std::min<int64_t>(right, 0);
    any = has_left || has_right;
  }
};

SpanGeometry::SpanGeometry(const Pattern& p, const DynamicLayout* dynamic, RandomLayouts random)
    : pattern_(p), dynamic_(dynamic) {
  const bool device_table = dynamic && dynamic->standin == DynamicLayout::Standin::EveryBlock;
  for (size_t b = 0; b < p.branches.size(); ++b) {
    const std::optional<Layout>& l = p.branches[b].layout;
    if (l && ((device_table && layout_has_kind(*l, Layout::Kind::Dynamic)) ||
              (random == RandomLayouts::InKernel && layout_has_kind(*l, Layout::Kind::Random))))
      kernel_seeks_ |= uint64_t{1} << b;
  }
}

bool SpanGeometry::has_pairs(int32_t branch, int32_t head, const Prog& q, const Prog& k) const {
  const Branch& b = pattern_.branches[static_cast<size_t>(branch)];
  const Interval band(b);
  const Layout* layout = planned_layout(branch);
  const int64_t gk = layout ? granule(*layout, false) : 1;
  for (int64_t i = 0; i < q.count; ++i) {
    const int64_t qpos = q.at(i);
    const int64_t lo = band.has_left ? k.first_at_least(qpos - band.left) : 0;
    const int64_t hi = band.has_right ? k.last_at_most(qpos + band.right) : k.count - 1;
    if (lo > hi) continue;
    if (!layout) return true;
    // The layout is constant on key granules: test each granule holding a key of [lo, hi] once.
    for (int64_t id = k.at(lo) / gk; id <= k.at(hi) / gk;) {
      const int64_t a = std::max(lo, k.first_at_least(id * gk));
      if (a > hi) break;
      const int64_t at = k.at(a) / gk;  // the granule of the next key (strided keys skip granules)
      if (layout_allows(*layout, head, qpos, at * gk, dynamic_)) return true;
      id = at + 1;
    }
  }
  return false;
}

// The layout one block row at a time: for each query granule of the tile, the key intervals the
// layout keeps (layout_key_intervals). A key tile is visited iff one of its keys lies in the
// union over the granules, and the layout covers it whole iff all its keys lie in the
// intersection; only the tiles the union touches are looked at.
void SpanGeometry::add_layout_entries(const Layout& l, int32_t branch, int32_t head, const Prog& q, const Prog& keys,
                                      int64_t tk, int64_t tb, int64_t te, int64_t fb, int64_t fe, Plan& plan) const {
  const int64_t n = keys.count, gq = granule(l, true);
  const int64_t lo = keys.at(tb * tk), hi = keys.at(std::min(te * tk, n) - 1) + 1;
  std::vector<KeyInterval>& any = scratch_any_;
  std::vector<KeyInterval>& all = scratch_all_;
  bool first = true;
  for (int64_t id : granules_of(q, gq)) {
    const std::vector<KeyInterval>& row = row_intervals(l, head, id * gq, lo, hi);
    if (first) {
      any = row, all = row, first = false;
      continue;
    }
    union_key_intervals(any, row, scratch_merge_);
    intersect_key_intervals(all, row, scratch_merge_);
  }
  // Key index ranges [a, b] (inclusive) of the intervals; ranges with no key between them join.
  auto index_ranges = [&](const std::vector<KeyInterval>& iv, std::vector<std::pair<int64_t, int64_t>>& out) {
    out.clear();
    for (const KeyInterval& k : iv) {
      const int64_t a = keys.first_at_least(k.begin), b = keys.last_at_most(k.end - 1);
      if (a > b) continue;
      if (!out.empty() && a == out.back().second + 1) out.back().second = b;
      else out.emplace_back(a, b);
    }
  };
  index_ranges(any, any_ranges_);
  index_ranges(all, all_ranges_);
  size_t full_at = 0;  // the first range of all_ranges_ that may hold the current tile
  int64_t next = tb;   // tiles below this are done
  for (const auto& [a, b] : any_ranges_) {
    for (int64_t t = std::max(next, a / tk); t <= std::min(te - 1, b / tk); ++t) {
      const int64_t first_key = t * tk, last_key = std::min((t + 1) * tk, n) - 1;
      while (full_at < all_ranges_.size() && all_ranges_[full_at].second < first_key) ++full_at;
      const bool layout_full = full_at < all_ranges_.size() && all_ranges_[full_at].first <= first_key &&
                               all_ranges_[full_at].second >= last_key;
      const bool band_full = t >= fb && t < fe;
      if (!band_full && !has_pairs(branch, head, q, keys.slice(first_key, last_key - first_key + 1))) continue;
      plan.tile_entries.push_back(TileEntry{static_cast<int32_t>(t), layout_full && band_full});
    }
    next = std::max(next, b / tk + 1);
  }
}

// The intervals of one block row, kept from the previous call when the head, the query granule
// and the key range are the same (consecutive query tiles of one block row).
const std::vector<KeyInterval>& SpanGeometry::row_intervals(const Layout& l, int32_t head, int64_t qpos, int64_t lo,
                                                           int64_t hi) const {
  RowCache& c = row_cache_;
  if (!(c.layout == &l && c.head == head && c.qpos == qpos && c.lo == lo && c.hi == hi)) {
    layout_key_intervals(l, head, qpos, lo, hi, dynamic_, c.intervals);
    c.layout = &l, c.head = head, c.qpos = qpos, c.lo = lo, c.hi = hi;
  }
  return c.intervals;
}

void SpanGeometry::add_span(int32_t head, int32_t branch, const Prog& q, const Prog& keys, const TileConfig& tiles,
                            const Shape& shape, Plan& plan) const {
  const Branch& b = pattern_.branches[static_cast<size_t>(branch)];
  const Interval band(b);
  const Layout* layout = planned_layout(branch);
  const int64_t tk = tiles.tile_k, n = keys.count;
  const int64_t nt = ceil_div(n, tk);
  int64_t tb = 0, te = nt, fb = 0, fe = nt;
  if (band.any) {
    // Visited: some key in [q.first - left, q.last + right]. Full: every key in
    // [q.last - left, q.first + right], so every pair of the tile is inside the band.
    const int64_t lo = band.has_left ? keys.first_at_least(q.first - band.left) : 0;
    const int64_t hi = band.has_right ? keys.last_at_most(q.last() + band.right) : n - 1;
    if (lo > hi) return;
    tb = lo / tk;
    te = hi / tk + 1;
    const int64_t flo = band.has_left ? keys.first_at_least(q.last() - band.left) : 0;
    const int64_t fhi = band.has_right ? keys.last_at_most(q.first + band.right) : n - 1;
    fb = std::clamp(ceil_div(flo, tk), tb, te);
    fe = std::clamp(fhi == n - 1 ? nt : (fhi + 1) / tk, fb, te);
    if (flo > fhi) fe = fb;
  }
  KeySpan span;
  span.keys = RowMap{keys.first - shape.k_offset, keys.stride, keys.count};
  span.branch = branch;
  auto tile_prog = [&](int64_t t) { return keys.slice(t * tk, std::min(tk, n - t * tk)); };
  if (!layout) {
    // Partial tiles at the band's edges can still be empty when queries are strided: list the
    // visited tiles explicitly only then.
    bool gaps = false;
    for (int64_t t = tb; t < te && !gaps; ++t)
      if ((t < fb || t >= fe) && !has_pairs(branch, head, q, tile_prog(t))) gaps = true;
    if (!gaps) {
      span.tile_begin = static_cast<int32_t>(tb);
      span.tile_end = static_cast<int32_t>(te);
      span.full_begin = static_cast<int32_t>(fb);
      span.full_end = static_cast<int32_t>(fe);
      plan.spans.push_back(span);
      return;
    }
  }
  span.entry_begin = static_cast<int64_t>(plan.tile_entries.size());
  if (layout) {
    add_layout_entries(*layout, branch, head, q, keys, tk, tb, te, fb, fe, plan);
  } else {
    for (int64_t t = tb; t < te; ++t) {
      const bool band_full = t >= fb && t < fe;
      if (!band_full && !has_pairs(branch, head, q, tile_prog(t))) continue;
      plan.tile_entries.push_back(TileEntry{static_cast<int32_t>(t), band_full});
    }
  }
  span.entry_end = static_cast<int64_t>(plan.tile_entries.size());
  if (span.entry_end > span.entry_begin) plan.spans.push_back(span);
}

}  // namespace attnjit
