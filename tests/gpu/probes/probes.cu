// Probe kernels: one per building block of templates/blocks/. Each writes what every lane
// received, as 32-bit words, so the emulator's output (the golden files beside this one) and the
// hardware's can be compared bit for bit. tests/gpu/probes/run_probes.cpp prepends the blocks,
// fills `in` and launches each probe; its table says which grid, block and words each one uses.
// Every kernel has the signature (const aj_u32* in, aj_u32* out).

__device__ __forceinline__ float aj_probe_f(aj_u32 u) { return aj_uint_as_float(u); }

// Index registers: grid (3, 2), 64 threads.
extern "C" __global__ void probe_index(const aj_u32* in, aj_u32* out) {
  const int b = aj_block_idx_y() * 3 + aj_block_idx_x();
  out[b * 64 + aj_thread_idx()] = (aj_u32)aj_thread_idx() | (aj_u32)aj_block_idx_x() << 16 | (aj_u32)aj_block_idx_y() << 24;
}

// shfl.sync.bfly (xor) with every lane mask, 64 threads: out[mask index][tid].
extern "C" __global__ void probe_shfl_xor(const aj_u32* in, aj_u32* out) {
  const int t = aj_thread_idx();
  const float v = aj_probe_f(in[t]);
  for (int m = 0; m < 5; ++m) out[m * 64 + t] = aj_float_as_uint(aj_shfl_xor(v, 1 << m));
}

// shfl.sync.idx from lane 0 (aj_warp_uniform), 64 threads, each lane its own value.
extern "C" __global__ void probe_warp_uniform(const aj_u32* in, aj_u32* out) {
  const int t = aj_thread_idx();
  out[t] = (aj_u32)aj_warp_uniform((int)in[t]);
}

// bar.sync: every thread writes its word, then reads another thread's, 128 threads.
struct AjProbeWords {
  aj_u32 w[128];
};
extern "C" __global__ void probe_syncthreads(const aj_u32* in, aj_u32* out) {
  AJ_STATIC_SHARED(AjProbeWords, words);
  const int t = aj_thread_idx();
  words.w[t] = in[t] * 3u + 1u;
  aj_syncthreads();
  out[t] = words.w[(t * 37 + 11) % 128];
}

// cp.async.cg 16 bytes, read or ignored (ignore-src: zero fill), two groups, wait_group 0; 32 threads,
// each copies two 16-byte chunks (the second is zero-filled for odd lanes).
extern "C" __global__ void probe_cp_async(const aj_u32* in, aj_u32* out) {
  AJ_DYNAMIC_SHARED(smem);
  aj_u32* s = (aj_u32*)smem;
  const int t = aj_thread_idx();
  aj_cp_async16(s + 8 * t, in + 8 * t, true);
  aj_cp_async_commit();
  aj_cp_async16(s + 8 * t + 4, in + 8 * t + 4, (t & 1) == 0);
  aj_cp_async_commit();
  aj_cp_async_wait<0>();
  aj_syncthreads();
  for (int i = 0; i < 8; ++i) out[8 * t + i] = s[8 * ((t + 5) % 32) + i];
}

// ldmatrix: shared memory holds a 32x40 array of distinct 16-bit words; lane l gives the address of
// row 2 * (l % 16) + l / 16, column 8 * ((l / 8) % 2) + 16 * (l / 16), so every matrix gathers rows
// from all over the array. out[lane * 4 + j] = register j (0 beyond the variant's count).
#define AJ_PROBE_LDMATRIX(NAME, CALL, N)                                                        \
  extern "C" __global__ void NAME(const aj_u32* in, aj_u32* out) {                             \
    AJ_DYNAMIC_SHARED(smem);                                                                    \
    aj_u16* s = (aj_u16*)smem;                                                                  \
    const int t = aj_thread_idx();                                                              \
    for (int i = t; i < 32 * 40; i += 32) s[i] = (aj_u16)(in[i / 2] >> (16 * (i & 1)));       \
    aj_syncthreads();                                                                           \
    aj_u32 r[N];                                                                                \
    CALL(r, s + ((t % 16) * 2 + t / 16) * 40 + 8 * ((t / 8) % 2) + 16 * (t / 16));             \
    for (int j = 0; j < N; ++j) out[t * 4 + j] = r[j];                                          \
    for (int j = N; j < 4; ++j) out[t * 4 + j] = 0;                                             \
  }
