// Host tensors seen through TensorViews (any strides, fp32/fp16/bf16): gathered into contiguous
// float32 and scattered back. The CPU device runs on them; the other devices use them where they
// compute on the host (the attention weights).
#pragma once

#include <vector>

#include "attnjit/attnjit.hpp"

namespace attnjit {

// A view -> contiguous float32 in the view's row-major order, and back.
std::vector<float> gather(const TensorView& t);
void scatter(const TensorView& t, const std::vector<float>& values);

// A [B, S, H, D] view seen as [B, H, S, D]: gathering it gives the executor's HeadMajor order.
TensorView head_major(const TensorView& t);

// The bytes from a view's first element to just past its last (strides >= 0).
int64_t view_extent_bytes(const TensorView& t);

}  // namespace attnjit
