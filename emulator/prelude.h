// The emulation prelude: what the host C++ compiler needs, besides emulator/emu_abi.h, to compile
// a kernel's CUDA text unchanged. It maps the CUDA keywords to C++, declares the aj_emu_* shims
// the emulation twins of templates/blocks/ call, and defines the hooks through which the
// compiler's instrumentation (-fsanitize=thread, without its runtime) reports every memory access
// of the kernel to the emulator. Embedded in the library; its hash is part of the cache key.
#define AJ_EMULATE 1
#include <math.h>
#include <stddef.h>
#include <type_traits>
#include <utility>

#define __device__
#define __host__
#define __global__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __restrict__ __restrict
#define __grid_constant__

// The runtime's table, set by aj_emu_bind() when the emulator loads this object.
static const AjEmuApi* aj_emu_api = nullptr;
extern "C" __attribute__((visibility("default"), no_sanitize_thread)) int aj_emu_bind(const AjEmuApi* api) {
  aj_emu_api = api;
  return AJ_EMU_ABI_VERSION;
}

// Shims: not instrumented, never inlined, so __builtin_return_address(0) is the kernel's call site.
#define AJ_EMU_SHIM static __attribute__((noinline, no_sanitize_thread, used))
#define AJ_EMU_PC __builtin_return_address(0)
AJ_EMU_SHIM unsigned aj_emu_thread_idx(int d) { return aj_emu_api->thread_idx(d); }
AJ_EMU_SHIM unsigned aj_emu_block_idx(int d) { return aj_emu_api->block_idx(d); }
AJ_EMU_SHIM unsigned aj_emu_grid_dim(int d) { return aj_emu_api->grid_dim(d); }
AJ_EMU_SHIM void aj_emu_syncthreads() { aj_emu_api->syncthreads(AJ_EMU_PC); }
AJ_EMU_SHIM unsigned aj_emu_shfl_xor(unsigned v, int m) { return aj_emu_api->shfl_xor(v, m, AJ_EMU_PC); }
AJ_EMU_SHIM void* aj_emu_dynamic_shared() { return aj_emu_api->dynamic_shared(); }
AJ_EMU_SHIM void* aj_emu_static_shared(const void* key, unsigned long long bytes, unsigned long long align) {
  return aj_emu_api->static_shared(key, bytes, align, AJ_EMU_PC);
}
AJ_EMU_SHIM void aj_emu_cp_async(void* smem, const void* gmem, unsigned cp_size, unsigned src_size) {
  aj_emu_api->cp_async(smem, gmem, cp_size, src_size, AJ_EMU_PC);
}
AJ_EMU_SHIM void aj_emu_cp_async_commit() { aj_emu_api->cp_async_commit(AJ_EMU_PC); }
AJ_EMU_SHIM void aj_emu_cp_async_wait(int n) { aj_emu_api->cp_async_wait(n, AJ_EMU_PC); }
AJ_EMU_SHIM void aj_emu_ldmatrix(unsigned* regs, const void* smem, int num, int trans) {
  aj_emu_api->ldmatrix(regs, smem, num, trans, AJ_EMU_PC);
}
AJ_EMU_SHIM void aj_emu_stmatrix(const unsigned* regs, void* smem, int num, int trans) {
  aj_emu_api->stmatrix(regs, smem, num, trans, AJ_EMU_PC);
}
AJ_EMU_SHIM void aj_emu_mma_sync(float* d, const unsigned* a, const unsigned* b, int in_type) {
  aj_emu_api->mma_sync(d, a, b, in_type, AJ_EMU_PC);
}
AJ_EMU_SHIM unsigned aj_emu_cvt_rn_x2(float hi, float lo, int type) { return aj_emu_api->cvt_rn_x2(hi, lo, type); }
AJ_EMU_SHIM float aj_emu_cvt_f32_f16(unsigned short h) { return aj_emu_api->cvt_f32_f16(h); }
AJ_EMU_SHIM unsigned short aj_emu_cvt_rn_f16_f32(float f) { return aj_emu_api->cvt_rn_f16_f32(f); }
AJ_EMU_SHIM unsigned short aj_emu_cvt_e4m3x2(float hi, float lo) { return aj_emu_api->cvt_rn_satfinite_e4m3x2(hi, lo); }
AJ_EMU_SHIM unsigned aj_emu_cvt_f16x2_e4m3x2(unsigned short x) { return aj_emu_api->cvt_f16x2_e4m3x2(x); }
AJ_EMU_SHIM float aj_emu_ex2_approx_ftz(float x) { return aj_emu_api->ex2_approx_ftz(x); }
AJ_EMU_SHIM float aj_emu_lg2_approx_ftz(float x) { return aj_emu_api->lg2_approx_ftz(x); }
AJ_EMU_SHIM void aj_emu_red_add_f32(float* p, float v) { aj_emu_api->red_add_f32(p, v, AJ_EMU_PC); }
AJ_EMU_SHIM void aj_emu_red_add_u32(unsigned* p, unsigned v) { aj_emu_api->red_add_u32(p, v, AJ_EMU_PC); }
AJ_EMU_SHIM void aj_emu_red_add_f32x2(float* p, float a, float b) { aj_emu_api->red_add_f32x2(p, a, b, AJ_EMU_PC); }
AJ_EMU_SHIM void aj_emu_bulk_reduce_add_f32(float* dst, const void* src, unsigned bytes) {
  aj_emu_api->bulk_reduce_add_f32(dst, src, bytes, AJ_EMU_PC);
}
AJ_EMU_SHIM void aj_emu_bulk_commit() { aj_emu_api->bulk_commit(AJ_EMU_PC); }
AJ_EMU_SHIM void aj_emu_bulk_wait(int n, int read) { aj_emu_api->bulk_wait(n, read, AJ_EMU_PC); }
// One 8- or 16-byte load or store as a single access of that width, as the hardware's vector
// instruction is (the building blocks' aj_ld_u32x4 and the like; compiled as a struct copy, the
// access would reach the emulator split into its fields).
AJ_EMU_SHIM void aj_emu_vector_load(void* out, const void* src, unsigned bytes) {
  aj_emu_api->vector_access(src, bytes, 0, AJ_EMU_PC);
  __builtin_memcpy(out, src, bytes);
}
AJ_EMU_SHIM void aj_emu_vector_store(void* dst, const void* value, unsigned bytes) {
  aj_emu_api->vector_access(dst, bytes, 1, AJ_EMU_PC);
  __builtin_memcpy(dst, value, bytes);
}
AJ_EMU_SHIM void aj_emu_rare_path(int path) { aj_emu_api->rare_path(path); }
AJ_EMU_SHIM unsigned aj_emu_smem_addr(const void* p) { return aj_emu_api->smem_addr(p); }
AJ_EMU_SHIM void aj_emu_wgmma(float* d, int n, const unsigned* a, unsigned long long da, unsigned long long db, int type,
                              int flags) {
  aj_emu_api->wgmma(d, n, a, da, db, type, flags, AJ_EMU_PC);
}
AJ_EMU_SHIM void aj_emu_wgmma_fence() { aj_emu_api->wgmma_fence(AJ_EMU_PC); }
AJ_EMU_SHIM void aj_emu_wgmma_commit() { aj_emu_api->wgmma_commit(AJ_EMU_PC); }
AJ_EMU_SHIM void aj_emu_wgmma_wait(int n) { aj_emu_api->wgmma_wait(n, AJ_EMU_PC); }
AJ_EMU_SHIM void aj_emu_fence_proxy_async() { aj_emu_api->fence_proxy_async(AJ_EMU_PC); }
AJ_EMU_SHIM void aj_emu_mbarrier_init(void* bar, unsigned count) { aj_emu_api->mbarrier_init(bar, count, AJ_EMU_PC); }
AJ_EMU_SHIM unsigned long long aj_emu_mbarrier_arrive(void* bar, unsigned tx, int arrive) {
  return aj_emu_api->mbarrier_arrive(bar, tx, arrive, AJ_EMU_PC);
}
AJ_EMU_SHIM void aj_emu_mbarrier_wait(void* bar, unsigned parity) { aj_emu_api->mbarrier_wait(bar, parity, AJ_EMU_PC); }
AJ_EMU_SHIM int aj_emu_mbarrier_test_wait(void* bar, unsigned parity) {
  return aj_emu_api->mbarrier_test_wait(bar, parity, AJ_EMU_PC);
}
AJ_EMU_SHIM void aj_emu_named_barrier(int id, int count, int wait) { aj_emu_api->named_barrier(id, count, wait, AJ_EMU_PC); }
AJ_EMU_SHIM void aj_emu_warp_sync(void) { aj_emu_api->warp_sync(AJ_EMU_PC); }
AJ_EMU_SHIM void aj_emu_tma_store(const void* map, const int* coords, int rank, const void* src) {
  aj_emu_api->tma_store(map, coords, rank, src, AJ_EMU_PC);
}
AJ_EMU_SHIM void aj_emu_tma_load(void* dst, const void* map, const int* coords, int rank, void* bar) {
  aj_emu_api->tma_load(dst, map, coords, rank, bar, AJ_EMU_PC);
}

