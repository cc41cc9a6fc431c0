// The SIMT forward kernel (sm_60 and newer; the fp32 path everywhere): four threads per query row,
// each owning every fourth head dimension, float32 arithmetic, online softmax per key tile.
// FP8 inputs (AJ_DTYPE 3): codes decoded exactly as they are loaded, the scores times q_descale x
// k_descale, P rounded to e4m3 after a factor 2^8 for the P V sum (the row sum takes it unrounded),
// O times v_descale: the FP8 forward's arithmetic (docs/spec.md, "FP8 inputs").

#define AJ_SIMT_LANES 4
#define AJ_SIMT_THREADS (AJ_TILE_Q * AJ_SIMT_LANES)
#define AJ_QD (AJ_HEAD_DIM / AJ_SIMT_LANES)
#define AJ_VD (AJ_HEAD_DIM_V / AJ_SIMT_LANES)

// K and V tiles, converted to float on load (every query row of the block reads every key).
struct AjSimtShared {
  float k[AJ_TILE_K][AJ_HEAD_DIM];
  float v[AJ_TILE_K][AJ_HEAD_DIM_V];
};

__device__ __forceinline__ void aj_simt_load_tile(const AjParams& p, AjSimtShared& sh, const AjTile& t, aj_i64 b,
                                                  int kvh) {
  const aj_elem* kb = (const aj_elem*)p.k + b * p.k_batch_stride + kvh * p.k_head_stride;
  const aj_elem* vb = (const aj_elem*)p.v + b * p.v_batch_stride + kvh * p.v_head_stride;
  for (int x = aj_thread_idx(); x < AJ_TILE_K * AJ_HEAD_DIM; x += AJ_SIMT_THREADS) {
    const int r = x / AJ_HEAD_DIM, d = x % AJ_HEAD_DIM;
    sh.k[r][d] = r < t.count ? aj_load(kb + (t.first + r * t.stride) * p.k_row_stride + d) : 0.0f;
  }
  for (int x = aj_thread_idx(); x < AJ_TILE_K * AJ_HEAD_DIM_V; x += AJ_SIMT_THREADS) {
    const int r = x / AJ_HEAD_DIM_V, d = x % AJ_HEAD_DIM_V;
    sh.v[r][d] = r < t.count ? aj_load(vb + (t.first + r * t.stride) * p.v_row_stride + d) : 0.0f;
  }
}

__device__ __forceinline__ void aj_fwd_simt(const AjParams& p) {
  AJ_STATIC_SHARED(AjSimtShared, sh);
  const AjItem item = p.items[aj_block_idx_x()];
  const aj_i64 b = aj_batch_index();
  if (b >= p.batch) return;
  const int row = aj_thread_idx() / AJ_SIMT_LANES, lane = aj_thread_idx() % AJ_SIMT_LANES;
  const bool live = row < item.rows_count;
  const aj_i64 i = item.rows_start + (aj_i64)(live ? row : 0) * item.rows_stride;
  const aj_i64 doc = aj_doc_start(p, item.rows_start), k_origin = p.k_offset - doc;
  const aj_i64 qpos = p.q_offset - doc + i;
  const int kvh = item.head / p.heads_per_kv;

  float q[AJ_QD];
  const aj_elem* qrow = (const aj_elem*)p.q + b * p.q_batch_stride + i * p.q_row_stride + item.head * p.q_head_stride;
#pragma unroll
  for (int x = 0; x < AJ_QD; ++x) q[x] = live ? aj_load(qrow + lane + AJ_SIMT_LANES * x) : 0.0f;

  float acc[AJ_VD];
#pragma unroll
  for (int x = 0; x < AJ_VD; ++x) acc[x] = 0.0f;
  float m = AJ_NEG_INF, l = 0.0f;
  const float scale_log2 = aj_scale_log2(p, b, kvh);

  AjTileCursor cursor;
  cursor.begin(p, item);
  for (; !cursor.done(); cursor.next()) {
    const AjTile t = cursor.tile();
    aj_syncthreads();  // the previous tile is no longer read
    aj_simt_load_tile(p, sh, t, b, kvh);
    aj_syncthreads();

    // Scores of this row against the tile, in the exp2 domain; masked keys are -inf.
    float s[AJ_TILE_K];
    float tile_max = AJ_NEG_INF;
    bool nan = false;  // fmaxf drops a NaN score; the row must still come out NaN
#pragma unroll
    for (int c = 0; c < AJ_TILE_K; ++c) {
      float dot = 0.0f;
#pragma unroll
      for (int x = 0; x < AJ_QD; ++x) dot += q[x] * sh.k[c][lane + AJ_SIMT_LANES * x];
      dot += aj_shfl_xor(dot, 1);
      dot += aj_shfl_xor(dot, 2);
      bool ok = live && c < t.count;
      if (ok && !t.full) ok = aj_keys_allowed(p, t.branch, item.head, qpos, k_origin + t.first, (aj_cs)c * (aj_cs)t.stride);
      s[c] = ok ? aj_mul_rn(dot, scale_log2) : AJ_NEG_INF;  // rounded as m_new is: the maximum's weight is 1
      tile_max = fmaxf(tile_max, s[c]);
      nan |= s[c] != s[c];
    }
    const float m_new = nan ? aj_int_as_float(0x7fffffff) : fmaxf(m, tile_max);
    if (m_new == AJ_NEG_INF) continue;  // nothing attended yet in this row
    const float rescale = aj_ex2(m - m_new);
    l *= rescale;
#pragma unroll
    for (int x = 0; x < AJ_VD; ++x) acc[x] *= rescale;
#pragma unroll
    for (int c = 0; c < AJ_TILE_K; ++c) {
      // A masked key is skipped, not weighted by 0: 0 times a NaN or inf in its V would be NaN.
      if (s[c] == AJ_NEG_INF) continue;
#ifdef AJ_KEY_WEIGHTS
      float pr = aj_ex2(s[c] - m_new);
      pr = aj_fma(pr, aj_key_extra(p, t, c), pr);  // a packed plan's weighted key counts for each of its branches
#else
      const float pr = aj_ex2(s[c] - m_new);
#endif
      l += pr;
#if AJ_DTYPE == 3
      const float pv = aj_round_e4m3(pr * 256.0f) * 0.00390625f;  // P8: 2^8 P rounded to e4m3, times 2^-8
#else
      const float pv = pr;
#endif
#pragma unroll
      for (int x = 0; x < AJ_VD; ++x) acc[x] += pv * sh.v[c][lane + AJ_SIMT_LANES * x];
    }
    m = m_new;
  }

  if (!live) return;
  aj_out_elem* orow = (aj_out_elem*)p.o + b * p.o_batch_stride + i * p.o_row_stride + item.head * p.o_head_stride;
#if AJ_DTYPE == 3
  const float out_scale = p.output_scale * aj_descale(p, 2, b, kvh);
#else
  const float out_scale = p.output_scale;
#endif
  // l is 0 for a row that attended nothing (O = 0, LSE = -inf) and NaN for one that saw a NaN.
  const float inv = l == 0.0f ? 0.0f : out_scale / l;
#pragma unroll
  for (int x = 0; x < AJ_VD; ++x) aj_store_out(orow + lane + AJ_SIMT_LANES * x, acc[x] * inv);
  if (lane == 0 && p.lse) {
    p.lse[b * p.lse_batch_stride + item.head * p.lse_head_stride + i] = l == 0.0f ? AJ_NEG_INF : (m + aj_lg2(l)) * AJ_LN2;
  }
}
