// A pattern over a slice of the heads: what one rank of a head-parallel group computes.
#pragma once

#include <cstdint>

#include "pattern.hpp"  // beside this header, as it is installed too (include/attnjit/compiler/pattern/)

// Public API: exported from the shared libattnjit, built with hidden visibility (cmake/install.cmake).
#pragma GCC visibility push(default)
namespace attnjit {

// The pattern whose head j, in a call of `count` query heads, attends exactly what head
// first + j attends under `p` in a call of `heads_q` query heads. Each branch's offset rule is
// resolved for those heads (a branch whose heads take several offsets becomes one branch per
// offset, with a `heads` list), `heads` lists are renumbered (a branch none of whose heads is in
// the slice is dropped), per-head explicit lists are sliced, and random layouts hash with
// head_base moved by `first`. head_groups becomes softmax with each branch on its group's heads
// (the same result) when group_scale is "none". Throws UserError when the slice is out of range,
// when group_scale is "mean" (a scale of O no spec can say per head), when no branch keeps a head
// of the slice, or when the slice needs more than kMaxBranches branches.
Pattern head_slice(const Pattern& p, int64_t first, int64_t count, int64_t heads_q);

}  // namespace attnjit
#pragma GCC visibility pop
