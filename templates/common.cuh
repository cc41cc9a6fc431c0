// attnjit kernel templates: shared pieces. Self-contained (no includes), so NVRTC needs no
// include path and the source of a kernel is exactly what `attnjit dump --stage cuda` prints.
//
// The generated instantiation defines, before this file and templates/blocks/:
//   AJ_HEAD_DIM, AJ_HEAD_DIM_V   head dims of q/k and of v
//   AJ_TILE_Q, AJ_TILE_K         query rows and keys per tile
//   AJ_STAGES                    cp.async pipeline depth (sm_80 path)
//   AJ_DTYPE                     0 = float32, 1 = float16, 2 = bfloat16, 3 = FP8 e4m3 (storage of
//                                q, k, v, and of o unless AJ_OUT_DTYPE says otherwise)
//   AJ_OUT_DTYPE                 o's storage where it is not AJ_DTYPE's (FP8 inputs: 1 or 2)
// and, after it, aj_keys_allowed() and aj_queries_allowed() (the mask predicate of partial tiles,
// compiler/codegen/codegen_mask.cpp).

// ---- the kernel arguments and plan tables (AjItem, AjSpan, AjParams) are in kernel_abi.h, which
// the host includes too -----------------------------------------------------------------------

// The batch index of this block: grid y holds up to 65535 batch entries, grid z counts slices of
// 65535 (runtime/kernel_params.hpp, batch_grid()), so a batch of any size runs in one launch.
#define AJ_GRID_Y_MAX 65535
__device__ __forceinline__ aj_i64 aj_batch_index() {
  return (aj_i64)aj_block_idx_z() * AJ_GRID_Y_MAX + aj_block_idx_y();
}

// Packed documents: the row where the document of `row` starts (0 without documents). A work
// item's rows and every key it visits lie in one document (the plan never crosses one), so a
// kernel reads this once per item, from the item's first row, and subtracts it from the offsets:
// every position the mask sees is then within the document.
__device__ __forceinline__ aj_i64 aj_doc_start(const AjParams& p, aj_i64 row) {
  return p.doc_base != nullptr && row >= 0 && row < p.doc_rows ? p.doc_base[row] : 0;
}

// ---- walking a work item's key tiles in order ----------------------------------------------

struct AjTile {
  aj_i64 first;   // local key row of the tile's first key
  aj_i64 stride;  // key rows between consecutive keys (the dilation)
  int count;      // keys in the tile (<= AJ_TILE_K)
  int branch;
  bool full;      // every pair attended: no mask
  int weight;     // a packed plan's weighted tile: key c's probability times 1 + AjParams::key_extra[weight
                  // + c] (aj_key_extra); -1: unweighted
};

#ifdef AJ_KERNEL_SEEK
// templates/mask_lib.cuh: for a branch whose layout the kernel decides (AjParams::seek_branches: a
// table on the device, a random layout above the planning threshold), the first tile >= t of the
// span whose keys the layout may keep (INT_MAX: none), and whether it keeps that tile whole.
// `doc`: where the item's packed document starts (0 without documents; positions are the document's).
__device__ int aj_layout_seek(const AjParams& p, const AjSpan& s, int head, aj_i64 doc, aj_i64 q_lo, aj_i64 q_hi, int t,
                              bool& whole);
__device__ __forceinline__ bool aj_seeks(const AjParams& p, int branch) { return (p.seek_branches >> branch & 1ull) != 0; }
#endif

// A cursor over (span, visited tile) pairs. Every thread of a block walks the same sequence.
struct AjTileCursor {
  const AjParams* p;
  int span, span_end, visit;
#ifdef AJ_KERNEL_SEEK
  int head;
  aj_i64 doc;         // where the item's packed document starts (0 without documents)
  aj_i64 q_lo, q_hi;  // positions of the item's first and last rows (within the document)
  bool layout_whole;  // the layout keeps the current tile whole (a branch the kernel seeks through)
#endif

