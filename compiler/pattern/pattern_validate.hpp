// What a spec says before defaults are applied; shared by the JSON parser and the C++ builder so
// both resolve defaults and check values in exactly one place.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compiler/pattern/pattern.hpp"

namespace attnjit {

struct UnresolvedBranch {
  std::optional<int64_t> segment;  // nullopt: "full"
  int64_t dilation = 1;
  std::optional<Offset> offset;
  std::optional<std::vector<int64_t>> heads;
  std::optional<bool> causal;
  std::optional<Window> window;
  std::optional<Layout> layout;
};

struct UnresolvedPattern {
  Combine combine = Combine::Softmax;
  GroupScale group_scale = GroupScale::Mean;
  std::optional<double> scale;
  bool causal = false;
  Window window;
  std::optional<Layout> layout;
  std::vector<UnresolvedBranch> branches;
};

// Applies pattern-level defaults to each branch, resolves offset rules that do not depend on the
// head (group -> fixed, anything with dilation 1 -> fixed 0), canonicalises lists (sorted, unique)
// and checks every shape-independent rule. Errors name the JSON pointer of the offending field.
Pattern resolve_and_validate(UnresolvedPattern u);

// An explicit layout of n blocks (over all its heads) within kExplicitBlocksCap; a UserError at
// `where` naming the count, the cap and the alternatives otherwise.
void check_explicit_block_count(uint64_t n, const std::string& where);

}  // namespace attnjit
