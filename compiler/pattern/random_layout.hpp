// The `random` layout generator's hash. It is part of the spec (docs/spec.md, "random"): any language can
// rebuild the same layout from these few lines, so never change them.
#pragma once

#include <cstdint>

namespace attnjit {

// Standard splitmix64 step: add the golden-ratio increment, then two xor-shift-multiply rounds.
constexpr uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform number in [0, 1) for block (h, qb, kb): x = seed; for v in (h, qb, kb): x = splitmix64(x ^ v).
constexpr double random_block_uniform(uint64_t seed, uint64_t h, uint64_t qb, uint64_t kb) {
  uint64_t x = seed;
  x = splitmix64(x ^ h);
  x = splitmix64(x ^ qb);
  x = splitmix64(x ^ kb);
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}

constexpr bool random_block_kept(uint64_t seed, double density, uint64_t h, uint64_t qb, uint64_t kb) {
  return random_block_uniform(seed, h, qb, kb) < density;
}

// The same decision for a whole block row (h, qb): the first two rounds are shared.
struct RandomBlockRow {
  uint64_t row;
  double density;
  constexpr RandomBlockRow(uint64_t seed, double d, uint64_t h, uint64_t qb)
      : row(splitmix64(splitmix64(seed ^ h) ^ qb)), density(d) {}
  constexpr bool kept(uint64_t kb) const { return static_cast<double>(splitmix64(row ^ kb) >> 11) * 0x1.0p-53 < density; }
};

}  // namespace attnjit
