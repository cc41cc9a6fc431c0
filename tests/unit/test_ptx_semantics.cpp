// The emulator's reading of the PTX ISA, instruction by instruction, against expectations written
// here from the ISA's own text (section titles cited), with small integers so results are exact.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "emulator/emu_abi.h"
#include "emulator/ptx_semantics.hpp"
#include "runtime/npy.hpp"

using namespace attnjit;
using namespace attnjit::emu;

namespace {

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

}  // namespace

// PTX ISA, "Warp-level Matrix Fragments: Matrix Fragments for mma.m16n8k16 with floating point
// type": groupID = laneid >> 2, threadID_in_group = laneid % 4;
//   A: row = groupID for a_i with 0 <= i < 2 || 4 <= i < 6, else groupID + 8;
//      col = threadID_in_group * 2 + (i & 1) for i < 4, else + 8.
//   B: row = threadID_in_group * 2 + (i & 1) for b_i with i < 2, else + 8; col = groupID.
//   C/D: row = groupID for c_i with i < 2, else groupID + 8; col = threadID_in_group * 2 + (i & 1).
// Element a_i sits in register i / 2, the lower-numbered element in the lower 16 bits.
TEST_CASE("mma.m16n8k16 fragments follow the PTX ISA figures and D = A * B + C exactly", "[emu][ptx]") {
  for (int type : {AJ_EMU_F16, AJ_EMU_BF16}) {
    INFO((type == AJ_EMU_F16 ? "f16" : "bf16"));
    auto enc = [&](float v) { return type == AJ_EMU_F16 ? float_to_half(v) : float_to_bfloat16(v); };
    float A[16][16], B[16][8], C[16][8];
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c) A[r][c] = float((r * 7 + c * 3) % 9 - 4);
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 8; ++c) B[r][c] = float((r * 5 + c * 11) % 7 - 3);
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 8; ++c) C[r][c] = float(r * 8 + c);
    uint32_t a[32][4] = {}, b[32][2] = {};
    float d[32][4];
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, t = lane % 4;
      for (int i = 0; i < 8; ++i) {
        const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
        const int col = t * 2 + (i & 1) + (i >= 4 ? 8 : 0);
        a[lane][i / 2] |= uint32_t(enc(A[row][col])) << (16 * (i & 1));
      }
      for (int i = 0; i < 4; ++i) {
        const int row = t * 2 + (i & 1) + (i >= 2 ? 8 : 0);
        b[lane][i / 2] |= uint32_t(enc(B[row][g])) << (16 * (i & 1));
      }
      for (int i = 0; i < 4; ++i) d[lane][i] = C[i < 2 ? g : g + 8][t * 2 + (i & 1)];
    }
    mma_m16n8k16(a, b, d, type);
    for (int lane = 0; lane < 32; ++lane)
      for (int i = 0; i < 4; ++i) {
        const int row = i < 2 ? lane / 4 : lane / 4 + 8, col = (lane % 4) * 2 + (i & 1);
        float want = C[row][col];
        for (int k = 0; k < 16; ++k) want += A[row][k] * B[k][col];
        INFO("lane " << lane << " d" << i << " (row " << row << ", col " << col << ")");
        CHECK(d[lane][i] == want);
      }
  }
}

TEST_CASE("mma accumulates exact products and rounds the sum once to fp32", "[emu][ptx]") {
  // Row 0 of A = (1 + 2^-10) repeated, column 0 of B = (1 + 2^-10): each product 1 + 2^-9 + 2^-20
  // is exact in the model (and not in fp16); sixteen of them plus C = 2^24 round once.
  uint32_t a[32][4] = {}, b[32][2] = {};
  float d[32][4] = {};
  const uint16_t x = float_to_half(1.0f + 1.0f / 1024);
  for (int lane = 0; lane < 4; ++lane) {  // group 0 holds row 0 of A and column 0 of B
    a[lane][0] = a[lane][2] = uint32_t(x) | uint32_t(x) << 16;
    b[lane][0] = b[lane][1] = uint32_t(x) | uint32_t(x) << 16;
  }
  d[0][0] = 16777216.0f;
  mma_m16n8k16(a, b, d, AJ_EMU_F16);
  const double exact = 16777216.0 + 16 * (1 + 1.0 / 1024) * (1 + 1.0 / 1024);
  CHECK(d[0][0] == static_cast<float>(exact));
  CHECK(d[1][0] == 0.0f);
}

