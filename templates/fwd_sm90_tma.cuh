// The Hopper forward kernel (sm_90a) with TMA and a producer warp (FlashAttention-3, section 3.1):
// the block's consumer warpgroups (one per 64 query rows) run exactly the loop of fwd_sm90.cuh
// (wgmma S = Q K^T and O += P V, the softmax of one tile overlapping P V of the one before), and
// one more warpgroup produces: its first thread loads every K and V tile with cp.async.bulk.tensor into
// the rings of AJ_STAGES stages, each completing on the stage's "full" mbarrier; the consumers
// wait on it, and release the stage by arriving on its "empty" mbarrier (K as soon as S's wgmma
// has read it, V after P V). No block barrier runs in the loop, and the consumers issue no loads.
//
// Dilation stays addressing: a key tile's rows are first + i * stride (i < AJ_TILE_K), which the
// tensor map for that stride describes (runtime/cuda/tma_maps.cpp makes one per key stride of the plan,
// at most AJ_TMA_MAPS). Up to stride 8 the map traverses the rows with that element stride, and a
// box brings `rows` of them (stride x rows <= 256): dimensions head dim (64 elements a box, one
// 128-byte swizzled column block), kv head, row, batch. Beyond 8 the rows are folded by f (a
// divisor of the stride and of the key length, stride / f <= 8): dimensions head dim, kv head,
// first % f, row / f traversed with element stride stride / f, batch; where no such f exists, the
// runtime runs fwd_sm90.cuh's cp.async kernel.
// Rows past the tensor's end read zero; rows past the span's count read their true values and
// are masked.
//
// The producer loads Q too, first of an item's tiles, by TMA through maps per query-row stride
// (the items' rows first + i * stride, i < AJ_TILE_Q, the same rules as the keys'), into one of
// AJ_Q_BUFFERS buffers: its "full" mbarrier completes when Q has landed, and the consumers arrive
// on its "empty" one once the item's last S = Q K^T has been waited for. Rows past the item's count
// read their true values (past the tensor's end, zero): a row of the forward is computed from its
// own Q row alone, and the epilogue stores only the item's rows. The epilogue is fwd_sm80.cuh's.
// Persistent blocks (AJ_PERSISTENT, below) take several items each, the rings running on from one
// to the next, and with two Q buffers the next item's Q lands while this item's loop runs.
//
// Two or three consumer warpgroups take turns at the tensor cores (FlashAttention-3's ping-pong):
// each issues a step's wgmmas only after the one before it has issued its own (named barrier
// 1 + w is warpgroup w's turn; warpgroup w hands over to w + 1, the last to 0), so one's softmax
// runs while the others' GEMMs do. The last warpgroup lets warpgroup 0 go first and skips its
// last handoff, so every barrier round has exactly its 256 threads.
//
// Registers: with two consumer warpgroups, 12 warps get 168 registers each at launch (the
// register file is split among the SM's four schedulers); the producer gives back all but 24 and
// the consumers take 240 (setmaxnreg; FlashAttention-3's split; 56 and 224 in a kernel that
// seeks, below). With three (192-row tiles, head dims up to 64: FlashAttention-3's tile there),
// 16 warps get 128 each: the producer keeps 32 and the consumers take 160 (56 and 152 where the
// kernel seeks). With one consumer warpgroup every warp has 255 from the start.

