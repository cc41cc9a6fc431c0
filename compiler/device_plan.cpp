#include "compiler/device_plan.hpp"

#include <limits>

#include "compiler/error.hpp"

namespace attnjit {

size_t DevicePlan::bytes() const {
  return items.size() * sizeof(DeviceItem) + spans.size() * sizeof(DeviceSpan) + entries.size() * sizeof(int32_t);
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
                       s.full_begin, s.full_end, static_cast<int32_t>(s.entry_begin), static_cast<int32_t>(s.entry_end)});
  }
  d.entries.reserve(plan.tile_entries.size());
  for (const TileEntry& e : plan.tile_entries) d.entries.push_back(e.tile << 1 | (e.full ? 1 : 0));
  return d;
}

}  // namespace attnjit