// PTX ISA, "Matrix Fragments for mma.m16n8k32" (.e4m3): A's elements a_0..a_15, four to a
// register, lowest byte first: row = groupID for a_i with i < 4 || 8 <= i < 12, else groupID + 8;
// col = threadID_in_group * 4 + (i & 3) for i < 8, else + 16. B's b_0..b_7: row =
// threadID_in_group * 4 + (i & 3) for i < 4, else + 16; col = groupID. C/D as m16n8k16's.
TEST_CASE("mma.m16n8k32 on e4m3 follows the PTX ISA figures and D = A * B + C exactly", "[emu][ptx][fp8]") {
  float A[16][32], B[32][8], C[16][8];
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 32; ++c) A[r][c] = float((r * 7 + c * 3) % 9 - 4);
  for (int r = 0; r < 32; ++r)
    for (int c = 0; c < 8; ++c) B[r][c] = float((r * 5 + c * 11) % 7 - 3) * 0.5f;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 8; ++c) C[r][c] = float(r * 8 + c);
  uint32_t a[32][4] = {}, b[32][2] = {};
  float d[32][4];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, t = lane % 4;
    for (int i = 0; i < 16; ++i) {
      const int row = (i < 4 || (i >= 8 && i < 12)) ? g : g + 8;
      const int col = t * 4 + (i & 3) + (i >= 8 ? 16 : 0);
      a[lane][i / 4] |= uint32_t(float_to_e4m3(A[row][col])) << (8 * (i & 3));
    }
    for (int i = 0; i < 8; ++i) {
      const int row = t * 4 + (i & 3) + (i >= 4 ? 16 : 0);
      b[lane][i / 4] |= uint32_t(float_to_e4m3(B[row][g])) << (8 * (i & 3));
    }
    for (int i = 0; i < 4; ++i) d[lane][i] = C[i < 2 ? g : g + 8][t * 2 + (i & 1)];
  }
  mma_m16n8k32_e4m3(a, b, d);
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      const int row = i < 2 ? lane / 4 : lane / 4 + 8, col = (lane % 4) * 2 + (i & 1);
      float want = C[row][col];
      for (int k = 0; k < 32; ++k) want += A[row][k] * B[k][col];
      INFO("lane " << lane << " d" << i << " (row " << row << ", col " << col << ")");
      CHECK(d[lane][i] == want);
    }
  // The element maps the kernels use are the same figures.
  CHECK(mma_a_element_8bit(13, 3, 2).row == 11);
  CHECK(mma_a_element_8bit(13, 3, 2).col == 22);
  CHECK(mma_b_element_8bit(13, 1, 3).row == 23);
  CHECK(mma_b_element_8bit(13, 1, 3).col == 3);
}

// PTX ISA, "Data Movement and Conversion Instructions: ldmatrix": for .m8n8 each matrix's eight
// rows come from the addresses of threads 8j..8j+7; without .trans thread l receives row l / 4,
// elements 2 * (l % 4) and + 1 of each matrix; .trans delivers the transpose (the same positions
// of the column-major matrix).
TEST_CASE("ldmatrix x1/x2/x4, with and without .trans, deliver the ISA's lane map", "[emu][ptx]") {
  uint16_t m[4][8][8];
  for (int j = 0; j < 4; ++j)
    for (int r = 0; r < 8; ++r)
      for (int c = 0; c < 8; ++c) m[j][r][c] = uint16_t(j * 1000 + r * 10 + c);
  const uint16_t* rows[4][8];
  for (int j = 0; j < 4; ++j)
    for (int r = 0; r < 8; ++r) rows[j][r] = m[j][7 - r];  // rows come from anywhere: reversed here
  for (int num : {1, 2, 4})
    for (bool trans : {false, true}) {
      INFO("x" << num << (trans ? ".trans" : ""));
      uint32_t out[32][4] = {};
      ldmatrix(rows, num, trans, out);
      for (int lane = 0; lane < 32; ++lane)
        for (int j = 0; j < num; ++j) {
          const int r = lane / 4, c = 2 * (lane % 4);
          // Row r of the loaded matrix is m[j][7 - r].
          const uint16_t lo = trans ? m[j][7 - c][r] : m[j][7 - r][c];
          const uint16_t hi = trans ? m[j][7 - (c + 1)][r] : m[j][7 - r][c + 1];
          INFO("lane " << lane << " matrix " << j);
          CHECK(out[lane][j] == (uint32_t(hi) << 16 | lo));
        }
    }
}

