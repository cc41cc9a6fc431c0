#include "compiler/support/half.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

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

float e4m3_to_float(uint8_t x) {
  const bool negative = x & 0x80;
  const int exp = (x >> 3) & 0xf, mant = x & 7;
  if (exp == 0xf && mant == 7) return std::numeric_limits<float>::quiet_NaN();
  // Subnormal: mant * 2^-9; normal: (8 + mant) * 2^(exp - 10). Both exact in binary32.
  const float v = exp == 0 ? std::ldexp(static_cast<float>(mant), -9) : std::ldexp(static_cast<float>(8 + mant), exp - 10);
  return negative ? -v : v;
}

uint8_t float_to_e4m3(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint8_t sign = static_cast<uint8_t>((x >> 24) & 0x80);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7f;  // NaN: the canonical 0x7F whatever its sign, as the H200 gives
  // Past 448 + half an ulp (464), infinities included: the largest finite value. 464 itself is a
  // tie that rounds to 448's even mantissa below.
  if (abs > 0x43e80000u) return sign | 0x7e;
  const int exp = static_cast<int>(abs >> 23) - 127 + 7;  // e4m3-biased exponent
  const uint32_t full = (abs & 0x7fffff) | 0x800000;      // 24-bit significand with its leading 1
  auto round_shift = [](uint32_t v, int shift) {          // v >> shift, to nearest, ties to even
    if (shift >= 32) return 0u;
    const uint32_t q = v >> shift, rem = v & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    return q + ((rem > halfway || (rem == halfway && (q & 1))) ? 1u : 0u);
  };
  if (abs < 0x00800000u) return sign;  // binary32 zero or subnormal: far below e4m3's smallest (2^-9)
  if (exp <= 0) {                      // e4m3 subnormal: value / 2^-9 = full * 2^(exp - 1 - 23 + 3)
    // A carry out of the subnormal mantissa gives the smallest normal, 0x08: the bits say so.
    return sign | static_cast<uint8_t>(round_shift(full, 21 - exp));
  }
  // Normal: the exponent field and the mantissa rounded from 23 to 3 bits; a carry bumps the
  // exponent (at most to 0x7e: 464 and above were handled).
  return sign | static_cast<uint8_t>((static_cast<uint32_t>(exp) << 3) + round_shift(full & 0x7fffff, 20));
}

namespace {

// The exponent a tensor-core term is aligned by: floor(log2 |x|), at least `least` (e4m3's
// subnormals count as 2^-6, fp32's as 2^-126).
int term_exponent(double x, int least) {
  int e = 0;
  std::frexp(x, &e);  // |x| = f 2^e, f in [0.5, 1)
  return std::max(e - 1, least);
}

}  // namespace

float e4m3_fused_dot_add(const double* a, size_t a_step, const double* b, size_t b_step, int count, float c, bool with_c) {
  constexpr int kFractionBits = 13;
  double naive = with_c ? double(c) : 0.0;  // what the special values come out as
  for (int k = 0; k < count; ++k) naive += a[k * a_step] * b[k * b_step];
  if (!std::isfinite(naive) || (with_c && !std::isfinite(c))) return static_cast<float>(naive);
  // Each product is exact in a double (4-bit significands); its exponent is the sum of its
  // factors', unnormalised (its significand may reach [2, 4)).
  int top = INT32_MIN;
  for (int k = 0; k < count; ++k) {
    const double x = a[k * a_step], y = b[k * b_step];
    if (x != 0.0 && y != 0.0) top = std::max(top, term_exponent(x, -6) + term_exponent(y, -6));
  }
  if (with_c && c != 0.0f) top = std::max(top, term_exponent(c, -126));
  if (top == INT32_MIN) return with_c ? c + 0.0f : 0.0f;  // nothing but zeros
  // Every term truncated toward zero to a multiple of 2^(top - 13) and summed exactly (the terms
  // are below 2^(top + 2), so each is a 16-bit integer of that unit).
  const double unit = std::ldexp(1.0, top - kFractionBits);
  int64_t sum = 0;
  for (int k = 0; k < count; ++k) sum += static_cast<int64_t>(std::trunc(a[k * a_step] * b[k * b_step] / unit));
  if (with_c) sum += static_cast<int64_t>(std::trunc(double(c) / unit));
  if (sum == 0) return 0.0f;
  // The sum normalised and truncated toward zero to 13 fraction bits.
  const uint64_t mag = static_cast<uint64_t>(sum < 0 ? -sum : sum);
  const int width = 64 - __builtin_clzll(mag);
  const uint64_t kept = width > kFractionBits + 1 ? mag >> (width - kFractionBits - 1) << (width - kFractionBits - 1) : mag;
  const double v = std::ldexp(static_cast<double>(kept), top - kFractionBits);
  return static_cast<float>(sum < 0 ? -v : v);
}

}  // namespace attnjit
