// head_slice: a pattern over a slice of the heads (head-parallel attention).
#include "compiler/pattern/head_slice.hpp"

#include <map>
#include <string>
#include <vector>

#include "compiler/pattern/mask.hpp"
#include "compiler/support/error.hpp"

namespace attnjit {
namespace {

// The layout for local heads [0, count) standing for global heads [first, first + count).
Layout slice_layout(Layout l, int64_t first, int64_t count) {
  if (l.kind == Layout::Kind::Random) l.head_base += first;
  if (l.kind == Layout::Kind::Explicit && !l.per_head.empty())
    l.per_head = std::vector<std::vector<Layout::BlockPair>>(l.per_head.begin() + first, l.per_head.begin() + first + count);
  for (Layout& c : l.children) c = slice_layout(std::move(c), first, count);
  return l;
}

void check_layout_slice(const Layout& l, int64_t first, int64_t count, int64_t heads_q) {
  if (l.kind == Layout::Kind::Dynamic) {
    throw UserError(l.path + "/dynamic", "a layout given at run time cannot be sliced by heads here; slice its table "
                                         "by heads yourself, or run this pattern without head parallelism");
  }
  if (l.kind == Layout::Kind::Explicit && !l.per_head.empty() && static_cast<int64_t>(l.per_head.size()) != heads_q) {
    throw UserError(l.path + "/explicit/per_head", "has " + std::to_string(l.per_head.size()) + " lists but the call has " +
                                                       std::to_string(heads_q) + " query heads; give one list per query head");
  }
  if (l.kind == Layout::Kind::Random && l.head_base + first + count - 1 > kMaxSize) {
    throw UserError(l.path + "/random/head_base", "head_base " + std::to_string(l.head_base) + " plus the slice's last head (" +
                                                      std::to_string(first + count - 1) + ") passes 2^31 - 1, the largest "
                                                      "head_base; use a smaller head_base");
  }
  for (const Layout& c : l.children) check_layout_slice(c, first, count, heads_q);
}

}  // namespace

Pattern head_slice(const Pattern& p, int64_t first, int64_t count, int64_t heads_q) {
  if (heads_q < 1 || heads_q > kMaxSize || count < 1 || first < 0 || first > heads_q - count) {
    throw UserError("heads", "the slice [" + std::to_string(first) + ", " + std::to_string(first) + " + " +
                                 std::to_string(count) + ") does not lie in the " + std::to_string(heads_q) +
                                 " query heads; give 0 <= first and first + count <= heads_q, count >= 1");
  }
  if (p.combine == Combine::HeadGroups && p.group_scale == GroupScale::Mean) {
    throw UserError("/group_scale", "combine head_groups with group_scale \"mean\" divides O by the number of groups, "
                                    "which a slice of the heads cannot say; use group_scale \"none\" and divide O "
                                    "yourself, or run this pattern without head parallelism");
  }
  // What the whole call must satisfy (heads in range, one head per group, one list per head),
  // checked here: a slice would keep only its own heads' share of the mistake.
  Shape whole;
  whole.seq_q = whole.seq_k = 1;
  whole.heads_q = whole.heads_kv = heads_q;
  check_pattern_fits(p, whole);
  Pattern out = p;
  out.combine = Combine::Softmax;
  out.group_scale = GroupScale::Mean;  // the default, as parse_spec leaves it under softmax
  out.branches.clear();
  for (size_t b = 0; b < p.branches.size(); ++b) {
    const Branch& br = p.branches[b];
    if (br.layout) check_layout_slice(*br.layout, first, count, heads_q);
    // The slice's heads that take part in this branch, by the offset they select.
    std::map<int64_t, std::vector<int64_t>> by_offset;
    for (int64_t j = 0; j < count; ++j)
      if (branch_has_head(p, b, first + j, heads_q)) by_offset[branch_offset(br, first + j, heads_q)].push_back(j);
    for (auto& [offset, heads] : by_offset) {
      Branch nb = br;
      nb.offset = Offset{OffsetRule::Fixed, offset};
      if (static_cast<int64_t>(heads.size()) == count) nb.heads.reset();
      else nb.heads = heads;
      if (nb.layout) nb.layout = slice_layout(*nb.layout, first, count);
      out.branches.push_back(std::move(nb));
    }
  }
  if (out.branches.empty()) {  // heads no branch takes part in attend nothing: O = 0, LSE = -inf, as in the whole
    Branch none;
    none.layout = layouts::explicit_blocks({});
    out.branches.push_back(std::move(none));
  }
  if (out.branches.size() > kMaxBranches) {
    throw UserError("heads", "the slice needs " + std::to_string(out.branches.size()) + " branches (one per offset its "
                                 "heads select), more than " + std::to_string(kMaxBranches) + "; use fewer heads per slice");
  }
  return out;
}

}  // namespace attnjit
