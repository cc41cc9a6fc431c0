#include "runtime/cuda/cuda_driver.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>

#include "compiler/support/error.hpp"

namespace attnjit {

namespace {

constexpr const char* kNoDriver =
    "no CUDA driver (libcuda.so.1) on this machine: no GPU is available; use the CPU device";

std::string with_context(const std::string& what, const std::string& context) {
  return context.empty() ? what : context + " (" + what + ")";
}

// The loaded driver's entry points and its check; both throw the no-driver UserError first.
const DriverApi& api() { return CudaDriver::get().api(); }
void check(CUresult r, const char* call, const std::string& context = {}) { CudaDriver::get().check(r, call, context); }
std::string bytes_context(const char* verb, size_t bytes, const char* tail, const std::string& context) {
  return with_context(std::string(verb) + " " + std::to_string(bytes) + " bytes" + tail, context);
}

// Makes `ctx` current on this thread for the lifetime of the guard when it is not already, then
// restores the previous one. For destructors: they never throw, so errors are ignored.
class CurrentGuard {
public:
  CurrentGuard(const DriverApi& api, CUcontext ctx) noexcept : api_(api) {
    if (!ctx || api_.cuCtxGetCurrent(&prev_) != cu::CUDA_SUCCESS) return;
    if (prev_ != ctx && api_.cuCtxSetCurrent(ctx) == cu::CUDA_SUCCESS) switched_ = true;
  }
  ~CurrentGuard() {
    if (switched_) api_.cuCtxSetCurrent(prev_);
  }
  CurrentGuard(const CurrentGuard&) = delete;
  CurrentGuard& operator=(const CurrentGuard&) = delete;

private:
  const DriverApi& api_;
  CUcontext prev_ = nullptr;
  bool switched_ = false;
};

CUcontext current_context() {
  CUcontext ctx = nullptr;
  check(api().cuCtxGetCurrent(&ctx), "cuCtxGetCurrent");
  return ctx;
}

CUdevice device_handle(int ordinal) {
  const int count = device_count();
  if (ordinal < 0 || ordinal >= count) {
    throw UserError("device", "GPU " + std::to_string(ordinal) + " does not exist: this machine has " +
                                  std::to_string(count) + " GPU(s)" +
                                  (count > 0 ? " (ordinals 0.." + std::to_string(count - 1) + ")" : std::string()));
  }
  CUdevice dev = 0;
  check(api().cuDeviceGet(&dev, ordinal), "cuDeviceGet", "GPU " + std::to_string(ordinal));
  return dev;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Loading

// Every entry point: DriverApi member, the symbol cuda.h maps the name to, an older fallback symbol.
#define ATTNJIT_DRIVER_ENTRY_POINTS(X) \
  X(cuInit, "cuInit", nullptr) X(cuDriverGetVersion, "cuDriverGetVersion", nullptr) \
  X(cuGetErrorName, "cuGetErrorName", nullptr) X(cuGetErrorString, "cuGetErrorString", nullptr) \
  X(cuDeviceGetCount, "cuDeviceGetCount", nullptr) X(cuDeviceGet, "cuDeviceGet", nullptr) \
  X(cuDeviceGetName, "cuDeviceGetName", nullptr) X(cuDeviceGetAttribute, "cuDeviceGetAttribute", nullptr) \
  X(cuDeviceTotalMem, "cuDeviceTotalMem_v2", nullptr) X(cuDeviceGetUuid, "cuDeviceGetUuid_v2", "cuDeviceGetUuid") \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", nullptr) \
  X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", nullptr) \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", nullptr) X(cuCtxGetCurrent, "cuCtxGetCurrent", nullptr) \
  X(cuCtxSynchronize, "cuCtxSynchronize", nullptr) \
  X(cuModuleLoadData, "cuModuleLoadData", nullptr) X(cuModuleUnload, "cuModuleUnload", nullptr) \
  X(cuModuleGetFunction, "cuModuleGetFunction", nullptr) X(cuFuncSetAttribute, "cuFuncSetAttribute", nullptr) \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor", nullptr) \
  X(cuLaunchKernel, "cuLaunchKernel", nullptr) X(cuMemAlloc, "cuMemAlloc_v2", nullptr) \
  X(cuMemFree, "cuMemFree_v2", nullptr) X(cuMemAllocAsync, "cuMemAllocAsync", nullptr) \
  X(cuMemFreeAsync, "cuMemFreeAsync", nullptr) X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", nullptr) \
  X(cuMemPoolSetAttribute, "cuMemPoolSetAttribute", nullptr) X(cuMemcpyHtoD, "cuMemcpyHtoD_v2", nullptr) \
  X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", nullptr) X(cuMemcpyDtoH, "cuMemcpyDtoH_v2", nullptr) \
  X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", nullptr) X(cuMemsetD8Async, "cuMemsetD8Async", nullptr) \
  X(cuStreamCreate, "cuStreamCreate", nullptr) X(cuStreamDestroy, "cuStreamDestroy_v2", nullptr) \
  X(cuStreamSynchronize, "cuStreamSynchronize", nullptr) X(cuEventCreate, "cuEventCreate", nullptr) \
  X(cuEventDestroy, "cuEventDestroy_v2", nullptr) X(cuEventRecord, "cuEventRecord", nullptr) \
  X(cuEventSynchronize, "cuEventSynchronize", nullptr) \
  X(cuEventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime") \
  X(cuPointerGetAttribute, "cuPointerGetAttribute", nullptr) \
  X(cuStreamBeginCapture, "cuStreamBeginCapture_v2", nullptr) X(cuStreamEndCapture, "cuStreamEndCapture", nullptr) \
  X(cuGraphInstantiate, "cuGraphInstantiateWithFlags", nullptr) X(cuGraphLaunch, "cuGraphLaunch", nullptr) \
  X(cuGraphExecDestroy, "cuGraphExecDestroy", nullptr) X(cuGraphDestroy, "cuGraphDestroy", nullptr) \
  X(cuStreamIsCapturing, "cuStreamIsCapturing", nullptr) \
  X(cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode", nullptr) \
  X(cuStreamWaitEvent, "cuStreamWaitEvent", nullptr) X(cuEventQuery, "cuEventQuery", nullptr) \
  X(cuMemAllocHost, "cuMemAllocHost_v2", nullptr) X(cuMemFreeHost, "cuMemFreeHost", nullptr)


struct DriverLoader {
  bool ok = false;
  std::string why;
  CudaDriver driver;

  DriverLoader() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      why = kNoDriver;
      return;
    }
    // Never dlclose()d: handles from the driver live until the process ends.
    std::string missing;
    auto resolve = [&](auto& fn, const char* symbol, const char* fallback) {
      void* p = dlsym(lib, symbol);
      if (!p && fallback) p = dlsym(lib, fallback);
      if (p) {
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
      } else {
        missing += (missing.empty() ? "" : ", ") + std::string(symbol);
      }
    };
    DriverApi& a = driver.api_;
#define ATTNJIT_RESOLVE(member, symbol, fallback) resolve(a.member, symbol, fallback);
    ATTNJIT_DRIVER_ENTRY_POINTS(ATTNJIT_RESOLVE)
#undef ATTNJIT_RESOLVE
    a.cuTensorMapEncodeTiled = reinterpret_cast<decltype(a.cuTensorMapEncodeTiled)>(dlsym(lib, "cuTensorMapEncodeTiled"));
    if (!missing.empty()) {
      why = "the CUDA driver (libcuda.so.1) lacks " + missing +
            ": the NVIDIA driver is too old (attnjit needs a driver for CUDA 11.2 or newer); update it, or use "
            "the CPU device";
      return;
    }
    if (const CUresult r = a.cuInit(0); r != cu::CUDA_SUCCESS) {
      const std::string err = driver.error_name(r) + " (" + driver.error_string(r) + ")";
      std::string hint = "the driver is not working; check nvidia-smi";
      if (r == cu::CUDA_ERROR_NO_DEVICE) hint = "no GPU is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)";
      if (r == cu::CUDA_ERROR_STUB_LIBRARY) hint = "libcuda.so.1 is the toolkit's stub, not a real driver";
      why = "the CUDA driver is installed but cuInit failed: " + err + ": " + hint + "; use the CPU device";
      return;
    }
    if (a.cuDriverGetVersion(&driver.version_) != cu::CUDA_SUCCESS) driver.version_ = 0;
    ok = true;
  }
};

