#include "compiler/support/types.hpp"

#include "compiler/support/error.hpp"

namespace attnjit {

const char* to_string(DType d) {
  switch (d) {
    case DType::F32: return "fp32";
    case DType::F16: return "fp16";
    case DType::BF16: return "bf16";
    case DType::E4M3: return "fp8_e4m3";
  }
  return "?";
}
int dtype_bytes(DType d) { return d == DType::F32 ? 4 : d == DType::E4M3 ? 1 : 2; }

namespace {
bool is_e4m3(const std::string& s) { return s == "fp8_e4m3" || s == "e4m3" || s == "float8_e4m3fn"; }
}  // namespace

DType parse_dtype(const std::string& s) {
  if (s == "fp32" || s == "float32" || s == "f32") return DType::F32;
  if (s == "fp16" || s == "float16" || s == "f16" || s == "half") return DType::F16;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (is_e4m3(s)) return DType::E4M3;
  throw UserError("--dtype " + s, "unknown dtype; use fp32, fp16, bf16 or fp8_e4m3");
}

}  // namespace attnjit
