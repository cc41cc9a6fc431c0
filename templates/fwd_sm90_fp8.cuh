// The Hopper forward on FP8 inputs (sm_90a, AJ_DTYPE 3: e4m3 codes with descale factors; O in
// AJ_OUT_DTYPE): warpgroup MMA on e4m3 operands, m64nNk32, fp32 accumulators. The arithmetic is
// the one docs/spec.md states ("FP8 inputs") and the SIMT kernel and the plan executor compute:
// scores times q_descale * k_descale, P rounded to e4m3 after a factor 2^8 for P V while the row
// sums take it unrounded, O times v_descale.
//
// FP8 wgmma reads both shared-memory operands K-major, so:
// - S = Q K^T takes Q and K as they lie (rows of AJ_HEAD_DIM = 64 or 128 bytes, the swizzle of
//   that width), one wgmma per 32 columns of the head dim;
// - O += P V needs V^T (for each output column, the tile's keys contiguous): each tile of V is
//   transposed as it is loaded (16 bytes from a key's row, one byte to each of 16 rows of V^T);
// - P comes from registers in the 8-bit A layout: thread (lane l) holds, of each 32-key chunk,
//   columns 4(l % 4) .. + 3 and 16 + 4(l % 4) .. + 3, while its S accumulators hold keys
//   2(l % 4), + 1, 8 + 2(l % 4), + 1 (and 16 more). Rather than move values between threads, the
//   chunk's keys are renumbered: P's column k stands for key aj_fp8_key(k), and V^T's column k
//   holds that key's row, so the product is the same sum in another order.
//
// One warpgroup per 64 query rows (AJ_TILE_Q 64 or 128), AJ_TILE_K 128 keys a tile, one stage:
// each tile's K (cp.async) and V^T (loads and byte stores) land, then S, the mask and the softmax,
// P packed, P V, before the next tile is loaded. The loop overlaps nothing yet: it is the FP8
// arithmetic on the tensor cores, proven in the emulator, before it is made fast. Rows whose O a
// masked NaN in V reached are summed again exactly (aj_tc_exact_rows, as the other tensor-core
// kernels do).

#if (AJ_HEAD_DIM != 64 && AJ_HEAD_DIM != 128) || (AJ_HEAD_DIM_V != 64 && AJ_HEAD_DIM_V != 128) || AJ_TILE_K != 128 || \
    AJ_TILE_Q % 64 || AJ_WARPS * 16 != AJ_TILE_Q
#error "the FP8 Hopper forward takes head dims 64 or 128, 128-key tiles and 64 query rows per warpgroup"
#endif

// Q's and K's rows are AJ_HEAD_DIM bytes with the swizzle of that width (128 or 64 bytes); V^T's
// rows are a tile's 128 keys (the 128-byte swizzle).
#define AJ_FP8_QK (AJ_HEAD_DIM)
#define AJ_FP8_VT 128

// Byte offset of byte k of row r in a [rows][W B] tile with the W-byte swizzle (W = 64 or 128):
// the address's bits [7, 7 + log2(W / 16)) XORed into its 16-byte chunk (the tiles start on
// 1024-byte boundaries, so the offset stands for the address).
template <int W>
__device__ __forceinline__ int aj_fp8_at(int r, int k) {
  const int at = r * W + k;
  return at ^ (((at >> 7) & (W / 16 - 1)) << 4);
}

// The key (within its 32-key chunk) that P's column k stands for, and back: column 16h + 4q + 2b
// + e holds key 16h + 8b + 2q + e (h, b, e in {0, 1}, q < 4).
__device__ __forceinline__ int aj_fp8_key(int k) { return (k & 16) | ((k & 2) << 2) | ((k >> 1) & 6) | (k & 1); }
__device__ __forceinline__ int aj_fp8_column(int key) { return (key & 16) | ((key & 6) << 1) | ((key >> 2) & 2) | (key & 1); }

