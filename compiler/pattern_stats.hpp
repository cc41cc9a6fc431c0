// Counting what a pattern attends for a shape: pairs, density, empty rows. Batch-independent.
#pragma once

#include <vector>

#include "compiler/mask.hpp"

namespace attnjit {

struct PatternStats {
  int64_t attended_pairs = 0;              // over all query heads, with multiplicity (a key counted per branch)
  std::vector<int64_t> pairs_per_head;     // [heads_q]
  std::vector<int64_t> pairs_per_branch;   // [branches]
  int64_t empty_rows = 0;                  // (head, query row) pairs that attend nothing
  double density = 0.0;                    // attended_pairs / (heads_q * seq_q * seq_k)
};

PatternStats pattern_stats(const MaskContext& c);

}  // namespace attnjit
