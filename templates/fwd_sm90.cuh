// The Hopper forward kernel (sm_90a), first form: warpgroup MMA. Each warpgroup (4 warps) owns 64
// query rows of the tile; S = Q K^T is one wgmma per 16 columns of the head dim with both operands
// in shared memory, O += P V one wgmma per 16 keys with P in registers (the accumulator layout of
// S is the A-fragment layout, as on sm_80) and V in shared memory read N-major. Every shared tile
// is stored as the wgmma's canonical 128-byte-swizzle layout: 64-element column blocks of the head
// dim, each [rows][128 bytes] with row r's 16-byte chunk c at (c ^ r % 8). K/V tiles stream through
// AJ_STAGES stages with cp.async exactly as on sm_80 (fwd_sm80.cuh, included before this file,
// brings the loads' row maps, the mask and the online softmax, which the wgmma's register layout
// lets this kernel share); the rows a tile loads come through the plan's row maps, so dilated rows
// are gathered by the loads.
//
// The softmax of one tile overlaps the tensor cores' work on its neighbours (FlashAttention-3,
// section 3.2, within one warpgroup): iteration j issues S(j+1) = Q K(j+1)^T and O += P(j) V(j)
// back to back, waits for the first only, runs the mask and the softmax of S(j+1) while P(j) V(j)
// is still in flight, then waits for it and rescales O. K therefore runs one tile ahead of V: they
// stream through separate rings of AJ_STAGES stages, K(j + AJ_STAGES) and V(j + AJ_STAGES - 1)
// prefetched at iteration j, each its own cp.async group. TMA loads by a producer warpgroup are
// fwd_sm90_tma.cuh's, which runs this loop.
//
// AJ_TILE_Q is 64 per warpgroup (AJ_WARPS = AJ_TILE_Q / 16), AJ_TILE_K the wgmma N of S (64 or
// 128), AJ_HEAD_DIM_V the wgmma N of O (64, 128 or 256); codegen checks these.

#define AJ_WG_ROWS 64
#define AJ_SW 128                     // swizzle width, bytes: one row of a column block
#define AJ_COLS (AJ_SW / 2)           // elements per column block
#if AJ_TILE_Q % AJ_WG_ROWS || AJ_WARPS * 16 != AJ_TILE_Q || AJ_HEAD_DIM % AJ_COLS || AJ_HEAD_DIM_V % AJ_COLS
#error "the sm_90a forward needs 64 query rows per warpgroup and head dims that are multiples of 64"
#endif
#define AJ_WGMMA_TYPE (AJ_DTYPE == 2 ? AJ_WGMMA_BF16 : AJ_WGMMA_F16)

// Rows first + r * stride (r < count) of a [.., D] tensor into a swizzled [D / 64][ROWS][64] tile
// at `dst` (1024-byte aligned); rows past `count` are zero-filled (their keys are masked, and a
// zero V row keeps 0 * V finite). Each thread copies one 16-byte chunk column of every STEP-th row.
template <int ROWS, int D, int THREADS = AJ_THREADS>
__device__ __forceinline__ void aj_sm90_load_rows(unsigned char* dst, const aj_elem* base, aj_i64 row_stride, aj_i64 first,
                                                  aj_i64 stride, int count) {
  constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
  static_assert(THREADS % CHUNKS == 0, "a thread copies one chunk column");
  constexpr int STEP = THREADS / CHUNKS;
  constexpr int TRIPS = (ROWS + STEP - 1) / STEP;
  const int r0 = aj_thread_idx() / CHUNKS, c = aj_thread_idx() % CHUNKS;
  const int block = c / 8, chunk = c % 8;
  const aj_i64 step = stride * row_stride * STEP;
  const aj_elem* src = base + (first + (aj_i64)r0 * stride) * row_stride + c * 8;
  unsigned char* to = dst + block * ROWS * AJ_SW;
#pragma unroll
  for (int i = 0; i < TRIPS; ++i) {
    const int r = r0 + i * STEP;
    if (ROWS % STEP == 0 || r < ROWS)
      aj_cp_async16(to + r * AJ_SW + ((chunk ^ (r & 7)) << 4), src, r < count);
    src += step;
  }
}

