// The paged forward's planner on the device (the `_plan` entry): one block turns the step's lengths,
// read from device memory, into the tables fwd_paged.cuh walks (the header, items, spans and the
// per-request rows), so a decode step captured in a CUDA graph replays with new lengths and no
// work on the host. compiler/plan/paged_plan.cpp plans the same calls on the host; this planner's
// items are coarser where that one merges strided rows, and visit the same key tiles for a single
// query row (a unit test compares the two).
//
// The pattern comes as constant tables, generated with the kernel for its query heads:
//   AJ_PG_NB, AJ_PG_CLASSES               branches; classes of heads planned together
//   aj_pg_segment[b]                      segment length (0: the whole sequence is one)
//   aj_pg_dilation[b]
//   aj_pg_left[b], aj_pg_right[b]         the band: kpos >= qpos - left, kpos <= qpos + right
//                                         (-1: unbounded; causal is right = min(right, 0))
//   aj_pg_class_head[c], aj_pg_class_heads[c]  a class: consecutive heads of one kv group whose
//                                         branches, offsets and layouts are the same, at most
//                                         AJ_TILE_Q of them (they share one item, GQA)
//   aj_pg_class_offset[c * AJ_PG_NB + b]  the class's offset in branch b (-1: b does not apply)
//
// A branch's block layout is left to the forward, which seeks through it (the host sets its bit in
// AjParams::seek_branches): the spans hold the band's tiles.
//
// Items: for each request and class, runs of consecutive query rows whose branch sets and
// segments agree (the rows of one item share every span), at most AJ_TILE_Q / heads rows each.
// The spans of item i are spans[i * AJ_PG_NB ...], in range form. A request whose lengths are
// wrong (kv_len < its queries, negative, past its block table's pages) gets items marked
// span_begin = -1, which the forward writes as NaN; one whose cu_seqlens_q entries are out of order
// or past total_q gets none. Each such request is counted in AjPagedParams::errors (when given).
// Items past the workspace's capacity are dropped and counted (only inconsistent cu_seqlens_q
// entries can make them). Threads share out (request, class) pairs and walk their rows one by one:
// made for decode and speculative steps, a few rows per request (a long prefill chunk is one
// thread's walk; docs/performance.md, "Planning on the device").

#define AJ_PG_PLAN_THREADS AJ_PG_THREADS

// A request's queries, first position and length, and whether they are consistent.
struct AjPgRequest {
  aj_i64 first_row, queries, q_pos, kv_len;
  bool rows_ok;  // its rows lie in 0 .. total_q (else: no items)
  bool len_ok;   // its length covers its queries and fits its block table (else: NaN rows)
};
__device__ __forceinline__ AjPgRequest aj_pg_request(const AjPagedParams& pp, int b) {
  AjPgRequest r;
  const aj_i64 c0 = pp.dev_cu_seqlens_q ? pp.dev_cu_seqlens_q[b] : b;
  const aj_i64 c1 = pp.dev_cu_seqlens_q ? pp.dev_cu_seqlens_q[b + 1] : b + 1;
  r.rows_ok = c0 >= 0 && c0 <= c1 && c1 <= pp.total_q;
  r.first_row = c0;
  r.queries = r.rows_ok ? c1 - c0 : 0;
  r.kv_len = pp.dev_kv_lens[b];
  const aj_i64 pages = (r.kv_len + pp.page_size - 1) / pp.page_size;
  r.len_ok = r.kv_len >= r.queries && pages <= pp.table_stride;
  r.q_pos = r.len_ok ? r.kv_len - r.queries : 0;
  return r;
}

__device__ __forceinline__ aj_i64 aj_pg_segment_of(int b, aj_i64 pos) {
  return aj_pg_segment[b] ? pos / aj_pg_segment[b] : 0;
}
__device__ __forceinline__ bool aj_pg_selected(int b, aj_i64 off, aj_i64 pos) {
  return (pos - aj_pg_segment_of(b, pos) * aj_pg_segment[b]) % aj_pg_dilation[b] == off;
}

// Do the rows at positions `a` and `c` of class `cls` take part in the same branches, in the same
// segments? (Then one item holds both: its spans are the first row's.)
__device__ __forceinline__ bool aj_pg_same_keys(int cls, aj_i64 a, aj_i64 c) {
  for (int b = 0; b < AJ_PG_NB; ++b) {
    const aj_i64 off = aj_pg_class_offset[cls * AJ_PG_NB + b];
    if (off < 0) continue;
    const bool sa = aj_pg_selected(b, off, a);
    if (sa != aj_pg_selected(b, off, c)) return false;
    if (sa && aj_pg_segment_of(b, a) != aj_pg_segment_of(b, c)) return false;
  }
  return true;
}

