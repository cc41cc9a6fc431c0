// The tensor-core forward kernel for sm_80 and newer, in the style of FlashAttention-2:
// each warp owns 16 query rows; S = Q K^T and O += P V with mma.sync m16n8k16 (fp16/bf16 in,
// fp32 accumulate); K/V tiles stream through shared memory with cp.async, AJ_STAGES deep; the
// online softmax lives in the accumulator registers. Query and key rows come through the plan's
// row maps (start + k * stride): dilated rows are gathered by the loads, never copied.

#define AJ_WARPS (AJ_TILE_Q / 16)
#define AJ_THREADS (AJ_WARPS * 32)
#define AJ_DP (AJ_HEAD_DIM + 8)     // shared-memory row pitch in elements: +16 bytes keeps ldmatrix
#define AJ_DVP (AJ_HEAD_DIM_V + 8)  // rows on distinct banks
#define AJ_Q_IN_REGS (AJ_HEAD_DIM <= 128)

// D += A * B for one m16n8k16 tile in the kernel's input type.
__device__ __forceinline__ void aj_mma(float (&d)[4], const aj_u32 (&a)[4], aj_u32 b0, aj_u32 b1) {
#if AJ_DTYPE == 2
  aj_mma_bf16(d, a, b0, b1);
#else
  aj_mma_f16(d, a, b0, b1);
#endif
}

// Two floats to one register of two 16-bit values, `lo` in the low half (the lower column).
__device__ __forceinline__ aj_u32 aj_pack2(float lo, float hi) {
#if AJ_DTYPE == 2
  return aj_cvt_bf16x2(hi, lo);
#else
  return aj_cvt_f16x2(hi, lo);
#endif
}

// ---- tile loads through row maps --------------------------------------------------------------

// Rows first + r * stride (r < count) of a [.., D] tensor into a [rows][pitch] shared tile, by a
// block of THREADS threads; rows past `count` are zero-filled. Where the threads divide into whole
// columns of 16-byte chunks (every power-of-two head dim), each thread copies one column of rows
// r0, r0 + STEP, ...: one 64-bit address per tile, then a constant stride in global memory and
// constant offsets in shared memory, a trip count known at compile time. Other head dims (48, 80,
// ...) take the general loop.
template <int ROWS, int D, int PITCH, int THREADS = AJ_THREADS>
__device__ __forceinline__ void aj_load_rows(aj_elem* dst, const aj_elem* base, aj_i64 row_stride, aj_i64 first,
                                             aj_i64 stride, int count) {
  constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
  if constexpr (THREADS % CHUNKS == 0) {
    constexpr int STEP = THREADS / CHUNKS;  // rows between a thread's copies
    constexpr int TRIPS = (ROWS + STEP - 1) / STEP;
    const int r0 = aj_thread_idx() / CHUNKS, c = aj_thread_idx() % CHUNKS;
    const aj_i64 step = stride * row_stride * STEP;  // elements between a thread's source rows
    const aj_elem* src = base + (first + (aj_i64)r0 * stride) * row_stride + c * 8;
    aj_elem* to = dst + r0 * PITCH + c * 8;
#pragma unroll
    for (int i = 0; i < TRIPS; ++i) {
      const int r = r0 + i * STEP;
      if (ROWS % STEP == 0 || r < ROWS) aj_cp_async16(to + i * STEP * PITCH, r < count ? src : base, r < count);
      src += step;
    }
  } else {
    for (int x = aj_thread_idx(); x < ROWS * CHUNKS; x += THREADS) {
      const int r = x / CHUNKS, c = x % CHUNKS;
      const bool valid = r < count;
      const aj_elem* src = valid ? base + (first + (aj_i64)r * stride) * row_stride + c * 8 : base;
      aj_cp_async16(dst + r * PITCH + c * 8, src, valid);
    }
  }
}

