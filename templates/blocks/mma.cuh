// Building blocks (templates/blocks/base.cuh says how they work): matrix multiply-accumulate. The
// warp-level mma.sync of sm_80 and the warpgroup MMA (wgmma) of sm_90a, with its fences, commit
// groups, register reallocation and shared-memory descriptors.

#ifndef AJ_EMULATE  // ---- hardware bodies (inline PTX) ----

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
// m16n8k32 on FP8 e4m3 (sm_89 and newer): A row-major 16x32 bytes, B column-major 32x8; byte j of
// a[r] is (row g + 8 (r % 2), column 4t + j + 16 (r / 2)), byte j of b[r] is (row 4t + j + 16 r,
// column g) (lane 4g + t): ldmatrix's registers of the byte rows, as for 16-bit inputs.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
__device__ __forceinline__ void aj_mma_e4m3(float (&d)[4], const aj_u32 (&a)[4], aj_u32 b0, aj_u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// ---- Hopper (sm_90a): warpgroup MMA -----------------------------------------------------------
// wgmma.mma_async m64nNk16, fp32 += {f16,bf16}: the 128 threads of a warpgroup compute a 64 x N
// tile; thread t holds d[N/2] (warp t/32 owns rows 16(t/32)..+15; in each 8-column block j,
// d[4j..4j+3] are mma.m16n8k16's C/D elements). A comes from shared memory (a descriptor, K-major)
// or from registers (mma.m16n8k16's A fragment of the warp's rows); B from shared memory, K-major
// (TRANS_B = 0) or N-major (TRANS_B = 1). `accumulate` false ignores d (scale-d = 0). Between a
// thread's own accesses to d or a and a wgmma that uses them comes aj_wgmma_fence(); a wgmma's
// results are there only after aj_wgmma_commit() and aj_wgmma_wait<n>(); its shared-memory operands
// must not change before then. Shared memory written by threads (stores, cp.async) is read by a
// wgmma only after the writer's aj_fence_proxy_async() and a barrier. AJ_WGMMA_E4M3: m64nNk32 on
// FP8 e4m3 operands, both K-major in shared memory (TRANS_B 0), or A from registers where byte b
// of register r holds row 16w + l/4 + 8(r % 2), column 4(l % 4) + b + 16(r / 2) (lane l of warp w).
#define AJ_WGMMA_F16 1
#define AJ_WGMMA_BF16 2
#define AJ_WGMMA_E4M3 3

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
// N = 128, 176 and 256 share their first accumulators: the lists are built from pieces (the
// strings concatenate to the same operand lists).
#define AJ_WGMMA_D_0_63 \
      "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),\
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),\
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),\
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),\
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),\
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),\
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),\
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define AJ_WGMMA_D_64_87 \
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),\
      "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),\
      "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