AJ_PROBE_LDMATRIX(probe_ldmatrix_x1, aj_ldmatrix_x1, 1)
AJ_PROBE_LDMATRIX(probe_ldmatrix_x2, aj_ldmatrix_x2, 2)
AJ_PROBE_LDMATRIX(probe_ldmatrix_x4, aj_ldmatrix_x4, 4)
AJ_PROBE_LDMATRIX(probe_ldmatrix_x1_trans, aj_ldmatrix_x1_trans, 1)
AJ_PROBE_LDMATRIX(probe_ldmatrix_x2_trans, aj_ldmatrix_x2_trans, 2)
AJ_PROBE_LDMATRIX(probe_ldmatrix_x4_trans, aj_ldmatrix_x4_trans, 4)

// stmatrix .x4 .trans (sm_90; built on the emulator and for sm_90a only, as the wgmma probes): lane l stores registers in[l * 4 + j] into a zeroed 32x40 array of
// 16-bit words at ldmatrix's addresses above; out = the array, two words to a 32-bit word.
#if defined(AJ_EMULATE) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
extern "C" __global__ void probe_stmatrix_x4_trans(const aj_u32* in, aj_u32* out) {
  AJ_DYNAMIC_SHARED(smem);
  aj_u16* s = (aj_u16*)smem;
  const int t = aj_thread_idx();
  for (int i = t; i < 32 * 40; i += 32) s[i] = 0;
  aj_syncthreads();
  const aj_u32 r[4] = {in[t * 4], in[t * 4 + 1], in[t * 4 + 2], in[t * 4 + 3]};
  aj_stmatrix_x4_trans(r, s + ((t % 16) * 2 + t / 16) * 40 + 8 * ((t / 8) % 2) + 16 * (t / 16));
  aj_syncthreads();
  for (int i = t; i < 32 * 40 / 2; i += 32) out[i] = (aj_u32)s[2 * i] | (aj_u32)s[2 * i + 1] << 16;
}
#endif

// mma.sync m16n8k16 with f16 / bf16 inputs (small integers: exact on every model), 32 threads:
// in[lane * 10 + 0..3] = A registers, 4..5 = B registers, 6..9 = C (fp32 bits); out = D.
#define AJ_PROBE_MMA(NAME, CALL)                                                                \
  extern "C" __global__ void NAME(const aj_u32* in, aj_u32* out) {                             \
    const int t = aj_thread_idx();                                                              \
    const aj_u32 a[4] = {in[t * 10], in[t * 10 + 1], in[t * 10 + 2], in[t * 10 + 3]};         \
    float d[4];                                                                                 \
    for (int i = 0; i < 4; ++i) d[i] = aj_probe_f(in[t * 10 + 6 + i]);                          \
    CALL(d, a, in[t * 10 + 4], in[t * 10 + 5]);                                                 \
    for (int i = 0; i < 4; ++i) out[t * 4 + i] = aj_float_as_uint(d[i]);                        \
  }
AJ_PROBE_MMA(probe_mma_f16, aj_mma_f16)
AJ_PROBE_MMA(probe_mma_bf16, aj_mma_bf16)

// cvt, with in[2t] = a and in[2t+1] = b (fp32 bits): out[4t] = cvt.rn.f16x2.f32(a, b),
// out[4t+1] = cvt.rn.bf16x2.f32(a, b), out[4t+2] = cvt.rn.f16.f32(a), out[4t+3] = cvt.f32.f16 of the
// low 16 bits of b's word.
extern "C" __global__ void probe_cvt(const aj_u32* in, aj_u32* out) {
  const int t = aj_thread_idx();
  const float a = aj_probe_f(in[2 * t]), b = aj_probe_f(in[2 * t + 1]);
  out[4 * t] = aj_cvt_f16x2(a, b);
  out[4 * t + 1] = aj_cvt_bf16x2(a, b);
  out[4 * t + 2] = aj_cvt_f16_f32(a);
  out[4 * t + 3] = aj_float_as_uint(aj_cvt_f32_f16((aj_u16)(in[2 * t + 1] & 0xffffu)));
}

