// Printing a Plan, parsing tile sizes, and the per-element predicate of partial tiles.
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string_view>
#include <vector>

#include "compiler/plan/plan.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/parse_int.hpp"

namespace attnjit {

bool partial_tile_allows(const Pattern& p, int32_t branch, int32_t head, int64_t qpos, int64_t kpos,
                         const DynamicLayout* dynamic) {
  const Branch& b = p.branches[static_cast<size_t>(branch)];
  if (b.causal && kpos > qpos) return false;
  if (b.window.left >= 0 && kpos < qpos - b.window.left) return false;
  if (b.window.right >= 0 && kpos > qpos + b.window.right) return false;
  return !b.layout || layout_allows(*b.layout, head, qpos, kpos, dynamic);
}

namespace {
int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }
int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }
}  // namespace

void partial_tile_row(const Pattern& p, int32_t branch, int32_t head, int64_t qpos, int64_t kpos0, int64_t step,
                      int64_t count, const DynamicLayout* dynamic, float* keep) {
  std::fill(keep, keep + count, 0.0f);
  if (count <= 0) return;
  const Branch& b = p.branches[static_cast<size_t>(branch)];
  // The band, as key columns [c_lo, c_hi]: kpos0 + c * step within [lo, hi].
  const int64_t last = kpos0 + (count - 1) * step;
  int64_t lo = kpos0, hi = last;
  if (b.causal) hi = std::min(hi, qpos);
  if (b.window.left >= 0) lo = std::max(lo, qpos - b.window.left);
  if (b.window.right >= 0) hi = std::min(hi, qpos + b.window.right);
  if (lo > hi) return;
  const int64_t c_lo = ceil_div(lo - kpos0, step), c_hi = floor_div(hi - kpos0, step);
  if (c_lo > c_hi) return;
  if (!b.layout) {
    std::fill(keep + c_lo, keep + c_hi + 1, 1.0f);
    return;
  }
  // The layout, as kept key intervals over the band's columns.
  thread_local std::vector<KeyInterval> kept;
  layout_key_intervals(*b.layout, head, qpos, kpos0 + c_lo * step, kpos0 + c_hi * step + 1, dynamic, kept);
  for (const KeyInterval& iv : kept) {
    const int64_t from = std::max(c_lo, ceil_div(iv.begin - kpos0, step)), to = std::min(c_hi, floor_div(iv.end - 1 - kpos0, step));
    if (from <= to) std::fill(keep + from, keep + to + 1, 1.0f);
  }
}

TileConfig parse_tile_config(const std::string& text) {
  // The plan's tiles are 1 to 1024 rows and keys (lower_to_plan checks the same).
  constexpr int64_t kMaxTile = 1024;
  const std::string where = "--tile " + text;
  const std::string expected = "expected QxK with positive sizes, e.g. 64x64 or 128x64";
  const size_t x = text.find('x');
  if (x == std::string::npos) throw UserError(where, expected);
  const std::string_view parts[2] = {std::string_view(text).substr(0, x), std::string_view(text).substr(x + 1)};
  int32_t sizes[2] = {0, 0};
  for (int n = 0; n < 2; ++n) {
    const ParsedInt r = read_int(parts[n], 1, kMaxTile);
    if (r.status == IntText::NotInteger) throw UserError(where, expected);
    if (r.status == IntText::OutOfRange)
      throw UserError(where, "tile sizes must lie in [1, " + std::to_string(kMaxTile) + "], got " + std::string(parts[n]) +
                                 "; e.g. 64x64 or 128x64");
    sizes[n] = static_cast<int32_t>(r.value);
  }
  TileConfig t;
  t.tile_q = sizes[0];
  t.tile_k = sizes[1];
  return t;
}

namespace {
std::string row_map(const RowMap& m) {
  std::ostringstream os;
  os << m.start << "+" << m.stride << "k,k<" << m.count;
  return os.str();
}
}  // namespace

