// Geometry for the lowering: arithmetic progressions of positions, and the classification of key
// tiles (visited or not, full or partial) under causal, window and layout masks.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "compiler/plan/plan.hpp"

namespace attnjit {

inline int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

// Global positions first + k*stride, k < count.
struct Prog {
  int64_t first = 0, stride = 1, count = 0;
  int64_t at(int64_t k) const { return first + k * stride; }
  int64_t last() const { return at(count - 1); }
  Prog slice(int64_t from, int64_t n) const { return Prog{at(from), stride, n}; }
  // Index of the first member >= x (count if none) and of the last member <= x (-1 if none).
  int64_t first_at_least(int64_t x) const {
    if (x <= first) return 0;
    return std::min(count, ceil_div(x - first, stride));
  }
  int64_t last_at_most(int64_t x) const {
    if (x < first) return -1;
    return std::min(count - 1, (x - first) / stride);
  }
};

// Builds the key spans of query tiles: which key tiles are visited and which need a mask.
class SpanGeometry {
public:
  // `dynamic`: the call's table (the every-block stand-in for one the kernels read on the device).
  SpanGeometry(const Pattern& p, const DynamicLayout* dynamic, RandomLayouts random);

  // Plan::kernel_seeks: the branches whose layouts the kernels decide (a table on the device,
  // random layouts InKernel). They are planned as if they had no layout.
  uint64_t kernel_seeks() const { return kernel_seeks_; }
  // The layout the plan decides for a branch: none where the kernels seek through it.
  const Layout* planned_layout(int32_t branch) const {
    const Branch& b = pattern_.branches[static_cast<size_t>(branch)];
    return b.layout && !(kernel_seeks_ >> branch & 1) ? &*b.layout : nullptr;
  }

  // Appends the span of branch `branch` for the query tile `q` (global positions) over the keys
  // `keys` (global positions, already clipped to segment, selection and sequence) to plan.spans,
  // unless no tile is visited.
  void add_span(int32_t head, int32_t branch, const Prog& q, const Prog& keys, const TileConfig& tiles,
                const Shape& shape, Plan& plan) const;

private:
  struct Interval;  // the causal/window band of a branch
  // Does some query of q attend some key of k in this branch (band and layout; segment and
  // selection are already in the progressions)?
  bool has_pairs(int32_t branch, int32_t head, const Prog& q, const Prog& k) const;
  // The tile entries of a layout branch's span over band tiles [tb, te) (those in [fb, fe) are
  // inside the band whole).
  void add_layout_entries(const Layout& l, int32_t branch, int32_t head, const Prog& q, const Prog& keys, int64_t tk,
                          int64_t tb, int64_t te, int64_t fb, int64_t fe, Plan& plan) const;
  // The intervals of one block row.
  const std::vector<KeyInterval>& row_intervals(const Layout& l, int32_t head, int64_t qpos, int64_t lo, int64_t hi) const;

  const Pattern& pattern_;
  const DynamicLayout* dynamic_;
  uint64_t kernel_seeks_ = 0;
  // Scratch reused across spans (one SpanGeometry per lowering, used by one thread).
  struct RowCache {
    const Layout* layout = nullptr;
    int32_t head = -1;
    int64_t qpos = -1, lo = 0, hi = 0;
    std::vector<KeyInterval> intervals;
  };
  mutable RowCache row_cache_;
  mutable std::vector<KeyInterval> scratch_any_, scratch_all_, scratch_merge_;
  mutable std::vector<std::pair<int64_t, int64_t>> any_ranges_, all_ranges_;
};

}  // namespace attnjit
