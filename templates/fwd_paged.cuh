// The paged forward (decode, chunked prefill, speculative decoding): queries packed across
// requests, keys and values read from a paged KV cache through each request's block table, the
// key tiles those of the request's own plan (compiler/plan/paged_plan.hpp), so only the pages the
// pattern attends are read. SIMT, fp32 arithmetic on every storage type (sm_60 and newer): a
// decode step is bound by reading the cache, not by arithmetic.
//
// A block runs one work item over a share of its key tiles. An item holds query rows of one
// request for one or more heads of one kv group (GQA: the heads whose key tiles are the same share
// the item, so each K/V tile is read once for all of them); its rows are (head, query) pairs,
// head-major, at most AJ_TILE_Q. With split-KV (splits > 1, from the tables' header) block (x, y)
// takes the item's tiles n with n % splits == y and writes its normalised partial output and
// log2-domain LSE, and _merge combines the splits (NaN-safe: a NaN split makes the row NaN; splits
// that attended nothing weigh 0). Four warps: all load the tile (K, V as float in shared memory),
// then warp w runs rows w, w + 4, ...: lane c scores key c (one key per lane and 32-key step), the row's probabilities go
// through shared memory, and lane l accumulates output dims l, l + 32, ...
//
// A page index outside the cache (0 .. num_pages - 1) is never read. With a counter
// (AjPagedParams::errors) each such key's read is counted and the key skipped, as if masked;
// without one it reads as NaN, so the rows that attend it come out NaN.

// The caches' storage (AJ_KV_DTYPE, the generated header's; AJ_DTYPE's where it says none): q's, or
// 3 = FP8 e4m3 (OCP E4M3FN: bias 7, no infinities, S.1111.111 NaN), decoded exactly in software
// (integer and float operations alike on every arch and in the emulator) and scaled per kv head.
#ifndef AJ_KV_DTYPE
#define AJ_KV_DTYPE AJ_DTYPE
#endif
#if AJ_KV_DTYPE == 3
typedef unsigned char aj_kv_elem;
__device__ __forceinline__ float aj_kv_load(const aj_kv_elem* p) { return aj_e4m3_to_float(*p); }
#else
typedef aj_elem aj_kv_elem;
__device__ __forceinline__ float aj_kv_load(const aj_kv_elem* p) { return aj_load(p); }
#endif

#define AJ_PG_WARPS 4
#define AJ_PG_THREADS (32 * AJ_PG_WARPS)
#define AJ_PG_ROWS ((AJ_TILE_Q + AJ_PG_WARPS - 1) / AJ_PG_WARPS)  // rows per warp
#define AJ_PG_KL ((AJ_TILE_K + 31) / 32)                           // keys per lane
#define AJ_PG_VD ((AJ_HEAD_DIM_V + 31) / 32)                       // output dims per lane

// K's row pitch: where the head dim is a multiple of 4 the scores read 16 bytes of K (and of Q) at a
// time, and a pitch of 4 floats past it puts the 8 lanes of each 16-byte phase on 32 distinct
// banks; otherwise an odd pitch does the same for 4-byte reads.
#define AJ_PG_VEC_DOT (AJ_HEAD_DIM % 4 == 0)
#define AJ_PG_KPITCH (AJ_PG_VEC_DOT ? AJ_HEAD_DIM + 4 : AJ_HEAD_DIM + 1)

// Where a key of a tile lies in the cache (aj_paged_slot, below).
struct AjPagedSlot {
  int page, slot;
};

struct __align__(16) AjPagedShared {
  float q[AJ_TILE_Q][AJ_HEAD_DIM];
  float k[AJ_TILE_K][AJ_PG_KPITCH];
  float v[AJ_TILE_K][AJ_HEAD_DIM_V];
  float p[AJ_PG_WARPS][AJ_TILE_K];      // each warp's row probabilities (-1: the key is masked)
  int skip[AJ_TILE_K];                  // 1: the key's page is outside the cache, counted and skipped
  AjPagedSlot slots[AJ_TILE_K];         // the tile's keys' places in the cache
};