// ex2.approx.ftz.f32 and lg2.approx.ftz.f32 (approximate on hardware: compared within ulps,
// special values exactly); out[2t] = ex2(x), out[2t+1] = lg2(x).
extern "C" __global__ void probe_ex2_lg2(const aj_u32* in, aj_u32* out) {
  const int t = aj_thread_idx();
  const float x = aj_probe_f(in[t]);
  out[2 * t] = aj_float_as_uint(aj_ex2(x));
  out[2 * t + 1] = aj_float_as_uint(aj_lg2(x));
}

// red.global.add.f32 from every thread of two blocks into 8 words (small integers: any order is exact).
extern "C" __global__ void probe_red_add(const aj_u32* in, aj_u32* out) {
  const int t = aj_thread_idx();
  aj_red_add_f32((float*)out + (t + aj_block_idx_x()) % 8, aj_probe_f(in[t]));
}

// red.global.add.v2.f32 (two scalar adds before sm_90) from every thread of two blocks into 4 pairs
// of words (small integers: any order is exact).
extern "C" __global__ void probe_red_add_f32x2(const aj_u32* in, aj_u32* out) {
  const int t = aj_thread_idx();
  aj_red_add_f32x2((float*)out + 2 * ((t + aj_block_idx_x()) % 4), aj_probe_f(in[t]), aj_probe_f(in[(t + 17) % 64]));
}

// red.global.add.u32 from every thread of two blocks into 8 words (wrapping: any order gives the same sum).
extern "C" __global__ void probe_red_add_u32(const aj_u32* in, aj_u32* out) {
  const int t = aj_thread_idx();
  aj_red_add_u32(out + (t + aj_block_idx_x()) % 8, in[t]);
}

// aj_ex2_poly (the FMA-pipe exp2 of the softmax's option): out[i] = 2^in[i], two a thread. Pure
// fma, floor and integer arithmetic: the hardware and the emulator must agree bit for bit.
extern "C" __global__ void probe_ex2_poly(const aj_u32* in, aj_u32* out) {
  const int t = aj_thread_idx();
  for (int i = 2 * t; i < 2 * t + 2; ++i) out[i] = aj_float_as_uint(aj_ex2_poly(aj_probe_f(in[i])));
}

// prmt.b32 (__byte_perm): out[5t + k] = prmt(in[3t], in[3t + 1], selector k) for the FP8 forward's
// V transpose (0x5140, 0x7362, 0x5410, 0x7632) and in[3t + 2] & 0x7777 (any four of the eight bytes).
extern "C" __global__ void probe_prmt(const aj_u32* in, aj_u32* out) {
  const int t = aj_thread_idx();
  const aj_u32 a = in[3 * t], b = in[3 * t + 1];
  out[5 * t] = aj_prmt(a, b, 0x5140);
  out[5 * t + 1] = aj_prmt(a, b, 0x7362);
  out[5 * t + 2] = aj_prmt(a, b, 0x5410);
  out[5 * t + 3] = aj_prmt(a, b, 0x7632);
  out[5 * t + 4] = aj_prmt(a, b, in[3 * t + 2] & 0x7777u);
}

// fp32 arithmetic as NVRTC compiles it (--use_fast_math: contraction to fma, subnormals flushed):
// out[2t] = a * b + c, out[2t+1] = a * b (in[3t..3t+2] = a, b, c).
extern "C" __global__ void probe_fp32_arith(const aj_u32* in, aj_u32* out) {
  const int t = aj_thread_idx();
  const float a = aj_probe_f(in[3 * t]), b = aj_probe_f(in[3 * t + 1]), c = aj_probe_f(in[3 * t + 2]);
  out[2 * t] = aj_float_as_uint(a * b + c);
  out[2 * t + 1] = aj_float_as_uint(a * b);
}

