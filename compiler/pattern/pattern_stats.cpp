#include "compiler/pattern/pattern_stats.hpp"

#include <numeric>
#include <tuple>
#include <utility>

#include "compiler/support/error.hpp"

namespace attnjit {

namespace {

int64_t floor_mod(int64_t a, int64_t m) { return ((a % m) + m) % m; }

// x with x * a == 1 (mod m), for gcd(a, m) == 1 and m >= 1.
int64_t inverse_mod(int64_t a, int64_t m) {
  int64_t r0 = m, r1 = floor_mod(a, m), t0 = 0, t1 = 1;
  while (r1 != 0) {
    const int64_t q = r0 / r1;
    std::tie(r0, r1) = std::make_pair(r1, r0 - q * r1);
    std::tie(t0, t1) = std::make_pair(t1, t0 - q * t1);
  }
  return floor_mod(t0, m);
}

// Branches attend at most a few hundred keys' worth of branches per row; above this many taking
// part, inclusion-exclusion (2^n terms) loses to marking keys.
constexpr size_t kMaxInclusionExclusion = 10;

// total += n. Counts of the largest shapes (64 branches over 2^31 - 1 rows and keys) pass 2^63.
void add_pairs(int64_t& total, int64_t n) {
  if (__builtin_add_overflow(total, n, &total)) {
    throw UserError("statistics", "more than 2^63 attended pairs, which attnjit cannot count; count a chunk of the "
                                  "query rows (a shorter --seq with --q-offset) or fewer heads");
  }
}

}  // namespace

KeyProgression intersect(const KeyProgression& a, const KeyProgression& b) {
  KeyProgression none;
  if (a.empty() || b.empty()) return none;
  // x = a.first + s * a.step with x == b.first (mod b.step): s * a.step == d (mod b.step).
  // Steps (dilations) go up to 2^62, so the lcm and the products are taken in 128 bits.
  using i128 = __int128;
  const int64_t g = std::gcd(a.step, b.step), d = b.first - a.first;
  if (floor_mod(d, g) != 0) return none;
  const int64_t m = b.step / g;
  const int64_t s = m == 1 ? 0 : static_cast<int64_t>(i128{floor_mod(d / g, m)} * inverse_mod(a.step / g, m) % m);
  const i128 step = i128{a.step / g} * b.step;  // lcm
  i128 x = a.first + i128{s} * a.step;          // one common member; move it to the first >= both starts
  const int64_t lo = std::max(a.first, b.first), hi = std::min(a.last, b.last);
  x += (lo > x ? (lo - x + step - 1) / step : -((x - lo) / step)) * step;
  if (x > hi) return none;
  // A step past int64 is never taken inside [lo, hi]: one member, which step 1 describes as well.
  return KeyProgression{static_cast<int64_t>(x), static_cast<int64_t>(x + (hi - x) / step * step),
                        step > INT64_MAX ? 1 : static_cast<int64_t>(step)};
}

int64_t distinct_key_count(const MaskContext& c, int64_t h, int64_t i) {
  std::vector<size_t> active;
  std::vector<KeyProgression> kps;
  bool layout = false;
  for (size_t b = 0; b < c.pattern.branches.size(); ++b) {
    const KeyProgression kp = branch_key_candidates(c, b, h, i);
    if (kp.empty()) continue;
    active.push_back(b);
    kps.push_back(kp);
    layout = layout || c.pattern.branches[b].layout.has_value();
  }
  if (active.empty()) return 0;
  if (active.size() == 1) return branch_key_count(c, active[0], h, i);
  if (!layout && active.size() <= kMaxInclusionExclusion) {
    // |A_1 u ... u A_n| = sum over nonempty subsets T of (-1)^(|T|+1) |intersection of T|.
    int64_t total = 0;
    const size_t n = kps.size();
    for (uint32_t set = 1; set < (1u << n); ++set) {
      KeyProgression x;
      bool first = true;
      for (size_t t = 0; t < n && (first || !x.empty()); ++t) {
        if (!(set >> t & 1u)) continue;
        x = first ? kps[t] : intersect(x, kps[t]);
        first = false;
      }
      total += (__builtin_popcount(set) % 2 ? 1 : -1) * x.count();
    }
    return total;
  }
  std::vector<bool> seen(static_cast<size_t>(c.shape.seq_k), false);
  int64_t total = 0;
  for (size_t b : active)
    for_each_branch_key(c, b, h, i, [&](int64_t j) {
      if (!seen[static_cast<size_t>(j)]) seen[static_cast<size_t>(j)] = true, ++total;
    });
  return total;
}

PatternStats pattern_stats(const MaskContext& c) {
  const Shape& s = c.shape;
  const size_t nb = c.pattern.branches.size();
  PatternStats st;
  st.pairs_per_head.assign(static_cast<size_t>(s.heads_q), 0);
  st.pairs_per_branch.assign(nb, 0);
  for (int64_t h = 0; h < s.heads_q; ++h) {
    for (int64_t i = 0; i < s.seq_q; ++i) {
      int64_t row = 0;
      size_t taking_part = 0;
      for (size_t b = 0; b < nb; ++b) {
        const int64_t n = branch_key_count(c, b, h, i);
        add_pairs(st.pairs_per_branch[b], n);
        row += n;  // at most 64 branches * 2^31 keys
        taking_part += n > 0;
      }
      add_pairs(st.pairs_per_head[static_cast<size_t>(h)], row);
      st.empty_rows += row == 0;
      add_pairs(st.distinct_pairs, taking_part <= 1 ? row : distinct_key_count(c, h, i));
    }
  }
  for (int64_t n : st.pairs_per_head) add_pairs(st.attended_pairs, n);
  const double all = static_cast<double>(s.heads_q) * s.seq_q * s.seq_k;
  st.density = static_cast<double>(st.attended_pairs) / all;
  st.distinct_density = static_cast<double>(st.distinct_pairs) / all;
  return st;
}

}  // namespace attnjit