struct AjSm90Shared {
  unsigned char* q;  // [AJ_HEAD_DIM / 64][AJ_TILE_Q][128 B]
  unsigned char* k;  // [AJ_STAGES][AJ_HEAD_DIM / 64][AJ_TILE_K][128 B]
  unsigned char* v;  // [AJ_STAGES][AJ_HEAD_DIM_V / 64][AJ_TILE_K][128 B]
};
#define AJ_SM90_K_STAGE (AJ_HEAD_DIM * AJ_TILE_K * 2)
#define AJ_SM90_V_STAGE (AJ_HEAD_DIM_V * AJ_TILE_K * 2)
#define AJ_SM90_AHEAD (2 * (AJ_STAGES - 1))  // cp.async groups committed after the ones a tile waits for

// K (or V) rows of tile `t` into stage `stage` of its ring.
template <bool IS_K>
__device__ __forceinline__ void aj_sm90_load(const AjParams& p, const AjSm90Shared& sh, int stage, const AjTile& t, aj_i64 b,
                                             int kvh) {
  if (IS_K) {
    const aj_elem* kb = (const aj_elem*)p.k + b * p.k_batch_stride + kvh * p.k_head_stride;
    aj_sm90_load_rows<AJ_TILE_K, AJ_HEAD_DIM>(sh.k + stage * AJ_SM90_K_STAGE, kb, p.k_row_stride, t.first, t.stride, t.count);
  } else {
    const aj_elem* vb = (const aj_elem*)p.v + b * p.v_batch_stride + kvh * p.v_head_stride;
    aj_sm90_load_rows<AJ_TILE_K, AJ_HEAD_DIM_V>(sh.v + stage * AJ_SM90_V_STAGE, vb, p.v_row_stride, t.first, t.stride, t.count);
  }
}

// The next tile of a ring's cursor into its stage (if any tile is left), then its cp.async group.
template <bool IS_K>
__device__ __forceinline__ void aj_sm90_prefetch(const AjParams& p, const AjSm90Shared& sh, AjTileCursor& c, int index,
                                                 aj_i64 b, int kvh) {
  if (!c.done()) {
    aj_sm90_load<IS_K>(p, sh, index % AJ_STAGES, c.tile(), b, kvh);
    c.next();
  }
  aj_cp_async_commit();
}

// The copies this thread waited for are read by wgmma (the async proxy) after the barrier that follows.
template <int N>
__device__ __forceinline__ void aj_sm90_wait_tiles() {
  aj_cp_async_wait<N>();
  aj_fence_proxy_async();
  aj_syncthreads();
}

// S = Q K^T for the warpgroup's 64 rows and one K stage: one wgmma per 16 columns of the head dim,
// K-major operands; a step inside a column block moves the start address 32 bytes (the swizzle
// follows the address). Issued and committed, not waited for.
__device__ __forceinline__ void aj_sm90_issue_s(float (&s)[AJ_TILE_K / 8][4], aj_u64 q_desc, aj_u64 k_desc) {
  aj_wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < AJ_HEAD_DIM / 16; ++ks) {
    const aj_u64 da = q_desc + (((ks / 4) * AJ_TILE_Q * AJ_SW + (ks % 4) * 32) >> 4);
    const aj_u64 db = k_desc + (((ks / 4) * AJ_TILE_K * AJ_SW + (ks % 4) * 32) >> 4);
    aj_wgmma_ss<AJ_TILE_K, AJ_WGMMA_TYPE, 0>(*(float(*)[AJ_TILE_K / 2]) & s[0][0], da, db, ks > 0);
  }
  aj_wgmma_commit();
}