// PTX ISA, "stmatrix": the inverse of ldmatrix. Thread l's register j holds row l / 4, elements
// 2 * (l % 4) and + 1 of matrix j; .trans stores the transpose. So a stmatrix then an ldmatrix of
// the same rows and form gives back every register, and with .trans row c of the stored matrix
// holds column c of the threads' matrix.
TEST_CASE("stmatrix x1/x2/x4, with and without .trans, are ldmatrix's inverse", "[emu][ptx]") {
  uint32_t regs[32][4];
  for (int lane = 0; lane < 32; ++lane)
    for (int j = 0; j < 4; ++j) regs[lane][j] = uint32_t(lane * 4 + j) << 16 | uint32_t(0x8000 + lane * 4 + j);
  for (int num : {1, 2, 4})
    for (bool trans : {false, true}) {
      INFO("x" << num << (trans ? ".trans" : ""));
      uint16_t m[4][8][8] = {};
      uint16_t* rows[4][8];
      for (int j = 0; j < 4; ++j)
        for (int r = 0; r < 8; ++r) rows[j][r] = m[j][7 - r];  // rows go anywhere: reversed here
      stmatrix(rows, num, trans, regs);
      for (int lane = 0; lane < 32; ++lane)
        for (int j = 0; j < num; ++j) {
          const int r = lane / 4, c = 2 * (lane % 4);
          const uint16_t lo = trans ? m[j][7 - c][r] : m[j][7 - r][c];
          const uint16_t hi = trans ? m[j][7 - (c + 1)][r] : m[j][7 - r][c + 1];
          INFO("lane " << lane << " matrix " << j);
          CHECK(lo == uint16_t(regs[lane][j] & 0xffffu));
          CHECK(hi == uint16_t(regs[lane][j] >> 16));
        }
      const uint16_t* back_rows[4][8];
      for (int j = 0; j < 4; ++j)
        for (int r = 0; r < 8; ++r) back_rows[j][r] = rows[j][r];
      uint32_t back[32][4] = {};
      ldmatrix(back_rows, num, trans, back);
      for (int lane = 0; lane < 32; ++lane)
        for (int j = 0; j < num; ++j) CHECK(back[lane][j] == regs[lane][j]);
    }
}

// PTX ISA, "cvt": for .f16x2 / .bf16x2 destinations "the result of converting a is stored in the
// upper half of d and b in the lower half"; .rn rounds to nearest even.
TEST_CASE("cvt.rn.{f16,bf16}x2.f32 puts its first source in the upper half", "[emu][ptx]") {
  CHECK(cvt_rn_x2(1.0f, 2.0f, AJ_EMU_F16) == (0x3c00u << 16 | 0x4000u));
  CHECK(cvt_rn_x2(1.0f, 2.0f, AJ_EMU_BF16) == (0x3f80u << 16 | 0x4000u));
  CHECK(cvt_rn_x2(-3.0f, 0.5f, AJ_EMU_F16) == (0xc200u << 16 | 0x3800u));
}

// FP8 e4m3 from its definition (OCP E4M3FN): code c = S.EEEE.MMM is (-1)^S * M * 2^-9 when E = 0,
// (-1)^S * (8 + M) * 2^(E - 10) otherwise; S.1111.111 is NaN; no infinities.
double e4m3_value(int c) {
  const int e = (c >> 3) & 15, m = c & 7;
  const double v = e == 0 ? std::ldexp(double(m), -9) : std::ldexp(double(8 + m), e - 10);
  return c & 0x80 ? -v : v;
}

// The correctly rounded e4m3 code of a finite x with |x| <= 464 by search: the nearest of the 127
// non-negative finite codes, a tie to the even code (mantissa bit 0).
int e4m3_nearest(double x) {
  const double a = std::fabs(x);
  int best = 0;
  for (int c = 1; c <= 0x7e; ++c) {
    const double d = std::fabs(a - e4m3_value(c)), db = std::fabs(a - e4m3_value(best));
    if (d < db || (d == db && (c & 1) == 0)) best = c;
  }
  return best | (std::signbit(x) ? 0x80 : 0);
}

