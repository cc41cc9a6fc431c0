// The Hopper forward on FP8 inputs (sm_90a, AJ_DTYPE 3: e4m3 codes with descale factors; O in
// AJ_OUT_DTYPE): warpgroup MMA on e4m3 operands, m64nNk32, fp32 accumulators. The arithmetic is
// the one docs/spec.md states ("FP8 inputs") and the SIMT kernel and the plan executor compute:
// scores times q_descale * k_descale, P rounded to e4m3 after a factor 2^8 for P V while the row
// sums take it unrounded, O times v_descale.
//
// FP8 wgmma reads both shared-memory operands K-major: Q and K as they lie (one wgmma per 32
// columns of the head dim), V transposed as it is loaded, P from registers with the chunk's keys
// renumbered (fwd_fp8.cuh says how; its tiles carry the swizzle the descriptors name).
//
// One warpgroup per 64 query rows (AJ_TILE_Q 64 or 128), AJ_TILE_K 128 keys a tile, two stages of
// K and of V^T, K one tile ahead of V (as fwd_sm90.cuh's bf16 loop): each step issues S(j + 1) and
// then P(j) V(j), stores V^T(j + 1) while both run, computes the softmax of S(j + 1) while P(j) V(j)
// runs (FlashAttention-3's overlap within the warpgroup), and only then rescales O and packs
// P(j + 1). The copies of K(j + 2) and the loads of V(j + 1) are in flight through the step. Rows
// whose O a masked NaN in V reached are summed again exactly (aj_tc_exact_rows, as the other
// tensor-core kernels do).

#if (AJ_HEAD_DIM != 64 && AJ_HEAD_DIM != 128) || (AJ_HEAD_DIM_V != 64 && AJ_HEAD_DIM_V != 128) || AJ_TILE_K != 128 || \
    AJ_TILE_Q % 64 || AJ_WARPS * 16 != AJ_TILE_Q
#error "the FP8 Hopper forward takes head dims 64 or 128, 128-key tiles and 64 query rows per warpgroup"
#endif

