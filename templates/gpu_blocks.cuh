// attnjit kernel templates: the vocabulary of GPU building blocks. Kernels use these and nothing
// else that touches the hardware: index registers, barriers, shuffles, shared memory, cp.async,
// ldmatrix, mma, conversions and the approximate math instructions. Each block has two bodies:
// the hardware one (inline PTX, what NVRTC compiles) and its emulation twin, selected by
// AJ_EMULATE, which the CPU emulator (emulator/) defines when it compiles the same kernel text
// with the host compiler. The twins call the emulator's runtime (emulator/emu_abi.h), which gives
// each instruction the semantics of the PTX ISA. tests/gpu/probes/ runs one probe per block on
// both and compares them bit for bit.

typedef unsigned short aj_u16;
typedef unsigned int aj_u32;
typedef unsigned long long aj_u64;
typedef long long aj_i64;

#ifndef AJ_EMULATE
// ================================ hardware bodies =============================================

__device__ __forceinline__ int aj_thread_idx() { return (int)threadIdx.x; }
__device__ __forceinline__ int aj_block_idx_x() { return (int)blockIdx.x; }
__device__ __forceinline__ int aj_block_idx_y() { return (int)blockIdx.y; }
__device__ __forceinline__ int aj_block_idx_z() { return (int)blockIdx.z; }

__device__ __forceinline__ void aj_syncthreads() { __syncthreads(); }
// Every lane of the warp takes part; lane i receives `v` of lane i ^ lane_mask.
__device__ __forceinline__ float aj_shfl_xor(float v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }

// Dynamic shared memory (its size is a launch parameter) and a statically sized shared variable
// (of a class or scalar type: wrap arrays in a struct).
#define AJ_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#define AJ_STATIC_SHARED(type, name) __shared__ type name

__device__ __forceinline__ float aj_int_as_float(int x) { return __int_as_float(x); }
__device__ __forceinline__ float aj_uint_as_float(aj_u32 x) { return __uint_as_float(x); }
__device__ __forceinline__ aj_u32 aj_float_as_uint(float x) { return __float_as_uint(x); }

// The compiler's own conversion (not inline PTX), so that constant offsets from one base fold into
// the instructions' immediates and the conversion is done once per base.
__device__ __forceinline__ aj_u32 aj_smem_addr(const void* p) { return (aj_u32)__cvta_generic_to_shared(p); }

// 16-byte asynchronous copy global -> shared; `valid` false zero-fills the destination.
__device__ __forceinline__ void aj_cp_async16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(aj_smem_addr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
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

// D += A * B for one m16n8k16 tile, fp32 accumulators; A row-major 16x16, B column-major 16x8.
__device__ __forceinline__ void aj_mma_f16(float (&d)[4], const aj_u32 (&a)[4], aj_u32 b0, aj_u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void aj_mma_bf16(float (&d)[4], const aj_u32 (&a)[4], aj_u32 b0, aj_u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// cvt.rn.{f16,bf16}x2.f32 d, a, b: a goes to the upper half, b to the lower (PTX operand order).
__device__ __forceinline__ aj_u32 aj_cvt_f16x2(float hi, float lo) {
  aj_u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ aj_u32 aj_cvt_bf16x2(float hi, float lo) {
  aj_u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float aj_cvt_f32_f16(aj_u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ aj_u16 aj_cvt_f16_f32(float f) {
  aj_u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

// red.global.add.f32: *p += v atomically (no result); subnormals flushed.
__device__ __forceinline__ void aj_red_add_f32(float* p, float v) {
  asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory");
}

// ex2.approx.ftz.f32 and lg2.approx.ftz.f32: the SFU's approximations, subnormals flushed.
__device__ __forceinline__ float aj_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float aj_lg2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

#else
// ================================ emulation twins =============================================
// The aj_emu_* functions come from the emulator's prelude; each passes its caller's address on,
// so a report names the kernel line.

__device__ __forceinline__ int aj_thread_idx() { return (int)aj_emu_thread_idx(0); }
__device__ __forceinline__ int aj_block_idx_x() { return (int)aj_emu_block_idx(0); }
__device__ __forceinline__ int aj_block_idx_y() { return (int)aj_emu_block_idx(1); }
__device__ __forceinline__ int aj_block_idx_z() { return (int)aj_emu_block_idx(2); }

__device__ __forceinline__ void aj_syncthreads() { aj_emu_syncthreads(); }
__device__ __forceinline__ float aj_shfl_xor(float v, int lane_mask) {
  aj_u32 u;
  __builtin_memcpy(&u, &v, 4);
  u = aj_emu_shfl_xor(u, lane_mask);
  __builtin_memcpy(&v, &u, 4);
  return v;
}

#define AJ_DYNAMIC_SHARED(name) unsigned char* const name = (unsigned char*)aj_emu_dynamic_shared()
#define AJ_STATIC_SHARED(type, name)                                                               \
  static const char aj_static_shared_key_##name = 0;                                              \
  type& name = *(type*)aj_emu_static_shared(&aj_static_shared_key_##name, sizeof(type), alignof(type))

__device__ __forceinline__ float aj_int_as_float(int x) { float f; __builtin_memcpy(&f, &x, 4); return f; }
__device__ __forceinline__ float aj_uint_as_float(aj_u32 x) { float f; __builtin_memcpy(&f, &x, 4); return f; }
__device__ __forceinline__ aj_u32 aj_float_as_uint(float x) { aj_u32 u; __builtin_memcpy(&u, &x, 4); return u; }

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

__device__ __forceinline__ void aj_mma_f16(float (&d)[4], const aj_u32 (&a)[4], aj_u32 b0, aj_u32 b1) {
  const aj_u32 b[2] = {b0, b1};
  aj_emu_mma_m16n8k16(d, a, b, AJ_EMU_F16);
}
__device__ __forceinline__ void aj_mma_bf16(float (&d)[4], const aj_u32 (&a)[4], aj_u32 b0, aj_u32 b1) {
  const aj_u32 b[2] = {b0, b1};
  aj_emu_mma_m16n8k16(d, a, b, AJ_EMU_BF16);
}

__device__ __forceinline__ aj_u32 aj_cvt_f16x2(float hi, float lo) { return aj_emu_cvt_rn_x2(hi, lo, AJ_EMU_F16); }
__device__ __forceinline__ aj_u32 aj_cvt_bf16x2(float hi, float lo) { return aj_emu_cvt_rn_x2(hi, lo, AJ_EMU_BF16); }
__device__ __forceinline__ float aj_cvt_f32_f16(aj_u16 h) { return aj_emu_cvt_f32_f16(h); }
__device__ __forceinline__ aj_u16 aj_cvt_f16_f32(float f) { return aj_emu_cvt_rn_f16_f32(f); }

__device__ __forceinline__ void aj_red_add_f32(float* p, float v) { aj_emu_red_add_f32(p, v); }

__device__ __forceinline__ float aj_ex2(float x) { return aj_emu_ex2_approx_ftz(x); }
__device__ __forceinline__ float aj_lg2(float x) { return aj_emu_lg2_approx_ftz(x); }

#endif