#define AJ_CONSUMERS (AJ_WARPS * 32)
#define AJ_CONSUMER_WGS (AJ_WARPS / 4)
#if AJ_CONSUMER_WGS > 3
#error "the TMA kernel runs at most three consumer warpgroups"
#endif
// A kernel that seeks through a layout (AJ_KERNEL_SEEK: random layouts or a device table decided
// in the kernel) walks it in the producer's thread too, and at 24 registers its hashing spilled
// (320-360 bytes of stores at head dims 64-256); there the producer keeps 56 and the consumers
// take 224 (16-24 bytes at head dims 64 and 128). 2 x 224 + 56 = 2 x 240 + 24 = 504, the 3 x 168
// the launch gave each thread of a consumer warpgroup pair and the producer; with three
// consumer warpgroups 3 x 152 + 56 = 3 x 160 + 32 = 512 = 4 x 128.
#ifdef AJ_KERNEL_SEEK
#define AJ_PRODUCER_REGS 56
#define AJ_CONSUMER_REGS (AJ_CONSUMER_WGS == 3 ? 152 : 224)
#else
#define AJ_PRODUCER_REGS (AJ_CONSUMER_WGS == 3 ? 32 : 24)
#define AJ_CONSUMER_REGS (AJ_CONSUMER_WGS == 3 ? 160 : 240)
#endif
// What the launch gives each thread (the register file over the block's threads, in steps of 8),
// which the warpgroups' setmaxnreg may only redistribute: a consumer that asked for more would
// wait for registers nobody frees (the emulator does not model registers, so this is checked here).
#define AJ_LAUNCH_REGS (65536 / (AJ_CONSUMERS + 128) / 8 * 8)
#if AJ_CONSUMER_WGS > 1 && AJ_CONSUMER_WGS * AJ_CONSUMER_REGS + AJ_PRODUCER_REGS > (AJ_CONSUMER_WGS + 1) * AJ_LAUNCH_REGS
#error "setmaxnreg: the consumer warpgroups take more registers than the launch and the producer leave"
#endif

// How a set of maps reads rows, map by map.
struct AjTmaRows {
  aj_i64 stride[AJ_TMA_MAPS];  // the row stride the map serves (0: unused)
  int rows[AJ_TMA_MAPS];       // dilated rows per box
  int fold[AJ_TMA_MAPS];       // 0: the plain rows (stride <= 8); else the rows folded by it
};
// The forward's K and V maps, one pair per key stride of the plan, and its Q maps, one per query-row
// stride of the plan's items; the backward's TMA kernel (bwd_sm90_tma.cuh) holds Q's maps in k and
// dO's in v, one pair per query stride, and no q.
struct AjTmaMaps {
  aj_tensor_map k[AJ_TMA_MAPS];
  aj_tensor_map v[AJ_TMA_MAPS];
  AjTmaRows kv;
  aj_tensor_map q[AJ_TMA_MAPS];
  AjTmaRows qr;
};
// The forward kernel's parameter: K's, V's and Q's maps, and where the kernel stages O (below)
// O's, one per query-row stride of the plan's items, boxes of at most a warpgroup's 64 rows.
struct AjFwdTmaMaps {
  AjTmaMaps in;
#ifdef AJ_O_STAGED
  aj_tensor_map o[AJ_TMA_MAPS];
  AjTmaRows orows;
#endif
};
// The host's TmaMaps and TmaForwardMaps (runtime/cuda/tma_maps.hpp), byte for byte.
static_assert(AJ_TMA_MAPS != 8 || sizeof(AjTmaMaps) == 3328, "kernel ABI: AjTmaMaps changed size");
#ifdef AJ_O_STAGED
static_assert(AJ_TMA_MAPS != 8 || sizeof(AjFwdTmaMaps) == 4480, "kernel ABI: AjFwdTmaMaps changed size");
#endif
#define AJ_MAPS_K 0  // which of a AjTmaMaps' sets aj_tma_rows reads through
#define AJ_MAPS_V 1
#define AJ_MAPS_Q 2

