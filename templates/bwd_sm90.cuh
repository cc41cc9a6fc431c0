// The Hopper backward's dK/dV kernel (sm_90a): bwd_sm80.cuh's key-major single pass with every
// product on the warpgroup MMA. One warpgroup holds a key tile of 64 rows (16 a warp, the
// accumulator layout of bwd_sm80.cuh, so its softmax, masks and epilogue are shared); query tiles
// of 64 rows stream through two cp.async stages, as there. Per query tile:
//   S^T  = K Q^T and dP^T = V dO^T    wgmma, both operands in shared memory (K-major);
//   P^T, dS^T                         in registers (bwd_sm80.cuh's element rule);
//   dV  += P^T dO, dK += dS^T Q       wgmma, A from registers, B (dO, Q) N-major in shared memory;
//   dQ   = dS K                       wgmma per 64 columns of the head dim, dS written K-major to
//                                     shared memory, K N-major; added into the fp32 dQ accumulator
//                                     with red.global.add (the single pass only).
// Every shared tile has fwd_sm90.cuh's 128-byte-swizzle layout (64-element column blocks); each
// group of wgmmas is waited for. This is the cp.async form (RuntimeOptions::tma off); the TMA form
// with a producer and two consumer warpgroups (bwd_sm90_tma.cuh) shares its sub-block body
// (aj_bwd90_sub_block) and its exact dQ sum. The two-pass form (deterministic) runs
// bwd_sm90_dq.cuh's _dq, and this kernel then skips dQ.

#if !defined(AJ_BWD_PRODUCER) && (AJ_TILE_K != 64 || AJ_TILE_Q != 64)
#error "the sm_90a backward needs 64 x 64 tiles"
#endif
#define AJ_BWD90_THREADS 128
// Query columns of S^T and dP^T a thread holds at once: 64, or 32 past head dim 64, so that they
// fit beside the 64 x head-dim accumulators of dK and dV without spilling (as bwd_sm80.cuh's).
#define AJ_BWD90_SUB (AJ_HEAD_DIM > 64 || AJ_HEAD_DIM_V > 64 ? 32 : 64)
#define AJ_BWD90_K_BYTES (AJ_TILE_K * AJ_HEAD_DIM * 2)
#define AJ_BWD90_V_BYTES (AJ_TILE_K * AJ_HEAD_DIM_V * 2)
#define AJ_BWD90_Q_BYTES (AJ_TILE_Q * AJ_HEAD_DIM * 2)
#define AJ_BWD90_DO_BYTES (AJ_TILE_Q * AJ_HEAD_DIM_V * 2)
#define AJ_BWD90_STAGE_BYTES (AJ_BWD90_Q_BYTES + AJ_BWD90_DO_BYTES)
#define AJ_BWD90_DS_BYTES (AJ_TILE_Q * AJ_SW)

// Dynamic shared memory from its first 1024-byte boundary, each piece 1024-byte aligned (the
// swizzle's pattern): K, V, two stages of (Q, dO), dS [AJ_TILE_Q][128 B], then two stages of
// (LSE, D) floats (compiler/codegen/codegen_backward.cpp: backward_dkdv_sm90_smem_bytes).
struct AjBwd90Shared {
  unsigned char *k, *v, *ds, *stages;
  float* stats;  // per stage: LSE (exp2 domain) then D, AJ_TILE_Q floats each
  // Stage s's tiles and rows' statistics (computed, not indexed: an array indexed by the loop's
  // stage would live in local memory).
  __device__ unsigned char* q(int s) const { return stages + s * AJ_BWD90_STAGE_BYTES; }
  __device__ unsigned char* dout(int s) const { return q(s) + AJ_BWD90_Q_BYTES; }
  __device__ float* lse2(int s) const { return stats + s * 2 * AJ_TILE_Q; }
  __device__ float* delta(int s) const { return lse2(s) + AJ_TILE_Q; }
};
__device__ __forceinline__ AjBwd90Shared aj_bwd90_shared(unsigned char* smem) {
  AjBwd90Shared sh;
  sh.k = smem;
  sh.v = sh.k + AJ_BWD90_K_BYTES;
  sh.stages = sh.v + AJ_BWD90_V_BYTES;
  sh.ds = sh.stages + 2 * AJ_BWD90_STAGE_BYTES;
  sh.stats = (float*)(sh.ds + AJ_BWD90_DS_BYTES);
  return sh;
}

