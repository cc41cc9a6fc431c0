// Pieces the generated mask predicate is built from (one per layout generator). Partial tiles
// only: full tiles never evaluate a mask.

__device__ __forceinline__ aj_u64 aj_splitmix64(aj_u64 x) {
  aj_u64 z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// random layout: u = (x >> 11) * 2^-53 < density  <=>  (x >> 11) < threshold, where
// threshold = ceil(density * 2^53) is computed exactly on the host. x hashes (head, qb, kb) in
// turn; the first two rounds are the row's (aj_random_row), the last the column's.
__device__ __forceinline__ aj_u64 aj_random_row(aj_u64 seed, aj_i64 h, aj_i64 qb) {
  return aj_splitmix64(aj_splitmix64(seed ^ (aj_u64)h) ^ (aj_u64)qb);
}
__device__ __forceinline__ bool aj_random_col(aj_u64 row, aj_u64 threshold, aj_i64 kb) {
  return (aj_splitmix64(row ^ (aj_u64)kb) >> 11) < threshold;
}

// The random layout where an element's key block is the base's or the next (step 0 or 1: TWO
// holds when AJ_TILE_K x stride <= bk): both blocks are hashed once per row and each element picks.
template <bool TWO>
__device__ __forceinline__ bool aj_random_pick(aj_u64 row, aj_u64 threshold, aj_i64 kb0, int step) {
  if constexpr (TWO) {
    const bool here = aj_random_col(row, threshold, kb0), next = aj_random_col(row, threshold, kb0 + 1);
    return step ? next : here;
  } else {
    return aj_random_col(row, threshold, kb0 + step);
  }
}

// The predicate's 32-bit pieces (compiler/codegen/codegen_mask.cpp explains the form). Positions
// are >= 0 (offsets are), so block indices are plain quotients. cs, an element's distance from
// its tile's first position, lies in [0, AJ_CS_LIMIT).
#define AJ_CS_LIMIT (1 << 30)

// The rule of a branch without a mask (the generated aj_keys_rule's default).
struct AjAllowAll {
  template <class A, class B, class C> __device__ __forceinline__ bool operator()(A, B, C) const { return true; }
};

// A 64-bit bound, clamped so that comparing a value in [0, AJ_CS_LIMIT) with it is exact.
__device__ __forceinline__ int aj_bound32(aj_i64 x) { return x < -1 ? -1 : x > AJ_CS_LIMIT ? AJ_CS_LIMIT : (int)x; }

// How many blocks of size b (<= AJ_CS_LIMIT) past the base's block the element at base + cs lies,
// given base % b: (base % b + cs) / b, below 2^31.
__device__ __forceinline__ int aj_step32(aj_i64 base_rem, int cs, unsigned b) {
  return (int)(((unsigned)base_rem + (unsigned)cs) / b);
}

// (m + step) % s == phase for m = (base block) % s, s <= AJ_CS_LIMIT: the strided layout's test.
__device__ __forceinline__ bool aj_mod32_is(aj_i64 m, int step, unsigned s, unsigned phase) {
  return ((unsigned)m + (unsigned)step) % s == phase;
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

