// Counting what a pattern attends for a shape: pairs, density, empty rows. Batch-independent.
#pragma once

#include <vector>

#include "compiler/pattern/mask.hpp"
#include "compiler/support/progress.hpp"

namespace attnjit {

struct PatternStats {
  int64_t attended_pairs = 0;              // over all query heads, with multiplicity (a key counted per branch)
  int64_t distinct_pairs = 0;              // over all query heads, a (head, query, key) counted once however many branches attend it
  std::vector<int64_t> pairs_per_head;     // [heads_q], with multiplicity
  std::vector<int64_t> pairs_per_branch;   // [branches]
  int64_t empty_rows = 0;                  // (head, query row) pairs that attend nothing
  double density = 0.0;                    // attended_pairs / (heads_q * seq_q * seq_k)
  double distinct_density = 0.0;           // distinct_pairs / (heads_q * seq_q * seq_k), at most 1
};

// In time linear in the rows and the intervals their layouts keep: a layout's intervals are made
// once per block row (as a plan makes them) and clipped to each row by binary search.
// `progress`, when given, hears how many of the (head, row) pairs are done.
PatternStats pattern_stats(const MaskContext& c, Progress* progress = nullptr);

// The attended pairs of each query row, over all query heads and with multiplicity ([seq_q]; they
// sum to pattern_stats' attended_pairs): where a pattern's work sits along the sequence, which
// attnjit.distributed reads to find the rows that attend far more than the rest (global rows).
std::vector<int64_t> pairs_per_row(const MaskContext& c);

// The keys a query row attends in at least one branch, however many attend each: |union over
// branches|. Each branch's keys are arithmetic progressions (one per interval its layout keeps);
// between consecutive ends of those pieces the union is counted by inclusion-exclusion (an
// intersection of arithmetic progressions is one), so the time follows the pieces, not the keys.
int64_t distinct_key_count(const MaskContext& c, int64_t h, int64_t i);

// The arithmetic progression of keys in both `a` and `b` (empty if none).
KeyProgression intersect(const KeyProgression& a, const KeyProgression& b);

}  // namespace attnjit
