// Tile classification for the lowering: visited or not, full or partial.
#include "compiler/plan_geometry.hpp"

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

SpanGeometry::SpanGeometry(const Pattern& p, const DynamicLayout* dynamic) : pattern_(p), dynamic_(dynamic) {}

SpanGeometry::Cover SpanGeometry::layout_cover(const Layout& l, int32_t head, const Prog& q, const Prog& k) const {
  const int64_t gq = granule(l, true), gk = granule(l, false);
  const std::vector<int64_t> qg = granules_of(q, gq), kg = granules_of(k, gk);
  bool all = true, any = false;
  for (int64_t a : qg)
    for (int64_t b : kg) {
      const bool ok = layout_allows(l, head, a * gq, b * gk, dynamic_);
      all &= ok;
      any |= ok;
    }
  return all ? Cover::All : any ? Cover::Some : Cover::None;
}

int64_t SpanGeometry::exact_pairs(int32_t branch, int32_t head, const Prog& q, const Prog& k) const {
  const Branch& b = pattern_.branches[static_cast<size_t>(branch)];
  const Interval band(b);
  int64_t total = 0;
  for (int64_t i = 0; i < q.count; ++i) {
    const int64_t qpos = q.at(i);
    const int64_t lo = band.has_left ? k.first_at_least(qpos - band.left) : 0;
    const int64_t hi = band.has_right ? k.last_at_most(qpos + band.right) : k.count - 1;
    if (lo > hi) continue;
    if (!b.layout) {
      total += hi - lo + 1;
      continue;
    }
    const int64_t gk = granule(*b.layout, false);
    for (int64_t id : granules_of(k.slice(lo, hi - lo + 1), gk)) {
      if (!layout_allows(*b.layout, head, qpos, id * gk, dynamic_)) continue;
      const int64_t a = std::max(lo, k.first_at_least(id * gk)), z = std::min(hi, k.last_at_most(id * gk + gk - 1));
      if (a <= z) total += z - a + 1;
    }
  }
  return total;
}

void SpanGeometry::add_span(int32_t head, int32_t branch, const Prog& q, const Prog& keys, const TileConfig& tiles,
                            const Shape& shape, Plan& plan) const {
  const Branch& b = pattern_.branches[static_cast<size_t>(branch)];
  const Interval band(b);
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
  if (!b.layout) {
    // Partial tiles at the band's edges can still be empty when queries are strided: list the
    // visited tiles explicitly only then.
    bool gaps = false;
    for (int64_t t = tb; t < te && !gaps; ++t)
      if ((t < fb || t >= fe) && exact_pairs(branch, head, q, tile_prog(t)) == 0) gaps = true;
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
  for (int64_t t = tb; t < te; ++t) {
    const Prog kt = tile_prog(t);
    const bool band_full = t >= fb && t < fe;
    const Cover cover = b.layout ? layout_cover(*b.layout, head, q, kt) : Cover::All;
    if (cover == Cover::None) continue;
    const bool full = cover == Cover::All && band_full;
    if (!full && !band_full && exact_pairs(branch, head, q, kt) == 0) continue;
    plan.tile_entries.push_back(TileEntry{static_cast<int32_t>(t), full});
  }
  span.entry_end = static_cast<int64_t>(plan.tile_entries.size());
  if (span.entry_end > span.entry_begin) plan.spans.push_back(span);
}

}  // namespace attnjit
