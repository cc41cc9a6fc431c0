#include "compiler/support/half.hpp"

#include <bit>
#include <cmath>
#include <cstring>

namespace attnjit {

float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exactly representable in float
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  uint32_t bits = exp == 0x1f ? (sign | 0x7f800000u | (mant << 13))                 // inf / nan (payload kept)
                              : (sign | ((exp - 15 + 127) << 23) | (mant << 13));  // normal: rebias exponent
  return std::bit_cast<float>(bits);
}

uint16_t float_to_half(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  uint32_t abs = x & 0x7fffffff;
  if (abs > 0x7f800000) return sign | 0x7e00 | static_cast<uint16_t>((abs >> 13) & 0x3ff);  // nan stays (quiet) nan
  if (abs == 0x7f800000) return sign | 0x7c00;                                               // inf
  int exp = static_cast<int>(abs >> 23) - 127 + 15;  // half-biased exponent
  uint32_t full = (abs & 0x7fffff) | 0x800000;       // mantissa with the implicit leading 1
  // Keep the top bits of `full` by shifting right `shift` places, rounding to nearest, ties to even.
  // A carry out of the mantissa correctly bumps the exponent (and gives inf past the max finite half).
  auto round_shift = [](uint32_t v, int shift) {
    uint32_t q = v >> shift, rem = v & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    return q + ((rem > halfway || (rem == halfway && (q & 1))) ? 1u : 0u);
  };
  if (exp >= 31) return sign | 0x7c00;  // too large even before rounding
  if (exp <= 0) {                       // half subnormal: value / 2^-24 = full * 2^(exp - 14)
    int shift = 14 - exp;
    if (shift > 24) return sign;  // below half of the smallest subnormal: rounds to zero
    return sign | static_cast<uint16_t>(round_shift(full, shift));
  }
  uint32_t bits = (static_cast<uint32_t>(exp) << 10) + round_shift(full & 0x7fffff, 13);
  return sign | static_cast<uint16_t>(bits);
}

float bfloat16_to_float(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t float_to_bfloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace attnjit
