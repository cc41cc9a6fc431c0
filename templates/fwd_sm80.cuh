// The tensor-core forward kernel for sm_80 and newer, in the style of FlashAttention-2:
// each warp owns AJ_ROW_GROUPS groups of 16 query rows; S = Q K^T and O += P V with mma.sync
// m16n8k16 (fp16/bf16 in, fp32 accumulate), every K and V fragment loaded once per warp and used
// by each of its row groups; K/V tiles stream through shared memory with cp.async, AJ_STAGES
// deep; the online softmax lives in the accumulator registers. Query and key rows come through
// the plan's row maps (start + k * stride): dilated rows are gathered by the loads, never copied.
// The instantiation header sets AJ_WARPS (the config's warps; AJ_TILE_Q / 16 by default),
// AJ_Q_IN_REGS (each warp's Q fragments held in registers from the first tile on, when they take at
// most 32 of them) and AJ_Q_OVER_KV (the Q tile lies over the last V stage; compiler/codegen/codegen.cpp
// decides both with the shared memory they take).

#if AJ_DTYPE == 0
#error "the tensor-core templates take fp16 or bf16 inputs; fp32 runs the SIMT path (fwd_simt.cuh)"
#endif
#define AJ_THREADS (AJ_WARPS * 32)
#define AJ_ROW_GROUPS (AJ_TILE_Q / (16 * AJ_WARPS))  // 16-row groups per warp
#define AJ_WARP_ROWS (16 * AJ_ROW_GROUPS)
#define AJ_DP (AJ_HEAD_DIM + 8)     // shared-memory row pitch in elements: +16 bytes keeps ldmatrix
#define AJ_DVP (AJ_HEAD_DIM_V + 8)  // rows on distinct banks
#if AJ_Q_OVER_KV && !AJ_Q_IN_REGS
#error "the Q tile can lie over a V stage only when Q moves to registers"
#endif

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
    const aj_u32 r0 = (aj_u32)aj_thread_idx() / CHUNKS, c = (aj_u32)aj_thread_idx() % CHUNKS;
    // Rows in 32 bits (local rows lie below seq_q, seq_k <= 2^31 - 1: check_shape), widened once.
    // A thread whose first row is past `count` may wrap here: its copies read nothing.
    const aj_u32 row = (aj_u32)first + r0 * (aj_u32)stride;
    const aj_i64 step = (aj_i64)(aj_u32)stride * row_stride * STEP;  // elements between a thread's source rows
    const aj_elem* src = base + (aj_i64)row * row_stride + c * 8;
    aj_elem* to = dst + r0 * PITCH + c * 8;
    const int left = count - (int)r0;  // r < count as i * STEP < left: a compare with an immediate per copy
#pragma unroll
    for (int i = 0; i < TRIPS; ++i) {
      if (ROWS % STEP == 0 || r0 + i * STEP < ROWS) aj_cp_async16(to + i * STEP * PITCH, src, i * STEP < left);
      src += step;
    }
  } else {
    for (int x = aj_thread_idx(); x < ROWS * CHUNKS; x += THREADS) {
      const int r = x / CHUNKS, c = x % CHUNKS;
      aj_cp_async16(dst + r * PITCH + c * 8, base + (first + (aj_i64)r * stride) * row_stride + c * 8, r < count);
    }
  }
}

struct AjSm80Shared {
  aj_elem* q;  // [AJ_TILE_Q][AJ_DP]
  aj_elem* k;  // [AJ_STAGES][AJ_TILE_K][AJ_DP]
  aj_elem* v;  // [AJ_STAGES][AJ_TILE_K][AJ_DVP]
};

// The key tiles in flight: the prefetch writes the tile it loads (thread 0) into its stage's slot,
// and the loop reads it back after the barrier that makes the stage's keys visible, so only the
// prefetch walks the plan's tables. A stage's slot is the padding of its K tile's first row
// (columns AJ_HEAD_DIM .. AJ_DP - 1, 16 bytes, which no copy and no ldmatrix touches): the first
// key, the stride, count | full << 15 | branch << 16 and the weight's offset (-1: none) in 32 bits
// each (key rows lie below seq_k <= 2^31 - 1: check_shape; a count is at most AJ_TILE_K, a branch
// below 64), one 16-byte store and one 16-byte load.
// (FP8 inputs reach this file for its softmax and epilogue helpers only: fwd_sm90_fp8.cuh has its own layout.)
static_assert((AJ_DP - AJ_HEAD_DIM) * sizeof(aj_elem) >= 16 || AJ_DTYPE == 3, "a K row's padding holds a slot");
__device__ __forceinline__ aj_u32x4* aj_sm80_slot(const AjSm80Shared& sh, int stage) {
  return (aj_u32x4*)(sh.k + stage * AJ_TILE_K * AJ_DP + AJ_HEAD_DIM);
}
__device__ __forceinline__ AjTile aj_sm80_issued(const AjSm80Shared& sh, int stage) {
  const aj_u32x4 a = aj_ld_u32x4(aj_sm80_slot(sh, stage));
  AjTile t;
  t.first = (int)a.x, t.stride = (int)a.y, t.count = (int)(a.z & 0x7fffu), t.full = (a.z >> 15 & 1u) != 0;
  t.branch = (int)(a.z >> 16), t.weight = (int)a.w;
  return t;
}

// Where the K and V rows of (batch b, kv head kvh) start.
__device__ __forceinline__ const aj_elem* aj_sm80_k_base(const AjParams& p, aj_i64 b, int kvh) {
  return (const aj_elem*)p.k + b * p.k_batch_stride + kvh * p.k_head_stride;
}
__device__ __forceinline__ const aj_elem* aj_sm80_v_base(const AjParams& p, aj_i64 b, int kvh) {
  return (const aj_elem*)p.v + b * p.v_batch_stride + kvh * p.v_head_stride;
}

