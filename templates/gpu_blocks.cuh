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
// Named barrier `id` (1..15) of `count` threads (a multiple of 32, whole warps): sync waits for
// all of them, arrive counts itself and goes on.
__device__ __forceinline__ void aj_named_sync(int id, int count) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory"); }
__device__ __forceinline__ void aj_named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}
// Every lane of the warp takes part; lane i receives `v` of lane i ^ lane_mask.
__device__ __forceinline__ float aj_shfl_xor(float v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }
// Lane 0's value in every lane (shfl.sync.idx from lane 0). Besides broadcasting, it tells ptxas that
// the value is the same across the warp, so what is computed from it (a warpgroup's wgmma
// descriptors, say) can live in uniform registers instead of being converted before every use.
__device__ __forceinline__ int aj_warp_uniform(int v) { return __shfl_sync(0xffffffffu, v, 0); }

// Dynamic shared memory (its size is a launch parameter) and a statically sized shared variable
// (of a class or scalar type: wrap arrays in a struct).
#define AJ_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#define AJ_STATIC_SHARED(type, name) __shared__ type name

__device__ __forceinline__ float aj_int_as_float(int x) { return __int_as_float(x); }
__device__ __forceinline__ float aj_uint_as_float(aj_u32 x) { return __uint_as_float(x); }
__device__ __forceinline__ aj_u32 aj_float_as_uint(float x) { return __float_as_uint(x); }
// a * b rounded to float, never contracted into an fma with what uses it (mul.rn): the softmax's
// exponents subtract a row maximum that was rounded the same way, so the maximum's is exactly 0.
__device__ __forceinline__ float aj_mul_rn(float a, float b) { return __fmul_rn(a, b); }

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

// Marks rare path `path` taken (AJ_RARE_*, common.cuh: the exact sums after a non-finite value):
// nothing on a GPU; the emulator counts them, so tests can tell that finite inputs never take one.
__device__ __forceinline__ void aj_rare_path(int) {}

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


// ---- Hopper (sm_90a): warpgroup MMA -----------------------------------------------------------
// wgmma.mma_async m64nNk16, fp32 += {f16,bf16}: the 128 threads of a warpgroup compute a 64 x N
// tile; thread t holds d[N/2] (warp t/32 owns rows 16(t/32)..+15; in each 8-column block j,
// d[4j..4j+3] are mma.m16n8k16's C/D elements). A comes from shared memory (a descriptor, K-major)
// or from registers (mma.m16n8k16's A fragment of the warp's rows); B from shared memory, K-major
// (TRANS_B = 0) or N-major (TRANS_B = 1). `accumulate` false ignores d (scale-d = 0). Between a
// thread's own accesses to d or a and a wgmma that uses them comes aj_wgmma_fence(); a wgmma's
// results are there only after aj_wgmma_commit() and aj_wgmma_wait<n>(); its shared-memory operands
// must not change before then. Shared memory written by threads (stores, cp.async) is read by a
// wgmma only after the writer's aj_fence_proxy_async() and a barrier.
#define AJ_WGMMA_F16 1
#define AJ_WGMMA_BF16 2

