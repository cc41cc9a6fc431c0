#include "compiler/plan/paged_plan.hpp"

#include <algorithm>
#include <map>
#include <sstream>

#include "compiler/pattern/mask.hpp"
#include "compiler/support/error.hpp"

namespace attnjit {

namespace {

// What a work item visits, as values: its rows and, span by span, the keys, the branch and the
// visited tiles with their full flags.
std::vector<int64_t> visit_signature(const Plan& plan, const WorkItem& item) {
  std::vector<int64_t> sig{item.rows.start, item.rows.stride, item.rows.count};
  for (int64_t s = item.span_begin; s < item.span_end; ++s) {
    const KeySpan& k = plan.spans[s];
    sig.insert(sig.end(), {-1, k.keys.start, k.keys.stride, k.keys.count, k.branch});
    for_each_planned_tile(plan, k, [&](int32_t tile, bool full) { sig.push_back(int64_t{tile} * 2 + (full ? 1 : 0)); });
  }
  return sig;
}

// The plan's items packed by heads (GQA): items of consecutive heads of one kv group that visit
// the same rows and the same tiles become one item of several heads (its first item's index and
// the head count), while heads x rows fit `tile_q`; the kernel reads each K/V tile once for them.
// Masks are still asked per head (a partial tile's predicate takes each row's head).
std::vector<std::pair<size_t, int32_t>> pack_heads(const Plan& plan, int64_t group, int32_t tile_q) {
  std::map<std::pair<int64_t, std::vector<int64_t>>, std::vector<size_t>> same;  // (kv head, visits) -> items by head
  std::vector<std::pair<int64_t, std::vector<int64_t>>> order;
  for (size_t i = 0; i < plan.items.size(); ++i) {
    auto key = std::make_pair(plan.items[i].head / group, visit_signature(plan, plan.items[i]));
    auto [it, fresh] = same.try_emplace(key);
    if (fresh) order.push_back(key);
    it->second.push_back(i);
  }
  std::vector<std::pair<size_t, int32_t>> out;
  for (const auto& key : order) {
    std::vector<size_t>& items = same[key];
    std::sort(items.begin(), items.end(), [&](size_t a, size_t b) { return plan.items[a].head < plan.items[b].head; });
    const int64_t rows = std::max<int64_t>(1, plan.items[items[0]].rows.count);
    for (size_t n = 0; n < items.size();) {
      size_t e = n + 1;
      while (e < items.size() && plan.items[items[e]].head == plan.items[items[e - 1]].head + 1 &&
             int64_t(e - n + 1) * rows <= tile_q)
        ++e;
      out.emplace_back(items[n], static_cast<int32_t>(e - n));
      n = e;
    }
  }
  return out;
}

}  // namespace

PagedPlan lower_paged_plan(const Pattern& p, int64_t heads_q, int64_t heads_kv, int64_t head_dim, int64_t head_dim_v,
                           const std::vector<PagedRequest>& requests, const TileConfig& tiles) {
  if (p.has_dynamic_layout())
    throw UserError("pattern", "paged attention cannot take a dynamic layout (its table describes one sequence's blocks); "
                               "use a fixed or random layout");
  PagedPlan out;
  out.requests = requests;
  Plan& t = out.tables;
  t.tiles = tiles;
  t.shape.heads_q = heads_q, t.shape.heads_kv = heads_kv, t.shape.head_dim = head_dim, t.shape.head_dim_v = head_dim_v;
  // Requests of the same (queries, length) share one lowering.
  std::map<std::pair<int64_t, int64_t>, std::shared_ptr<const Plan>> lowered;
  int64_t row = 0;
  for (size_t b = 0; b < requests.size(); ++b) {
    const PagedRequest& r = requests[b];
    const std::string name = "request " + std::to_string(b);
    if (r.queries < 0 || r.kv_len < 0) throw UserError(name, "queries and kv_len must be >= 0");
    if (r.queries > r.kv_len)
      throw UserError(name, "has " + std::to_string(r.queries) + " queries but " + std::to_string(r.kv_len) +
                                " cached tokens; append the queries' own K/V first, so each query is a cached token");
    out.q_start.push_back(row);
    out.q_pos.push_back(r.kv_len - r.queries);
    row += r.queries;
    t.shape.seq_k = std::max(t.shape.seq_k, r.kv_len);
    out.request_plans.emplace_back();
    if (r.queries == 0) continue;
    auto it = lowered.find({r.queries, r.kv_len});
    if (it == lowered.end()) {
      Shape s = t.shape;
      s.seq_q = r.queries, s.seq_k = r.kv_len, s.q_offset = r.kv_len - r.queries, s.k_offset = 0;
      it = lowered.emplace(std::make_pair(r.queries, r.kv_len), std::make_shared<const Plan>(lower_to_plan(p, s, tiles))).first;
    }
    out.request_plans.back() = it->second;
    const Plan& one = *it->second;
    t.softmax_scale = one.softmax_scale, t.output_scale = one.output_scale, t.combine = one.combine;
    const int64_t span0 = static_cast<int64_t>(t.spans.size()), entry0 = static_cast<int64_t>(t.tile_entries.size());
    for (const auto& [first, heads] : pack_heads(one, heads_q / heads_kv, tiles.tile_q)) {
      WorkItem item = one.items[first];
      int64_t visits = 0;
      for (int64_t s = item.span_begin; s < item.span_end; ++s) visits += span_tile_count(one, one.spans[s]);
      out.max_item_tiles = std::max(out.max_item_tiles, visits);
      item.span_begin += span0, item.span_end += span0;
      t.items.push_back(item);
      out.item_request.push_back(static_cast<int32_t>(b));
      out.item_heads.push_back(heads);
    }
    for (KeySpan s : one.spans) {
      if (s.listed()) s.entry_begin += entry0, s.entry_end += entry0;
      t.spans.push_back(s);
    }
    t.tile_entries.insert(t.tile_entries.end(), one.tile_entries.begin(), one.tile_entries.end());
    PlanStats& st = t.stats;
    st.attended_pairs += one.stats.attended_pairs, st.computed_pairs += one.stats.computed_pairs;
    st.computed_real_pairs += one.stats.computed_real_pairs, st.work_items += one.stats.work_items;
    st.empty_items += one.stats.empty_items, st.full_tiles += one.stats.full_tiles;
    st.partial_tiles += one.stats.partial_tiles, st.spans += one.stats.spans, st.tile_entries += one.stats.tile_entries;
    st.table_bytes += one.stats.table_bytes;
  }
  t.shape.seq_q = row;
  t.stats.work_items = static_cast<int64_t>(t.items.size());  // packed: what the kernel runs
  if (lowered.empty()) t.softmax_scale = softmax_scale(p, t.shape);
  return out;
}

namespace {
bool layout_per_head(const Layout& l) {
  if (l.kind == Layout::Kind::Random || l.kind == Layout::Kind::Dynamic) return true;
  if (l.kind == Layout::Kind::Explicit && !l.per_head.empty()) return true;
  return std::any_of(l.children.begin(), l.children.end(), layout_per_head);
}
}  // namespace

std::vector<PagedHeadClass> paged_head_classes(const Pattern& p, int64_t heads_q, int64_t heads_kv, int32_t tile_q) {
  const int64_t group = heads_q / heads_kv;
  std::vector<PagedHeadClass> out;
  bool open = false;  // may the next head join the last class?
  for (int64_t h = 0; h < heads_q; ++h) {
    std::vector<int64_t> offsets(p.branches.size(), -1);
    bool alone = false;
    for (size_t b = 0; b < p.branches.size(); ++b) {
      if (!branch_has_head(p, b, h, heads_q)) continue;
      offsets[b] = branch_offset(p.branches[b], h, heads_q);
      alone |= p.branches[b].layout && layout_per_head(*p.branches[b].layout);
    }
    if (open && !alone && h % group != 0 && out.back().offsets == offsets && out.back().heads < tile_q) {
      ++out.back().heads;
    } else {
      out.push_back({static_cast<int32_t>(h), 1, offsets});
    }
    open = !alone;
  }
  return out;
}

int32_t paged_splits(const PagedPlan& plan, int64_t target_blocks) {
  const int64_t items = static_cast<int64_t>(plan.tables.items.size());
  if (items == 0) return 1;
  const int64_t want = (target_blocks + items - 1) / items;
  return static_cast<int32_t>(std::max<int64_t>(1, std::min({want, plan.max_item_tiles, int64_t{64}})));
}

std::string print_paged_plan(const PagedPlan& plan, int64_t max_items) {
  std::ostringstream os;
  os << "paged plan: " << plan.requests.size() << " requests, " << plan.tables.items.size()
     << " work items (heads of a kv group with the same tiles share one), longest "
     << plan.max_item_tiles << " key tiles\n";
  for (size_t b = 0; b < plan.requests.size(); ++b)
    os << "  request " << b << ": queries=" << plan.requests[b].queries << " kv_len=" << plan.requests[b].kv_len
       << " first row=" << plan.q_start[b] << " first position=" << plan.q_pos[b] << "\n";
  os << "items (request:heads):";
  for (size_t i = 0; i < plan.item_request.size() && (max_items < 0 || int64_t(i) < max_items); ++i)
    os << " " << plan.item_request[i] << ":" << plan.item_heads[i];
  os << "\n" << print_plan(plan.tables, max_items);
  return os.str();
}

}  // namespace attnjit