// The forward's K and V bases live in shared memory across its main loop, in the padding of
// stage 0's second K row (beside the slots): held in registers they took four that 128-row tiles
// at head dim 128 lack (FlashAttention-2's 128x64 tile with 4 warps spilled in the softmax). The
// prefetch reads them back, one shared load a tile.
static_assert(AJ_TILE_K >= 2, "the second K row's padding holds the K and V bases");
__device__ __forceinline__ const aj_elem** aj_sm80_bases(const AjSm80Shared& sh) {
  return (const aj_elem**)(sh.k + AJ_DP + AJ_HEAD_DIM);
}

// Tile t in `stage`'s slot (thread 0 writes it).
__device__ __forceinline__ void aj_sm80_record(const AjSm80Shared& sh, int stage, const AjTile& t) {
  if (aj_thread_idx() == 0) {
    aj_u32x4 a;
    a.x = (aj_u32)t.first, a.y = (aj_u32)t.stride, a.z = (aj_u32)t.count | (t.full ? 1u << 15 : 0u) | (aj_u32)t.branch << 16;
    a.w = (aj_u32)t.weight;
    aj_st_u32x4(aj_sm80_slot(sh, stage), a);
  }
}
// Starts loading the keys (K rows at kb) or the values (V rows at vb) of tile t into `stage`.
__device__ __forceinline__ void aj_sm80_issue_k(const AjParams& p, const AjSm80Shared& sh, int stage, const AjTile& t,
                                                const aj_elem* kb) {
  aj_load_rows<AJ_TILE_K, AJ_HEAD_DIM, AJ_DP>(sh.k + stage * AJ_TILE_K * AJ_DP, kb, p.k_row_stride, t.first, t.stride,
                                              t.count);
}
__device__ __forceinline__ void aj_sm80_issue_v(const AjParams& p, const AjSm80Shared& sh, int stage, const AjTile& t,
                                                const aj_elem* vb) {
  aj_load_rows<AJ_TILE_K, AJ_HEAD_DIM_V, AJ_DVP>(sh.v + stage * AJ_TILE_K * AJ_DVP, vb, p.v_row_stride, t.first,
                                                 t.stride, t.count);
}
// Both, and the slot: tile t into `stage` (the caller commits the group).
__device__ __forceinline__ void aj_sm80_issue(const AjParams& p, const AjSm80Shared& sh, int stage, const AjTile& t,
                                              const aj_elem* kb, const aj_elem* vb) {
  aj_sm80_issue_k(p, sh, stage, t, kb);
  aj_sm80_issue_v(p, sh, stage, t, vb);
  aj_sm80_record(sh, stage, t);
}

// ---- the kernel body -------------------------------------------------------------------------

// Scores of one 16-row group on a partial tile: keys past the tile's end and pairs the branch's
// mask refuses become -inf. qpos0: the position of this thread's first accumulator row in the
// group (row g), q_step8 the distance to its second (row g + 8). Positions are computed here, on
// the masked path only, rather than held in registers across the loop.
__device__ __forceinline__ void aj_sm80_mask(float (&s)[AJ_TILE_K / 8][4], const AjParams& p, const AjTile& t, int head,
                                             aj_i64 qpos0, aj_i64 q_step8, aj_i64 k_origin, int quad) {
  const aj_i64 qpos[2] = {qpos0, qpos0 + q_step8}, kbase = k_origin + t.first;
  // col < count as (col - quad * 2) < count - quad * 2: one compare with an immediate per score.
  const int left = t.count - quad * 2;
  const aj_cs stride = (aj_cs)t.stride;
  auto apply = [&](auto rule) {
#pragma unroll
    for (int j = 0; j < AJ_TILE_K / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = j * 8 + quad * 2 + (e & 1);
        if (!((j * 8 + (e & 1) < left) & rule(qpos[e >> 1], kbase, (aj_cs)col * stride))) s[j][e] = AJ_NEG_INF;
      }
    }
  };
  aj_keys_rule(p, t.branch, head, t.full, apply);  // a full tile (cut short): only the count
}

// A weighted tile's probabilities (one 16-row group's, after the softmax step): key c's P becomes
// P + extra * P (aj_key_extra) and the row sums take the extra too, so the pair counts once for each
// branch it stands for. This thread's columns j * 8 + quad * 2 and + 1, the same for its two rows,
// one 8-byte load per 8 columns. Nothing for an unweighted tile, no code where the pattern's plans
// cannot be packed (codegen defines AJ_KEY_WEIGHTS where they can). After the softmax, not on the
// scores: on sm_90a that is after P(j) V(j)'s wait, when P(j)'s registers are free again (with the
// scores' terms loaded beside S, P and O, the 192-row tile at head dim 64 spilled). Every run of
// the extras starts at an even offset and the table runs on past its last key
// (DevicePlan::key_extra), so a tile cut short reads finite extras past its count, for keys whose P
// is 0.
__device__ __forceinline__ void aj_tc_weigh(float (&s)[AJ_TILE_K / 8][4], float (&l)[2], const AjParams& p, const AjTile& t,
                                            int quad) {
#ifdef AJ_KEY_WEIGHTS
  if (t.weight < 0) return;
  const aj_f32x2* x = (const aj_f32x2*)(p.key_extra + t.weight + quad * 2);
#pragma unroll
  for (int j = 0; j < AJ_TILE_K / 8; ++j) {
    const aj_f32x2 e = aj_ld_f32x2(x + j * 4);
    l[0] = aj_fma(s[j][0], e.x, l[0]), s[j][0] = aj_fma(s[j][0], e.x, s[j][0]);
    l[0] = aj_fma(s[j][1], e.y, l[0]), s[j][1] = aj_fma(s[j][1], e.y, s[j][1]);
    l[1] = aj_fma(s[j][2], e.x, l[1]), s[j][2] = aj_fma(s[j][2], e.x, s[j][2]);
    l[1] = aj_fma(s[j][3], e.y, l[1]), s[j][3] = aj_fma(s[j][3], e.y, s[j][3]);
  }
#else
  (void)s, (void)l, (void)p, (void)t, (void)quad;
#endif
}

