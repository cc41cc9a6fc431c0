// PTX instruction semantics (see the header for the ISA sections and the models).
#include "emulator/ptx_semantics.hpp"

#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "emulator/emu_abi.h"
#include "compiler/support/half.hpp"

namespace attnjit::emu {
namespace {

constexpr uint16_t kCanonicalNaN16 = 0x7fff;
constexpr uint32_t kCanonicalNaN32 = 0x7fffffff;  // the PTX ISA's canonical fp32 NaN
float canonical_nan32() { return std::bit_cast<float>(kCanonicalNaN32); }

bool is_nan(float f) { return std::isnan(f); }

// .ftz: a subnormal fp32 reads as a zero of the same sign.
float flush_input(float x) {
  return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x;
}

}  // namespace

uint16_t cvt_rn_f16_f32(float f) { return is_nan(f) ? kCanonicalNaN16 : float_to_half(f); }
uint16_t cvt_rn_bf16_f32(float f) { return is_nan(f) ? kCanonicalNaN16 : float_to_bfloat16(f); }
float cvt_f32_f16(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x03ff) ? canonical_nan32() : half_to_float(h); }
float cvt_f32_bf16(uint16_t h) { return bfloat16_to_float(h); }

float cvt_f32_of_type(uint16_t h, int type) { return type == AJ_EMU_BF16 ? cvt_f32_bf16(h) : cvt_f32_f16(h); }

uint16_t cvt_rn_satfinite_e4m3x2(float a, float b) {
  return static_cast<uint16_t>(uint32_t{float_to_e4m3(a)} << 8 | float_to_e4m3(b));
}

uint32_t cvt_f16x2_e4m3x2(uint16_t a) {
  auto one = [](uint8_t x) -> uint32_t { return (x & 0x7f) == 0x7f ? 0x7fffu : float_to_half(e4m3_to_float(x)); };
  return one(static_cast<uint8_t>(a >> 8)) << 16 | one(static_cast<uint8_t>(a & 0xff));
}

uint32_t cvt_rn_x2(float a, float b, int type) {
  const auto one = type == AJ_EMU_BF16 ? cvt_rn_bf16_f32 : cvt_rn_f16_f32;
  return static_cast<uint32_t>(one(a)) << 16 | one(b);
}

float ex2_approx_ftz(float x) {
  x = flush_input(x);
  if (std::isnan(x)) return canonical_nan32();
  const float y = static_cast<float>(std::exp2(static_cast<double>(x)));
  return std::fpclassify(y) == FP_SUBNORMAL ? 0.0f : y;
}

float lg2_approx_ftz(float x) {
  x = flush_input(x);
  if (std::isnan(x) || x < 0.0f) return canonical_nan32();
  if (x == 0.0f) return -std::numeric_limits<float>::infinity();
  return static_cast<float>(std::log2(static_cast<double>(x)));  // never subnormal for normal x
}

MmaRowCol mma_a_element(int lane, int reg, int half) {
  const int g = lane / 4, t = lane % 4;
  return {g + (reg & 1) * 8, 2 * t + half + (reg >> 1) * 8};
}
MmaRowCol mma_b_element(int lane, int reg, int half) {
  const int g = lane / 4, t = lane % 4;
  return {2 * t + half + reg * 8, g};
}

namespace {
// Each lane's C/D elements plus their K products (exact in double), rounded once to fp32: the
// accumulation model of mma.sync (ptx_semantics.hpp).
template <int K>
void mma_accumulate(const double (&A)[16][K], const double (&B)[K][8], float (*d)[4]) {
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      const MmaRowCol e = mma_cd_element(lane, i);
      double sum = d[lane][i];
      for (int k = 0; k < K; ++k) sum += A[e.row][k] * B[k][e.col];
      d[lane][i] = static_cast<float>(sum);
    }
}
}  // namespace

void mma_m16n8k16(const uint32_t (*a)[4], const uint32_t (*b)[2], float (*d)[4], int type) {
  double A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    for (int reg = 0; reg < 4; ++reg)
      for (int half = 0; half < 2; ++half) {
        const MmaRowCol e = mma_a_element(lane, reg, half);
        A[e.row][e.col] = cvt_f32_of_type(static_cast<uint16_t>(a[lane][reg] >> (16 * half)), type);
      }
    for (int reg = 0; reg < 2; ++reg)
      for (int half = 0; half < 2; ++half) {
        const MmaRowCol e = mma_b_element(lane, reg, half);
        B[e.row][e.col] = cvt_f32_of_type(static_cast<uint16_t>(b[lane][reg] >> (16 * half)), type);
      }
  }
  mma_accumulate(A, B, d);
}