  __device__ void begin(const AjParams& params, const AjItem& item) {
#ifdef AJ_KERNEL_SEEK
    const aj_i64 d = aj_doc_start(params, item.rows_start);
    start(params, item, params.q_offset - d, d);
#else
    start(params, item, params.q_offset, 0);
#endif
  }
  // The same with row 0 of the item's rows at position `row0` (the paged forward: its request's).
  __device__ void begin_at(const AjParams& params, const AjItem& item, aj_i64 row0) { start(params, item, row0, 0); }
  __device__ void start(const AjParams& params, const AjItem& item, aj_i64 row0, aj_i64 doc_start) {
    p = &params;
    span = item.span_begin;
    span_end = item.span_end;
    visit = 0;
#ifdef AJ_KERNEL_SEEK
    head = item.head;
    doc = doc_start;
    q_lo = row0 + item.rows_start;
    q_hi = q_lo + (aj_i64)(item.rows_count > 0 ? item.rows_count - 1 : 0) * item.rows_stride;
    layout_whole = true;
#else
    (void)row0;
    (void)doc_start;
#endif
    skip_empty();
  }
  __device__ bool done() const { return span >= span_end; }
  __device__ int visits(const AjSpan& s) const {
    return s.entry_begin >= 0 ? s.entry_end - s.entry_begin : s.tile_end - s.tile_begin;
  }
  __device__ int tile_index(const AjSpan& s, int at) const {
    return s.entry_begin >= 0 ? p->entries[s.entry_begin + at] >> 1 : s.tile_begin + at;
  }
  // Moves to the next visit with something to do: past exhausted spans and, for a branch whose
  // layout the kernel decides (the plan lists every tile its band allows), past the tiles the
  // layout does not keep.
  __device__ void skip_empty() {
    while (span < span_end) {
      const AjSpan& s = p->spans[span];
      const int n = visits(s);
      if (visit < n) {
#ifdef AJ_KERNEL_SEEK
        if (!aj_seeks(*p, s.branch)) return;
        const int t = tile_index(s, visit);
        const int want = aj_layout_seek(*p, s, head, doc, q_lo, q_hi, t, layout_whole);
        if (want == t) return;
        if (s.entry_begin < 0) {
          visit = want - s.tile_begin < n ? want - s.tile_begin : n;
        } else {
          while (visit < n && tile_index(s, visit) < want) ++visit;
        }
        continue;
#else
        return;
#endif
      }
      ++span;
      visit = 0;
    }
  }
  __device__ AjTile tile() const {
    const AjSpan& s = p->spans[span];
    int t;
    bool full;
    if (s.entry_begin >= 0) {
      const int e = p->entries[s.entry_begin + visit];
      t = e >> 1;
      full = (e & 1) != 0;
    } else {
      t = s.tile_begin + visit;
      full = t >= s.full_begin && t < s.full_end;
    }
#ifdef AJ_KERNEL_SEEK
    if (aj_seeks(*p, s.branch)) full = full && layout_whole;
#endif
    AjTile out;
    // 32-bit: a visited tile holds a key, so from < keys_count, an int.
    const int from = t * AJ_TILE_K;
    out.first = s.keys_start + (aj_i64)from * s.keys_stride;
    out.stride = s.keys_stride;
    const int left = s.keys_count - from;
    out.count = left < AJ_TILE_K ? left : AJ_TILE_K;
    out.branch = s.branch;
    out.full = full;
    out.weight = s.weight_begin >= 0 ? s.weight_begin + from : -1;
    return out;
  }
  __device__ void next() {
    ++visit;
    skip_empty();
  }
};

// Key c of a weighted tile stands for 1 + this many branches (a packed plan: compiler/plan/plan.hpp,
// BranchPacking): its probability, in O's sum and in the row sum, counts once for each, P + extra *
// P. 0 for an unweighted tile and past the tile's keys.
__device__ __forceinline__ float aj_key_extra(const AjParams& p, const AjTile& t, int c) {
  return t.weight >= 0 && c < t.count ? p.key_extra[t.weight + c] : 0.0f;
}

// ---- conversions between storage types and float, without cuda_fp16.h --------------------

__device__ __forceinline__ float aj_half_to_float(aj_u16 h) { return aj_cvt_f32_f16(h); }
__device__ __forceinline__ aj_u16 aj_float_to_half(float f) { return aj_cvt_f16_f32(f); }
__device__ __forceinline__ float aj_bf16_to_float(aj_u16 h) { return aj_uint_as_float(((aj_u32)h) << 16); }
__device__ __forceinline__ aj_u16 aj_float_to_bf16(float f) {
  // Round to nearest even; NaN stays NaN.
  aj_u32 u = aj_float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (aj_u16)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (aj_u16)(u >> 16);
}

