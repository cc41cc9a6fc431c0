// `attnjit run|grad --device gpu|emu`: the host float32 inputs, converted to the requested dtype,
// through the runtime on GPU 0 or on the emulator; results come back as float32.
#pragma once

#include <string>
#include <vector>

#include "attnjit/attnjit.hpp"

namespace attnjit::cli {

// The backward pass of `attnjit grad`: dO in, the gradients out (float32, layouts of q, k, v).
struct DeviceBackward {
  std::vector<float> dout;
  bool forward_given = false;  // o and lse hold the forward's outputs: do not run the forward
  bool deterministic = false;  // ForwardOptions::deterministic
  std::vector<float> lse_grad;  // ForwardOptions::dlse, [B, Hq, Sq]; empty: none
  std::vector<float> dq, dk, dv;
};

// FP8 inputs (dtype fp8_e4m3): q, k and v hold the values of e4m3 codes (what they are sent as),
// one descale factor per tensor, O written in `out_dtype` (bf16 or fp16).
struct DeviceFp8 {
  float q_descale = 1, k_descale = 1, v_descale = 1;
  DType out_dtype = DType::BF16;
};

// The forward (into o, lse), then with `weights` the attention weights (Attention::weights,
// float32 [B, Hq, Sq, Sk]) and with `backward` the gradients.
void run_on_device(const Device& device, const Pattern& p, const Shape& s, const std::vector<float>& q,
                   const std::vector<float>& k, const std::vector<float>& v, const DynamicLayout* dynamic, DType dtype,
                   const KernelConfig& config, std::vector<float>& o, std::vector<float>& lse,
                   DeviceBackward* backward = nullptr, std::vector<float>* weights = nullptr,
                   const std::vector<int64_t>* documents = nullptr, const DeviceFp8* fp8 = nullptr);

}  // namespace attnjit::cli