// ---- sm_90a: wgmma (built on the emulator and for sm_90a only; other GPUs skip these probes) ----
#if defined(AJ_EMULATE) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The shared-window byte offset of element (mn, k) of a 16-bit wgmma operand in a canonical layout
// (PTX ISA "Shared Memory Matrix Layout"; sw: swizzle bytes, 0 for none), from a start address on
// the swizzle pattern's boundary, then the swizzle of the address itself.
__device__ __forceinline__ aj_u32 aj_probe_wgmma_at(aj_u32 start, int sw, bool mn_major, int mn, int k, aj_u32 lbo, aj_u32 sbo) {
  aj_u32 off;
  if (!mn_major)
    off = sw == 0 ? (mn % 8) * 16 + (mn / 8) * sbo + (k / 8) * lbo + (k % 8) * 2 : (mn % 8) * sw + (mn / 8) * sbo + k * 2;
  else
    off = sw == 0 ? (mn % 8) * 2 + (mn / 8) * sbo + (k % 8) * 16 + (k / 8) * lbo
                  : (mn * 2) % sw + (mn * 2 / sw) * lbo + (k % 8) * sw + (k / 8) * sbo;
  const aj_u32 addr = start + off, mask = sw == 0 ? 0 : sw / 16 - 1;
  return addr ^ (((addr >> 7) & mask) << 4);
}

// D [64][N] = A [64][64] * B [64][N] in four k16 steps, accumulated without waits in between:
// in = A (row-major, 16-bit pairs), then B (row-major [k][n]); out[row * N + col] = D.
// A: registers (A_SW < 0) or shared memory, K-major with swizzle A_SW; B: shared memory, K-major
// (B_MN 0) or N-major (B_MN 1) with swizzle B_SW. A k16 step moves a swizzled K-major operand's start
// 32 bytes within its rows (K_STEP_A/B: bytes per step); other layouts step by whole atoms.
#define AJ_PROBE_WGMMA(NAME, N, TYPE, A_SW, A_LBO, A_SBO, A_STEP, B_SW, B_MN, B_LBO, B_SBO, B_STEP)                 \
  extern "C" __global__ void NAME(const aj_u32* in, aj_u32* out) {                                                  \
    AJ_DYNAMIC_SHARED(smem);                                                                                        \
    const int t = aj_thread_idx();                                                                                  \
    unsigned char* tiles = smem + (1024 - aj_smem_addr(smem) % 1024) % 1024;                                        \
    const aj_u32 base = aj_smem_addr(tiles), a_at = base, b_at = base + 16384;                                      \
    const aj_u16* g = (const aj_u16*)in;                                                                            \
    for (int i = t; i < 64 * 64; i += 128) {                                                                        \
      const int r = i / 64, k = i % 64;                                                                             \
      if (A_SW >= 0)                                                                                                \
        *(aj_u16*)(tiles + aj_probe_wgmma_at(a_at + (k / 16) * A_STEP, A_SW, false, r, k % 16, A_LBO, A_SBO) - base) = g[i]; \
    }                                                                                                               \
    for (int i = t; i < 64 * N; i += 128) {                                                                         \
      const int k = i / N, n = i % N;                                                                               \
      *(aj_u16*)(tiles + aj_probe_wgmma_at(b_at + (k / 16) * B_STEP, B_SW, B_MN, n, k % 16, B_LBO, B_SBO) - base) =  \
          g[64 * 64 + i];                                                                                           \
    }                                                                                                               \
    aj_fence_proxy_async();                                                                                         \
    aj_syncthreads();                                                                                               \
    const int w = t / 32, grp = (t % 32) / 4, q = t % 4;                                                            \
    aj_u32 af[4][4];                                                                                                \
    for (int ks = 0; ks < 4; ++ks)                                                                                  \
      for (int reg = 0; reg < 4; ++reg) {                                                                           \
        const int row = 16 * w + grp + 8 * (reg & 1), col = 16 * ks + 2 * q + 8 * (reg >> 1);                      \
        af[ks][reg] = (aj_u32)g[row * 64 + col] | (aj_u32)g[row * 64 + col + 1] << 16;                              \
      }                                                                                                             \
    float d[N / 2];                                                                                                 \
    aj_wgmma_fence();                                                                                               \
    for (int ks = 0; ks < 4; ++ks) {                                                                                \
      const aj_u64 db = B_SW == 128   ? aj_wgmma_desc<128>(b_at + ks * B_STEP, B_LBO, B_SBO)                        \
                        : B_SW == 64 ? aj_wgmma_desc<64>(b_at + ks * B_STEP, B_LBO, B_SBO)                          \
                        : B_SW == 32 ? aj_wgmma_desc<32>(b_at + ks * B_STEP, B_LBO, B_SBO)                          \
                                     : aj_wgmma_desc<0>(b_at + ks * B_STEP, B_LBO, B_SBO);                          \
      if (A_SW < 0) {                                                                                               \
        aj_wgmma_rs<N, TYPE, B_MN>(d, af[ks], db, ks > 0);                                                          \
      } else {                                                                                                      \
        const aj_u64 da = A_SW == 128  ? aj_wgmma_desc<128>(a_at + ks * A_STEP, A_LBO, A_SBO)                       \
                          : A_SW == 32 ? aj_wgmma_desc<32>(a_at + ks * A_STEP, A_LBO, A_SBO)                        \
                                       : aj_wgmma_desc<0>(a_at + ks * A_STEP, A_LBO, A_SBO);                        \
        aj_wgmma_ss<N, TYPE, B_MN>(d, da, db, ks > 0);                                                              \
      }                                                                                                             \
    }                                                                                                               \
    aj_wgmma_commit();                                                                                              \
    aj_wgmma_wait<0>();                                                                                             \
    for (int i = 0; i < N / 2; ++i) {                                                                               \
      const int row = 16 * w + grp + 8 * ((i % 4) >> 1), col = 8 * (i / 4) + 2 * q + (i & 1);                      \
      out[row * N + col] = aj_float_as_uint(d[i]);                                                                  \
    }                                                                                                               \
  }
