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
// (AJ_CS_LIMIT, 2^30, is in kernel_abi.h: the host's mask generator uses it too.)

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
// The first of n sorted (qb, kb) pairs not below (qb, kb).
__device__ __forceinline__ int aj_pair_lower_bound(const aj_i64* pairs, int n, aj_i64 qb, aj_i64 kb) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    const aj_i64 a = pairs[2 * mid], b = pairs[2 * mid + 1];
    if (a < qb || (a == qb && b < kb)) lo = mid + 1; else hi = mid;
  }
  return lo;
}
__device__ __forceinline__ bool aj_pair_contains(const aj_i64* pairs, int n, aj_i64 qb, aj_i64 kb) {
  const int at = aj_pair_lower_bound(pairs, n, qb, kb);
  return at < n && pairs[2 * at] == qb && pairs[2 * at + 1] == kb;
}

// The smallest kb' >= kb that a row block in [qb_lo, qb_hi] pairs with in the sorted pairs (-1: none;
// kb itself, "maybe", over more than 4 row blocks). The seek for a table on the device asks it.
__device__ __forceinline__ aj_i64 aj_pair_next(const aj_i64* pairs, int n, aj_i64 qb_lo, aj_i64 qb_hi, aj_i64 kb) {
  if (qb_hi - qb_lo > 3) return kb;
  aj_i64 best = -1;
  for (aj_i64 qb = qb_lo; qb <= qb_hi; ++qb) {
    const int at = aj_pair_lower_bound(pairs, n, qb, kb);
    if (at < n && pairs[2 * at] == qb && (best < 0 || pairs[2 * at + 1] < best)) best = pairs[2 * at + 1];
  }
  return best;
}

// dynamic layout: the run-time CSR table (rows: global query blocks of each head in turn). Positions
// in the table are 64-bit (a table may hold 2^31 entries or more) and clamped to [0, dyn_entries]
// (a table on the device is not checked before the kernel reads it: aj_dynamic_check counts what
// is wrong, and nothing is read out of bounds meanwhile).
__device__ __forceinline__ void aj_dynamic_row(const AjParams& p, int h, aj_i64 qb, aj_i64& begin, aj_i64& end) {
  const aj_i64 row = (p.dyn_heads == 1 ? 0 : h) * p.dyn_q_blocks + qb;
  const aj_i64 n = p.dyn_entries, b = p.dyn_row_offsets[row], e = p.dyn_row_offsets[row + 1];
  begin = b < 0 ? 0 : b > n ? n : b;
  end = e < begin ? begin : e > n ? n : e;
}
// The first entry of [lo, end) not below kb (rows are increasing).
__device__ __forceinline__ aj_i64 aj_dynamic_lower_bound(const AjParams& p, aj_i64 lo, aj_i64 end, aj_i64 kb) {
  aj_i64 hi = end;
  while (lo < hi) {
    const aj_i64 mid = (lo + hi) >> 1;
    if (p.dyn_cols[mid] < kb) lo = mid + 1; else hi = mid;
  }
  return lo;
}
__device__ __forceinline__ bool aj_dynamic_allows(const AjParams& p, int h, aj_i64 qb, aj_i64 kb) {
  if (qb >= p.dyn_q_blocks) return false;
  aj_i64 begin, end;
  aj_dynamic_row(p, h, qb, begin, end);
  const aj_i64 at = aj_dynamic_lower_bound(p, begin, end, kb);
  return at < end && p.dyn_cols[at] == kb;
}

#ifdef AJ_KERNEL_SEEK
// ---- layouts the kernel decides (AjParams::seek_branches: a table on the device, random layouts
// above the planning threshold): the plan visits every tile the band allows, and the kernel asks
// the branch's layout which of them it keeps (the tile cursor in common.cuh, the dK/dV loop) ------

// The smallest key block >= kb that some row qb_lo..qb_hi of the device table keeps (-1: none).
__device__ __forceinline__ aj_i64 aj_dynamic_next(const AjParams& p, int h, aj_i64 qb_lo, aj_i64 qb_hi, aj_i64 kb) {
  aj_i64 best = -1;
  const aj_i64 last = qb_hi < p.dyn_q_blocks - 1 ? qb_hi : p.dyn_q_blocks - 1;
  for (aj_i64 qb = qb_lo; qb <= last; ++qb) {
    aj_i64 begin, end;
    aj_dynamic_row(p, h, qb, begin, end);
    const aj_i64 at = aj_dynamic_lower_bound(p, begin, end, kb);
    if (at < end && (best < 0 || p.dyn_cols[at] < best)) best = p.dyn_cols[at];
  }
  return best;
}
#define AJ_NEVER 0x7fffffffffffffffll