// The TMA kernel's step hooks: turns between the consumer warpgroups (with one, none), the stages'
// releases, and the consumers' walk through the plan a tile ahead: once a step's wgmmas are issued,
// the cursor moves from tile j + 1 (the step's) to j + 2 and reads it, so the plan tables' loads
// (dependent, a few per tile) wait while S(j + 1) runs instead of before the next issue. A kernel
// that seeks keeps its larger cursor walking at the top of the loop (ahead, it spilled 422 bytes
// where it spills 220 at head dim 128).
#ifdef AJ_KERNEL_SEEK
#define AJ_SM90_LOOKAHEAD 0
#else
#define AJ_SM90_LOOKAHEAD 1
#endif
struct AjSm90TmaHooks {
  aj_u64* k_empty;
  aj_u64* v_empty;
  AjTileCursor* cur;  // at the step's tile; moved on by issued()
  AjTile* next;       // the tile after it, where there is one
  bool* more;         // whether there is
  int sk, sv, wg;
  bool last;  // the warpgroup's last issue: the last warpgroup does not hand over
  __device__ void turn() const {
    if (AJ_CONSUMER_WGS > 1) aj_named_sync(1 + wg, 256);
  }
  __device__ void pass() const {
    // The next warpgroup's barrier (with two, 2 - wg: the same barrier, and the same SASS as the
    // two-warpgroup kernel timed on the H200 before three were possible).
    const int to = AJ_CONSUMER_WGS == 2 ? 2 - wg : 1 + (wg + 1) % AJ_CONSUMER_WGS;
    if (AJ_CONSUMER_WGS > 1 && !(wg == AJ_CONSUMER_WGS - 1 && last)) aj_named_arrive(to, 256);
  }
  __device__ void advance() const {
    cur->next();
    *more = !cur->done();
    if (*more) *next = cur->tile();
  }
  __device__ void issued() const {
    if (AJ_SM90_LOOKAHEAD) advance();
  }
  __device__ void s_read() const { aj_mbarrier_arrive(&k_empty[sk]); }
  __device__ void pv_read() const { aj_mbarrier_arrive(&v_empty[sv]); }
};

// The boxes that cover ROWS dilated rows (first + i * stride) of one head of a [B, S, H, D] tensor
// in a swizzled [D / 64][BLOCK_ROWS][128 B] tile, through the map of that stride among `maps`
// (their rows per box and folds in `table`): box(map, byte offset in the tile, coordinates) for
// each 64-column block and `rows` rows, the coordinates of the rank-4 map (head dim, head, row,
// batch) or, for a stride folded by f, of the rank-5 one (head dim, head, row mod f, row / f,
// batch).
template <int ROWS, int D, int BLOCK_ROWS, typename Box4, typename Box5>
__device__ __forceinline__ void aj_tma_boxes(const aj_tensor_map* maps, const AjTmaRows& table, aj_i64 first, aj_i64 stride,
                                             int head, int b, const Box4& box4, const Box5& box5) {
  int mi = 0;
#pragma unroll
  for (int i = 1; i < AJ_TMA_MAPS; ++i)
    if (table.stride[i] == stride) mi = i;
  const aj_tensor_map& map = maps[mi];
  const int rows = table.rows[mi], fold = table.fold[mi];
  constexpr int BLOCKS = D / AJ_COLS;
  if (fold == 0) {
#pragma unroll
    for (int cb = 0; cb < BLOCKS; ++cb)
      for (int r0 = 0; r0 < ROWS; r0 += rows)
        box4(map, (cb * BLOCK_ROWS + r0) * AJ_SW, cb * AJ_COLS, head, (int)(first + r0 * stride), b);
  } else {
    const int residue = (int)(first % fold), row = (int)(first / fold), step = (int)(stride / fold);
#pragma unroll
    for (int cb = 0; cb < BLOCKS; ++cb)
      for (int r0 = 0; r0 < ROWS; r0 += rows)
        box5(map, (cb * BLOCK_ROWS + r0) * AJ_SW, cb * AJ_COLS, head, residue, row + r0 * step, b);
  }
}

// ROWS dilated rows of one head of a [B, S, H, D] tensor into a swizzled [D / 64][ROWS][128 B]
// tile at `dst`, through the map of that stride in set SET (AJ_MAPS_K: K, or the backward's Q;
// AJ_MAPS_V: V, or dO; AJ_MAPS_Q: the forward's Q), all completing on `bar`.
template <int ROWS, int D, int SET>
__device__ __forceinline__ void aj_tma_rows(const AjTmaMaps& maps, unsigned char* dst, aj_u64* bar, aj_i64 first, aj_i64 stride,
                                            int head, int b) {
  aj_tma_boxes<ROWS, D, ROWS>(
      SET == AJ_MAPS_K ? maps.k : SET == AJ_MAPS_V ? maps.v : maps.q, SET == AJ_MAPS_Q ? maps.qr : maps.kv, first, stride, head, b,
      [&](const aj_tensor_map& map, int at, int c0, int c1, int c2, int c3) { aj_tma_load_4d(dst + at, map, bar, c0, c1, c2, c3); },
      [&](const aj_tensor_map& map, int at, int c0, int c1, int c2, int c3, int c4) {
        aj_tma_load_5d(dst + at, map, bar, c0, c1, c2, c3, c4);
      });
}

