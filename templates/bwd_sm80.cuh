// The tensor-core backward kernels for sm_80 and newer (fp16/bf16 in, fp32 accumulate), in the
// style of FlashAttention-2's backward, between bwd_common.cuh's _pre and _cvt. Every GEMM is an
// mma.sync m16n8k16 on fragments from ldmatrix; tiles come through the plans' row maps, so
// dilated rows are gathered by the cp.async loads, never copied.
//   _dq    over the forward plan, one query tile per block, 16 query rows per warp (as
//          fwd_sm80.cuh): for each key tile, S = Q K^T, dP = dO V^T, P = exp2(S - LSE),
//          dS = P (dP - D), dQ += dS K. A query tile owns its rows: dQ needs no atomics and is
//          the same bits on every run.
//   _dkdv  over the key-major plan, one key tile per block, 16 key rows per warp: the K and V
//          tiles stay in shared memory while the query tiles that attend them stream through
//          (double-buffered with cp.async); S^T = K Q^T, dP^T = V dO^T, dV += P^T dO,
//          dK += dS^T Q in registers; then dK, dV are added to the fp32 workspaces, atomically
//          or, for a layer of disjoint key tiles, plainly (bwd_simt.cuh's rule). In the single
//          pass (bp.dq_acc set) dS^T also goes through shared memory and dQ += dS K is added
//          into the fp32 dQ accumulator with red.global.add, as FlashAttention-2 does: five
//          products per tile pair instead of the two-pass form's seven, and no second walk.
//          Past head dim 128 the accumulators of dK and dV no longer fit beside S^T and dP^T: the
//          block walks its query tiles once per column slice (AJ_BWD_SLICES of AJ_BWD_DK_COLS and
//          AJ_BWD_DV_COLS columns, compiler/codegen/codegen_backward.cpp: backward_slices), each walk
//          computing S^T and dP^T over the whole head dim and adding its columns of dK, dV and dQ.
// The output scale f of the forward (O = f softmax(S) V) enters as dP -> f dP and dV -> f dV;
// the softmax scale as dQ, dK -> scale dQ, scale dK. A query row that attends nothing has
// LSE = -inf: its P is 0 (its LSE is read as +inf), so it gives and gets no gradient.

// _dq blocks have fwd_sm80.cuh's AJ_THREADS (16 query rows per warp); _dkdv blocks 16 key rows per warp.
#define AJ_BWD_KV_THREADS (AJ_TILE_K / 16 * 32)
// Columns of S (and dP) a warp holds at once: AJ_BWD_SUB_MAX in _dkdv, AJ_BWD_DQ_SUB_MAX in _dq,
// defined by the generator (compiler/codegen/codegen_backward.cpp: backward_sub_max, which the shared-memory
// size uses too, and backward_dq_sub_max). Tiles are powers of two, so a tile is a whole number of
// these.
#define AJ_BWD_SUB_K (AJ_TILE_K > AJ_BWD_DQ_SUB_MAX ? AJ_BWD_DQ_SUB_MAX : AJ_TILE_K)
#define AJ_BWD_SUB_Q (AJ_TILE_Q > AJ_BWD_SUB_MAX ? AJ_BWD_SUB_MAX : AJ_TILE_Q)

// LSE of a row in the exp2 domain, +inf where P must be 0: past the tile's rows, or a row that
// attends nothing (exp2(s - inf) = 0 for every finite s, and never NaN).
__device__ __forceinline__ float aj_bwd_lse2_or_inf(const AjParams& p, aj_i64 b, int h, aj_i64 i, bool valid) {
  const float inf = -AJ_NEG_INF;
  if (!valid) return inf;
  const float l = aj_bwd_lse2(p, b, h, i);
  return l == AJ_NEG_INF ? inf : l;
}

// acc[ROWS=16][COLS] += A[16][K] B[K][COLS] where A comes row-major from shared memory (pitch
// APITCH, this warp's 16 rows at `a`) and B^T row-major (B's columns are rows of `bt`, pitch
// BPITCH): the S = Q K^T shape. K and COLS are multiples of 16.
template <int K, int COLS, int APITCH, int BPITCH>
__device__ __forceinline__ void aj_mma_abt(float (&acc)[COLS / 8][4], const aj_elem* a, const aj_elem* bt, int lane) {
  const int a_row = lane % 16, a_col = (lane / 16) * 8;
  const int b_row = (lane & 7) + ((lane >> 4) << 3), b_col = ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks) {
    aj_u32 af[4];
    aj_ldmatrix_x4(af, a + a_row * APITCH + ks * 16 + a_col);
#pragma unroll
    for (int n = 0; n < COLS / 16; ++n) {
      aj_u32 bf[4];
      aj_ldmatrix_x4(bf, bt + (n * 16 + b_row) * BPITCH + ks * 16 + b_col);
      aj_mma(acc[2 * n], af, bf[0], bf[1]);
      aj_mma(acc[2 * n + 1], af, bf[2], bf[3]);
    }
  }
}

// acc[16][COLS] += X[16][K] B[K][COLS] where X is this warp's accumulator tile (x[K / 8][4], the
// S/P layout, rounded to the input type) and B row-major in shared memory (pitch BPITCH): the
// O += P V shape. Only B's first `cols` columns (a multiple of 16) where fewer: a narrower slice.
template <int K, int COLS, int BPITCH>
__device__ __forceinline__ void aj_mma_xb(float (&acc)[COLS / 8][4], const float (&x)[K / 8][4], const aj_elem* b, int lane,
                                          int cols = COLS) {
  const int b_row = (lane & 7) + ((lane >> 3) & 1) * 8, b_col = (lane >> 4) * 8;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    aj_u32 xa[4];
    xa[0] = aj_pack2(x[2 * kk][0], x[2 * kk][1]);
    xa[1] = aj_pack2(x[2 * kk][2], x[2 * kk][3]);
    xa[2] = aj_pack2(x[2 * kk + 1][0], x[2 * kk + 1][1]);
    xa[3] = aj_pack2(x[2 * kk + 1][2], x[2 * kk + 1][3]);
#pragma unroll
    for (int n = 0; n < COLS / 16; ++n) {
      if (n * 16 >= cols) break;  // (an empty slice: none; folds away where cols is COLS)
      aj_u32 bf[4];
      aj_ldmatrix_x4_trans(bf, b + (kk * 16 + b_row) * BPITCH + n * 16 + b_col);
      aj_mma(acc[2 * n], xa, bf[0], bf[1]);
      aj_mma(acc[2 * n + 1], xa, bf[2], bf[3]);
    }
  }
}

