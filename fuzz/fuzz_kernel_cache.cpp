// The kernel-cache entry decoder (compiler/cache/kernel_cache.*): any bytes either decode or give a
// problem; an entry that decodes (with a key of 64 hex digits, as the cache writes) encodes back to
// the same bytes.
//
// Two SHA-256 checksums guard an entry, which random mutation never gets right; the custom mutator
// recomputes them after most mutations so the fuzzer reaches the fields behind them.
#include <cstring>
#include <vector>

#include "compiler/cache/kernel_cache.hpp"
#include "compiler/support/sha256.hpp"
#include "fuzz/fuzz_support.hpp"

using namespace attnjit;
using attnjit::fuzz::require;

namespace {

// The entry layout of compiler/cache/kernel_cache.cpp (pinned by tests/unit/golden/kernel_cache_entry_v1.ajk).
constexpr size_t kNameOffset = 88;
constexpr size_t kFixedHeaderBytes = kNameOffset + 8 + 32 + 32;

uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

// Rewrites both checksums to match the bytes, where the lengths in the header allow it.
void fix_checksums(uint8_t* data, size_t size) {
  if (size < kNameOffset) return;
  const uint64_t header_size = kFixedHeaderBytes + get_le(data + 80, 4) + get_le(data + 84, 4);
  if (header_size > size) return;
  Sha256 payload;
  payload.update(data + header_size, size - header_size);
  const auto payload_digest = payload.digest();
  std::memcpy(data + header_size - 64, payload_digest.data(), 32);
  Sha256 header;
  header.update(data, header_size - 32);
  const auto header_digest = header.digest();
  std::memcpy(data + header_size - 32, header_digest.data(), 32);
}

bool is_hex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  size = LLVMFuzzerMutate(data, size, max_size);
  if (seed % 8 != 0) fix_checksums(data, size);  // one mutation in eight keeps its broken checksums
  return size;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> bytes(data, data + size);
  std::string problem;
  const std::optional<DecodedCacheEntry> entry = decode_cache_entry(bytes, &problem);
  if (!entry) {
    require(!problem.empty(), "a rejected entry says why");
    return 0;
  }
  require(problem.empty(), "an entry that decodes has no problem");
  if (!is_hex64(entry->key_hex)) return 0;  // the cache compares it with the key it looks up, and misses
  require(encode_cache_entry(entry->key_hex, entry->payload, entry->kernel_name, entry->arch) == bytes,
          "a decoded entry encodes to the same bytes");
  return 0;
}