// One K (or V) tile of the forward.
template <bool IS_K>
__device__ __forceinline__ void aj_sm90_tma_tile(const AjTmaMaps& maps, unsigned char* dst, aj_u64* bar, const AjTile& t, int kvh,
                                                 int b) {
  aj_tma_rows<AJ_TILE_K, IS_K ? AJ_HEAD_DIM : AJ_HEAD_DIM_V, IS_K ? AJ_MAPS_K : AJ_MAPS_V>(maps, dst, bar, t.first, t.stride, kvh, b);
}

// The block's shared memory: the Q buffers, the K and V rings, O's staging tile (AJ_O_STAGED:
// [AJ_HEAD_DIM_V / 64][AJ_TILE_Q][128 B], swizzled as Q's), then the rings' full and empty
// mbarriers, then Q's. sh.q is buffer 0.
#ifndef AJ_Q_BUFFERS
#define AJ_Q_BUFFERS 1
#endif
#define AJ_SM90_Q_TILE (AJ_TILE_Q * AJ_HEAD_DIM * 2)
#ifdef AJ_O_STAGED
#define AJ_SM90_O_TILE (AJ_TILE_Q * AJ_HEAD_DIM_V * 2)
#else
#define AJ_SM90_O_TILE 0
#endif
struct AjSm90TmaRings {
  AjSm90Shared sh;
  unsigned char* o;
  aj_u64 *k_full, *k_empty, *v_full, *v_empty, *q_full, *q_empty;
};
__device__ __forceinline__ AjSm90TmaRings aj_sm90_tma_rings(unsigned char* smem) {
  AjSm90TmaRings r;
  r.sh.q = smem;
  r.sh.k = r.sh.q + AJ_Q_BUFFERS * AJ_SM90_Q_TILE;
  r.sh.v = r.sh.k + AJ_STAGES * AJ_SM90_K_STAGE;
  r.o = r.sh.v + AJ_STAGES * AJ_SM90_V_STAGE;
  r.k_full = (aj_u64*)(r.o + AJ_SM90_O_TILE);
  r.k_empty = r.k_full + AJ_STAGES;
  r.v_full = r.k_full + 2 * AJ_STAGES;
  r.v_empty = r.k_full + 3 * AJ_STAGES;
  r.q_full = r.k_full + 4 * AJ_STAGES;
  r.q_empty = r.q_full + AJ_Q_BUFFERS;
  return r;
}

// The block's n-th K/V tile (counted from 0 across a persistent block's items): its stage, and
// the parity of the phase its load completes (the stage's use n / AJ_STAGES). Unsigned: no sign
// handling in the division.
__device__ __forceinline__ int aj_ring_stage(aj_u32 n) { return (int)(n % AJ_STAGES); }
__device__ __forceinline__ aj_u32 aj_ring_parity(aj_u32 n) { return (n / AJ_STAGES) & 1; }

// A block's place in its rings before a work item: the K/V tiles it loaded (a persistent block's
// rings run on across its items: tile n takes stage n % AJ_STAGES in its use n / AJ_STAGES) and
// the items with tiles (the n-th takes Q buffer n % AJ_Q_BUFFERS in its use n / AJ_Q_BUFFERS; an
// item without tiles loads no Q). Unsigned: no sign handling in the divisions.
struct AjTmaCount {
  aj_u32 tiles, items;
};
__device__ __forceinline__ AjTmaCount aj_tma_count_after(AjTmaCount c, aj_u32 tiles) {
  return AjTmaCount{c.tiles + tiles, c.items + (tiles != 0)};
}

