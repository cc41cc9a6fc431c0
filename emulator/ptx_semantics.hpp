// The emulator's reading of the PTX ISA: each instruction the kernels use, as a pure function of
// its operands. No fibers, no memory: the block executor gathers a warp's operands and calls
// these. Section titles below are those of the PTX ISA (version 8.x/9.x).
#pragma once

#include <cstddef>
#include <array>
#include <cstdint>

namespace attnjit::emu {

// ---- "Data Movement and Conversion Instructions: cvt" ----------------------------------------
// cvt.rn.f16.f32: round to nearest even; overflow gives inf; f16 subnormals are kept; a NaN gives
// the canonical NaN 0x7fff.
uint16_t cvt_rn_f16_f32(float f);
// cvt.rn.bf16.f32: the same rules for bfloat16 (canonical NaN 0x7fff).
uint16_t cvt_rn_bf16_f32(float f);
// cvt.f32.f16: exact, except that every NaN (quiet or signalling, any payload) gives the
// canonical fp32 NaN 0x7fffffff, as an H100 does (probe_cvt). cvt.f32.bf16: exact (the kernels'
// bf16 -> f32 is a 16-bit shift, which keeps a NaN's payload).
float cvt_f32_f16(uint16_t h);
float cvt_f32_bf16(uint16_t h);
// cvt.rn.f16x2.f32 d, a, b / cvt.rn.bf16x2.f32 d, a, b: "a" goes to the upper half of d, "b" to
// the lower half. `type` is AJ_EMU_F16 or AJ_EMU_BF16.
uint32_t cvt_rn_x2(float a, float b, int type);
// cvt.rn.satfinite.e4m3x2.f32 d, a, b (sm_89+): each to FP8 e4m3, to nearest even, saturated to
// +-448 (infinities too), a NaN to 0x7F whatever its sign (compiler/support/half.hpp: float_to_e4m3);
// "a" to the upper byte of d, "b" to the lower.
uint16_t cvt_rn_satfinite_e4m3x2(float a, float b);
// cvt.rn.f16x2.e4m3x2 d, a (sm_89+): each byte of a to fp16, exactly (every e4m3 value is an fp16
// value); a NaN byte gives the canonical fp16 NaN 0x7fff, its sign dropped, as CUDA's host
// conversion does. The upper byte goes to the upper half of d.
uint32_t cvt_f16x2_e4m3x2(uint16_t a);
float cvt_f32_of_type(uint16_t h, int type);

// ---- "Floating Point Instructions: ex2" / "lg2" (.approx.ftz.f32) ----------------------------
// The hardware computes an approximation (PTX ISA: max relative error 2^-22 for ex2, 2^-22 absolute
// near 1 for lg2); the emulator returns the correctly rounded value, with .ftz: subnormal inputs
// are read as zero and subnormal results are flushed to +0. Special values follow the ISA's tables
// exactly (ex2: -inf -> +0, +inf -> +inf; lg2: +-0 -> -inf, negative -> NaN, +inf -> +inf; NaN ->
// NaN). Every NaN result is the canonical 0x7fffffff, as an H100 gives (probe_ex2_lg2).
float ex2_approx_ftz(float x);
float lg2_approx_ftz(float x);

// ---- "Warp-level Matrix Fragments: Matrix Fragments for mma.m16n8k16 with floating point type" -
// Lane l: group g = l / 4, thread-in-group t = l % 4.
//   A (16x16, row): a[0] = (row g,   cols 2t, 2t+1), a[1] = (row g+8, cols 2t, 2t+1),
//                   a[2] = (row g,   cols 2t+8, 2t+9), a[3] = (row g+8, cols 2t+8, 2t+9)
//   B (16x8, col):  b[0] = (rows 2t, 2t+1; col g),     b[1] = (rows 2t+8, 2t+9; col g)
//   C/D (16x8 f32): d[0], d[1] = (row g, cols 2t, 2t+1); d[2], d[3] = (row g+8, cols 2t, 2t+1)
// In each 32-bit register the lower-numbered element sits in the lower 16 bits.
struct MmaRowCol {
  int row, col;
};
MmaRowCol mma_a_element(int lane, int reg, int half);  // element `half` (0 low, 1 high) of a[reg]
MmaRowCol mma_b_element(int lane, int reg, int half);  // row = k, col = n
inline MmaRowCol mma_cd_element(int lane, int index) {  // inline: the emulator's wgmma maps every accumulator
  const int g = lane / 4, t = lane % 4;
  return {g + (index >> 1) * 8, 2 * t + (index & 1)};
}

// One warp's mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32, D = A * B + C, with
// C = D on entry (the kernels accumulate in place). Operands per lane: a[lane][4], b[lane][2],
// d[lane][4].
//
// Accumulation model: every product is exact (a 11- or 8-bit significand squared fits a double),
// the sum of C and the 16 products is formed in double precision and rounded once to fp32 (round
// to nearest even). Tensor cores align the products to the largest exponent and truncate; where
// the products of one output span many binades the hardware result can differ from this model in
// the last bits of the fp32 result. Inputs made of small integers are exact in both.
void mma_m16n8k16(const uint32_t (*a)[4], const uint32_t (*b)[2], float (*d)[4], int type);

// ---- "Matrix Fragments for mma.m16n8k32" (.e4m3, sm_89+): 8-bit A and B, 4 bytes a register -----
//   A (16x32, row): byte j of a[r] = (row g + 8 (r % 2), col 4t + j + 16 (r / 2))
//   B (32x8, col):  byte j of b[r] = (row 4t + j + 16 r, col g)
//   C/D: as m16n8k16's.
// So A's registers are ldmatrix's (.b16, no .trans) of the byte rows, and B's those of the rows of
// B^T, as for 16-bit inputs with twice the K.
MmaRowCol mma_a_element_8bit(int lane, int reg, int byte);
MmaRowCol mma_b_element_8bit(int lane, int reg, int byte);
// mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32, with the accumulation model above. The
// probe probe_mma_e4m3 checks the fragments (small integers, exact in any model); the rounding of
// the sums is an assumption no GPU here can check (sm_90 builds the instruction from f16 HMMAs).
void mma_m16n8k32_e4m3(const uint32_t (*a)[4], const uint32_t (*b)[2], float (*d)[4]);

// ---- "Data Movement and Conversion Instructions: ldmatrix" (.m8n8 .b16) -----------------------
// For matrix j of an .x1/.x2/.x4, lanes 8j..8j+7 give the addresses of its rows 0..7 (16 bytes
// each). Without .trans, lane l receives in register j the elements (row l/4, cols 2*(l%4) and +1);
// with .trans, the elements (rows 2*(l%4) and +1, col l/4), i.e. the same positions of the
// transposed matrix. `rows[j][r]` points at row r of matrix j; `out[lane][j]`.
void ldmatrix(const uint16_t* const (*rows)[8], int num, bool trans, uint32_t (*out)[4]);

// ---- "Data Movement and Conversion Instructions: stmatrix" (.m8n8 .b16, sm_90) ----------------
// ldmatrix's inverse: lane l's register j (`in[lane][j]`) is its piece of matrix j (row l/4, cols
// 2*(l%4) and +1 in the low and high halves; with .trans, that piece of the transposed matrix),
// written to the rows whose addresses lanes 8j..8j+7 give (`rows[j][r]`, 16 bytes each).
void stmatrix(uint16_t* const (*rows)[8], int num, bool trans, const uint32_t (*in)[4]);

// ---- "Asynchronous Warpgroup Level Matrix Multiply-Accumulate: wgmma.mma_async" (sm_90a) -------
// A warpgroup (4 warps, 128 threads) computes D[64][N] = A[64][16] * B[16][N] + (scale_d ? D : 0)
// for 16-bit inputs (A[64][32] * B[32][N] for e4m3, whose operands are K-major). A comes from
// registers (thread t of the warpgroup holds the mma.m16n8k16 A fragment of rows 16 * (t / 32) ..)
// or, like B, from shared memory through a matrix descriptor.
//
// Matrix descriptor ("Matrix Descriptor Format"): bits 0-13 start address >> 4, 16-29 leading
// dimension byte offset (LBO) >> 4, 32-45 stride dimension byte offset (SBO) >> 4, 49-51 base
// offset, 62-63 swizzle mode (0 none, 1 128-byte, 2 64-byte, 3 32-byte).
struct WgmmaDesc {
  uint32_t start = 0, lbo = 0, sbo = 0;  // bytes
  int base_offset = 0;
  int swizzle = 0;  // swizzle width in bytes: 0 (none), 32, 64, 128
};
WgmmaDesc decode_wgmma_desc(uint64_t desc);
// The shared-window byte address of element (mn, k) (mn: the row of A or the column of B; k < 16)
// of a 16-bit operand, from "Shared Memory Matrix Layout" (the canonical layouts, in CuTe terms,
// with T = 8 elements of 16 bytes):
//   K-major,  no swizzle: ((8,m),(T,2k)):((1T,SBO),(1,LBO))      swizzled W: ((8,m),(T,2k)):((W/16 T,SBO),(1,T))
//   MN-major, no swizzle: ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))   swizzled W: ((T,W/16,m),(8,k)):((1,T,LBO),(W/16 T,SBO))
// then the swizzle of the address itself: for width W, bits [7, 7 + log2(W/16)) are XORed into
// bits [4, 4 + log2(W/16)) (CuTe's Swizzle<3,4,3>, <2,4,3>, <1,4,3>), so a start address moved by
// 32 bytes along K within a swizzled row keeps addressing the same rows.
// For 8-bit operands (e4m3: K = 32 per instruction, K-major only) the same layouts hold in bytes:
// `elem_bytes` 1 makes element k the k-th byte along K (a 128-byte swizzled row holds 128 of them).
inline uint32_t wgmma_element_address(const WgmmaDesc& d, bool mn_major, int mn, int k, int elem_bytes = 2) {
  const uint32_t w = static_cast<uint32_t>(d.swizzle), eb = static_cast<uint32_t>(elem_bytes);
  uint32_t off;
  if (!mn_major) {
    const uint32_t kb = eb * static_cast<uint32_t>(k);  // byte along K
    const uint32_t m = static_cast<uint32_t>(mn);
    off = w == 0 ? (m % 8) * 16 + (m / 8) * d.sbo + (kb / 16) * d.lbo + kb % 16 : (m % 8) * w + (m / 8) * d.sbo + kb;
  } else {
    const uint32_t mb = eb * static_cast<uint32_t>(mn);  // byte along M/N
    const uint32_t kk = static_cast<uint32_t>(k);
    off = w == 0 ? mb % 16 + (mb / 16) * d.sbo + (kk % 8) * 16 + (kk / 8) * d.lbo
                 : mb % w + (mb / w) * d.lbo + (kk % 8) * w + (kk / 8) * d.sbo;
  }
  const uint32_t addr = d.start + off;
  const uint32_t mask = w == 0 ? 0 : w / 16 - 1;
  return addr ^ (((addr >> 7) & mask) << 4);
}
// The thread (0..127) and register that hold an element of a warpgroup fragment ("Register
// Fragments"): D (fp32, N/2 registers): warp w owns rows 16w..16w+15 and, in each 8-column block j,
// d[4j + e] = mma.m16n8k16's C/D element e; A in registers: mma.m16n8k16's A fragment of warp w's rows.
inline MmaRowCol wgmma_d_element(int thread, int index) {
  const MmaRowCol e = mma_cd_element(thread % 32, index % 4);
  return {16 * (thread / 32) + e.row, 8 * (index / 4) + e.col};
}
MmaRowCol wgmma_a_element(int thread, int reg, int half);
// A in registers for 8-bit inputs (m64nNk32, e4m3): byte `byte` of register `reg` of thread t
// (warp w = t / 32, lane l) holds row 16w + l / 4 + 8 (reg % 2), column 4 (l % 4) + byte + 16
// (reg / 2) (CUTLASS's ALayout_64x32 for 8-bit register sources).
MmaRowCol wgmma_a_element_8bit(int thread, int reg, int byte);
// D = A * B (+ D when scale_d) on values already converted from the inputs (negations of
// imm-scale-a/-b applied): a[64][kk], b[kk][n], d[64][n], row-major; kk = 16 (16-bit inputs) or
// 32 (e4m3). 16-bit inputs: as mma_m16n8k16, exact products, C and the kk products summed in
// double, rounded once. e4m3: e4m3_fused_dot_add (compiler/support/half.hpp) per element, the
// Hopper tensor core's own sum. n: the instruction's N, a multiple of 8 in 8..256 (16-bit inputs:
// std::invalid_argument otherwise).
void wgmma_m64nNk(const double* a, const double* b, float* d, int n, int kk, bool scale_d);


}  // namespace attnjit::emu