#ifdef __CUDA_ARCH_FEAT_SM90_ALL
__device__ __forceinline__ void aj_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void aj_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void aj_wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ void aj_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// setmaxnreg: every thread of the warpgroup moves its register budget to N (24..256, a multiple of
// 8); the warpgroups of a block share the register file (a producer gives up what consumers take).
template <int N>
__device__ __forceinline__ void aj_setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void aj_setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N)); }
template <int N>
struct AjWgmma;
// The register operands of one N: D's N/2 accumulators ("+f") and their "%0, ..., %(N/2-1)" list.
#define AJ_WGMMA_D32 \
      "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),\
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define AJ_WGMMA_R32 "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" "}"
#define AJ_WGMMA_D64 \
      "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),\
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),\
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),\
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define AJ_WGMMA_R64 \
  "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" ", "\
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" "}"
#define AJ_WGMMA_D128 \
      "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),\
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),\
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),\
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),\
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),\
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),\
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),\
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define AJ_WGMMA_R128 \
  "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" ", "\
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" ", "\
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" ", "\
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" "}"
#define AJ_WGMMA_D256 \
      "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),\
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),\
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),\
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),\
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),\
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),\
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),\
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),\
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),\
      "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),\
      "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),\
      "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),\
      "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),\
      "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),\
      "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),\
      "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define AJ_WGMMA_R256 \
  "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" ", "\
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" ", "\
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" ", "\
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" ", "\
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79" ", "\
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95" ", "\
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111" ", "\
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" "}"
// ss_TY: A and B from descriptors; rs_TY: A from registers. SS/RS: the operand list after D
// (its %-numbers follow D's), SP/RP: the scale-d predicate's operand.
#define AJ_WGMMA_OPS(N, TY, SP, SS, RP, RS)                                                                            \
  template <int TRANS_B>                                                                                              \
  __device__ __forceinline__ static void ss_##TY(float (&d)[N / 2], aj_u64 da, aj_u64 db, int scale_d) {              \
    asm volatile("{ .reg .pred p; setp.ne.b32 p, " SP ", 0; wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #TY "." #TY \
                 " " AJ_WGMMA_R##N ", " SS "; }"                                                                      \
                 : AJ_WGMMA_D##N                                                                                      \
                 : "l"(da), "l"(db), "r"(scale_d), "n"(TRANS_B));                                                     \
  }                                                                                                                   \
  template <int TRANS_B>                                                                                              \
  __device__ __forceinline__ static void rs_##TY(float (&d)[N / 2], const aj_u32 (&a)[4], aj_u64 db, int scale_d) {   \
    asm volatile("{ .reg .pred p; setp.ne.b32 p, " RP ", 0; wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #TY "." #TY \
                 " " AJ_WGMMA_R##N ", " RS "; }"                                                                      \
                 : AJ_WGMMA_D##N                                                                                      \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TRANS_B));                  \
  }
#define AJ_WGMMA_SHAPE(N, SP, SS, RP, RS) \
  template <>                             \
  struct AjWgmma<N> {                     \
    AJ_WGMMA_OPS(N, f16, SP, SS, RP, RS)  \
    AJ_WGMMA_OPS(N, bf16, SP, SS, RP, RS) \
  };