// Byte offset of element (row, col) in a swizzled tile of ROWS rows (fwd_sm90.cuh's layout).
template <int ROWS>
__device__ __forceinline__ int aj_sw_offset(int row, int col) {
  return (col / AJ_COLS) * ROWS * AJ_SW + row * AJ_SW + ((((col % AJ_COLS) / 8) ^ (row & 7)) << 4) + (col % 8) * 2;
}

// Key item ki's K and V rows into swizzled tiles at k and v (cp.async by THREADS threads, zero past
// the key count; the caller commits): both Hopper dK/dV kernels'.
template <int THREADS>
__device__ __forceinline__ void aj_bwd90_load_keys(const AjParams& p, unsigned char* k, unsigned char* v, const AjKeyItem& ki,
                                                   aj_i64 b) {
  aj_sm90_load_rows<AJ_TILE_K, AJ_HEAD_DIM, THREADS>(k, (const aj_elem*)p.k + b * p.k_batch_stride + ki.kv_head * p.k_head_stride,
                                                      p.k_row_stride, ki.keys_start, ki.keys_stride, ki.keys_count);
  aj_sm90_load_rows<AJ_TILE_K, AJ_HEAD_DIM_V, THREADS>(v, (const aj_elem*)p.v + b * p.v_batch_stride + ki.kv_head * p.v_head_stride,
                                                        p.v_row_stride, ki.keys_start, ki.keys_stride, ki.keys_count);
}

// Query entry `qe` into stage `s`: Q and dO through cp.async (the caller commits), LSE and D by
// plain loads (visible after the next barrier).
__device__ __forceinline__ void aj_bwd90_stage_queries(const AjBwdParams& bp, const AjBwd90Shared& sh, int s,
                                                       const AjQueryEntry& qe, aj_i64 b) {
  const AjParams& p = bp.fwd;
  aj_sm90_load_rows<AJ_TILE_Q, AJ_HEAD_DIM, AJ_BWD90_THREADS>(
      sh.q(s), (const aj_elem*)p.q + b * p.q_batch_stride + qe.head * p.q_head_stride, p.q_row_stride, qe.rows_start,
      qe.rows_stride, qe.rows_count);
  aj_sm90_load_rows<AJ_TILE_Q, AJ_HEAD_DIM_V, AJ_BWD90_THREADS>(
      sh.dout(s), (const aj_elem*)bp.dout + b * bp.do_batch_stride + qe.head * bp.do_head_stride, bp.do_row_stride,
      qe.rows_start, qe.rows_stride, qe.rows_count);
  const float* drow = bp.delta + (b * bp.heads_q + qe.head) * bp.seq_q;
  for (int r = aj_thread_idx(); r < AJ_TILE_Q; r += AJ_BWD90_THREADS) {
    const bool valid = r < qe.rows_count;
    const aj_i64 i = qe.rows_start + (aj_i64)(valid ? r : 0) * qe.rows_stride;
    sh.lse2(s)[r] = aj_bwd_lse2_or_inf(p, b, qe.head, i, valid);
    sh.delta(s)[r] = valid ? drow[i] : 0.0f;
  }
}

