// SHA-256 (FIPS 180-4), self-contained so that cache keys need no crypto library.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace attnjit {

// Streaming hasher: update() any number of times, then digest() or hex_digest() once.
class Sha256 {
public:
  Sha256();
  void update(const void* data, std::size_t size);
  void update(std::string_view data) { update(data.data(), data.size()); }
  // Finishes the hash. The object is spent afterwards; calling update() or digest() again is a bug.
  std::array<uint8_t, 32> digest();
  std::string hex_digest();  // 64 lowercase hex characters

private:
  void compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  std::size_t buffered_ = 0;   // bytes waiting in buffer_
  uint64_t total_bytes_ = 0;   // message length so far, needed for the final padding
  bool finished_ = false;
};

// One-shot: 64 lowercase hex characters.
std::string sha256_hex(std::string_view data);

}  // namespace attnjit