struct AjSm80Shared {
  aj_elem* q;  // [AJ_TILE_Q][AJ_DP]
  aj_elem* k;  // [AJ_STAGES][AJ_TILE_K][AJ_DP]
  aj_elem* v;  // [AJ_STAGES][AJ_TILE_K][AJ_DVP]
};

__device__ __forceinline__ void aj_sm80_load_kv(const AjParams& p, const AjSm80Shared& sh, int stage, const AjTile& t,
                                                aj_i64 b, int kvh) {
  const aj_elem* kb = (const aj_elem*)p.k + b * p.k_batch_stride + kvh * p.k_head_stride;
  const aj_elem* vb = (const aj_elem*)p.v + b * p.v_batch_stride + kvh * p.v_head_stride;
  aj_load_rows<AJ_TILE_K, AJ_HEAD_DIM, AJ_DP>(sh.k + stage * AJ_TILE_K * AJ_DP, kb, p.k_row_stride, t.first, t.stride,
                                              t.count);
  aj_load_rows<AJ_TILE_K, AJ_HEAD_DIM_V, AJ_DVP>(sh.v + stage * AJ_TILE_K * AJ_DVP, vb, p.v_row_stride, t.first,
                                                 t.stride, t.count);
}

// ---- the kernel body -------------------------------------------------------------------------