// This thread's elements of one 64 x 64 block of the single pass's dQ (columns c0 .. c0 + 63 of the
// head dim) summed over the attended pairs only, from dS and K in shared memory, and added into the
// fp32 accumulator in place of the tensor cores' block: a NaN or inf in a key row that some of
// these queries mask reaches them through the product as their dS = 0 times NaN. Rare: only a
// non-finite block of a partial entry whose key tile holds a non-finite value gets here. One
// element at a time, so the rare path adds few registers to the kernel's.
// dS is [keys / 64][AJ_TILE_Q][128 B] at `ds`, K the key tile at `k`; the sum runs over key rows
// k_lo .. k_hi - 1 (the rows whose dS this warpgroup's product read). Each sum, scaled, goes to
// sink(r, c, x): row r of the entry, column c of the block.
template <class Sink>
__device__ __forceinline__ void aj_bwd90_dq_exact(const AjBwdParams& bp, const unsigned char* ds, const unsigned char* k,
                                                  const AjKeyItem& ki, const AjQueryEntry& qe, int c0, int k_lo, int k_hi,
                                                  int warp, int lane, const Sink& sink) {
  const AjParams& p = bp.fwd;
  const int g = lane / 4, quad = lane % 4;
  const aj_i64 doc = aj_doc_start(p, ki.keys_start), q_origin = p.q_offset - doc + qe.rows_start;
  aj_rare_path(AJ_RARE_DQ_BLOCK);
#pragma unroll 1
  for (int half = 0; half < 2; ++half) {
    const int r = warp * 16 + g + half * 8;
    if (r >= qe.rows_count) continue;
#pragma unroll 1
    for (int x = 0; x < 16; ++x) {  // columns n * 8 + e of this thread, n < 8, e < 2
      const int col = c0 + (x / 2) * 8 + quad * 2 + (x & 1);
      float sum = 0.0f;
      for (int kr = k_lo; kr < k_hi; ++kr) {
        const aj_i64 kpos = p.k_offset - doc + ki.keys_start + (aj_i64)kr * ki.keys_stride;
        if (!aj_queries_allowed(p, qe.branch, qe.head, kpos, q_origin, (aj_cs)r * (aj_cs)qe.rows_stride)) continue;
        sum += aj_load((const aj_elem*)(ds + aj_sw_offset<AJ_TILE_Q>(r, kr))) *
               aj_load((const aj_elem*)(k + aj_sw_offset<AJ_TILE_K>(kr, col)));
      }
      sink(r, col - c0, sum * bp.scale);
    }
  }
}

// One sub-block of a query entry: its AJ_BWD90_SUB query columns from c0 (8-row aligned, so the
// swizzle holds). S^T = K Q^T and dP^T = V dO^T as two wgmma groups (k_a, v_a: this warpgroup's 64
// key rows, K-major; q_b, do_b: Q and dO as the K-major B); P^T (aj_bwd_pt) once S^T and the
// previous sub-block's dV and dK have landed (the A registers pa, dsa are then free), while dP^T
// runs; dS^T (aj_bwd_dst) once dP^T has. Where ds is not null, dS is written K-major into it
// (queries x keys, the A of dQ = dS K) by stmatrix from the packed registers dK's product reads,
// key rows past the tile's count zeroed. Then dV += f P^T dO and dK += dS^T Q are issued (q_n,
// do_n: Q and dO N-major) and left in flight. The two Hopper backward kernels' one body.
__device__ __forceinline__ void aj_bwd90_sub_block(const AjParams& p, const AjKeyItem& ki, const AjQueryEntry& qe, bool full, int c0,
                                                   int quad, int kr0, int kr1, aj_i64 kpos0, aj_i64 kpos1, const float* lse2,
                                                   const float* delta, aj_u64 k_a, aj_u64 v_a, aj_u64 q_b, aj_u64 do_b, aj_u64 q_n,
                                                   aj_u64 do_n, unsigned char* ds, float (&dk)[AJ_HEAD_DIM / 8][4],
                                                   float (&dv)[AJ_HEAD_DIM_V / 8][4], aj_u32 (&pa)[AJ_BWD90_SUB / 16][4],
                                                   aj_u32 (&dsa)[AJ_BWD90_SUB / 16][4]) {
  float s[AJ_BWD90_SUB / 8][4], dp[AJ_BWD90_SUB / 8][4];
  aj_wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < AJ_HEAD_DIM / 16; ++ks)
    aj_wgmma_ss<AJ_BWD90_SUB, AJ_WGMMA_TYPE, 0>(*(float(*)[AJ_BWD90_SUB / 2]) & s[0][0],
                                                k_a + (((ks / 4) * AJ_TILE_K * AJ_SW + (ks % 4) * 32) >> 4),
                                                q_b + (((ks / 4) * AJ_TILE_Q * AJ_SW + c0 * AJ_SW + (ks % 4) * 32) >> 4), ks > 0);
  aj_wgmma_commit();
