// Building blocks (templates/blocks/base.cuh says how they work): memory. Shared memory, the
// asynchronous global -> shared copies (cp.async, TMA), ldmatrix, and reductions into global memory.

// Sixteen bytes moved as one (a 128-bit load or store; the address must be 16-byte aligned): four
// words or four floats; and two floats as one 8-byte load or store (8-byte aligned). Kernels load and store them through
// aj_ld_* and aj_st_*: one LDS/STS/LDG/STG of that width on hardware, and one access of that width
// in the emulator (whose host compiler would split a struct copy into its fields, and whose bank
// profile counts accesses by width).
struct __align__(16) aj_u32x4 {
  aj_u32 x, y, z, w;
};
struct __align__(8) aj_f32x2 {
  float x, y;
};
struct __align__(16) aj_f32x4 {
  float x, y, z, w;
};
#ifndef AJ_EMULATE
__device__ __forceinline__ aj_u32x4 aj_ld_u32x4(const void* p) { return *(const aj_u32x4*)p; }
__device__ __forceinline__ void aj_st_u32x4(void* p, aj_u32x4 v) { *(aj_u32x4*)p = v; }
__device__ __forceinline__ aj_f32x2 aj_ld_f32x2(const void* p) { return *(const aj_f32x2*)p; }
__device__ __forceinline__ void aj_st_f32x2(void* p, aj_f32x2 v) { *(aj_f32x2*)p = v; }
__device__ __forceinline__ aj_f32x4 aj_ld_f32x4(const void* p) { return *(const aj_f32x4*)p; }
__device__ __forceinline__ void aj_st_f32x4(void* p, aj_f32x4 v) { *(aj_f32x4*)p = v; }
#else
__device__ __forceinline__ aj_u32x4 aj_ld_u32x4(const void* p) {
  aj_u32x4 v;
  aj_emu_vector_load(&v, p, 16);
  return v;
}
__device__ __forceinline__ void aj_st_u32x4(void* p, aj_u32x4 v) { aj_emu_vector_store(p, &v, 16); }
__device__ __forceinline__ aj_f32x2 aj_ld_f32x2(const void* p) {
  aj_f32x2 v;
  aj_emu_vector_load(&v, p, 8);
  return v;
}
__device__ __forceinline__ void aj_st_f32x2(void* p, aj_f32x2 v) { aj_emu_vector_store(p, &v, 8); }
__device__ __forceinline__ aj_f32x4 aj_ld_f32x4(const void* p) {
  aj_f32x4 v;
  aj_emu_vector_load(&v, p, 16);
  return v;
}
__device__ __forceinline__ void aj_st_f32x4(void* p, aj_f32x4 v) { aj_emu_vector_store(p, &v, 16); }
#endif

#ifndef AJ_EMULATE  // ---- hardware bodies (inline PTX) ----

// Dynamic shared memory (its size is a launch parameter) and a statically sized shared variable
// (of a class or scalar type: wrap arrays in a struct).
#define AJ_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#define AJ_STATIC_SHARED(type, name) __shared__ type name

// The compiler's own conversion (not inline PTX), so that constant offsets from one base fold into
// the instructions' immediates and the conversion is done once per base.
__device__ __forceinline__ aj_u32 aj_smem_addr(const void* p) { return (aj_u32)__cvta_generic_to_shared(p); }

