// The mask: what docs/spec.md says a pattern means, as code. Every other stage (the plan,
// the kernels) is tested against these functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pattern.hpp"  // beside this header, as it is installed too (include/attnjit/compiler/pattern/)

// Public API: exported from the shared libattnjit, built with hidden visibility (cmake/install.cmake).
#pragma GCC visibility push(default)
namespace attnjit {

// A block layout given at run time (Layout::Kind::Dynamic) in CSR form. Rows are global query
// blocks 0..q_blocks-1 (q_blocks = ceil((q_offset + seq_q) / bq)) of each head in turn; `heads` is
// 1 (one table for every head) or heads_q. Row r's key blocks are
// col_indices[row_offsets[r] .. row_offsets[r+1]), strictly increasing.
struct DynamicLayout {
  int64_t heads = 1;
  std::vector<int64_t> row_offsets;
  std::vector<int32_t> col_indices;
  // A stand-in for a table the planner does not see (one that stays in device memory,
  // DeviceDynamicLayout in attnjit.hpp): every block kept. A plan lowered with it leaves the
  // branches with the table to the kernels (Plan::kernel_seeks). A stand-in has no rows; it is
  // never checked.
  enum class Standin { None, EveryBlock };
  Standin standin = Standin::None;
  static const DynamicLayout& every_block();
};

// The host form of a table given as raw CSR arrays, the way the kernels read a device table:
// row r spans entries [clamp(row_offsets[r], 0, n), clamp(row_offsets[r + 1], that, n)); an entry
// outside [0, k_blocks) or not above the row's last kept entry is dropped. Returns the number of
// problems (offsets out of order or range, dropped entries), as the kernels count them.
int64_t sanitize_dynamic_table(const int64_t* row_offsets, int64_t rows, const int32_t* col_indices, int64_t n,
                               int64_t k_blocks, DynamicLayout& out);
// The smallest key-block count of the pattern's dynamic layouts for a call: ceil((k_offset + seq_k) / bk).
int64_t dynamic_key_blocks(const Pattern& p, const Shape& s);
// The query-block rows per head of the pattern's dynamic layouts: ceil((q_offset + seq_q) / bq).
int64_t dynamic_query_blocks(const Pattern& p, const Shape& s);

// Checks a dynamic table against every dynamic layout of the pattern and the shape: length,
// monotone offsets, sorted unique in-range indices. Throws UserError naming `source` and the fix.
void check_dynamic_layout(const Pattern& p, const Shape& s, const DynamicLayout& d, const std::string& source);

// Packed documents (FlashAttention's varlen): cu_seqlens = {0, e_1, ..., S}, non-decreasing,
// batch 1, seq_q == seq_k == S. Document d is rows [cu[d], cu[d+1]); a query attends only keys of
// its own document, and every position the pattern sees restarts at 0 at a document's start (a
// document is a sequence of its own). Offsets, and dynamic layouts, cannot be combined with them.
// Throws UserError naming `source` and the fix.
void check_documents(const Pattern& p, const Shape& s, const std::vector<int64_t>& cu_seqlens, bool has_dynamic_table,
                     const std::string& source);

// Parses "0,37,37,101,150" (the CLI's --cu-seqlens); a UserError naming `source` if malformed.
std::vector<int64_t> parse_cu_seqlens(const std::string& text, const std::string& source);

// Everything the mask depends on for one call.
struct MaskContext {
  const Pattern& pattern;
  Shape shape;
  const DynamicLayout* dynamic = nullptr;  // required iff pattern.has_dynamic_layout()
  const std::vector<int64_t>* documents = nullptr;  // cu_seqlens of packed documents, or null
};

// With documents: query row i's document as a call of its own (its rows, offsets 0, no
// documents) and the row where it starts. Without: the context itself and 0.
struct DocumentOfRow {
  MaskContext context;
  int64_t start;
};
DocumentOfRow document_of_row(const MaskContext& c, int64_t i);

// head_groups: the group of query head h (groups are contiguous; the first heads_q % groups are one larger).
int64_t head_group(int64_t h, int64_t heads_q, int64_t groups);

// Does branch b take part for query head h (its `heads` list, or its group under head_groups)?
bool branch_has_head(const Pattern& p, size_t b, int64_t h, int64_t heads_q);

// off_b(h): the residue a position's in-segment index must have, modulo the dilation, to be selected.
int64_t branch_offset(const Branch& br, int64_t h, int64_t heads_q);

// Is global position `pos` selected by the branch with offset `off`?
bool position_selected(const Branch& br, int64_t off, int64_t pos);

// Does the layout keep global positions (qpos, kpos) for query head h?
bool layout_allows(const Layout& l, int64_t h, int64_t qpos, int64_t kpos, const DynamicLayout* dynamic);

// Key positions [begin, end).
struct KeyInterval {
  int64_t begin = 0, end = 0;
  bool operator==(const KeyInterval& o) const { return begin == o.begin && end == o.end; }
};

// The key positions in [lo, hi) that layout `l` keeps for query position `qpos` of head h, as
// sorted intervals with gaps between them (adjacent kept blocks are one interval): one block row
// of the layout at a time, in time proportional to the intervals (the random layout: to the key
// blocks in range). Equal to testing layout_allows at every position; the lowering uses it to
// visit only the key tiles a block row keeps.
void layout_key_intervals(const Layout& l, int64_t h, int64_t qpos, int64_t lo, int64_t hi, const DynamicLayout* dynamic,
                          std::vector<KeyInterval>& out);

// acc := acc u more, and acc := acc n more, for sorted gapped interval lists (results sorted and
// gapped too); `scratch` is working space.
void union_key_intervals(std::vector<KeyInterval>& acc, const std::vector<KeyInterval>& more, std::vector<KeyInterval>& scratch);
void intersect_key_intervals(std::vector<KeyInterval>& acc, const std::vector<KeyInterval>& more, std::vector<KeyInterval>& scratch);

// The definition, one pair at a time: does query row i attend key row j in branch b for head h?
// (Local row indices; positions are shape.q_offset + i and shape.k_offset + j.)
bool branch_attends(const MaskContext& c, size_t b, int64_t h, int64_t i, int64_t j);

// How many times query row i counts key row j (once per branch that attends the pair).
int attend_count(const MaskContext& c, int64_t h, int64_t i, int64_t j);

// The keys of branch b for query row i, before the layout: local key rows first, first+step, ..., <= last.
struct KeyProgression {
  int64_t first = 0, last = -1, step = 1;
  bool empty() const { return first > last; }
  int64_t count() const { return empty() ? 0 : (last - first) / step + 1; }
};
KeyProgression branch_key_candidates(const MaskContext& c, size_t b, int64_t h, int64_t i);

// Calls f(j) for every key row j that branch b attends from query row i, in increasing order.
template <typename F>
void for_each_branch_key(const MaskContext& c, size_t b, int64_t h, int64_t i, F&& f) {
  // With documents: row i's document as a call of its own, keys moved back to packed rows.
  const DocumentOfRow d = document_of_row(c, i);
  const KeyProgression kp = branch_key_candidates(d.context, b, h, i - d.start);
  const Branch& br = c.pattern.branches[b];
  const int64_t qpos = d.context.shape.q_offset + i - d.start;
  for (int64_t j = kp.first; j <= kp.last; j += kp.step) {
    if (!br.layout || layout_allows(*br.layout, h, qpos, d.context.shape.k_offset + j, c.dynamic)) f(j + d.start);
  }
}

// Number of keys branch b attends from query row i (same as counting for_each_branch_key, in time
// proportional to the intervals the layout keeps in the row, layout_key_intervals).
int64_t branch_key_count(const MaskContext& c, size_t b, int64_t h, int64_t i);

// The mask's translation period: a P > 0 (below 2^40) such that moving a query and a
// key position both by a multiple of P never changes whether they attend, in any branch or head;
// nullopt where absolute positions matter (global, random, explicit and dynamic layouts; local
// and offset layouts with different query and key blocks) or the period reaches 2^40. Segments
// contribute their length, a dilation without a segment its rate, a layout its blocks (a strided
// one its key block times its stride); causal masks and windows see only the difference of the
// positions. Two calls whose offsets agree modulo P and whose offsets differ by the same amount
// (q_offset - k_offset) have the same mask in local rows, and so the same plan.
std::optional<int64_t> translation_period(const Pattern& p);

}  // namespace attnjit
#pragma GCC visibility pop