#pragma unroll
  for (int ks = 0; ks < AJ_HEAD_DIM_V / 16; ++ks)
    aj_wgmma_ss<AJ_BWD90_SUB, AJ_WGMMA_TYPE, 0>(*(float(*)[AJ_BWD90_SUB / 2]) & dp[0][0],
                                                v_a + (((ks / 4) * AJ_TILE_K * AJ_SW + (ks % 4) * 32) >> 4),
                                                do_b + (((ks / 4) * AJ_TILE_Q * AJ_SW + c0 * AJ_SW + (ks % 4) * 32) >> 4), ks > 0);
  aj_wgmma_commit();
  // S^T (with the last sub-block's dV, dK, committed before it: their A registers are free again),
  // then P^T's exponentials while dP^T is still on the tensor cores; then dP^T and dS^T. P^T sits
  // in both arms of a branch so that the wait for dP^T stays after it (ptxas puts a wgmma wait at
  // the top of its basic block; fwd_sm90.cuh's softmax does the same).
  aj_wgmma_wait<1>();
  if (full) {
    aj_bwd_pt<AJ_BWD90_SUB>(p, ki, qe, true, c0, quad, kr0, kr1, kpos0, kpos1, lse2, s);
  } else {
    aj_bwd_pt<AJ_BWD90_SUB>(p, ki, qe, false, c0, quad, kr0, kr1, kpos0, kpos1, lse2, s);
  }
  aj_wgmma_wait<0>();
  aj_bwd_dst<AJ_BWD90_SUB>(p, c0, quad, delta, s, dp);
  aj_sm90_pack<AJ_BWD90_SUB>(dp, pa);  // fwd_sm90.cuh
  aj_sm90_pack<AJ_BWD90_SUB>(s, dsa);
  if (ds) {
    // dS^T's packed registers are the 8 x 8 fragments stmatrix takes: dsa[kk][m] holds key rows
    // kr0 - g + (m & 1) * 8 (+ g) by query columns c0 + kk * 16 + (m >> 1) * 8 (+ quad * 2, + 1).
    // Stored transposed, each is 8 query rows of 8 keys (16 bytes, one swizzle chunk), whose
    // addresses lanes 8m .. 8m + 7 give. Key rows past the tile's count go in as 0 (their K rows
    // are zero-filled, so their P^T is not); dK never stores those rows.
    if (kr0 >= ki.keys_count) {
#pragma unroll
      for (int kk = 0; kk < AJ_BWD90_SUB / 16; ++kk) dsa[kk][0] = dsa[kk][2] = 0u;
    }
    if (kr1 >= ki.keys_count) {
#pragma unroll
      for (int kk = 0; kk < AJ_BWD90_SUB / 16; ++kk) dsa[kk][1] = dsa[kk][3] = 0u;
    }
    const int lane = aj_thread_idx() % 32, m = lane / 8;
    unsigned char* const at = ds + aj_sw_offset<AJ_TILE_Q>(c0 + (m >> 1) * 8 + lane % 8, kr0 - lane / 4 + (m & 1) * 8);
#pragma unroll
    for (int kk = 0; kk < AJ_BWD90_SUB / 16; ++kk) aj_stmatrix_x4_trans(dsa[kk], at + kk * 16 * AJ_SW);
  }
  aj_wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < AJ_BWD90_SUB / 16; ++kk)
    aj_wgmma_rs<AJ_HEAD_DIM_V, AJ_WGMMA_TYPE, 1>(*(float(*)[AJ_HEAD_DIM_V / 2]) & dv[0][0], pa[kk],
                                                 do_n + (((c0 + kk * 16) * AJ_SW) >> 4), true);