// One online-softmax step of one 16-row group's scores, for this thread's rows g and g + 8: m, l
// are their running maximum (in exp2 units) and sum; the scores become probabilities in place and
// `c` is the factor the output accumulator must be multiplied by (the caller does it: on sm_90a it
// may still be a wgmma's accumulator). Scores stay unscaled until here: the scale is positive, so
// the row maximum scales with them. Each exponent is s * scale_log2 rounded, minus the maximum
// rounded the same way (aj_mul_rn, not one fused multiply-add): the maximum's weight is exactly 1
// at any score, where a fused exponent is the product's rounding error, which at scores of about
// 1e9 (fp16) or 4e20 (bf16) makes P overflow its type and the row inf or NaN.
__device__ __forceinline__ void aj_tc_softmax_scores(float (&s)[AJ_TILE_K / 8][4], float (&m)[2], float (&l)[2],
                                                     float (&c)[2], float scale_log2) {
  // Each row's maximum as a tree of four partial maxima: a dependent chain of AJ_TILE_K / 32 + 2
  // steps where one running maximum took AJ_TILE_K / 8 (the softmax's exponentials wait for it).
  // The first n-tiles start the partial maxima: starting from -inf would cost an fmaxf each that
  // the compiler must keep (fmaxf(NaN, -inf) is -inf, not NaN).
  constexpr int PARTS = AJ_TILE_K / 8 < 4 ? AJ_TILE_K / 8 : 4;  // 2 for 16-key tiles
  float part[2][PARTS], mx[2], base[2];
#pragma unroll
  for (int j = 0; j < AJ_TILE_K / 8; ++j) {
    const float m0 = fmaxf(s[j][0], s[j][1]), m1 = fmaxf(s[j][2], s[j][3]);
    part[0][j % PARTS] = j < PARTS ? m0 : fmaxf(part[0][j % PARTS], m0);
    part[1][j % PARTS] = j < PARTS ? m1 : fmaxf(part[1][j % PARTS], m1);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(part[h][0], part[h][1]);
    if constexpr (PARTS == 4) mx[h] = fmaxf(mx[h], fmaxf(part[h][2], part[h][3]));
    mx[h] *= scale_log2;
    mx[h] = fmaxf(mx[h], aj_shfl_xor(mx[h], 1));  // the four threads of a quad share a row
    mx[h] = fmaxf(mx[h], aj_shfl_xor(mx[h], 2));
#ifdef AJ_LAZY_RESCALE
    // FlashAttention-4's lazy rescale: the running maximum moves only when the tile's passes it by
    // more than AJ_LAZY_RESCALE; below that P is taken against the old one (at most 2^8, within
    // fp16 and bf16), c is exactly 1 and O is not rescaled. The result is the same softmax (O and l
    // share the base). A NaN maximum keeps the old one, as fmaxf does.
    const float n = mx[h] > m[h] + AJ_LAZY_RESCALE ? mx[h] : m[h];
#else
    const float n = fmaxf(m[h], mx[h]);
#endif
    base[h] = n == AJ_NEG_INF ? 0.0f : n;  // a row that has seen nothing: exp2(-inf - 0) = 0, never NaN
    c[h] = aj_ex2(m[h] - base[h]);
    m[h] = n;
    l[h] *= c[h];
  }
#pragma unroll
  for (int j = 0; j < AJ_TILE_K / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float x = aj_mul_rn(s[j][e], scale_log2) - base[e >> 1];
#ifdef AJ_POLY_EXP2
      // FlashAttention-4: every AJ_POLY_EXP2-th n-tile's exponentials on the FMA pipe, so that the
      // SFU and the FMA units share the work (the maximum's weight is still exactly 1: 2^0 is).
      if (j % AJ_POLY_EXP2 == AJ_POLY_EXP2 - 1) {
        s[j][e] = aj_ex2_poly(x);
        continue;
      }
#endif
      s[j][e] = aj_ex2(x);
    }
    l[0] += s[j][0] + s[j][1];
    l[1] += s[j][2] + s[j][3];
  }
}

// O's rows g and g + 8 times c[0] and c[1] (with the lazy rescale, only when one of them moved).
__device__ __forceinline__ void aj_tc_rescale(float (&acc)[AJ_HEAD_DIM_V / 8][4], const float (&c)[2]) {
#ifdef AJ_LAZY_RESCALE
  if (c[0] == 1.0f && c[1] == 1.0f) return;
#endif
#pragma unroll
  for (int j = 0; j < AJ_HEAD_DIM_V / 8; ++j) {
    acc[j][0] *= c[0];
    acc[j][1] *= c[0];
    acc[j][2] *= c[1];
    acc[j][3] *= c[1];
  }
}

// The whole step on sm_80: the scores, then O rescaled before this tile's P V.
__device__ __forceinline__ void aj_sm80_softmax(float (&s)[AJ_TILE_K / 8][4], float (&acc)[AJ_HEAD_DIM_V / 8][4],
                                                float (&m)[2], float (&l)[2], float scale_log2) {
  float c[2];
  aj_tc_softmax_scores(s, m, l, c, scale_log2);
  aj_tc_rescale(acc, c);
}

// A key a row does not attend must not reach it, but the tensor cores multiply a non-finite V by
// that row's P = 0 all the same (0 * NaN is NaN): an uninitialised tail of a KV cache, or a NaN
// beside a causal diagonal, would poison every row of the tile. So the epilogue looks at the two
// 16-bit values it stores per word (aj_tc_word_nonfinite in common.cuh: exponent bits all ones, a
// bit test that no fast-math rule can fold away), and a row with such a value whose softmax sum l is finite
// (every score it attended was) is summed again (aj_tc_exact_rows) and stored once more. The test
// reads the packed words, not the accumulators: on the Hopper kernels, touching the wgmma
// accumulators outside the multiplies makes ptxas serialise every wgmma of the loop.
// Bit h of the answer: row r0 + 8 h, whose stored words showed a non-finite value (bad[h]), needs
// the exact sum.
__device__ __forceinline__ int aj_tc_poisoned_rows(const AjItem& item, int r0, const bool (&bad)[2], const float (&l)[2]) {
  int rows = 0;
#pragma unroll
  for (int h = 0; h < 2; ++h)
    if (bad[h] && !aj_nonfinite(l[h]) && r0 + 8 * h < item.rows_count) rows |= 1 << h;
  return rows;
}