namespace {
DriverLoader& loader() {
  static DriverLoader l;  // thread-safe, once
  return l;
}
}  // namespace

std::vector<std::pair<std::string, std::string>> driver_entry_points() {
#define ATTNJIT_NAME(member, symbol, fallback) {#member, symbol},
  return {ATTNJIT_DRIVER_ENTRY_POINTS(ATTNJIT_NAME)};
#undef ATTNJIT_NAME
}

bool CudaDriver::available(std::string* why) noexcept {
  try {
    DriverLoader& l = loader();
    if (why) *why = l.ok ? std::string() : l.why;
    return l.ok;
  } catch (...) {  // std::bad_alloc: the loader itself never throws
    if (why) *why = "loading the CUDA driver failed (out of memory)";
    return false;
  }
}

CudaDriver& CudaDriver::get() {
  DriverLoader& l = loader();
  if (!l.ok) throw UserError("CUDA driver", l.why);
  return l.driver;
}

std::string CudaDriver::error_name(CUresult r) const {
  const char* s = nullptr;
  if (api_.cuGetErrorName && api_.cuGetErrorName(r, &s) == cu::CUDA_SUCCESS && s) return s;
  return "CUDA error " + std::to_string(r);
}

std::string CudaDriver::error_string(CUresult r) const {
  const char* s = nullptr;
  if (api_.cuGetErrorString && api_.cuGetErrorString(r, &s) == cu::CUDA_SUCCESS && s) return s;
  return "unknown error";
}