// O += P V for one V stage: P from registers (the accumulator layout of S is the A-fragment layout,
// as on sm_80), V N-major (its rows are keys, the head dim contiguous): the 64-column blocks of V
// lie LBO apart, 8-key groups SBO apart. Issued and committed, not waited for.
__device__ __forceinline__ void aj_sm90_issue_pv(float (&acc)[AJ_HEAD_DIM_V / 8][4], const aj_u32 (&pa)[AJ_TILE_K / 16][4],
                                                 aj_u64 v_desc) {
  aj_wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < AJ_TILE_K / 16; ++kk)
    aj_wgmma_rs<AJ_HEAD_DIM_V, AJ_WGMMA_TYPE, 1>(*(float(*)[AJ_HEAD_DIM_V / 2]) & acc[0][0], pa[kk], v_desc + ((kk * 16 * AJ_SW) >> 4),
                                                 true);
  aj_wgmma_commit();
}

// P in the input type, as the A operand of P V (the registers of a wgmma in flight must not change
// before it is waited for, so the loop packs the next P only after waiting for the last P V). Any
// accumulator of COLS columns packs so (the backward's P^T and dS^T): the accumulator layout of
// wgmma (and of mma.sync) is the A-fragment layout.
template <int COLS = AJ_TILE_K>
__device__ __forceinline__ void aj_sm90_pack(const float (&s)[COLS / 8][4], aj_u32 (&pa)[COLS / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < COLS / 16; ++kk) {
    pa[kk][0] = aj_pack2(s[2 * kk][0], s[2 * kk][1]);
    pa[kk][1] = aj_pack2(s[2 * kk][2], s[2 * kk][3]);
    pa[kk][2] = aj_pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[kk][3] = aj_pack2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// A consumer warpgroup's view of its work item: where this thread's rows sit for the mask, and
// the descriptors of the first stages (a descriptor's low 14 bits are the start address in 16-byte
// units, so an operand further on is the same descriptor plus its offset / 16: no carry, shared
// addresses stay below 2^18).
struct AjSm90Consumer {
  aj_i64 k_origin, qpos, q_step8;
  aj_u64 q_desc, k_desc, v_desc;
};
__device__ __forceinline__ AjSm90Consumer aj_sm90_consumer(const AjParams& p, const AjItem& item, const AjSm90Shared& sh,
                                                           int wg_row, int row) {
  AjSm90Consumer w;
  const aj_i64 doc = aj_doc_start(p, item.rows_start);
  w.k_origin = p.k_offset - doc;
  w.qpos = p.q_offset - doc + item.rows_start + (aj_i64)row * item.rows_stride;
  w.q_step8 = 8 * item.rows_stride;
  w.q_desc = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.q) + wg_row * AJ_SW, 16, 8 * AJ_SW);
  w.k_desc = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.k), 16, 8 * AJ_SW);
  w.v_desc = aj_wgmma_desc<AJ_SW>(aj_smem_addr(sh.v), AJ_TILE_K * AJ_SW, 8 * AJ_SW);
  return w;
}

// What a kernel does around a step's wgmmas: nothing, in this file's kernel; the TMA kernel
// (fwd_sm90_tma.cuh) takes turns between its warpgroups and releases stages.
struct AjSm90NoHooks {
  __device__ void turn() const {}     // before issuing: wait for this warpgroup's turn
  __device__ void pass() const {}     // after issuing: the other warpgroup's turn
  __device__ void s_read() const {}   // S(j + 1)'s wgmma is done: K(j + 1)'s stage is no longer read
  __device__ void issued() const {}   // after passing: free time while S(j + 1)'s wgmma runs
  __device__ void pv_read() const {}  // P(j) V(j)'s is done: V(j)'s stage, O and P's registers are free
};

