// Geometry for the lowering: arithmetic progressions of positions, and the classification of key
// tiles (visited or not, full or partial) under causal, window and layout masks.
#pragma once

#include <cstdint>

#include "compiler/plan.hpp"

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
  SpanGeometry(const Pattern& p, const DynamicLayout* dynamic);

  // Appends the span of branch `branch` for the query tile `q` (global positions) over the keys
  // `keys` (global positions, already clipped to segment, selection and sequence) to plan.spans,
  // unless no tile is visited.
  void add_span(int32_t head, int32_t branch, const Prog& q, const Prog& keys, const TileConfig& tiles,
                const Shape& shape, Plan& plan) const;

private:
  struct Interval;  // the causal/window band of a branch
  enum class Cover { None, Some, All };
  Cover layout_cover(const Layout& l, int32_t head, const Prog& q, const Prog& k) const;
  int64_t exact_pairs(int32_t branch, int32_t head, const Prog& q, const Prog& k) const;

  const Pattern& pattern_;
  const DynamicLayout* dynamic_;
};

}  // namespace attnjit