template <int COLS>
__device__ __forceinline__ void aj_zero(float (&acc)[COLS / 8][4]) {
#pragma unroll
  for (int j = 0; j < COLS / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
}

// ---- _dq: over the forward plan -------------------------------------------------------------

// This thread's columns of dQ for the rows in `rows` (bit h: row r0 + 8 h) summed again in float32
// from global memory over the keys each row attends only: dQ = sum dS K with dS = P (f dP - D),
// P = exp2(S scale_log2 - LSE). The rare path of a non-finite K row that a row masks (the tensor
// cores multiply it by that row's dS = 0). lse2, delta: the rows' exp2-domain LSE (+inf where P is
// 0) and D; store(h, j, x0, x1) receives columns j * 8 + quad * 2 and + 1, unscaled.
template <typename Store>
__device__ __forceinline__ void aj_bwd_exact_dq_rows(const AjBwdParams& bp, const AjItem& item, aj_i64 b, int r0, int quad,
                                                     const float (&lse2)[2], const float (&delta)[2], int rows, const Store& store) {
  const AjParams& p = bp.fwd;
  constexpr int BLOCKS = AJ_HEAD_DIM / 8, CHUNK = BLOCKS < AJ_TC_EXACT_COLS ? BLOCKS : AJ_TC_EXACT_COLS;
  aj_rare_path(AJ_RARE_DQ_ROWS);
  const bool want[2] = {(rows & 1) != 0, (rows & 2) != 0};
  const int kvh = item.head / p.heads_per_kv;
  const aj_elem* kb = (const aj_elem*)p.k + b * p.k_batch_stride + kvh * p.k_head_stride;
  const aj_elem* vb = (const aj_elem*)p.v + b * p.v_batch_stride + kvh * p.v_head_stride;
  const AjTcRows rs = aj_tc_rows(p, item, b, r0, want);
  const aj_elem* dorow[2];
#pragma unroll
  for (int h = 0; h < 2; ++h)
    dorow[h] = (const aj_elem*)bp.dout + b * bp.do_batch_stride + item.head * bp.do_head_stride +
               (item.rows_start + (aj_i64)(want[h] ? r0 + 8 * h : 0) * item.rows_stride) * bp.do_row_stride;
#pragma unroll 1
  for (int j0 = 0; j0 < BLOCKS; j0 += CHUNK) {
    float ex[CHUNK][4];
#pragma unroll
    for (int j = 0; j < CHUNK; ++j) ex[j][0] = ex[j][1] = ex[j][2] = ex[j][3] = 0.0f;
    aj_tc_attended_keys(p, item, rs.qpos, want, [&](const bool (&att)[2], aj_i64 key, float) {  // Separate plans: no weights
      const aj_elem* krow = kb + key * p.k_row_stride;
      const aj_elem* vrow = vb + key * p.v_row_stride;
      float ds[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        ds[h] = 0.0f;
        if (!att[h]) continue;
        const float pr = aj_ex2(aj_mul_rn(aj_dot_rows(rs.q[h], krow, AJ_HEAD_DIM), p.scale_log2) - lse2[h]);
        ds[h] = pr * (p.output_scale * aj_dot_rows(dorow[h], vrow, AJ_HEAD_DIM_V) - delta[h]);
      }
#pragma unroll
      for (int j = 0; j < CHUNK; ++j) {
        if (BLOCKS % CHUNK != 0 && j0 + j >= BLOCKS) break;
        const float k0 = aj_load(krow + (j0 + j) * 8 + quad * 2), k1 = aj_load(krow + (j0 + j) * 8 + quad * 2 + 1);
        if (att[0]) ex[j][0] += ds[0] * k0, ex[j][1] += ds[0] * k1;
        if (att[1]) ex[j][2] += ds[1] * k0, ex[j][3] += ds[1] * k1;
      }
    });
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (want[h])
#pragma unroll
        for (int j = 0; j < CHUNK; ++j)
          if (BLOCKS % CHUNK == 0 || j0 + j < BLOCKS) store(h, j0 + j, ex[j][2 * h], ex[j][2 * h + 1]);
  }
}

// A _dq thread's two query rows of its item, r0 and r0 + 8 (bwd_sm80.cuh's and bwd_sm90_dq.cuh's
// kernels): their rows i, whether they lie within the item, their positions for the mask, their
// LSE in the exp2 domain (+inf where P must be 0) and D.
struct AjBwdDqRows {
  aj_i64 i0, i1, qpos0, qpos1, k_origin;
  bool valid0, valid1;
  float lse0, lse1, delta0, delta1;
};
__device__ __forceinline__ AjBwdDqRows aj_bwd_dq_rows(const AjBwdParams& bp, const AjItem& item, aj_i64 b, int r0) {
  const AjParams& p = bp.fwd;
  AjBwdDqRows w;
  const int r1 = r0 + 8;
  w.i0 = item.rows_start + (aj_i64)r0 * item.rows_stride, w.i1 = item.rows_start + (aj_i64)r1 * item.rows_stride;
  const aj_i64 doc = aj_doc_start(p, item.rows_start);
  w.k_origin = p.k_offset - doc;
  w.qpos0 = p.q_offset - doc + w.i0, w.qpos1 = p.q_offset - doc + w.i1;
  w.valid0 = r0 < item.rows_count, w.valid1 = r1 < item.rows_count;
  w.lse0 = aj_bwd_lse2_or_inf(p, b, item.head, w.i0, w.valid0), w.lse1 = aj_bwd_lse2_or_inf(p, b, item.head, w.i1, w.valid1);
  const float* drow = bp.delta + (b * bp.heads_q + item.head) * bp.seq_q;
  w.delta0 = w.valid0 ? drow[w.i0] : 0.0f, w.delta1 = w.valid1 ? drow[w.i1] : 0.0f;
  return w;
}

// dS = P (f dP - D) of a warp's 16 query rows (w) by COLS keys of tile t from column c0, in place
// of S: P = exp2(S scale_log2 - LSE) where the pair is attended, else 0. Keys past the tile's count
// are refused too (a whole tile with every pair needs no test). The _dq kernels' element rule (this
// file's and bwd_sm90_dq.cuh's): s and dp in the accumulator layout of mma.sync, which wgmma shares.
template <int COLS>
__device__ __forceinline__ void aj_bwd_dq_ds(const AjParams& p, const AjTile& t, int head, int c0, int quad, const AjBwdDqRows& w,
                                             float (&s)[COLS / 8][4], const float (&dp)[COLS / 8][4]) {
  const float f = p.output_scale;
  const aj_i64 qpos0 = w.qpos0, qpos1 = w.qpos1, k_origin = w.k_origin;
  const float lse0 = w.lse0, lse1 = w.lse1, delta0 = w.delta0, delta1 = w.delta1;
  auto apply = [&](auto rule, bool counted) {
#pragma unroll
    for (int j = 0; j < COLS / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = c0 + j * 8 + quad * 2 + (e & 1);
        const bool ok = (!counted || col < t.count) & rule(e < 2 ? qpos0 : qpos1, k_origin + t.first, (aj_cs)col * (aj_cs)t.stride);
        // Selected, not multiplied by P = 0: a masked key's dP may be NaN (a NaN or inf in its V).
        const float pr = aj_ex2(aj_mul_rn(s[j][e], p.scale_log2) - (e < 2 ? lse0 : lse1));
        s[j][e] = ok ? pr * (f * dp[j][e] - (e < 2 ? delta0 : delta1)) : 0.0f;
      }
    }
  };
  if (t.full && t.count == AJ_TILE_K) apply(AjAllowAll(), false);
  else aj_keys_rule(p, t.branch, head, t.full, [&](auto rule) { apply(rule, true); });
}