// The end of the run of rows that starts at row `i` of a request (`n` rows, the first at `q_pos`).
__device__ __forceinline__ aj_i64 aj_pg_run_end(int cls, bool len_ok, aj_i64 q_pos, aj_i64 i, aj_i64 n) {
  const int heads = aj_pg_class_heads[cls];
  const aj_i64 most = AJ_TILE_Q / heads > 0 ? AJ_TILE_Q / heads : 1;
  aj_i64 j = i + 1;
  while (j < n && j - i < most && (!len_ok || aj_pg_same_keys(cls, q_pos + i, q_pos + j))) ++j;
  return j;
}

// Index of the first member >= x of the keys first + k * stride (k < n), n if none; of the last <= x, -1.
__device__ __forceinline__ aj_i64 aj_pg_first_at_least(aj_i64 first, aj_i64 stride, aj_i64 n, aj_i64 x) {
  if (x <= first) return 0;
  const aj_i64 k = (x - first + stride - 1) / stride;
  return k < n ? k : n;
}
__device__ __forceinline__ aj_i64 aj_pg_last_at_most(aj_i64 first, aj_i64 stride, aj_i64 n, aj_i64 x) {
  if (x < first) return -1;
  const aj_i64 k = (x - first) / stride;
  return k < n - 1 ? k : n - 1;
}

// The span branch `b` (offset `off`) offers the rows at positions [q_lo, q_hi] of a request with
// `kv_len` cached tokens: the branch's keys in the segment of q_lo below kv_len, the tiles the band
// reaches, and those inside it whole (compiler/plan/plan_geometry.cpp's add_span, for consecutive
// rows: no tile in between is empty). False when no tile is visited.
__device__ __forceinline__ bool aj_pg_span(int b, aj_i64 off, aj_i64 q_lo, aj_i64 q_hi, aj_i64 kv_len, AjSpan& s) {
  const aj_i64 seg_len = aj_pg_segment[b], r = aj_pg_dilation[b];
  const aj_i64 seg = seg_len ? q_lo / seg_len * seg_len : 0;
  const aj_i64 end = seg_len && seg + seg_len < kv_len ? seg + seg_len : kv_len;
  const aj_i64 first = seg + off;
  if (first >= end) return false;
  const aj_i64 n = (end - 1 - first) / r + 1, tk = AJ_TILE_K, nt = (n + tk - 1) / tk;
  const aj_i64 left = aj_pg_left[b], right = aj_pg_right[b];
  aj_i64 tb = 0, te = nt, fb = 0, fe = nt;
  if (left >= 0 || right >= 0) {
    const aj_i64 lo = left >= 0 ? aj_pg_first_at_least(first, r, n, q_lo - left) : 0;
    const aj_i64 hi = right >= 0 ? aj_pg_last_at_most(first, r, n, q_hi + right) : n - 1;
    if (lo > hi) return false;
    tb = lo / tk;
    te = hi / tk + 1;
    const aj_i64 flo = left >= 0 ? aj_pg_first_at_least(first, r, n, q_hi - left) : 0;
    const aj_i64 fhi = right >= 0 ? aj_pg_last_at_most(first, r, n, q_lo + right) : n - 1;
    fb = (flo + tk - 1) / tk;
    fb = fb < tb ? tb : fb > te ? te : fb;
    fe = fhi == n - 1 ? nt : (fhi + 1) / tk;
    fe = fe < fb ? fb : fe > te ? te : fe;
    if (flo > fhi) fe = fb;
  }
  s.keys_start = first;
  s.keys_stride = r;
  s.keys_count = (int)n;
  s.branch = b;
  s.tile_begin = (int)tb, s.tile_end = (int)te;
  s.full_begin = (int)fb, s.full_end = (int)fe;
  s.entry_begin = s.entry_end = -1;
  s.weight_begin = -1;
  return true;
}

