#include "compiler/plan/device_plan.hpp"

#include <limits>

#include "compiler/support/error.hpp"

namespace attnjit {

size_t DevicePlan::bytes() const {
  return items.size() * sizeof(DeviceItem) + spans.size() * sizeof(DeviceSpan) + entries.size() * sizeof(int32_t) +
         doc_base.size() * sizeof(int64_t) + key_extra.size() * sizeof(float);
}

DevicePlan pack_plan(const Plan& plan) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (static_cast<int64_t>(plan.spans.size()) > kMax || static_cast<int64_t>(plan.tile_entries.size()) > kMax ||
      static_cast<int64_t>(plan.items.size()) > kMax) {
    throw UserError("plan", "has more than 2^31 spans, tile entries or items; split the sequence into chunks with offsets");
  }
  DevicePlan d;
  d.items.reserve(plan.items.size());
  for (const WorkItem& it : plan.items) {
    d.items.push_back({it.rows.start, it.rows.stride, static_cast<int32_t>(it.rows.count), it.head,
                       static_cast<int32_t>(it.span_begin), static_cast<int32_t>(it.span_end)});
  }
  d.spans.reserve(plan.spans.size());
  for (const KeySpan& s : plan.spans) {
    if (s.keys.count > kMax) throw UserError("plan", "a key span has more than 2^31 keys; split the sequence");
    d.spans.push_back({s.keys.start, s.keys.stride, static_cast<int32_t>(s.keys.count), s.branch, s.tile_begin, s.tile_end,
                       s.full_begin, s.full_end, static_cast<int32_t>(s.entry_begin), static_cast<int32_t>(s.entry_end),
                       static_cast<int32_t>(s.weight_begin)});
  }
  // The kernels take a weighted key's probability P + (w - 1) P (aj_tc_weigh): the extras w - 1,
  // then 256 zeros after the last (the widest key tile), as a kernel reads a whole tile's.
  if (static_cast<int64_t>(plan.key_weights.size()) > kMax) throw UserError("plan", "has more than 2^31 key weights; split the sequence");
  if (plan.packed()) {
    d.key_extra.reserve(plan.key_weights.size() + 256);
    for (uint8_t w : plan.key_weights) d.key_extra.push_back(static_cast<float>(w) - 1.0f);
    d.key_extra.resize(d.key_extra.size() + 256, 0.0f);
  }
  d.entries.reserve(plan.tile_entries.size());
  for (const TileEntry& e : plan.tile_entries) d.entries.push_back(e.tile << 1 | (e.full ? 1 : 0));
  d.doc_base = plan.doc_base;
  return d;
}

DeviceBackwardPlan pack_backward_plan(const BackwardPlan& plan) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (static_cast<int64_t>(plan.entries.size()) > kMax || static_cast<int64_t>(plan.items.size()) > kMax) {
    throw UserError("plan", "the backward plan has more than 2^31 entries; split the sequence into chunks with offsets");
  }
  DeviceBackwardPlan d;
  for (const KeyItem& k : plan.items) {
    d.items.push_back({k.keys.start, k.keys.stride, static_cast<int32_t>(k.keys.count), k.kv_head,
                       static_cast<int32_t>(k.entry_begin), static_cast<int32_t>(k.entry_end)});
  }
  for (const QueryEntry& q : plan.entries) {
    d.entries.push_back({q.rows.start, q.rows.stride, static_cast<int32_t>(q.rows.count), q.head, q.branch, q.full ? 1 : 0});
  }
  return d;
}

}  // namespace attnjit