// The end of a _dq thread's item (either kernel): its columns of dQ (the accumulator layout, summed
// over every key tile, unscaled) scaled and stored in the storage type, or added into the caller's
// fp32 accumulator (Attention::backward_add).
__device__ __forceinline__ void aj_bwd_dq_finish(const AjBwdParams& bp, const AjItem& item, aj_i64 b, int r0, int quad,
                                                 const AjBwdDqRows& w, const float (&dq)[AJ_HEAD_DIM / 8][4]) {
  const aj_i64 i0 = w.i0, i1 = w.i1;
  const bool valid0 = w.valid0, valid1 = w.valid1;
  const float lse0 = w.lse0, lse1 = w.lse1, delta0 = w.delta0, delta1 = w.delta1;
  // A NaN or inf in a K row that a row masks still reaches it through dQ += dS K (0 times NaN): such
  // rows are summed again, exactly (aj_bwd_exact_dq_rows). A row that attends something and whose
  // LSE or D is NaN has dS NaN at every pair it attends: NaN in every column either way.
  auto redo_rows = [&](const bool (&bad)[2]) {
    int redo = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float lse = h ? lse1 : lse0;
      if (bad[h] && (h ? valid1 : valid0) && !aj_isnan(lse) && !(aj_isnan(h ? delta1 : delta0) && !aj_nonfinite(lse))) redo |= 1 << h;
    }
    return redo;
  };
  const float lse2[2] = {lse0, lse1}, deltas[2] = {delta0, delta1};
  if (bp.dq_acc) {
    // Attention::backward_add: added into the caller's fp32 accumulator (this item alone holds its
    // rows), each row once: those summed again are left to the exact sum.
    float* acc[2] = {bp.dq_acc + ((b * bp.seq_q + i0) * bp.heads_q + item.head) * AJ_HEAD_DIM + quad * 2,
                     bp.dq_acc + ((b * bp.seq_q + i1) * bp.heads_q + item.head) * AJ_HEAD_DIM + quad * 2};
    bool bad[2] = {false, false};
#pragma unroll
    for (int j = 0; j < AJ_HEAD_DIM / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) bad[e / 2] |= aj_nonfinite(dq[j][e] * bp.scale);
    const int redo = redo_rows(bad);
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if ((h ? valid1 : valid0) && !(redo >> h & 1))
#pragma unroll
        for (int j = 0; j < AJ_HEAD_DIM / 8; ++j) acc[h][j * 8] += dq[j][2 * h] * bp.scale, acc[h][j * 8 + 1] += dq[j][2 * h + 1] * bp.scale;
    if (redo)
      aj_bwd_exact_dq_rows(bp, item, b, r0, quad, lse2, deltas, redo, [&](int h, int j, float x0, float x1) {
        acc[h][j * 8] += x0 * bp.scale, acc[h][j * 8 + 1] += x1 * bp.scale;
      });
    return;
  }
  aj_elem* out = (aj_elem*)bp.dq + b * bp.dq_batch_stride + item.head * bp.dq_head_stride;
  bool bad[2] = {false, false};
#pragma unroll
  for (int j = 0; j < AJ_HEAD_DIM / 8; ++j) {
    const int col = j * 8 + quad * 2;  // two adjacent columns per 4-byte store
    const aj_u32 w0 = aj_pack2(dq[j][0] * bp.scale, dq[j][1] * bp.scale), w1 = aj_pack2(dq[j][2] * bp.scale, dq[j][3] * bp.scale);
    bad[0] |= aj_tc_word_nonfinite(w0);
    bad[1] |= aj_tc_word_nonfinite(w1);
    if (valid0) *(aj_u32*)(out + i0 * bp.dq_row_stride + col) = w0;
    if (valid1) *(aj_u32*)(out + i1 * bp.dq_row_stride + col) = w1;
  }
  if (const int redo = redo_rows(bad)) {
    aj_bwd_exact_dq_rows(bp, item, b, r0, quad, lse2, deltas, redo, [&](int h, int j, float x0, float x1) {
      *(aj_u32*)(out + (h ? i1 : i0) * bp.dq_row_stride + j * 8 + quad * 2) = aj_pack2(x0 * bp.scale, x1 * bp.scale);
    });
  }
}

