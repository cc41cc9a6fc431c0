// Host tensors for the runtime tests (test_runtime.cpp, test_runtime_grad.cpp): a [B, S, H, D]
// tensor stored row-major or as [B, H, S, D], in fp32, fp16 or bf16.
#pragma once

#include <cstdint>
#include <vector>

#include "attnjit/attnjit.hpp"
#include "compiler/support/half.hpp"

namespace attnjit::testing {

// A [B, S, H, D] tensor stored either row-major or as [B, H, S, D] (through strides).
struct HostTensor {
  std::vector<float> f32;
  std::vector<uint16_t> f16;
  TensorView view;

  HostTensor(const std::vector<float>& values, std::vector<int64_t> shape, DType dt, bool bhsd) {
    const int64_t B = shape[0], S = shape[1], H = shape[2], D = shape[3];
    std::vector<int64_t> strides = bhsd ? std::vector<int64_t>{H * S * D, D, S * D, 1}
                                        : std::vector<int64_t>{S * H * D, H * D, D, 1};
    if (dt == DType::F32) f32.assign(values.size(), 0.0f); else f16.assign(values.size(), 0);
    size_t n = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < D; ++d) {
            const int64_t at = b * strides[0] + s * strides[1] + h * strides[2] + d;
            if (dt == DType::F32) f32[static_cast<size_t>(at)] = values[n++];
            else if (dt == DType::BF16) f16[static_cast<size_t>(at)] = float_to_bfloat16(values[n++]);
            else f16[static_cast<size_t>(at)] = float_to_half(values[n++]);
          }
    view.data = dt == DType::F32 ? static_cast<void*>(f32.data()) : static_cast<void*>(f16.data());
    view.dtype = dt;
    view.shape = std::move(shape);
    view.strides = strides;
  }
  float at(int64_t b, int64_t s, int64_t h, int64_t d) const {
    const int64_t i = b * view.strides[0] + s * view.strides[1] + h * view.strides[2] + d;
    if (view.dtype == DType::F32) return f32[static_cast<size_t>(i)];
    return view.dtype == DType::BF16 ? bfloat16_to_float(f16[static_cast<size_t>(i)]) : half_to_float(f16[static_cast<size_t>(i)]);
  }
};

inline std::vector<float> rounded_to_half(std::vector<float> v) {
  for (float& x : v) x = half_to_float(float_to_half(x));
  return v;
}

// v rounded to the values dtype dt holds (fp32: unchanged).
inline std::vector<float> rounded_to(DType dt, std::vector<float> v) {
  if (dt == DType::F16) return rounded_to_half(std::move(v));
  if (dt == DType::BF16)
    for (float& x : v) x = bfloat16_to_float(float_to_bfloat16(x));
  return v;
}


}  // namespace attnjit::testing
