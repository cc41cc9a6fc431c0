// The Hopper backward's dK/dV kernel with TMA and a producer warpgroup (sm_90a; FlashAttention-3's
// backward, section 3 of its paper): a key tile of 128 rows, 64 per consumer warpgroup, against
// query tiles of 64 rows that a producer brings in.
//
//   producer (warpgroup 2)   its first thread loads each query entry's Q and dO tiles with
//                            cp.async.bulk.tensor into a ring of AJ_STAGES stages, completing on
//                            the stage's "full" mbarrier, after the consumers released the stage's
//                            last use on its "empty" one; then it gives its registers away.
//   consumers (0 and 1)      bwd_sm90.cuh's products for their 64 key rows: S^T = K Q^T and
//                            dP^T = V dO^T (wgmma, shared operands), P^T and dS^T in registers
//                            (bwd_sm80.cuh's element rule), dV += P^T dO and dK += dS^T Q (A from
//                            registers); each writes its dS^T rows into dS (queries x 128 keys),
//                            releases the stage, and after a barrier of both computes its share of
//                            dQ = dS K: past head dim 64 the columns are split (warpgroup w the
//                            w-th 64, over all 128 keys), at 64 the keys (warpgroup w over its
//                            own 64 rows, both adding into the same columns). Its 64 x 64 block
//                            goes to shared memory and into the fp32 dQ accumulator by bulk
//                            asynchronous reduce, one cp.reduce.async.bulk per query row (256
//                            bytes), which the next entry's block waits for before reusing the rows.
//
// A query tile's Q and dO are read from shared memory by twice the keys of bwd_sm90.cuh's kernel,
// which halves their loads per key; the loads no longer stand in the consumers' instruction
// stream. Each entry's LSE (exp2 domain, +inf for rows that must give P = 0) and D are loaded by the
// consumers themselves one entry ahead (a float per row each, raw into registers at the top of an
// entry, turned into the statistic and stored after its products) and made visible by the entry's
// barrier; the query entries are read two ahead, so that no global load is waited for in the entry
// that issues it. dS is double-
// buffered, so that barrier is the only one an entry needs: a warpgroup writes dS of entry e + 2
// only after the barrier of e + 1, which the other passes only once it has finished e's dQ.
//
// Rows are the plan's: a query entry's rows first + i * stride come through the tensor map for
// that stride (runtime/cuda/tma_maps.hpp, as the forward's key rows). Rows past the entry's count
// read their true values (zero past the tensor's end): their LSE is +inf, so P = dS = 0 there, and a
// non-finite value among them reaches dK or dV only as 0 * NaN, which the exact key-row path
// (aj_bwd_dkdv_store) sums again. K and V are loaded once per key item by the consumers with
// cp.async (zero past the key count). The two-pass form (deterministic) runs this kernel without
// dQ and bwd_sm90_dq.cuh's _dq at the same 64 x 128 tiles.

#if AJ_TILE_K != 128 || AJ_TILE_Q != 64
#error "the TMA backward runs 64-query x 128-key tiles"
#endif
#define AJ_BWDT_CONSUMERS 256
#define AJ_BWDT_THREADS 384
// setmaxnreg (as fwd_sm90_tma.cuh's two consumer warpgroups): 384 threads get 168 registers each
// at launch; the producer keeps 24 and the consumers take 240 (2 x 240 + 24 = 3 x 168).
#define AJ_BWDT_PRODUCER_REGS 24
#define AJ_BWDT_CONSUMER_REGS 240
#define AJ_BWDT_SUB AJ_BWD90_SUB
#define AJ_BWDT_K_BYTES (AJ_TILE_K * AJ_HEAD_DIM * 2)
#define AJ_BWDT_V_BYTES (AJ_TILE_K * AJ_HEAD_DIM_V * 2)
#define AJ_BWDT_Q_BYTES (AJ_TILE_Q * AJ_HEAD_DIM * 2)
#define AJ_BWDT_DO_BYTES (AJ_TILE_Q * AJ_HEAD_DIM_V * 2)
#define AJ_BWDT_STAGE_BYTES (AJ_BWDT_Q_BYTES + AJ_BWDT_DO_BYTES)
#define AJ_BWDT_DS_BYTES (AJ_TILE_Q * AJ_TILE_K * 2)  // [128 keys / 64][64 queries][128 B]
// A warpgroup's dQ block (64 rows x 64 columns, fp32) before its bulk reduce: rows of
// AJ_BWDT_DQ_PITCH floats (72: 32 bytes more than the data, so that the 8-byte pairs half a warp
// stores fall on distinct banks), emitted by codegen, which sizes shared memory with it.
#ifndef AJ_BWDT_DQ_PITCH
#error "AJ_BWDT_DQ_PITCH: the dQ staging pitch comes from codegen (compiler/codegen/codegen_backward.cpp)"
#endif
#define AJ_BWDT_DQ_BYTES (AJ_TILE_Q * AJ_BWDT_DQ_PITCH * 4)
// dQ's split between the warpgroups (above): by columns past head dim 64, by keys at 64.
#define AJ_BWDT_DQ_BY_COLUMNS (AJ_HEAD_DIM > 64)