// Dynamic shared memory: Q [AJ_TILE_Q][AJ_DP], dO [AJ_TILE_Q][AJ_DVP], then AJ_STAGES stages of
// K [AJ_TILE_K][AJ_DP] (their padding holds the tiles in flight, fwd_sm80.cuh) and V
// [AJ_TILE_K][AJ_DVP] (compiler/codegen/codegen_backward.cpp: backward_dq_smem_bytes).
__device__ __forceinline__ void aj_bwd_dq_sm80(const AjBwdParams& bp) {
  const AjParams& p = bp.fwd;
  AJ_DYNAMIC_SHARED(aj_smem);
  aj_elem* const sq = (aj_elem*)aj_smem;
  aj_elem* const sdo = sq + AJ_TILE_Q * AJ_DP;
  AjSm80Shared sh;
  sh.q = sq;
  sh.k = sdo + AJ_TILE_Q * AJ_DVP;
  sh.v = sh.k + AJ_STAGES * AJ_TILE_K * AJ_DP;

  const AjItem item = p.items[aj_block_idx_x()];
  const aj_i64 b = aj_batch_index();
  if (b >= p.batch) return;
  const int warp = aj_thread_idx() / 32, lane = aj_thread_idx() % 32;
  const int g = lane / 4, quad = lane % 4;
  const int kvh = item.head / p.heads_per_kv;

  // Q and dO of the tile (one cp.async group), then the first AJ_STAGES - 1 key tiles.
  aj_load_rows<AJ_TILE_Q, AJ_HEAD_DIM, AJ_DP>(sq, (const aj_elem*)p.q + b * p.q_batch_stride + item.head * p.q_head_stride,
                                              p.q_row_stride, item.rows_start, item.rows_stride, item.rows_count);
  aj_load_rows<AJ_TILE_Q, AJ_HEAD_DIM_V, AJ_DVP>(
      sdo, (const aj_elem*)bp.dout + b * bp.do_batch_stride + item.head * bp.do_head_stride, bp.do_row_stride,
      item.rows_start, item.rows_stride, item.rows_count);
  aj_cp_async_commit();
  AjTileCursor pre;
  pre.begin(p, item);
  int issued = 0;  // tiles loaded so far
#pragma unroll
  for (int s = 0; s < AJ_STAGES - 1; ++s) {
    if (!pre.done()) {
      aj_sm80_issue(p, sh, s, pre.tile(), aj_sm80_k_base(p, b, kvh), aj_sm80_v_base(p, b, kvh));
      pre.next();
      ++issued;
    }
    aj_cp_async_commit();
  }

  // This thread's two rows of the accumulator tiles: their positions, LSE and D.
  const int r0 = warp * 16 + g;
  const AjBwdDqRows w = aj_bwd_dq_rows(bp, item, b, r0);

  float dq[AJ_HEAD_DIM / 8][4];
  aj_zero<AJ_HEAD_DIM>(dq);
  for (int iter = 0; iter < issued; ++iter) {
    const int stage = iter % AJ_STAGES;
    if (!pre.done()) {
      aj_sm80_issue(p, sh, (iter + AJ_STAGES - 1) % AJ_STAGES, pre.tile(), aj_sm80_k_base(p, b, kvh),
                    aj_sm80_v_base(p, b, kvh));
      pre.next();
      ++issued;
    }
    aj_cp_async_commit();
    aj_cp_async_wait<AJ_STAGES - 1>();
    aj_syncthreads();
    const AjTile t = aj_sm80_issued(sh, stage);
    const aj_elem* ks = sh.k + stage * AJ_TILE_K * AJ_DP;
    const aj_elem* vs = sh.v + stage * AJ_TILE_K * AJ_DVP;

    for (int c0 = 0; c0 < t.count; c0 += AJ_BWD_SUB_K) {  // the tile's keys, AJ_BWD_SUB_K at a time
      float s[AJ_BWD_SUB_K / 8][4], dp[AJ_BWD_SUB_K / 8][4];
      aj_zero<AJ_BWD_SUB_K>(s);
      aj_zero<AJ_BWD_SUB_K>(dp);
      aj_mma_abt<AJ_HEAD_DIM, AJ_BWD_SUB_K, AJ_DP, AJ_DP>(s, sq + warp * 16 * AJ_DP, ks + c0 * AJ_DP, lane);  // S = Q K^T
      aj_mma_abt<AJ_HEAD_DIM_V, AJ_BWD_SUB_K, AJ_DVP, AJ_DVP>(dp, sdo + warp * 16 * AJ_DVP, vs + c0 * AJ_DVP, lane);  // dP = dO V^T
      aj_bwd_dq_ds<AJ_BWD_SUB_K>(p, t, item.head, c0, quad, w, s, dp);
      aj_mma_xb<AJ_BWD_SUB_K, AJ_HEAD_DIM, AJ_DP>(dq, s, ks + c0 * AJ_DP, lane);  // dQ += dS K
    }
    aj_syncthreads();  // this stage is overwritten by a later prefetch
  }
  aj_cp_async_wait<0>();

  aj_bwd_dq_finish(bp, item, b, r0, quad, w, dq);
}

// ---- _dkdv: over the key-major plan ---------------------------------------------------------

// acc[16][COLS] += A[16][K] B[K][COLS] where A^T is row-major in shared memory (A's columns are
// rows of `at`, pitch APITCH, A's 16 rows start at `at`) and B row-major (pitch BPITCH): the
// single pass's dQ = dS K, with dS^T as the _dkdv warps wrote it. ldmatrix.trans turns the
// stored A^T into A's fragments.
template <int K, int COLS, int APITCH, int BPITCH>
__device__ __forceinline__ void aj_mma_atb(float (&acc)[COLS / 8][4], const aj_elem* at, const aj_elem* b, int lane) {
  const int a_row = (lane >> 4) * 8 + (lane & 7), a_col = ((lane >> 3) & 1) * 8;
  const int b_row = (lane & 7) + ((lane >> 3) & 1) * 8, b_col = (lane >> 4) * 8;
#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks) {
    aj_u32 af[4];
    aj_ldmatrix_x4_trans(af, at + (ks * 16 + a_row) * APITCH + a_col);
#pragma unroll
    for (int n = 0; n < COLS / 16; ++n) {
      aj_u32 bf[4];
      aj_ldmatrix_x4_trans(bf, b + (ks * 16 + b_row) * BPITCH + n * 16 + b_col);
      aj_mma(acc[2 * n], af, bf[0], bf[1]);
      aj_mma(acc[2 * n + 1], af, bf[2], bf[3]);
    }
  }
}

// The single pass's dQ rows c0 .. c0 + AJ_BWD_SUB_Q of query entry `qe`, columns k0 .. k0 + kcols
// (the slice's): every warp has written its 16 key rows of dS^T (unscaled, masked pairs 0) into
// `sdst` ([AJ_TILE_K][AJ_BWD_DSP]); the warps share the 16 x 16 blocks of dQ = dS K (K the tile in
// shared memory, rows past the tile's count zero), each added, scaled, into the fp32 accumulator.
// The barrier before makes dS^T complete when read; the caller's after it, that it is read before
// the next rows overwrite it.
#define AJ_BWD_DSP (AJ_BWD_SUB_Q + 8)

// Whether acc may hold a NaN or inf: their sum is then not finite (a sum of finite values that
// overflows says yes too, and only costs the exact sum).
template <int N>
__device__ __forceinline__ bool aj_bwd_any_nonfinite(const float (&acc)[N][4]) {
  float sum = 0.0f;
#pragma unroll
  for (int n = 0; n < N; ++n) sum += (acc[n][0] + acc[n][1]) + (acc[n][2] + acc[n][3]);
  return aj_nonfinite(sum);
}

// Whether the key tile in shared memory ([AJ_TILE_K][AJ_DP], rows past the count zero) holds a NaN
// or an inf, for the calling warp (each warp reads the whole tile once per key item): only then
// can the single pass's dQ = dS K carry one to a row that masks its key, and only then does the
// loop test its dQ blocks.
__device__ __forceinline__ bool aj_bwd_tile_nonfinite(const aj_elem* sk, int lane) {
  constexpr int WORDS = AJ_HEAD_DIM / 2;  // two elements a word
  bool bad = false;
  for (int x = lane; x < AJ_TILE_K * WORDS; x += 32) bad |= aj_tc_word_nonfinite(*(const aj_u32*)(sk + (x / WORDS) * AJ_DP + (x % WORDS) * 2));
  return aj_warp_any(bad);
}