void CudaDriver::check(CUresult r, const char* call, const std::string& context) const {
  if (r != cu::CUDA_SUCCESS) throw CudaError(call, r, error_name(r), error_string(r), context);
}

CudaError::CudaError(std::string call, CUresult result, std::string error_name, std::string error_string,
                     std::string context)
    : std::runtime_error(call + " failed: " + error_name + " (" + error_string + ")" +
                         (context.empty() ? std::string() : ": " + context)),
      call_(std::move(call)),
      result_(result),
      error_name_(std::move(error_name)),
      error_string_(std::move(error_string)),
      context_(std::move(context)) {}

// ---------------------------------------------------------------------------------------------
// Devices and contexts

int driver_version() { return CudaDriver::get().version(); }

int device_count() {
  int n = 0;
  check(api().cuDeviceGetCount(&n), "cuDeviceGetCount");
  return n;
}

DeviceInfo device_info(int ordinal) {
  const CudaDriver& d = CudaDriver::get();
  const DriverApi& a = d.api();
  const CUdevice dev = device_handle(ordinal);
  const std::string where = "GPU " + std::to_string(ordinal);
  DeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {};
  d.check(a.cuDeviceGetName(name, static_cast<int>(sizeof name) - 1, dev), "cuDeviceGetName", where);
  info.name = name;
  auto attr = [&](int attribute, const char* what) {
    int v = 0;
    d.check(a.cuDeviceGetAttribute(&v, attribute, dev), "cuDeviceGetAttribute", where + ", " + what);
    return v;
  };
  info.cc_major = attr(cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "compute capability major");
  info.cc_minor = attr(cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "compute capability minor");
  info.sm_count = attr(cu::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "multiprocessor count");
  info.max_shared_per_block_optin =
      attr(cu::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, "max shared memory per block (opt-in)");
  info.max_threads_per_block = attr(cu::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, "max threads per block");
  d.check(a.cuDeviceTotalMem(&info.total_memory, dev), "cuDeviceTotalMem_v2", where);
  unsigned char uuid[16] = {};
  if (a.cuDeviceGetUuid(uuid, dev) == cu::CUDA_SUCCESS) {
    char text[64];
    std::snprintf(text, sizeof text,
                  "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", uuid[0], uuid[1],
                  uuid[2], uuid[3], uuid[4], uuid[5], uuid[6], uuid[7], uuid[8], uuid[9], uuid[10], uuid[11],
                  uuid[12], uuid[13], uuid[14], uuid[15]);
    info.uuid_or_empty = text;
  }
  return info;
}

Context::Context(int ordinal) : ordinal_(ordinal), device_(device_handle(ordinal)) {
  check(api().cuDevicePrimaryCtxRetain(&ctx_, device_), "cuDevicePrimaryCtxRetain", "GPU " + std::to_string(ordinal));
}

Context::~Context() {
  // Errors ignored: at process exit the driver may already be shutting down.
  if (ctx_) CudaDriver::get().api().cuDevicePrimaryCtxRelease(device_);
}