std::string print_plan(const Plan& plan, int64_t max_items) {
  const PlanStats& st = plan.stats;
  const Shape& s = plan.shape;
  std::ostringstream os;
  os << "plan: batch=" << s.batch << " seq_q=" << s.seq_q << " seq_k=" << s.seq_k << " heads_q=" << s.heads_q
     << " heads_kv=" << s.heads_kv << " head_dim=" << s.head_dim << " head_dim_v=" << s.head_dim_v
     << " q_offset=" << s.q_offset << " k_offset=" << s.k_offset << "\n";
  os << "tile: " << plan.tiles.tile_q << "x" << plan.tiles.tile_k << "\n";
  os << "combine: " << to_string(plan.combine) << " (one online softmax per query tile, no merge pass)"
     << " output_scale=" << plan.output_scale << "\n";
  os << "work items: " << st.work_items << " (" << st.empty_items << " with no keys)\n";
  if (plan.kernel_seeks) {
    os << "kernel seeks: branch";
    for (int32_t b = 0; b < 64; ++b)
      if (plan.kernel_seeks_branch(b)) os << " " << b;
    os << " (layouts the kernels decide: their tiles below are what the band allows, an upper bound)\n";
  }
  os << "tiles: " << st.full_tiles + st.partial_tiles << " visited, " << st.full_tiles << " full, " << st.partial_tiles
     << " partial\n";
  if (plan.packed() || st.packed_tiles > 0) {
    os << "packed: " << st.packed_tiles << " tiles left out (another branch's tile holds every key: its weights count them), "
       << st.weighted_tiles << " visited tiles weighted, " << plan.key_weights.size() << " bytes of key weights\n";
  }
  if (st.attended_pairs > 0) {
    char w[32];
    std::snprintf(w, sizeof w, "%.4f", st.waste());
    os << "pairs: attended=" << st.attended_pairs << " computed=" << st.computed_pairs
       << " computed_real=" << st.computed_real_pairs << " waste=" << w << "\n";
  } else {
    os << "pairs: computed=" << st.computed_pairs << " computed_real=" << st.computed_real_pairs << "\n";
  }
  os << "tables: " << st.spans << " spans, " << st.tile_entries << " tile entries, " << st.table_bytes << " bytes\n";
  const int64_t n = max_items < 0 ? st.work_items : std::min<int64_t>(max_items, st.work_items);
  os << "items (" << n << " of " << st.work_items << ", heaviest first):\n";
  for (int64_t i = 0; i < n; ++i) {
    const WorkItem& it = plan.items[static_cast<size_t>(i)];
    os << "  item " << i << ": head=" << it.head << " rows=" << row_map(it.rows) << " cost=" << it.cost << "\n";
    for (int64_t sp = it.span_begin; sp < it.span_end; ++sp) {
      const KeySpan& span = plan.spans[static_cast<size_t>(sp)];
      os << "    span branch=" << span.branch << " keys=" << row_map(span.keys);
      if (span.listed()) {
        os << " tiles=[";
        for_each_planned_tile(plan, span, [&, first = true](int32_t t, bool full) mutable {
          os << (first ? "" : " ") << t << (full ? "F" : "P");
          first = false;
        });
        os << "]\n";
      } else {
        os << " tiles=" << span.tile_begin << ".." << span.tile_end << " full=" << span.full_begin << ".." << span.full_end
           << (plan.kernel_seeks_branch(span.branch) ? " (the kernel seeks through the layout)" : "");
        if (span.weighted()) {
          const auto w = plan.key_weights.begin() + span.weight_begin;
          const int64_t heavier = std::count_if(w, w + span.keys.count, [](uint8_t x) { return x > 1; });
          os << " weights: " << heavier << " of " << span.keys.count << " keys stand for up to "
             << int{*std::max_element(w, w + span.keys.count)} << " branches";
        }
        os << "\n";
      }
    }
  }
  return os.str();
}

std::string print_plan_sharing(const Pattern& p, const Shape& s) {
  std::ostringstream os;
  if (const std::optional<int64_t> period = translation_period(p)) {
    os << "; shared by offsets with q_offset mod " << *period << " = " << s.q_offset % *period
       << " and q_offset - k_offset = " << s.q_offset - s.k_offset << " (translation period " << *period << ")\n";
  } else {
    os << "; for these offsets only: the pattern has no translation period (a global, random, explicit or dynamic "
          "layout, or blocks of different sizes)\n";
  }
  return os.str();
}

}  // namespace attnjit