// Calls visit(att, key) for every key of the item's tiles that row r0 (att[0]) or r0 + 8 (att[1])
// attends, of the rows in `want`, in the plan's order: the walk of the exact sums below and of
// the backward's (bwd_sm80.cuh). qpos: the two rows' positions within their document. The third
// argument is the key's extra branches (aj_key_extra: 0 but in a packed plan's weighted tile).
template <typename Visit>
__device__ __forceinline__ void aj_tc_attended_keys(const AjParams& p, const AjItem& item, const aj_i64 (&qpos)[2],
                                                    const bool (&want)[2], const Visit& visit) {
  const aj_i64 k_origin = p.k_offset - aj_doc_start(p, item.rows_start);
  AjTileCursor cursor;
  for (cursor.begin(p, item); (want[0] | want[1]) && !cursor.done(); cursor.next()) {
    const AjTile t = cursor.tile();
    for (int c = 0; c < t.count; ++c) {
      bool att[2];
#pragma unroll
      for (int h = 0; h < 2; ++h)
        att[h] = want[h] && (t.full || aj_keys_allowed(p, t.branch, item.head, qpos[h], k_origin + t.first,
                                                       (aj_cs)c * (aj_cs)t.stride));
      if (att[0] | att[1]) visit(att, t.first + (aj_i64)c * t.stride, aj_key_extra(p, t, c));
    }
  }
}

// The Q rows of this thread's two rows r0 and r0 + 8 of the item (the item's first row for one not
// in `want`) and their positions within the document.
struct AjTcRows {
  aj_i64 qpos[2];
  const aj_elem* q[2];
};
__device__ __forceinline__ AjTcRows aj_tc_rows(const AjParams& p, const AjItem& item, aj_i64 b, int r0, const bool (&want)[2]) {
  AjTcRows rs;
  const aj_i64 doc = aj_doc_start(p, item.rows_start);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const aj_i64 i = item.rows_start + (aj_i64)(want[h] ? r0 + 8 * h : 0) * item.rows_stride;
    rs.q[h] = (const aj_elem*)p.q + b * p.q_batch_stride + i * p.q_row_stride + item.head * p.q_head_stride;
    rs.qpos[h] = p.q_offset - doc + i;
  }
  return rs;
}

__device__ __forceinline__ float aj_dot_rows(const aj_elem* a, const aj_elem* b, int n) {
  float dot = 0.0f;
  for (int d = 0; d < n; ++d) dot += aj_load(a + d) * aj_load(b + d);
  return dot;
}

// This thread's columns of the rows in `rows` (aj_tc_poisoned_rows) summed again, one attended key
// at a time in float32 from global memory, skipping the keys the row does not attend; a row that
// attends nothing (l = 0) comes out 0. Only non-finite inputs lead here, and a row that did attend
// a non-finite value comes out non-finite again. m: the rows' maxima in exp2 units (the quad's, as
// the tensor-core path used them); store(h, j, x0, x1) receives row r0 + 8 h's columns
// j * 8 + quad * 2 and + 1, unnormalised (the caller scales them as it scales acc). The columns go
// AJ_TC_EXACT_COLS 8-column blocks at a time, each a walk over the keys: a rare path's registers
// stay few (at head dim 256 a whole row's sums beside the epilogue's would spill).
#define AJ_TC_EXACT_COLS 4
template <typename Store>
__device__ __forceinline__ void aj_tc_exact_rows(const AjParams& p, const AjItem& item, aj_i64 b, int r0, int quad,
                                                 const float (&m)[2], const float (&l)[2], int rows, const Store& store) {
  constexpr int BLOCKS = AJ_HEAD_DIM_V / 8, CHUNK = BLOCKS < AJ_TC_EXACT_COLS ? BLOCKS : AJ_TC_EXACT_COLS;
  aj_rare_path(AJ_RARE_FWD_ROWS);
  bool want[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) want[h] = (rows >> h & 1) != 0 && l[h] != 0.0f;
  const int kvh = item.head / p.heads_per_kv;
  const aj_elem* kb = (const aj_elem*)p.k + b * p.k_batch_stride + kvh * p.k_head_stride;
  const aj_elem* vb = (const aj_elem*)p.v + b * p.v_batch_stride + kvh * p.v_head_stride;
  const float scale_log2 = aj_scale_log2(p, b, kvh);  // as the loop's
  const AjTcRows rs = aj_tc_rows(p, item, b, r0, want);
#pragma unroll 1
  for (int j0 = 0; j0 < BLOCKS; j0 += CHUNK) {
    float ex[CHUNK][4];
#pragma unroll
    for (int j = 0; j < CHUNK; ++j) ex[j][0] = ex[j][1] = ex[j][2] = ex[j][3] = 0.0f;
    aj_tc_attended_keys(p, item, rs.qpos, want, [&](const bool (&att)[2], aj_i64 key, float extra) {
      const aj_elem* krow = kb + key * p.k_row_stride;
      const aj_elem* vrow = vb + key * p.v_row_stride + j0 * 8 + quad * 2;
      float pr[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        pr[h] = att[h] ? aj_ex2(aj_mul_rn(aj_dot_rows(rs.q[h], krow, AJ_HEAD_DIM), scale_log2) - m[h]) : 0.0f;
        pr[h] = aj_fma(pr[h], extra, pr[h]);  // a weighted key counts for each of its branches
      }
#pragma unroll
      for (int j = 0; j < CHUNK; ++j) {
        if (BLOCKS % CHUNK != 0 && j0 + j >= BLOCKS) break;
        const float v0 = aj_load(vrow + j * 8), v1 = aj_load(vrow + j * 8 + 1);
        if (att[0]) ex[j][0] += pr[0] * v0, ex[j][1] += pr[0] * v1;
        if (att[1]) ex[j][2] += pr[1] * v0, ex[j][3] += pr[1] * v1;
      }
    });
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (rows >> h & 1)
#pragma unroll
        for (int j = 0; j < CHUNK; ++j)
          if (BLOCKS % CHUNK == 0 || j0 + j < BLOCKS) store(h, j0 + j, ex[j][2 * h], ex[j][2 * h + 1]);
  }
}