// Row r of an item: its head and its query row (the packed row of q, o and lse) and position.
struct AjPagedRow {
  int head;
  aj_i64 row, pos;
};
__device__ __forceinline__ AjPagedRow aj_paged_row_of(const AjItem& item, aj_i64 q_first, aj_i64 q_pos, int r) {
  const int h = r / item.rows_count;
  const aj_i64 local = item.rows_start + (aj_i64)(r - h * item.rows_count) * item.rows_stride;
  AjPagedRow out;
  out.head = item.head + h;
  out.row = q_first + local;
  out.pos = q_pos + local;
  return out;
}

// The call's splits, and whether this block has work: the header says how much of the grid the
// step's plan uses (all of it in an eager call; a CUDA graph's grid is the workspace's capacity).
__device__ __forceinline__ bool aj_paged_block_live(const AjPagedParams& pp, int& splits) {
  splits = pp.header[1];
  return aj_block_idx_x() < pp.header[0] && aj_block_idx_y() < splits;
}

// Where a key of a tile lies in the cache: its page (-1: past the tile's count, or a page index
// outside the cache, which is never read) and its slot within the page. A loader looks each key up
// once per tile, not once per chunk it copies: the block table read and the division by the page
// size are then off the copies' path (AjPagedSlot, above).
__device__ __forceinline__ AjPagedSlot aj_paged_slot(const AjPagedParams& pp, int req, const AjTile& t, int r) {
  AjPagedSlot s{-1, 0};
  if (r < t.count) {
    const aj_i64 pos = t.first + (aj_i64)r * t.stride;
    const aj_i64 page = pp.block_table[(aj_i64)req * pp.table_stride + pos / pp.page_size];
    s.page = page < 0 || page >= pp.num_pages ? -1 : (int)page;
    s.slot = (int)(pos % pp.page_size);
  }
  return s;
}
// The first element of a slot's cache row for kv head `kvh` (null: no row to read).
__device__ __forceinline__ const aj_kv_elem* aj_paged_slot_row(const void* cache, aj_i64 page_stride, aj_i64 row_stride,
                                                              aj_i64 head_stride, AjPagedSlot s, int kvh) {
  if (s.page < 0) return nullptr;
  return (const aj_kv_elem*)cache + s.page * page_stride + s.slot * row_stride + kvh * head_stride;
}

// A tile's K or V rows (`D` wide) into shared memory as float (`PITCH` floats a row): 16 bytes a
// thread where every row is 16-byte aligned (AjPagedParams::vec16), else one element. Keys past the
// tile's count are 0; the rows of a page outside the cache NaN, or 0 where such reads are counted
// (pp.errors). Values are times `scale` (1 unless the caches are FP8). With `skip` (K's load) the
// thread loading a row's first element marks there whether the row is a counted bad one, and
// counts it.
template <int D, int PITCH>
__device__ __forceinline__ void aj_paged_load_tile(const AjPagedParams& pp, const void* cache, aj_i64 page_stride,
                                                   aj_i64 row_stride, aj_i64 head_stride, const AjPagedSlot* slots, int kvh,
                                                   const AjTile& t, float scale, float* dst, int* skip) {
  const float bad = pp.errors ? 0.0f : aj_int_as_float(0x7fffffff);
  auto mark = [&](int r, bool missing) {
    if (skip == nullptr) return;
    skip[r] = missing && pp.errors ? 1 : 0;
    if (missing && pp.errors) aj_red_add_u32((aj_u32*)pp.errors, 1u);
  };
  constexpr int kVec = 16 / (int)sizeof(aj_kv_elem);  // elements in 16 bytes
  if (D % kVec == 0 && PITCH % 4 == 0 && pp.vec16) {  // 16 bytes a load, 16 bytes a store
    for (int x = aj_thread_idx(); x < AJ_TILE_K * (D / kVec); x += AJ_PG_THREADS) {
      const int r = x / (D / kVec), d = x % (D / kVec) * kVec;
      float val[kVec];
      const aj_kv_elem* row = aj_paged_slot_row(cache, page_stride, row_stride, head_stride, slots[r], kvh);
      if (row) {
        const aj_u32x4 raw = aj_ld_u32x4(row + d);
        const aj_kv_elem* e = (const aj_kv_elem*)&raw;
#pragma unroll
        for (int i = 0; i < kVec; ++i) val[i] = aj_kv_load(e + i) * scale;
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) val[i] = r < t.count ? bad : 0.0f;
      }
      if (d == 0) mark(r, r < t.count && row == nullptr);
#pragma unroll
      for (int i = 0; i < kVec; i += 4) aj_st_f32x4(dst + r * PITCH + d + i, aj_f32x4{val[i], val[i + 1], val[i + 2], val[i + 3]});
    }
    return;
  }
  for (int x = aj_thread_idx(); x < AJ_TILE_K * D; x += AJ_PG_THREADS) {
    const int r = x / D, d = x % D;
    float val = 0.0f;
    bool missing = false;
    if (r < t.count) {
      const aj_kv_elem* row = aj_paged_slot_row(cache, page_stride, row_stride, head_stride, slots[r], kvh);
      missing = row == nullptr;
      val = row ? aj_kv_load(row + d) * scale : bad;
    }
    dst[r * PITCH + d] = val;
    if (d == 0) mark(r, missing);
  }
}