TEST_CASE("FP8 e4m3 conversions: every code decodes exactly, fp32 rounds to the nearest code, ties to even, saturating", "[emu][ptx][fp8]") {
  for (int c = 0; c < 256; ++c) {
    const float f = e4m3_to_float(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      CHECK(std::isnan(f));
      continue;
    }
    CHECK(double(f) == e4m3_value(c));
    CHECK(std::signbit(f) == bool(c & 0x80));
    CHECK(int(float_to_e4m3(f)) == c);  // every finite code round trips, -0 included
  }
  // The midpoints between neighbouring codes, and the floats just beside them.
  for (int c = 0; c < 0x7e; ++c) {
    const double lo = e4m3_value(c), hi = e4m3_value(c + 1);
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: a few more bits than e4m3
    REQUIRE(double(mid) == (lo + hi) / 2);
    CHECK(int(float_to_e4m3(mid)) == ((c & 1) ? c + 1 : c));
    CHECK(int(float_to_e4m3(-mid)) == (((c & 1) ? c + 1 : c) | 0x80));
    CHECK(int(float_to_e4m3(std::nextafter(mid, 0.0f))) == c);
    CHECK(int(float_to_e4m3(std::nextafter(mid, 1e9f))) == c + 1);
  }
  // Random magnitudes across every binade, against the search.
  uint64_t s = 12345;
  for (int i = 0; i < 20000; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float m = 1.0f + float(s >> 41) / float(1 << 23);
    const int e = int((s >> 20) % 22) - 13;  // 2^-13 .. 2^8
    const float x = std::ldexp(m, e) * ((s >> 63) ? -1.0f : 1.0f);
    if (std::fabs(x) > 464.0f) continue;
    CHECK(int(float_to_e4m3(x)) == e4m3_nearest(x));
  }
  // Saturation (satfinite): past 448 + half an ulp, and infinities, to +-448; 464 itself is a tie
  // that goes to 448's even mantissa. NaN is 0x7F, its sign dropped. Zeros and binary32 subnormals to zero.
  CHECK(int(float_to_e4m3(464.0f)) == 0x7e);
  CHECK(int(float_to_e4m3(std::nextafter(464.0f, 1e9f))) == 0x7e);
  CHECK(int(float_to_e4m3(1e30f)) == 0x7e);
  CHECK(int(float_to_e4m3(std::numeric_limits<float>::infinity())) == 0x7e);
  CHECK(int(float_to_e4m3(-std::numeric_limits<float>::infinity())) == 0xfe);
  CHECK(int(float_to_e4m3(std::numeric_limits<float>::quiet_NaN())) == 0x7f);
  CHECK(int(float_to_e4m3(-std::numeric_limits<float>::quiet_NaN())) == 0x7f);  // the sign dropped, as the hardware does
  CHECK(int(float_to_e4m3(from_bits(0x00000001u))) == 0x00);
  CHECK(int(float_to_e4m3(from_bits(0x807fffffu))) == 0x80);
  CHECK(int(float_to_e4m3(std::ldexp(1.0f, -10))) == 0x00);  // half the smallest subnormal: a tie to 0
  CHECK(int(float_to_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f))) == 0x01);
  CHECK(int(float_to_e4m3(std::ldexp(15.0f, -10))) == 0x08);  // between 7 * 2^-9 and 2^-6: a tie to 2^-6
}

TEST_CASE("cvt.rn.satfinite.e4m3x2.f32 puts its first source in the upper byte", "[emu][ptx][fp8]") {
  CHECK(cvt_rn_satfinite_e4m3x2(1.0f, -2.0f) == ((0x38u << 8) | 0xc0u));
  CHECK(cvt_rn_satfinite_e4m3x2(std::numeric_limits<float>::quiet_NaN(), 1e9f) == ((0x7fu << 8) | 0x7eu));
}