// 16-byte asynchronous copy global -> shared; `valid` false zero-fills the destination and does
// not read `gmem` at all (the ignore-src operand: "the data from the source location src is
// ignored completely"), so a row past a tile's end needs no safe address of its own.
__device__ __forceinline__ void aj_cp_async16(void* smem, const void* gmem, bool valid) {
  asm volatile(
      "{\n .reg .pred ignore;\n setp.eq.u32 ignore, %2, 0;\n"
      " cp.async.cg.shared.global [%0], [%1], 16, ignore;\n}" ::"r"(aj_smem_addr(smem)),
      "l"(gmem), "r"((aj_u32)valid));
}
__device__ __forceinline__ void aj_cp_async_commit() { asm volatile("cp.async.commit_group;"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void aj_cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

// ldmatrix .m8n8 .b16: lanes 8j..8j+7 give the row addresses of matrix j; r[j] is this lane's
// piece of matrix j (row lane/4, columns 2*(lane%4) and +1; with .trans, of the transpose).
__device__ __forceinline__ void aj_ldmatrix_x1(aj_u32 (&r)[1], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(r[0]) : "r"(aj_smem_addr(smem)));
}
__device__ __forceinline__ void aj_ldmatrix_x2(aj_u32 (&r)[2], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(aj_smem_addr(smem)));
}
__device__ __forceinline__ void aj_ldmatrix_x4(aj_u32 (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(aj_smem_addr(smem)));
}
__device__ __forceinline__ void aj_ldmatrix_x1_trans(aj_u32 (&r)[1], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];" : "=r"(r[0]) : "r"(aj_smem_addr(smem)));
}
__device__ __forceinline__ void aj_ldmatrix_x2_trans(aj_u32 (&r)[2], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(aj_smem_addr(smem)));
}
__device__ __forceinline__ void aj_ldmatrix_x4_trans(aj_u32 (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(aj_smem_addr(smem)));
}
// stmatrix .m8n8 .x4 .trans .b16 (sm_90): ldmatrix's inverse. r[j] is this lane's piece of matrix
// j (row lane/4, columns 2*(lane%4) and +1), written transposed: lanes 8j..8j+7 give the addresses
// of the 16-byte rows of the stored matrix j, whose row c holds column c of the lanes' matrix.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void aj_stmatrix_x4_trans(const aj_u32 (&r)[4], void* smem) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};" ::"r"(aj_smem_addr(smem)), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}
#endif