// One 16 x 16 block of the single pass's dQ = dS K (query rows q0 .. q0 + 15 of the entry, dS^T's
// columns s0 .., K's columns k0 ..) summed again over the attended pairs only: a NaN or inf in a
// key row that some of these rows mask reaches them through the product as their dS = 0 times
// NaN. Rare: only a non-finite block of a partial entry gets here.
__device__ __forceinline__ void aj_bwd_dq_single_exact(const AjParams& p, const aj_elem* sdst, const aj_elem* sk,
                                                       const AjKeyItem& ki, const AjQueryEntry& qe, int q0, int s0, int k0,
                                                       int lane, float (&acc)[2][4]) {
  const int g = lane / 4, quad = lane % 4;
  const aj_i64 doc = aj_doc_start(p, ki.keys_start), q_origin = p.q_offset - doc + qe.rows_start;
  aj_rare_path(AJ_RARE_DQ_BLOCK);
  aj_zero<16>(acc);
  for (int kr = 0; kr < ki.keys_count; ++kr) {
    const aj_i64 kpos = p.k_offset - doc + ki.keys_start + (aj_i64)kr * ki.keys_stride;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = g + half * 8;
      if (q0 + r >= qe.rows_count || !aj_queries_allowed(p, qe.branch, qe.head, kpos, q_origin, (aj_cs)(q0 + r) * (aj_cs)qe.rows_stride))
        continue;
      const float ds = aj_load(sdst + kr * AJ_BWD_DSP + s0 + r);
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) acc[n][2 * half + e] += ds * aj_load(sk + kr * AJ_DP + k0 + n * 8 + quad * 2 + e);
    }
  }
}
__device__ __forceinline__ void aj_bwd_dq_single(const AjBwdParams& bp, const aj_elem* sdst, const aj_elem* sk,
                                                 const AjKeyItem& ki, const AjQueryEntry& qe, bool masked_kbad, int c0,
                                                 int k0, int kcols, aj_i64 b, int warp, int lane) {
  const int col_blocks = kcols / 16, units = AJ_BWD_SUB_Q / 16 * col_blocks;
  const int g = lane / 4, quad = lane % 4;
  aj_syncthreads();
  for (int u = warp; u < units; u += AJ_TILE_K / 16) {
    const int ur = u / col_blocks, uc = k0 / 16 + u % col_blocks;
    float acc[2][4];
    aj_zero<16>(acc);
    aj_mma_atb<AJ_TILE_K, 16, AJ_BWD_DSP, AJ_DP>(acc, sdst + ur * 16, sk + uc * 16, lane);
    if (masked_kbad && aj_bwd_any_nonfinite(acc)) aj_bwd_dq_single_exact(bp.fwd, sdst, sk, ki, qe, c0 + ur * 16, ur * 16, uc * 16, lane, acc);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = c0 + ur * 16 + g + half * 8;
      if (r >= qe.rows_count) continue;
      const aj_i64 i = qe.rows_start + (aj_i64)r * qe.rows_stride;
      float* dst = bp.dq_acc + ((b * bp.seq_q + i) * bp.heads_q + qe.head) * AJ_HEAD_DIM + uc * 16 + quad * 2;
#pragma unroll
      for (int n = 0; n < 2; ++n) aj_red_add_f32x2(dst + n * 8, acc[n][2 * half] * bp.scale, acc[n][2 * half + 1] * bp.scale);
    }
  }
}

// One stage of the query stream: a query tile's Q and dO rows, with each row's LSE and D.
struct AjBwdQueryStage {
  aj_elem* q;     // [AJ_TILE_Q][AJ_DP]
  aj_elem* dout;  // [AJ_TILE_Q][AJ_DVP]
  float* lse2;    // [AJ_TILE_Q]: exp2-domain LSE, +inf where P is 0
  float* delta;   // [AJ_TILE_Q]
};

// Dynamic shared memory: K [AJ_TILE_K][AJ_DP], V [AJ_TILE_K][AJ_DVP], then two AjBwdQueryStages,
// then the single pass's dS^T [AJ_TILE_K][AJ_BWD_DSP] (aj_bwd_dst).
__device__ __forceinline__ AjBwdQueryStage aj_bwd_query_stage(unsigned char* smem, int stage) {
  constexpr int elems = AJ_TILE_Q * (AJ_DP + AJ_DVP), floats = 2 * AJ_TILE_Q;
  aj_elem* base = (aj_elem*)smem + AJ_TILE_K * (AJ_DP + AJ_DVP);
  AjBwdQueryStage s;
  s.q = base + stage * elems;
  s.dout = s.q + AJ_TILE_Q * AJ_DP;
  s.lse2 = (float*)(base + 2 * elems) + stage * floats;
  s.delta = s.lse2 + AJ_TILE_Q;
  return s;
}

// Stages query entry `qe`: Q and dO through cp.async (the caller commits), LSE and D by plain
// loads (visible after the next barrier).
__device__ __forceinline__ void aj_bwd_stage_queries(const AjBwdParams& bp, const AjBwdQueryStage& st, const AjQueryEntry& qe,
                                                     aj_i64 b) {
  const AjParams& p = bp.fwd;
  aj_load_rows<AJ_TILE_Q, AJ_HEAD_DIM, AJ_DP, AJ_BWD_KV_THREADS>(
      st.q, (const aj_elem*)p.q + b * p.q_batch_stride + qe.head * p.q_head_stride, p.q_row_stride, qe.rows_start,
      qe.rows_stride, qe.rows_count);
  aj_load_rows<AJ_TILE_Q, AJ_HEAD_DIM_V, AJ_DVP, AJ_BWD_KV_THREADS>(
      st.dout, (const aj_elem*)bp.dout + b * bp.do_batch_stride + qe.head * bp.do_head_stride, bp.do_row_stride,
      qe.rows_start, qe.rows_stride, qe.rows_count);
  const float* drow = bp.delta + (b * bp.heads_q + qe.head) * bp.seq_q;
  for (int r = aj_thread_idx(); r < AJ_TILE_Q; r += AJ_BWD_KV_THREADS) {
    const bool valid = r < qe.rows_count;
    const aj_i64 i = qe.rows_start + (aj_i64)(valid ? r : 0) * qe.rows_stride;
    st.lse2[r] = aj_bwd_lse2_or_inf(p, b, qe.head, i, valid);
    st.delta[r] = valid ? drow[i] : 0.0f;
  }
}