void Context::make_current() const {
  check(api().cuCtxSetCurrent(ctx_), "cuCtxSetCurrent", "GPU " + std::to_string(ordinal_));
}

ScopedCurrentContext::ScopedCurrentContext(const Context& context) {
  previous_ = current_context();
  if (previous_ == context.handle()) return;
  context.make_current();
  switched_ = true;
}

ScopedCurrentContext::~ScopedCurrentContext() {
  if (switched_) CudaDriver::get().api().cuCtxSetCurrent(previous_);  // errors ignored: a destructor must not throw
}

Context& shared_context(int ordinal) {
  static std::mutex mu;
  static auto* contexts = new std::map<int, std::unique_ptr<Context>>;  // never destroyed, on purpose
  std::lock_guard<std::mutex> lock(mu);
  auto it = contexts->find(ordinal);
  if (it == contexts->end()) it = contexts->emplace(ordinal, std::make_unique<Context>(ordinal)).first;
  return *it->second;
}

// ---------------------------------------------------------------------------------------------
// Modules and launches

Module::Module(const std::vector<uint8_t>& cubin, const std::string& context) : context_(context) {
  const DriverApi& a = api();  // the no-driver error first
  if (cubin.empty()) throw UserError(context.empty() ? "module" : context, "the CUBIN is empty");
  check(a.cuModuleLoadData(&module_, cubin.data()), "cuModuleLoadData",
          with_context("loading a " + std::to_string(cubin.size()) + "-byte CUBIN", context));
  ctx_ = current_context();
}

Module::~Module() {
  if (!module_) return;
  const DriverApi& a = CudaDriver::get().api();
  CurrentGuard guard(a, ctx_);
  a.cuModuleUnload(module_);
}

Module::Module(Module&& other) noexcept
    : module_(std::exchange(other.module_, nullptr)),
      ctx_(std::exchange(other.ctx_, nullptr)),
      context_(std::move(other.context_)) {}

Module& Module::operator=(Module&& other) noexcept {
  if (this != &other) {
    Module old(std::move(*this));
    module_ = std::exchange(other.module_, nullptr);
    ctx_ = std::exchange(other.ctx_, nullptr);
    context_ = std::move(other.context_);
  }
  return *this;
}

CUfunction Module::function(const std::string& name) const {
  CUfunction f = nullptr;
  check(api().cuModuleGetFunction(&f, module_, name.c_str()), "cuModuleGetFunction",
        with_context("kernel '" + name + "'", context_));
  return f;
}

void Module::set_max_dynamic_shared(CUfunction f, int bytes) const {
  check(api().cuFuncSetAttribute(f, cu::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes), "cuFuncSetAttribute",
        with_context("CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = " + std::to_string(bytes), context_));
}

int Module::resident_blocks_per_sm(CUfunction f, int threads, size_t dynamic_shared) const {
  int blocks = 0;
  check(api().cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, threads, dynamic_shared),
        "cuOccupancyMaxActiveBlocksPerMultiprocessor", with_context(std::to_string(threads) + " threads", context_));
  return blocks;
}

void launch(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x, unsigned shared_bytes,
            CUstream stream, void** params, const std::string& context) {
  const std::string where = context.empty() ? "launch" : context;
  auto limit = [&](const char* what, unsigned v, unsigned max, const char* meaning) {
    if (v == 0 || v > max) {
      throw UserError(where, std::string(what) + " = " + std::to_string(v) + " is outside the CUDA limit 1.." +
                                 std::to_string(max) + " (" + meaning + ")");
    }
  };
  limit("grid_x", grid_x, 2147483647u, "blocks in grid dimension x, 2^31-1");
  limit("grid_y", grid_y, 65535u, "blocks in grid dimension y");
  limit("grid_z", grid_z, 65535u, "blocks in grid dimension z");
  limit("block_x", block_x, 1024u, "threads per block");
  const std::string config = "grid (" + std::to_string(grid_x) + ", " + std::to_string(grid_y) + ", " +
                             std::to_string(grid_z) + "), block (" + std::to_string(block_x) + ", 1, 1), " +
                             std::to_string(shared_bytes) + " B dynamic shared memory";
  check(api().cuLaunchKernel(f, grid_x, grid_y, grid_z, block_x, 1, 1, shared_bytes, stream, params, nullptr),
        "cuLaunchKernel", context.empty() ? config : context + ": " + config);
}