// FP8 e4m3 (OCP E4M3FN: bias 7, no infinities, S.1111.111 NaN) to float, exactly, in software
// (integer and float operations alike on every arch and in the emulator).
__device__ __forceinline__ float aj_e4m3_to_float(unsigned char code) {
  const aj_u32 x = code, sign = (x & 0x80u) << 24, e = (x >> 3) & 15u, m = x & 7u;
  if (e == 15u && m == 7u) return aj_uint_as_float(0x7fc00000u | sign);  // NaN
  if (e == 0u) {  // subnormal: m x 2^-9
    const float f = (float)m * 0.001953125f;
    return sign ? -f : f;
  }
  return aj_uint_as_float(sign | ((e + 120u) << 23) | (m << 20));  // (1 + m/8) x 2^(e - 7)
}

// x rounded to the nearest e4m3 value, ties to even, as a float: what cvt.rn.satfinite.e4m3x2.f32
// and back gives for 0 <= x <= 448 (the probabilities the FP8 forward rounds; NaN stays NaN). In
// software: one rounding of the float's bits at e4m3's quantum (2^-9 below 2^-6, else 3 mantissa
// bits), so the emulator and every arch compute the same.
__device__ __forceinline__ float aj_round_e4m3(float x) {
  const aj_u32 u = aj_float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return x;  // NaN
  const int e = (int)((u >> 23) & 255u) - 127;   // x = 1.m x 2^e (0 and binary32 subnormals: e = -127)
  if (e < -10) return 0.0f;                       // below half of the smallest subnormal, 2^-10
  const int drop = e >= -6 ? 20 : 14 - e;         // mantissa bits below e4m3's quantum (21..24 under 2^-6)
  if (drop >= 24) return x > 0.0009765625f ? 0.001953125f : 0.0f;  // [2^-10, 2^-9): to 2^-9, or the tie to 0
  // Ties go to the even code: the kept lowest bit is the code's last bit, except in [2^-9, 2^-8),
  // whose only code is 1 x 2^-9 (odd): its tie goes up to 2 x 2^-9.
  const aj_u32 half = 1u << (drop - 1), keep = ~((half << 1) - 1u), odd = drop == 23 ? 1u : (u >> drop) & 1u;
  return aj_uint_as_float((u + (half - 1u) + odd) & keep);
}

#if AJ_DTYPE == 0
typedef float aj_elem;
__device__ __forceinline__ float aj_load(const aj_elem* p) { return *p; }
__device__ __forceinline__ void aj_store(aj_elem* p, float v) { *p = v; }
#elif AJ_DTYPE == 3
typedef unsigned char aj_elem;  // FP8 inputs: read-only (o is AJ_OUT_DTYPE's)
__device__ __forceinline__ float aj_load(const aj_elem* p) { return aj_e4m3_to_float(*p); }
#else
typedef aj_u16 aj_elem;
__device__ __forceinline__ float aj_load(const aj_elem* p) {
#if AJ_DTYPE == 1
  return aj_half_to_float(*p);
#else
  return aj_bf16_to_float(*p);
#endif
}
__device__ __forceinline__ void aj_store(aj_elem* p, float v) {
#if AJ_DTYPE == 1
  *p = aj_float_to_half(v);
#else
  *p = aj_float_to_bf16(v);
#endif
}
#endif

// O's storage: AJ_DTYPE's, or AJ_OUT_DTYPE's (fp16 or bf16) for FP8 inputs.
#ifndef AJ_OUT_DTYPE
#define AJ_OUT_DTYPE AJ_DTYPE
#endif
#if AJ_OUT_DTYPE == AJ_DTYPE
typedef aj_elem aj_out_elem;
__device__ __forceinline__ void aj_store_out(aj_out_elem* p, float v) { aj_store(p, v); }
#else
typedef aj_u16 aj_out_elem;
__device__ __forceinline__ void aj_store_out(aj_out_elem* p, float v) {
#if AJ_OUT_DTYPE == 1
  *p = aj_float_to_half(v);
#else
  *p = aj_float_to_bf16(v);
#endif
}
#endif

