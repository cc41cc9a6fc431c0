// The words every stage shares for a problem's element type and a kernel's tiles: the public API
// (RuntimeOptions, Problem) and the code generator both speak them, so they live below both.
#pragma once

#include <string>

// Public API: exported from the shared libattnjit, built with hidden visibility (cmake/install.cmake).
#pragma GCC visibility push(default)
namespace attnjit {

// The head dimension of q and k (and of v) wherever a caller names none: the API's Problem, the
// plan's Shape, a KernelRequest and every CLI command. One value, declared here only.
inline constexpr int kDefaultHeadDim = 64;

// E4M3: FP8 e4m3 (OCP E4M3FN), one byte: the forward's q, k and v with descale factors (its O is
// bf16 or fp16; no backward), and the paged forward's KV caches with per-head scales.
enum class DType { F32, F16, BF16, E4M3 };
const char* to_string(DType d);  // "fp32", "fp16", "bf16", "fp8_e4m3"
// "fp32|float32|f32", "fp16|float16|f16", "bf16|bfloat16", "fp8_e4m3|e4m3|float8_e4m3fn"; UserError
// otherwise.
DType parse_dtype(const std::string& s);
int dtype_bytes(DType d);

struct KernelConfig {
  int tile_q = 0, tile_k = 0, stages = 0;  // 0: the default for the path and head dim
  // Warps per block (0: the default). The tensor-core forward gives each warp tile_q / warps rows
  // (16 or 32: one or two 16-row groups sharing every K/V fragment); the other kernels have one
  // block shape per tile and take only their own count.
  int warps = 0;
  bool operator==(const KernelConfig&) const = default;
};

}  // namespace attnjit
#pragma GCC visibility pop
