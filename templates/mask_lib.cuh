// Pieces the generated mask predicate is built from (one per layout generator). Partial tiles
// only: full tiles never evaluate a mask.

__device__ __forceinline__ aj_u64 aj_splitmix64(aj_u64 x) {
  aj_u64 z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// random layout: u = (x >> 11) * 2^-53 < density  <=>  (x >> 11) < threshold, where
// threshold = ceil(density * 2^53) is computed exactly on the host.
__device__ __forceinline__ bool aj_random_kept(aj_u64 seed, aj_u64 threshold, aj_i64 h, aj_i64 qb, aj_i64 kb) {
  aj_u64 x = aj_splitmix64(seed ^ (aj_u64)h);
  x = aj_splitmix64(x ^ (aj_u64)qb);
  x = aj_splitmix64(x ^ (aj_u64)kb);
  return (x >> 11) < threshold;
}

// Membership in a sorted list (global blocks, offsets).
__device__ __forceinline__ bool aj_sorted_contains(const aj_i64* list, int n, aj_i64 v) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (list[mid] < v) lo = mid + 1; else hi = mid;
  }
  return lo < n && list[lo] == v;
}

// Membership of (qb, kb) in a sorted list of pairs stored as qb0, kb0, qb1, kb1, ...
__device__ __forceinline__ bool aj_pair_contains(const aj_i64* pairs, int n, aj_i64 qb, aj_i64 kb) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    const aj_i64 a = pairs[2 * mid], b = pairs[2 * mid + 1];
    if (a < qb || (a == qb && b < kb)) lo = mid + 1; else hi = mid;
  }
  return lo < n && pairs[2 * lo] == qb && pairs[2 * lo + 1] == kb;
}

// dynamic layout: the run-time CSR table (rows: global query blocks of each head in turn).
__device__ __forceinline__ bool aj_dynamic_allows(const AjParams& p, int h, aj_i64 qb, aj_i64 kb) {
  if (qb >= p.dyn_q_blocks) return false;
  const aj_i64 row = (p.dyn_heads == 1 ? 0 : h) * p.dyn_q_blocks + qb;
  // 64-bit positions in the table: a CSR table may hold 2^31 entries or more.
  const aj_i64 end = p.dyn_row_offsets[row + 1];
  aj_i64 lo = p.dyn_row_offsets[row], hi = end;
  while (lo < hi) {
    const aj_i64 mid = (lo + hi) >> 1;
    if (p.dyn_cols[mid] < kb) lo = mid + 1; else hi = mid;
  }
  return lo < end && p.dyn_cols[lo] == kb;
}

__device__ __forceinline__ aj_i64 aj_abs(aj_i64 x) { return x < 0 ? -x : x; }
