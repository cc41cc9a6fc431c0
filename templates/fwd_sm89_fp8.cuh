// The tensor-core forward on FP8 inputs for sm_89 and newer without wgmma (Ada, Blackwell's
// consumer parts, and Hopper where the arch-specific kernels are off): mma.sync m16n8k32 on e4m3
// operands, fp32 accumulators. The arithmetic is the one docs/spec.md states ("FP8 inputs") and
// every FP8 path computes: scores times q_descale * k_descale, P rounded to e4m3 after a factor 2^8
// for P V while the row sums take it unrounded, O times v_descale.
//
// Each warp owns 16 query rows (AJ_TILE_Q = 16 AJ_WARPS: 64 or 128); AJ_TILE_K 64 keys a tile.
// The tiles are fwd_fp8.cuh's: Q and K as they lie, V transposed as it is loaded, P's keys
// renumbered so that its A registers come from the thread's own S accumulators. ldmatrix (.b16,
// no .trans) delivers the 8-bit fragments of Q, K and V^T: a register of 4 bytes along K is one
// 16-bit pair's worth. Q's fragments stay in registers from the first tile on up to head dim 128;
// at 256 (AJ_FP8_Q_REGS 0) they are read from the Q tile at each k32 step, so the 128 floats of O's
// accumulators keep room beside S.
//
// Two stages (aj_fp8_tiles): the next tile's K copies and V loads are in flight through this
// tile's products, and its V^T is stored after them. (With mma.sync a warp's softmax overlaps the
// tensor cores through the other warps' products, as in the sm_80 kernel, not within the warp as
// the Hopper kernel's does.) Rows whose O a masked
// NaN in V reached are summed again exactly (aj_tc_exact_rows).

#if AJ_TILE_K != 64 || (AJ_TILE_Q != 64 && AJ_TILE_Q != 128) || AJ_WARPS * 16 != AJ_TILE_Q
#error "the FP8 sm_89 forward takes 64-key tiles and 16 query rows per warp (tile_q 64 or 128)"
#endif
#define AJ_FP8_Q_REGS (AJ_HEAD_DIM <= 128)

// This lane's part of an ldmatrix .x4 of a [.][W B] swizzled tile, for rows r0 + 0..15 (r0 a
// multiple of 8) and bytes k0 + 0..31 along K: the offset past r0 * W of row (lane % 8) + 8 ((lane /
// 8) & RSEL), byte k0 + 16 ((lane / 8) & KSEL) (RSEL, KSEL one bit each, 1 or 2: which of the four
// matrices move along the rows, which along K). The swizzle of a row depends on its row within 8
// only, so rows r0 + .. lie r0 * W further: each k0 takes one offset a thread, each r0 an immediate.
template <int W, int RSEL, int KSEL>
__device__ __forceinline__ int aj_fp8_frag(int k0, int lane) {
  const int m = lane / 8;
  return aj_fp8_at<W>(lane % 8 + ((m & RSEL) ? 8 : 0), k0 + ((m & KSEL) ? 16 : 0));
}

