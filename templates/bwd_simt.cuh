// The SIMT backward kernels (fp32 arithmetic for every storage type), FlashAttention-2's
// structure on CUDA cores, between bwd_common.cuh's _pre and _cvt:
//   _dq    over the forward plan: each query tile recomputes P = exp(S - LSE) tile by tile and
//          accumulates dQ = scale * dS K in registers (a query tile owns its rows: no atomics);
//   _dkdv  over the key-major plan: each key tile keeps dK, dV in registers while it walks the
//          query tiles that attend it, then adds them to fp32 workspaces: atomically when key
//          tiles of the launch may share rows, plainly when the launch is one layer of disjoint
//          key tiles (the deterministic mode runs the layers one launch each).
// Four threads per row, each owning every fourth head dimension, as in fwd_simt.cuh.

// ---- _dq: over the forward plan -------------------------------------------------------------

__device__ __forceinline__ void aj_bwd_dq(const AjBwdParams& bp) {
  const AjParams& p = bp.fwd;
  AJ_STATIC_SHARED(AjSimtShared, sh);
  const AjItem item = p.items[aj_block_idx_x()];
  const aj_i64 b = aj_batch_index();
  if (b >= p.batch) return;
  const int row = aj_thread_idx() / AJ_SIMT_LANES, lane = aj_thread_idx() % AJ_SIMT_LANES;
  const aj_i64 i = item.rows_start + (aj_i64)(row < item.rows_count ? row : 0) * item.rows_stride;
  const float lse2 = row < item.rows_count ? aj_bwd_lse2(p, b, item.head, i) : AJ_NEG_INF;
  const bool live = lse2 != AJ_NEG_INF;  // a row that attends nothing has no gradient
  const aj_i64 doc = aj_doc_start(p, item.rows_start), k_origin = p.k_offset - doc;
  const aj_i64 qpos = p.q_offset - doc + i;
  const int kvh = item.head / p.heads_per_kv;
  const float f = p.output_scale, delta = live ? bp.delta[(b * bp.heads_q + item.head) * bp.seq_q + i] : 0.0f;

  float q[AJ_QD], dq[AJ_QD], dout[AJ_VD];
  const aj_elem* qrow = (const aj_elem*)p.q + b * p.q_batch_stride + i * p.q_row_stride + item.head * p.q_head_stride;
  const aj_elem* drow = (const aj_elem*)bp.dout + b * bp.do_batch_stride + i * bp.do_row_stride + item.head * bp.do_head_stride;
#pragma unroll
  for (int x = 0; x < AJ_QD; ++x) q[x] = live ? aj_load(qrow + lane + AJ_SIMT_LANES * x) : 0.0f, dq[x] = 0.0f;
#pragma unroll
  for (int x = 0; x < AJ_VD; ++x) dout[x] = live ? aj_load(drow + lane + AJ_SIMT_LANES * x) : 0.0f;

  AjTileCursor cursor;
  cursor.begin(p, item);
  for (; !cursor.done(); cursor.next()) {
    const AjTile t = cursor.tile();
    aj_syncthreads();  // the previous tile is no longer read
    aj_simt_load_tile(p, sh, t, b, kvh);
    aj_syncthreads();
    for (int c = 0; c < AJ_TILE_K; ++c) {
      float dot = 0.0f, dp = 0.0f;
#pragma unroll
      for (int x = 0; x < AJ_QD; ++x) dot += q[x] * sh.k[c][lane + AJ_SIMT_LANES * x];
#pragma unroll
      for (int x = 0; x < AJ_VD; ++x) dp += dout[x] * sh.v[c][lane + AJ_SIMT_LANES * x];
      dot += aj_shfl_xor(dot, 1);
      dot += aj_shfl_xor(dot, 2);
      dp += aj_shfl_xor(dp, 1);
      dp += aj_shfl_xor(dp, 2);
      bool ok = live && c < t.count;
      if (ok && !t.full) ok = aj_keys_allowed(p, t.branch, item.head, qpos, k_origin + t.first, (aj_cs)c * (aj_cs)t.stride);
      if (!ok) continue;
      const float pr = aj_ex2(aj_mul_rn(dot, p.scale_log2) - lse2);
      const float ds = pr * (f * dp - delta);
#pragma unroll
      for (int x = 0; x < AJ_QD; ++x) dq[x] += ds * sh.k[c][lane + AJ_SIMT_LANES * x];
    }
  }
  if (row >= item.rows_count) return;
  if (bp.dq_acc) {  // added into the caller's fp32 accumulator (this item alone holds the row)
    float* acc = bp.dq_acc + ((b * bp.seq_q + i) * bp.heads_q + item.head) * AJ_HEAD_DIM;
#pragma unroll
    for (int x = 0; x < AJ_QD; ++x) acc[lane + AJ_SIMT_LANES * x] += dq[x] * bp.scale;
    return;
  }
  aj_elem* out = (aj_elem*)bp.dq + b * bp.dq_batch_stride + i * bp.dq_row_stride + item.head * bp.dq_head_stride;
#pragma unroll
  for (int x = 0; x < AJ_QD; ++x) aj_store(out + lane + AJ_SIMT_LANES * x, dq[x] * bp.scale);
}

