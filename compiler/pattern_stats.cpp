#include "compiler/pattern_stats.hpp"

namespace attnjit {

PatternStats pattern_stats(const MaskContext& c) {
  const Shape& s = c.shape;
  const size_t nb = c.pattern.branches.size();
  PatternStats st;
  st.pairs_per_head.assign(static_cast<size_t>(s.heads_q), 0);
  st.pairs_per_branch.assign(nb, 0);
  for (int64_t h = 0; h < s.heads_q; ++h) {
    for (int64_t i = 0; i < s.seq_q; ++i) {
      int64_t row = 0;
      for (size_t b = 0; b < nb; ++b) {
        const int64_t n = branch_key_count(c, b, h, i);
        st.pairs_per_branch[b] += n;
        row += n;
      }
      st.pairs_per_head[static_cast<size_t>(h)] += row;
      st.empty_rows += row == 0;
    }
  }
  for (int64_t n : st.pairs_per_head) st.attended_pairs += n;
  st.density = static_cast<double>(st.attended_pairs) / (static_cast<double>(s.heads_q) * s.seq_q * s.seq_k);
  return st;
}

}  // namespace attnjit
