// The paged forward on tensor cores (sm_80 and newer, fp16/bf16 queries; fwd_paged.cuh, included
// before this file, brings the tables, the row map, the cache reads and the merge): the same work
// items and splits as the SIMT kernel, S = Q K^T and O += P V by mma.m16n8k16 with fp32
// accumulators. An item's rows (heads x queries, at most AJ_TILE_Q = 16) are one m16 tile; each
// 64-key tile is shared out between the four warps, 16 keys each (flash-decoding inside the block):
// every warp copies its own keys' K and V rows and keeps its own running maximum, sum and output
// for all 16 rows over them, with no block barrier until the four are merged at the end through
// shared memory. A GQA group of 4 to 16 query heads fills the
// tile's rows, which is what the SIMT kernel's per-row dot products cannot use.
//
// FP8 caches are decoded exactly into the queries' type as they are loaded (every e4m3 value is an
// fp16 and a bf16 value), and the per-kv-head scales applied in fp32: K's to the scores, V's to the
// output. A masked key's P is 0, and 0 times a non-finite V is NaN, so a warp whose 16 keys hold a
// non-finite V takes P V one key at a time in fp32, skipping the keys each row does not attend.

#if AJ_TILE_Q != 16 || AJ_TILE_K != 64 || AJ_HEAD_DIM % 16 || AJ_HEAD_DIM_V % 16
#error "the tensor-core paged forward takes 16 rows, 64-key tiles and head dims that are multiples of 16"
#endif
#define AJ_PT_DP (AJ_HEAD_DIM + 8)     // shared pitches in elements: ldmatrix rows 16 bytes apart in banks
#define AJ_PT_DVP (AJ_HEAD_DIM_V + 8)
#define AJ_PT_KEYS 16                  // keys per warp in a tile
// The float rows the warps store their fragments' pairs into (P's copy, the outputs): 8 floats
// longer than the data, so that a half warp's 8-byte pairs (four rows, eight words each) fall on 32
// distinct banks; unpadded, a warp's single-float stores met four or eight to a bank.
#define AJ_PT_KEYS_P (AJ_PT_KEYS + 8)
#define AJ_PT_DVO (AJ_HEAD_DIM_V + 8)

struct __align__(16) AjPagedTcShared {
  union {
    struct {
      aj_elem k[AJ_TILE_K][AJ_PT_DP];
      aj_elem v[AJ_TILE_K][AJ_PT_DVP];
    } kv;
    float o[AJ_PG_WARPS][16][AJ_PT_DVO];  // after the loop: each warp's unnormalised output
  };
  aj_elem q[16][AJ_PT_DP];
  float p[AJ_PG_WARPS][16][AJ_PT_KEYS_P];     // the rare path's probabilities (-1: not attended)
  float m[AJ_PG_WARPS][16], l[AJ_PG_WARPS][16];
  int skip[AJ_TILE_K];                        // 1: the key's page is outside the cache, counted and skipped
  AjPagedSlot slots[AJ_PG_WARPS][AJ_PT_KEYS]; // each warp's keys' places in the cache
};

