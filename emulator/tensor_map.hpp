// A TMA tensor map: what cuTensorMapEncodeTiled is given (CUDA driver API, "Tensor Map Object
// Management"), the rules the driver checks, and what `cp.async.bulk.tensor ... .tile` does with
// it (PTX ISA, "Tensor Access Modes: Tiled mode"). On a GPU the driver encodes the spec into its
// opaque 128 bytes (runtime/cuda/cuda_driver.cpp); for the emulator attnjit encodes it into the same
// 128 bytes in a format of its own, which the emulator's TMA decodes. Both go through the same
// checks, so a map the driver would refuse is refused before either sees it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace attnjit::emu {

// CUtensorMapDataType values (cuda.h, CUDA 13.0) for the types attnjit uses.
enum class TensorMapType : int { U8 = 0, U16 = 1, U32 = 2, F16 = 6, F32 = 7, BF16 = 9 };
int element_bytes(TensorMapType t);

struct TensorMapSpec {
  TensorMapType type = TensorMapType::BF16;
  int rank = 2;                             // 1..5; dimension 0 is the innermost
  uint64_t address = 0;                     // global address of element (0, ..., 0)
  std::array<uint64_t, 5> dims{};           // elements per dimension
  std::array<uint64_t, 5> strides{};        // bytes between consecutive elements of dimension i >= 1
                                            // (the driver's globalStrides[i - 1]); strides[0] unused
  std::array<uint32_t, 5> box{};            // elements traversed per dimension
  std::array<uint32_t, 5> element_strides{1, 1, 1, 1, 1};  // traversal step; [0] is ignored (as the driver does)
  int swizzle = 0;                          // bytes: 0, 32, 64 or 128
  bool oob_nan = false;                     // out-of-bounds elements read NaN (else zero)
};

// The first rule of cuTensorMapEncodeTiled the spec breaks, naming the field and how to fix it;
// empty when the driver would accept it.
std::string tensor_map_problem(const TensorMapSpec& s);

// The opaque object a kernel receives (CUtensorMap: 128 bytes, 64-byte aligned).
struct alignas(64) TensorMapBytes {
  uint8_t bytes[128];
};

// The emulator's encoding (UserError when tensor_map_problem is not empty), and its decoding:
// nullopt when the bytes are not an emulator tensor map (a driver-encoded map, or garbage).
TensorMapBytes encode_emulated_tensor_map(const TensorMapSpec& s);
std::optional<TensorMapSpec> decode_emulated_tensor_map(const void* bytes);

// Elements a box load brings along dimension i: ceil(box[i] / element_strides[i]) (dimension 0:
// box[0]); the box's bytes in shared memory (what the load completes on its mbarrier, in or out
// of bounds).
uint32_t box_elements(const TensorMapSpec& s, int dim);
uint64_t box_bytes(const TensorMapSpec& s);
// The shared-memory alignment a box destination needs: 128 bytes, or the swizzle pattern's
// repeat (8 rows of the swizzle width: 256, 512, 1024 bytes).
uint32_t box_alignment(const TensorMapSpec& s);
// The swizzle of a shared-window address (bits [7, 7 + log2(W/16)) XORed into bits [4, ...)),
// the same function wgmma's descriptors use.
uint32_t swizzle_address(uint32_t addr, int swizzle_bytes);

}  // namespace attnjit::emu