// The producer's thread: one work item's Q, then every K and V tile of it, into the buffers and
// rings; returns the count after the item.
__device__ __forceinline__ AjTmaCount aj_sm90_tma_produce(const AjParams& p, const AjTmaMaps& maps, const AjSm90TmaRings& r,
                                                          const AjItem& item, aj_i64 b, AjTmaCount c) {
  const int kvh = item.head / p.heads_per_kv;
  AjTileCursor pre;
  pre.begin(p, item);
  if (pre.done()) return c;  // no tiles: the consumers read no Q
  {
    const int qb = (int)(c.items % AJ_Q_BUFFERS);
    const aj_u32 use = c.items / AJ_Q_BUFFERS;
    // A buffer's use u waits for the consumers' release of its use u - 1 (phase u - 1).
    if (use > 0) aj_mbarrier_wait(&r.q_empty[qb], (use - 1) & 1);
    aj_mbarrier_arrive_expect_tx(&r.q_full[qb], AJ_SM90_Q_TILE);
    aj_tma_rows<AJ_TILE_Q, AJ_HEAD_DIM, AJ_MAPS_Q>(maps, r.sh.q + qb * AJ_SM90_Q_TILE, &r.q_full[qb], item.rows_start,
                                                   item.rows_stride, item.head, (int)b);
  }
  aj_u32 j = c.tiles;
  for (; !pre.done(); ++j, pre.next()) {
    const AjTile t = pre.tile();
    const int s = aj_ring_stage(j);
    const aj_u32 use = j / AJ_STAGES;
    // A stage's use u waits for the consumers' release of its use u - 1 (phase u - 1).
    if (use > 0) aj_mbarrier_wait(&r.k_empty[s], (use - 1) & 1);
    aj_mbarrier_arrive_expect_tx(&r.k_full[s], AJ_SM90_K_STAGE);
    aj_sm90_tma_tile<true>(maps, r.sh.k + s * AJ_SM90_K_STAGE, &r.k_full[s], t, kvh, (int)b);
    if (use > 0) aj_mbarrier_wait(&r.v_empty[s], (use - 1) & 1);
    aj_mbarrier_arrive_expect_tx(&r.v_full[s], AJ_SM90_V_STAGE);
    aj_sm90_tma_tile<false>(maps, r.sh.v + s * AJ_SM90_V_STAGE, &r.v_full[s], t, kvh, (int)b);
  }
  return aj_tma_count_after(c, j - c.tiles);
}

// O staged (AJ_O_STAGED: a persistent kernel where shared memory allows): a warpgroup whose 64
// rows are all the item's writes them, normalised and packed, into its rows of the staging tile
// (swizzled as a TMA load would leave them, so the quads' 4-byte stores meet no bank twice), and
// the lanes of its first warp store them by TMA through the O map of the item's row stride, lane
// k the boxes k, k + 32, ... (one bulk group each). The stores run on while the warpgroup starts
// its next item; those lanes wait for them to have read the tile before the warpgroup writes it
// again (the first barrier), and for every store before the block ends. The boxes are issued by
// a whole warp, not one elected thread: one thread's loop over boxes, inlined or called, took the
// consumers' descriptors out of uniform registers (1114 -> 1232 instructions a tile at head dim
// 128) and spilled. A warpgroup with rows past the item's end stores from registers
// (aj_tc_store_rows).
#ifdef AJ_O_STAGED
#define AJ_O_BARRIER 4  // + the warpgroup: the ping-pong takes barriers 1 to 3
__device__ __forceinline__ void aj_sm90_tma_store_o(const AjParams& p, const AjFwdTmaMaps& maps, const AjSm90TmaRings& r,
                                                    const AjItem& item, aj_i64 b, int wg, int row, int quad,
                                                    float (&acc)[AJ_HEAD_DIM_V / 8][4], float (&m)[2], float (&l)[2]) {
  unsigned char* const o = r.o;
  const bool issuers = aj_warp_uniform(aj_thread_idx() / 32 % 4) == 0;  // the warpgroup's first warp
  if (issuers) aj_bulk_wait_read<0>();  // the last stores have read the staging rows
  aj_named_sync(AJ_O_BARRIER + wg, 128);
  aj_tc_stage_rows_at(p, item, b, row, quad, acc, m, l, [&](int tr, int col) {
    return (aj_u32*)(o + (col / AJ_COLS) * (AJ_TILE_Q * AJ_SW) + tr * AJ_SW + ((((col % AJ_COLS) / 8) ^ (tr % 8)) << 4) + (col % 8) * 2);
  });
  aj_fence_proxy_async();  // the generic stores, then the TMA stores that read them
  aj_named_sync(AJ_O_BARRIER + wg, 128);
  if (issuers) {
    const unsigned char* const src = o + wg * AJ_WG_ROWS * AJ_SW;
    const int lane = aj_thread_idx() % 32;
    int k = 0;
    aj_tma_boxes<AJ_WG_ROWS, AJ_HEAD_DIM_V, AJ_TILE_Q>(
        maps.o, maps.orows, item.rows_start + (aj_i64)(wg * AJ_WG_ROWS) * item.rows_stride, item.rows_stride, item.head, (int)b,
        [&](const aj_tensor_map& map, int at, int c0, int c1, int c2, int c3) {
          if (k++ % 32 == lane) aj_tma_store_4d(map, src + at, c0, c1, c2, c3);
        },
        [&](const aj_tensor_map& map, int at, int c0, int c1, int c2, int c3, int c4) {
          if (k++ % 32 == lane) aj_tma_store_5d(map, src + at, c0, c1, c2, c3, c4);
        });
    aj_bulk_commit();
  }
}
#endif

