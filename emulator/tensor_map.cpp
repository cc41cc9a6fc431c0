// Tensor maps: the driver's rules, the emulator's encoding, the box geometry.
#include "emulator/tensor_map.hpp"

#include <cstring>
#include <sstream>

#include "compiler/support/error.hpp"

namespace attnjit::emu {
namespace {

constexpr uint32_t kMagic = 0x4d544a41;  // "AJTM"
constexpr uint32_t kVersion = 1;

// The emulator's layout of the 128 opaque bytes.
struct Encoded {
  uint32_t magic, version;
  int32_t type, rank, swizzle, oob_nan;
  uint64_t address;
  uint64_t dims[5];
  uint64_t strides[4];  // of dimensions 1..4
  uint16_t box[5];
  uint8_t element_strides[5];
};
static_assert(sizeof(Encoded) <= sizeof(TensorMapBytes));

}  // namespace

int element_bytes(TensorMapType t) {
  switch (t) {
    case TensorMapType::U8: return 1;
    case TensorMapType::U16:
    case TensorMapType::F16:
    case TensorMapType::BF16: return 2;
    case TensorMapType::U32:
    case TensorMapType::F32: return 4;
  }
  return 0;
}

std::string tensor_map_problem(const TensorMapSpec& s) {
  std::ostringstream os;
  const int eb = element_bytes(s.type);
  if (eb == 0) return "tensor map: unknown element type " + std::to_string(int(s.type));
  if (s.rank < 1 || s.rank > 5) return "tensor map: rank " + std::to_string(s.rank) + " is not in 1..5";
  if (s.address % 16) {
    os << "tensor map: the global address 0x" << std::hex << s.address << " is not 16-byte aligned";
    return os.str();
  }
  for (int i = 0; i < s.rank; ++i) {
    const std::string d = "dimension " + std::to_string(i);
    if (s.dims[size_t(i)] == 0 || s.dims[size_t(i)] > (uint64_t(1) << 32))
      return "tensor map: " + d + " has size " + std::to_string(s.dims[size_t(i)]) + "; sizes must be in 1..2^32";
    if (i > 0 && (s.strides[size_t(i)] % 16 || s.strides[size_t(i)] == 0 || s.strides[size_t(i)] >= (uint64_t(1) << 40)))
      return "tensor map: " + d + " has a stride of " + std::to_string(s.strides[size_t(i)]) +
             " bytes; strides must be non-zero multiples of 16 below 2^40 (pad the rows)";
    if (s.box[size_t(i)] == 0 || s.box[size_t(i)] > 256)
      return "tensor map: " + d + " has a box of " + std::to_string(s.box[size_t(i)]) + " elements; boxes must be in 1..256";
    if (s.element_strides[size_t(i)] == 0 || s.element_strides[size_t(i)] > 8)
      return "tensor map: " + d + " has an element stride of " + std::to_string(s.element_strides[size_t(i)]) +
             "; element strides must be in 1..8";
  }
  const uint64_t inner = uint64_t(s.box[0]) * uint64_t(eb);
  if (inner % 16) return "tensor map: the box's inner dimension is " + std::to_string(inner) + " bytes; it must be a multiple of 16";
  if (s.swizzle != 0 && s.swizzle != 32 && s.swizzle != 64 && s.swizzle != 128)
    return "tensor map: swizzle " + std::to_string(s.swizzle) + " bytes; use 0, 32, 64 or 128";
  if (s.swizzle && inner > uint64_t(s.swizzle))
    return "tensor map: the box's inner dimension is " + std::to_string(inner) + " bytes, more than the " +
           std::to_string(s.swizzle) + "-byte swizzle allows; split the box along dimension 0";
  if (s.oob_nan && s.type != TensorMapType::F16 && s.type != TensorMapType::BF16 && s.type != TensorMapType::F32)
    return "tensor map: NaN out-of-bounds fill needs a floating-point element type";
  return "";
}

uint32_t box_elements(const TensorMapSpec& s, int dim) {
  const uint32_t e = dim == 0 ? 1 : s.element_strides[size_t(dim)];
  return (s.box[size_t(dim)] + e - 1) / e;
}

uint64_t box_bytes(const TensorMapSpec& s) {
  uint64_t n = uint64_t(element_bytes(s.type));
  for (int i = 0; i < s.rank; ++i) n *= box_elements(s, i);
  return n;
}

uint32_t box_alignment(const TensorMapSpec& s) { return s.swizzle ? uint32_t(s.swizzle) * 8 : 128; }

uint32_t swizzle_address(uint32_t addr, int swizzle_bytes) {
  if (swizzle_bytes == 0) return addr;
  const uint32_t mask = uint32_t(swizzle_bytes) / 16 - 1;
  return addr ^ (((addr >> 7) & mask) << 4);
}

TensorMapBytes encode_emulated_tensor_map(const TensorMapSpec& s) {
  if (const std::string p = tensor_map_problem(s); !p.empty()) throw UserError("", p);
  Encoded e{};
  e.magic = kMagic, e.version = kVersion;
  e.type = int32_t(s.type), e.rank = s.rank, e.swizzle = s.swizzle, e.oob_nan = s.oob_nan;
  e.address = s.address;
  for (int i = 0; i < 5; ++i) {
    e.dims[i] = s.dims[size_t(i)];
    if (i > 0) e.strides[i - 1] = s.strides[size_t(i)];
    e.box[i] = uint16_t(s.box[size_t(i)]);
    e.element_strides[i] = uint8_t(s.element_strides[size_t(i)]);
  }
  TensorMapBytes out{};
  std::memcpy(out.bytes, &e, sizeof e);
  return out;
}

std::optional<TensorMapSpec> decode_emulated_tensor_map(const void* bytes) {
  Encoded e;
  std::memcpy(&e, bytes, sizeof e);
  if (e.magic != kMagic || e.version != kVersion) return std::nullopt;
  TensorMapSpec s;
  s.type = TensorMapType(e.type), s.rank = e.rank, s.swizzle = e.swizzle, s.oob_nan = e.oob_nan != 0;
  s.address = e.address;
  for (int i = 0; i < 5; ++i) {
    s.dims[size_t(i)] = e.dims[i];
    if (i > 0) s.strides[size_t(i)] = e.strides[i - 1];
    s.box[size_t(i)] = e.box[i];
    s.element_strides[size_t(i)] = e.element_strides[i];
  }
  if (!tensor_map_problem(s).empty()) return std::nullopt;
  return s;
}

}  // namespace attnjit::emu