// Dynamic shared memory from its first 1024-byte boundary (compiler/codegen/codegen_backward.cpp:
// backward_dkdv_sm90_tma_smem_bytes): K, V, AJ_STAGES stages of (Q, dO), two dS buffers, two
// buffers of (LSE, D) floats, each consumer warpgroup's dQ block, then the mbarriers.
struct AjBwdTmaShared {
  unsigned char *k, *v, *stages, *ds0;
  float *stats0, *dq0;
  aj_u64 *full, *empty;
  __device__ unsigned char* q(int s) const { return stages + s * AJ_BWDT_STAGE_BYTES; }
  __device__ unsigned char* dout(int s) const { return q(s) + AJ_BWDT_Q_BYTES; }
  __device__ unsigned char* ds(int buf) const { return ds0 + buf * AJ_BWDT_DS_BYTES; }
  __device__ float* lse2(int buf) const { return stats0 + buf * 2 * AJ_TILE_Q; }
  __device__ float* delta(int buf) const { return lse2(buf) + AJ_TILE_Q; }
  __device__ float* dq(int wg) const { return dq0 + wg * (AJ_BWDT_DQ_BYTES / 4); }
};
__device__ __forceinline__ AjBwdTmaShared aj_bwdt_shared(unsigned char* smem) {
  AjBwdTmaShared sh;
  sh.k = smem;
  sh.v = sh.k + AJ_BWDT_K_BYTES;
  sh.stages = sh.v + AJ_BWDT_V_BYTES;
  sh.ds0 = sh.stages + AJ_STAGES * AJ_BWDT_STAGE_BYTES;
  sh.stats0 = (float*)(sh.ds0 + 2 * AJ_BWDT_DS_BYTES);
  sh.dq0 = sh.stats0 + 2 * 2 * AJ_TILE_Q;
  sh.full = (aj_u64*)(sh.dq0 + 2 * (AJ_BWDT_DQ_BYTES / 4));
  sh.empty = sh.full + AJ_STAGES;
  return sh;
}

// The statistic thread t of a warpgroup's first 64 keeps for query entry qe: warpgroup 0 row t's
// LSE (exp2 domain, +inf past the rows), warpgroup 1 row t's D. In two steps, so that nothing
// waits for the load until the value is stored: aj_bwdt_stat_load reads the row's raw value (row
// 0's past the rows), aj_bwdt_stat_finish makes the statistic of it.
__device__ __forceinline__ float aj_bwdt_stat_load(const AjBwdParams& bp, const AjQueryEntry& qe, aj_i64 b, int wg, int t) {
  const aj_i64 i = qe.rows_start + (aj_i64)(t < qe.rows_count ? t : 0) * qe.rows_stride;
  if (wg == 0) return bp.fwd.lse[b * bp.fwd.lse_batch_stride + qe.head * bp.fwd.lse_head_stride + i];
  return bp.delta[(b * bp.heads_q + qe.head) * bp.seq_q + i];
}
__device__ __forceinline__ float aj_bwdt_stat_finish(float raw, bool valid, int wg) {
  if (wg != 0) return valid ? raw : 0.0f;
  const float inf = -AJ_NEG_INF, l = raw * AJ_LOG2E;  // aj_bwd_lse2_or_inf's value
  return !valid || l == AJ_NEG_INF ? inf : l;
}

