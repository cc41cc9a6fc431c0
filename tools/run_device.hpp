// `attnjit run --device gpu|emu`: the host float32 inputs, converted to the requested dtype, through
// the runtime on GPU 0 or on the emulator; O comes back as float32.
#pragma once

#include <string>
#include <vector>

#include "attnjit/attnjit.hpp"

namespace attnjit::cli {

void run_on_device(const Device& device, const Pattern& p, const Shape& s, const std::vector<float>& q,
                   const std::vector<float>& k, const std::vector<float>& v, const DynamicLayout* dynamic, DType dtype,
                   const KernelConfig& config, std::vector<float>& o, std::vector<float>& lse);

}  // namespace attnjit::cli
