// The FP8 forward's tiles (AJ_DTYPE 3: e4m3 codes), shared by the tensor-core kernels on FP8
// inputs: fwd_sm90_fp8.cuh (wgmma m64nNk32) and fwd_sm89_fp8.cuh (mma.sync m16n8k32). Both read
// their 8-bit operands K-major: each thread's A register holds 4 consecutive bytes along K, and so
// does its B register. So:
// - S = Q K^T takes Q and K as they lie (rows of AJ_HEAD_DIM = 64 or 128 bytes, and 256 for the
//   sm_89 kernel, which reads them by ldmatrix only);
// - O += P V needs V^T (for each output column, the tile's keys contiguous): each tile of V is
//   transposed on its way to shared memory (four keys' 16 bytes become 16 words of V^T by byte
//   permutes, aj_fp8_store_vt);
// - P comes from registers in the 8-bit A layout: lane l holds, of each 32-key chunk of its rows,
//   columns 4(l % 4) .. + 3 and 16 + 4(l % 4) .. + 3, while its S accumulators (the C layout of
//   m16n8, the same in both instructions) hold keys 2(l % 4), + 1, 8 + 2(l % 4), + 1 (and 16
//   more). Rather than move values between threads, the chunk's keys are renumbered: P's column k
//   stands for key aj_fp8_key(k), and V^T's column k holds that key's row, so the product is the
//   same sum in another order.
// P is packed as e4m3 codes of 2^8 P (docs/spec.md, "FP8 inputs"); the epilogue takes the 2^-8
// back with v_descale.

#if (AJ_HEAD_DIM != 64 && AJ_HEAD_DIM != 128 && AJ_HEAD_DIM != 256) || \
    (AJ_HEAD_DIM_V != 64 && AJ_HEAD_DIM_V != 128 && AJ_HEAD_DIM_V != 256) || (AJ_TILE_K != 64 && AJ_TILE_K != 128)
#error "the FP8 tensor-core forward takes head dims 64, 128 or 256 and 64- or 128-key tiles"
#endif

// Q's and K's rows are AJ_HEAD_DIM bytes with the swizzle of that width (64, 128 or 256 bytes);
// V^T's rows are a tile's AJ_TILE_K keys (the swizzle of that width).
#define AJ_FP8_QK (AJ_HEAD_DIM)
#define AJ_FP8_VT (AJ_TILE_K)

// Byte offset of byte k of row r in a [rows][W B] tile with the W-byte swizzle (W = 64 or 128):
// the address's bits [7, 7 + log2(W / 16)) XORed into its 16-byte chunk (the tiles start on
// 1024-byte boundaries, so the offset stands for the address). wgmma reads this layout through
// its descriptors; for ldmatrix it puts the 8 rows of a matrix on distinct banks. Rows of 256
// bytes (the sm_89 kernel at head dim 256; no wgmma mode has them) XOR the row within 8 into the
// chunk's low three bits, which does the same for ldmatrix.
template <int W>
__device__ __forceinline__ int aj_fp8_at(int r, int k) {
  const int at = r * W + k;
  if (W == 256) return at ^ ((r & 7) << 4);
  return at ^ (((at >> 7) & (W / 16 - 1)) << 4);
}

// The key (within its 32-key chunk) that P's column k stands for: column 16h + 4q + 2b + e holds
// key 16h + 8b + 2q + e (h, b, e in {0, 1}, q < 4).
__device__ __forceinline__ int aj_fp8_key(int k) { return (k & 16) | ((k & 2) << 2) | ((k >> 1) & 6) | (k & 1); }

// Rows first + r * stride (r < count) of a [.., AJ_HEAD_DIM] e4m3 tensor into a swizzled
// [ROWS][AJ_HEAD_DIM B] tile by cp.async, 16 bytes a copy; rows past `count` are zero-filled.
template <int ROWS>
__device__ __forceinline__ void aj_fp8_load_rows(unsigned char* dst, const aj_elem* base, aj_i64 row_stride, aj_i64 first,
                                                 aj_i64 stride, int count) {
  constexpr int CHUNKS = AJ_FP8_QK / 16;
  for (int x = aj_thread_idx(); x < ROWS * CHUNKS; x += AJ_THREADS) {
    const int r = x / CHUNKS, c = x % CHUNKS;
    aj_cp_async16(dst + aj_fp8_at<AJ_FP8_QK>(r, c * 16),
                  base + (first + (aj_i64)(r < count ? r : 0) * stride) * row_stride + c * 16, r < count);
  }
}

// The dynamic shared memory of an FP8 kernel, from a 1024-byte boundary (the swizzle's pattern):
// the Q tile, then two stages of K and two of V^T.
struct AjFp8Smem {
  unsigned char* q;   // [AJ_TILE_Q][AJ_HEAD_DIM B]
  unsigned char* k;   // [2][AJ_TILE_K][AJ_HEAD_DIM B]
  unsigned char* vt;  // [2][AJ_HEAD_DIM_V][AJ_TILE_K B]
};