#define AJ_WGMMA_R_0_63 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" ", "\
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" ", "\
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" ", "\
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define AJ_WGMMA_R_64_87 \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79" ", " "%80, %81, %82, %83, %84, %85, %86, %87"
#define AJ_WGMMA_D128 AJ_WGMMA_D_0_63
#define AJ_WGMMA_R128 "{" AJ_WGMMA_R_0_63 "}"
// N = 176 (a 176-key S tile, FlashAttention-3's 128 x 176 at head dim 128): 88 accumulators.
#define AJ_WGMMA_D176 AJ_WGMMA_D_0_63, AJ_WGMMA_D_64_87
#define AJ_WGMMA_R176 "{" AJ_WGMMA_R_0_63 ", " AJ_WGMMA_R_64_87 "}"
#define AJ_WGMMA_D256 \
      AJ_WGMMA_D_0_63, AJ_WGMMA_D_64_87,\
      "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),\
      "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),\
      "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),\
      "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),\
      "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define AJ_WGMMA_R256 \
  "{" AJ_WGMMA_R_0_63 ", " AJ_WGMMA_R_64_87 ", " "%88, %89, %90, %91, %92, %93, %94, %95" ", "\
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
// m64nNk32 on FP8 e4m3 operands: K-major only (no imm-trans operands), A's registers 4 bytes each.
#define AJ_WGMMA_OPS_E4M3(N, SP, SS, RP, RS)                                                                          \
  __device__ __forceinline__ static void ss_e4m3(float (&d)[N / 2], aj_u64 da, aj_u64 db, int scale_d) {             \
    asm volatile("{ .reg .pred p; setp.ne.b32 p, " SP ", 0; wgmma.mma_async.sync.aligned.m64n" #N                     \
                 "k32.f32.e4m3.e4m3 " AJ_WGMMA_R##N ", " SS "; }"                                                     \
                 : AJ_WGMMA_D##N                                                                                      \
                 : "l"(da), "l"(db), "r"(scale_d));                                                                   \
  }                                                                                                                   \
  __device__ __forceinline__ static void rs_e4m3(float (&d)[N / 2], const aj_u32 (&a)[4], aj_u64 db, int scale_d) {  \
    asm volatile("{ .reg .pred p; setp.ne.b32 p, " RP ", 0; wgmma.mma_async.sync.aligned.m64n" #N                     \
                 "k32.f32.e4m3.e4m3 " AJ_WGMMA_R##N ", " RS "; }"                                                     \
                 : AJ_WGMMA_D##N                                                                                      \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));                                \
  }
#define AJ_WGMMA_SHAPE(N, SP, SS, RP, RS, SS8, RS8) \
  template <>                                       \
  struct AjWgmma<N> {                               \
    AJ_WGMMA_OPS(N, f16, SP, SS, RP, RS)            \
    AJ_WGMMA_OPS(N, bf16, SP, SS, RP, RS)           \
    AJ_WGMMA_OPS_E4M3(N, SP, SS8, RP, RS8)          \
  };
AJ_WGMMA_SHAPE(32, "%18", "%16, %17, p, 1, 1, 0, %19", "%21", "{%16, %17, %18, %19}, %20, p, 1, 1, %22", "%16, %17, p, 1, 1",
               "{%16, %17, %18, %19}, %20, p, 1, 1")
AJ_WGMMA_SHAPE(64, "%34", "%32, %33, p, 1, 1, 0, %35", "%37", "{%32, %33, %34, %35}, %36, p, 1, 1, %38", "%32, %33, p, 1, 1",
               "{%32, %33, %34, %35}, %36, p, 1, 1")
AJ_WGMMA_SHAPE(128, "%66", "%64, %65, p, 1, 1, 0, %67", "%69", "{%64, %65, %66, %67}, %68, p, 1, 1, %70", "%64, %65, p, 1, 1",
               "{%64, %65, %66, %67}, %68, p, 1, 1")
AJ_WGMMA_SHAPE(176, "%90", "%88, %89, p, 1, 1, 0, %91", "%93", "{%88, %89, %90, %91}, %92, p, 1, 1, %94", "%88, %89, p, 1, 1",
               "{%88, %89, %90, %91}, %92, p, 1, 1")
AJ_WGMMA_SHAPE(256, "%130", "%128, %129, p, 1, 1, 0, %131", "%133", "{%128, %129, %130, %131}, %132, p, 1, 1, %134",
               "%128, %129, p, 1, 1", "{%128, %129, %130, %131}, %132, p, 1, 1")
template <int N, int TYPE, int TRANS_B>
__device__ __forceinline__ void aj_wgmma_ss(float (&d)[N / 2], aj_u64 da, aj_u64 db, bool accumulate) {
  static_assert(TYPE != AJ_WGMMA_E4M3 || TRANS_B == 0, "e4m3 wgmma operands are K-major");
  if (TYPE == AJ_WGMMA_E4M3) AjWgmma<N>::ss_e4m3(d, da, db, accumulate ? 1 : 0);
  else if (TYPE == AJ_WGMMA_BF16) AjWgmma<N>::template ss_bf16<TRANS_B>(d, da, db, accumulate ? 1 : 0);
  else AjWgmma<N>::template ss_f16<TRANS_B>(d, da, db, accumulate ? 1 : 0);
}
template <int N, int TYPE, int TRANS_B>
__device__ __forceinline__ void aj_wgmma_rs(float (&d)[N / 2], const aj_u32 (&a)[4], aj_u64 db, bool accumulate) {
  static_assert(TYPE != AJ_WGMMA_E4M3 || TRANS_B == 0, "e4m3 wgmma operands are K-major");
  if (TYPE == AJ_WGMMA_E4M3) AjWgmma<N>::rs_e4m3(d, a, db, accumulate ? 1 : 0);
  else if (TYPE == AJ_WGMMA_BF16) AjWgmma<N>::template rs_bf16<TRANS_B>(d, a, db, accumulate ? 1 : 0);
  else AjWgmma<N>::template rs_f16<TRANS_B>(d, a, db, accumulate ? 1 : 0);
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

#else  // ---- emulation twins (the emulator's runtime, emulator/emu_abi.h) ----

__device__ __forceinline__ void aj_mma_f16(float (&d)[4], const aj_u32 (&a)[4], aj_u32 b0, aj_u32 b1) {
  const aj_u32 b[2] = {b0, b1};
  aj_emu_mma_sync(d, a, b, AJ_EMU_F16);
}
__device__ __forceinline__ void aj_mma_bf16(float (&d)[4], const aj_u32 (&a)[4], aj_u32 b0, aj_u32 b1) {
  const aj_u32 b[2] = {b0, b1};
  aj_emu_mma_sync(d, a, b, AJ_EMU_BF16);
}
__device__ __forceinline__ void aj_mma_e4m3(float (&d)[4], const aj_u32 (&a)[4], aj_u32 b0, aj_u32 b1) {
  const aj_u32 b[2] = {b0, b1};
  aj_emu_mma_sync(d, a, b, AJ_EMU_E4M3);
}

#define AJ_WGMMA_F16 1
#define AJ_WGMMA_BF16 2
#define AJ_WGMMA_E4M3 3
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

#endif  // AJ_EMULATE

// A wgmma matrix descriptor for an operand at shared address `addr` (16-byte aligned; a swizzled
// operand's pattern starts on a SWIZZLE * 8-byte boundary): SWIZZLE 0 (none), 32, 64 or 128 bytes,
// leading and stride byte offsets as the PTX ISA's canonical layouts define them.
template <int SWIZZLE>
__device__ __forceinline__ aj_u64 aj_wgmma_desc(aj_u32 addr, aj_u32 lbo, aj_u32 sbo) {
  constexpr aj_u64 mode = SWIZZLE == 128 ? 1 : SWIZZLE == 64 ? 2 : SWIZZLE == 32 ? 3 : 0;
  return (aj_u64)((addr & 0x3FFFF) >> 4) | (aj_u64)((lbo & 0x3FFFF) >> 4) << 16 | (aj_u64)((sbo & 0x3FFFF) >> 4) << 32 |
         mode << 62;
}
