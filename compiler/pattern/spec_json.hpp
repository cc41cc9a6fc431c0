// Reading pattern specs from JSON (format: docs/spec.md).
#pragma once

#include <string>

#include "pattern.hpp"  // beside this header, as it is installed too (include/attnjit/compiler/pattern/)

// Public API: exported from the shared libattnjit, built with hidden visibility (cmake/install.cmake).
#pragma GCC visibility push(default)
namespace attnjit {

// Parses and validates a spec. Errors are UserErrors whose where() is the JSON pointer of the
// offending field (or `source` for a JSON syntax error, with line and column).
Pattern parse_spec(const std::string& text, const std::string& source = "<spec>");

// Same, reading a file; where() is prefixed with the file name.
Pattern load_spec_file(const std::string& path);

// The JSON spec of a Pattern, on one line, with every default written out: parse_spec of it gives
// a Pattern equal to `p` (explicit blocks are written as pairs, hierarchical layouts as the unions
// they stand for). What a pattern made in C++ (head_slice) hands to another process or language.
std::string spec_json_text(const Pattern& p);

}  // namespace attnjit
#pragma GCC visibility pop