// Rows first + r * stride (r < count) of a [.., AJ_HEAD_DIM] e4m3 tensor into a swizzled
// [ROWS][AJ_HEAD_DIM B] tile by cp.async, 16 bytes a copy; rows past `count` are zero-filled.
template <int ROWS>
__device__ __forceinline__ void aj_fp8_load_rows(unsigned char* dst, const aj_elem* base, aj_i64 row_stride, aj_i64 first,
                                                 aj_i64 stride, int count) {
  constexpr int CHUNKS = AJ_FP8_QK / 16;
  for (int x = aj_thread_idx(); x < ROWS * CHUNKS; x += AJ_THREADS) {
    const int r = x / CHUNKS, c = x % CHUNKS;
    aj_cp_async16(dst + aj_fp8_at<AJ_FP8_QK>(r, c * 16),
                  base + (first + (aj_i64)(r < count ? r : 0) * stride) * row_stride + c * 16, r < count);
  }
}

// V's rows of tile t as V^T ([AJ_HEAD_DIM_V output columns][128 B], swizzled): key c's value of
// column d at V^T row d, byte aj_fp8_column(c % 32) of its chunk. Keys past the count are zeros
// (their P is 0 and 0 x 0 adds nothing).
__device__ __forceinline__ void aj_fp8_load_vt(unsigned char* vt, const aj_elem* vb, aj_i64 row_stride, const AjTile& t) {
  constexpr int CHUNKS = AJ_HEAD_DIM_V / 16;
  for (int x = aj_thread_idx(); x < AJ_TILE_K * CHUNKS; x += AJ_THREADS) {
    const int key = x / CHUNKS, c = x % CHUNKS;
    aj_u32x4 w = {0u, 0u, 0u, 0u};
    if (key < t.count) w = *(const aj_u32x4*)(vb + (t.first + (aj_i64)key * t.stride) * row_stride + c * 16);
    const aj_u32 words[4] = {w.x, w.y, w.z, w.w};
    const int col = (key & ~31) | aj_fp8_column(key & 31);
#pragma unroll
    for (int e = 0; e < 16; ++e) vt[aj_fp8_at<AJ_FP8_VT>(c * 16 + e, col)] = (unsigned char)(words[e / 4] >> (8 * (e % 4)));
  }
}

// P as e4m3 codes of 2^8 P in the 8-bit A layout (see the top): chunk kc's registers 0 and 2 from
// row g's accumulators of n-tiles 4kc, 4kc + 1 and 4kc + 2, 4kc + 3; registers 1 and 3 from row g + 8's.
__device__ __forceinline__ void aj_fp8_pack(const float (&s)[AJ_TILE_K / 8][4], aj_u32 (&pa)[AJ_TILE_K / 32][4]) {
#pragma unroll
  for (int kc = 0; kc < AJ_TILE_K / 32; ++kc)
#pragma unroll
    for (int reg = 0; reg < 4; ++reg) {
      const int j = 4 * kc + 2 * (reg >> 1), e = 2 * (reg & 1);
      const aj_u32 lo = aj_cvt_e4m3x2(256.0f * s[j][e + 1], 256.0f * s[j][e]);
      const aj_u32 hi = aj_cvt_e4m3x2(256.0f * s[j + 1][e + 1], 256.0f * s[j + 1][e]);
      pa[kc][reg] = hi << 16 | lo;
    }
}