MmaRowCol mma_a_element_8bit(int lane, int reg, int byte) {
  const int g = lane / 4, t = lane % 4;
  return {g + 8 * (reg % 2), 4 * t + byte + 16 * (reg / 2)};
}
MmaRowCol mma_b_element_8bit(int lane, int reg, int byte) {
  const int g = lane / 4, t = lane % 4;
  return {4 * t + byte + 16 * reg, g};
}

void mma_m16n8k32_e4m3(const uint32_t (*a)[4], const uint32_t (*b)[2], float (*d)[4]) {
  double A[16][32], B[32][8];
  for (int lane = 0; lane < 32; ++lane)
    for (int byte = 0; byte < 4; ++byte) {
      for (int reg = 0; reg < 4; ++reg) {
        const MmaRowCol e = mma_a_element_8bit(lane, reg, byte);
        A[e.row][e.col] = e4m3_to_float(static_cast<uint8_t>(a[lane][reg] >> (8 * byte)));
      }
      for (int reg = 0; reg < 2; ++reg) {
        const MmaRowCol e = mma_b_element_8bit(lane, reg, byte);
        B[e.row][e.col] = e4m3_to_float(static_cast<uint8_t>(b[lane][reg] >> (8 * byte)));
      }
    }
  mma_accumulate(A, B, d);
}

void ldmatrix(const uint16_t* const (*rows)[8], int num, bool trans, uint32_t (*out)[4]) {
  for (int j = 0; j < num; ++j)
    for (int lane = 0; lane < 32; ++lane) {
      const int r = lane / 4, c = 2 * (lane % 4);
      const uint16_t lo = trans ? rows[j][c][r] : rows[j][r][c];
      const uint16_t hi = trans ? rows[j][c + 1][r] : rows[j][r][c + 1];
      out[lane][j] = static_cast<uint32_t>(hi) << 16 | lo;
    }
}

void stmatrix(uint16_t* const (*rows)[8], int num, bool trans, const uint32_t (*in)[4]) {
  for (int j = 0; j < num; ++j)
    for (int lane = 0; lane < 32; ++lane) {
      const int r = lane / 4, c = 2 * (lane % 4);
      const uint16_t lo = static_cast<uint16_t>(in[lane][j] & 0xffffu), hi = static_cast<uint16_t>(in[lane][j] >> 16);
      (trans ? rows[j][c][r] : rows[j][r][c]) = lo;
      (trans ? rows[j][c + 1][r] : rows[j][r][c + 1]) = hi;
    }
}

WgmmaDesc decode_wgmma_desc(uint64_t desc) {
  WgmmaDesc d;
  d.start = static_cast<uint32_t>(desc & 0x3fff) << 4;
  d.lbo = static_cast<uint32_t>((desc >> 16) & 0x3fff) << 4;
  d.sbo = static_cast<uint32_t>((desc >> 32) & 0x3fff) << 4;
  d.base_offset = static_cast<int>((desc >> 49) & 7);
  static constexpr int kSwizzle[4] = {0, 128, 64, 32};
  d.swizzle = kSwizzle[(desc >> 62) & 3];
  return d;
}

MmaRowCol wgmma_a_element(int thread, int reg, int half) {
  const MmaRowCol e = mma_a_element(thread % 32, reg, half);
  return {16 * (thread / 32) + e.row, e.col};
}

MmaRowCol wgmma_a_element_8bit(int thread, int reg, int byte) {
  const int lane = thread % 32;
  return {16 * (thread / 32) + lane / 4 + 8 * (reg % 2), 4 * (lane % 4) + byte + 16 * (reg / 2)};
}

void wgmma_m64nNk(const double* a, const double* b, float* d, int n, int kk, bool scale_d) {
  if (kk == 32) {  // e4m3: the tensor core's fused sum (ptx_semantics.hpp)
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < n; ++c) d[r * n + c] = e4m3_fused_dot_add(a + r * kk, 1, b + c, size_t(n), kk, d[r * n + c], scale_d);
    return;
  }
  // Each element's sum in k order, as written; eight columns at a time, their sums kept in registers
  // side by side over k (which changes no element's order of additions).
  if (n < 8 || n > 256 || n % 8)
    throw std::invalid_argument("wgmma_m64nNk: n must be a multiple of 8 in 8..256, got " + std::to_string(n));
  for (int r = 0; r < 64; ++r) {
    const double* ar = a + r * kk;
    for (int c0 = 0; c0 < n; c0 += 8) {
      double sum[8];
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) sum[j] = scale_d ? d[r * n + c0 + j] : 0.0;
      for (int k = 0; k < kk; ++k) {
        const double x = ar[k];
        const double* bk = b + k * n + c0;
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) sum[j] += x * bk[j];
      }
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) d[r * n + c0 + j] = static_cast<float>(sum[j]);
    }
  }
}

}  // namespace attnjit::emu