// The instrumentation's entry points (the ThreadSanitizer ABI that GCC and Clang emit), hidden so
// that they bind inside this object even in a process that loaded the real sanitizer runtime.
#define AJ_EMU_HOOK extern "C" __attribute__((no_sanitize_thread, visibility("hidden")))
#define AJ_EMU_ACCESS(n)                                                                                           \
  AJ_EMU_HOOK void __tsan_read##n(void* a) { aj_emu_api->access(a, n, 0, AJ_EMU_PC); }                            \
  AJ_EMU_HOOK void __tsan_write##n(void* a) { aj_emu_api->access(a, n, 1, AJ_EMU_PC); }                           \
  AJ_EMU_HOOK void __tsan_unaligned_read##n(void* a) { aj_emu_api->access(a, n, 0, AJ_EMU_PC); }                  \
  AJ_EMU_HOOK void __tsan_unaligned_write##n(void* a) { aj_emu_api->access(a, n, 1, AJ_EMU_PC); }                 \
  AJ_EMU_HOOK void __tsan_volatile_read##n(void* a) { aj_emu_api->access(a, n, 0, AJ_EMU_PC); }                   \
  AJ_EMU_HOOK void __tsan_volatile_write##n(void* a) { aj_emu_api->access(a, n, 1, AJ_EMU_PC); }
