// A stand-in for the CUDA driver (libcuda.so.1) that pretends to be one GPU of a named kind and
// runs nothing: memory is host memory, copies are memcpy, every launch returns at once. With it a
// machine without a GPU runs the GPU test binary far enough to make attnjit compile, with NVRTC and
// for the real GPU's arch, every kernel the tests ask for, into a kernel cache that then travels to
// the GPU machine (tests/device/precompile_cache.sh). The tests' checks fail here, since no kernel
// ran; only the cache is kept.
//
// The device it pretends to be comes from ATTNJIT_STAND_IN_GPU: h200 (default) or h100, with the
// name, compute capability, SM count and memory the real driver reports for that GPU (the name
// and SM count pick tuned tiles, so they must be exact). Only the entry points attnjit's driver
// layer resolves (runtime/cuda/cuda_driver.cpp) are defined.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace {

struct Gpu {
  const char* name;
  int cc_major, cc_minor, sm_count, shared_optin;
  size_t memory;
};

const Gpu& gpu() {
  static const Gpu h200{"NVIDIA H200", 9, 0, 132, 232448, 150754820096ull};
  static const Gpu h100{"NVIDIA H100 80GB HBM3", 9, 0, 132, 232448, 85029158912ull};
  static const Gpu& g = [] () -> const Gpu& {
    const char* e = std::getenv("ATTNJIT_STAND_IN_GPU");
    return e && std::string(e) == "h100" ? h100 : h200;
  }();
  return g;
}

// Allocations by start address, so that a pointer into one is recognised as device memory.
std::mutex mu;
std::map<uintptr_t, size_t>& allocations() {
  static auto* m = new std::map<uintptr_t, size_t>;
  return *m;
}

int alloc(unsigned long long* p, size_t bytes) {
  void* q = nullptr;
  if (posix_memalign(&q, 256, bytes ? bytes : 1) != 0) return 2;  // CUDA_ERROR_OUT_OF_MEMORY
  std::memset(q, 0, bytes);
  std::lock_guard<std::mutex> lock(mu);
  allocations()[reinterpret_cast<uintptr_t>(q)] = bytes;
  *p = reinterpret_cast<uintptr_t>(q);
  return 0;
}

int release(unsigned long long p) {
  if (!p) return 0;
  std::lock_guard<std::mutex> lock(mu);
  auto it = allocations().find(p);
  if (it == allocations().end()) return 1;  // CUDA_ERROR_INVALID_VALUE
  allocations().erase(it);
  std::free(reinterpret_cast<void*>(p));
  return 0;
}

bool is_device(unsigned long long p) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = allocations().upper_bound(p);
  if (it == allocations().begin()) return false;
  --it;
  return p < it->first + (it->second ? it->second : 1);
}

// Opaque handles: distinct non-null pointers that are never dereferenced.
void* handle() {
  static std::atomic<uintptr_t> next{0x1000};
  return reinterpret_cast<void*>(next.fetch_add(16));
}

std::mutex capture_mu;
std::map<void*, bool>& capturing() {
  static auto* m = new std::map<void*, bool>;
  return *m;
}
thread_local int capture_mode = 0;
void* current_context = nullptr;

}  // namespace