// red.global.add.f32: *p += v atomically (no result); subnormals flushed.
__device__ __forceinline__ void aj_red_add_f32(float* p, float v) {
  asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory");
}
// red.global.add.u32: *p += v atomically (no result).
__device__ __forceinline__ void aj_red_add_u32(aj_u32* p, aj_u32 v) {
  asm volatile("red.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// p[0] += a, p[1] += b, each atomically; p 8-byte aligned. One red.global.add.v2.f32 from sm_90
// (half the reduction instructions), two scalar ones before.
__device__ __forceinline__ void aj_red_add_f32x2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
  aj_red_add_f32(p, a);
  aj_red_add_f32(p + 1, b);
#endif
}

// Bulk asynchronous reduction (sm_90): aj_bulk_reduce_add_f32 adds `bytes` (a non-zero multiple of
// 16) of floats at shared `src` into global `dst`, element by element (each an fp32 add, as
// red.global.add.f32), both 16-byte aligned, through the async proxy: a thread that wrote `src`
// runs aj_fence_proxy_async() before the barrier that orders it before the issue. The operation
// joins the issuing thread's open bulk group; aj_bulk_commit closes it; aj_bulk_wait_read<N>()
// returns once at most N of the thread's groups may still read their sources (which may then be
// overwritten), aj_bulk_wait<N>() once at most N are incomplete. A thread waits for every group it
// issued before it exits.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void aj_bulk_reduce_add_f32(float* dst, const float* src, aj_u32 bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(dst), "r"(aj_smem_addr(src)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void aj_bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void aj_bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void aj_bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}
#endif  // __CUDA_ARCH__ >= 900

// TMA (sm_90): aj_tma_load_Nd loads one box of a tensor map (made on the host, a __grid_constant__
// kernel parameter) at the given element coordinates (innermost first; out of bounds reads zero)
// into shared memory (aligned to 128 bytes, or 8 x the swizzle width), completing its bytes on the
// mbarrier `bar` (sync.cuh). Its bytes may be read only after a wait on that phase.
struct __align__(64) aj_tensor_map {
  aj_u64 opaque[16];
};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define AJ_TMA_LOAD(RANK, COORDS, ...)                                                                                     \
  asm volatile("cp.async.bulk.tensor." #RANK "d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {" COORDS \
               "}], [%2];" ::"r"(aj_smem_addr(dst)),                                                                       \
               "l"((aj_u64)&map), "r"(aj_smem_addr(bar)), __VA_ARGS__                                                       \
               : "memory")
__device__ __forceinline__ void aj_tma_load_2d(void* dst, const aj_tensor_map& map, aj_u64* bar, int c0, int c1) {
  AJ_TMA_LOAD(2, "%3, %4", "r"(c0), "r"(c1));
}
__device__ __forceinline__ void aj_tma_load_3d(void* dst, const aj_tensor_map& map, aj_u64* bar, int c0, int c1, int c2) {
  AJ_TMA_LOAD(3, "%3, %4, %5", "r"(c0), "r"(c1), "r"(c2));
}
__device__ __forceinline__ void aj_tma_load_4d(void* dst, const aj_tensor_map& map, aj_u64* bar, int c0, int c1, int c2, int c3) {
  AJ_TMA_LOAD(4, "%3, %4, %5, %6", "r"(c0), "r"(c1), "r"(c2), "r"(c3));
}
__device__ __forceinline__ void aj_tma_load_5d(void* dst, const aj_tensor_map& map, aj_u64* bar, int c0, int c1, int c2, int c3,
                                               int c4) {
  AJ_TMA_LOAD(5, "%3, %4, %5, %6, %7", "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4));
}
// aj_tma_store_Nd: the reverse, one box from shared memory (laid out as a load of it would leave
// it; written through the generic proxy, then fence.proxy.async and a barrier before the issue)
// to the tensor, elements outside it dropped, in the issuing thread's open bulk group
// (aj_bulk_commit; aj_bulk_wait_read before the source is written again).
#define AJ_TMA_STORE(RANK, COORDS, ...)                                                                                      \
  asm volatile("cp.async.bulk.tensor." #RANK "d.global.shared::cta.tile.bulk_group [%0, {" COORDS "}], [%1];" ::"l"((aj_u64)&map), \
               "r"(aj_smem_addr(src)), __VA_ARGS__                                                                          \
               : "memory")
__device__ __forceinline__ void aj_tma_store_4d(const aj_tensor_map& map, const void* src, int c0, int c1, int c2, int c3) {
  AJ_TMA_STORE(4, "%2, %3, %4, %5", "r"(c0), "r"(c1), "r"(c2), "r"(c3));
}
__device__ __forceinline__ void aj_tma_store_5d(const aj_tensor_map& map, const void* src, int c0, int c1, int c2, int c3, int c4) {
  AJ_TMA_STORE(5, "%2, %3, %4, %5, %6", "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4));
}
#endif  // __CUDA_ARCH__ >= 900

#else  // ---- emulation twins (the emulator's runtime, emulator/emu_abi.h) ----

#define AJ_DYNAMIC_SHARED(name) unsigned char* const name = (unsigned char*)aj_emu_dynamic_shared()
#define AJ_STATIC_SHARED(type, name)                                                               \
  static const char aj_static_shared_key_##name = 0;                                              \
  type& name = *(type*)aj_emu_static_shared(&aj_static_shared_key_##name, sizeof(type), alignof(type))

__device__ __forceinline__ aj_u32 aj_smem_addr(const void* p) { return aj_emu_smem_addr(p); }

__device__ __forceinline__ void aj_cp_async16(void* smem, const void* gmem, bool valid) {
  aj_emu_cp_async(smem, gmem, 16, valid ? 16 : 0);
}
__device__ __forceinline__ void aj_cp_async_commit() { aj_emu_cp_async_commit(); }
template <int N>
__device__ __forceinline__ void aj_cp_async_wait() { aj_emu_cp_async_wait(N); }

__device__ __forceinline__ void aj_ldmatrix_x1(aj_u32 (&r)[1], const void* smem) { aj_emu_ldmatrix(r, smem, 1, 0); }
__device__ __forceinline__ void aj_ldmatrix_x2(aj_u32 (&r)[2], const void* smem) { aj_emu_ldmatrix(r, smem, 2, 0); }
__device__ __forceinline__ void aj_ldmatrix_x4(aj_u32 (&r)[4], const void* smem) { aj_emu_ldmatrix(r, smem, 4, 0); }
__device__ __forceinline__ void aj_ldmatrix_x1_trans(aj_u32 (&r)[1], const void* smem) { aj_emu_ldmatrix(r, smem, 1, 1); }
__device__ __forceinline__ void aj_ldmatrix_x2_trans(aj_u32 (&r)[2], const void* smem) { aj_emu_ldmatrix(r, smem, 2, 1); }
__device__ __forceinline__ void aj_ldmatrix_x4_trans(aj_u32 (&r)[4], const void* smem) { aj_emu_ldmatrix(r, smem, 4, 1); }
__device__ __forceinline__ void aj_stmatrix_x4_trans(const aj_u32 (&r)[4], void* smem) { aj_emu_stmatrix(r, smem, 4, 1); }

__device__ __forceinline__ void aj_red_add_f32(float* p, float v) { aj_emu_red_add_f32(p, v); }
__device__ __forceinline__ void aj_red_add_u32(aj_u32* p, aj_u32 v) { aj_emu_red_add_u32(p, v); }
__device__ __forceinline__ void aj_red_add_f32x2(float* p, float a, float b) { aj_emu_red_add_f32x2(p, a, b); }
// The adds land when the thread waits for their group (either wait): the emulator checks there
// that the source did not change since the issue.
__device__ __forceinline__ void aj_bulk_reduce_add_f32(float* dst, const float* src, aj_u32 bytes) {
  aj_emu_bulk_reduce_add_f32(dst, src, bytes);
}
__device__ __forceinline__ void aj_bulk_commit() { aj_emu_bulk_commit(); }
template <int N>
__device__ __forceinline__ void aj_bulk_wait_read() {
  aj_emu_bulk_wait(N, 1);
}
template <int N>
__device__ __forceinline__ void aj_bulk_wait() {
  aj_emu_bulk_wait(N, 0);
}

struct __align__(64) aj_tensor_map {
  aj_u64 opaque[16];
};
__device__ __forceinline__ void aj_tma_load_2d(void* dst, const aj_tensor_map& map, aj_u64* bar, int c0, int c1) {
  const int c[2] = {c0, c1};
  aj_emu_tma_load(dst, &map, c, 2, bar);
}
__device__ __forceinline__ void aj_tma_load_3d(void* dst, const aj_tensor_map& map, aj_u64* bar, int c0, int c1, int c2) {
  const int c[3] = {c0, c1, c2};
  aj_emu_tma_load(dst, &map, c, 3, bar);
}
__device__ __forceinline__ void aj_tma_load_4d(void* dst, const aj_tensor_map& map, aj_u64* bar, int c0, int c1, int c2, int c3) {
  const int c[4] = {c0, c1, c2, c3};
  aj_emu_tma_load(dst, &map, c, 4, bar);
}
__device__ __forceinline__ void aj_tma_load_5d(void* dst, const aj_tensor_map& map, aj_u64* bar, int c0, int c1, int c2, int c3,
                                               int c4) {
  const int c[5] = {c0, c1, c2, c3, c4};
  aj_emu_tma_load(dst, &map, c, 5, bar);
}
__device__ __forceinline__ void aj_tma_store_4d(const aj_tensor_map& map, const void* src, int c0, int c1, int c2, int c3) {
  const int c[4] = {c0, c1, c2, c3};
  aj_emu_tma_store(&map, c, 4, src);
}
__device__ __forceinline__ void aj_tma_store_5d(const aj_tensor_map& map, const void* src, int c0, int c1, int c2, int c3, int c4) {
  const int c[5] = {c0, c1, c2, c3, c4};
  aj_emu_tma_store(&map, c, 5, src);
}

#endif  // AJ_EMULATE