// ---------------------------------------------------------------------------------------------
// Memory

CUdeviceptr alloc_async(size_t bytes, CUstream stream, const std::string& context) {
  CUdeviceptr p = 0;
  if (bytes) {
    check(api().cuMemAllocAsync(&p, bytes, stream), "cuMemAllocAsync",
          bytes_context("allocating", bytes, " from the default memory pool", context));
  }
  return p;
}

void free_async(CUdeviceptr p, CUstream stream, const std::string& context) {
  if (p) check(api().cuMemFreeAsync(p, stream), "cuMemFreeAsync", context);
}

void keep_pool_memory(int ordinal, uint64_t bytes) {
  const CUdevice dev = device_handle(ordinal);
  const std::string where = "GPU " + std::to_string(ordinal);
  CUmemoryPool pool = nullptr;
  check(api().cuDeviceGetDefaultMemPool(&pool, dev), "cuDeviceGetDefaultMemPool", where);
  uint64_t value = bytes;  // cuuint64_t
  check(api().cuMemPoolSetAttribute(pool, cu::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &value), "cuMemPoolSetAttribute",
        where + ", CU_MEMPOOL_ATTR_RELEASE_THRESHOLD");
}

CUdeviceptr device_alloc(size_t bytes, const std::string& context) {
  CUdeviceptr p = 0;
  if (bytes) check(api().cuMemAlloc(&p, bytes), "cuMemAlloc_v2", bytes_context("allocating", bytes, "", context));
  return p;
}

emu::TensorMapBytes encode_tensor_map(const emu::TensorMapSpec& s) {
  if (const std::string p = emu::tensor_map_problem(s); !p.empty()) throw UserError("", p);
  const DriverApi& a = api();
  if (!a.cuTensorMapEncodeTiled)
    throw UserError("", "the CUDA driver has no cuTensorMapEncodeTiled (a driver for CUDA 12.0 or newer makes TMA tensor maps)");
  unsigned long long dims[5], strides[4];
  unsigned box[5], estrides[5];
  for (int i = 0; i < s.rank; ++i) {
    dims[i] = s.dims[size_t(i)];
    if (i > 0) strides[i - 1] = s.strides[size_t(i)];
    box[i] = s.box[size_t(i)];
    estrides[i] = s.element_strides[size_t(i)];
  }
  const int swizzle = s.swizzle == 128 ? 3 : s.swizzle == 64 ? 2 : s.swizzle == 32 ? 1 : 0;
  constexpr int kInterleaveNone = 0, kL2Promotion128 = 2;
  emu::TensorMapBytes out{};
  check(a.cuTensorMapEncodeTiled(out.bytes, int(s.type), unsigned(s.rank), reinterpret_cast<void*>(uintptr_t(s.address)), dims,
                                 strides, box, estrides, kInterleaveNone, swizzle, kL2Promotion128, s.oob_nan ? 1 : 0),
        "cuTensorMapEncodeTiled", "making a TMA tensor map");
  return out;
}

void device_free(CUdeviceptr p, const std::string& context) {
  if (p) check(api().cuMemFree(p), "cuMemFree_v2", context);
}

void copy_to_device(CUdeviceptr dst, const void* src, size_t bytes, const std::string& context) {
  if (bytes) {
    check(api().cuMemcpyHtoD(dst, src, bytes), "cuMemcpyHtoD_v2",
          bytes_context("copying", bytes, " to the device", context));
  }
}

void copy_to_device_async(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream,
                          const std::string& context) {
  if (bytes) {
    check(api().cuMemcpyHtoDAsync(dst, src, bytes, stream), "cuMemcpyHtoDAsync_v2",
          bytes_context("copying", bytes, " to the device", context));
  }
}

void copy_to_host(void* dst, CUdeviceptr src, size_t bytes, const std::string& context) {
  if (bytes) {
    check(api().cuMemcpyDtoH(dst, src, bytes), "cuMemcpyDtoH_v2",
          bytes_context("copying", bytes, " to the host", context));
  }
}

void copy_to_host_async(void* dst, CUdeviceptr src, size_t bytes, CUstream stream, const std::string& context) {
  if (bytes) {
    check(api().cuMemcpyDtoHAsync(dst, src, bytes, stream), "cuMemcpyDtoHAsync_v2",
          bytes_context("copying", bytes, " to the host", context));
  }
}