// Both K-major with the 128-byte swizzle (the forward's S = Q K^T): rows of 128 bytes, 8-row groups
// 1024 bytes apart, a k16 step 32 bytes along the rows.
AJ_PROBE_WGMMA(probe_wgmma_ss_sw128, 128, AJ_WGMMA_F16, 128, 16, 1024, 32, 128, 0, 16, 1024, 32)
// The same at N = 176 (the forward's S over a 176-key tile): 22 8-row groups of keys.
AJ_PROBE_WGMMA(probe_wgmma_ss_sw128_n176, 176, AJ_WGMMA_BF16, 128, 16, 1024, 32, 128, 0, 16, 1024, 32)
// A in registers, B N-major with the 128-byte swizzle (the forward's O += P V): two 64-column
// blocks 8192 bytes apart (LBO), 8-row groups of k 1024 bytes apart (SBO), a k16 step 2048 bytes.
AJ_PROBE_WGMMA(probe_wgmma_rs_mn_sw128, 128, AJ_WGMMA_BF16, -1, 0, 0, 0, 128, 1, 8192, 1024, 2048)
// The other layouts: A K-major with the 32-byte swizzle (each k16 step its own 64 x 32-byte block),
// B N-major without swizzle (8 x 8 core matrices: SBO 128 along n, LBO 1024 along k).
AJ_PROBE_WGMMA(probe_wgmma_ss_sw32_interleave, 64, AJ_WGMMA_F16, 32, 16, 256, 2048, 0, 1, 1024, 128, 2048)
// A K-major and B N-major, both with the 128-byte swizzle, from shared memory (the Hopper
// backward's dQ = dS K: dS K-major, K's rows the k dimension).
AJ_PROBE_WGMMA(probe_wgmma_ss_mn_sw128, 64, AJ_WGMMA_BF16, 128, 16, 1024, 32, 128, 1, 8192, 1024, 2048)