// This thread's columns of dK and dV for key row kr of the key item summed again in float32 from
// global memory over the queries that attend it only: dV = sum f P^T dO, dK = sum dS^T Q. The rare
// path of a non-finite Q or dO row of a query that masks the key (the tensor cores multiply it by
// that query's P = dS = 0). add(is_dk, c, x0, x1) receives dK's (or dV's) columns c * 8 + quad * 2
// and + 1, dK unscaled, for the 8-column blocks [k0, k0 + nk) of dK and [v0, v0 + nv) of dV (a
// column slice's). The blocks go AJ_TC_EXACT_COLS at a time, each a walk over the item's query
// entries.
template <typename Add>
__device__ __forceinline__ void aj_bwd_exact_key_row(const AjBwdParams& bp, const AjKeyItem& ki, aj_i64 b, int kr, int quad,
                                                     int k0, int nk, int v0, int nv, const Add& add) {
  const AjParams& p = bp.fwd;
  const int BK = nk, BLOCKS = nk + nv;
  constexpr int CHUNK = AJ_TC_EXACT_COLS;
  aj_rare_path(AJ_RARE_KEY_ROW);
  const aj_i64 j = ki.keys_start + (aj_i64)kr * ki.keys_stride;
  const aj_i64 doc = aj_doc_start(p, ki.keys_start), q_origin = p.q_offset - doc, kpos = p.k_offset - doc + j;
  const aj_elem* krow = (const aj_elem*)p.k + b * p.k_batch_stride + j * p.k_row_stride + ki.kv_head * p.k_head_stride;
  const aj_elem* vrow = (const aj_elem*)p.v + b * p.v_batch_stride + j * p.v_row_stride + ki.kv_head * p.v_head_stride;
#pragma unroll 1
  for (int j0 = 0; j0 < BLOCKS; j0 += CHUNK) {
    float ex[CHUNK][2];
#pragma unroll
    for (int x = 0; x < CHUNK; ++x) ex[x][0] = ex[x][1] = 0.0f;
    for (int e = ki.entry_begin; e < ki.entry_end; ++e) {
      const AjQueryEntry qe = bp.query_entries[e];
      bool full;
      if (!aj_bwd_entry_visit(p, ki, qe, full)) continue;
      for (int r = 0; r < qe.rows_count; ++r) {
        if (!full && !aj_queries_allowed(p, qe.branch, qe.head, kpos, q_origin + qe.rows_start, (aj_cs)r * (aj_cs)qe.rows_stride))
          continue;
        const aj_i64 i = qe.rows_start + (aj_i64)r * qe.rows_stride;
        const aj_elem* qrow = (const aj_elem*)p.q + b * p.q_batch_stride + i * p.q_row_stride + qe.head * p.q_head_stride;
        const aj_elem* dorow = (const aj_elem*)bp.dout + b * bp.do_batch_stride + i * bp.do_row_stride + qe.head * bp.do_head_stride;
        const float pr = aj_ex2(aj_mul_rn(aj_dot_rows(krow, qrow, AJ_HEAD_DIM), p.scale_log2) - aj_bwd_lse2_or_inf(p, b, qe.head, i, true));
        const float ds = pr * (p.output_scale * aj_dot_rows(vrow, dorow, AJ_HEAD_DIM_V) - bp.delta[(b * bp.heads_q + qe.head) * bp.seq_q + i]);
#pragma unroll
        for (int x = 0; x < CHUNK; ++x) {
          const int blk = j0 + x;
          if (blk >= BLOCKS) break;
          const aj_elem* src = blk < BK ? qrow + (k0 + blk) * 8 : dorow + (v0 + blk - BK) * 8;
          const float w = blk < BK ? ds : p.output_scale * pr;
          ex[x][0] += w * aj_load(src + quad * 2);
          ex[x][1] += w * aj_load(src + quad * 2 + 1);
        }
      }
    }
#pragma unroll
    for (int x = 0; x < CHUNK; ++x) {
      const int blk = j0 + x;
      if (blk < BLOCKS) add(blk < BK, blk < BK ? k0 + blk : v0 + blk - BK, ex[x][0], ex[x][1]);
    }
  }
}

// P^T of query columns c0 .. c0 + SUB of an entry, in place of S^T (s) in this thread's accumulator
// tiles (key rows kr0 and kr1 = kr0 + 8 at positions kpos0, kpos1; columns c0 + j * 8 + quad * 2
// and + 1): P^T = exp2(S^T scale_log2 - LSE) where the pair is attended, and -0.0 where it is not,
// which marks the pair masked for aj_bwd_dst (an attended pair's P^T is never -0.0: ex2 gives +0
// at the least, and a NaN is no zero). The rule is asked per element (aj_queries_allowed): a loop
// copy per branch, as the forward has, holds too many registers next to dK and dV. lse2: the
// entry's rows' LSE (exp2 domain). The Hopper kernels call it while dP^T is still in flight.
template <int SUB>
__device__ __forceinline__ void aj_bwd_pt(const AjParams& p, const AjKeyItem& ki, const AjQueryEntry& qe, bool full, int c0, int quad,
                                          int kr0, int kr1, aj_i64 kpos0, aj_i64 kpos1, const float* lse2,
                                          float (&s)[SUB / 8][4]) {
  const aj_i64 q_first = p.q_offset - aj_doc_start(p, ki.keys_start) + qe.rows_start;
#pragma unroll
  for (int j = 0; j < SUB / 8; ++j) {
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int col = c0 + j * 8 + quad * 2 + (x & 1);
      bool ok = true;
      if (!full) {
        const int kr = x < 2 ? kr0 : kr1;
        ok = col < qe.rows_count && kr < ki.keys_count &&
             aj_queries_allowed(p, qe.branch, qe.head, x < 2 ? kpos0 : kpos1, q_first, (aj_cs)col * (aj_cs)qe.rows_stride);
      }
      s[j][x] = ok ? aj_ex2(aj_mul_rn(s[j][x], p.scale_log2) - lse2[col]) : -0.0f;
    }
  }
}

// dS^T and f P^T of the same columns from aj_bwd_pt's P^T (s) and dP^T (dp): dp becomes f P^T (for
// dV), s becomes dS^T = P^T (f dP^T - D), and 0 at a masked pair, selected (its dP^T may be NaN: a
// NaN or inf in V). delta: the entry's rows' D.
template <int SUB>
__device__ __forceinline__ void aj_bwd_dst(const AjParams& p, int c0, int quad, const float* delta, float (&s)[SUB / 8][4],
                                           float (&dp)[SUB / 8][4]) {
  const float f = p.output_scale;
#pragma unroll
  for (int j = 0; j < SUB / 8; ++j) {
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int col = c0 + j * 8 + quad * 2 + (x & 1);
      const float pr = s[j][x];
      const bool masked = aj_float_as_uint(pr) == 0x80000000u;
      s[j][x] = masked ? 0.0f : pr * (f * dp[j][x] - delta[col]);
      dp[j][x] = f * pr;
    }
  }
}

