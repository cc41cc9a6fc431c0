// What the fuzz targets share. A reader may reject its input with the error it documents (a
// UserError, or a problem string); anything else is a finding: a sanitizer report, an exception of
// another type escaping (std::terminate), or a property below that does not hold (abort).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace attnjit::fuzz {

inline std::string text_of(const uint8_t* data, size_t size) { return std::string(reinterpret_cast<const char*>(data), size); }

// A property of the reader that failed: print it and abort, so libFuzzer keeps the input.
inline void require(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "attnjit fuzz: property failed: %s\n", what.c_str());
  std::abort();
}

}  // namespace attnjit::fuzz