#pragma unroll
  for (int kk = 0; kk < AJ_BWD90_SUB / 16; ++kk)
    aj_wgmma_rs<AJ_HEAD_DIM, AJ_WGMMA_TYPE, 1>(*(float(*)[AJ_HEAD_DIM / 2]) & dk[0][0], dsa[kk],
                                               q_n + (((c0 + kk * 16) * AJ_SW) >> 4), true);
  aj_wgmma_commit();
}

__device__ __forceinline__ void aj_bwd_dkdv_sm90(const AjBwdParams& bp) {
  const AjParams& p = bp.fwd;
  AJ_DYNAMIC_SHARED(aj_smem);
  const AjBwd90Shared sh = aj_bwd90_shared(aj_smem + ((1024 - aj_smem_addr(aj_smem) % 1024) % 1024));
  const bool single = bp.dq_acc != nullptr;
  const AjKeyItem ki = bp.key_items[bp.key_item_base + aj_block_idx_x()];
  const aj_i64 b = aj_batch_index();
  if (b >= p.batch || aj_bwd_adds_nothing(bp, ki)) return;
  const int warp = aj_warp_uniform(aj_thread_idx() / 32), lane = aj_thread_idx() % 32;
  const int g = lane / 4, quad = lane % 4;

  // K and V of the key tile with the first query tile (one cp.async group).
  aj_bwd90_load_keys<AJ_BWD90_THREADS>(p, sh.k, sh.v, ki, b);
  if (ki.entry_begin < ki.entry_end) aj_bwd90_stage_queries(bp, sh, 0, bp.query_entries[ki.entry_begin], b);
  aj_cp_async_commit();

  const int kr0 = warp * 16 + g, kr1 = kr0 + 8;
  const aj_i64 doc = aj_doc_start(p, ki.keys_start);
  const aj_i64 kpos0 = p.k_offset - doc + ki.keys_start + (aj_i64)kr0 * ki.keys_stride;
  const aj_i64 kpos1 = p.k_offset - doc + ki.keys_start + (aj_i64)kr1 * ki.keys_stride;
  // Descriptors (fwd_sm90.cuh): K and V as the A operand of S^T and dP^T (K-major, this warpgroup's
  // 64 rows), K as the N-major B of dQ = dS K, dS as the K-major A of it.
  const aj_u64 k_a = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.k), 16, 8 * AJ_SW);
  const aj_u64 v_a = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.v), 16, 8 * AJ_SW);
  const aj_u64 k_b = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.k), AJ_TILE_K * AJ_SW, 8 * AJ_SW);
  const aj_u64 ds_a = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.ds), 16, 8 * AJ_SW);

  float dk[AJ_HEAD_DIM / 8][4], dv[AJ_HEAD_DIM_V / 8][4];
  aj_zero<AJ_HEAD_DIM>(dk);
  aj_zero<AJ_HEAD_DIM_V>(dv);
  bool kbad = false;  // the single pass: the key tile holds a NaN or an inf
  aj_u32 pa[AJ_BWD90_SUB / 16][4], dsa[AJ_BWD90_SUB / 16][4];  // A operands of dV and dK, in flight until waited for
  for (int e = ki.entry_begin, it = 0; e < ki.entry_end; ++e, ++it) {
    const int stage = it & 1;
    // Prefetch the next query tile into the other stage: its readers passed the last barrier.
    if (e + 1 < ki.entry_end) aj_bwd90_stage_queries(bp, sh, stage ^ 1, bp.query_entries[e + 1], b);
    aj_cp_async_commit();
    aj_sm90_wait_tiles<1>();
    if (single && it == 0) {  // K landed with the first query tile: any non-finite word in it?
      bool bad = false;
      for (int x = lane; x < AJ_BWD90_K_BYTES / 4; x += 32) bad |= aj_tc_word_nonfinite(((const aj_u32*)sh.k)[x]);
      kbad = aj_warp_any(bad);
    }
    const AjQueryEntry qe = bp.query_entries[e];
    bool full;
    if (aj_bwd_entry_visit(p, ki, qe, full)) {
      // Q and dO as the K-major B of S^T and dP^T, and as the N-major B of dK and dV.
      const aj_u64 q_b = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.q(stage)), 16, 8 * AJ_SW);
      const aj_u64 do_b = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.dout(stage)), 16, 8 * AJ_SW);
      const aj_u64 q_n = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.q(stage)), AJ_TILE_Q * AJ_SW, 8 * AJ_SW);
      const aj_u64 do_n = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.dout(stage)), AJ_TILE_Q * AJ_SW, 8 * AJ_SW);
      const float* lse2 = sh.lse2(stage);
      const float* delta = sh.delta(stage);
      // The query tile AJ_BWD90_SUB columns at a time: S^T and dP^T of a sub-block, its P^T and
      // dS^T, then dV and dK from it (the wgmma of one sub-block runs under the next one's).