// Eight elements of a cache row into shared memory in the queries' type: 16 bytes by cp.async where
// the cache is the queries' type and rows are aligned; FP8 codes 8 to a read where rows are
// aligned, decoded exactly; else read one element at a time. `row` null: a key past the tile (0) or
// on a page outside the cache (`bad`). What is not a cp.async is one 16-byte store, as the copies
// are (eight 2-byte stores a lane met four lanes to a bank).
__device__ __forceinline__ void aj_pt_load8(aj_elem* dst, const aj_kv_elem* row, bool vec16, float bad) {
#if AJ_KV_DTYPE == AJ_DTYPE
  if (row && vec16) {
    aj_cp_async16(dst, row, true);
    return;
  }
#elif AJ_KV_DTYPE == 3
  if (row && vec16) {  // a chunk of 8 codes starts 8 bytes into an aligned row
    const aj_u64 raw = *(const aj_u64*)row;
#if AJ_KV_CVT
    // Two codes at a time to fp16 (cvt.rn.f16x2.e4m3x2: the upper byte to the upper half), then,
    // for bf16 queries, through fp32 (every e4m3 value is a bf16 value: exact).
    aj_u32 w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[i] = aj_cvt_f16x2_e4m3x2((aj_u16)(raw >> (16 * i)));
#if AJ_DTYPE == 2
      w[i] = aj_cvt_bf16x2(aj_cvt_f32_f16((aj_u16)(w[i] >> 16)), aj_cvt_f32_f16((aj_u16)w[i]));
#endif
    }
    aj_st_u32x4(dst, aj_u32x4{w[0], w[1], w[2], w[3]});
#else
    aj_u32 w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const aj_kv_elem lo = (aj_kv_elem)(raw >> (16 * i)), hi = (aj_kv_elem)(raw >> (16 * i + 8));
      w[i] = aj_pack2(aj_kv_load(&lo), aj_kv_load(&hi));
    }
    aj_st_u32x4(dst, aj_u32x4{w[0], w[1], w[2], w[3]});
#endif
    return;
  }
#endif
  // Exact: the elements are values of the queries' type (or e4m3 values, which all are), `bad` 0 or NaN.
  aj_u32 w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) w[i] = row ? aj_pack2(aj_kv_load(row + 2 * i), aj_kv_load(row + 2 * i + 1)) : aj_pack2(bad, bad);
  aj_st_u32x4(dst, aj_u32x4{w[0], w[1], w[2], w[3]});
}

// The warp's 16 keys of a tile: their K and V rows, which only this warp reads. Lanes 0-15 look
// their key up once (the block table and the division by the page size, off the copies' path) and
// mark it in `skip` where a counter takes keys on pages outside the cache (counted, their rows 0;
// without a counter such rows read as NaN). Then every lane copies 16-byte chunks. The warp waits
// for its own copies only: no block barrier in the loop, so one warp's copies overlap the other
// warps' arithmetic.
__device__ __forceinline__ void aj_pt_load_keys(const AjPagedParams& pp, AjPagedTcShared& sh, int req, int kvh, const AjTile& t,
                                                int warp, int lane, int k0) {
  const AjParams& p = pp.fwd;
  const float nan = aj_int_as_float(0x7fffffff);
  if (lane < AJ_PT_KEYS) {
    const AjPagedSlot s = aj_paged_slot(pp, req, t, k0 + lane);
    const bool missing = k0 + lane < t.count && s.page < 0;
    sh.slots[warp][lane] = s;
    sh.skip[k0 + lane] = missing && pp.errors ? 1 : 0;
    if (missing && pp.errors) aj_red_add_u32((aj_u32*)pp.errors, 1u);
  }
  aj_syncwarp();  // the keys' slots are in place
  constexpr int KC = AJ_HEAD_DIM / 8, VC = AJ_HEAD_DIM_V / 8;
#pragma unroll 4
  for (int x = lane; x < AJ_PT_KEYS * (KC + VC); x += 32) {
    const bool is_k = x < AJ_PT_KEYS * KC;
    const int y = is_k ? x : x - AJ_PT_KEYS * KC, chunks = is_k ? KC : VC;
    const int r = y / chunks, c = y % chunks * 8;
    const AjPagedSlot s = sh.slots[warp][r];
    const aj_kv_elem* row = is_k ? aj_paged_slot_row(p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, s, kvh)
                                 : aj_paged_slot_row(p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, s, kvh);
    const bool missing = k0 + r < t.count && row == nullptr;
    aj_elem* dst = is_k ? &sh.kv.k[k0 + r][c] : &sh.kv.v[k0 + r][c];
    aj_pt_load8(dst, row ? row + c : nullptr, pp.vec16 != 0, missing && !pp.errors ? nan : 0.0f);
  }
  aj_cp_async_commit();
  aj_cp_async_wait<0>();
  aj_syncwarp();  // every lane's copies are in place
}