// What a thread of an FP8 kernel needs of its item for its accumulator rows `row` and row + 8:
// its kv head and score factor, where the K and V rows of (batch, kv head) start, and the
// positions aj_sm80_mask compares (k_origin, qpos, q_step8). Taking it starts the copy of the
// item's Q rows into the Q tile (one commit group).
struct AjFp8Item {
  int kvh;
  float scale_log2;
  aj_i64 k_origin, qpos, q_step8;
  const aj_elem *kb, *vb;
};
__device__ __forceinline__ AjFp8Item aj_fp8_item(const AjParams& p, const AjItem& item, aj_i64 b, int row, unsigned char* sq) {
  AjFp8Item w;
  w.kvh = item.head / p.heads_per_kv;
  w.scale_log2 = aj_scale_log2(p, b, w.kvh);
  const aj_i64 doc = aj_doc_start(p, item.rows_start);
  w.k_origin = p.k_offset - doc;
  w.qpos = p.q_offset - doc + item.rows_start + (aj_i64)row * item.rows_stride;
  w.q_step8 = 8 * item.rows_stride;
  w.kb = (const aj_elem*)p.k + b * p.k_batch_stride + w.kvh * p.k_head_stride;
  w.vb = (const aj_elem*)p.v + b * p.v_batch_stride + w.kvh * p.v_head_stride;
  const aj_elem* qb = (const aj_elem*)p.q + b * p.q_batch_stride + item.head * p.q_head_stride;
  aj_fp8_load_rows<AJ_TILE_Q>(sq, qb, p.q_row_stride, item.rows_start, item.rows_stride, item.rows_count);
  aj_cp_async_commit();
  return w;
}

// V's rows of a tile on their way to V^T, in units of four keys by 16 columns: unit u holds the
// keys k0, k0 + 1, k0 + 8, k0 + 9 that P's columns 4g .. 4g + 3 stand for (g = u % (AJ_TILE_K / 4),
// k0 = aj_fp8_key(4g) within its 32-key chunk), at columns 16 (u / (AJ_TILE_K / 4)) .. + 15: 16
// bytes from each key's row. Transposed, each of its 16 columns becomes one
// 4-byte word of V^T's row, at byte 4g: a warp's 32 units of one column block store to 32
// distinct banks (at 128-key tiles), and a thread stores 16 words, not 64 bytes.
#define AJ_FP8_V_GROUPS (AJ_TILE_K / 4)
#define AJ_FP8_V_UNITS (AJ_FP8_V_GROUPS * (AJ_HEAD_DIM_V / 16))
#define AJ_FP8_V_PER_THREAD ((AJ_FP8_V_UNITS + AJ_THREADS - 1) / AJ_THREADS)
struct AjFp8V {
  aj_u32x4 rows[AJ_FP8_V_PER_THREAD][4];  // unit i's keys k0, k0 + 1, k0 + 8, k0 + 9
};

// Tile t's V rows into registers (keys past the count as zeros: their P is 0, and 0 x 0 adds nothing).
__device__ __forceinline__ void aj_fp8_load_v(AjFp8V& v, const aj_elem* vb, aj_i64 row_stride, const AjTile& t) {
#pragma unroll
  for (int i = 0; i < AJ_FP8_V_PER_THREAD; ++i) {
    const int u = aj_thread_idx() + i * AJ_THREADS, g = u % AJ_FP8_V_GROUPS, col = 16 * (u / AJ_FP8_V_GROUPS);
    const int k0 = (4 * g & ~31) | aj_fp8_key(4 * g & 31);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int key = k0 + (r & 1) + 8 * (r >> 1);
      v.rows[i][r] = u < AJ_FP8_V_UNITS && key < t.count
                         ? aj_ld_u32x4(vb + (t.first + (aj_i64)key * t.stride) * row_stride + col)
                         : aj_u32x4{0u, 0u, 0u, 0u};
    }
  }
}