extern "C" {

int cuInit(unsigned) { return 0; }
// NVRTC looks the driver up too (libcuda.so.1, the first on the loader's path: this one) and asks
// it for its private tables; without one it compiles as on a machine without a driver.
int cuGetExportTable(const void** table, const void*) { *table = nullptr; return 500; }  // CUDA_ERROR_NOT_FOUND
int cuDriverGetVersion(int* v) { *v = 13000; return 0; }
int cuGetErrorName(int r, const char** s) { *s = r == 0 ? "CUDA_SUCCESS" : "CUDA_ERROR_STAND_IN"; return 0; }
int cuGetErrorString(int r, const char** s) { *s = r == 0 ? "no error" : "error from the stand-in driver"; return 0; }
int cuDeviceGetCount(int* n) { *n = 1; return 0; }
int cuDeviceGet(int* d, int ordinal) { if (ordinal != 0) return 101; *d = 0; return 0; }  // CUDA_ERROR_INVALID_DEVICE
int cuDeviceGetName(char* name, int len, int) {
  std::strncpy(name, gpu().name, static_cast<size_t>(len));
  if (len > 0) name[len - 1] = 0;
  return 0;
}
int cuDeviceGetAttribute(int* v, int attribute, int) {
  switch (attribute) {
    case 1: *v = 1024; break;                 // max threads per block
    case 16: *v = gpu().sm_count; break;      // multiprocessors
    case 75: *v = gpu().cc_major; break;
    case 76: *v = gpu().cc_minor; break;
    case 97: *v = gpu().shared_optin; break;  // max shared memory per block, opt-in
    case 115: *v = 1; break;                  // memory pools supported
    default: *v = 0;
  }
  return 0;
}
int cuDeviceTotalMem_v2(size_t* bytes, int) { *bytes = gpu().memory; return 0; }
int cuDeviceGetUuid_v2(void* uuid, int) { std::memset(uuid, 0x5a, 16); return 0; }
int cuDevicePrimaryCtxRetain(void** ctx, int) {
  static void* primary = handle();
  *ctx = primary;
  return 0;
}
int cuDevicePrimaryCtxRelease_v2(int) { return 0; }
int cuCtxSetCurrent(void* ctx) { current_context = ctx; return 0; }
int cuCtxGetCurrent(void** ctx) { *ctx = current_context; return 0; }
int cuCtxSynchronize() { return 0; }
int cuModuleLoadData(void** module, const void* image) { *module = image ? handle() : nullptr; return image ? 0 : 1; }
int cuModuleUnload(void*) { return 0; }
int cuModuleGetFunction(void** f, void*, const char*) { *f = handle(); return 0; }
int cuFuncSetAttribute(void*, int, int) { return 0; }
int cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, void*, int, size_t) { *n = 1; return 0; }
int cuLaunchKernel(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**, void**) {
  return 0;
}
int cuMemAlloc_v2(unsigned long long* p, size_t bytes) { return alloc(p, bytes); }
int cuMemFree_v2(unsigned long long p) { return release(p); }
int cuMemAllocAsync(unsigned long long* p, size_t bytes, void*) { return alloc(p, bytes); }
int cuMemFreeAsync(unsigned long long p, void*) { return release(p); }
int cuDeviceGetDefaultMemPool(void** pool, int) { *pool = handle(); return 0; }
int cuMemPoolSetAttribute(void*, int, void*) { return 0; }
int cuMemcpyHtoD_v2(unsigned long long dst, const void* src, size_t n) { std::memmove(reinterpret_cast<void*>(dst), src, n); return 0; }
int cuMemcpyHtoDAsync_v2(unsigned long long dst, const void* src, size_t n, void*) { return cuMemcpyHtoD_v2(dst, src, n); }
int cuMemcpyDtoH_v2(void* dst, unsigned long long src, size_t n) { std::memmove(dst, reinterpret_cast<void*>(src), n); return 0; }
int cuMemcpyDtoHAsync_v2(void* dst, unsigned long long src, size_t n, void*) { return cuMemcpyDtoH_v2(dst, src, n); }
int cuMemsetD8Async(unsigned long long dst, unsigned char v, size_t n, void*) { std::memset(reinterpret_cast<void*>(dst), v, n); return 0; }
int cuStreamCreate(void** s, unsigned) { *s = handle(); return 0; }
int cuStreamDestroy_v2(void*) { return 0; }
int cuStreamSynchronize(void*) { return 0; }
int cuEventCreate(void** e, unsigned) { *e = handle(); return 0; }
int cuEventDestroy_v2(void*) { return 0; }
int cuEventRecord(void*, void*) { return 0; }
int cuEventSynchronize(void*) { return 0; }
int cuEventElapsedTime_v2(float* ms, void*, void*) { *ms = 1.0f; return 0; }
int cuPointerGetAttribute(void* data, int attribute, unsigned long long p) {
  if (!is_device(p)) return 1;  // as the driver answers for memory it does not know
  if (attribute == 2) *static_cast<unsigned*>(data) = 2;  // CU_MEMORYTYPE_DEVICE
  else if (attribute == 9) *static_cast<int*>(data) = 0;  // device ordinal
  else return 1;
  return 0;
}
int cuStreamBeginCapture_v2(void* s, int) {
  std::lock_guard<std::mutex> lock(capture_mu);
  capturing()[s] = true;
  return 0;
}
int cuStreamEndCapture(void* s, void** graph) {
  std::lock_guard<std::mutex> lock(capture_mu);
  capturing()[s] = false;
  *graph = handle();
  return 0;
}
int cuGraphInstantiateWithFlags(void** exec, void*, unsigned long long) { *exec = handle(); return 0; }
int cuGraphLaunch(void*, void*) { return 0; }
int cuGraphExecDestroy(void*) { return 0; }
int cuGraphDestroy(void*) { return 0; }
int cuStreamIsCapturing(void* s, int* status) {
  std::lock_guard<std::mutex> lock(capture_mu);
  auto it = capturing().find(s);
  *status = it != capturing().end() && it->second ? 1 : 0;
  return 0;
}
int cuThreadExchangeStreamCaptureMode(int* mode) { std::swap(*mode, capture_mode); return 0; }
int cuStreamWaitEvent(void*, void*, unsigned) { return 0; }
int cuEventQuery(void*) { return 0; }
int cuMemAllocHost_v2(void** p, size_t bytes) { *p = std::calloc(bytes ? bytes : 1, 1); return *p ? 0 : 2; }
int cuMemFreeHost(void* p) { std::free(p); return 0; }
int cuTensorMapEncodeTiled(void* map, int, unsigned, void*, const unsigned long long*, const unsigned long long*,
                           const unsigned*, const unsigned*, int, int, int, int) {
  std::memset(map, 0, 128);
  return 0;
}

}  // extern "C"
