// The Hopper backward's dQ kernel (sm_90a): the two-pass form's walk over the forward plan
// (RuntimeOptions / ForwardOptions::deterministic, and Attention::backward_add without the single
// pass), bwd_sm80.cuh's _dq with every product on the warpgroup MMA. A block of two warpgroups
// takes one query tile of 64 rows; K and V tiles stream through AJ_STAGES cp.async stages in
// fwd_sm90.cuh's swizzled layout, and warpgroup w takes keys w * AJ_BWDQ_KEYS .. + AJ_BWDQ_KEYS - 1
// of each:
//   S  = Q K^T, dP = dO V^T   wgmma, both operands in shared memory, K-major (the forward's S),
//                             AJ_BWDQ_SUB keys at a time;
//   dS = P (f dP - D)         in registers (bwd_sm80.cuh's element rule, aj_bwd_dq_ds), packed as
//   dQ += dS K                the A operand; K N-major, as V in the forward's O += P V.
// Each warpgroup's dQ covers all 64 rows over its half of the keys. At the end warpgroup 1 hands
// its sums to warpgroup 0 through shared memory, which adds them to its own, always in that order,
// and stores (bwd_sm80.cuh's epilogue and exact sums, aj_bwd_dq_finish): a query tile owns its
// rows, so dQ is the same bits on every run. The kernel runs at the dK/dV kernel's tiles (64 x 64
// for bwd_sm90.cuh, 64 x 128 for bwd_sm90_tma.cuh), which the forward plan both walk shares.
//
// Each tile's products are waited for before the block's barrier that lets a later load overwrite
// its stage; the two warpgroups' element work then runs while the other's products do only as far
// as the barrier allows. A producer warpgroup (as the TMA forward's) would lift that; this is the
// first form.

#if AJ_TILE_Q != 64 || (AJ_TILE_K != 64 && AJ_TILE_K != 128)
#error "the sm_90a dQ kernel runs 64-query tiles of 64 or 128 keys"
#endif
#define AJ_BWDQ_THREADS 256
#define AJ_BWDQ_KEYS (AJ_TILE_K / 2)  // a warpgroup's keys of each tile
// Keys of S and dP a thread holds at once (the wgmma N of S and dP): 64, or 32 past head dim 64,
// so that S and dP fit beside dQ's 64 x head-dim accumulator and a pattern's mask (the codegen
// test's every mask kind spilled 24 bytes at 64 and head dim 128).
#define AJ_BWDQ_SUB (AJ_HEAD_DIM > 64 || AJ_HEAD_DIM_V > 64 ? 32 : AJ_BWDQ_KEYS)
#define AJ_BWDQ_Q_BYTES (AJ_TILE_Q * AJ_HEAD_DIM * 2)
#define AJ_BWDQ_DO_BYTES (AJ_TILE_Q * AJ_HEAD_DIM_V * 2)

