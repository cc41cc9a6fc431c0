// Decimal integers in text the user typed: options (--tile 64x64, -j 4) and the numbers inside
// names (sm_80, 128x64w4). sscanf("%d") and atoi wrap a value past 32 bits to a small one that
// looks valid (sm_4294967376 read as sm_80); this reads the whole text into 64 bits and checks it.
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>
#include <system_error>

namespace attnjit {

enum class IntText { Ok, NotInteger, OutOfRange };

struct ParsedInt {
  IntText status = IntText::NotInteger;
  int64_t value = 0;  // set when status is Ok
};

// `text` as a decimal integer in [min, max]: digits with an optional leading '-' and nothing else
// (no spaces, no '+', nothing after the digits). A value outside [min, max], or past 64 bits, is
// OutOfRange; anything else that is not such an integer is NotInteger.
inline ParsedInt read_int(std::string_view text, int64_t min, int64_t max) {
  const char* begin = text.data();
  const char* end = begin + text.size();
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(begin, end, v);
  if (text.empty() || ptr != end) return {IntText::NotInteger, 0};
  if (ec == std::errc::result_out_of_range) return {IntText::OutOfRange, 0};
  if (ec != std::errc()) return {IntText::NotInteger, 0};
  if (v < min || v > max) return {IntText::OutOfRange, 0};
  return {IntText::Ok, v};
}

// The value, or nothing when `text` is not an integer in [min, max].
inline std::optional<int64_t> parse_int(std::string_view text, int64_t min, int64_t max) {
  const ParsedInt r = read_int(text, min, max);
  if (r.status != IntText::Ok) return std::nullopt;
  return r.value;
}

}  // namespace attnjit