// FP8 inputs: the descale factor of (batch b, kv head h) of q (t = 0), k (1) or v (2); AjParams::q_descale.
#if AJ_DTYPE == 3
__device__ __forceinline__ float aj_descale(const AjParams& p, int t, aj_i64 b, int h) {
  const float* f = t == 0 ? p.q_descale : t == 1 ? p.k_descale : p.v_descale;
  return f[b * p.descale_strides[2 * t] + (aj_i64)h * p.descale_strides[2 * t + 1]];
}
#endif

// The scores' factor in exp2 units for (batch b, kv head kvh): the call's scale, and for FP8
// inputs the q and k descales too (docs/spec.md, "FP8 inputs"). Every forward kernel's loop and
// the exact sums of the tensor-core kernels take it from here, so they round the same P.
__device__ __forceinline__ float aj_scale_log2(const AjParams& p, aj_i64 b, int kvh) {
#if AJ_DTYPE == 3
  return p.scale_log2 * (aj_descale(p, 0, b, kvh) * aj_descale(p, 1, b, kvh));
#else
  (void)b, (void)kvh;
  return p.scale_log2;
#endif
}

// ---- tensor-core helpers of the 16-bit types (the sm_80 forward and backward, the paged forward) ----

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

// A 32-bit word of two 16-bit values holds a non-finite one (exponent bits all ones: a bit test
// no fast-math rule can fold away).
#if AJ_DTYPE == 1
#define AJ_HALF_EXP 0x7c00u  // fp16
#else
#define AJ_HALF_EXP 0x7f80u  // bf16
#endif
__device__ __forceinline__ bool aj_tc_word_nonfinite(aj_u32 w) {
  return (w & AJ_HALF_EXP) == AJ_HALF_EXP || (w & (AJ_HALF_EXP << 16)) == (AJ_HALF_EXP << 16);
}

// Two values of O as one word of its storage (the Hopper epilogue), and whether a value in such a
// word is NaN or infinite: the input type's (aj_pack2, aj_tc_word_nonfinite), or for FP8 inputs
// AJ_OUT_DTYPE's (fp16 or bf16).
#if AJ_OUT_DTYPE == AJ_DTYPE
__device__ __forceinline__ aj_u32 aj_out_pack2(float lo, float hi) { return aj_pack2(lo, hi); }
__device__ __forceinline__ bool aj_out_word_nonfinite(aj_u32 w) { return aj_tc_word_nonfinite(w); }
#elif AJ_OUT_DTYPE == 1 || AJ_OUT_DTYPE == 2
__device__ __forceinline__ aj_u32 aj_out_pack2(float lo, float hi) {
  return AJ_OUT_DTYPE == 2 ? aj_cvt_bf16x2(hi, lo) : aj_cvt_f16x2(hi, lo);
}
__device__ __forceinline__ bool aj_out_word_nonfinite(aj_u32 w) {
  const aj_u32 e = AJ_OUT_DTYPE == 2 ? 0x7f80u : 0x7c00u;
  return (w & e) == e || (w & (e << 16)) == (e << 16);
}
#endif

#define AJ_NEG_INF (aj_int_as_float((int)0xff800000u))
#define AJ_LN2 0.6931471805599453f

// NaN or +-inf, by the exponent bits: a test no fast-math rule can fold away.
__device__ __forceinline__ bool aj_nonfinite(float x) { return (aj_float_as_uint(x) & 0x7f800000u) == 0x7f800000u; }
__device__ __forceinline__ bool aj_isnan(float x) { return (aj_float_as_uint(x) & 0x7fffffffu) > 0x7f800000u; }

// Whether any lane of the (whole, converged) warp passes `x`.
__device__ __forceinline__ bool aj_warp_any(bool x) {
  float any = x ? 1.0f : 0.0f;
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) any += aj_shfl_xor(any, m);
  return any != 0.0f;
}

// The rare paths (aj_rare_path): the exact sums after a non-finite value, by kernel. The emulator
// counts each (tests/unit/test_mutations.cpp reads them).
#define AJ_RARE_FWD_ROWS 0  // forward: a row a masked non-finite V reached (aj_tc_exact_rows)
#define AJ_RARE_DQ_ROWS 1   // backward, two-pass dQ: a row a masked non-finite K reached
#define AJ_RARE_DQ_BLOCK 2  // backward, single pass: a dQ block a masked non-finite K reached
#define AJ_RARE_KEY_ROW 3   // backward: a key row a masked non-finite Q or dO reached