// Dynamic shared memory from its first 1024-byte boundary (compiler/codegen/codegen_backward.cpp:
// backward_dq_sm90_smem_bytes): Q, dO, then the K and V rings (fwd_sm90.cuh's AjSm90Shared). After
// the last tile warpgroup 1's dQ sums (64 x head dim floats) take the start of the K ring.
__device__ __forceinline__ void aj_bwd_dq_sm90(const AjBwdParams& bp) {
  const AjParams& p = bp.fwd;
  AJ_DYNAMIC_SHARED(aj_smem);
  unsigned char* const smem = aj_smem + ((1024 - aj_smem_addr(aj_smem) % 1024) % 1024);
  unsigned char* const sdo = smem + AJ_BWDQ_Q_BYTES;
  AjSm90Shared sh;
  sh.q = smem;
  sh.k = sdo + AJ_BWDQ_DO_BYTES;
  sh.v = sh.k + AJ_STAGES * AJ_SM90_K_STAGE;

  const AjItem item = p.items[aj_block_idx_x()];
  const aj_i64 b = aj_batch_index();
  if (b >= p.batch) return;
  const int tid = aj_thread_idx();
  const int wg = aj_warp_uniform(tid / 128), warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, quad = lane % 4;
  const int kvh = item.head / p.heads_per_kv;
  const aj_elem* const kb = (const aj_elem*)p.k + b * p.k_batch_stride + kvh * p.k_head_stride;
  const aj_elem* const vb = (const aj_elem*)p.v + b * p.v_batch_stride + kvh * p.v_head_stride;
  // K and V of a tile: fwd_sm90.cuh's aj_sm90_load with the bases hoisted out of the loop (calling
  // it, which forms them per tile, spilled 32 bytes at head dim 128 in the codegen test's kernel).
  auto load_tile = [&](int stage, const AjTile& t) {
    aj_sm90_load_rows<AJ_TILE_K, AJ_HEAD_DIM, AJ_BWDQ_THREADS>(sh.k + stage * AJ_SM90_K_STAGE, kb, p.k_row_stride, t.first,
                                                               t.stride, t.count);
    aj_sm90_load_rows<AJ_TILE_K, AJ_HEAD_DIM_V, AJ_BWDQ_THREADS>(sh.v + stage * AJ_SM90_V_STAGE, vb, p.v_row_stride, t.first,
                                                                 t.stride, t.count);
  };

  // Q and dO of the tile (one cp.async group), then the first AJ_STAGES - 1 key tiles, a group each.
  aj_sm90_load_rows<AJ_TILE_Q, AJ_HEAD_DIM, AJ_BWDQ_THREADS>(
      sh.q, (const aj_elem*)p.q + b * p.q_batch_stride + item.head * p.q_head_stride, p.q_row_stride, item.rows_start,
      item.rows_stride, item.rows_count);
  aj_sm90_load_rows<AJ_TILE_Q, AJ_HEAD_DIM_V, AJ_BWDQ_THREADS>(
      sdo, (const aj_elem*)bp.dout + b * bp.do_batch_stride + item.head * bp.do_head_stride, bp.do_row_stride, item.rows_start,
      item.rows_stride, item.rows_count);
  aj_cp_async_commit();
  AjTileCursor pre, cur;  // the next tile to load; the tile the loop computes
  pre.begin(p, item);
  cur.begin(p, item);
  int issued = 0;
#pragma unroll
  for (int s = 0; s < AJ_STAGES - 1; ++s) {
    if (!pre.done()) {
      load_tile(s, pre.tile());
      pre.next();
      ++issued;
    }
    aj_cp_async_commit();
  }

  // This thread's two rows (both warpgroups hold all 64 rows of the tile, over different keys).
  const int r0 = warp * 16 + g;
  const AjBwdDqRows w = aj_bwd_dq_rows(bp, item, b, r0);
  const int c0 = wg * AJ_BWDQ_KEYS;  // this warpgroup's first key of each tile
  // Descriptors (fwd_sm90.cuh): Q and dO as the K-major A of S and dP, the stage's K and V rows
  // c0 .. as their K-major B, K's as the N-major B of dQ.
  const aj_u64 q_a = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.q), 16, 8 * AJ_SW);
  const aj_u64 do_a = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sdo), 16, 8 * AJ_SW);
  const aj_u64 k_b = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.k + c0 * AJ_SW), 16, 8 * AJ_SW);
  const aj_u64 v_b = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.v + c0 * AJ_SW), 16, 8 * AJ_SW);
  const aj_u64 k_n = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.k + c0 * AJ_SW), AJ_TILE_K * AJ_SW, 8 * AJ_SW);

  float dq[AJ_HEAD_DIM / 8][4];
  aj_zero<AJ_HEAD_DIM>(dq);
  for (int iter = 0; iter < issued; ++iter) {
    const int stage = iter % AJ_STAGES;
    if (!pre.done()) {
      load_tile((iter + AJ_STAGES - 1) % AJ_STAGES, pre.tile());
      pre.next();
      ++issued;
    }
    aj_cp_async_commit();
    aj_cp_async_wait<AJ_STAGES - 1>();
    aj_fence_proxy_async();  // the copies this thread waited for are read by wgmma after the barrier
    aj_syncthreads();
    const AjTile t = cur.tile();
    cur.next();
    if (c0 < t.count) {  // warpgroup-uniform: the tile holds some of this warpgroup's keys
      const aj_u64 kd = k_b + ((stage * AJ_SM90_K_STAGE) >> 4), vd = v_b + ((stage * AJ_SM90_V_STAGE) >> 4);
      const aj_u64 kn = k_n + ((stage * AJ_SM90_K_STAGE) >> 4);
      // AJ_BWDQ_SUB keys at a time; a sub-block past the tile's count computes dS = 0 (its K and V
      // rows are zero), which costs less than a branch around wgmmas in flight.
#pragma unroll
      for (int sb = 0; sb < AJ_BWDQ_KEYS; sb += AJ_BWDQ_SUB) {
        float s[AJ_BWDQ_SUB / 8][4], dp[AJ_BWDQ_SUB / 8][4];
        aj_u32 dsa[AJ_BWDQ_SUB / 16][4];
        aj_wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < AJ_HEAD_DIM / 16; ++ks)  // S = Q K^T
          aj_wgmma_ss<AJ_BWDQ_SUB, AJ_WGMMA_TYPE, 0>(*(float(*)[AJ_BWDQ_SUB / 2]) & s[0][0],
                                                     q_a + (((ks / 4) * AJ_TILE_Q * AJ_SW + (ks % 4) * 32) >> 4),
                                                     kd + (((ks / 4) * AJ_TILE_K * AJ_SW + sb * AJ_SW + (ks % 4) * 32) >> 4),
                                                     ks > 0);
#pragma unroll
        for (int ks = 0; ks < AJ_HEAD_DIM_V / 16; ++ks)  // dP = dO V^T
          aj_wgmma_ss<AJ_BWDQ_SUB, AJ_WGMMA_TYPE, 0>(*(float(*)[AJ_BWDQ_SUB / 2]) & dp[0][0],
                                                     do_a + (((ks / 4) * AJ_TILE_Q * AJ_SW + (ks % 4) * 32) >> 4),
                                                     vd + (((ks / 4) * AJ_TILE_K * AJ_SW + sb * AJ_SW + (ks % 4) * 32) >> 4),
                                                     ks > 0);
        aj_wgmma_commit();
        aj_wgmma_wait<0>();  // S and dP, and the previous sub-block's dQ (its A registers are free)
        aj_bwd_dq_ds<AJ_BWDQ_SUB>(p, t, item.head, c0 + sb, quad, w, s, dp);
        aj_sm90_pack<AJ_BWDQ_SUB>(s, dsa);
        aj_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < AJ_BWDQ_SUB / 16; ++kk)  // dQ += dS K, 16 keys a step
          aj_wgmma_rs<AJ_HEAD_DIM, AJ_WGMMA_TYPE, 1>(*(float(*)[AJ_HEAD_DIM / 2]) & dq[0][0], dsa[kk],
                                                     kn + (((sb + kk * 16) * AJ_SW) >> 4), true);
        aj_wgmma_commit();
      }
      aj_wgmma_wait<0>();  // K's stage is read: the barrier below lets a later load overwrite it
    }
    aj_syncthreads();
  }
  aj_cp_async_wait<0>();

  // Warpgroup 1's sums into the K ring (no tile is read any more), then warpgroup 0 adds them to
  // its own: thread x of each holds the same rows and columns.
  float* const part = (float*)sh.k;
  const int lt = tid % 128;
  if (wg == 1) {
#pragma unroll
    for (int j = 0; j < AJ_HEAD_DIM / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) part[(j * 4 + e) * 128 + lt] = dq[j][e];
  }
  aj_syncthreads();
  if (wg == 1) return;
#pragma unroll
  for (int j = 0; j < AJ_HEAD_DIM / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[j][e] += part[(j * 4 + e) * 128 + lt];
  aj_bwd_dq_finish(bp, item, b, r0, quad, w, dq);
}