// ---- _dkdv: over the key-major plan ---------------------------------------------------------

// Query rows are staged in chunks that fit static shared memory (48 KB) at any head dim.
#define AJ_BWD_QCHUNK_FIT(n) ((n) * (AJ_HEAD_DIM + AJ_HEAD_DIM_V + 2) * 4 <= 40 * 1024)
#define AJ_BWD_QCHUNK (AJ_BWD_QCHUNK_FIT(AJ_TILE_Q) ? AJ_TILE_Q : AJ_BWD_QCHUNK_FIT(16) ? 16 : 8)
#define AJ_BWD_KV_THREADS (AJ_TILE_K * AJ_SIMT_LANES)

struct AjBwdQueryShared {
  float q[AJ_BWD_QCHUNK][AJ_HEAD_DIM];
  float dout[AJ_BWD_QCHUNK][AJ_HEAD_DIM_V];
  float lse2[AJ_BWD_QCHUNK];
  float delta[AJ_BWD_QCHUNK];
};

__device__ __forceinline__ void aj_bwd_dkdv(const AjBwdParams& bp) {
  const AjParams& p = bp.fwd;
  AJ_STATIC_SHARED(AjBwdQueryShared, sh);
  const AjKeyItem ki = bp.key_items[bp.key_item_base + aj_block_idx_x()];
  const aj_i64 b = aj_batch_index();
  if (b >= p.batch || aj_bwd_adds_nothing(bp, ki)) return;
  const int krow = aj_thread_idx() / AJ_SIMT_LANES, lane = aj_thread_idx() % AJ_SIMT_LANES;
  const bool live = krow < ki.keys_count;
  const aj_i64 j = ki.keys_start + (aj_i64)(live ? krow : 0) * ki.keys_stride;
  const aj_i64 doc = aj_doc_start(p, ki.keys_start), q_origin = p.q_offset - doc;
  const aj_i64 kpos = p.k_offset - doc + j;
  const float f = p.output_scale;

  float k[AJ_QD], v[AJ_VD], dk[AJ_QD], dv[AJ_VD];
  const aj_elem* kr = (const aj_elem*)p.k + b * p.k_batch_stride + j * p.k_row_stride + ki.kv_head * p.k_head_stride;
  const aj_elem* vr = (const aj_elem*)p.v + b * p.v_batch_stride + j * p.v_row_stride + ki.kv_head * p.v_head_stride;
#pragma unroll
  for (int x = 0; x < AJ_QD; ++x) k[x] = live ? aj_load(kr + lane + AJ_SIMT_LANES * x) : 0.0f, dk[x] = 0.0f;
#pragma unroll
  for (int x = 0; x < AJ_VD; ++x) v[x] = live ? aj_load(vr + lane + AJ_SIMT_LANES * x) : 0.0f, dv[x] = 0.0f;

  for (int e = ki.entry_begin; e < ki.entry_end; ++e) {
    const AjQueryEntry qe = bp.query_entries[e];
    bool full;
    if (!aj_bwd_entry_visit(p, ki, qe, full)) continue;
    for (int r0 = 0; r0 < qe.rows_count; r0 += AJ_BWD_QCHUNK) {
      const int rows = qe.rows_count - r0 < AJ_BWD_QCHUNK ? qe.rows_count - r0 : AJ_BWD_QCHUNK;
      aj_syncthreads();  // the previous chunk is no longer read
      for (int x = aj_thread_idx(); x < AJ_BWD_QCHUNK * AJ_HEAD_DIM; x += AJ_BWD_KV_THREADS) {
        const int r = x / AJ_HEAD_DIM, d = x % AJ_HEAD_DIM;
        const aj_i64 i = qe.rows_start + (aj_i64)(r0 + r) * qe.rows_stride;
        sh.q[r][d] = r < rows ? aj_load((const aj_elem*)p.q + b * p.q_batch_stride + i * p.q_row_stride + qe.head * p.q_head_stride + d) : 0.0f;
      }
      for (int x = aj_thread_idx(); x < AJ_BWD_QCHUNK * AJ_HEAD_DIM_V; x += AJ_BWD_KV_THREADS) {
        const int r = x / AJ_HEAD_DIM_V, d = x % AJ_HEAD_DIM_V;
        const aj_i64 i = qe.rows_start + (aj_i64)(r0 + r) * qe.rows_stride;
        sh.dout[r][d] = r < rows ? aj_load((const aj_elem*)bp.dout + b * bp.do_batch_stride + i * bp.do_row_stride + qe.head * bp.do_head_stride + d) : 0.0f;
      }
      for (int r = aj_thread_idx(); r < AJ_BWD_QCHUNK; r += AJ_BWD_KV_THREADS) {
        const aj_i64 i = qe.rows_start + (aj_i64)(r0 + r) * qe.rows_stride;
        sh.lse2[r] = r < rows ? aj_bwd_lse2(p, b, qe.head, i) : AJ_NEG_INF;
        sh.delta[r] = r < rows ? bp.delta[(b * bp.heads_q + qe.head) * bp.seq_q + i] : 0.0f;
      }
      aj_syncthreads();
      for (int r = 0; r < rows; ++r) {
        float dot = 0.0f, dp = 0.0f;
#pragma unroll
        for (int x = 0; x < AJ_QD; ++x) dot += k[x] * sh.q[r][lane + AJ_SIMT_LANES * x];
#pragma unroll
        for (int x = 0; x < AJ_VD; ++x) dp += v[x] * sh.dout[r][lane + AJ_SIMT_LANES * x];
        dot += aj_shfl_xor(dot, 1);
        dot += aj_shfl_xor(dot, 2);
        dp += aj_shfl_xor(dp, 1);
        dp += aj_shfl_xor(dp, 2);
        const float lse2 = sh.lse2[r];
        bool ok = live && lse2 != AJ_NEG_INF;
        if (ok && !full) {
          ok = aj_queries_allowed(p, qe.branch, qe.head, kpos, q_origin + qe.rows_start, (aj_cs)(r0 + r) * (aj_cs)qe.rows_stride);
        }
        if (!ok) continue;
        const float pr = aj_ex2(aj_mul_rn(dot, p.scale_log2) - lse2);
        const float ds = pr * (f * dp - sh.delta[r]);
#pragma unroll
        for (int x = 0; x < AJ_VD; ++x) dv[x] += f * pr * sh.dout[r][lane + AJ_SIMT_LANES * x];
#pragma unroll
        for (int x = 0; x < AJ_QD; ++x) dk[x] += ds * sh.q[r][lane + AJ_SIMT_LANES * x];
      }
    }
  }
  if (!live) return;
  float* dka = bp.dk_acc + ((b * bp.seq_k + j) * bp.heads_kv + ki.kv_head) * AJ_HEAD_DIM;
  float* dva = bp.dv_acc + ((b * bp.seq_k + j) * bp.heads_kv + ki.kv_head) * AJ_HEAD_DIM_V;
  if (bp.plain_add == 2) {  // this block alone writes the row: stored in the storage type
    aj_elem* dks = (aj_elem*)bp.dk + b * bp.dk_batch_stride + j * bp.dk_row_stride + ki.kv_head * bp.dk_head_stride;
    aj_elem* dvs = (aj_elem*)bp.dv + b * bp.dv_batch_stride + j * bp.dv_row_stride + ki.kv_head * bp.dv_head_stride;
#pragma unroll
    for (int x = 0; x < AJ_QD; ++x) aj_store(dks + lane + AJ_SIMT_LANES * x, dk[x] * bp.scale);
#pragma unroll
    for (int x = 0; x < AJ_VD; ++x) aj_store(dvs + lane + AJ_SIMT_LANES * x, dv[x]);
    return;
  }
  if (bp.plain_add) {  // one layer of disjoint key tiles: reproducible bit for bit
#pragma unroll
    for (int x = 0; x < AJ_QD; ++x) dka[lane + AJ_SIMT_LANES * x] += dk[x] * bp.scale;
#pragma unroll
    for (int x = 0; x < AJ_VD; ++x) dva[lane + AJ_SIMT_LANES * x] += dv[x];
    return;
  }
#pragma unroll
  for (int x = 0; x < AJ_QD; ++x) aj_red_add_f32(dka + lane + AJ_SIMT_LANES * x, dk[x] * bp.scale);
#pragma unroll
  for (int x = 0; x < AJ_VD; ++x) aj_red_add_f32(dva + lane + AJ_SIMT_LANES * x, dv[x]);
}