// The end of one 16-row group of the tensor-core kernels (this file's and fwd_sm90.cuh's, whose
// accumulators have the same layout): the row sums finished across the quad, the LSE of this
// thread's rows r0 and r0 + 8 of the item stored, and the factors that turn acc into O (1 / l
// times the output scale; 0 for a row that attended nothing).
__device__ __forceinline__ void aj_tc_finish_rows(const AjParams& p, const AjItem& item, aj_i64 b, int r0, int quad,
                                                  float (&m)[2], float (&l)[2], float (&inv)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += aj_shfl_xor(l[h], 1);
    l[h] += aj_shfl_xor(l[h], 2);
    // l is 0 for a row that attended nothing (O = 0, LSE = -inf) and NaN for one that saw a NaN.
    inv[h] = l[h] == 0.0f ? 0.0f : p.output_scale / l[h];
  }
  if (quad == 0 && p.lse) {
    const int r1 = r0 + 8;
    float* lb = p.lse + b * p.lse_batch_stride + item.head * p.lse_head_stride;
    const aj_i64 i0 = item.rows_start + (aj_i64)r0 * item.rows_stride, i1 = item.rows_start + (aj_i64)r1 * item.rows_stride;
    if (r0 < item.rows_count) lb[i0] = l[0] == 0.0f ? AJ_NEG_INF : (m[0] + aj_lg2(l[0])) * AJ_LN2;
    if (r1 < item.rows_count) lb[i1] = l[1] == 0.0f ? AJ_NEG_INF : (m[1] + aj_lg2(l[1])) * AJ_LN2;
  }
}

// The epilogue of one 16-row group straight to global memory (the Hopper kernels): O = acc * inv
// for this thread's rows r0 and r0 + 8, two adjacent columns per 4-byte store. FP8 inputs
// (fwd_sm90_fp8.cuh) scale O by out_scale (v_descale) and acc alone by acc_scale (2^-8, P's
// factor; the exact sums are of P itself).
__device__ __forceinline__ void aj_tc_store_rows(const AjParams& p, const AjItem& item, aj_i64 b, int r0, int quad,
                                                 float (&acc)[AJ_HEAD_DIM_V / 8][4], float (&m)[2], float (&l)[2],
                                                 float acc_scale = 1.0f, float out_scale = 1.0f) {
  float inv[2];
  aj_tc_finish_rows(p, item, b, r0, quad, m, l, inv);
  inv[0] *= out_scale, inv[1] *= out_scale;
  const float ia[2] = {inv[0] * acc_scale, inv[1] * acc_scale};
  aj_out_elem* ob = (aj_out_elem*)p.o + b * p.o_batch_stride + item.head * p.o_head_stride;
  const int r1 = r0 + 8;
  const aj_i64 i0 = item.rows_start + (aj_i64)r0 * item.rows_stride, i1 = item.rows_start + (aj_i64)r1 * item.rows_stride;
  bool bad[2] = {false, false};
#pragma unroll
  for (int j = 0; j < AJ_HEAD_DIM_V / 8; ++j) {
    const int col = j * 8 + quad * 2;
    const aj_u32 w0 = aj_out_pack2(acc[j][0] * ia[0], acc[j][1] * ia[0]), w1 = aj_out_pack2(acc[j][2] * ia[1], acc[j][3] * ia[1]);
    bad[0] |= aj_out_word_nonfinite(w0);
    bad[1] |= aj_out_word_nonfinite(w1);
    if (r0 < item.rows_count) *(aj_u32*)(ob + i0 * p.o_row_stride + col) = w0;
    if (r1 < item.rows_count) *(aj_u32*)(ob + i1 * p.o_row_stride + col) = w1;
  }
  if (const int redo = aj_tc_poisoned_rows(item, r0, bad, l))  // rows a masked non-finite V reached: written again, exactly
    aj_tc_exact_rows(p, item, b, r0, quad, m, l, redo, [&](int h, int j, float x0, float x1) {
      *(aj_u32*)(ob + (h ? i1 : i0) * p.o_row_stride + j * 8 + quad * 2) = aj_out_pack2(x0 * inv[h], x1 * inv[h]);
    });
}