// The producer's thread: every query entry's Q and dO of key item `ki` into the ring. `it0` counts
// the entries the block loaded before this item (a persistent block's ring runs on across its
// items: entry it takes stage it % AJ_STAGES in its use it / AJ_STAGES); returns the count after.
__device__ __forceinline__ int aj_bwdt_produce(const AjTmaMaps& maps, const AjBwdTmaShared& sh, const AjBwdParams& bp,
                                               const AjKeyItem& ki, aj_i64 b, int it0) {
  int it = it0;
  for (int e = ki.entry_begin; e < ki.entry_end; ++e, ++it) {
    const AjQueryEntry qe = bp.query_entries[e];
    const int s = it % AJ_STAGES, use = it / AJ_STAGES;
    // A stage's use u waits for the consumers' release of its use u - 1 (phase u - 1).
    if (use > 0) aj_mbarrier_wait(&sh.empty[s], (aj_u32)((use - 1) & 1));
    aj_mbarrier_arrive_expect_tx(&sh.full[s], AJ_BWDT_STAGE_BYTES);
    aj_tma_rows<AJ_TILE_Q, AJ_HEAD_DIM, AJ_MAPS_K>(maps, sh.q(s), &sh.full[s], qe.rows_start, qe.rows_stride, qe.head, (int)b);
    aj_tma_rows<AJ_TILE_Q, AJ_HEAD_DIM_V, AJ_MAPS_V>(maps, sh.dout(s), &sh.full[s], qe.rows_start, qe.rows_stride, qe.head, (int)b);
  }
  return it;
}

// A consumer thread's share of key item `ki`'s K and V (cp.async, zero past the key count) and of
// its first entry's statistics (into the buffer `buf` of the entry's count), in place for every
// consumer once the caller's barrier has passed.
__device__ __forceinline__ void aj_bwdt_load_item(const AjBwdParams& bp, const AjBwdTmaShared& sh, const AjKeyItem& ki, aj_i64 b,
                                                  int buf, int tid) {
  aj_bwd90_load_keys<AJ_BWDT_CONSUMERS>(bp.fwd, sh.k, sh.v, ki, b);
  aj_cp_async_commit();
  if (tid % 128 < AJ_TILE_Q && ki.entry_begin < ki.entry_end) {
    const AjQueryEntry first = bp.query_entries[ki.entry_begin];
    const float x = aj_bwdt_stat_finish(aj_bwdt_stat_load(bp, first, b, tid / 128, tid % 128), tid % 128 < first.rows_count,
                                        tid / 128);
    (tid < 128 ? sh.lse2(buf) : sh.delta(buf))[tid % 128] = x;
  }
  aj_cp_async_wait<0>();
  aj_fence_proxy_async();  // K and V are read by wgmma (the async proxy) after the barrier
}