// One overlapped step of a busy warpgroup: S(j + 1) = Q K(j + 1)^T and O += P(j) V(j) issued back
// to back; S(j + 1)'s mask and softmax while P(j) V(j) may still run; then O rescaled and P(j + 1)
// packed. One straight line, as every wgmma path must be: ptxas serialises every wgmma of the
// kernel when a path it cannot rule out reads an accumulator in flight (C7514; a lit test keeps the
// log free of it).
template <typename Hooks>
__device__ __forceinline__ void aj_sm90_step(float (&s)[AJ_TILE_K / 8][4], float (&acc)[AJ_HEAD_DIM_V / 8][4],
                                             aj_u32 (&pa)[AJ_TILE_K / 16][4], float (&m)[2], float (&l)[2], float (&c)[2],
                                             aj_u64 q_desc, aj_u64 k_desc, aj_u64 v_desc, const AjTile& t, const AjParams& p,
                                             int head, aj_i64 qpos, aj_i64 q_step8, aj_i64 k_origin, int quad, const Hooks& hooks) {
  hooks.turn();
  aj_sm90_issue_s(s, q_desc, k_desc);
  aj_sm90_issue_pv(acc, pa, v_desc);
  hooks.pass();
  hooks.issued();
  aj_wgmma_wait<1>();  // S(j + 1) is done; P(j) V(j) may still run
  hooks.s_read();
  // The softmax sits in both arms of the mask's branch so that the wait below stays after it:
  // ptxas schedules a wgmma wait at the top of its basic block, and with the softmax in the same
  // block as the wait the exponentials would run only once P(j) V(j) had finished, which is the
  // overlap lost (bench/sass_mainloop.py --min-overlap checks the SASS; a lit test keeps it).
  if (!(t.full && t.count == AJ_TILE_K)) {
    aj_sm80_mask(s, p, t, head, qpos, q_step8, k_origin, quad);
    aj_tc_softmax_scores(s, m, l, c, p.scale_log2);
  } else {
    aj_tc_softmax_scores(s, m, l, c, p.scale_log2);
  }
  aj_wgmma_wait<0>();  // P(j) V(j) is done
  hooks.pv_read();
  aj_tc_rescale(acc, c);
  aj_tc_weigh(s, l, p, t, quad);  // P(j)'s registers are free: the extras' loads fit beside S
  aj_sm90_pack(s, pa);
}

