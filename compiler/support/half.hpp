// fp16, bf16 and fp8 (e4m3) <-> fp32 on the host, bit-exact: the .npy readers, the plan executor, the float64
// reference's inputs and the emulator's conversion instructions all use these.
#pragma once

#include <cstddef>
#include <cstdint>

namespace attnjit {

// IEEE 754 binary16 <-> binary32. float_to_half rounds to nearest, ties to even; overflow gives inf.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

// bfloat16 (the top half of a binary32) <-> binary32; rounds to nearest even, NaN stays NaN.
float bfloat16_to_float(uint16_t b);
uint16_t float_to_bfloat16(float f);

// FP8 e4m3 (OCP "E4M3FN": 1 sign, 4 exponent bits with bias 7, 3 mantissa bits, no infinities,
// NaN = S.1111.111, largest finite 448) <-> binary32, as cvt.rn.satfinite.e4m3x2.f32 converts:
// round to nearest, ties to even; magnitudes past 448 (infinities included) saturate to +-448;
// a NaN becomes 0x7F whatever its sign (the hardware's canonical NaN, seen on an H200). Decoding is exact; either NaN code decodes to a NaN.
float e4m3_to_float(uint8_t x);
uint8_t float_to_e4m3(float f);

// One element of an e4m3 warpgroup MMA step: C (when with_c) plus the `count` products
// a[k a_step] b[k b_step], summed as Hopper's tensor core sums them (the model of Microsoft's
// MMA-Sim and of Khattak and Mikaitis's tensor-core models; it reproduces the words of the probe
// probe_wgmma_e4m3_rounding that an H200 run printed, 8 of its 4,096, the rest to be compared): each product exact, with the exponent of its factors'
// exponents added (e4m3 subnormals at 2^-6); every term, C included, truncated toward zero to a
// multiple of 2^(E - 13), E the largest of their exponents; the terms summed exactly; the sum
// truncated toward zero to 13 fraction bits. A NaN or infinity anywhere gives what an ordinary
// sum gives.
float e4m3_fused_dot_add(const double* a, size_t a_step, const double* b, size_t b_step, int count, float c, bool with_c);

}  // namespace attnjit