// A consumer thread's key item, K, V and the first statistics in place: the query entries (the
// stage ring's entries it0, it0 + 1, ...; returns the count after), then dK and dV.
__device__ __forceinline__ int aj_bwdt_consume(const AjBwdParams& bp, const AjBwdTmaShared& sh, const AjKeyItem& ki, aj_i64 b,
                                               int it0, int tid) {
  const AjParams& p = bp.fwd;
  const bool single = bp.dq_acc != nullptr;
  const int wg = aj_warp_uniform(tid / 128), warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, quad = lane % 4;
  const int kr0 = wg * 64 + warp * 16 + g, kr1 = kr0 + 8;  // this thread's key rows of the tile
  const aj_i64 doc = aj_doc_start(p, ki.keys_start);
  const aj_i64 kpos0 = p.k_offset - doc + ki.keys_start + (aj_i64)kr0 * ki.keys_stride;
  const aj_i64 kpos1 = p.k_offset - doc + ki.keys_start + (aj_i64)kr1 * ki.keys_stride;
  // Descriptors (fwd_sm90.cuh): this warpgroup's 64 rows of K and V as the K-major A of S^T and
  // dP^T, K as the N-major B of dQ = dS K, dS as its K-major A.
  const aj_u64 k_a = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.k + wg * 64 * AJ_SW), 16, 8 * AJ_SW);
  const aj_u64 v_a = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.v + wg * 64 * AJ_SW), 16, 8 * AJ_SW);
  const aj_u64 k_b = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.k), AJ_TILE_K * AJ_SW, 8 * AJ_SW);
  // This warpgroup's share of dQ: columns dq_c0 .. + 63 over key rows dq_k0 .. dq_k0 + dq_keys - 1.
  const int dq_c0 = AJ_BWDT_DQ_BY_COLUMNS ? wg * AJ_COLS : 0;
  const int dq_k0 = AJ_BWDT_DQ_BY_COLUMNS ? 0 : wg * 64;
  constexpr int DQ_KEYS = AJ_BWDT_DQ_BY_COLUMNS ? AJ_TILE_K : 64;

  float dk[AJ_HEAD_DIM / 8][4], dv[AJ_HEAD_DIM_V / 8][4];
  aj_zero<AJ_HEAD_DIM>(dk);
  aj_zero<AJ_HEAD_DIM_V>(dv);
  bool kbad = false;  // the single pass: the key tile holds a NaN or an inf
  if (single) {
    bool bad = false;
    for (int x = lane; x < AJ_BWDT_K_BYTES / 4; x += 32) bad |= aj_tc_word_nonfinite(((const aj_u32*)sh.k)[x]);
    kbad = aj_warp_any(bad);
  }
  aj_u32 pa[AJ_BWDT_SUB / 16][4], dsa[AJ_BWDT_SUB / 16][4];  // A operands of dV and dK, in flight until waited for
  AjQueryEntry qe_cur = {}, qe_next = {};  // the entries e and e + 1 (zeros past the item's)
  if (ki.entry_begin < ki.entry_end) qe_cur = bp.query_entries[ki.entry_begin];
  if (ki.entry_begin + 1 < ki.entry_end) qe_next = bp.query_entries[ki.entry_begin + 1];
  int it = it0;
  for (int e = ki.entry_begin; e < ki.entry_end; ++e, ++it) {
    const int stage = it % AJ_STAGES, buf = it & 1;
    // This entry, loaded an entry ago, and the one after next, loaded now: a global load is first
    // used an entry after it was issued (the loop's only such loads).
    const AjQueryEntry qe = qe_cur;
    AjQueryEntry qe_far = qe_next;
    if (e + 2 < ki.entry_end) qe_far = bp.query_entries[e + 2];
    // The next entry's statistic, loaded now and stored after this entry's products (its buffer's
    // last readers passed the previous entry's barrier).
    const bool stat_thread = tid % 128 < AJ_TILE_Q && e + 1 < ki.entry_end;
    const float next_raw = stat_thread ? aj_bwdt_stat_load(bp, qe_next, b, wg, tid % 128) : 0.0f;
    aj_mbarrier_wait(&sh.full[stage], (aj_u32)((it / AJ_STAGES) & 1));
    bool full;
    const bool visit = aj_bwd_entry_visit(p, ki, qe, full);
    if (visit) {
      const aj_u64 q_b = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.q(stage)), 16, 8 * AJ_SW);
      const aj_u64 do_b = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.dout(stage)), 16, 8 * AJ_SW);
      const aj_u64 q_n = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.q(stage)), AJ_TILE_Q * AJ_SW, 8 * AJ_SW);
      const aj_u64 do_n = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.dout(stage)), AJ_TILE_Q * AJ_SW, 8 * AJ_SW);
      const float* lse2 = sh.lse2(buf);
      const float* delta = sh.delta(buf);