__device__ __forceinline__ void aj_fwd_sm90_fp8(const AjParams& p) {
  AJ_DYNAMIC_SHARED(aj_smem);
  unsigned char* const smem = aj_smem + ((1024 - aj_smem_addr(aj_smem) % 1024) % 1024);
  unsigned char* const sq = smem;                        // [AJ_TILE_Q][AJ_HEAD_DIM B]
  unsigned char* const sk = sq + AJ_TILE_Q * AJ_FP8_QK;  // [AJ_TILE_K][AJ_HEAD_DIM B]
  unsigned char* const svt = sk + AJ_TILE_K * AJ_FP8_QK; // [AJ_HEAD_DIM_V][128 B]

  const AjItem item = p.items[aj_block_idx_x()];
  const aj_i64 b = aj_batch_index();
  if (b >= p.batch) return;
  const int wg = aj_warp_uniform(aj_thread_idx() / 128), warp = (aj_thread_idx() / 32) % 4, lane = aj_thread_idx() % 32;
  const int g = lane / 4, quad = lane % 4;
  const int kvh = item.head / p.heads_per_kv;
  const int wg_row = wg * 64, row = wg_row + warp * 16 + g;
  const bool busy = wg_row < item.rows_count;  // a warpgroup past the item's rows loads and waits only
  const float scale_log2 = p.scale_log2 * (aj_descale(p, 0, b, kvh) * aj_descale(p, 1, b, kvh));

  const aj_i64 doc = aj_doc_start(p, item.rows_start);
  const aj_i64 k_origin = p.k_offset - doc, qpos = p.q_offset - doc + item.rows_start + (aj_i64)row * item.rows_stride;
  const aj_i64 q_step8 = 8 * item.rows_stride;
  const aj_elem* qb = (const aj_elem*)p.q + b * p.q_batch_stride + item.head * p.q_head_stride;
  const aj_elem* kb = (const aj_elem*)p.k + b * p.k_batch_stride + kvh * p.k_head_stride;
  const aj_elem* vb = (const aj_elem*)p.v + b * p.v_batch_stride + kvh * p.v_head_stride;
  aj_fp8_load_rows<AJ_TILE_Q>(sq, qb, p.q_row_stride, item.rows_start, item.rows_stride, item.rows_count);
  aj_cp_async_commit();
  const aj_u64 q_desc = aj_wgmma_desc<AJ_FP8_QK>(aj_smem_addr(sq) + wg_row * AJ_FP8_QK, 16, 8 * AJ_FP8_QK);
  const aj_u64 k_desc = aj_wgmma_desc<AJ_FP8_QK>(aj_smem_addr(sk), 16, 8 * AJ_FP8_QK);
  const aj_u64 v_desc = aj_wgmma_desc<AJ_FP8_VT>(aj_smem_addr(svt), 16, 8 * AJ_FP8_VT);

  float acc[AJ_HEAD_DIM_V / 8][4];
  float m[2] = {AJ_NEG_INF, AJ_NEG_INF}, l[2] = {0.0f, 0.0f}, c[2];
#pragma unroll
  for (int j = 0; j < AJ_HEAD_DIM_V / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  float s[AJ_TILE_K / 8][4];
  aj_u32 pa[AJ_TILE_K / 32][4];

  AjTileCursor cur;
  for (cur.begin(p, item); !cur.done(); cur.next()) {
    const AjTile t = cur.tile();
    aj_syncthreads();  // the previous tile's K and V^T are no longer read
    aj_fp8_load_rows<AJ_TILE_K>(sk, kb, p.k_row_stride, t.first, t.stride, t.count);
    aj_cp_async_commit();
    aj_fp8_load_vt(svt, vb, p.v_row_stride, t);
    aj_cp_async_wait<0>();
    aj_fence_proxy_async();  // the copies and the byte stores are read by wgmma (the async proxy)
    aj_syncthreads();
    if (busy) {
      aj_wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < AJ_HEAD_DIM / 32; ++ks)  // a k32 step: 32 bytes along the rows
        aj_wgmma_ss<AJ_TILE_K, AJ_WGMMA_E4M3, 0>(*(float(*)[AJ_TILE_K / 2]) & s[0][0], q_desc + ks * 2, k_desc + ks * 2, ks > 0);
      aj_wgmma_commit();
      aj_wgmma_wait<0>();
      if (!(t.full && t.count == AJ_TILE_K)) aj_sm80_mask(s, p, t, item.head, qpos, q_step8, k_origin, quad);
      aj_tc_softmax_scores(s, m, l, c, scale_log2);
      aj_tc_rescale(acc, c);
      aj_fp8_pack(s, pa);
      aj_wgmma_fence();
#pragma unroll
      for (int kc = 0; kc < AJ_TILE_K / 32; ++kc)
        aj_wgmma_rs<AJ_HEAD_DIM_V, AJ_WGMMA_E4M3, 0>(*(float(*)[AJ_HEAD_DIM_V / 2]) & acc[0][0], pa[kc], v_desc + kc * 2, true);
      aj_wgmma_commit();
      aj_wgmma_wait<0>();
    }
  }
  aj_cp_async_wait<0>();  // an item without tiles: Q's copy
  if (!busy) return;

  // The epilogue, as the other Hopper kernels': O = acc x v_descale / (2^8 l) (the exact sums of
  // rows a masked NaN in V reached are of P itself).
  aj_tc_store_rows(p, item, b, row, quad, acc, m, l, 0.00390625f, aj_descale(p, 2, b, kvh));
}
