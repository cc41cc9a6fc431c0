// Building blocks (templates/blocks/base.cuh says how they work): arithmetic. Bit casts, the
// uncontracted product, conversions between fp32 and fp16/bf16, and the SFU's exp2 and log2.

#ifndef AJ_EMULATE  // ---- hardware bodies (inline PTX) ----

__device__ __forceinline__ float aj_int_as_float(int x) { return __int_as_float(x); }
__device__ __forceinline__ float aj_uint_as_float(aj_u32 x) { return __uint_as_float(x); }
__device__ __forceinline__ aj_u32 aj_float_as_uint(float x) { return __float_as_uint(x); }
// a * b rounded to float, never contracted into an fma with what uses it (mul.rn): the softmax's
// exponents subtract a row maximum that was rounded the same way, so the maximum's is exactly 0.
__device__ __forceinline__ float aj_mul_rn(float a, float b) { return __fmul_rn(a, b); }

// cvt.rn.{f16,bf16}x2.f32 d, a, b: a goes to the upper half, b to the lower (PTX operand order).
__device__ __forceinline__ aj_u32 aj_cvt_f16x2(float hi, float lo) {
  aj_u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ aj_u32 aj_cvt_bf16x2(float hi, float lo) {
  aj_u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float aj_cvt_f32_f16(aj_u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ aj_u16 aj_cvt_f16_f32(float f) {
  aj_u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

// prmt.b32 (CUDA's __byte_perm): byte i of the result is byte (sel >> 4i) & 7 of the eight bytes
// a (0..3) and b (4..7). The FP8 forward transposes V's bytes with it.
__device__ __forceinline__ aj_u32 aj_prmt(aj_u32 a, aj_u32 b, aj_u32 sel) { return __byte_perm(a, b, sel); }

// fma.rn.f32 and cvt.rmi.f32.f32: a * b + c rounded once, and x rounded down to an integer.
__device__ __forceinline__ float aj_fma(float a, float b, float c) { return fmaf(a, b, c); }
// add.rm.ftz.f32: a + b rounded toward minus infinity (one FADD on the FMA pipe), subnormals
// flushed as everywhere else (-ftz=true): a subnormal x then gives floor 0 and 2^x exactly 1.
__device__ __forceinline__ float aj_add_rm(float a, float b) {
  float y;
  asm("add.rm.ftz.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
  return y;
}

// ex2.approx.ftz.f32 and lg2.approx.ftz.f32: the SFU's approximations, subnormals flushed.
__device__ __forceinline__ float aj_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float aj_lg2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// cvt.rn.satfinite.e4m3x2.f32 d, hi, lo (sm_89+): two floats to FP8 e4m3, to nearest even,
// saturated to +-448, a NaN to 0x7F whatever its sign; hi in the upper byte (PTX operand order).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
__device__ __forceinline__ aj_u16 aj_cvt_e4m3x2(float hi, float lo) {
  aj_u16 r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}
// cvt.rn.f16x2.e4m3x2 d, x (sm_89+): both FP8 bytes of x to fp16, exactly; the upper byte to the
// upper half. A NaN byte gives an fp16 NaN.
__device__ __forceinline__ aj_u32 aj_cvt_f16x2_e4m3x2(aj_u16 x) {
  aj_u32 r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(x));
  return r;
}
#endif

#else  // ---- emulation twins (the emulator's runtime, emulator/emu_abi.h) ----

__device__ __forceinline__ float aj_int_as_float(int x) { float f; __builtin_memcpy(&f, &x, 4); return f; }
__device__ __forceinline__ float aj_uint_as_float(aj_u32 x) { float f; __builtin_memcpy(&f, &x, 4); return f; }
__device__ __forceinline__ aj_u32 aj_float_as_uint(float x) { aj_u32 u; __builtin_memcpy(&u, &x, 4); return u; }
// The product stored as a float before any use: the host compiler contracts a * b - c too.
__device__ __forceinline__ float aj_mul_rn(float a, float b) {
  volatile float r = a * b;
  return r;
}

__device__ __forceinline__ aj_u32 aj_cvt_f16x2(float hi, float lo) { return aj_emu_cvt_rn_x2(hi, lo, AJ_EMU_F16); }
__device__ __forceinline__ aj_u32 aj_cvt_bf16x2(float hi, float lo) { return aj_emu_cvt_rn_x2(hi, lo, AJ_EMU_BF16); }
__device__ __forceinline__ float aj_cvt_f32_f16(aj_u16 h) { return aj_emu_cvt_f32_f16(h); }
__device__ __forceinline__ aj_u16 aj_cvt_f16_f32(float f) { return aj_emu_cvt_rn_f16_f32(f); }
__device__ __forceinline__ aj_u16 aj_cvt_e4m3x2(float hi, float lo) { return aj_emu_cvt_e4m3x2(hi, lo); }
__device__ __forceinline__ aj_u32 aj_cvt_f16x2_e4m3x2(aj_u16 x) { return aj_emu_cvt_f16x2_e4m3x2(x); }

__device__ __forceinline__ aj_u32 aj_prmt(aj_u32 a, aj_u32 b, aj_u32 sel) {
  const unsigned long long bytes = (unsigned long long)b << 32 | a;
  aj_u32 r = 0;
  for (int i = 0; i < 4; ++i) r |= (aj_u32)(bytes >> (8 * ((sel >> (4 * i)) & 7)) & 0xffu) << (8 * i);
  return r;
}

__device__ __forceinline__ float aj_fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
// The nearest sum, one step down where it rounded up (the rounding error by Knuth's two-sum).
__device__ __forceinline__ float aj_add_rm(float a, float b) {
  const float s = a + b, bb = s - a, err = (a - (s - bb)) + (b - bb);
  return err < 0.0f ? __builtin_nextafterf(s, -__builtin_inff()) : s;
}

__device__ __forceinline__ float aj_ex2(float x) { return aj_emu_ex2_approx_ftz(x); }
__device__ __forceinline__ float aj_lg2(float x) { return aj_emu_lg2_approx_ftz(x); }

#endif  // AJ_EMULATE

// 2^x on the FMA pipe instead of the SFU (FlashAttention-4's exponentials): x = n + f with
// n = floor(x) and f in [0, 1); 2^f by a cubic in f (least relative error on [0, 1): at most
// 8.6e-5, 2^0 exactly 1), then n added to its exponent bits. The floor without a conversion (a
// conversion shares the exponential unit's pipe, which is what this is to relieve): x + 1.5 * 2^23
// rounded down holds floor(x) in its low mantissa bits, so its bits shifted by 23 add n to the
// exponent. Below -126 the result is +0 (as ex2.approx.ftz flushes subnormal results), -inf gives
// +0, from 128 on +inf, NaN stays NaN. The same arithmetic on the hardware and in the emulator,
// so the two agree bit for bit (probe_ex2_poly).
__device__ __forceinline__ float aj_ex2_poly(float x) {
  const float t = aj_add_rm(x, 12582912.0f);  // 1.5 * 2^23 + floor(x), for |x| < 2^22
  const float f = x - (t - 12582912.0f);      // exact
  const float p = aj_fma(aj_fma(aj_fma(0.07706263f, f, 0.22764981f), f, 0.69511571f), f, 1.0f);
  float r = aj_uint_as_float(aj_float_as_uint(p) + (aj_float_as_uint(t) << 23));
  r = x < -126.0f ? 0.0f : r;
  r = x >= 128.0f ? aj_uint_as_float(0x7f800000u) : r;
  return (aj_float_as_uint(x) & 0x7fffffffu) > 0x7f800000u ? x : r;  // NaN (a bit test no fast-math rule folds)
}
