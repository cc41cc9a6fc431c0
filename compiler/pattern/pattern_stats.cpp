#include "compiler/pattern/pattern_stats.hpp"

#include <algorithm>
#include <numeric>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include "compiler/support/error.hpp"

namespace attnjit {

namespace {

int64_t floor_mod(int64_t a, int64_t m) { return ((a % m) + m) % m; }
int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -(-a / b); }

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

// Up to this many progressions overlapping one stretch of keys are counted by inclusion-exclusion
// (2^n terms); above it, marking the stretch's keys is cheaper.
constexpr size_t kMaxInclusionExclusion = 10;

// total += n. Counts of the largest shapes (64 branches over 2^31 - 1 rows and keys) pass 2^63.
void add_pairs(int64_t& total, int64_t n) {
  if (__builtin_add_overflow(total, n, &total)) {
    throw UserError("statistics", "more than 2^63 attended pairs, which attnjit cannot count; count a chunk of the "
                                  "query rows (a shorter --seq with --q-offset) or fewer heads");
  }
}

// The members of `kp` inside [lo, hi] (empty if none).
KeyProgression clip(const KeyProgression& kp, int64_t lo, int64_t hi) {
  KeyProgression out;
  const int64_t first = lo <= kp.first ? kp.first : kp.first + ceil_div(lo - kp.first, kp.step) * kp.step;
  const int64_t end = std::min(kp.last, hi);
  if (first > end) return out;
  return KeyProgression{first, first + (end - first) / kp.step * kp.step, kp.step};
}

void query_blocks(const Layout& l, std::vector<int64_t>& out) {
  out.push_back(l.bq);
  for (const Layout& c : l.children) query_blocks(c, out);
}

// The key intervals one branch's layout keeps, for every query row that shares them: rows of one
// head and one document whose position lies in the same query block of every node of the layout.
// Made once per such run of rows over the document's whole key range (so once per block row, as a
// plan does), then clipped to each row's candidates by binary search.
class LayoutRows {
public:
  explicit LayoutRows(const Layout& l) : layout_(l) {
    query_blocks(l, bqs_);
    std::sort(bqs_.begin(), bqs_.end());
    bqs_.erase(std::unique(bqs_.begin(), bqs_.end()), bqs_.end());
  }

  // For query position qpos of head h in the document starting at row `doc`, whose keys are the
  // positions [k_lo, k_hi).
  void select(int64_t h, int64_t doc, int64_t qpos, int64_t k_lo, int64_t k_hi, const DynamicLayout* dynamic) {
    if (valid_ && h == h_ && doc == doc_ && qpos >= q_lo_ && qpos < q_hi_) return;
    q_lo_ = 0, q_hi_ = INT64_MAX;
    for (int64_t bq : bqs_) {  // qpos < 2^62 and bq < 2^62: no overflow
      const int64_t start = qpos / bq * bq;
      q_lo_ = std::max(q_lo_, start), q_hi_ = std::min(q_hi_, start + bq);
    }
    layout_key_intervals(layout_, h, qpos, k_lo, k_hi, dynamic, kept_);
    prefix_.assign(1, 0);
    for (const KeyInterval& iv : kept_) prefix_.push_back(prefix_.back() + (iv.end - iv.begin));
    h_ = h, doc_ = doc, valid_ = true;
  }

  // How many members of `kp` (key positions) the selected intervals keep.
  int64_t count(const KeyProgression& kp) const {
    const auto [from, to] = overlapping(kp);
    if (from >= to) return 0;
    if (kp.step == 1) {
      int64_t n = prefix_[to] - prefix_[from];
      n -= std::max<int64_t>(0, kp.first - kept_[from].begin);
      n -= std::max<int64_t>(0, kept_[to - 1].end - 1 - kp.last);
      return n;
    }
    int64_t n = 0;
    for (size_t k = from; k < to; ++k) n += clip(kp, kept_[k].begin, kept_[k].end - 1).count();
    return n;
  }

  // The members of `kp` the selected intervals keep, as one progression per interval, shifted by
  // `shift` (key positions to packed key rows).
  void pieces(const KeyProgression& kp, int64_t shift, std::vector<KeyProgression>& out) const {
    const auto [from, to] = overlapping(kp);
    for (size_t k = from; k < to; ++k) {
      const KeyProgression x = clip(kp, kept_[k].begin, kept_[k].end - 1);
      if (!x.empty()) out.push_back(KeyProgression{x.first + shift, x.last + shift, x.step});
    }
  }

private:
  // The intervals [from, to) that meet [kp.first, kp.last].
  std::pair<size_t, size_t> overlapping(const KeyProgression& kp) const {
    const auto from = std::upper_bound(kept_.begin(), kept_.end(), kp.first,
                                       [](int64_t x, const KeyInterval& iv) { return x < iv.end; });
    const auto to = std::upper_bound(from, kept_.end(), kp.last,
                                     [](int64_t x, const KeyInterval& iv) { return x < iv.begin; });
    return {static_cast<size_t>(from - kept_.begin()), static_cast<size_t>(to - kept_.begin())};
  }