__device__ __forceinline__ void aj_fwd_sm89_fp8(const AjParams& p) {
  const AjFp8Smem sh = aj_fp8_smem();
  const AjItem item = p.items[aj_block_idx_x()];
  const aj_i64 b = aj_batch_index();
  if (b >= p.batch) return;
  const int warp = aj_warp_uniform(aj_thread_idx() / 32), lane = aj_thread_idx() % 32;
  const int g = lane / 4, quad = lane % 4;
  const int row = warp * 16 + g;
  const bool busy = warp * 16 < item.rows_count;  // a warp past the item's rows loads and waits only
  const AjFp8Item w = aj_fp8_item(p, item, b, row, sh.q);

  float acc[AJ_HEAD_DIM_V / 8][4];
  float m[2] = {AJ_NEG_INF, AJ_NEG_INF}, l[2] = {0.0f, 0.0f}, c[2];
#pragma unroll
  for (int j = 0; j < AJ_HEAD_DIM_V / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  aj_u32 qa[AJ_FP8_Q_REGS ? AJ_HEAD_DIM / 32 : 1][4];  // Q's A fragments, a 32-byte step of the head dim each
  int k_at[AJ_HEAD_DIM / 32], vt_at[AJ_TILE_K / 32];  // this lane's ldmatrix offsets in K and V^T
#pragma unroll
  for (int ks = 0; ks < AJ_HEAD_DIM / 32; ++ks) k_at[ks] = aj_fp8_frag<AJ_FP8_QK, 2, 1>(ks * 32, lane);
#pragma unroll
  for (int kc = 0; kc < AJ_TILE_K / 32; ++kc) vt_at[kc] = aj_fp8_frag<AJ_FP8_VT, 2, 1>(kc * 32, lane);
  float s[AJ_TILE_K / 8][4];
  aj_u32 pa[AJ_TILE_K / 32][4];

  bool first = true;
  aj_fp8_tiles(p, item, w.kb, w.vb, sh.k, sh.vt, [] {}, [&](const AjTile& t, int stage, auto store_next) {
    if (AJ_FP8_Q_REGS && first) {  // Q has landed with the first tile: its fragments to registers
#pragma unroll
      for (int ks = 0; ks < (AJ_FP8_Q_REGS ? AJ_HEAD_DIM / 32 : 0); ++ks)
        aj_ldmatrix_x4(qa[ks], sh.q + warp * 16 * AJ_FP8_QK + aj_fp8_frag<AJ_FP8_QK, 1, 2>(ks * 32, lane));
      first = false;
    }
    if (busy) {
      const unsigned char* const k = sh.k + stage * AJ_FP8_K_STAGE;
      const unsigned char* const vt = sh.vt + stage * AJ_FP8_VT_STAGE;
#pragma unroll
      for (int j = 0; j < AJ_TILE_K / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < AJ_HEAD_DIM / 32; ++ks) {
        if (!AJ_FP8_Q_REGS)  // this k32 step's fragments of Q from the Q tile
          aj_ldmatrix_x4(qa[0], sh.q + warp * 16 * AJ_FP8_QK + aj_fp8_frag<AJ_FP8_QK, 1, 2>(ks * 32, lane));
        const int qs = AJ_FP8_Q_REGS ? ks : 0;
#pragma unroll
        for (int j = 0; j < AJ_TILE_K / 8; j += 2) {  // keys 8j .. 8j + 15: b0, b1 of n-tiles j and j + 1
          aj_u32 kf[4];
          aj_ldmatrix_x4(kf, k + 8 * j * AJ_FP8_QK + k_at[ks]);
          aj_mma_e4m3(s[j], qa[qs], kf[0], kf[1]);
          aj_mma_e4m3(s[j + 1], qa[qs], kf[2], kf[3]);
        }
      }
      if (!(t.full && t.count == AJ_TILE_K)) aj_sm80_mask(s, p, t, item.head, w.qpos, w.q_step8, w.k_origin, quad);
      aj_tc_softmax_scores(s, m, l, c, w.scale_log2);
      aj_tc_rescale(acc, c);
      aj_fp8_pack(s, pa);
#pragma unroll
      for (int kc = 0; kc < AJ_TILE_K / 32; ++kc)
#pragma unroll
        for (int j = 0; j < AJ_HEAD_DIM_V / 8; j += 2) {  // output columns 8j .. 8j + 15
          aj_u32 vf[4];
          aj_ldmatrix_x4(vf, vt + 8 * j * AJ_FP8_VT + vt_at[kc]);
          aj_mma_e4m3(acc[j], pa[kc], vf[0], vf[1]);
          aj_mma_e4m3(acc[j + 1], pa[kc], vf[2], vf[3]);
        }
    }
    store_next();  // the next tile's V^T, its loads landed behind this tile's products
  });
  aj_cp_async_wait<0>();  // an item without tiles: Q's copy
  if (!busy) return;

  // O = acc x v_descale / (2^8 l) (the exact sums of rows a masked NaN in V reached are of P itself).
  aj_tc_store_rows(p, item, b, row, quad, acc, m, l, 0.00390625f, aj_descale(p, 2, b, w.kvh));
}
