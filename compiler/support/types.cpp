#include "compiler/support/types.hpp"

#include "compiler/support/error.hpp"

namespace attnjit {

const char* to_string(DType d) { return d == DType::F32 ? "fp32" : d == DType::F16 ? "fp16" : "bf16"; }
int dtype_bytes(DType d) { return d == DType::F32 ? 4 : 2; }

DType parse_dtype(const std::string& s) {
  if (s == "fp32" || s == "float32" || s == "f32") return DType::F32;
  if (s == "fp16" || s == "float16" || s == "f16" || s == "half") return DType::F16;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  throw UserError("--dtype " + s, "unknown dtype; use fp32, fp16 or bf16");
}

}  // namespace attnjit
