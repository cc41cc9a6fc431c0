// The boundary between a kernel compiled for the emulator and the emulator's runtime: a table of
// C functions the runtime hands to the kernel's shared object when it loads it. This header is
// compiled into the library and is also the first part of every emulated kernel's source (see
// emulator/prelude.h), so the two sides share one definition. Plain C types only.
#ifndef ATTNJIT_EMU_ABI_H
#define ATTNJIT_EMU_ABI_H

#define AJ_EMU_ABI_VERSION 16
#define AJ_EMU_F16 1
#define AJ_EMU_BF16 2
#define AJ_EMU_E4M3 3 /* FP8 e4m3 operands: wgmma k32 (K-major), mma.sync m16n8k32 */
#define AJ_EMU_RARE_PATHS 8
/* wgmma flags: scale-d (accumulate into D), imm-trans-a / -b (MN-major operands), imm-scale -1 */
#define AJ_EMU_WGMMA_SCALE_D 1
#define AJ_EMU_WGMMA_TRANS_A 2
#define AJ_EMU_WGMMA_TRANS_B 4
#define AJ_EMU_WGMMA_NEG_A 8
#define AJ_EMU_WGMMA_NEG_B 16

#ifdef __cplusplus
extern "C" {
#endif

typedef struct AjEmuApi {
  unsigned version;  // AJ_EMU_ABI_VERSION
  // Every memory access the compiler instrumented (plain loads and stores of the kernel): bounds
  // checks for global memory, bounds and race checks for shared memory.
  void (*access)(const void* addr, unsigned long long bytes, int is_write, const void* pc);
  unsigned (*thread_idx)(int dim);
  unsigned (*block_idx)(int dim);
  void (*syncthreads)(const void* pc);
  unsigned (*shfl_xor)(unsigned value, int lane_mask, const void* pc);
  void* (*dynamic_shared)(void);
  void* (*static_shared)(const void* key, unsigned long long bytes, unsigned long long align, const void* pc);
  void (*cp_async)(void* smem, const void* gmem, unsigned cp_size, unsigned src_size, const void* pc);
  void (*cp_async_commit)(const void* pc);
  void (*cp_async_wait)(int n, const void* pc);
  void (*ldmatrix)(unsigned* regs, const void* smem, int num, int trans, const void* pc);
  /* mma.sync m16n8k16 on f16/bf16, m16n8k32 on e4m3 (in_type AJ_EMU_E4M3): 4 A and 2 B registers a lane */
  void (*mma_sync)(float* d, const unsigned* a, const unsigned* b, int in_type, const void* pc);
  unsigned (*cvt_rn_x2)(float hi, float lo, int type);
  float (*cvt_f32_f16)(unsigned short h);
  unsigned short (*cvt_rn_f16_f32)(float f);
  float (*ex2_approx_ftz)(float x);
  float (*lg2_approx_ftz)(float x);
  void (*red_add_f32)(float* addr, float value, const void* pc);
  /* sm_90a */
  unsigned (*smem_addr)(const void* p); /* the shared-window address of a generic pointer */
  /* wgmma.mma_async m64nNk16, f32 += {f16,bf16} (m64nNk32 for type AJ_EMU_E4M3): A from a_regs (4
     per thread) or, when a_regs is null, from shared memory through a_desc; B through b_desc;
     flags AJ_EMU_WGMMA_* */
  void (*wgmma)(float* d, int n, const unsigned* a_regs, unsigned long long a_desc, unsigned long long b_desc,
                int type, int flags, const void* pc);
  void (*wgmma_fence)(const void* pc);
  void (*wgmma_commit)(const void* pc);
  void (*wgmma_wait)(int n, const void* pc);
  void (*fence_proxy_async)(const void* pc);
  /* sm_90: mbarrier objects (8 bytes of shared memory) and TMA tile loads. mbarrier_arrive adds
     expect_tx transaction bytes, then arrives when `arrive` is non-zero; it returns the parity of
     the phase it arrived in. mbarrier_wait blocks until the phase of `parity` has completed;
     mbarrier_test_wait only tells. tma_load: cp.async.bulk.tensor.<rank>d.tile from the tensor map
     (an emulator-encoded CUtensorMap) at `coords` into `dst`, completing on `bar`. */
  void (*mbarrier_init)(void* bar, unsigned count, const void* pc);
  unsigned long long (*mbarrier_arrive)(void* bar, unsigned expect_tx, int arrive, const void* pc);
  void (*mbarrier_wait)(void* bar, unsigned parity, const void* pc);
  int (*mbarrier_test_wait)(void* bar, unsigned parity, const void* pc);
  void (*tma_load)(void* dst, const void* tensor_map, const int* coords, int rank, void* bar, const void* pc);
  /* named barriers (bar.sync / bar.arrive id, count): `count` threads arrive, those that sync wait */
  void (*named_barrier)(int id, int count, int wait, const void* pc);
  /* red.global.add.u32 */
  void (*red_add_u32)(unsigned* addr, unsigned value, const void* pc);
  /* red.global.add.v2.f32 (sm_90): two adjacent floats at an 8-byte aligned address */
  void (*red_add_f32x2)(float* addr, float a, float b, const void* pc);
  /* a kernel took rare path `path` (0 .. AJ_EMU_RARE_PATHS - 1: an exact sum again after a
     non-finite value, which finite inputs never need): counted, so tests can tell that finite
     inputs stay on the fast path */
  void (*rare_path)(int path);
  /* cvt.rn.satfinite.e4m3x2.f32 (sm_89+): hi to the upper byte, lo to the lower */
  unsigned short (*cvt_rn_satfinite_e4m3x2)(float hi, float lo);
  /* cvt.rn.f16x2.e4m3x2 (sm_89+): the upper byte to the upper half, the lower to the lower */
  unsigned (*cvt_f16x2_e4m3x2)(unsigned short x);
  /* cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 (sm_90): `bytes` (a multiple of 16)
     of floats at shared `src` added into global `dst` (both 16-byte aligned), in the thread's open
     bulk group; bulk_commit (cp.async.bulk.commit_group) closes the group; bulk_wait
     (cp.async.bulk.wait_group n, or with `read` cp.async.bulk.wait_group.read n) returns once at
     most n of the thread's groups are pending (with `read`: pending reading their sources; their
     global writes then land at a later full wait or when the thread exits) */
  void (*bulk_reduce_add_f32)(float* dst, const void* src, unsigned bytes, const void* pc);
  void (*bulk_commit)(const void* pc);
  void (*bulk_wait)(int n, int read, const void* pc);
  /* __syncwarp() (bar.warp.sync 0xffffffff): the 32 lanes of the warp meet; shared memory written
     before it by one lane is read after it by another without a race */
  void (*warp_sync)(const void* pc);
  /* stmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16 (sm_90): ldmatrix's inverse; lane l's
     register j is its piece of matrix j, lanes 8j..8j+7 give the addresses of that matrix's rows */
  void (*stmatrix)(const unsigned* regs, void* smem, int num, int trans, const void* pc);
  /* gridDim.x, .y, .z (dim 0, 1, 2): the launch's blocks per dimension */
  unsigned (*grid_dim)(int dim);
  /* cp.async.bulk.tensor.<rank>d.global.shared::cta.tile.bulk_group (sm_90): the box of the tensor
     map at `coords` from shared `src` (laid out as a load of that box would leave it) to global
     memory, elements outside the tensor dropped, in the thread's open bulk group (bulk_wait) */
  void (*tma_store)(const void* tensor_map, const int* coords, int rank, const void* src, const void* pc);
  /* one 8- or 16-byte load or store (LD/ST .64/.128, the building blocks' aj_ld_u32x4 and the
     like): `access` for its bytes, as one access, after checking the address is aligned to them */
  void (*vector_access)(const void* addr, unsigned bytes, int is_write, const void* pc);
} AjEmuApi;

#ifdef __cplusplus
}
#endif

#endif