void memset_d8_async(CUdeviceptr dst, unsigned char value, size_t bytes, CUstream stream,
                     const std::string& context) {
  if (bytes) {
    check(api().cuMemsetD8Async(dst, value, bytes, stream), "cuMemsetD8Async",
          bytes_context("setting", bytes, "", context));
  }
}

DeviceBuffer::DeviceBuffer(size_t bytes, const std::string& context) : bytes_(bytes) {
  ptr_ = device_alloc(bytes, context);
  if (ptr_) ctx_ = current_context();
}

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, 0)),
      bytes_(std::exchange(other.bytes_, 0)),
      ctx_(std::exchange(other.ctx_, nullptr)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    ptr_ = std::exchange(other.ptr_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
    ctx_ = std::exchange(other.ctx_, nullptr);
  }
  return *this;
}

void DeviceBuffer::wait_for_users() const {
  if (!ptr_) return;
  const DriverApi& a = CudaDriver::get().api();
  CurrentGuard guard(a, ctx_);
  a.cuCtxSynchronize();
}

void DeviceBuffer::reset() {
  if (ptr_) {
    const DriverApi& a = CudaDriver::get().api();
    CurrentGuard guard(a, ctx_);
    a.cuMemFree(ptr_);  // errors ignored: this runs in destructors
  }
  ptr_ = 0;
  bytes_ = 0;
  ctx_ = nullptr;
}

// ---------------------------------------------------------------------------------------------
// Streams, events, pointers

CUstream create_stream(bool non_blocking) {
  CUstream s = nullptr;
  check(api().cuStreamCreate(&s, non_blocking ? cu::CU_STREAM_NON_BLOCKING : cu::CU_STREAM_DEFAULT), "cuStreamCreate");
  return s;
}

void destroy_stream(CUstream stream) {
  if (stream) check(api().cuStreamDestroy(stream), "cuStreamDestroy_v2");
}

void synchronize(CUstream stream, const std::string& context) {
  check(api().cuStreamSynchronize(stream), "cuStreamSynchronize", context);
}