// Items of (request, class) units [u0, u1): counted (write false) or written from index `at`
// (write true). Returns the items; `most_tiles` the largest item's visited tiles.
__device__ aj_i64 aj_pg_units(const AjPagedParams& pp, aj_i64 u0, aj_i64 u1, aj_i64 at, bool write, aj_i64& most_tiles,
                              aj_u32& bad) {
  AjItem* items = (AjItem*)pp.fwd.items;
  AjSpan* spans = (AjSpan*)pp.fwd.spans;
  int* item_request = (int*)pp.item_request;
  int* item_heads = (int*)pp.item_heads;
  aj_i64 count = 0;
  for (aj_i64 u = u0; u < u1; ++u) {
    const int b = (int)(u / AJ_PG_CLASSES), cls = (int)(u % AJ_PG_CLASSES);
    const AjPgRequest r = aj_pg_request(pp, b);
    if (write && cls == 0) {
      ((aj_i64*)pp.q_start)[b] = r.first_row;
      ((aj_i64*)pp.q_pos)[b] = r.q_pos;
      if (!r.rows_ok || !r.len_ok) ++bad;
    }
    for (aj_i64 i = 0; i < r.queries;) {
      const aj_i64 j = aj_pg_run_end(cls, r.len_ok, r.q_pos, i, r.queries);
      const aj_i64 index = at + count++;
      if (write && index < pp.cap_items) {
        AjItem it;
        it.rows_start = i;
        it.rows_stride = 1;
        it.rows_count = (int)(j - i);
        it.head = aj_pg_class_head[cls];
        it.span_begin = it.span_end = -1;
        if (r.len_ok) {
          it.span_begin = it.span_end = (int)(index * AJ_PG_NB);
          aj_i64 tiles = 0;
          for (int br = 0; br < AJ_PG_NB; ++br) {
            const aj_i64 off = aj_pg_class_offset[cls * AJ_PG_NB + br];
            if (off < 0 || !aj_pg_selected(br, off, r.q_pos + i)) continue;
            AjSpan s;
            if (!aj_pg_span(br, off, r.q_pos + i, r.q_pos + j - 1, r.kv_len, s)) continue;
            spans[it.span_end++] = s;
            tiles += s.tile_end - s.tile_begin;
          }
          if (tiles > most_tiles) most_tiles = tiles;
        }
        items[index] = it;
        item_request[index] = b;
        item_heads[index] = aj_pg_class_heads[cls];
      } else if (write) {
        ++bad;  // past the workspace: dropped
      }
      i = j;
    }
  }
  return count;
}

struct AjPgPlanShared {
  aj_i64 sums[AJ_PG_PLAN_THREADS];   // each thread's items, then where they start
  aj_i64 tiles[AJ_PG_PLAN_THREADS];  // the total items, then each thread's largest item (tiles)
};

__device__ void aj_paged_plan(const AjPagedParams& pp) {
  AJ_STATIC_SHARED(AjPgPlanShared, sh);
  aj_i64* const sums = sh.sums;
  aj_i64* const tiles = sh.tiles;
  const int t = aj_thread_idx();
  // Thread t plans units [u0, u1): its count, the block's prefix of the counts, then its items.
  const aj_i64 units = (aj_i64)pp.requests * AJ_PG_CLASSES;
  const aj_i64 u0 = units * t / AJ_PG_PLAN_THREADS, u1 = units * (t + 1) / AJ_PG_PLAN_THREADS;
  aj_i64 most = 0;
  aj_u32 bad = 0;
  sums[t] = aj_pg_units(pp, u0, u1, 0, false, most, bad);
  aj_syncthreads();
  if (t == 0) {
    aj_i64 run = 0;
    for (int x = 0; x < AJ_PG_PLAN_THREADS; ++x) {
      const aj_i64 n = sums[x];
      sums[x] = run;
      run += n;
    }
    tiles[0] = run;  // the total, until the barrier below
  }
  aj_syncthreads();
  const aj_i64 total = tiles[0];
  aj_syncthreads();
  aj_pg_units(pp, u0, u1, sums[t], true, most, bad);
  tiles[t] = most;
  if (bad && pp.errors) aj_red_add_u32((aj_u32*)pp.errors, bad);
  aj_syncthreads();
  if (t == 0) {
    for (int x = 1; x < AJ_PG_PLAN_THREADS; ++x) most = tiles[x] > most ? tiles[x] : most;
    const aj_i64 items = total < pp.cap_items ? total : pp.cap_items;
    aj_i64 splits = 1;
    if (pp.fixed_splits > 0) {
      splits = pp.fixed_splits;
    } else if (items > 0) {  // compiler/plan/paged_plan.cpp's paged_splits
      splits = (pp.target_blocks + items - 1) / items;
      if (splits > most) splits = most;
      if (splits > 64) splits = 64;
      if (splits < 1) splits = 1;
    }
    if (splits > pp.cap_splits) splits = pp.cap_splits;
    int* header = (int*)pp.header;
    header[0] = (int)items;
    header[1] = (int)splits;
  }
}