// Generated with the mask predicate (compiler/codegen/codegen_mask.cpp), by branch: the next key
// position >= x the branch's layout may keep for some query in [q_lo, q_hi] (never later than the
// layout's own next key; AJ_NEVER: none), and whether the layout keeps every pair of queries
// [q_lo, q_hi] and keys [k_lo, k_hi] (false when unsure: the tile is then masked per element).
__device__ aj_i64 aj_layout_next_key(const AjParams& p, int branch, int head, aj_i64 q_lo, aj_i64 q_hi, aj_i64 x);
__device__ bool aj_layout_whole(const AjParams& p, int branch, int head, aj_i64 q_lo, aj_i64 q_hi, aj_i64 k_lo, aj_i64 k_hi);

// Does the branch's layout keep some pair of queries [q_lo, q_hi] and keys [k_lo, k_hi] (whole: all
// of them)?
__device__ __forceinline__ bool aj_layout_pair(const AjParams& p, int branch, int head, aj_i64 q_lo, aj_i64 q_hi,
                                               aj_i64 k_lo, aj_i64 k_hi, bool& whole) {
  if (aj_layout_next_key(p, branch, head, q_lo, q_hi, k_lo) > k_hi) return false;
  whole = aj_layout_whole(p, branch, head, q_lo, q_hi, k_lo, k_hi);
  return true;
}

// The first tile >= t of the span whose keys the branch's layout may keep for the item's rows: from
// the key at the tile's start, the layout's next key, and the first key of the span at or past it
// (strided keys can step over a kept position), until the tile holding that key holds a kept one.
// A tile is never skipped while a key in it may be kept; sparse rows are crossed in jumps, not tile
// by tile.
__device__ int aj_layout_seek(const AjParams& p, const AjSpan& s, int head, aj_i64 doc, aj_i64 q_lo, aj_i64 q_hi, int t,
                              bool& whole) {
  const aj_i64 origin = p.k_offset + s.keys_start - doc;  // the position of the span's first key
  for (aj_i64 j = (aj_i64)t * AJ_TILE_K;;) {
    if (j >= s.keys_count) return 0x7fffffff;
    const aj_i64 tile = j / AJ_TILE_K;
    const aj_i64 end = (tile + 1) * AJ_TILE_K < s.keys_count ? (tile + 1) * AJ_TILE_K : s.keys_count;
    const aj_i64 k_hi = origin + (end - 1) * s.keys_stride;
    const aj_i64 n = aj_layout_next_key(p, s.branch, head, q_lo, q_hi, origin + j * s.keys_stride);
    if (n > k_hi) {
      if (n == AJ_NEVER) return 0x7fffffff;
      j = (n - origin + s.keys_stride - 1) / s.keys_stride;
      continue;
    }
    whole = aj_layout_whole(p, s.branch, head, q_lo, q_hi, origin + tile * AJ_TILE_K * s.keys_stride, k_hi);
    return (int)tile;
  }
}

// Counts what is wrong with a device table into *p.dyn_errors, the rows shared out between the
// blocks of the first batch entry (`threads` per block): row offsets outside [0, entries] or
// decreasing, a first offset other than 0 or a last other than the entries, and entries outside
// [0, key blocks) or not above the row's last good entry (compiler/pattern/mask.cpp,
// sanitize_dynamic_table, counts the same).
__device__ void aj_dynamic_check(const AjParams& p, int threads) {
  if (p.dyn_errors == nullptr || aj_batch_index() != 0) return;
  const aj_i64 rows = (aj_i64)p.dyn_heads * p.dyn_q_blocks, n = p.dyn_entries, blocks = p.num_items;
  const aj_i64 x = aj_block_idx_x(), per = rows / blocks, extra = rows % blocks;
  const aj_i64 from = x * per + (x < extra ? x : extra), to = from + per + (x < extra ? 1 : 0);
  aj_u32 bad = 0;
  if (x == 0 && aj_thread_idx() == 0 && (p.dyn_row_offsets[0] != 0 || p.dyn_row_offsets[rows] != n)) ++bad;
  for (aj_i64 r = from + aj_thread_idx(); r < to; r += threads) {
    const aj_i64 b = p.dyn_row_offsets[r], e = p.dyn_row_offsets[r + 1];
    if (b < 0 || b > n || e < b || e > n) ++bad;
    const aj_i64 begin = b < 0 ? 0 : b > n ? n : b, end = e < begin ? begin : e > n ? n : e;
    aj_i64 kept = -1;
    for (aj_i64 at = begin; at < end; ++at) {
      const aj_i64 kb = p.dyn_cols[at];
      if (kb < 0 || kb >= p.dyn_k_blocks || kb <= kept) ++bad;
      else kept = kb;
    }
  }
  if (bad) aj_red_add_u32((aj_u32*)p.dyn_errors, bad);
}
#endif

