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

}  // namespace attnjit
#pragma GCC visibility pop
