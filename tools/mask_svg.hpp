// A picture of a mask: one panel per head, each cell shaded by the fraction of its (query, key)
// pairs attended. Works at any sequence length (it never holds the dense mask).
#pragma once

#include <string>
#include <vector>

#include "compiler/pattern/mask.hpp"

namespace attnjit::cli {

void write_mask_svg(const MaskContext& c, const std::vector<int64_t>& heads, const std::string& path,
                    int64_t max_cells = 192);

}  // namespace attnjit::cli