#pragma unroll 1
      for (int c0 = 0; c0 < AJ_TILE_Q; c0 += AJ_BWDT_SUB)  // bwd_sm90.cuh's sub-blocks
        aj_bwd90_sub_block(p, ki, qe, full, c0, quad, kr0, kr1, kpos0, kpos1, lse2, delta, k_a, v_a, q_b, do_b, q_n, do_n,
                           single ? sh.ds(buf) : nullptr, dk, dv, pa, dsa);
      aj_wgmma_wait<0>();
    }
    aj_mbarrier_arrive(&sh.empty[stage]);  // this warpgroup has read the stage's Q and dO
    if (stat_thread)
      (wg == 0 ? sh.lse2(buf ^ 1) : sh.delta(buf ^ 1))[tid % 128] = aj_bwdt_stat_finish(next_raw, tid % 128 < qe_next.rows_count, wg);
    if (single && visit) aj_fence_proxy_async();  // dS's generic stores, then the wgmmas that read them
    aj_named_sync(1, AJ_BWDT_CONSUMERS);  // both warpgroups' dS and the next statistics are in place
    if (single && visit) {
      const unsigned char* const ds = sh.ds(buf);
      const aj_u64 ds_a = aj_wgmma_desc<AJ_SW>(aj_smem_addr(ds), 16, 8 * AJ_SW);
      float acc[8][4];
      aj_wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < DQ_KEYS / 16; ++kk) {
        const int ks = dq_k0 / 16 + kk;  // 16 keys
        aj_wgmma_ss<64, AJ_WGMMA_TYPE, 1>(*(float(*)[32]) & acc[0][0],
                                          ds_a + (((ks / 4) * AJ_TILE_Q * AJ_SW + (ks % 4) * 32) >> 4),
                                          k_b + (((dq_c0 / AJ_COLS) * AJ_TILE_K * AJ_SW + ks * 16 * AJ_SW) >> 4), kk > 0);
      }
      aj_wgmma_commit();
      aj_wgmma_wait<0>();
      // The block into this warpgroup's staging rows, once the previous entry's reduce has read
      // them (its issuing threads wait, then the warpgroup's barrier), then one bulk reduce per row
      // into the fp32 accumulator.
      float* const stage = sh.dq(wg);
      const int lt = tid % 128;
      if (lt < AJ_TILE_Q) aj_bulk_wait_read<0>();
      aj_named_sync(2 + wg, 128);
      if (kbad && !full && aj_bwd_any_nonfinite(acc)) {
        aj_bwd90_dq_exact(bp, ds, sh.k, ki, qe, dq_c0, dq_k0, dq_k0 + DQ_KEYS < ki.keys_count ? dq_k0 + DQ_KEYS : ki.keys_count, warp,
                          lane, [&](int r, int c, float x) { stage[r * AJ_BWDT_DQ_PITCH + c] = x; });
      } else {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float* const row = stage + (warp * 16 + g + half * 8) * AJ_BWDT_DQ_PITCH + quad * 2;
#pragma unroll
          for (int n = 0; n < 8; ++n) aj_st_f32x2(row + n * 8, aj_f32x2{acc[n][2 * half] * bp.scale, acc[n][2 * half + 1] * bp.scale});
        }
      }
      aj_fence_proxy_async();  // the generic stores, then the bulk copies that read them
      aj_named_sync(2 + wg, 128);
      if (lt < qe.rows_count) {
        const aj_i64 i = qe.rows_start + (aj_i64)lt * qe.rows_stride;
        aj_bulk_reduce_add_f32(bp.dq_acc + ((b * bp.seq_q + i) * bp.heads_q + qe.head) * AJ_HEAD_DIM + dq_c0,
                               stage + lt * AJ_BWDT_DQ_PITCH, AJ_COLS * 4);
      }
      if (lt < AJ_TILE_Q) aj_bulk_commit();
    }
    qe_cur = qe_next;
    qe_next = qe_far;
  }
  aj_bwd_dkdv_store(bp, ki, b, kr0, kr1, quad, dk, dv);
  return it;
}

// Persistent blocks (AJ_PERSISTENT; RuntimeOptions::persistent_blocks, as the TMA forward's): the
// launch has at most one block per SM, and each takes the units u = blockIdx.x, + gridDim.x, ... of
// the launch's key items x batch entries (unit u: key item key_item_base + u / batch of batch entry
// u % batch), a static scheduler over the plan's heaviest-first order within the launch's layer.
// The producer walks the same units and runs on into the next item's query entries while the
// consumers finish this one (its last products and dQ, dK and dV's stores, the next K and V),
// where a block per item would drain its ring and start cold. Between items the consumers meet on
// their own barrier twice: before K, V and the first statistics are overwritten (every wgmma on the
// last item's K and V has been waited for) and after the new ones have landed.
#define AJ_BWDT_ITEM_BARRIER 4  // the consumers' barriers 1 (dS) and 2, 3 (each warpgroup's dQ block)