__device__ __forceinline__ void aj_fwd_paged_tc(const AjPagedParams& pp) {
  const AjParams& p = pp.fwd;
  AJ_STATIC_SHARED(AjPagedTcShared, sh);
  int splits;
  if (!aj_paged_block_live(pp, splits)) return;  // the whole block, before any barrier
  const int index = aj_block_idx_x(), split = aj_block_idx_y();
  const AjItem item = p.items[index];
  const int req = pp.item_request[index];
  const int warp = aj_thread_idx() / 32, lane = aj_thread_idx() % 32, g = lane / 4, quad = lane % 4;
  const int kvh = item.head / p.heads_per_kv;
  const int rows = item.rows_count * pp.item_heads[index];
  const aj_i64 q_first = pp.q_start[req], q_pos = pp.q_pos[req];
  // K's scale on the scores (exp2 units), V's on the output.
  const float scale_log2 = p.scale_log2 * (pp.k_scale ? pp.k_scale[kvh] : 1.0f);
  const float v_scale = pp.v_scale ? pp.v_scale[kvh] : 1.0f;

  for (int x = aj_thread_idx(); x < 16 * AJ_HEAD_DIM; x += AJ_PG_THREADS) {
    const int r = x / AJ_HEAD_DIM, d = x % AJ_HEAD_DIM;
    aj_elem val = 0;
    if (r < rows) {
      const AjPagedRow at = aj_paged_row_of(item, q_first, q_pos, r);
      val = ((const aj_elem*)p.q)[at.row * p.q_row_stride + at.head * p.q_head_stride + d];
    }
    sh.q[r][d] = val;
  }
  // This thread's rows g and g + 8: their heads and positions (rows past the item: its first row's).
  AjPagedRow at[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) at[h] = aj_paged_row_of(item, q_first, q_pos, g + 8 * h < rows ? g + 8 * h : 0);
  aj_syncthreads();  // Q is in place (its fragments are read from shared memory per tile: 32 registers
                     // fewer, so three blocks fit an SM at head dim 128, not two)

  float acc[AJ_HEAD_DIM_V / 8][4];
#pragma unroll
  for (int j = 0; j < AJ_HEAD_DIM_V / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  float m[2] = {AJ_NEG_INF, AJ_NEG_INF}, l[2] = {0.0f, 0.0f};
  const int k0 = warp * AJ_PT_KEYS;  // this warp's keys in every tile
  const int k_row = (lane & 7) + ((lane >> 4) << 3), k_col = ((lane >> 3) & 1) * 8;
  const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8, v_col = (lane >> 4) * 8;

  AjTileCursor cursor;
  cursor.begin_at(p, item, q_pos);
  for (int n = 0; !cursor.done(); cursor.next(), ++n) {
    if (n % splits != split) continue;
    const AjTile t = cursor.tile();
    if (k0 >= t.count) continue;  // the whole warp: none of its keys in this tile
    aj_syncwarp();  // the warp's keys of the previous tile are no longer read
    aj_pt_load_keys(pp, sh, req, kvh, t, warp, lane, k0);

    float s[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < AJ_HEAD_DIM / 16; ++ks) {
      aj_u32 qf[4], kf[4];
      aj_ldmatrix_x4(qf, &sh.q[lane % 16][ks * 16 + (lane / 16) * 8]);
      aj_ldmatrix_x4(kf, &sh.kv.k[k0 + k_row][ks * 16 + k_col]);
      aj_mma(s[0], qf, kf[0], kf[1]);
      aj_mma(s[1], qf, kf[2], kf[3]);
    }
    // Mask and scale: element e of n-tile j is row g + 8 (e / 2), key k0 + 8 j + 2 quad + e % 2.
    bool nan[2] = {false, false};
    float tmax[2] = {AJ_NEG_INF, AJ_NEG_INF};
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2, c = k0 + 8 * j + 2 * quad + e % 2;
        bool ok = g + 8 * h < rows && c < t.count && !sh.skip[c];
        if (ok && !t.full) ok = aj_keys_allowed(p, t.branch, at[h].head, at[h].pos, t.first, (aj_cs)c * (aj_cs)t.stride);
        s[j][e] = ok ? aj_mul_rn(s[j][e], scale_log2) : AJ_NEG_INF;
        nan[h] |= s[j][e] != s[j][e];
        tmax[h] = fmaxf(tmax[h], s[j][e]);
      }
    // The rows' online softmax over the warp's keys (a row's values lie with the quad's 4 lanes).
    float rescale[2], m_new[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int mask = 1; mask < 4; mask <<= 1) {
        tmax[h] = fmaxf(tmax[h], aj_shfl_xor(tmax[h], mask));
        nan[h] |= aj_shfl_xor(nan[h] ? 1.0f : 0.0f, mask) != 0.0f;
      }
      m_new[h] = nan[h] ? aj_int_as_float(0x7fffffff) : fmaxf(m[h], tmax[h]);
      rescale[h] = m_new[h] == AJ_NEG_INF ? 1.0f : aj_ex2(m[h] - m_new[h]);
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float kept[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2;
        // A masked key's probability is 0 (and -1 in the rare path's copy: skipped there).
        const bool attended = s[j][e] != AJ_NEG_INF;
        s[j][e] = attended ? aj_ex2(s[j][e] - m_new[h]) : 0.0f;
        sum[h] += s[j][e];
        kept[e] = attended ? s[j][e] : -1.0f;
      }
      aj_st_f32x2(&sh.p[warp][g][8 * j + 2 * quad], aj_f32x2{kept[0], kept[1]});
      aj_st_f32x2(&sh.p[warp][g + 8][8 * j + 2 * quad], aj_f32x2{kept[2], kept[3]});
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int mask = 1; mask < 4; mask <<= 1) sum[h] += aj_shfl_xor(sum[h], mask);
      l[h] = l[h] * rescale[h] + sum[h];
      m[h] = m_new[h];
    }