#pragma unroll 1
      for (int c0 = 0; c0 < AJ_TILE_Q; c0 += AJ_BWD90_SUB)
        aj_bwd90_sub_block(p, ki, qe, full, c0, quad, kr0, kr1, kpos0, kpos1, lse2, delta, k_a, v_a, q_b, do_b, q_n, do_n,
                           single ? sh.ds : nullptr, dk, dv, pa, dsa);
      if (single) {
        aj_fence_proxy_async();  // dS's generic stores, then the wgmma that reads them
        aj_syncthreads();
#pragma unroll 1
        for (int c0 = 0; c0 < AJ_HEAD_DIM; c0 += AJ_COLS) {
          float acc[8][4];
          aj_wgmma_fence();
#pragma unroll
          for (int ks = 0; ks < AJ_TILE_K / 16; ++ks)
            aj_wgmma_ss<64, AJ_WGMMA_TYPE, 1>(*(float(*)[32]) & acc[0][0], ds_a + ((ks * 32) >> 4),
                                              k_b + (((c0 / AJ_COLS) * AJ_TILE_K * AJ_SW + ks * 16 * AJ_SW) >> 4), ks > 0);
          aj_wgmma_commit();
          aj_wgmma_wait<0>();
          if (kbad && !full && aj_bwd_any_nonfinite(acc)) {
            aj_bwd90_dq_exact(bp, sh.ds, sh.k, ki, qe, c0, 0, ki.keys_count, warp, lane, [&](int r, int c, float x) {
              const aj_i64 i = qe.rows_start + (aj_i64)r * qe.rows_stride;
              aj_red_add_f32(bp.dq_acc + ((b * bp.seq_q + i) * bp.heads_q + qe.head) * AJ_HEAD_DIM + c0 + c, x);
            });
            continue;
          }
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int r = warp * 16 + g + half * 8;
            if (r >= qe.rows_count) continue;
            const aj_i64 i = qe.rows_start + (aj_i64)r * qe.rows_stride;
            float* dst = bp.dq_acc + ((b * bp.seq_q + i) * bp.heads_q + qe.head) * AJ_HEAD_DIM + c0 + quad * 2;
#pragma unroll
            for (int n = 0; n < 8; ++n) aj_red_add_f32x2(dst + n * 8, acc[n][2 * half] * bp.scale, acc[n][2 * half + 1] * bp.scale);
          }
        }
      }
      aj_wgmma_wait<0>();
    }
    aj_syncthreads();  // this stage (and dS) is overwritten by the prefetch two tiles on
  }
  aj_cp_async_wait<0>();
  aj_bwd_dkdv_store(bp, ki, b, kr0, kr1, quad, dk, dv);
}