// A consumer thread's whole work item: the loop over its key tiles (`cur`, begun on the item), Q's
// buffer released once the last tile's S has been read, then the epilogue; returns the count after
// the item.
__device__ __forceinline__ AjTmaCount aj_sm90_tma_consume(const AjParams& p, const AjFwdTmaMaps& maps, const AjSm90TmaRings& r,
                                                          const AjItem& item, aj_i64 b, AjTileCursor cur, AjTmaCount count) {
  const aj_u32 j0 = count.tiles;
  const int qb = (int)(count.items % AJ_Q_BUFFERS);
  AjSm90Shared sh = r.sh;
  sh.q += qb * AJ_SM90_Q_TILE;
  aj_u64* const k_full = r.k_full;
  aj_u64* const v_full = r.v_full;
  const int tid = aj_thread_idx();
  const bool any = !cur.done();
  // The warpgroup's index, warp-uniform to ptxas: its descriptors then live in uniform registers
  // (no conversion before each wgmma).
  const int wg = aj_warp_uniform(tid / 128), warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, quad = lane % 4;
  const int wg_row = wg * AJ_WG_ROWS;
  const int warp_row = wg_row + warp * 16;
  // A warpgroup whose rows all lie past the item's end computes nothing, but waits on and releases
  // every stage with the others (the empty mbarriers count every consumer).
  const bool busy = wg_row < item.rows_count;

  const AjSm90Consumer w = aj_sm90_consumer(p, item, sh, wg_row, warp_row + g);
  const aj_i64 k_origin = w.k_origin, qpos = w.qpos, q_step8 = w.q_step8;
  const aj_u64 q_desc = w.q_desc, k_desc = w.k_desc, v_desc = w.v_desc;
  float acc[AJ_HEAD_DIM_V / 8][4];
  float m[2] = {AJ_NEG_INF, AJ_NEG_INF}, l[2] = {0.0f, 0.0f}, c[2];
#pragma unroll
  for (int j = 0; j < AJ_HEAD_DIM_V / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  float s[AJ_TILE_K / 8][4];
  aj_u32 pa[AJ_TILE_K / 16][4];
  AjTile next{};      // tile j + 1 at the top of iteration j
  bool more = false;  // whether there is one
  const int s0 = aj_ring_stage(j0);
  AjSm90TmaHooks hooks{r.k_empty, r.v_empty, &cur, &next, &more, s0, 0, wg, false};
  int j = 0;  // the item's tiles: j0 + j is the block's count, which picks stages and phases
  if (any) {
    if (AJ_CONSUMER_WGS > 1 && wg == AJ_CONSUMER_WGS - 1) aj_named_arrive(1, 256);  // warpgroup 0 issues first
    aj_mbarrier_wait(&r.q_full[qb], (count.items / AJ_Q_BUFFERS) & 1);
    aj_mbarrier_wait(&k_full[s0], aj_ring_parity(j0));
    if (busy) {
      const AjTile t = cur.tile();
      hooks.turn();
      aj_sm90_issue_s(s, q_desc, k_desc + s0 * (AJ_SM90_K_STAGE >> 4));
      hooks.pass();
      hooks.issued();  // now at tile 1 (with the lookahead)
      aj_wgmma_wait<0>();
      hooks.s_read();
      if (!(t.full && t.count == AJ_TILE_K)) aj_sm80_mask(s, p, t, item.head, qpos, q_step8, k_origin, quad);
      aj_tc_softmax_scores(s, m, l, c, p.scale_log2);
      aj_tc_weigh(s, l, p, t, quad);
      aj_sm90_pack(s, pa);
    } else {
      hooks.turn();
      hooks.pass();
      hooks.issued();
      hooks.s_read();
    }
  }

  for (; any; ++j) {
    if (!AJ_SM90_LOOKAHEAD) hooks.advance();
    // `next` is tile j + 1 (`more`: there is one); the cursor stands on it.
    const int sv = aj_ring_stage(j0 + j);
    const aj_u64 vj = v_desc + sv * (AJ_SM90_V_STAGE >> 4);
    hooks.sv = sv;
    hooks.last = !more;
    // Q's last reader, the last tile's S, has been waited for (in the step before, or the
    // prologue): the buffer goes back to the producer before the last P V and the epilogue, so a
    // persistent block's next Q lands while they run (with one Q buffer it waited for them).
    if (!more) aj_mbarrier_arrive(&r.q_empty[qb]);
    if (more) {
      const int sk = aj_ring_stage(j0 + j + 1);
      const AjTile t = next;
      hooks.sk = sk;
      aj_mbarrier_wait(&k_full[sk], aj_ring_parity(j0 + j + 1));
      aj_mbarrier_wait(&v_full[sv], aj_ring_parity(j0 + j));
      // Straight-line branches, as in fwd_sm90.cuh (C7514). K(j + 1)'s stage is released once
      // S(j + 1) has read it, V(j)'s once P(j) V(j) has (the hooks).
      if (busy) {
        aj_sm90_step(s, acc, pa, m, l, c, q_desc, k_desc + sk * (AJ_SM90_K_STAGE >> 4), vj, t, p, item.head, qpos, q_step8,
                     k_origin, quad, hooks);
      } else {
        hooks.turn();
        hooks.pass();
        hooks.issued();
        hooks.s_read();
        hooks.pv_read();
      }
    } else {
      aj_mbarrier_wait(&v_full[sv], aj_ring_parity(j0 + j));
      hooks.turn();
      if (busy) {
        aj_sm90_issue_pv(acc, pa, vj);  // the last tile
        hooks.pass();
        aj_wgmma_wait<0>();
      } else {
        hooks.pass();
      }
      hooks.pv_read();
      ++j;
      break;
    }
  }

#ifdef AJ_O_STAGED
  if (busy && wg_row + AJ_WG_ROWS <= item.rows_count)  // every row of the warpgroup's is the item's
    aj_sm90_tma_store_o(p, maps, r, item, b, wg, warp_row + g, quad, acc, m, l);
  else
#endif
    aj_tc_store_rows(p, item, b, warp_row + g, quad, acc, m, l);
  return aj_tma_count_after(count, (aj_u32)j);
}

// Persistent blocks (AJ_PERSISTENT): the launch has fewer blocks than work (one per SM), and each
// takes the units u = blockIdx.x, blockIdx.x + gridDim.x, ... of the items x batch entries, unit u
// being item u / batch of batch entry u % batch: a static scheduler over the plan's heaviest-first
// order, so every round of blocks takes the heaviest items left. The producer walks the same
// units and runs on into the next item's Q, K and V while the consumers finish this one (its last
// products, the epilogue), where a block per item would drain its rings and start cold. With two Q
// buffers (codegen gives them where they fit: AJ_Q_BUFFERS) the next item's Q is in place when the
// consumers reach it; with one, its load waits for every consumer's release of this item's, which
// comes after the item's last S, before its last P V and the epilogue. The
// consumers never meet between items: each waits for its item's Q on the buffer's mbarrier, and
// the ping-pong's barriers keep their turns across items (a warpgroup's first turn of an item waits
// for the last warpgroup's first handoff of it, given after it finished the item before).
struct AjFwdUnits {
  aj_i64 first, step, end;  // units first, first + step, ... below end
};
__device__ __forceinline__ AjFwdUnits aj_fwd_units(const AjParams& p) {
  return AjFwdUnits{(aj_i64)aj_block_idx_x(), (aj_i64)aj_grid_dim_x(), (aj_i64)p.num_items * p.batch};
}

__device__ __forceinline__ void aj_fwd_sm90_tma(const AjParams& p, const AjFwdTmaMaps& maps) {
  AJ_DYNAMIC_SHARED(aj_smem);
  unsigned char* const smem = aj_smem + ((1024 - aj_smem_addr(aj_smem) % 1024) % 1024);
  const AjSm90TmaRings r = aj_sm90_tma_rings(smem);
  const int tid = aj_thread_idx();
#ifdef AJ_PERSISTENT
  const AjFwdUnits units = aj_fwd_units(p);
  if (units.first >= units.end) return;  // more blocks than work
#else
  const AjItem item = p.items[aj_block_idx_x()];
  const aj_i64 b = aj_batch_index();
  if (b >= p.batch) return;
#endif

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < AJ_STAGES; ++s) {
      aj_mbarrier_init(&r.k_full[s], 1);
      aj_mbarrier_init(&r.v_full[s], 1);
      aj_mbarrier_init(&r.k_empty[s], AJ_CONSUMERS);
      aj_mbarrier_init(&r.v_empty[s], AJ_CONSUMERS);
    }
#pragma unroll
    for (int qb = 0; qb < AJ_Q_BUFFERS; ++qb) {
      aj_mbarrier_init(&r.q_full[qb], 1);
      aj_mbarrier_init(&r.q_empty[qb], AJ_CONSUMERS);
    }
  }
  aj_syncthreads();  // the mbarriers are initialised for every thread

  if (tid >= AJ_CONSUMERS) {  // the producer warpgroup: its first thread issues every load
    if (AJ_CONSUMER_WGS > 1) aj_setmaxnreg_dec<AJ_PRODUCER_REGS>();
    if (tid == AJ_CONSUMERS) {
#ifdef AJ_PERSISTENT
      AjTmaCount c{0, 0};
      for (aj_i64 u = units.first; u < units.end; u += units.step)
        c = aj_sm90_tma_produce(p, maps.in, r, p.items[u / p.batch], u % p.batch, c);
#else
      aj_sm90_tma_produce(p, maps.in, r, item, b, AjTmaCount{0, 0});
#endif
    }
    return;
  }

  if (AJ_CONSUMER_WGS > 1) aj_setmaxnreg_inc<AJ_CONSUMER_REGS>();
#ifdef AJ_PERSISTENT
  AjTmaCount c{0, 0};
  for (aj_i64 u = units.first; u < units.end; u += units.step) {
    const AjItem item = p.items[u / p.batch];
    AjTileCursor cur;
    cur.begin(p, item);
    c = aj_sm90_tma_consume(p, maps, r, item, u % p.batch, cur, c);
  }
#else
  AjTileCursor cur;
  cur.begin(p, item);
  aj_sm90_tma_consume(p, maps, r, item, b, cur, AjTmaCount{0, 0});
#endif
#ifdef AJ_O_STAGED
  if (tid / 32 % 4 == 0) aj_bulk_wait<0>();  // the warpgroup's last O stores are done before the block ends
#endif
}