#pragma unroll
    for (int j = 0; j < AJ_HEAD_DIM_V / 8; ++j) {
      acc[j][0] *= rescale[0], acc[j][1] *= rescale[0];
      acc[j][2] *= rescale[1], acc[j][3] *= rescale[1];
    }
    // A non-finite V among the warp's keys: each row's attended keys one at a time (exact), else
    // the tensor cores.
    bool bad = false;
    for (int x = lane; x < AJ_PT_KEYS * AJ_HEAD_DIM_V / 8; x += 32) {
      const aj_u32x4 w = aj_ld_u32x4(&sh.kv.v[k0 + x / (AJ_HEAD_DIM_V / 8)][x % (AJ_HEAD_DIM_V / 8) * 8]);
      bad |= aj_tc_word_nonfinite(w.x) | aj_tc_word_nonfinite(w.y) | aj_tc_word_nonfinite(w.z) | aj_tc_word_nonfinite(w.w);
    }
    if (aj_warp_any(bad)) {
      aj_syncwarp();  // the warp's probabilities are in place
#pragma unroll
      for (int j = 0; j < AJ_HEAD_DIM_V / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = g + 8 * (e / 2), d = 8 * j + 2 * quad + e % 2;
          for (int c = 0; c < AJ_PT_KEYS && k0 + c < t.count; ++c) {
            const float pc = sh.p[warp][r][c];
            if (pc != -1.0f) acc[j][e] += pc * aj_load(&sh.kv.v[k0 + c][d]);
          }
        }
      aj_syncwarp();  // read before the next tile's probabilities are written
      continue;
    }
    aj_u32 pa[4];
    pa[0] = aj_pack2(s[0][0], s[0][1]);
    pa[1] = aj_pack2(s[0][2], s[0][3]);
    pa[2] = aj_pack2(s[1][0], s[1][1]);
    pa[3] = aj_pack2(s[1][2], s[1][3]);
