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
// One warpgroup per 64 query rows (AJ_TILE_Q 64 or 128), AJ_TILE_K 128 keys a tile, two stages
// (aj_fp8_tiles): the next tile's K copies and V loads are in flight through this tile's S, mask,
// softmax and P V, and its V^T is stored while P V runs. Rows whose O a masked NaN in V reached are
// summed again exactly (aj_tc_exact_rows, as the other tensor-core kernels do).

#if (AJ_HEAD_DIM != 64 && AJ_HEAD_DIM != 128) || (AJ_HEAD_DIM_V != 64 && AJ_HEAD_DIM_V != 128) || AJ_TILE_K != 128 || \
    AJ_TILE_Q % 64 || AJ_WARPS * 16 != AJ_TILE_Q
#error "the FP8 Hopper forward takes head dims 64 or 128, 128-key tiles and 64 query rows per warpgroup"
#endif

__device__ __forceinline__ void aj_fwd_sm90_fp8(const AjParams& p) {
  AJ_DYNAMIC_SHARED(aj_smem);
  unsigned char* const smem = aj_smem + ((1024 - aj_smem_addr(aj_smem) % 1024) % 1024);
  unsigned char* const sq = smem;                         // [AJ_TILE_Q][AJ_HEAD_DIM B]
  unsigned char* const sk = sq + AJ_TILE_Q * AJ_FP8_QK;   // [2][AJ_TILE_K][AJ_HEAD_DIM B]
  unsigned char* const svt = sk + 2 * AJ_FP8_K_STAGE;     // [2][AJ_HEAD_DIM_V][128 B]

  const AjItem item = p.items[aj_block_idx_x()];
  const aj_i64 b = aj_batch_index();
  if (b >= p.batch) return;
  const int wg = aj_warp_uniform(aj_thread_idx() / 128), warp = (aj_thread_idx() / 32) % 4, lane = aj_thread_idx() % 32;
  const int g = lane / 4, quad = lane % 4;
  const int kvh = item.head / p.heads_per_kv;
  const int wg_row = wg * 64, row = wg_row + warp * 16 + g;
  const bool busy = wg_row < item.rows_count;  // a warpgroup past the item's rows loads and waits only
  const float scale_log2 = aj_scale_log2(p, b, kvh);

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

  aj_fp8_tiles(p, item, kb, vb, sk, svt, [] { aj_fence_proxy_async(); },  // the copies and the byte stores are read by wgmma (the async proxy)
               [&](const AjTile& t, int stage, auto store_next) {
                 if (busy) {
                   aj_wgmma_fence();
#pragma unroll
                   for (int ks = 0; ks < AJ_HEAD_DIM / 32; ++ks)  // a k32 step: 32 bytes along the rows
                     aj_wgmma_ss<AJ_TILE_K, AJ_WGMMA_E4M3, 0>(*(float(*)[AJ_TILE_K / 2]) & s[0][0], q_desc + ks * 2,
                                                              k_desc + stage * (AJ_FP8_K_STAGE >> 4) + ks * 2, ks > 0);
                   aj_wgmma_commit();
                   aj_wgmma_wait<0>();
                   if (!(t.full && t.count == AJ_TILE_K)) aj_sm80_mask(s, p, t, item.head, qpos, q_step8, k_origin, quad);
                   aj_tc_softmax_scores(s, m, l, c, scale_log2);
                   aj_tc_rescale(acc, c);
                   aj_fp8_pack(s, pa);
                   aj_wgmma_fence();
#pragma unroll
                   for (int kc = 0; kc < AJ_TILE_K / 32; ++kc)
                     aj_wgmma_rs<AJ_HEAD_DIM_V, AJ_WGMMA_E4M3, 0>(*(float(*)[AJ_HEAD_DIM_V / 2]) & acc[0][0], pa[kc],
                                                                  v_desc + stage * (AJ_FP8_VT_STAGE >> 4) + kc * 2, true);
                   aj_wgmma_commit();
                 }
                 store_next();  // the next tile's V^T, while P V runs
                 if (busy) aj_wgmma_wait<0>();
               });
  aj_cp_async_wait<0>();  // an item without tiles: Q's copy
  if (!busy) return;

  // The epilogue, as the other Hopper kernels': O = acc x v_descale / (2^8 l) (the exact sums of
  // rows a masked NaN in V reached are of P itself).
  aj_tc_store_rows(p, item, b, row, quad, acc, m, l, 0.00390625f, aj_descale(p, 2, b, kvh));
}
