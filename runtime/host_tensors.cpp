#include "runtime/host_tensors.hpp"

#include <algorithm>
#include <type_traits>

#include "runtime/npy.hpp"

namespace attnjit {
namespace {

float load_element(const void* base, DType dt, int64_t index) {
  switch (dt) {
    case DType::F32: return static_cast<const float*>(base)[index];
    case DType::F16: return half_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::BF16: return bfloat16_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::E4M3: return e4m3_to_float(static_cast<const uint8_t*>(base)[index]);
  }
  return 0.0f;
}

void store_element(void* base, DType dt, int64_t index, float value) {
  switch (dt) {
    case DType::F32: static_cast<float*>(base)[index] = value; return;
    case DType::F16: static_cast<uint16_t*>(base)[index] = float_to_half(value); return;
    case DType::BF16: static_cast<uint16_t*>(base)[index] = float_to_bfloat16(value); return;
    case DType::E4M3: static_cast<uint8_t*>(base)[index] = float_to_e4m3(value); return;
  }
}

// Calls f(n, offset, count, stride) for each innermost run of a view in row-major order: `count`
// elements from `offset` (in the view) `stride` apart, the first of them element n of the run order.
template <typename F>
void for_each_run(const TensorView& t, F&& f) {
  if (t.shape.empty()) return f(size_t{0}, int64_t{0}, int64_t{1}, int64_t{1});
  const size_t last = t.shape.size() - 1;
  const int64_t count = t.shape[last], stride = t.strides[last];
  int64_t runs = 1;
  for (size_t d = 0; d < last; ++d) runs *= t.shape[d];
  if (count == 0) return;
  std::vector<int64_t> idx(last, 0);
  for (int64_t n = 0; n < runs; ++n) {
    int64_t off = 0;
    for (size_t d = 0; d < last; ++d) off += idx[d] * t.strides[d];
    f(static_cast<size_t>(n * count), off, count, stride);
    for (size_t d = last; d-- > 0;) {
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
}

// Calls f(Element{}) with the C++ type behind `dt`'s storage, so loops convert without a switch
// per element.
template <typename F>
void with_storage(DType dt, F&& f) {
  switch (dt) {
    case DType::F32: return f(float{});
    case DType::F16:
    case DType::BF16: return f(uint16_t{});
    case DType::E4M3: return f(uint8_t{});
  }
}

}  // namespace

std::vector<float> gather(const TensorView& t) {
  int64_t total = 1;
  for (int64_t d : t.shape) total *= d;
  std::vector<float> out(static_cast<size_t>(total));
  with_storage(t.dtype, [&](auto element) {
    using E = decltype(element);
    const E* base = static_cast<const E*>(t.data);
    for_each_run(t, [&](size_t n, int64_t off, int64_t count, int64_t stride) {
      float* dst = out.data() + n;
      if constexpr (std::is_same_v<E, float>) {
        if (stride == 1) return static_cast<void>(std::copy(base + off, base + off + count, dst));
      }
      for (int64_t x = 0; x < count; ++x) dst[x] = load_element(t.data, t.dtype, off + x * stride);
    });
  });
  return out;
}
void scatter(const TensorView& t, const std::vector<float>& values) {
  with_storage(t.dtype, [&](auto element) {
    using E = decltype(element);
    E* base = static_cast<E*>(t.data);
    for_each_run(t, [&](size_t n, int64_t off, int64_t count, int64_t stride) {
      const float* src = values.data() + n;
      if constexpr (std::is_same_v<E, float>) {
        if (stride == 1) return static_cast<void>(std::copy(src, src + count, base + off));
      }
      for (int64_t x = 0; x < count; ++x) store_element(t.data, t.dtype, off + x * stride, src[x]);
    });
  });
}

TensorView head_major(const TensorView& t) {
  TensorView h = t;
  std::swap(h.shape[1], h.shape[2]);
  std::swap(h.strides[1], h.strides[2]);
  return h;
}

int64_t view_extent_bytes(const TensorView& t) {
  int64_t last = 0;
  for (size_t d = 0; d < t.shape.size(); ++d) last += (t.shape[d] - 1) * t.strides[d];
  return (last + 1) * dtype_bytes(t.dtype);
}

}  // namespace attnjit