// D [64][64] = A [64][128] * B [128][64] on FP8 e4m3 codes in four k32 steps (the forward's S =
// Q K^T at head dim 128): in = A's codes (row-major bytes), then B's as [n][k] bytes (K-major);
// both K-major in shared memory with the 128-byte swizzle (a row of 128 bytes is 128 codes, a k32
// step 32 bytes along it), or A (A_REGS) from registers: byte b of register r holds row 16w + l/4 +
// 8(r % 2), column 4(l % 4) + b + 16(r / 2). out[row * 64 + col] = D.
#define AJ_PROBE_WGMMA_E4M3(NAME, A_REGS)                                                                         \
  extern "C" __global__ void NAME(const aj_u32* in, aj_u32* out) {                                                \
    AJ_DYNAMIC_SHARED(smem);                                                                                      \
    const int t = aj_thread_idx();                                                                                \
    unsigned char* tiles = smem + (1024 - aj_smem_addr(smem) % 1024) % 1024;                                      \
    const unsigned char* g = (const unsigned char*)in;                                                            \
    for (int x = t; x < (64 + 64) * 8; x += 128) {                                                                \
      const int r = x / 8, c = x % 8;                                                                             \
      unsigned char* dst = tiles + r * 128 + ((c ^ (r % 8)) << 4);                                                \
      for (int e = 0; e < 16; ++e) dst[e] = g[r * 128 + c * 16 + e];                                              \
    }                                                                                                             \
    aj_fence_proxy_async();                                                                                       \
    aj_syncthreads();                                                                                             \
    const int w = t / 32, grp = (t % 32) / 4, q = t % 4;                                                          \
    aj_u32 af[4][4];                                                                                              \
    for (int ks = 0; ks < 4; ++ks)                                                                                \
      for (int reg = 0; reg < 4; ++reg) {                                                                         \
        const int row = 16 * w + grp + 8 * (reg & 1), col = 32 * ks + 4 * q + 16 * (reg >> 1);                    \
        af[ks][reg] = 0;                                                                                          \
        for (int b = 0; b < 4; ++b) af[ks][reg] |= (aj_u32)g[row * 128 + col + b] << (8 * b);                     \
      }                                                                                                           \
    const aj_u32 sa = aj_smem_addr(tiles), sb = sa + 64 * 128;                                                    \
    float d[32];                                                                                                  \
    aj_wgmma_fence();                                                                                             \
    for (int ks = 0; ks < 4; ++ks) {                                                                              \
      const aj_u64 db = aj_wgmma_desc<128>(sb + ks * 32, 16, 1024);                                               \
      if (A_REGS) aj_wgmma_rs<64, AJ_WGMMA_E4M3, 0>(d, af[ks], db, ks > 0);                                       \
      else aj_wgmma_ss<64, AJ_WGMMA_E4M3, 0>(d, aj_wgmma_desc<128>(sa + ks * 32, 16, 1024), db, ks > 0);           \
    }                                                                                                             \
    aj_wgmma_commit();                                                                                            \
    aj_wgmma_wait<0>();                                                                                           \
    for (int i = 0; i < 32; ++i) {                                                                                \
      const int row = 16 * w + grp + 8 * ((i % 4) >> 1), col = 8 * (i / 4) + 2 * q + (i & 1);                    \
      out[row * 64 + col] = aj_float_as_uint(d[i]);                                                               \
    }                                                                                                             \
  }
// Small integers (exact whatever the accumulation): the layouts, from shared memory and registers.
AJ_PROBE_WGMMA_E4M3(probe_wgmma_e4m3_ss_sw128, 0)
AJ_PROBE_WGMMA_E4M3(probe_wgmma_e4m3_rs_sw128, 1)
// Codes over e4m3's whole range: how the tensor cores sum 32 products and the accumulator (each
// term truncated to 2^(E - 13), the sum to 13 fraction bits: e4m3_fused_dot_add).
AJ_PROBE_WGMMA_E4M3(probe_wgmma_e4m3_rounding, 0)

// cvt.rn.satfinite.e4m3x2.f32 (FP8, sm_89+; run on sm_90a and the emulator): out[t] holds
// cvt(in[4t], in[4t+1]) in its low 16 bits and cvt(in[4t+2], in[4t+3]) in its high 16 bits.
// Then cvt.rn.f16x2.e4m3x2 of every 16-bit pair of codes: out[64 + 2t], out[64 + 2t + 1] are the
// fp16 pairs of in[t]'s low and high halves as raw codes (every byte value among the inputs).
extern "C" __global__ void probe_cvt_e4m3x2(const aj_u32* in, aj_u32* out) {
  const int t = aj_thread_idx();
  const aj_u32 lo = aj_cvt_e4m3x2(aj_probe_f(in[4 * t]), aj_probe_f(in[4 * t + 1]));
  const aj_u32 hi = aj_cvt_e4m3x2(aj_probe_f(in[4 * t + 2]), aj_probe_f(in[4 * t + 3]));
  out[t] = hi << 16 | lo;
  const aj_u32 codes = in[256 + t];
  out[64 + 2 * t] = aj_cvt_f16x2_e4m3x2((aj_u16)(codes & 0xffffu));
  out[64 + 2 * t + 1] = aj_cvt_f16x2_e4m3x2((aj_u16)(codes >> 16));
}