AJ_WGMMA_SHAPE(32, "%18", "%16, %17, p, 1, 1, 0, %19", "%21", "{%16, %17, %18, %19}, %20, p, 1, 1, %22")
AJ_WGMMA_SHAPE(64, "%34", "%32, %33, p, 1, 1, 0, %35", "%37", "{%32, %33, %34, %35}, %36, p, 1, 1, %38")
AJ_WGMMA_SHAPE(128, "%66", "%64, %65, p, 1, 1, 0, %67", "%69", "{%64, %65, %66, %67}, %68, p, 1, 1, %70")
AJ_WGMMA_SHAPE(256, "%130", "%128, %129, p, 1, 1, 0, %131", "%133", "{%128, %129, %130, %131}, %132, p, 1, 1, %134")
template <int N, int TYPE, int TRANS_B>
__device__ __forceinline__ void aj_wgmma_ss(float (&d)[N / 2], aj_u64 da, aj_u64 db, bool accumulate) {
  if (TYPE == AJ_WGMMA_BF16) AjWgmma<N>::template ss_bf16<TRANS_B>(d, da, db, accumulate ? 1 : 0);
  else AjWgmma<N>::template ss_f16<TRANS_B>(d, da, db, accumulate ? 1 : 0);
}
template <int N, int TYPE, int TRANS_B>
__device__ __forceinline__ void aj_wgmma_rs(float (&d)[N / 2], const aj_u32 (&a)[4], aj_u64 db, bool accumulate) {
  if (TYPE == AJ_WGMMA_BF16) AjWgmma<N>::template rs_bf16<TRANS_B>(d, a, db, accumulate ? 1 : 0);
  else AjWgmma<N>::template rs_f16<TRANS_B>(d, a, db, accumulate ? 1 : 0);
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// ---- Hopper (sm_90): mbarrier and TMA -----------------------------------------------------------
// An mbarrier (8 bytes of shared memory, 8-byte aligned) counts `count` arrivals per phase plus a
// transaction count of bytes; a phase completes when all arrivals have come and the bytes
// announced with aj_mbarrier_arrive_expect_tx have landed. aj_mbarrier_wait(bar, parity) returns
// once the phase of that parity has completed (phase k has parity k % 2; a wait on parity 1
// before any phase completed returns at once). Other threads use an mbarrier only after a
// barrier that follows its init. aj_tma_load_Nd loads one box of a tensor map (made on the host,
// a __grid_constant__ kernel parameter) at the given element coordinates (innermost first; out of
// bounds reads zero) into shared memory (aligned to 128 bytes, or 8 x the swizzle width),
// completing its bytes on `bar`. Its bytes may be read only after a wait on that phase.
struct __align__(64) aj_tensor_map {
  aj_u64 opaque[16];
};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void aj_mbarrier_init(aj_u64* bar, aj_u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(aj_smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void aj_mbarrier_arrive(aj_u64* bar) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" ::"r"(aj_smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void aj_mbarrier_arrive_expect_tx(aj_u64* bar, aj_u32 bytes) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" ::"r"(aj_smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void aj_mbarrier_wait(aj_u64* bar, aj_u32 parity) {
  asm volatile(
      "{ .reg .pred p; AJ_MBAR_WAIT: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1; @!p bra AJ_MBAR_WAIT; }" ::"r"(
          aj_smem_addr(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ bool aj_mbarrier_test_wait(aj_u64* bar, aj_u32 parity) {
  aj_u32 r;
  asm volatile("{ .reg .pred p; mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
               : "=r"(r)
               : "r"(aj_smem_addr(bar)), "r"(parity)
               : "memory");
  return r != 0;
}
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
#endif  // __CUDA_ARCH__ >= 900

#else
// ================================ emulation twins =============================================
// The aj_emu_* functions come from the emulator's prelude; each passes its caller's address on,
// so a report names the kernel line.

__device__ __forceinline__ int aj_thread_idx() { return (int)aj_emu_thread_idx(0); }
__device__ __forceinline__ int aj_block_idx_x() { return (int)aj_emu_block_idx(0); }
__device__ __forceinline__ int aj_block_idx_y() { return (int)aj_emu_block_idx(1); }
__device__ __forceinline__ int aj_block_idx_z() { return (int)aj_emu_block_idx(2); }

__device__ __forceinline__ void aj_syncthreads() { aj_emu_syncthreads(); }
__device__ __forceinline__ void aj_named_sync(int id, int count) { aj_emu_named_barrier(id, count, 1); }
__device__ __forceinline__ void aj_named_arrive(int id, int count) { aj_emu_named_barrier(id, count, 0); }
__device__ __forceinline__ float aj_shfl_xor(float v, int lane_mask) {
  aj_u32 u;
  __builtin_memcpy(&u, &v, 4);
  u = aj_emu_shfl_xor(u, lane_mask);
  __builtin_memcpy(&v, &u, 4);
  return v;
}
// Lane 0's value, by five butterfly steps: after step m, lanes that differ only in bits below m
// hold the value of the lowest of them.
__device__ __forceinline__ int aj_warp_uniform(int v) {
  const int lane = aj_thread_idx() % 32;
  for (int m = 1; m < 32; m <<= 1) {
    const int other = (int)aj_emu_shfl_xor((aj_u32)v, m);
    if (lane & m) v = other;
  }
  return v;
}

#define AJ_DYNAMIC_SHARED(name) unsigned char* const name = (unsigned char*)aj_emu_dynamic_shared()
#define AJ_STATIC_SHARED(type, name)                                                               \
  static const char aj_static_shared_key_##name = 0;                                              \
  type& name = *(type*)aj_emu_static_shared(&aj_static_shared_key_##name, sizeof(type), alignof(type))

__device__ __forceinline__ float aj_int_as_float(int x) { float f; __builtin_memcpy(&f, &x, 4); return f; }
__device__ __forceinline__ float aj_uint_as_float(aj_u32 x) { float f; __builtin_memcpy(&f, &x, 4); return f; }
__device__ __forceinline__ aj_u32 aj_float_as_uint(float x) { aj_u32 u; __builtin_memcpy(&u, &x, 4); return u; }
// The product stored as a float before any use: the host compiler contracts a * b - c too.
__device__ __forceinline__ float aj_mul_rn(float a, float b) {
  volatile float r = a * b;
  return r;
}

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
__device__ __forceinline__ void aj_red_add_u32(aj_u32* p, aj_u32 v) { aj_emu_red_add_u32(p, v); }
__device__ __forceinline__ void aj_red_add_f32x2(float* p, float a, float b) { aj_emu_red_add_f32x2(p, a, b); }
__device__ __forceinline__ void aj_rare_path(int path) { aj_emu_rare_path(path); }

__device__ __forceinline__ float aj_ex2(float x) { return aj_emu_ex2_approx_ftz(x); }
__device__ __forceinline__ float aj_lg2(float x) { return aj_emu_lg2_approx_ftz(x); }

__device__ __forceinline__ aj_u32 aj_smem_addr(const void* p) { return aj_emu_smem_addr(p); }

#define AJ_WGMMA_F16 1
#define AJ_WGMMA_BF16 2
__device__ __forceinline__ void aj_wgmma_fence() { aj_emu_wgmma_fence(); }
__device__ __forceinline__ void aj_wgmma_commit() { aj_emu_wgmma_commit(); }
template <int N>
__device__ __forceinline__ void aj_wgmma_wait() { aj_emu_wgmma_wait(N); }
__device__ __forceinline__ void aj_fence_proxy_async() { aj_emu_fence_proxy_async(); }
template <int N>
__device__ __forceinline__ void aj_setmaxnreg_dec() {}  // registers are not modelled
template <int N>
__device__ __forceinline__ void aj_setmaxnreg_inc() {}
template <int N, int TYPE, int TRANS_B>
__device__ __forceinline__ void aj_wgmma_ss(float (&d)[N / 2], aj_u64 da, aj_u64 db, bool accumulate) {
  aj_emu_wgmma(d, N, nullptr, da, db, TYPE, (accumulate ? AJ_EMU_WGMMA_SCALE_D : 0) | (TRANS_B ? AJ_EMU_WGMMA_TRANS_B : 0));
}
template <int N, int TYPE, int TRANS_B>
__device__ __forceinline__ void aj_wgmma_rs(float (&d)[N / 2], const aj_u32 (&a)[4], aj_u64 db, bool accumulate) {
  aj_emu_wgmma(d, N, a, 0, db, TYPE, (accumulate ? AJ_EMU_WGMMA_SCALE_D : 0) | (TRANS_B ? AJ_EMU_WGMMA_TRANS_B : 0));
}

struct __align__(64) aj_tensor_map {
  aj_u64 opaque[16];
};
__device__ __forceinline__ void aj_mbarrier_init(aj_u64* bar, aj_u32 count) { aj_emu_mbarrier_init(bar, count); }
__device__ __forceinline__ void aj_mbarrier_arrive(aj_u64* bar) { aj_emu_mbarrier_arrive(bar, 0, 1); }
__device__ __forceinline__ void aj_mbarrier_arrive_expect_tx(aj_u64* bar, aj_u32 bytes) { aj_emu_mbarrier_arrive(bar, bytes, 1); }
__device__ __forceinline__ void aj_mbarrier_wait(aj_u64* bar, aj_u32 parity) { aj_emu_mbarrier_wait(bar, parity); }
__device__ __forceinline__ bool aj_mbarrier_test_wait(aj_u64* bar, aj_u32 parity) { return aj_emu_mbarrier_test_wait(bar, parity) != 0; }
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

#endif

// A wgmma matrix descriptor for an operand at shared address `addr` (16-byte aligned; a swizzled
// operand's pattern starts on a SWIZZLE * 8-byte boundary): SWIZZLE 0 (none), 32, 64 or 128 bytes,
// leading and stride byte offsets as the PTX ISA's canonical layouts define them.
template <int SWIZZLE>
__device__ __forceinline__ aj_u64 aj_wgmma_desc(aj_u32 addr, aj_u32 lbo, aj_u32 sbo) {
  constexpr aj_u64 mode = SWIZZLE == 128 ? 1 : SWIZZLE == 64 ? 2 : SWIZZLE == 32 ? 3 : 0;
  return (aj_u64)((addr & 0x3FFFF) >> 4) | (aj_u64)((lbo & 0x3FFFF) >> 4) << 16 | (aj_u64)((sbo & 0x3FFFF) >> 4) << 32 |
         mode << 62;
}