// The same into a shared O tile: this thread's rows r0 and r0 + 8, each pair of adjacent columns
// (col, col + 1) to the 4 bytes at(r, col) (rows of the item's tile), as they lie in the
// accumulators; the tile then goes to global memory in 16-byte chunks (aj_store_tile_rows, from
// [AJ_TILE_Q][AJ_DVP] below) or by a TMA store (fwd_sm90_tma.cuh, from its swizzled layout).
template <typename At>
__device__ __forceinline__ void aj_tc_stage_rows_at(const AjParams& p, const AjItem& item, aj_i64 b, int r0, int quad,
                                                    float (&acc)[AJ_HEAD_DIM_V / 8][4], float (&m)[2], float (&l)[2], const At& at) {
  float inv[2];
  aj_tc_finish_rows(p, item, b, r0, quad, m, l, inv);
  bool bad[2] = {false, false};
#pragma unroll
  for (int j = 0; j < AJ_HEAD_DIM_V / 8; ++j) {
    const int col = j * 8 + quad * 2;
    const aj_u32 w0 = aj_pack2(acc[j][0] * inv[0], acc[j][1] * inv[0]), w1 = aj_pack2(acc[j][2] * inv[1], acc[j][3] * inv[1]);
    bad[0] |= aj_tc_word_nonfinite(w0);
    bad[1] |= aj_tc_word_nonfinite(w1);
    *at(r0, col) = w0;
    *at(r0 + 8, col) = w1;
  }
  if (const int redo = aj_tc_poisoned_rows(item, r0, bad, l))  // rows a masked non-finite V reached: written again, exactly
    aj_tc_exact_rows(p, item, b, r0, quad, m, l, redo, [&](int h, int j, float x0, float x1) {
      *at(r0 + 8 * h, j * 8 + quad * 2) = aj_pack2(x0 * inv[h], x1 * inv[h]);
    });
}
__device__ __forceinline__ void aj_tc_stage_rows(const AjParams& p, const AjItem& item, aj_i64 b, int r0, int quad,
                                                 float (&acc)[AJ_HEAD_DIM_V / 8][4], float (&m)[2], float (&l)[2],
                                                 aj_elem* tile) {
  aj_tc_stage_rows_at(p, item, b, r0, quad, acc, m, l, [&](int r, int col) { return (aj_u32*)(tile + r * AJ_DVP + col); });
}

// Rows r < count of a shared [ROWS][PITCH] tile to rows first + r * stride of a [.., D] tensor,
// 16 bytes per store, consecutive threads on consecutive chunks of a row (the reverse of
// aj_load_rows; rows and tiles are 16-byte aligned on the tensor-core path).
template <int ROWS, int D, int PITCH>
__device__ __forceinline__ void aj_store_tile_rows(aj_elem* base, aj_i64 row_stride, aj_i64 first, aj_i64 stride,
                                                   int count, const aj_elem* tile) {
  constexpr int CHUNKS = D / 8;
  for (int x = aj_thread_idx(); x < ROWS * CHUNKS; x += AJ_THREADS) {
    const int r = x / CHUNKS, c = x % CHUNKS;
    if (r < count) aj_st_u32x4(base + (first + (aj_i64)r * stride) * row_stride + c * 8, aj_ld_u32x4(tile + r * PITCH + c * 8));
  }
}

#define AJ_QF_GROUPS (AJ_Q_IN_REGS ? AJ_ROW_GROUPS : 1)
#define AJ_QF_STEPS (AJ_Q_IN_REGS ? AJ_HEAD_DIM / 16 : 1)
// This warp's Q fragments (A operands of S = Q K^T) from the shared Q tile into registers; q_frag
// is this lane's ldmatrix address in the warp's first row group.
__device__ __forceinline__ void aj_sm80_q_to_registers(aj_u32 (&qf)[AJ_QF_GROUPS][AJ_QF_STEPS][4], const aj_elem* q_frag) {
#pragma unroll
  for (int gi = 0; gi < AJ_QF_GROUPS; ++gi)
#pragma unroll
    for (int ks = 0; ks < AJ_QF_STEPS; ++ks) aj_ldmatrix_x4(qf[gi][ks], q_frag + gi * 16 * AJ_DP + ks * 16);
}

// d[gi][2n] and d[gi][2n + 1] += a[gi] times the two n-tiles of one ldmatrix.x4 fragment f, for
// every row group: each B fragment is loaded once and feeds all of the warp's groups.
template <int N>
__device__ __forceinline__ void aj_mma_groups(float (&d)[AJ_ROW_GROUPS][N][4], int n, const aj_u32 (&a)[AJ_ROW_GROUPS][4],
                                              const aj_u32 (&f)[4]) {
#pragma unroll
  for (int gi = 0; gi < AJ_ROW_GROUPS; ++gi) {
    aj_mma(d[gi][2 * n], a[gi], f[0], f[1]);
    aj_mma(d[gi][2 * n + 1], a[gi], f[2], f[3]);
  }
}

// S = Q K^T for the warp's rows and the AJ_TILE_K keys at ks_base: each K fragment feeds every
// group. Q comes from registers (qf) or from the shared tile at q_frag; k_row, k_col: this lane's
// ldmatrix row and column of a K fragment.
__device__ __forceinline__ void aj_sm80_scores(float (&s)[AJ_ROW_GROUPS][AJ_TILE_K / 8][4],
                                               const aj_u32 (&qf)[AJ_QF_GROUPS][AJ_QF_STEPS][4], const aj_elem* q_frag,
                                               const aj_elem* ks_base, int k_row, int k_col) {
#pragma unroll
  for (int gi = 0; gi < AJ_ROW_GROUPS; ++gi)
#pragma unroll
    for (int j = 0; j < AJ_TILE_K / 8; ++j) s[gi][j][0] = s[gi][j][1] = s[gi][j][2] = s[gi][j][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < AJ_HEAD_DIM / 16; ++ks) {
    aj_u32 a[AJ_ROW_GROUPS][4];
#pragma unroll
    for (int gi = 0; gi < AJ_ROW_GROUPS; ++gi) {
      if (AJ_Q_IN_REGS) {
#pragma unroll
        for (int x = 0; x < 4; ++x) a[gi][x] = qf[AJ_Q_IN_REGS ? gi : 0][AJ_Q_IN_REGS ? ks : 0][x];
      } else {
        aj_ldmatrix_x4(a[gi], q_frag + gi * 16 * AJ_DP + ks * 16);
      }
    }
#pragma unroll
    for (int n = 0; n < AJ_TILE_K / 16; ++n) {
      aj_u32 kf[4];
      aj_ldmatrix_x4(kf, ks_base + (n * 16 + k_row) * AJ_DP + ks * 16 + k_col);
      aj_mma_groups(s, n, a, kf);
    }
  }
}

