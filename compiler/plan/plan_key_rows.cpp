// The key rows a plan attends and the query rows it computes (plan.hpp: plan_key_rows,
// plan_query_rows, plan_attending_rows, work_item_prefix).
#include "compiler/plan/plan.hpp"

#include <algorithm>

namespace attnjit {

std::vector<uint8_t> plan_key_rows(const Plan& plan, const Pattern& p, const DynamicLayout* dynamic) {
  const Shape& s = plan.shape;
  std::vector<uint8_t> rows(static_cast<size_t>(s.heads_kv * s.seq_k), 0);
  const int64_t group = s.heads_q / s.heads_kv;
  // Positions: within the row's document when documents are packed (a tile never crosses one).
  const int64_t* base = plan.doc_base.empty() ? nullptr : plan.doc_base.data();
  auto pos = [&](int64_t row) { return base ? row - base[row] : row; };
  // Keys marked per kv head: a head whose keys are all marked skips its remaining items (dense
  // and causal plans mark every key early, and have the most tiles).
  std::vector<int64_t> marked(static_cast<size_t>(s.heads_kv), 0);
  for (const WorkItem& item : plan.items) {
    const int64_t kvh = item.head / group;
    uint8_t* head_rows = rows.data() + kvh * s.seq_k;
    int64_t& count = marked[static_cast<size_t>(kvh)];
    for (int64_t sp = item.span_begin; sp < item.span_end && count < s.seq_k; ++sp) {
      const KeySpan& span = plan.spans[static_cast<size_t>(sp)];
      for_each_visited_tile(plan, span, [&](int32_t t, bool full) {
        const RowMap keys = tile_keys(span, t, plan.tiles.tile_k);
        for (int64_t c = 0; c < keys.count; ++c) {
          const int64_t j = keys.at(c);
          if (head_rows[j]) continue;
          // A full tile attends every pair; a partial one is asked per pair, as a kernel's mask is.
          for (int64_t r = 0; r < item.rows.count && !head_rows[j]; ++r) {
            head_rows[j] = full || partial_tile_allows(p, span.branch, item.head, s.q_offset + pos(item.rows.at(r)),
                                                       s.k_offset + pos(j), dynamic);
          }
          count += head_rows[j];
        }
      });
    }
  }
  return rows;
}

namespace {

bool visits_a_tile(const Plan& plan, const WorkItem& item) {
  for (int64_t sp = item.span_begin; sp < item.span_end; ++sp)
    if (span_tile_count(plan, plan.spans[static_cast<size_t>(sp)]) > 0) return true;
  return false;
}

}  // namespace

std::vector<uint8_t> plan_query_rows(const Plan& plan) {
  const Shape& s = plan.shape;
  std::vector<uint8_t> rows(static_cast<size_t>(s.heads_q * s.seq_q), 0);
  for (const WorkItem& item : plan.items) {
    if (!visits_a_tile(plan, item)) continue;
    for (int64_t r = 0; r < item.rows.count; ++r) rows[static_cast<size_t>(item.head * s.seq_q + item.rows.at(r))] = 1;
  }
  return rows;
}

std::vector<uint8_t> plan_attending_rows(const Plan& plan, const Pattern& p, const DynamicLayout* dynamic) {
  const Shape& s = plan.shape;
  std::vector<uint8_t> rows(static_cast<size_t>(s.heads_q * s.seq_q), 0);
  const int64_t* base = plan.doc_base.empty() ? nullptr : plan.doc_base.data();
  auto pos = [&](int64_t row) { return base ? row - base[row] : row; };
  std::vector<float> keep(static_cast<size_t>(plan.tiles.tile_k));
  for (const WorkItem& item : plan.items) {
    uint8_t* head_rows = rows.data() + item.head * s.seq_q;
    int64_t marked = 0;  // rows of this item marked so far; the item is done when all are
    for (int64_t r = 0; r < item.rows.count; ++r) marked += head_rows[item.rows.at(r)];
    for (int64_t sp = item.span_begin; sp < item.span_end && marked < item.rows.count; ++sp) {
      const KeySpan& span = plan.spans[static_cast<size_t>(sp)];
      for_each_visited_tile(plan, span, [&](int32_t t, bool full) {
        const RowMap keys = tile_keys(span, t, plan.tiles.tile_k);
        for (int64_t r = 0; r < item.rows.count && marked < item.rows.count; ++r) {
          const int64_t i = item.rows.at(r);
          if (head_rows[i]) continue;
          bool attends = full;
          if (!attends) {  // a partial tile, asked per pair as a kernel's mask is
            partial_tile_row(p, span.branch, item.head, s.q_offset + pos(i), s.k_offset + pos(keys.start), keys.stride,
                             keys.count, dynamic, keep.data());
            attends = std::any_of(keep.begin(), keep.begin() + keys.count, [](float x) { return x != 0.0f; });
          }
          head_rows[i] = attends;
          marked += attends;
        }
      });
    }
  }
  return rows;
}

int64_t work_item_prefix(const Plan& plan) {
  for (int64_t n = static_cast<int64_t>(plan.items.size()); n > 0; --n)
    if (visits_a_tile(plan, plan.items[static_cast<size_t>(n - 1)])) return n;
  return 0;
}

}  // namespace attnjit
