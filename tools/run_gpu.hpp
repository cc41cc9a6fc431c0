// `attnjit run --device gpu`: the host float32 inputs, converted to the requested dtype, through
// the runtime on GPU 0; O comes back as float32.
#pragma once

#include <string>
#include <vector>

#include "compiler/codegen.hpp"
#include "compiler/mask.hpp"

namespace attnjit::cli {

void run_on_gpu(const Pattern& p, const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
                const std::vector<float>& v, const DynamicLayout* dynamic, DType dtype, std::vector<float>& o,
                std::vector<float>& lse);

}  // namespace attnjit::cli