// Word i of a 16-byte vector (i known at compile time: a register, no indexing).
__device__ __forceinline__ aj_u32 aj_word(const aj_u32x4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// ... and from them into V^T ([AJ_HEAD_DIM_V output columns][AJ_TILE_K B], swizzled): the value of
// key aj_fp8_key(k) at column d lies at V^T row d, byte k of its 32-key chunk. Each 4 x 4 block of
// bytes (four keys' words of four columns) is transposed by eight byte permutes.
__device__ __forceinline__ void aj_fp8_store_vt(unsigned char* vt, const AjFp8V& v) {
#pragma unroll
  for (int i = 0; i < AJ_FP8_V_PER_THREAD; ++i) {
    const int u = aj_thread_idx() + i * AJ_THREADS, g = u % AJ_FP8_V_GROUPS, col = 16 * (u / AJ_FP8_V_GROUPS);
    if (u >= AJ_FP8_V_UNITS) break;
#pragma unroll
    for (int w = 0; w < 4; ++w) {  // columns col + 4w .. + 3
      const aj_u32 a = aj_word(v.rows[i][0], w), b = aj_word(v.rows[i][1], w), c = aj_word(v.rows[i][2], w),
                   d = aj_word(v.rows[i][3], w);
      const aj_u32 ab01 = aj_prmt(a, b, 0x5140), cd01 = aj_prmt(c, d, 0x5140);  // a0 b0 a1 b1, c0 d0 c1 d1
      const aj_u32 ab23 = aj_prmt(a, b, 0x7362), cd23 = aj_prmt(c, d, 0x7362);  // a2 b2 a3 b3, c2 d2 c3 d3
      const aj_u32 out[4] = {aj_prmt(ab01, cd01, 0x5410), aj_prmt(ab01, cd01, 0x7632), aj_prmt(ab23, cd23, 0x5410),
                             aj_prmt(ab23, cd23, 0x7632)};
#pragma unroll
      for (int j = 0; j < 4; ++j) *(aj_u32*)(vt + aj_fp8_at<AJ_FP8_VT>(col + 4 * w + j, 4 * g)) = out[j];
    }
  }
}

// A stage: one K tile and one V^T tile (each a multiple of 1024 bytes, so every stage starts on
// the swizzle pattern's boundary).
#define AJ_FP8_K_STAGE (AJ_TILE_K * AJ_FP8_QK)
#define AJ_FP8_VT_STAGE (AJ_HEAD_DIM_V * AJ_FP8_VT)

__device__ __forceinline__ AjFp8Smem aj_fp8_smem() {
  AJ_DYNAMIC_SHARED(aj_smem);
  AjFp8Smem sh;
  sh.q = aj_smem + ((1024 - aj_smem_addr(aj_smem) % 1024) % 1024);
  sh.k = sh.q + AJ_TILE_Q * AJ_FP8_QK;
  sh.vt = sh.k + 2 * AJ_FP8_K_STAGE;
  return sh;
}

// The item's key tiles, two stages deep (the sm_89 kernel's loop; the Hopper one runs K a tile
// ahead of V instead, to overlap its softmax with P V): while tile j is computed from stage j % 2,
// tile j + 1's K is on its way into the other stage by cp.async and its V rows into registers
// (issued before tile j's products), and its V^T is stored from them where compute() says:
// compute(t, stage, store_next) runs tile t's products from `stage` and calls store_next() once.
// Before each tile: the copies waited for, fence() (a wgmma kernel's proxy fence: its products
// read through the async proxy what threads wrote; nothing for mma.sync), one barrier: tile j's
// stage has landed and tile j - 1's is read no more. The caller has committed Q's copy: the first
// wait takes it too.
template <typename Fence, typename Compute>
__device__ __forceinline__ void aj_fp8_tiles(const AjParams& p, const AjItem& item, const aj_elem* kb, const aj_elem* vb,
                                             unsigned char* sk, unsigned char* svt, Fence fence, Compute compute) {
  AjTileCursor cur;
  cur.begin(p, item);
  if (cur.done()) return;
  AjTile t = cur.tile();
  AjFp8V v;
  aj_fp8_load_rows<AJ_TILE_K>(sk, kb, p.k_row_stride, t.first, t.stride, t.count);
  aj_cp_async_commit();
  aj_fp8_load_v(v, vb, p.v_row_stride, t);
  aj_fp8_store_vt(svt, v);
  for (int j = 0;; ++j) {
    cur.next();  // now tile j + 1 (done: none)
    const bool more = !cur.done();
    const AjTile next = more ? cur.tile() : t;
    const int stage = j & 1;
    aj_cp_async_wait<0>();
    fence();
    aj_syncthreads();  // tile j's stage has landed; tile j - 1's is read no more
    if (more) {
      aj_fp8_load_rows<AJ_TILE_K>(sk + (stage ^ 1) * AJ_FP8_K_STAGE, kb, p.k_row_stride, next.first, next.stride, next.count);
      aj_cp_async_commit();
      aj_fp8_load_v(v, vb, p.v_row_stride, next);
    }
    compute(t, stage, [&] {
      if (more) aj_fp8_store_vt(svt + (stage ^ 1) * AJ_FP8_VT_STAGE, v);
    });
    if (!more) return;
    t = next;
  }
}

// P as e4m3 codes of 2^8 P in the 8-bit A layout (see the top): chunk kc's registers 0 and 2 from
// row g's accumulators of n-tiles 4kc, 4kc + 1 and 4kc + 2, 4kc + 3; registers 1 and 3 from row g + 8's.
__device__ __forceinline__ void aj_fp8_pack(const float (&s)[AJ_TILE_K / 8][4], aj_u32 (&pa)[AJ_TILE_K / 32][4]) {
#pragma unroll
  for (int kc = 0; kc < AJ_TILE_K / 32; ++kc)
#pragma unroll
    for (int reg = 0; reg < 4; ++reg) {
      const int j = 4 * kc + 2 * (reg >> 1), e = 2 * (reg & 1);
      const aj_u32 lo = aj_cvt_e4m3x2(256.0f * s[j][e + 1], 256.0f * s[j][e]);
      const aj_u32 hi = aj_cvt_e4m3x2(256.0f * s[j + 1][e + 1], 256.0f * s[j + 1][e]);
      pa[kc][reg] = hi << 16 | lo;
    }
}