// O += P V with P the probabilities in s and the AJ_TILE_K values at vs_base: the accumulator
// layout of S is the A-fragment layout of P (two n-tiles per k-step); each V fragment feeds every
// group. v_row, v_col: this lane's ldmatrix row and column of a (transposed) V fragment.
__device__ __forceinline__ void aj_sm80_pv(float (&acc)[AJ_ROW_GROUPS][AJ_HEAD_DIM_V / 8][4],
                                           const float (&s)[AJ_ROW_GROUPS][AJ_TILE_K / 8][4], const aj_elem* vs_base,
                                           int v_row, int v_col) {
#pragma unroll
  for (int kk = 0; kk < AJ_TILE_K / 16; ++kk) {
    aj_u32 pa[AJ_ROW_GROUPS][4];
#pragma unroll
    for (int gi = 0; gi < AJ_ROW_GROUPS; ++gi) {
      pa[gi][0] = aj_pack2(s[gi][2 * kk][0], s[gi][2 * kk][1]);
      pa[gi][1] = aj_pack2(s[gi][2 * kk][2], s[gi][2 * kk][3]);
      pa[gi][2] = aj_pack2(s[gi][2 * kk + 1][0], s[gi][2 * kk + 1][1]);
      pa[gi][3] = aj_pack2(s[gi][2 * kk + 1][2], s[gi][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < AJ_HEAD_DIM_V / 16; ++dp) {
      aj_u32 vf[4];
      aj_ldmatrix_x4_trans(vf, vs_base + (kk * 16 + v_row) * AJ_DVP + dp * 16 + v_col);
      aj_mma_groups(acc, dp, pa, vf);
    }
  }
}

__device__ __forceinline__ void aj_fwd_sm80(const AjParams& p) {
  AJ_DYNAMIC_SHARED(aj_smem);
  // K stages, V stages, then Q: after them, or over the last V stage, which the main loop's first
  // prefetch writes only once Q is in registers (AJ_Q_OVER_KV).
  AjSm80Shared sh;
  sh.k = (aj_elem*)aj_smem;
  sh.v = sh.k + AJ_STAGES * AJ_TILE_K * AJ_DP;
  sh.q = sh.v + (AJ_STAGES - AJ_Q_OVER_KV) * AJ_TILE_K * AJ_DVP;

  const AjItem item = p.items[aj_block_idx_x()];
  const aj_i64 b = aj_batch_index();
  if (b >= p.batch) return;
  const int warp = aj_thread_idx() / 32, lane = aj_thread_idx() % 32;
  const int g = lane / 4, quad = lane % 4;  // accumulator row within 8, column pair within 8
  const int kvh = item.head / p.heads_per_kv;
  const int warp_row = warp * AJ_WARP_ROWS;  // this warp's first row in the tile
  // A warp whose rows all lie past the item's end (a short residue tile) computes nothing; it
  // still copies its share of every tile and meets every barrier.
  const bool busy = warp_row < item.rows_count;

  // Q tile (skipped by an item with no key tiles: its rows come out empty), then the first
  // AJ_STAGES - 1 key tiles, each its own cp.async group (with one stage: K(0) joins Q's group).
  // `issued` counts the tiles loaded so far.
  AjTileCursor pre;
  pre.begin(p, item);
  int issued = 0;
  const aj_elem* qb = (const aj_elem*)p.q + b * p.q_batch_stride + item.head * p.q_head_stride;
  if (!pre.done())
    aj_load_rows<AJ_TILE_Q, AJ_HEAD_DIM, AJ_DP>(sh.q, qb, p.q_row_stride, item.rows_start, item.rows_stride,
                                                item.rows_count);
  if (AJ_STAGES == 1 && !pre.done()) {  // the single-buffer pipeline: K(0) in Q's group
    const AjTile first = pre.tile();
    aj_sm80_issue_k(p, sh, 0, first, aj_sm80_k_base(p, b, kvh));
    aj_sm80_record(sh, 0, first);
    pre.next();
    ++issued;
  }
  aj_cp_async_commit();
#pragma unroll
  for (int s = 0; s < AJ_STAGES - 1; ++s) {
    if (!pre.done()) {
      aj_sm80_issue(p, sh, s, pre.tile(), aj_sm80_k_base(p, b, kvh), aj_sm80_v_base(p, b, kvh));
      pre.next();
      ++issued;
    }
    aj_cp_async_commit();
  }

  // The global position of this thread's first accumulator row (row warp_row + g), for the mask
  // of partial tiles; the rows 8 and 16 below it are q_step8 and 2 q_step8 further.
  const aj_i64 doc = aj_doc_start(p, item.rows_start), k_origin = p.k_offset - doc;
  const aj_i64 qpos = p.q_offset - doc + item.rows_start + (aj_i64)(warp_row + g) * item.rows_stride;
  const aj_i64 q_step8 = 8 * item.rows_stride;

  aj_u32 qf[AJ_QF_GROUPS][AJ_QF_STEPS][4];
  float acc[AJ_ROW_GROUPS][AJ_HEAD_DIM_V / 8][4];
  float m[AJ_ROW_GROUPS][2], l[AJ_ROW_GROUPS][2];
#pragma unroll
  for (int gi = 0; gi < AJ_ROW_GROUPS; ++gi) {
#pragma unroll
    for (int j = 0; j < AJ_HEAD_DIM_V / 8; ++j) acc[gi][j][0] = acc[gi][j][1] = acc[gi][j][2] = acc[gi][j][3] = 0.0f;
    m[gi][0] = m[gi][1] = AJ_NEG_INF;
    l[gi][0] = l[gi][1] = 0.0f;
  }

  // ldmatrix row/column of this lane for A (Q, P) and B (K) fragments, and for V (transposed).
  const int a_row = lane % 16, a_col = (lane / 16) * 8;
  const int k_row = (lane & 7) + ((lane >> 4) << 3), k_col = ((lane >> 3) & 1) * 8;
  const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8, v_col = (lane >> 4) * 8;
  const aj_elem* q_frag = sh.q + (warp_row + a_row) * AJ_DP + a_col;  // + gi * 16 rows, + ks * 16 columns

  // The K and V bases for the loop's prefetches (aj_sm80_bases), published by the barrier below.
  if (aj_thread_idx() == 0) {
    aj_sm80_bases(sh)[0] = aj_sm80_k_base(p, b, kvh);
    aj_sm80_bases(sh)[1] = aj_sm80_v_base(p, b, kvh);
  }
  // Q into registers before the loop: over the last V stage, every warp past it before the first
  // prefetch overwrites it (all copies landed); otherwise once Q's group has landed (the key
  // tiles' AJ_STAGES - 1 groups may still be in flight). Neither is the loop's business.
  if (AJ_Q_IN_REGS && issued > 0) {
    if (AJ_Q_OVER_KV) aj_cp_async_wait<0>();
    else aj_cp_async_wait<AJ_STAGES - 1>();
  }
  aj_syncthreads();
  if (AJ_Q_IN_REGS && issued > 0) {
    if (busy) aj_sm80_q_to_registers(qf, q_frag);
    if (AJ_Q_OVER_KV) aj_syncthreads();
  }

  // Masks partial tiles (a whole tile with every pair attended, the common case, tests nothing),
  // then the online softmax, for every row group.
  auto softmax = [&](float (&s)[AJ_ROW_GROUPS][AJ_TILE_K / 8][4], const AjTile& t) {
#pragma unroll
    for (int gi = 0; gi < AJ_ROW_GROUPS; ++gi) {
      if (!(t.full && t.count == AJ_TILE_K)) aj_sm80_mask(s[gi], p, t, item.head, qpos + 2 * gi * q_step8, q_step8, k_origin, quad);
      aj_sm80_softmax(s[gi], acc[gi], m[gi], l[gi], p.scale_log2);
      aj_tc_weigh(s[gi], l[gi], p, t, quad);
    }
  };

#if AJ_STAGES == 1
  // FlashAttention-2's pipeline: one K and one V buffer, each its own cp.async group. V(j) loads
  // while S = Q K(j)^T runs, K(j + 1) while the softmax and P V(j) run; K(0) came with Q.
  for (int iter = 0; iter < issued; ++iter) {
    aj_cp_async_wait<0>();
    aj_syncthreads();  // K(j) has landed for every thread; every warp is past P V(j - 1): V's buffer is free
    const AjTile t = aj_sm80_issued(sh, 0);
    aj_sm80_issue_v(p, sh, 0, t, aj_sm80_bases(sh)[1]);
    aj_cp_async_commit();
    float s[AJ_ROW_GROUPS][AJ_TILE_K / 8][4];
    if (busy) aj_sm80_scores(s, qf, q_frag, sh.k, k_row, k_col);
    aj_cp_async_wait<0>();
    aj_syncthreads();  // V(j) has landed for every thread; every warp is past S(j): K's buffer and slot are free
    if (!pre.done()) {
      const AjTile next = pre.tile();
      aj_sm80_issue_k(p, sh, 0, next, aj_sm80_bases(sh)[0]);
      aj_sm80_record(sh, 0, next);
      pre.next();
      ++issued;
    }
    aj_cp_async_commit();
    if (busy) {
      softmax(s, t);
      aj_sm80_pv(acc, s, sh.v, v_row, v_col);
    }
  }
  aj_syncthreads();  // every warp is past its last P V: the epilogue lays O over the V buffer
#else
  for (int iter = 0; iter < issued; ++iter) {
    const int stage = iter % AJ_STAGES;
    if (!pre.done()) {
      aj_sm80_issue(p, sh, (iter + AJ_STAGES - 1) % AJ_STAGES, pre.tile(), aj_sm80_bases(sh)[0], aj_sm80_bases(sh)[1]);
      pre.next();
      ++issued;
    }
    aj_cp_async_commit();
    aj_cp_async_wait<AJ_STAGES - 1>();
    aj_syncthreads();
    if (busy) {
      const AjTile t = aj_sm80_issued(sh, stage);
      float s[AJ_ROW_GROUPS][AJ_TILE_K / 8][4];
      aj_sm80_scores(s, qf, q_frag, sh.k + stage * AJ_TILE_K * AJ_DP, k_row, k_col);
      softmax(s, t);
      aj_sm80_pv(acc, s, sh.v + stage * AJ_TILE_K * AJ_DVP, v_row, v_col);
    }
    aj_syncthreads();  // this stage is overwritten by a later prefetch
  }
#endif
  aj_cp_async_wait<0>();

  // Epilogue: O = acc / l (scaled) and the LSE. O goes through shared memory so that its stores are
  // 16 bytes wide; every stage is free (the loop ends on a barrier, no copy is in flight). With two
  // row groups and 64 or more keys a tile the item is read again here: its fields held across the
  // loop cost registers the accumulators need (ptxas spilled in the softmax at head dim 128; with
  // 32-key tiles the reread makes it spill instead, so those keep them: docs/performance.md).
  aj_elem* o_tile = (aj_elem*)aj_smem;  // [AJ_TILE_Q][AJ_DVP]
  const AjItem out = AJ_ROW_GROUPS > 1 && AJ_TILE_K >= 64 ? p.items[aj_block_idx_x()] : item;
#pragma unroll
  for (int gi = 0; gi < AJ_ROW_GROUPS; ++gi)
    aj_tc_stage_rows(p, out, b, warp_row + gi * 16 + g, quad, acc[gi], m[gi], l[gi], o_tile);
  aj_syncthreads();
  aj_elem* ob = (aj_elem*)p.o + b * p.o_batch_stride + out.head * p.o_head_stride;
  aj_store_tile_rows<AJ_TILE_Q, AJ_HEAD_DIM_V, AJ_DVP>(ob, p.o_row_stride, out.rows_start, out.rows_stride,
                                                       out.rows_count, o_tile);
}