// Both in one step (the sm_80 kernel's: its products are synchronous).
template <int SUB>
__device__ __forceinline__ void aj_bwd_pt_dst(const AjParams& p, const AjKeyItem& ki, const AjQueryEntry& qe, bool full, int c0,
                                              int quad, int kr0, int kr1, aj_i64 kpos0, aj_i64 kpos1, const float* lse2,
                                              const float* delta, float (&s)[SUB / 8][4], float (&dp)[SUB / 8][4]) {
  aj_bwd_pt<SUB>(p, ki, qe, full, c0, quad, kr0, kr1, kpos0, kpos1, lse2, s);
  aj_bwd_dst<SUB>(p, c0, quad, delta, s, dp);
}

// The end of a key tile: this thread's key rows kr0, kr1 (as the 16-row accumulator layout holds
// them) of dK (scaled) and dV stored into dK, dV in the storage type when this block is the only
// writer of its rows (plain_add 2), else added to the fp32 workspaces, plainly when no other block
// of this launch has these key rows, atomically when one may; a row a masked non-finite Q or dO
// reached is summed again exactly instead. Shared by the sm_80 and sm_90a kernels (their
// accumulators have one layout). dk and dv hold the columns from k0 and v0 (a column slice's:
// kcols and vcols of them, at most NK * 8 and NV * 8).
template <int NK, int NV>
__device__ __forceinline__ void aj_bwd_dkdv_store(const AjBwdParams& bp, const AjKeyItem& ki, aj_i64 b, int kr0, int kr1,
                                                  int quad, int k0, int kcols, int v0, int vcols, const float (&dk)[NK][4],
                                                  const float (&dv)[NV][4]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int kr = half ? kr1 : kr0;
    if (kr >= ki.keys_count) continue;
    // Pointers at this thread's columns of the row in 8-column block 0 (the slice's start at k0, v0).
    const aj_i64 j = ki.keys_start + (aj_i64)kr * ki.keys_stride;
    float* dka = bp.dk_acc + ((b * bp.seq_k + j) * bp.heads_kv + ki.kv_head) * AJ_HEAD_DIM + quad * 2;
    float* dva = bp.dv_acc + ((b * bp.seq_k + j) * bp.heads_kv + ki.kv_head) * AJ_HEAD_DIM_V + quad * 2;
    aj_elem* dks = (aj_elem*)bp.dk + b * bp.dk_batch_stride + j * bp.dk_row_stride + ki.kv_head * bp.dk_head_stride + quad * 2;
    aj_elem* dvs = (aj_elem*)bp.dv + b * bp.dv_batch_stride + j * bp.dv_row_stride + ki.kv_head * bp.dv_head_stride + quad * 2;
    const bool direct = bp.plain_add == 2;
    // A NaN or inf in the Q or dO row of a query that masks this key reaches it through dK += dS^T Q
    // and dV += P^T dO (its dS = P = 0 times NaN): such a key row is summed again, exactly.
    bool bad = false;
#pragma unroll
    for (int c = 0; c < NK; ++c)
      if (c * 8 < kcols) bad |= aj_nonfinite(dk[c][2 * half]) | aj_nonfinite(dk[c][2 * half + 1]);
#pragma unroll
    for (int c = 0; c < NV; ++c)
      if (c * 8 < vcols) bad |= aj_nonfinite(dv[c][2 * half]) | aj_nonfinite(dv[c][2 * half + 1]);
    if (bad) {
      aj_bwd_exact_key_row(bp, ki, b, kr, quad, k0 / 8, kcols / 8, v0 / 8, vcols / 8, [&](bool is_dk, int c, float x0, float x1) {
        float* dst = (is_dk ? dka : dva) + c * 8;
        if (is_dk) x0 *= bp.scale, x1 *= bp.scale;
        if (direct) *(aj_u32*)((is_dk ? dks : dvs) + c * 8) = aj_pack2(x0, x1);
        else if (bp.plain_add) dst[0] += x0, dst[1] += x1;
        else aj_red_add_f32x2(dst, x0, x1);
      });
      continue;
    }
#pragma unroll
    for (int c = 0; c < NK; ++c) {
      if (c * 8 >= kcols) break;
      const int at = k0 + c * 8;
      const float x0 = dk[c][2 * half] * bp.scale, x1 = dk[c][2 * half + 1] * bp.scale;
      if (direct) *(aj_u32*)(dks + at) = aj_pack2(x0, x1);
      else if (bp.plain_add) dka[at] += x0, dka[at + 1] += x1;
      else aj_red_add_f32x2(dka + at, x0, x1);
    }
#pragma unroll
    for (int c = 0; c < NV; ++c) {
      if (c * 8 >= vcols) break;
      const int at = v0 + c * 8;
      const float x0 = dv[c][2 * half], x1 = dv[c][2 * half + 1];
      if (direct) *(aj_u32*)(dvs + at) = aj_pack2(x0, x1);
      else if (bp.plain_add) dva[at] += x0, dva[at + 1] += x1;
      else aj_red_add_f32x2(dva + at, x0, x1);
    }
  }
}
// Every column at once (the sm_90a kernels', and the sm_80 kernel's up to head dim 128).
__device__ __forceinline__ void aj_bwd_dkdv_store(const AjBwdParams& bp, const AjKeyItem& ki, aj_i64 b, int kr0, int kr1,
                                                  int quad, const float (&dk)[AJ_HEAD_DIM / 8][4],
                                                  const float (&dv)[AJ_HEAD_DIM_V / 8][4]) {
  aj_bwd_dkdv_store(bp, ki, b, kr0, kr1, quad, 0, AJ_HEAD_DIM, 0, AJ_HEAD_DIM_V, dk, dv);
}

// How many of a head dim's `dim` columns the slice from column c0 holds, at most `width` (0 for a
// slice past them: the slice widths are cut from the larger head dim).
__device__ __forceinline__ int aj_bwd_slice_cols(int c0, int dim, int width) {
  return c0 >= dim ? 0 : dim - c0 < width ? dim - c0 : width;
}