__device__ __forceinline__ void aj_bwd_dkdv_sm90_tma(const AjBwdParams& bp, const AjTmaMaps& maps) {
  AJ_DYNAMIC_SHARED(aj_smem);
  const AjBwdTmaShared sh = aj_bwdt_shared(aj_smem + ((1024 - aj_smem_addr(aj_smem) % 1024) % 1024));
#ifdef AJ_PERSISTENT
  const aj_i64 first = (aj_i64)aj_block_idx_x(), step = (aj_i64)aj_grid_dim_x(), end = (aj_i64)bp.key_item_count * bp.batch;
  if (first >= end) return;  // more blocks than work
#else
  const AjKeyItem ki = bp.key_items[bp.key_item_base + aj_block_idx_x()];
  const aj_i64 b = aj_batch_index();
  if (b >= bp.fwd.batch || aj_bwd_adds_nothing(bp, ki)) return;
#endif
  const int tid = aj_thread_idx();

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < AJ_STAGES; ++s) {
      aj_mbarrier_init(&sh.full[s], 1);
      aj_mbarrier_init(&sh.empty[s], AJ_BWDT_CONSUMERS);
    }
  }
#ifndef AJ_PERSISTENT
  if (tid < AJ_BWDT_CONSUMERS) aj_bwdt_load_item(bp, sh, ki, b, 0, tid);  // K, V and the first statistics
#endif
  aj_syncthreads();  // the mbarriers initialised (and K, V, the first statistics in place) for every thread

  if (tid >= AJ_BWDT_CONSUMERS) {  // the producer warpgroup: its first thread issues every load
    aj_setmaxnreg_dec<AJ_BWDT_PRODUCER_REGS>();
    if (tid == AJ_BWDT_CONSUMERS) {
#ifdef AJ_PERSISTENT
      int it = 0;
      for (aj_i64 u = first; u < end; u += step) {
        const AjKeyItem ki = bp.key_items[bp.key_item_base + (int)(u / bp.batch)];
        if (!aj_bwd_adds_nothing(bp, ki)) it = aj_bwdt_produce(maps, sh, bp, ki, u % bp.batch, it);
      }
#else
      aj_bwdt_produce(maps, sh, bp, ki, b, 0);
#endif
    }
    return;
  }

  aj_setmaxnreg_inc<AJ_BWDT_CONSUMER_REGS>();
#ifdef AJ_PERSISTENT
  // The unit counter in 32 bits (the launch refuses more than 2^31 - 1 units: item_grid; the
  // producer's 64-bit count therefore walks the same units) and the bounds read again from the
  // parameters and special registers at each item: at head dim 128 the loop state spilled 136 bytes
  // with 64-bit counters held across the item, now one word (stored and loaded once per item,
  // outside the entries' loop).
  int it = 0;
  for (aj_u32 u = aj_block_idx_x(); u < (aj_u32)bp.key_item_count * (aj_u32)bp.batch; u += aj_grid_dim_x()) {
    const AjKeyItem ki = bp.key_items[bp.key_item_base + (int)(u / (aj_u32)bp.batch)];
    const aj_i64 b = u % (aj_u32)bp.batch;
    if (aj_bwd_adds_nothing(bp, ki)) continue;
    aj_named_sync(AJ_BWDT_ITEM_BARRIER, AJ_BWDT_CONSUMERS);  // every consumer is done with the last item's K and V
    aj_bwdt_load_item(bp, sh, ki, b, it & 1, tid);
    aj_named_sync(AJ_BWDT_ITEM_BARRIER, AJ_BWDT_CONSUMERS);
    it = aj_bwdt_consume(bp, sh, ki, b, it, tid);
  }
#else
  aj_bwdt_consume(bp, sh, ki, b, 0, tid);
#endif
  if (bp.dq_acc != nullptr && tid % 128 < AJ_TILE_Q) aj_bulk_wait<0>();  // every reduce this thread issued
}