__device__ __forceinline__ void aj_fwd_paged(const AjPagedParams& pp) {
  const AjParams& p = pp.fwd;
  AJ_STATIC_SHARED(AjPagedShared, sh);
  int splits;
  if (!aj_paged_block_live(pp, splits)) return;  // the whole block, before any barrier
  const int index = aj_block_idx_x(), split = aj_block_idx_y();
  const AjItem item = p.items[index];
  const int req = pp.item_request[index];
  const int warp = aj_thread_idx() / 32, lane = aj_thread_idx() % 32;
  const int kvh = item.head / p.heads_per_kv;
  const int rows = item.rows_count * pp.item_heads[index];
  const aj_i64 q_first = pp.q_start[req], q_pos = pp.q_pos[req];
  const float k_scale = pp.k_scale ? pp.k_scale[kvh] : 1.0f, v_scale = pp.v_scale ? pp.v_scale[kvh] : 1.0f;

  for (int x = aj_thread_idx(); x < AJ_TILE_Q * AJ_HEAD_DIM; x += AJ_PG_THREADS) {
    const int r = x / AJ_HEAD_DIM, d = x % AJ_HEAD_DIM;
    float val = 0.0f;
    if (r < rows) {
      const AjPagedRow at = aj_paged_row_of(item, q_first, q_pos, r);
      val = aj_load((const aj_elem*)p.q + at.row * p.q_row_stride + at.head * p.q_head_stride + d);
    }
    sh.q[r][d] = val;
  }

  float m[AJ_PG_ROWS], l[AJ_PG_ROWS], acc[AJ_PG_ROWS][AJ_PG_VD];
#pragma unroll
  for (int j = 0; j < AJ_PG_ROWS; ++j) {
    m[j] = AJ_NEG_INF;
    l[j] = 0.0f;
#pragma unroll
    for (int x = 0; x < AJ_PG_VD; ++x) acc[j][x] = 0.0f;
  }

  AjTileCursor cursor;
  cursor.begin_at(p, item, q_pos);
  for (int n = 0; !cursor.done(); cursor.next(), ++n) {
    if (n % splits != split) continue;
    const AjTile t = cursor.tile();
    for (int r = aj_thread_idx(); r < AJ_TILE_K; r += AJ_PG_THREADS) sh.slots[r] = aj_paged_slot(pp, req, t, r);
    aj_syncthreads();  // the keys' slots are in place, the previous tile no longer read (and Q in place)
    aj_paged_load_tile<AJ_HEAD_DIM, AJ_PG_KPITCH>(pp, p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, sh.slots, kvh, t, k_scale, &sh.k[0][0], sh.skip);
    aj_paged_load_tile<AJ_HEAD_DIM_V, AJ_HEAD_DIM_V>(pp, p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, sh.slots, kvh, t, v_scale, &sh.v[0][0], nullptr);
    aj_syncthreads();

#pragma unroll
    for (int j = 0; j < AJ_PG_ROWS; ++j) {
      const int r = warp + j * AJ_PG_WARPS;
      if (r >= rows) break;  // the same for the whole warp
      const AjPagedRow at = aj_paged_row_of(item, q_first, q_pos, r);
      float s[AJ_PG_KL];
      float tile_max = AJ_NEG_INF;
      bool nan = false;  // fmaxf drops a NaN score; the row must still come out NaN
#pragma unroll
      for (int e = 0; e < AJ_PG_KL; ++e) {
        const int c = lane + 32 * e;
        bool ok = c < t.count && !sh.skip[c];
        float dot = 0.0f;
        if (ok) {
#if AJ_PG_VEC_DOT
#pragma unroll 8
          for (int d = 0; d < AJ_HEAD_DIM; d += 4) {
            const aj_f32x4 a = aj_ld_f32x4(&sh.q[r][d]), b = aj_ld_f32x4(&sh.k[c][d]);
            dot += a.x * b.x;
            dot += a.y * b.y;
            dot += a.z * b.z;
            dot += a.w * b.w;
          }
#else
#pragma unroll 8
          for (int d = 0; d < AJ_HEAD_DIM; ++d) dot += sh.q[r][d] * sh.k[c][d];
#endif
          if (!t.full) ok = aj_keys_allowed(p, t.branch, at.head, at.pos, t.first, (aj_cs)c * (aj_cs)t.stride);
        }
        s[e] = ok ? aj_mul_rn(dot, p.scale_log2) : AJ_NEG_INF;  // rounded as m_new is: the maximum's weight is 1
        tile_max = fmaxf(tile_max, s[e]);
        nan |= s[e] != s[e];
      }
#pragma unroll
      for (int mask = 16; mask > 0; mask >>= 1) tile_max = fmaxf(tile_max, aj_shfl_xor(tile_max, mask));
      nan = aj_warp_any(nan);
      const float m_new = nan ? aj_int_as_float(0x7fffffff) : fmaxf(m[j], tile_max);
      if (m_new == AJ_NEG_INF) continue;  // nothing attended yet in this row
      const float rescale = aj_ex2(m[j] - m_new);
      float sum = 0.0f;
#pragma unroll
      for (int e = 0; e < AJ_PG_KL; ++e) {
        const int c = lane + 32 * e;
        // A masked key is skipped, not weighted by 0: 0 times a NaN or inf in its V would be NaN.
        const float pr = s[e] == AJ_NEG_INF ? -1.0f : aj_ex2(s[e] - m_new);
        if (s[e] != AJ_NEG_INF) sum += pr;
        if (c < AJ_TILE_K) sh.p[warp][c] = pr;
      }
#pragma unroll
      for (int mask = 16; mask > 0; mask >>= 1) sum += aj_shfl_xor(sum, mask);
      l[j] = l[j] * rescale + sum;
      aj_syncwarp();  // the warp's probabilities are in place
#pragma unroll
#pragma unroll
      for (int x = 0; x < AJ_PG_VD; ++x) acc[j][x] *= rescale;
      // Each probability read once for all of the lane's dims; each dim's sum in key order.
      for (int c = 0; c < t.count; ++c) {
        const float pc = sh.p[warp][c];
        if (pc == -1.0f) continue;
#pragma unroll
        for (int x = 0; x < AJ_PG_VD; ++x)
          if (lane + 32 * x < AJ_HEAD_DIM_V) acc[j][x] += pc * sh.v[c][lane + 32 * x];
      }
      aj_syncwarp();  // read before the next row writes them
      m[j] = m_new;
    }
  }

  // A request the device planner found wrong (its lengths) has items without spans marked so:
  // its rows come out NaN.
  if (item.span_begin < 0) {
#pragma unroll
    for (int j = 0; j < AJ_PG_ROWS; ++j) m[j] = l[j] = aj_int_as_float(0x7fffffff);
  }
#pragma unroll
  for (int j = 0; j < AJ_PG_ROWS; ++j) {
    const int r = warp + j * AJ_PG_WARPS;
    if (r >= rows) break;
    const AjPagedRow at = aj_paged_row_of(item, q_first, q_pos, r);
    // l is 0 for a row that attended nothing (O = 0, LSE = -inf) and NaN for one that saw a NaN.
    const float lse2 = l[j] == 0.0f ? AJ_NEG_INF : m[j] + aj_lg2(l[j]);
    if (splits == 1) {
      const float inv = l[j] == 0.0f ? 0.0f : p.output_scale / l[j];
      aj_elem* orow = (aj_elem*)p.o + at.row * p.o_row_stride + at.head * p.o_head_stride;
#pragma unroll
      for (int x = 0; x < AJ_PG_VD; ++x)
        if (lane + 32 * x < AJ_HEAD_DIM_V) aj_store(orow + lane + 32 * x, acc[j][x] * inv);
      if (lane == 0 && p.lse) p.lse[at.row * pp.lse_row_stride + at.head * p.lse_head_stride] = lse2 * AJ_LN2;
    } else {
      const aj_i64 part = ((aj_i64)index * splits + split) * AJ_TILE_Q + r;
      const float inv = l[j] == 0.0f ? 0.0f : 1.0f / l[j];
#pragma unroll
      for (int x = 0; x < AJ_PG_VD; ++x)
        if (lane + 32 * x < AJ_HEAD_DIM_V) pp.part_o[part * AJ_HEAD_DIM_V + lane + 32 * x] = acc[j][x] * inv;
      if (lane == 0) pp.part_lse[part] = lse2;
    }
  }
}