// mma.sync m16n8k32 on e4m3 (sm_89+; run on sm_90a and the emulator), laid out as the f16 probes:
// in[lane * 10 + 0..3] = A registers (4 codes each), 4..5 = B registers, 6..9 = C (fp32 bits);
// out = D. Small integers: the fragments, exact in any order of summation. How the sums round is
// not probed: on sm_90 ptxas builds the instruction from two f16 HMMAs and an add of C (not the
// QMMA of sm_89 and sm_120, which no GPU here has), so a hardware answer would be of another
// instruction than the one the kernel is for.
AJ_PROBE_MMA(probe_mma_e4m3, aj_mma_e4m3)

// ---- sm_90: mbarrier and TMA (built on the emulator and for sm_90a; other GPUs skip these) ------
// An mbarrier of all 128 threads as a barrier over three phases, exchanging words through shared
// memory; and test_wait on an mbarrier nobody arrives at: parity 0 (its first phase) is not
// complete, parity 1 (the phase "before" it) is. out[t] = test bits, out[128 (k + 1) + t] = the
// word of phase k another thread wrote.
extern "C" __global__ void probe_mbarrier(const aj_u32* in, aj_u32* out) {
  AJ_DYNAMIC_SHARED(smem);
  aj_u64* bars = (aj_u64*)smem;
  aj_u32* buf = (aj_u32*)(smem + 16);
  const int t = aj_thread_idx();
  if (t == 0) {
    aj_mbarrier_init(&bars[0], 128);
    aj_mbarrier_init(&bars[1], 1);
  }
  aj_syncthreads();
  out[t] = (aj_mbarrier_test_wait(&bars[1], 0) ? 1u : 0u) | (aj_mbarrier_test_wait(&bars[1], 1) ? 2u : 0u);
  for (int k = 0; k < 3; ++k) {
    buf[(k % 2) * 128 + t] = in[t] * (aj_u32)(k + 3) + (aj_u32)k;
    aj_mbarrier_arrive(&bars[0]);
    aj_mbarrier_wait(&bars[0], (aj_u32)(k % 2));
    out[128 * (k + 1) + t] = buf[(k % 2) * 128 + (t * 37 + 11 + k) % 128];
  }
}

// Bulk asynchronous reductions (cp.reduce.async.bulk ... .add.f32) from shared memory into `out`
// (which starts at zero): 16 threads each add a 64-byte row of shared floats into out[16t ..], wait
// for completion, then add another thread's row into the same words (so each word is a + b rounded
// once, in a defined order); thread 0 then adds 16 bytes from the middle of a row at out[260 ..].
extern "C" __global__ void probe_red_add_bulk_f32(const aj_u32* in, aj_u32* out) {
  AJ_DYNAMIC_SHARED(smem);
  float* buf = (float*)smem;
  const int t = aj_thread_idx();
  for (int k = 0; k < 4; ++k) buf[t * 4 + k] = aj_probe_f(in[t * 4 + k]);
  aj_fence_proxy_async();
  aj_syncthreads();
  if (t < 16) {
    aj_bulk_reduce_add_f32((float*)out + t * 16, buf + t * 16, 64);
    aj_bulk_commit();
    aj_bulk_wait<0>();
    aj_bulk_reduce_add_f32((float*)out + t * 16, buf + ((t + 5) % 16) * 16, 64);
    aj_bulk_commit();
    aj_bulk_wait<0>();
  }
  if (t == 0) {
    aj_bulk_reduce_add_f32((float*)out + 260, buf + 36, 16);
    aj_bulk_commit();
    aj_bulk_wait_read<0>();
    aj_bulk_wait<0>();
  }
}

