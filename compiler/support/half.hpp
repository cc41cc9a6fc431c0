// fp16 and bf16 <-> fp32 on the host, bit-exact: the .npy readers, the plan executor, the float64
// reference's inputs and the emulator's conversion instructions all use these.
#pragma once

#include <cstdint>

namespace attnjit {

// IEEE 754 binary16 <-> binary32. float_to_half rounds to nearest, ties to even; overflow gives inf.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);

// bfloat16 (the top half of a binary32) <-> binary32; rounds to nearest even, NaN stays NaN.
float bfloat16_to_float(uint16_t b);
uint16_t float_to_bfloat16(float f);

}  // namespace attnjit