// Combines an item's splits: O = sum_s w_s O_s / sum_s w_s with w_s = 2^(lse2_s - max), LSE from
// the same sums. A NaN split makes the row NaN; a row no split attended is O = 0, LSE = -inf.
__device__ __forceinline__ void aj_paged_merge(const AjPagedParams& pp) {
  const AjParams& p = pp.fwd;
  int splits;
  if (!aj_paged_block_live(pp, splits) || splits == 1) return;  // one split wrote O itself
  const int index = aj_block_idx_x();
  const AjItem item = p.items[index];
  const int req = pp.item_request[index];
  const int rows = item.rows_count * pp.item_heads[index];
  for (int x = aj_thread_idx(); x < rows * AJ_HEAD_DIM_V; x += AJ_PG_THREADS) {
    const int r = x / AJ_HEAD_DIM_V, d = x % AJ_HEAD_DIM_V;
    const aj_i64 base = (aj_i64)index * splits * AJ_TILE_Q + r;
    float top = AJ_NEG_INF;
    bool nan = false;
    for (int s = 0; s < splits; ++s) {
      const float v = pp.part_lse[base + (aj_i64)s * AJ_TILE_Q];
      top = fmaxf(top, v);
      nan |= v != v;
    }
    const AjPagedRow at = aj_paged_row_of(item, pp.q_start[req], pp.q_pos[req], r);
    float out = 0.0f, lse2 = AJ_NEG_INF;
    if (nan) {
      out = lse2 = aj_int_as_float(0x7fffffff);
    } else if (top != AJ_NEG_INF) {
      float weight = 0.0f, sum = 0.0f;
      for (int s = 0; s < splits; ++s) {
        const aj_i64 part = base + (aj_i64)s * AJ_TILE_Q;
        const float v = pp.part_lse[part];
        const float w = aj_ex2(v - top);  // 0 for a split that attended nothing (its O is 0)
        weight += w;
        sum += w * pp.part_o[part * AJ_HEAD_DIM_V + d];
      }
      out = sum * (p.output_scale / weight);
      lse2 = top + aj_lg2(weight);
    }
    aj_store((aj_elem*)p.o + at.row * p.o_row_stride + at.head * p.o_head_stride + d, out);
    if (d == 0 && p.lse) p.lse[at.row * pp.lse_row_stride + at.head * p.lse_head_stride] = lse2 * AJ_LN2;
  }
}