TEST_CASE("cvt.rn.f16x2.e4m3x2 decodes both bytes exactly, the upper byte to the upper half", "[emu][ptx][fp8]") {
  for (int hi = 0; hi < 256; ++hi) {
    for (int lo = 0; lo < 256; lo += 37) {
      const uint32_t d = cvt_f16x2_e4m3x2(static_cast<uint16_t>(hi << 8 | lo));
      for (const auto& [code, half] : {std::pair{hi, d >> 16}, std::pair{lo, d & 0xffffu}}) {
        if ((code & 0x7f) == 0x7f) {
          CHECK(half == 0x7fffu);  // canonical NaN, sign dropped
        } else {
          CHECK(double(half_to_float(static_cast<uint16_t>(half))) == e4m3_value(code));
          CHECK(bool(half & 0x8000) == bool(code & 0x80));  // -0 stays -0
        }
      }
    }
  }
}

TEST_CASE("cvt.rn.f16.f32 and cvt.rn.bf16.f32 round to nearest even and keep NaN a NaN", "[emu][ptx]") {
  // f16 has 10 fraction bits: 1 + 2^-11 is a tie between 1 and 1 + 2^-10 (even: 1).
  CHECK(cvt_rn_f16_f32(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
  CHECK(cvt_rn_f16_f32(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  CHECK(cvt_rn_f16_f32(65504.0f) == 0x7bff);
  CHECK(cvt_rn_f16_f32(65520.0f) == 0x7c00);           // rounds past the largest finite half: inf
  CHECK(cvt_rn_f16_f32(std::ldexp(1.0f, -24)) == 0x0001);  // the smallest subnormal half is kept
  CHECK(cvt_rn_f16_f32(std::ldexp(1.0f, -25)) == 0x0000);  // a tie with zero rounds to even
  CHECK(cvt_rn_f16_f32(-0.0f) == 0x8000);
  // bf16 has 7 fraction bits.
  CHECK(cvt_rn_bf16_f32(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);
  CHECK(cvt_rn_bf16_f32(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);
  CHECK(cvt_rn_bf16_f32(std::numeric_limits<float>::infinity()) == 0x7f80);
  for (uint32_t nan : {0x7fc00000u, 0xffc00000u, 0x7f800001u}) {
    const uint16_t h = cvt_rn_f16_f32(from_bits(nan)), b = cvt_rn_bf16_f32(from_bits(nan));
    CHECK(((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0));
    CHECK(((b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0));
  }
  CHECK(cvt_f32_f16(0x0001) == std::ldexp(1.0f, -24));
  CHECK(cvt_f32_bf16(0xc040) == -3.0f);
  // An f16 NaN of any sign, payload or kind becomes the canonical fp32 NaN (seen on an H100:
  // 0x7dcd gave 0x7fffffff, not the payload-keeping 0x7fb9a000).
  for (uint16_t nan : {0x7dcd, 0x7e00, 0xfe01, 0x7c01, 0x7fff}) CHECK(bits(cvt_f32_f16(nan)) == 0x7fffffffu);
  CHECK(bits(cvt_f32_f16(0x7c00)) == 0x7f800000u);  // infinity stays infinity
}

// PTX ISA, "ex2" / "lg2": .approx.ftz.f32; subnormal inputs and results are flushed to sign-
// preserving zero; ex2(-inf) = +0, ex2(+inf) = +inf; lg2(+-0) = -inf, lg2(negative) = NaN.
TEST_CASE("ex2.approx.ftz and lg2.approx.ftz: exact on powers of two, special values, flushing", "[emu][ptx]") {
  CHECK(ex2_approx_ftz(3.0f) == 8.0f);
  CHECK(ex2_approx_ftz(-126.0f) == std::ldexp(1.0f, -126));
  CHECK(bits(ex2_approx_ftz(-127.0f)) == 0u);  // 2^-127 is subnormal: flushed
  CHECK(ex2_approx_ftz(from_bits(1)) == 1.0f);  // a subnormal input reads as 0
  CHECK(bits(ex2_approx_ftz(-std::numeric_limits<float>::infinity())) == 0u);
  CHECK(ex2_approx_ftz(std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(ex2_approx_ftz(128.0f) == std::numeric_limits<float>::infinity());
  CHECK(bits(ex2_approx_ftz(std::nanf(""))) == 0x7fffffffu);  // the canonical NaN (H100)
  CHECK(bits(ex2_approx_ftz(from_bits(0xffc01234u))) == 0x7fffffffu);
  CHECK(lg2_approx_ftz(1024.0f) == 10.0f);
  CHECK(lg2_approx_ftz(0.0f) == -std::numeric_limits<float>::infinity());
  CHECK(lg2_approx_ftz(from_bits(5)) == -std::numeric_limits<float>::infinity());  // subnormal: 0
  CHECK(bits(lg2_approx_ftz(-1.0f)) == 0x7fffffffu);
  CHECK(bits(lg2_approx_ftz(std::nanf(""))) == 0x7fffffffu);
}

// Hopper's FP8 warpgroup MMA sums a k32 step's products and C in the tensor core: every term
// truncated toward zero to 2^(E - 13), E the largest term exponent (C's included), the sum truncated
// to 13 fraction bits (ptx_semantics.hpp; the probe probe_wgmma_e4m3_rounding holds it against an
// H200 bit for bit). Designed terms show each part of the rule.
TEST_CASE("the e4m3 warpgroup MMA sums its terms as the tensor core does", "[emu][ptx][fp8]") {
  auto dot = [](std::vector<double> a, std::vector<double> b, float c, bool with_c) {
    return e4m3_fused_dot_add(a.data(), 1, b.data(), 1, int(a.size()), c, with_c);
  };
  // Small integers: exact under any rule.
  CHECK(dot({1, 2, -3, 4}, {2, 2, 2, 0.5}, 10.0f, true) == 10.0f + 2 + 4 - 6 + 2);
  // One product of 2^8 beside ones of 2^-6: below 2^(8 - 13) each is truncated to zero.
  CHECK(dot({16, 0.125, 0.125}, {16, 0.125, -0.125}, 0.0f, false) == 256.0f);
  // The unit is 2^(8 - 13) = 2^-5: a term of 2^-4 is two units and stays, one of 2^-6 is none.
  CHECK(dot({16, 0.25, 0.125}, {16, 0.25, 0.125}, 0.0f, false) == 256.0f + 0.0625f);
  // A large C sets E: products under its unit vanish (C = 2^20, unit 2^7; 64 = 2^6 is lost).
  CHECK(dot({8}, {8}, 1048576.0f, true) == 1048576.0f);
  CHECK(dot({16}, {8}, 1048576.0f, true) == 1048576.0f + 128.0f);
  // Truncation is toward zero for negative terms as well: -(2^8 + 2^-5 + 2^-6) keeps -(2^8 + 2^-5).
  CHECK(dot({-16, -0.25, -0.125}, {16, 0.125, 0.125}, 0.0f, false) == -(256.0f + 0.03125f));
  // The sum keeps 13 fraction bits, truncated: C = 2^13 + 1 + 2^-1 is 13 + 2 significant bits
  // (already cut by its own term's truncation); 2^8 + 2^8 + 2^-5 keeps every term (the unit is
  // 2^-5) and loses 2^-5 only when the sum, 2^9, is cut to 13 fraction bits.
  CHECK(dot({0.0}, {0.0}, 8193.5f, true) == 8193.0f);
  CHECK(dot({16, 16, 0.25}, {16, 16, 0.125}, 0.0f, false) == 512.0f);
  CHECK(dot({16, 16, 0.25}, {16, 15, 0.125}, 0.0f, false) == 496.03125f);
  // A product's exponent is its factors' added, unnormalised: 1.875 x 1.875 = 3.515625 counts as
  // 2^0, so the unit is 2^-13 and a term of 2^-13 (2^-6 x 2^-7) is kept; the sum, 1.640625 after
  // -1.5 x 1.25, is below 2 and keeps it too (normalised, E would be 1 and the term gone).
  CHECK(dot({1.875, -1.5, 0.015625}, {1.875, 1.25, 0.0078125}, 0.0f, false) == 1.640625f + 0x1p-13f);
  // Nothing but zeros; NaN stays NaN.
  CHECK(dot({0.0, 0.0}, {1.0, -2.0}, 0.0f, true) == 0.0f);
  CHECK(std::isnan(dot({std::nan("")}, {1.0}, 0.0f, false)));
  CHECK(std::isnan(dot({1.0}, {1.0}, std::nanf(""), true)));
}