__device__ __forceinline__ void aj_bwd_dkdv_sm80(const AjBwdParams& bp) {
  const AjParams& p = bp.fwd;
  AJ_DYNAMIC_SHARED(aj_smem);
  aj_elem* const sk = (aj_elem*)aj_smem;
  aj_elem* const sv = sk + AJ_TILE_K * AJ_DP;
  aj_elem* const sdst = (aj_elem*)(aj_smem + 2 * (AJ_TILE_K + 2 * AJ_TILE_Q) * (AJ_DP + AJ_DVP) + 2 * 2 * AJ_TILE_Q * 4);
  const bool single = bp.dq_acc != nullptr;
  const AjKeyItem ki = bp.key_items[bp.key_item_base + aj_block_idx_x()];
  const aj_i64 b = aj_batch_index();
  if (b >= p.batch || aj_bwd_adds_nothing(bp, ki)) return;
  const int warp = aj_thread_idx() / 32, lane = aj_thread_idx() % 32;
  const int g = lane / 4, quad = lane % 4;

  // K and V of the key tile with the first query tile (one cp.async group).
  aj_load_rows<AJ_TILE_K, AJ_HEAD_DIM, AJ_DP, AJ_BWD_KV_THREADS>(
      sk, (const aj_elem*)p.k + b * p.k_batch_stride + ki.kv_head * p.k_head_stride, p.k_row_stride, ki.keys_start,
      ki.keys_stride, ki.keys_count);
  aj_load_rows<AJ_TILE_K, AJ_HEAD_DIM_V, AJ_DVP, AJ_BWD_KV_THREADS>(
      sv, (const aj_elem*)p.v + b * p.v_batch_stride + ki.kv_head * p.v_head_stride, p.v_row_stride, ki.keys_start,
      ki.keys_stride, ki.keys_count);
  if (ki.entry_begin < ki.entry_end) aj_bwd_stage_queries(bp, aj_bwd_query_stage(aj_smem, 0), bp.query_entries[ki.entry_begin], b);
  aj_cp_async_commit();

  // This thread's two key rows (of the accumulator tiles) as global positions.
  const int kr0 = warp * 16 + g, kr1 = kr0 + 8;
  const aj_i64 doc = aj_doc_start(p, ki.keys_start);
  const aj_i64 kpos0 = p.k_offset - doc + ki.keys_start + (aj_i64)kr0 * ki.keys_stride;
  const aj_i64 kpos1 = p.k_offset - doc + ki.keys_start + (aj_i64)kr1 * ki.keys_stride;

  bool kbad = false;  // the single pass: the key tile holds a NaN or an inf (aj_bwd_tile_nonfinite)
#pragma unroll 1
  for (int slice = 0; slice < AJ_BWD_SLICES; ++slice) {  // the columns of dK, dV (and dQ), a slice at a time
    const int k0 = slice * AJ_BWD_DK_COLS, v0 = slice * AJ_BWD_DV_COLS;
    const int kcols = aj_bwd_slice_cols(k0, AJ_HEAD_DIM, AJ_BWD_DK_COLS);
    const int vcols = aj_bwd_slice_cols(v0, AJ_HEAD_DIM_V, AJ_BWD_DV_COLS);
    // The first query tile again (K and V stay): every reader of both stages passed the last
    // barrier of the slice before.
    if (slice > 0 && ki.entry_begin < ki.entry_end) {
      aj_bwd_stage_queries(bp, aj_bwd_query_stage(aj_smem, 0), bp.query_entries[ki.entry_begin], b);
      aj_cp_async_commit();
    }
    float dk[AJ_BWD_DK_COLS / 8][4], dv[AJ_BWD_DV_COLS / 8][4];
    aj_zero<AJ_BWD_DK_COLS>(dk);
    aj_zero<AJ_BWD_DV_COLS>(dv);
    for (int e = ki.entry_begin, it = 0; e < ki.entry_end; ++e, ++it) {
      const AjBwdQueryStage st = aj_bwd_query_stage(aj_smem, it & 1);
      // Prefetch the next query tile into the other stage: its readers passed the last barrier.
      if (e + 1 < ki.entry_end) aj_bwd_stage_queries(bp, aj_bwd_query_stage(aj_smem, (it + 1) & 1), bp.query_entries[e + 1], b);
      aj_cp_async_commit();
      aj_cp_async_wait<1>();
      aj_syncthreads();
      if (single && slice == 0 && it == 0) kbad = aj_bwd_tile_nonfinite(sk, lane);  // K landed with the first query tile
      const AjQueryEntry qe = bp.query_entries[e];
      bool full;
      const bool visit = aj_bwd_entry_visit(p, ki, qe, full);

      for (int c0 = 0; visit && c0 < qe.rows_count; c0 += AJ_BWD_SUB_Q) {  // the query rows, AJ_BWD_SUB_Q at a time
        float s[AJ_BWD_SUB_Q / 8][4], dp[AJ_BWD_SUB_Q / 8][4];
        aj_zero<AJ_BWD_SUB_Q>(s);
        aj_zero<AJ_BWD_SUB_Q>(dp);
        aj_mma_abt<AJ_HEAD_DIM, AJ_BWD_SUB_Q, AJ_DP, AJ_DP>(s, sk + warp * 16 * AJ_DP, st.q + c0 * AJ_DP, lane);  // S^T = K Q^T
        aj_mma_abt<AJ_HEAD_DIM_V, AJ_BWD_SUB_Q, AJ_DVP, AJ_DVP>(dp, sv + warp * 16 * AJ_DVP, st.dout + c0 * AJ_DVP, lane);  // dP^T = V dO^T
        aj_bwd_pt_dst<AJ_BWD_SUB_Q>(p, ki, qe, full, c0, quad, kr0, kr1, kpos0, kpos1, st.lse2, st.delta, s, dp);
        aj_mma_xb<AJ_BWD_SUB_Q, AJ_BWD_DV_COLS, AJ_DVP>(dv, dp, st.dout + c0 * AJ_DVP + v0, lane, vcols);  // dV += f P^T dO
        aj_mma_xb<AJ_BWD_SUB_Q, AJ_BWD_DK_COLS, AJ_DP>(dk, s, st.q + c0 * AJ_DP + k0, lane, kcols);         // dK += dS^T Q
        if (single) {
          // dS^T to shared memory (rounded as dK's product rounds it), then dQ += dS K. Key rows past
          // the tile's count are zeroed: a full entry skips the checks above, and their dS^T (from a
          // zero K row: P = exp2(-LSE), inf for rows far below zero) would reach dQ as inf * 0.
          const bool in0 = kr0 < ki.keys_count, in1 = kr1 < ki.keys_count;
#pragma unroll
          for (int j = 0; j < AJ_BWD_SUB_Q / 8; ++j) {
            *(aj_u32*)(sdst + kr0 * AJ_BWD_DSP + j * 8 + quad * 2) = in0 ? aj_pack2(s[j][0], s[j][1]) : 0u;
            *(aj_u32*)(sdst + kr1 * AJ_BWD_DSP + j * 8 + quad * 2) = in1 ? aj_pack2(s[j][2], s[j][3]) : 0u;
          }
          aj_bwd_dq_single(bp, sdst, sk, ki, qe, kbad && !full, c0, k0, kcols, b, warp, lane);
          // dS^T is read before the next rows overwrite it (after an entry's last rows, the barrier
          // at the end of the entry does that).
          if (c0 + AJ_BWD_SUB_Q < qe.rows_count) aj_syncthreads();
        }
      }
      aj_syncthreads();  // this stage is overwritten by the prefetch two tiles on
    }
    aj_cp_async_wait<0>();

    aj_bwd_dkdv_store(bp, ki, b, kr0, kr1, quad, k0, kcols, v0, vcols, dk, dv);
  }
}
