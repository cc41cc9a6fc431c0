// "Did you mean": the choice nearest to a word a user mistyped, by edit distance (the spec reader's
// unknown fields and rules, the precompile manifest's fields).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "compiler/support/error.hpp"

namespace attnjit {

// Levenshtein distance: the fewest insertions, deletions and substitutions from `a` to `b`.
inline size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

// The first of `choices` (not empty) nearest to `word`.
inline std::string nearest(const std::string& word, const std::vector<std::string>& choices) {
  return *std::min_element(choices.begin(), choices.end(), [&](const std::string& x, const std::string& y) {
    return edit_distance(word, x) < edit_distance(word, y);
  });
}

// "; did you mean "x"?" for the choice nearest to `word`, when it is near enough to be a typo of it
// (at most a third of the longer word's characters apart, at least one); else "", since a far
// suggestion ("foo": did you mean "tiles"?) misleads more than it helps.
inline std::string did_you_mean(const std::string& word, const std::vector<std::string>& choices) {
  const std::string best = nearest(word, choices);
  const size_t limit = std::max<size_t>(1, std::max(word.size(), best.size()) / 3);
  return edit_distance(word, best) <= limit ? "; did you mean \"" + best + "\"?" : "";
}

// The error for a field `key` at `path` that is none of `allowed`: the nearest valid one if it is
// near, then all.
inline UserError unknown_field(const std::string& path, const std::string& key, const std::vector<std::string>& allowed) {
  std::string valid;
  for (const std::string& a : allowed) valid += (valid.empty() ? "" : ", ") + a;
  return UserError(path + "/" + printable(key),
                   "unknown field \"" + printable(key) + "\"" + did_you_mean(key, allowed) + " (valid here: " + valid + ")");
}

}  // namespace attnjit