__device__ __forceinline__ void aj_fwd_sm90_fp8(const AjParams& p) {
  const AjFp8Smem sh = aj_fp8_smem();
  unsigned char* const sk = sh.k;
  unsigned char* const svt = sh.vt;
  const AjItem item = p.items[aj_block_idx_x()];
  const aj_i64 b = aj_batch_index();
  if (b >= p.batch) return;
  const int wg = aj_warp_uniform(aj_thread_idx() / 128), warp = (aj_thread_idx() / 32) % 4, lane = aj_thread_idx() % 32;
  const int g = lane / 4, quad = lane % 4;
  const int wg_row = wg * 64, row = wg_row + warp * 16 + g;
  const bool busy = wg_row < item.rows_count;  // a warpgroup past the item's rows loads and waits only
  const AjFp8Item w = aj_fp8_item(p, item, b, row, sh.q);
  const aj_elem *const kb = w.kb, *const vb = w.vb;
  const aj_u64 q_desc = aj_wgmma_desc<AJ_FP8_QK>(aj_smem_addr(sh.q) + wg_row * AJ_FP8_QK, 16, 8 * AJ_FP8_QK);
  const aj_u64 k_desc = aj_wgmma_desc<AJ_FP8_QK>(aj_smem_addr(sk), 16, 8 * AJ_FP8_QK);
  const aj_u64 v_desc = aj_wgmma_desc<AJ_FP8_VT>(aj_smem_addr(svt), 16, 8 * AJ_FP8_VT);

  float acc[AJ_HEAD_DIM_V / 8][4];
  float m[2] = {AJ_NEG_INF, AJ_NEG_INF}, l[2] = {0.0f, 0.0f}, c[2];
#pragma unroll
  for (int j = 0; j < AJ_HEAD_DIM_V / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  float s[AJ_TILE_K / 8][4];
  aj_u32 pa[AJ_TILE_K / 32][4];

  // S of a tile from K stage `stage` into s (its own commit group).
  auto issue_s = [&](int stage) {
#pragma unroll
    for (int ks = 0; ks < AJ_HEAD_DIM / 32; ++ks)  // a k32 step: 32 bytes along the rows
      aj_wgmma_ss<AJ_TILE_K, AJ_WGMMA_E4M3, 0>(*(float(*)[AJ_TILE_K / 2]) & s[0][0], q_desc + ks * 2,
                                               k_desc + stage * (AJ_FP8_K_STAGE >> 4) + ks * 2, ks > 0);
    aj_wgmma_commit();
  };
  // O += P V from V stage `stage` (its own commit group).
  auto issue_pv = [&](int stage) {
#pragma unroll
    for (int kc = 0; kc < AJ_TILE_K / 32; ++kc)
      aj_wgmma_rs<AJ_HEAD_DIM_V, AJ_WGMMA_E4M3, 0>(*(float(*)[AJ_HEAD_DIM_V / 2]) & acc[0][0], pa[kc],
                                                   v_desc + stage * (AJ_FP8_VT_STAGE >> 4) + kc * 2, true);
    aj_wgmma_commit();
  };

  AjTileCursor cur;
  cur.begin(p, item);
  if (!cur.done()) {
    // Tile j's K lies in K stage j % 2 and its V^T in V stage j % 2; K runs one tile ahead of V so
    // that S(j + 1) can be issued beside P(j) V(j) and its softmax computed while P V runs.
    AjTile t = cur.tile();  // tile j
    aj_fp8_load_rows<AJ_TILE_K>(sk, kb, p.k_row_stride, t.first, t.stride, t.count);
    aj_cp_async_commit();
    cur.next();
    bool more = !cur.done();
    AjTile tn = more ? cur.tile() : t;  // tile j + 1
    if (more) aj_fp8_load_rows<AJ_TILE_K>(sk + AJ_FP8_K_STAGE, kb, p.k_row_stride, tn.first, tn.stride, tn.count);
    aj_cp_async_commit();
    AjFp8V v;
    aj_fp8_load_v(v, vb, p.v_row_stride, t);
    aj_fp8_store_vt(svt, v);
    aj_cp_async_wait<1>();   // Q and K(0)
    aj_fence_proxy_async();  // the copies and the byte stores are read by wgmma (the async proxy)
    aj_syncthreads();
    if (busy) {
      aj_wgmma_fence();
      issue_s(0);
      aj_wgmma_wait<0>();
      if (!(t.full && t.count == AJ_TILE_K)) aj_sm80_mask(s, p, t, item.head, w.qpos, w.q_step8, w.k_origin, quad);
      aj_tc_softmax_scores(s, m, l, c, w.scale_log2);
      aj_fp8_pack(s, pa);  // O is still 0: no rescale
    }
    for (int j = 0;; ++j) {
      const int stage = j & 1;
      aj_cp_async_wait<0>();   // K(j + 1)
      aj_fence_proxy_async();  // the copies and the byte stores are read by wgmma (the async proxy)
      aj_syncthreads();        // K(j + 1) and V^T(j) have landed; S(j) and P(j - 1) V(j - 1) are done everywhere
      bool more2 = false;
      AjTile t2 = tn;  // tile j + 2
      if (more) {
        cur.next();
        more2 = !cur.done();
        if (more2) t2 = cur.tile();
      }
      if (more2) aj_fp8_load_rows<AJ_TILE_K>(sk + stage * AJ_FP8_K_STAGE, kb, p.k_row_stride, t2.first, t2.stride, t2.count);
      aj_cp_async_commit();
      if (more) aj_fp8_load_v(v, vb, p.v_row_stride, tn);
      unsigned char* const vt_next = svt + (stage ^ 1) * AJ_FP8_VT_STAGE;
      // One branch per case, each issuing, waiting and reading in straight-line order: ptxas
      // serialises every wgmma of the kernel when a path it cannot rule out reads an accumulator in
      // flight (C7514; fwd_sm90.cuh's loop says more, a lit test keeps the log free of it).
      if (busy && more) {
        aj_wgmma_fence();
        issue_s(stage ^ 1);  // S(j + 1), committed first
        issue_pv(stage);     // P(j) V(j)
        aj_fp8_store_vt(vt_next, v);  // V^T(j + 1), while both run
        aj_wgmma_wait<1>();  // S(j + 1) has landed; P(j) V(j) may still run
        // The softmax in both arms of the mask's branch, so that the wait below stays after it
        // (ptxas puts a wgmma wait at the top of its basic block).
        if (!(tn.full && tn.count == AJ_TILE_K)) {
          aj_sm80_mask(s, p, tn, item.head, w.qpos, w.q_step8, w.k_origin, quad);
          aj_tc_softmax_scores(s, m, l, c, w.scale_log2);
        } else {
          aj_tc_softmax_scores(s, m, l, c, w.scale_log2);
        }
        aj_wgmma_wait<0>();  // P(j) V(j) has landed
        aj_tc_rescale(acc, c);
        aj_fp8_pack(s, pa);
      } else if (busy) {  // the last tile
        aj_wgmma_fence();
        issue_pv(stage);
        aj_wgmma_wait<0>();
      } else if (more) {
        aj_fp8_store_vt(vt_next, v);
      }
      if (!more) break;
      t = tn, tn = t2, more = more2;
    }
  }
  aj_cp_async_wait<0>();  // an item without tiles: Q's copy
  if (!busy) return;

  // The epilogue, as the other Hopper kernels': O = acc x v_descale / (2^8 l) (the exact sums of
  // rows a masked NaN in V reached are of P itself).
  aj_tc_store_rows(p, item, b, row, quad, acc, m, l, 0.00390625f, aj_descale(p, 2, b, w.kvh));
}