__device__ __forceinline__ void aj_fwd_sm90(const AjParams& p) {
  AJ_DYNAMIC_SHARED(aj_smem);
  // The swizzle is a function of the shared address: tiles start on a 1024-byte boundary.
  unsigned char* const smem = aj_smem + ((1024 - aj_smem_addr(aj_smem) % 1024) % 1024);
  AjSm90Shared sh;
  sh.q = smem;
  sh.k = sh.q + AJ_TILE_Q * AJ_HEAD_DIM * 2;
  sh.v = sh.k + AJ_STAGES * AJ_SM90_K_STAGE;

  const AjItem item = p.items[aj_block_idx_x()];
  const aj_i64 b = aj_batch_index();
  if (b >= p.batch) return;
  // The warpgroup's index, warp-uniform to ptxas: its descriptors then live in uniform registers.
  const int wg = aj_warp_uniform(aj_thread_idx() / 128), warp = (aj_thread_idx() / 32) % 4, lane = aj_thread_idx() % 32;
  const int g = lane / 4, quad = lane % 4;
  const int kvh = item.head / p.heads_per_kv;
  const int wg_row = wg * AJ_WG_ROWS;  // this warpgroup's first row in the tile
  const int warp_row = wg_row + warp * 16;
  // A warpgroup whose rows all lie past the item's end computes nothing (wgmma is warpgroup-wide,
  // so the test is too); it still copies its share of every tile and meets every barrier.
  const bool busy = wg_row < item.rows_count;

  // Cursors: `cur` the tile whose S the loop computes next, `kpre` / `vpre` the next K / V to load.
  AjTileCursor cur, kpre, vpre;
  cur.begin(p, item);
  kpre.begin(p, item);
  vpre.begin(p, item);
  const bool any = !cur.done();
  // Prologue: Q with K(0), then K(i + 1) and V(i) for i < AJ_STAGES - 1, each its own group (the
  // order of the loop's commits, so one wait count serves both).
  const aj_elem* qb = (const aj_elem*)p.q + b * p.q_batch_stride + item.head * p.q_head_stride;
  if (any) aj_sm90_load_rows<AJ_TILE_Q, AJ_HEAD_DIM>(sh.q, qb, p.q_row_stride, item.rows_start, item.rows_stride, item.rows_count);
  aj_sm90_prefetch<true>(p, sh, kpre, 0, b, kvh);
#pragma unroll
  for (int i = 0; i < AJ_STAGES - 1; ++i) {
    aj_sm90_prefetch<true>(p, sh, kpre, i + 1, b, kvh);
    aj_sm90_prefetch<false>(p, sh, vpre, i, b, kvh);
  }

  const AjSm90Consumer w = aj_sm90_consumer(p, item, sh, wg_row, warp_row + g);
  const aj_i64 k_origin = w.k_origin, qpos = w.qpos, q_step8 = w.q_step8;
  const aj_u64 q_desc = w.q_desc, k_desc = w.k_desc, v_desc = w.v_desc;
  float acc[AJ_HEAD_DIM_V / 8][4];
  float m[2] = {AJ_NEG_INF, AJ_NEG_INF}, l[2] = {0.0f, 0.0f}, c[2];
#pragma unroll
  for (int j = 0; j < AJ_HEAD_DIM_V / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  // S(0) and its softmax, then a barrier: K(0)'s stage is the loop's first prefetch target.
  float s[AJ_TILE_K / 8][4];
  aj_u32 pa[AJ_TILE_K / 16][4];
  aj_sm90_wait_tiles<AJ_SM90_AHEAD>();
  if (any && busy) {
    const AjTile t = cur.tile();
    aj_sm90_issue_s(s, q_desc, k_desc);
    aj_wgmma_wait<0>();
    if (!(t.full && t.count == AJ_TILE_K)) aj_sm80_mask(s, p, t, item.head, qpos, q_step8, k_origin, quad);
    aj_tc_softmax_scores(s, m, l, c, p.scale_log2);  // O is still zero: no rescaling
    aj_tc_weigh(s, l, p, t, quad);
    aj_sm90_pack(s, pa);
  }
  aj_syncthreads();

  for (int j = 0; !cur.done(); ++j) {
    cur.next();  // now the tile j + 1 (done: none)
    aj_sm90_prefetch<true>(p, sh, kpre, j + AJ_STAGES, b, kvh);
    aj_sm90_prefetch<false>(p, sh, vpre, j + AJ_STAGES - 1, b, kvh);
    aj_sm90_wait_tiles<AJ_SM90_AHEAD>();  // K(j + 1) and V(j) have landed
    if (busy) {
      // One branch per case, each issuing, waiting and reading in straight-line order (C7514).
      const aj_u64 vj = v_desc + (j % AJ_STAGES) * (AJ_SM90_V_STAGE >> 4);
      if (!cur.done()) {
        aj_sm90_step(s, acc, pa, m, l, c, q_desc, k_desc + ((j + 1) % AJ_STAGES) * (AJ_SM90_K_STAGE >> 4), vj, cur.tile(), p,
                     item.head, qpos, q_step8, k_origin, quad, AjSm90NoHooks());
      } else {
        aj_sm90_issue_pv(acc, pa, vj);  // the last tile
        aj_wgmma_wait<0>();
      }
    }
    aj_syncthreads();  // K(j + 1)'s and V(j)'s stages are overwritten by later prefetches
  }
  aj_cp_async_wait<0>();

  aj_tc_store_rows(p, item, b, warp_row + g, quad, acc, m, l);  // the epilogue, as on sm_80
}
