// The table of emulator functions a kernel's shared object calls (emulator/emu_abi.h): each entry
// forwards to the block executor running on this OS thread, or to a PTX semantic function.
#include "emulator/emu_api.hpp"

#include <atomic>

#include "emulator/block_executor.hpp"
#include "emulator/ptx_semantics.hpp"

namespace attnjit::emu {
namespace {

std::atomic<uint64_t> g_rare_paths[AJ_EMU_RARE_PATHS];
void api_rare_path(int path) {
  if (path >= 0 && path < AJ_EMU_RARE_PATHS) g_rare_paths[path].fetch_add(1, std::memory_order_relaxed);
}

BlockExecutor& ex() { return *BlockExecutor::current(); }

void api_access(const void* addr, unsigned long long bytes, int is_write, const void* pc) {
  // Outside a launch (the object's own initialisers) there is nothing to check.
  if (BlockExecutor* e = BlockExecutor::current()) e->access(addr, bytes, is_write != 0, pc);
}
unsigned api_thread_idx(int d) { return ex().thread_idx(d); }
unsigned api_block_idx(int d) { return ex().block_idx(d); }
unsigned api_grid_dim(int d) { return ex().grid_dim(d); }
void api_syncthreads(const void* pc) { ex().syncthreads(pc); }
unsigned api_shfl_xor(unsigned v, int m, const void* pc) { return ex().shfl_xor(v, m, pc); }
void* api_dynamic_shared() { return ex().dynamic_shared(); }
void* api_static_shared(const void* key, unsigned long long bytes, unsigned long long align, const void* pc) {
  return ex().static_shared(key, bytes, align, pc);
}
void api_cp_async(void* s, const void* g, unsigned cp, unsigned src, const void* pc) { ex().cp_async(s, g, cp, src, pc); }
void api_cp_async_commit(const void* pc) { ex().cp_async_commit(pc); }
void api_cp_async_wait(int n, const void* pc) { ex().cp_async_wait(n, pc); }
void api_ldmatrix(unsigned* r, const void* s, int num, int trans, const void* pc) { ex().ldmatrix(r, s, num, trans, pc); }
void api_stmatrix(const unsigned* r, void* s, int num, int trans, const void* pc) { ex().stmatrix(r, s, num, trans, pc); }
void api_mma(float* d, const unsigned* a, const unsigned* b, int type, const void* pc) { ex().mma_sync(d, a, b, type, pc); }
void api_red_add_f32(float* p, float v, const void* pc) { ex().red_add_f32(p, v, pc); }
void api_red_add_u32(unsigned* p, unsigned v, const void* pc) { ex().red_add_u32(p, v, pc); }
void api_red_add_f32x2(float* p, float a, float b, const void* pc) { ex().red_add_f32x2(p, a, b, pc); }
void api_bulk_reduce_add_f32(float* dst, const void* src, unsigned bytes, const void* pc) {
  ex().bulk_reduce_add_f32(dst, src, bytes, pc);
}
void api_bulk_commit(const void* pc) { ex().bulk_commit(pc); }
void api_bulk_wait(int n, int read, const void* pc) { ex().bulk_wait(n, read != 0, pc); }
unsigned api_smem_addr(const void* p) { return ex().smem_addr(p); }
void api_wgmma(float* d, int n, const unsigned* a, unsigned long long da, unsigned long long db, int type, int flags,
               const void* pc) {
  ex().wgmma(d, n, a, da, db, type, flags, pc);
}
void api_wgmma_fence(const void* pc) { ex().wgmma_fence(pc); }
void api_wgmma_commit(const void* pc) { ex().wgmma_commit(pc); }
void api_wgmma_wait(int n, const void* pc) { ex().wgmma_wait(n, pc); }
void api_fence_proxy_async(const void* pc) { ex().fence_proxy_async(pc); }
void api_mbarrier_init(void* bar, unsigned count, const void* pc) { ex().mbarrier_init(bar, count, pc); }
unsigned long long api_mbarrier_arrive(void* bar, unsigned tx, int arrive, const void* pc) {
  return ex().mbarrier_arrive(bar, tx, arrive, pc);
}
void api_mbarrier_wait(void* bar, unsigned parity, const void* pc) { ex().mbarrier_wait(bar, parity, pc); }
int api_mbarrier_test_wait(void* bar, unsigned parity, const void* pc) { return ex().mbarrier_test(bar, parity, pc) ? 1 : 0; }
void api_named_barrier(int id, int count, int wait, const void* pc) { ex().named_barrier(id, count, wait != 0, pc); }
void api_warp_sync(const void* pc) { ex().warp_sync(pc); }
void api_vector_access(const void* addr, unsigned bytes, int is_write, const void* pc) {
  ex().vector_access(addr, bytes, is_write != 0, pc);
}
void api_tma_store(const void* map, const int* coords, int rank, const void* src, const void* pc) {
  ex().tma_store(map, coords, rank, src, pc);
}
void api_tma_load(void* dst, const void* map, const int* coords, int rank, void* bar, const void* pc) {
  ex().tma_load(dst, map, coords, rank, bar, pc);
}
unsigned api_cvt_rn_x2(float hi, float lo, int type) { return cvt_rn_x2(hi, lo, type); }
float api_cvt_f32_f16(unsigned short h) { return cvt_f32_f16(h); }
unsigned short api_cvt_rn_f16_f32(float f) { return cvt_rn_f16_f32(f); }

}  // namespace

const AjEmuApi& emu_api() {
  static const AjEmuApi api = {
      AJ_EMU_ABI_VERSION, api_access,          api_thread_idx,       api_block_idx,     api_syncthreads,
      api_shfl_xor,       api_dynamic_shared,  api_static_shared,    api_cp_async,      api_cp_async_commit,
      api_cp_async_wait,  api_ldmatrix,        api_mma,              api_cvt_rn_x2,     api_cvt_f32_f16,
      api_cvt_rn_f16_f32, ex2_approx_ftz,      lg2_approx_ftz,       api_red_add_f32,   api_smem_addr,
      api_wgmma,          api_wgmma_fence,     api_wgmma_commit,     api_wgmma_wait,    api_fence_proxy_async,
      api_mbarrier_init,  api_mbarrier_arrive, api_mbarrier_wait,    api_mbarrier_test_wait, api_tma_load,
      api_named_barrier,  api_red_add_u32,     api_red_add_f32x2,   api_rare_path,     cvt_rn_satfinite_e4m3x2,
      cvt_f16x2_e4m3x2,   api_bulk_reduce_add_f32, api_bulk_commit, api_bulk_wait, api_warp_sync,
      api_stmatrix,       api_grid_dim,        api_tma_store,        api_vector_access,
  };
  return api;
}

uint64_t rare_paths_taken(int path) {
  uint64_t n = 0;
  for (int x = 0; x < AJ_EMU_RARE_PATHS; ++x)
    if (path < 0 || path == x) n += g_rare_paths[x].load(std::memory_order_relaxed);
  return n;
}

}  // namespace attnjit::emu