#pragma unroll
    for (int dp = 0; dp < AJ_HEAD_DIM_V / 16; ++dp) {
      aj_u32 vf[4];
      aj_ldmatrix_x4_trans(vf, &sh.kv.v[k0 + v_row][dp * 16 + v_col]);
      aj_mma(acc[2 * dp], pa, vf[0], vf[1]);
      aj_mma(acc[2 * dp + 1], pa, vf[2], vf[3]);
    }
  }

  // The four warps' partial results merged: O = sum_w 2^(m_w - M) O_w / sum_w 2^(m_w - M) l_w.
  aj_syncthreads();  // K and V are no longer read: their space holds the warps' outputs
#pragma unroll
  for (int j = 0; j < AJ_HEAD_DIM_V / 8; ++j) {
    aj_st_f32x2(&sh.o[warp][g][8 * j + 2 * quad], aj_f32x2{acc[j][0], acc[j][1]});
    aj_st_f32x2(&sh.o[warp][g + 8][8 * j + 2 * quad], aj_f32x2{acc[j][2], acc[j][3]});
  }
  if (quad == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) sh.m[warp][g + 8 * h] = m[h], sh.l[warp][g + 8 * h] = l[h];
  }
  aj_syncthreads();
  const bool poisoned = item.span_begin < 0;  // a request the device planner refused: NaN rows
  // Over the padded rows, so that a warp's 32 reads of sh.o are 32 consecutive words at every head
  // dim (over the data alone, a warp that crossed a row's end met two words on eight banks).
  for (int x = aj_thread_idx(); x < rows * AJ_PT_DVO; x += AJ_PG_THREADS) {
    const int r = x / AJ_PT_DVO, d = x % AJ_PT_DVO;
    if (d >= AJ_HEAD_DIM_V) continue;
    float top = AJ_NEG_INF;
    bool any_nan = poisoned;
#pragma unroll
    for (int w = 0; w < AJ_PG_WARPS; ++w) {
      top = fmaxf(top, sh.m[w][r]);
      any_nan |= sh.m[w][r] != sh.m[w][r];
    }
    float sum = 0.0f, out = 0.0f;
    if (top != AJ_NEG_INF) {
#pragma unroll
      for (int w = 0; w < AJ_PG_WARPS; ++w) {
        const float a = sh.m[w][r] == AJ_NEG_INF ? 0.0f : aj_ex2(sh.m[w][r] - top);
        sum += a * sh.l[w][r];
        out += a * sh.o[w][r][d];
      }
    }
    if (any_nan) top = sum = out = aj_int_as_float(0x7fffffff);
    // sum is 0 for a row that attended nothing (O = 0, LSE = -inf) and NaN for one that saw a NaN.
    const float lse2 = sum == 0.0f ? AJ_NEG_INF : top + aj_lg2(sum);
    const AjPagedRow row = aj_paged_row_of(item, q_first, q_pos, r);
    if (splits == 1) {
      const float inv = sum == 0.0f ? 0.0f : p.output_scale * v_scale / sum;
      aj_store((aj_elem*)p.o + row.row * p.o_row_stride + row.head * p.o_head_stride + d, out * inv);
      if (d == 0 && p.lse) p.lse[row.row * pp.lse_row_stride + row.head * p.lse_head_stride] = lse2 * AJ_LN2;
    } else {
      const aj_i64 part = ((aj_i64)index * splits + split) * AJ_TILE_Q + r;
      const float inv = sum == 0.0f ? 0.0f : v_scale / sum;
      pp.part_o[part * AJ_HEAD_DIM_V + d] = out * inv;
      if (d == 0) pp.part_lse[part] = lse2;
    }
  }
}