  const Layout& layout_;
  std::vector<int64_t> bqs_;
  bool valid_ = false;
  int64_t h_ = 0, doc_ = 0, q_lo_ = 0, q_hi_ = 0;
  std::vector<KeyInterval> kept_;
  std::vector<int64_t> prefix_;  // prefix_[n]: keys in kept_[0 .. n)
};

// |union of the progressions| for progressions that all cover one stretch [lo, hi] of keys.
// `kps` and `marks` are working space.
int64_t union_on_stretch(const std::vector<KeyProgression>& open, int64_t lo, int64_t hi, std::vector<KeyProgression>& kps,
                         std::vector<char>& marks) {
  kps.clear();
  for (const KeyProgression& kp : open) {
    const KeyProgression x = clip(kp, lo, hi);
    if (x.empty()) continue;
    if (x.step == 1 && x.first == lo && x.last == hi) return hi - lo + 1;
    kps.push_back(x);
  }
  if (kps.empty()) return 0;
  if (kps.size() == 1) return kps[0].count();
  if (kps.size() <= kMaxInclusionExclusion) {
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
  marks.assign(static_cast<size_t>(hi - lo + 1), 0);
  int64_t total = 0;
  for (const KeyProgression& kp : kps)
    for (int64_t j = kp.first; j <= kp.last; j += kp.step) {
      char& m = marks[static_cast<size_t>(j - lo)];
      total += !m;
      m = 1;
    }
  return total;
}

// The statistics of one query row after another, with the layouts' intervals kept between rows.
class RowCounter {
public:
  explicit RowCounter(const MaskContext& c) : c_(c) {
    for (const Branch& br : c.pattern.branches) {
      if (br.layout) layouts_.emplace_back(*br.layout);
      else layouts_.emplace_back(std::nullopt);
    }
  }

  // Row i of head h: the keys of each branch (`counts`, with what distinct() needs to make the
  // row's pieces: a layout branch's are made only if it asks, as a row with one branch taking part
  // never does, and a layout keeping many intervals would cost one piece each per row).
  void row(int64_t h, int64_t i, std::vector<int64_t>& counts) {
    const size_t nb = c_.pattern.branches.size();
    counts.assign(nb, 0);
    pieces_.clear();
    pending_.clear();
    const DocumentOfRow d = document_of_row(c_, i);
    const Shape& ds = d.context.shape;
    const int64_t local = i - d.start, koff = ds.k_offset, qpos = ds.q_offset + local;
    for (size_t b = 0; b < nb; ++b) {
      const KeyProgression kp = branch_key_candidates(d.context, b, h, local);
      if (kp.empty()) continue;
      if (!layouts_[b]) {
        counts[b] = kp.count();
        pieces_.push_back({kp.first + d.start, kp.last + d.start, kp.step, b});
        continue;
      }
      LayoutRows& lr = *layouts_[b];
      lr.select(h, d.start, qpos, koff, koff + ds.seq_k, c_.dynamic);
      const KeyProgression at{koff + kp.first, koff + kp.last, kp.step};
      counts[b] = lr.count(at);
      pending_.push_back({b, at, d.start - koff});
    }
  }

  // The keys of the last row() attended by at least one branch.
  int64_t distinct() {
    for (const Pending& x : pending_) {
      scratch_.clear();
      layouts_[x.branch]->pieces(x.at, x.shift, scratch_);
      for (const KeyProgression& kp : scratch_) pieces_.push_back({kp.first, kp.last, kp.step, x.branch});
    }
    pending_.clear();
    if (std::all_of(pieces_.begin(), pieces_.end(), [](const Piece& x) { return x.step == 1; })) {
      // Intervals only: the length of their union.
      std::sort(pieces_.begin(), pieces_.end(), [](const Piece& a, const Piece& b) { return a.first < b.first; });
      int64_t total = 0, end = INT64_MIN;  // the keys up to `end` are counted
      for (const Piece& x : pieces_) {
        if (x.last <= end) continue;
        total += x.last - std::max(x.first - 1, end);
        end = x.last;
      }
      return total;
    }
    // Sweep over the pieces' ends: between two consecutive ends the same pieces are open (at most
    // one per branch, as a branch's pieces are disjoint), and their union there is counted at once.
    events_.clear();
    for (size_t n = 0; n < pieces_.size(); ++n) {
      events_.push_back({pieces_[n].first, n, true});
      events_.push_back({pieces_[n].last + 1, n, false});
    }
    std::sort(events_.begin(), events_.end(), [](const Event& a, const Event& b) { return a.at < b.at; });
    std::vector<size_t>& open = open_;
    open.clear();
    int64_t total = 0;
    for (size_t e = 0; e < events_.size();) {
      const int64_t at = events_[e].at;
      for (; e < events_.size() && events_[e].at == at; ++e) {
        if (events_[e].opens) {
          open.push_back(events_[e].piece);
        } else {
          open.erase(std::find(open.begin(), open.end(), events_[e].piece));
        }
      }
      if (open.empty() || e == events_.size()) continue;
      open_kps_.clear();
      for (size_t n : open) open_kps_.push_back(KeyProgression{pieces_[n].first, pieces_[n].last, pieces_[n].step});
      total += union_on_stretch(open_kps_, at, events_[e].at - 1, clipped_, marks_);
    }
    return total;
  }

private:
  struct Piece {
    int64_t first, last, step;
    size_t branch;
  };
  struct Event {
    int64_t at;
    size_t piece;
    bool opens;
  };
  struct Pending {  // a layout branch's keys of the row, as LayoutRows::pieces takes them
    size_t branch;
    KeyProgression at;
    int64_t shift;
  };
  const MaskContext& c_;
  std::vector<std::optional<LayoutRows>> layouts_;
  std::vector<Piece> pieces_;
  std::vector<Pending> pending_;
  std::vector<KeyProgression> scratch_, open_kps_, clipped_;
  std::vector<size_t> open_;
  std::vector<Event> events_;
  std::vector<char> marks_;
};

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

std::vector<int64_t> pairs_per_row(const MaskContext& c) {
  const Shape& s = c.shape;
  std::vector<int64_t> out(static_cast<size_t>(s.seq_q), 0);
  // Slices of rows on the machine's threads (each its own counter; the context is only read).
  auto count = [&](int64_t lo, int64_t hi) {
    RowCounter rows(c);
    std::vector<int64_t> counts;
    for (int64_t h = 0; h < s.heads_q; ++h)
      for (int64_t i = lo; i < hi; ++i) {
        rows.row(h, i, counts);
        for (int64_t n : counts) add_pairs(out[static_cast<size_t>(i)], n);
      }
  };
  const int64_t threads =
      std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::max<int64_t>(1, s.seq_q / 4096));
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(count, s.seq_q * t / threads, s.seq_q * (t + 1) / threads);
  count(0, s.seq_q / threads);
  for (std::thread& t : pool) t.join();
  return out;
}

int64_t distinct_key_count(const MaskContext& c, int64_t h, int64_t i) {
  RowCounter rows(c);
  std::vector<int64_t> counts;
  rows.row(h, i, counts);
  return rows.distinct();
}

PatternStats pattern_stats(const MaskContext& c, Progress* progress) {
  const Shape& s = c.shape;
  const size_t nb = c.pattern.branches.size();
  PatternStats st;
  st.pairs_per_head.assign(static_cast<size_t>(s.heads_q), 0);
  st.pairs_per_branch.assign(nb, 0);
  RowCounter rows(c);
  std::vector<int64_t> counts;
  const double rows_total = static_cast<double>(s.heads_q) * static_cast<double>(s.seq_q);
  for (int64_t h = 0; h < s.heads_q; ++h) {
    for (int64_t i = 0; i < s.seq_q; ++i) {
      if (progress) progress->update((static_cast<double>(h) * static_cast<double>(s.seq_q) + static_cast<double>(i)) / rows_total);
      rows.row(h, i, counts);
      int64_t row = 0;
      size_t taking_part = 0;
      for (size_t b = 0; b < nb; ++b) {
        add_pairs(st.pairs_per_branch[b], counts[b]);
        row += counts[b];  // at most 64 branches * 2^31 keys
        taking_part += counts[b] > 0;
      }
      add_pairs(st.pairs_per_head[static_cast<size_t>(h)], row);
      st.empty_rows += row == 0;
      add_pairs(st.distinct_pairs, taking_part <= 1 ? row : rows.distinct());
    }
  }
  for (int64_t n : st.pairs_per_head) add_pairs(st.attended_pairs, n);
  const double all = static_cast<double>(s.heads_q) * s.seq_q * s.seq_k;
  st.density = static_cast<double>(st.attended_pairs) / all;
  st.distinct_density = static_cast<double>(st.distinct_pairs) / all;
  return st;
}

}  // namespace attnjit