CapturedGraph::CapturedGraph(CUstream stream, const std::function<void()>& enqueue) {
  const DriverApi& a = api();
  check(a.cuStreamBeginCapture(stream, cu::CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCapture_v2");
  try {
    enqueue();
  } catch (...) {
    CUgraph broken = nullptr;  // end the capture so the stream is usable again; the error is enqueue's
    if (a.cuStreamEndCapture(stream, &broken) == cu::CUDA_SUCCESS && broken) a.cuGraphDestroy(broken);
    throw;
  }
  check(a.cuStreamEndCapture(stream, &graph_), "cuStreamEndCapture", "the work enqueued during the capture");
  const CUresult r = a.cuGraphInstantiate(&exec_, graph_, 0);
  if (r != cu::CUDA_SUCCESS) {
    a.cuGraphDestroy(graph_);
    check(r, "cuGraphInstantiateWithFlags");
  }
}

CapturedGraph::~CapturedGraph() {
  const DriverApi& a = api();
  if (exec_) a.cuGraphExecDestroy(exec_);
  if (graph_) a.cuGraphDestroy(graph_);
}

void CapturedGraph::launch(CUstream stream) { check(api().cuGraphLaunch(exec_, stream), "cuGraphLaunch"); }

EventTimer::EventTimer() {
  const CudaDriver& d = CudaDriver::get();
  d.check(d.api().cuEventCreate(&start_, cu::CU_EVENT_DEFAULT), "cuEventCreate", "EventTimer start");
  try {
    d.check(d.api().cuEventCreate(&stop_, cu::CU_EVENT_DEFAULT), "cuEventCreate", "EventTimer stop");
  } catch (...) {
    d.api().cuEventDestroy(start_);
    throw;
  }
  ctx_ = current_context();
}

EventTimer::~EventTimer() {
  const DriverApi& a = CudaDriver::get().api();
  CurrentGuard guard(a, ctx_);
  if (start_) a.cuEventDestroy(start_);
  if (stop_) a.cuEventDestroy(stop_);
}

void EventTimer::record_start(CUstream stream) {
  check(api().cuEventRecord(start_, stream), "cuEventRecord", "EventTimer start");
  started_ = true;
  stopped_ = false;
}

void EventTimer::record_stop(CUstream stream) {
  ATTNJIT_CHECK(started_, "EventTimer::record_stop before record_start");
  check(api().cuEventRecord(stop_, stream), "cuEventRecord", "EventTimer stop");
  stopped_ = true;
}

float EventTimer::elapsed_ms() {
  ATTNJIT_CHECK(started_ && stopped_, "EventTimer::elapsed_ms before record_start and record_stop");
  check(api().cuEventSynchronize(stop_), "cuEventSynchronize", "EventTimer stop");
  float ms = 0;
  check(api().cuEventElapsedTime(&ms, start_, stop_), "cuEventElapsedTime");
  return ms;
}

bool stream_capturing(CUstream stream) {
  int status = cu::CU_STREAM_CAPTURE_STATUS_NONE;  // CUstreamCaptureStatus
  check(api().cuStreamIsCapturing(stream, &status), "cuStreamIsCapturing");
  return status != cu::CU_STREAM_CAPTURE_STATUS_NONE;
}

RelaxedCapture::RelaxedCapture(bool relax) {
  if (!relax) return;
  previous_ = cu::CU_STREAM_CAPTURE_MODE_RELAXED;
  check(api().cuThreadExchangeStreamCaptureMode(&previous_), "cuThreadExchangeStreamCaptureMode");
  relaxed_ = true;
}

RelaxedCapture::~RelaxedCapture() {
  if (relaxed_) CudaDriver::get().api().cuThreadExchangeStreamCaptureMode(&previous_);  // restoring never throws
}

PinnedBuffer::PinnedBuffer(size_t bytes, const std::string& context) {
  if (!bytes) return;
  check(api().cuMemAllocHost(&ptr_, bytes), "cuMemAllocHost_v2", bytes_context("allocating", bytes, " of pinned host memory", context));
  ctx_ = current_context();
}

PinnedBuffer::~PinnedBuffer() {
  if (!ptr_) return;
  const DriverApi& a = CudaDriver::get().api();
  CurrentGuard guard(a, ctx_);
  a.cuMemFreeHost(ptr_);  // errors ignored: this runs in destructors
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), ctx_(std::exchange(other.ctx_, nullptr)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    PinnedBuffer old(std::move(*this));
    ptr_ = std::exchange(other.ptr_, nullptr);
    ctx_ = std::exchange(other.ctx_, nullptr);
  }
  return *this;
}

StreamEvent::StreamEvent() {
  check(api().cuEventCreate(&event_, cu::CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  ctx_ = current_context();
}

StreamEvent::~StreamEvent() {
  const DriverApi& a = CudaDriver::get().api();
  CurrentGuard guard(a, ctx_);
  a.cuEventDestroy(event_);
}

void StreamEvent::record(CUstream stream) { check(api().cuEventRecord(event_, stream), "cuEventRecord"); }

void StreamEvent::make_wait(CUstream stream) const {
  check(api().cuStreamWaitEvent(stream, event_, 0), "cuStreamWaitEvent");
}

bool StreamEvent::done() const {
  const CUresult r = api().cuEventQuery(event_);
  if (r == cu::CUDA_ERROR_NOT_READY) return false;
  check(r, "cuEventQuery");
  return true;
}

PointerInfo pointer_info(const void* p) {
  PointerInfo info;
  if (!p) return info;
  const CudaDriver& d = CudaDriver::get();
  const auto ptr = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(p));
  unsigned type = 0;  // CUmemorytype
  const CUresult r = d.api().cuPointerGetAttribute(&type, cu::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr);
  if (r == cu::CUDA_ERROR_INVALID_VALUE) return info;  // not a pointer the driver knows: plain host memory
  d.check(r, "cuPointerGetAttribute", "CU_POINTER_ATTRIBUTE_MEMORY_TYPE");
  if (type != cu::CU_MEMORYTYPE_DEVICE && type != cu::CU_MEMORYTYPE_UNIFIED) return info;
  int ordinal = -1;
  d.check(d.api().cuPointerGetAttribute(&ordinal, cu::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr),
          "cuPointerGetAttribute", "CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL");
  info.is_device_memory = true;
  info.device_ordinal = ordinal;
  return info;
}

}  // namespace attnjit