__device__ __forceinline__ void aj_fwd_sm80(const AjParams& p) {
  AJ_DYNAMIC_SHARED(aj_smem);
  AjSm80Shared sh;
  sh.q = (aj_elem*)aj_smem;
  sh.k = sh.q + AJ_TILE_Q * AJ_DP;
  sh.v = sh.k + AJ_STAGES * AJ_TILE_K * AJ_DP;

  const AjItem item = p.items[aj_block_idx_x()];
  const aj_i64 b = aj_block_idx_y();
  const int warp = aj_thread_idx() / 32, lane = aj_thread_idx() % 32;
  const int g = lane / 4, quad = lane % 4;  // accumulator row within 8, column pair within 8
  const int kvh = item.head / p.heads_per_kv;

  // Q tile, then the first AJ_STAGES - 1 key tiles, each its own cp.async group.
  const aj_elem* qb = (const aj_elem*)p.q + b * p.q_batch_stride + item.head * p.q_head_stride;
  aj_load_rows<AJ_TILE_Q, AJ_HEAD_DIM, AJ_DP>(sh.q, qb, p.q_row_stride, item.rows_start, item.rows_stride,
                                              item.rows_count);
  aj_cp_async_commit();
  AjTileCursor cur, pre;
  cur.begin(p, item);
  pre.begin(p, item);
#pragma unroll
  for (int s = 0; s < AJ_STAGES - 1; ++s) {
    if (!pre.done()) {
      aj_sm80_load_kv(p, sh, s, pre.tile(), b, kvh);
      pre.next();
    }
    aj_cp_async_commit();
  }

  // Query rows of this thread's two accumulator rows, as global positions.
  const int r0 = warp * 16 + g, r1 = r0 + 8;
  const aj_i64 doc = aj_doc_start(p, item.rows_start), k_origin = p.k_offset - doc;
  const aj_i64 qpos0 = p.q_offset - doc + item.rows_start + (aj_i64)r0 * item.rows_stride;
  const aj_i64 qpos1 = p.q_offset - doc + item.rows_start + (aj_i64)r1 * item.rows_stride;

  aj_u32 qf[AJ_Q_IN_REGS ? AJ_HEAD_DIM / 16 : 1][4];
  float acc[AJ_HEAD_DIM_V / 8][4];
#pragma unroll
  for (int j = 0; j < AJ_HEAD_DIM_V / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  float m0 = AJ_NEG_INF, m1 = AJ_NEG_INF, l0 = 0.0f, l1 = 0.0f;

  // ldmatrix row/column of this lane for A (Q, P) and B (K) fragments, and for V (transposed).
  const int a_row = lane % 16, a_col = (lane / 16) * 8;
  const int k_row = (lane & 7) + ((lane >> 4) << 3), k_col = ((lane >> 3) & 1) * 8;
  const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8, v_col = (lane >> 4) * 8;

  for (int iter = 0; !cur.done(); ++iter, cur.next()) {
    const int stage = iter % AJ_STAGES;
    if (!pre.done()) {
      aj_sm80_load_kv(p, sh, (iter + AJ_STAGES - 1) % AJ_STAGES, pre.tile(), b, kvh);
      pre.next();
    }
    aj_cp_async_commit();
    aj_cp_async_wait<AJ_STAGES - 1>();
    aj_syncthreads();
    if (AJ_Q_IN_REGS && iter == 0) {
#pragma unroll
      for (int ks = 0; ks < (AJ_Q_IN_REGS ? AJ_HEAD_DIM / 16 : 0); ++ks)
        aj_ldmatrix_x4(qf[ks], sh.q + (warp * 16 + a_row) * AJ_DP + ks * 16 + a_col);
    }
    const AjTile t = cur.tile();
    const aj_elem* ks_base = sh.k + stage * AJ_TILE_K * AJ_DP;
    const aj_elem* vs_base = sh.v + stage * AJ_TILE_K * AJ_DVP;

    // S = Q K^T for this warp's 16 rows and the tile's AJ_TILE_K keys.
    float s[AJ_TILE_K / 8][4];
#pragma unroll
    for (int j = 0; j < AJ_TILE_K / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < AJ_HEAD_DIM / 16; ++ks) {
      aj_u32 a[4];
      if (AJ_Q_IN_REGS) {
#pragma unroll
        for (int x = 0; x < 4; ++x) a[x] = qf[AJ_Q_IN_REGS ? ks : 0][x];
      } else {
        aj_ldmatrix_x4(a, sh.q + (warp * 16 + a_row) * AJ_DP + ks * 16 + a_col);
      }
#pragma unroll
      for (int n = 0; n < AJ_TILE_K / 16; ++n) {
        aj_u32 kf[4];
        aj_ldmatrix_x4(kf, ks_base + (n * 16 + k_row) * AJ_DP + ks * 16 + k_col);
        aj_mma(s[2 * n], a, kf[0], kf[1]);
        aj_mma(s[2 * n + 1], a, kf[2], kf[3]);
      }
    }

    // Mask partial tiles and keys past the tile's end (a whole tile with every pair attended, the
    // common case, tests nothing). Scores stay unscaled until the exponent: the scale is positive,
    // so the row maximum scales with them, and exp2(s * scale_log2 - base) is one FFMA.
    if (!(t.full && t.count == AJ_TILE_K)) {
#pragma unroll
      for (int j = 0; j < AJ_TILE_K / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = j * 8 + quad * 2 + (e & 1);
          bool ok = col < t.count;
          if (ok && !t.full) {
            const aj_i64 kpos = k_origin + t.first + (aj_i64)col * t.stride;
            ok = aj_branch_allows(p, t.branch, item.head, e < 2 ? qpos0 : qpos1, kpos);
          }
          if (!ok) s[j][e] = AJ_NEG_INF;
        }
      }
    }
    float mx0 = AJ_NEG_INF, mx1 = AJ_NEG_INF;
#pragma unroll
    for (int j = 0; j < AJ_TILE_K / 8; ++j) {
      mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
      mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
    }
    mx0 *= p.scale_log2;
    mx1 *= p.scale_log2;
    // The four threads of a quad share a row.
    mx0 = fmaxf(mx0, aj_shfl_xor(mx0, 1));
    mx0 = fmaxf(mx0, aj_shfl_xor(mx0, 2));
    mx1 = fmaxf(mx1, aj_shfl_xor(mx1, 1));
    mx1 = fmaxf(mx1, aj_shfl_xor(mx1, 2));
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    // A row that has seen nothing keeps base 0, so exp2(-inf - 0) = 0 and never NaN.
    const float base0 = n0 == AJ_NEG_INF ? 0.0f : n0, base1 = n1 == AJ_NEG_INF ? 0.0f : n1;
    const float c0 = aj_ex2(m0 - base0), c1 = aj_ex2(m1 - base1);
    m0 = n0;
    m1 = n1;
    l0 *= c0;
    l1 *= c1;
#pragma unroll
    for (int j = 0; j < AJ_HEAD_DIM_V / 8; ++j) {
      acc[j][0] *= c0;
      acc[j][1] *= c0;
      acc[j][2] *= c1;
      acc[j][3] *= c1;
    }
#pragma unroll
    for (int j = 0; j < AJ_TILE_K / 8; ++j) {
      s[j][0] = aj_ex2(fmaf(s[j][0], p.scale_log2, -base0));
      s[j][1] = aj_ex2(fmaf(s[j][1], p.scale_log2, -base0));
      s[j][2] = aj_ex2(fmaf(s[j][2], p.scale_log2, -base1));
      s[j][3] = aj_ex2(fmaf(s[j][3], p.scale_log2, -base1));
      l0 += s[j][0] + s[j][1];
      l1 += s[j][2] + s[j][3];
    }

    // O += P V: the accumulator layout of S is the A-fragment layout of P (two n-tiles per k-step).
#pragma unroll
    for (int kk = 0; kk < AJ_TILE_K / 16; ++kk) {
      aj_u32 pa[4];
      pa[0] = aj_pack2(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = aj_pack2(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = aj_pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = aj_pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dp = 0; dp < AJ_HEAD_DIM_V / 16; ++dp) {
        aj_u32 vf[4];
        aj_ldmatrix_x4_trans(vf, vs_base + (kk * 16 + v_row) * AJ_DVP + dp * 16 + v_col);
        aj_mma(acc[2 * dp], pa, vf[0], vf[1]);
        aj_mma(acc[2 * dp + 1], pa, vf[2], vf[3]);
      }
    }
    aj_syncthreads();  // this stage is overwritten by a later prefetch
  }
  aj_cp_async_wait<0>();

  // Epilogue: finish the row sums across the quad, then O = acc / l (scaled) and LSE.
  l0 += aj_shfl_xor(l0, 1);
  l0 += aj_shfl_xor(l0, 2);
  l1 += aj_shfl_xor(l1, 1);
  l1 += aj_shfl_xor(l1, 2);
  const float inv0 = l0 > 0.0f ? p.output_scale / l0 : 0.0f, inv1 = l1 > 0.0f ? p.output_scale / l1 : 0.0f;
  aj_elem* ob = (aj_elem*)p.o + b * p.o_batch_stride + item.head * p.o_head_stride;
  const aj_i64 i0 = item.rows_start + (aj_i64)r0 * item.rows_stride, i1 = item.rows_start + (aj_i64)r1 * item.rows_stride;
  // Two adjacent columns per 4-byte store (the tensor-core path's rows are 16-byte aligned).
#pragma unroll
  for (int j = 0; j < AJ_HEAD_DIM_V / 8; ++j) {
    const int col = j * 8 + quad * 2;
    if (r0 < item.rows_count) *(aj_u32*)(ob + i0 * p.o_row_stride + col) = aj_pack2(acc[j][0] * inv0, acc[j][1] * inv0);
    if (r1 < item.rows_count) *(aj_u32*)(ob + i1 * p.o_row_stride + col) = aj_pack2(acc[j][2] * inv1, acc[j][3] * inv1);
  }
  if (quad == 0 && p.lse) {
    float* lb = p.lse + b * p.lse_batch_stride + item.head * p.lse_head_stride;
    if (r0 < item.rows_count) lb[i0] = l0 > 0.0f ? (m0 + aj_lg2(l0)) * AJ_LN2 : AJ_NEG_INF;
    if (r1 < item.rows_count) lb[i1] = l1 > 0.0f ? (m1 + aj_lg2(l1)) * AJ_LN2 : AJ_NEG_INF;
  }
}