AJ_EMU_ACCESS(1)
AJ_EMU_ACCESS(2)
AJ_EMU_ACCESS(4)
AJ_EMU_ACCESS(8)
AJ_EMU_ACCESS(16)
AJ_EMU_HOOK void __tsan_read_range(void* a, unsigned long n) { aj_emu_api->access(a, n, 0, AJ_EMU_PC); }
AJ_EMU_HOOK void __tsan_write_range(void* a, unsigned long n) { aj_emu_api->access(a, n, 1, AJ_EMU_PC); }
AJ_EMU_HOOK void __tsan_init() {}
AJ_EMU_HOOK void __tsan_func_entry(void*) {}
AJ_EMU_HOOK void __tsan_func_exit() {}
AJ_EMU_HOOK void __tsan_vptr_update(void**, void*) {}
AJ_EMU_HOOK void __tsan_vptr_read(void**) {}

// Launches pass kernel arguments as cuLaunchKernel does: an array of pointers to each argument.
// Not instrumented: the argument blocks belong to the launcher, not to the kernel's memory.
template <typename... P, size_t... I>
static __attribute__((no_sanitize_thread)) void aj_emu_call(void (*kernel)(P...), void** args, std::index_sequence<I...>) {
  kernel(*static_cast<std::remove_cv_t<std::remove_reference_t<P>>*>(args[I])...);
}
template <typename... P>
static __attribute__((no_sanitize_thread)) void aj_emu_call(void (*kernel)(P...), void** args) {
  aj_emu_call(kernel, args, std::index_sequence_for<P...>{});
}
