// Probe kernels: one per building block of templates/gpu_blocks.cuh. Each writes what every lane
// received, as 32-bit words, so the emulator's output (the golden files beside this one) and the
// hardware's can be compared bit for bit. tests/gpu/probes/run_probes.cpp prepends gpu_blocks.cuh,
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

// cp.async.cg 16 bytes with src-size 16 or 0 (zero fill), two groups, wait_group 0; 32 threads,
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

// fp32 arithmetic as NVRTC compiles it (--use_fast_math: contraction to fma, subnormals flushed):
// out[2t] = a * b + c, out[2t+1] = a * b (in[3t..3t+2] = a, b, c).
extern "C" __global__ void probe_fp32_arith(const aj_u32* in, aj_u32* out) {
  const int t = aj_thread_idx();
  const float a = aj_probe_f(in[3 * t]), b = aj_probe_f(in[3 * t + 1]), c = aj_probe_f(in[3 * t + 2]);
  out[2 * t] = aj_float_as_uint(a * b + c);
  out[2 * t + 1] = aj_float_as_uint(a * b);
}