// TMA tile loads of two boxes completing on one mbarrier (one thread announces the bytes and
// issues both; every thread waits), then every thread copies shared memory out word by word, so
// the golden file shows the layout in shared memory, swizzle included. The tensor map (made by
// run_probes.cpp over `in`) and the coordinates of the two boxes are per probe.
#define AJ_PROBE_TMA(NAME, BOX_BYTES, LOAD)                                                \
  extern "C" __global__ void NAME(const aj_u32* in, aj_u32* out, const __grid_constant__ aj_tensor_map map) { \
    AJ_DYNAMIC_SHARED(smem);                                                               \
    unsigned char* tiles = smem + (1024 - aj_smem_addr(smem) % 1024) % 1024;               \
    aj_u64* bar = (aj_u64*)(tiles + 2 * (BOX_BYTES));                                      \
    const int t = aj_thread_idx();                                                         \
    if (t == 0) aj_mbarrier_init(bar, 1);                                                  \
    aj_syncthreads();                                                                      \
    if (t == 0) {                                                                          \
      aj_mbarrier_arrive_expect_tx(bar, 2 * (BOX_BYTES));                                  \
      LOAD;                                                                                \
    }                                                                                      \
    aj_mbarrier_wait(bar, 0);                                                              \
    const aj_u32* w = (const aj_u32*)tiles;                                                \
    for (int i = t; i < 2 * (BOX_BYTES) / 4; i += 128) out[i] = w[i];                      \
  }
// A [100][64] 16-bit matrix, boxes of 64 x 64 with the 128-byte swizzle at rows 50 (rows 100..113
// out of bounds: zero) and -8 (rows -8..-1 out of bounds).
AJ_PROBE_TMA(probe_tma_2d_sw128, 8192,
             (aj_tma_load_2d(tiles, map, bar, 0, 50), aj_tma_load_2d(tiles + 8192, map, bar, 0, -8)))
// A [40 rows][3 heads][32] 16-bit tensor (dimensions innermost first: 32, 3 heads, 40 rows), boxes
// of one head and every third row (box 48, element stride 3: 16 rows) with the 64-byte swizzle:
// head 1 from row 20 (rows 41..65 out of bounds), head 2 from row -5 (rows -5, -2 out of bounds).
AJ_PROBE_TMA(probe_tma_3d_strided_sw64, 1024,
             (aj_tma_load_3d(tiles, map, bar, 0, 1, 20), aj_tma_load_3d(tiles + 1024, map, bar, 0, 2, -5)))

// TMA tile stores, as the forward's staged O goes out: every thread copies words of `in` into two
// 2048-byte boxes of shared memory (taken as laid out with the 128-byte swizzle), fence.proxy.async
// and a barrier, then thread 0 stores both boxes through a map over `out` (made by run_probes.cpp)
// in one bulk group and waits for it. `out` is a [2 batch][40 rows][3 heads][64] 16-bit tensor
// (dimensions innermost first: 64, 3 heads, 40 rows, 2 batch) that starts poisoned; boxes of one
// head and every second row (box 32, element stride 2: 16 rows): head 1 of batch 1 from row 10
// (row 40 out of bounds: dropped), head 2 of batch 0 from row 0. The words no box reaches, the odd
// rows among them, must keep the poison. (A store box may not start at a negative coordinate: an
// H200 raised an illegal instruction for one from row -4, and the emulator refuses it.)
extern "C" __global__ void probe_tma_store_strided_sw128(const aj_u32* in, aj_u32* out, const __grid_constant__ aj_tensor_map map) {
  AJ_DYNAMIC_SHARED(smem);
  unsigned char* tiles = smem + (1024 - aj_smem_addr(smem) % 1024) % 1024;
  const int t = aj_thread_idx();
  for (int i = t; i < 2 * 2048 / 4; i += 128) ((aj_u32*)tiles)[i] = in[i];
  aj_fence_proxy_async();  // the generic stores, then the TMA stores that read them
  aj_syncthreads();
  if (t == 0) {
    aj_tma_store_4d(map, tiles, 0, 1, 10, 1);
    aj_tma_store_4d(map, tiles + 2048, 0, 2, 0, 0);
    aj_bulk_commit();
    aj_bulk_wait<0>();
  }
  (void)out;
}
#endif
