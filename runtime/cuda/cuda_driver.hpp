// The CUDA driver API, loaded at run time (docs/architecture.md, "Runtime"). libcuda.so.1 is
// dlopen()ed once, so the library and the CLI build, link and run on machines without a GPU and
// say so plainly there. cuda.h is NOT included: the few types and constants used are declared
// below with the values of CUDA 13.0's cuda.h (tests/unit/test_cuda_driver.cpp static_asserts
// them against the header where it is installed).
//
// Every driver call is checked: a failure throws CudaError naming the call, the driver's error name
// and text, and what the caller was doing. Calls that need a context (memory, modules, streams,
// launches) use the calling thread's current context: make one current with Context::make_current().
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "emulator/tensor_map.hpp"

// The driver's opaque handle structs, at global scope exactly as cuda.h names them
// (typedef struct CUctx_st* CUcontext; ...), so these handles are the same types as cuda.h's.
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
struct CUevent_st;
struct CUmemPoolHandle_st;
struct CUgraph_st;
struct CUgraphExec_st;

namespace attnjit {

using CUresult = int;                     // cuda.h: enum cudaError_enum (int-sized)
using CUdevice = int;                     // cuda.h: typedef int CUdevice_v1
using CUdeviceptr = unsigned long long;   // cuda.h: CUdeviceptr_v2 on 64-bit hosts
using CUcontext = ::CUctx_st*;
using CUmodule = ::CUmod_st*;
using CUfunction = ::CUfunc_st*;
using CUstream = ::CUstream_st*;
using CUevent = ::CUevent_st*;
using CUmemoryPool = ::CUmemPoolHandle_st*;
using CUgraph = ::CUgraph_st*;
using CUgraphExec = ::CUgraphExec_st*;

// Constants from cuda.h (CUDA 13.0), same names, in their own namespace so they never clash with it.
namespace cu {
constexpr int CUDA_SUCCESS = 0;
constexpr int CUDA_ERROR_INVALID_VALUE = 1;
constexpr int CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr int CUDA_ERROR_NOT_INITIALIZED = 3;
constexpr int CUDA_ERROR_DEINITIALIZED = 4;
constexpr int CUDA_ERROR_STUB_LIBRARY = 34;
constexpr int CUDA_ERROR_NO_DEVICE = 100;
constexpr int CUDA_ERROR_INVALID_CONTEXT = 201;
constexpr int CUDA_ERROR_NOT_FOUND = 500;
// CUdevice_attribute
constexpr int CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1;
constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;
constexpr int CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115;
// CUpointer_attribute
constexpr int CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2;     // value: CUmemorytype (unsigned int)
constexpr int CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9;  // value: int
// CUmemorytype
constexpr unsigned CU_MEMORYTYPE_HOST = 1;
constexpr unsigned CU_MEMORYTYPE_DEVICE = 2;
constexpr unsigned CU_MEMORYTYPE_ARRAY = 3;
constexpr unsigned CU_MEMORYTYPE_UNIFIED = 4;
// CUfunction_attribute
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
// CUmemPool_attribute
constexpr int CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4;  // value: cuuint64_t
// CUstream_flags, CUevent_flags
constexpr unsigned CU_STREAM_DEFAULT = 0;
constexpr unsigned CU_STREAM_NON_BLOCKING = 1;
constexpr unsigned CU_EVENT_DEFAULT = 0;
constexpr unsigned CU_EVENT_DISABLE_TIMING = 2;
// CUstreamCaptureMode
constexpr int CU_STREAM_CAPTURE_MODE_GLOBAL = 0;
constexpr int CU_STREAM_CAPTURE_MODE_RELAXED = 2;
// CUstreamCaptureStatus
constexpr int CU_STREAM_CAPTURE_STATUS_NONE = 0;
constexpr int CU_STREAM_CAPTURE_STATUS_ACTIVE = 1;
constexpr int CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2;
constexpr int CUDA_ERROR_NOT_READY = 600;
}  // namespace cu

// A driver call that returned an error. what():
//   "<call> failed: <CUDA_ERROR_NAME> (<driver's text>) [<context>]"
class CudaError : public std::runtime_error {
public:
  CudaError(std::string call, CUresult result, std::string error_name, std::string error_string, std::string context);
  const std::string& call() const { return call_; }
  CUresult result() const { return result_; }
  const std::string& error_name() const { return error_name_; }      // "CUDA_ERROR_OUT_OF_MEMORY"
  const std::string& error_string() const { return error_string_; }  // "out of memory"
  const std::string& context() const { return context_; }

private:
  std::string call_;
  CUresult result_;
  std::string error_name_, error_string_, context_;
};

// The driver entry points, with cuda.h's C signatures, under the symbol names cuda.h maps to
// (cuMemAlloc -> cuMemAlloc_v2, ...). Resolved with dlsym; all are non-null once loaded.
struct DriverApi {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuGetErrorName)(CUresult, const char**);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDeviceTotalMem)(size_t*, CUdevice);                 // cuDeviceTotalMem_v2
  CUresult (*cuDeviceGetUuid)(void* /* CUuuid: char[16] */, CUdevice);  // cuDeviceGetUuid_v2, else cuDeviceGetUuid
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);                 // cuDevicePrimaryCtxRelease_v2
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int*, CUfunction, int, size_t);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void**, void**);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);                    // cuMemAlloc_v2
  CUresult (*cuMemFree)(CUdeviceptr);                              // cuMemFree_v2
  CUresult (*cuMemAllocAsync)(CUdeviceptr*, size_t, CUstream);
  CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
  CUresult (*cuDeviceGetDefaultMemPool)(CUmemoryPool*, CUdevice);
  CUresult (*cuMemPoolSetAttribute)(CUmemoryPool, int, void*);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);                // cuMemcpyHtoD_v2
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream); // cuMemcpyHtoDAsync_v2
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);                      // cuMemcpyDtoH_v2
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream);       // cuMemcpyDtoHAsync_v2
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*cuStreamCreate)(CUstream*, unsigned);
  CUresult (*cuStreamDestroy)(CUstream);                           // cuStreamDestroy_v2
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventDestroy)(CUevent);                             // cuEventDestroy_v2
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);        // cuEventElapsedTime_v2, else cuEventElapsedTime
  CUresult (*cuPointerGetAttribute)(void*, int, CUdeviceptr);
  CUresult (*cuStreamBeginCapture)(CUstream, int /* CUstreamCaptureMode */);  // cuStreamBeginCapture_v2
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph*);
  CUresult (*cuGraphInstantiate)(CUgraphExec*, CUgraph, unsigned long long);  // cuGraphInstantiateWithFlags
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
  CUresult (*cuGraphExecDestroy)(CUgraphExec);
  CUresult (*cuGraphDestroy)(CUgraph);
  CUresult (*cuStreamIsCapturing)(CUstream, int* /* CUstreamCaptureStatus */);
  CUresult (*cuThreadExchangeStreamCaptureMode)(int* /* CUstreamCaptureMode */);
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned);
  CUresult (*cuEventQuery)(CUevent);
  CUresult (*cuMemAllocHost)(void**, size_t);                      // cuMemAllocHost_v2
  CUresult (*cuMemFreeHost)(void*);
  // Optional (drivers for CUDA 12.0 and newer; null before): TMA tensor maps.
  CUresult (*cuTensorMapEncodeTiled)(void* /* CUtensorMap* */, int, unsigned, void*, const unsigned long long*,
                                     const unsigned long long*, const unsigned*, const unsigned*, int, int, int, int) = nullptr;
};

// (DriverApi member, the symbol looked up for it) for every entry point, e.g. ("cuMemAlloc",
// "cuMemAlloc_v2"); the unit test compares them with cuda.h's macros.
std::vector<std::pair<std::string, std::string>> driver_entry_points();

// The loaded driver: one per process, loaded (and cuInit()ed) on first use, thread-safe.
class CudaDriver {
public:
  // Whether the driver loaded and cuInit succeeded; if not, *why (when given) says why. Never throws.
  static bool available(std::string* why = nullptr) noexcept;
  // The driver; UserError("CUDA driver", ...) when there is none or cuInit failed.
  static CudaDriver& get();

  const DriverApi& api() const { return api_; }
  int version() const { return version_; }  // cuDriverGetVersion: 13000 for 13.0
  // Throws CudaError when r is not CUDA_SUCCESS.
  void check(CUresult r, const char* call, const std::string& context = {}) const;
  std::string error_name(CUresult r) const;    // "CUDA_ERROR_INVALID_VALUE", or "CUDA error <n>"
  std::string error_string(CUresult r) const;  // "invalid argument", or "unknown error"

  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

private:
  CudaDriver() = default;
  friend struct DriverLoader;
  DriverApi api_{};
  int version_ = 0;
};

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0, sm_count = 0;
  int max_shared_per_block_optin = 0;  // bytes, with cuFuncSetAttribute opt-in
  int max_threads_per_block = 0;
  size_t total_memory = 0;             // bytes
  std::string uuid_or_empty;           // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" as nvidia-smi prints it
};

// These throw the UserError of CudaDriver::get() when there is no driver.
int driver_version();
int device_count();
DeviceInfo device_info(int ordinal);  // UserError for an ordinal out of range

// RAII over a device's primary context (retained in the constructor, released in the destructor).
class Context {
public:
  explicit Context(int ordinal);  // UserError for an ordinal out of range
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  void make_current() const;  // cuCtxSetCurrent on the calling thread
  CUcontext handle() const { return ctx_; }
  int ordinal() const { return ordinal_; }

private:
  int ordinal_;
  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
};

// Makes `context` current on the calling thread for a scope, then restores the context that was
// current before (none included): every call into attnjit leaves the caller's thread as it found
// it, so a program (or PyTorch) that uses another context on that thread keeps it. Throws when
// the context cannot be made current; restoring never throws.
class ScopedCurrentContext {
public:
  explicit ScopedCurrentContext(const Context& context);
  ~ScopedCurrentContext();
  ScopedCurrentContext(const ScopedCurrentContext&) = delete;
  ScopedCurrentContext& operator=(const ScopedCurrentContext&) = delete;

private:
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

// The process-wide retained primary context of a device, created on first use and never released
// (thread-safe). Objects below remember the context current at their creation and make it
// current again in their destructors, so keep that context alive as long as they are.
Context& shared_context(int ordinal);

// A loaded CUBIN in the current context. Movable, not copyable.
class Module {
public:
  explicit Module(const std::vector<uint8_t>& cubin, const std::string& context = {});
  ~Module();
  Module(Module&& other) noexcept;
  Module& operator=(Module&& other) noexcept;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  // cuModuleGetFunction; CudaError (CUDA_ERROR_NOT_FOUND) when the module has no such kernel.
  CUfunction function(const std::string& name) const;
  // Opts `f` in to `bytes` of dynamic shared memory (needed above 48 KiB).
  void set_max_dynamic_shared(CUfunction f, int bytes) const;
  // How many blocks of `threads` threads and `dynamic_shared` bytes of `f` an SM holds at once
  // (cuOccupancyMaxActiveBlocksPerMultiprocessor: registers, shared memory, block and warp limits).
  int resident_blocks_per_sm(CUfunction f, int threads, size_t dynamic_shared) const;
  CUmodule handle() const { return module_; }

private:
  CUmodule module_ = nullptr;
  CUcontext ctx_ = nullptr;
  std::string context_;
};

// cuLaunchKernel with a 1-D block. The grid is checked first (x <= 2^31-1, y and z <= 65535, none
// 0; block_x 1..1024): UserError naming the limit. `context` names the kernel; errors add the grid.
void launch(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x, unsigned shared_bytes,
            CUstream stream, void** params, const std::string& context);

// Stream-ordered allocation from the current device's default memory pool.
CUdeviceptr alloc_async(size_t bytes, CUstream stream, const std::string& context = {});
void free_async(CUdeviceptr p, CUstream stream, const std::string& context = {});
// Sets the default pool's release threshold so freed memory stays in the pool across synchronizes
// (the driver's default, 0, returns it to the OS at every synchronize).
void keep_pool_memory(int ordinal, uint64_t bytes = UINT64_MAX);
// Plain (not stream-ordered) allocation, for long-lived tables. Not named alloc/free so that
// `free(p)` inside namespace attnjit still means ::free.
CUdeviceptr device_alloc(size_t bytes, const std::string& context = {});
void device_free(CUdeviceptr p, const std::string& context = {});

void copy_to_device(CUdeviceptr dst, const void* src, size_t bytes, const std::string& context = {});
void copy_to_device_async(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream,
                          const std::string& context = {});
void copy_to_host(void* dst, CUdeviceptr src, size_t bytes, const std::string& context = {});
void copy_to_host_async(void* dst, CUdeviceptr src, size_t bytes, CUstream stream, const std::string& context = {});
void memset_d8_async(CUdeviceptr dst, unsigned char value, size_t bytes, CUstream stream,
                     const std::string& context = {});

// Owns memory from device_alloc; frees it in the destructor. Movable, not copyable.
class DeviceBuffer {
public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes, const std::string& context = {});
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  CUdeviceptr get() const { return ptr_; }
  size_t size() const { return bytes_; }
  void reset();  // frees now
  // Waits for all work in the context the memory belongs to (nothing without memory); errors are
  // ignored (for destructors). Memory from cuMemAlloc may be freed before a kernel that reads it
  // has finished unless the caller waits first: cuMemFree only "may" synchronise.
  void wait_for_users() const;

private:
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
  CUcontext ctx_ = nullptr;
};

CUstream create_stream(bool non_blocking = true);  // CU_STREAM_NON_BLOCKING unless asked otherwise
void destroy_stream(CUstream stream);
void synchronize(CUstream stream, const std::string& context = {});

// Times work on a stream with a pair of events.
class EventTimer {
public:
  EventTimer();
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void record_start(CUstream stream);
  void record_stop(CUstream stream);
  float elapsed_ms();  // waits for the stop event

private:
  CUevent start_ = nullptr, stop_ = nullptr;
  CUcontext ctx_ = nullptr;
  bool started_ = false, stopped_ = false;
};

// Stream capture (CUDA graphs). Whether `stream` is capturing work into a graph (cuStreamIsCapturing;
// an invalidated capture counts: its work must not run either).
bool stream_capturing(CUstream stream);

// For a scope, the calling thread's capture mode relaxed where `relax` (cuThreadExchangeStreamCaptureMode,
// push-pop): a call captured in a graph may then allocate (cuMemAlloc, cuMemAllocHost) and load
// modules, which are not work on a stream and are done once, at capture, not at each replay. The
// thread's mode is restored at the end of the scope.
class RelaxedCapture {
public:
  explicit RelaxedCapture(bool relax);
  ~RelaxedCapture();
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

private:
  bool relaxed_ = false;
  int previous_ = 0;  // CUstreamCaptureMode
};

// Page-locked host memory (cuMemAllocHost), freed in the destructor: the source of a copy a graph
// replays. Movable, not copyable.
class PinnedBuffer {
public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes, const std::string& context = {});
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* get() const { return ptr_; }

private:
  void* ptr_ = nullptr;
  CUcontext ctx_ = nullptr;
};

// An event that marks a point in one stream's work (cuEventRecord), for other streams to wait on
// (cuStreamWaitEvent) or the host to ask about (cuEventQuery). Created in the current context.
class StreamEvent {
public:
  StreamEvent();
  ~StreamEvent();
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;
  void record(CUstream stream);
  void make_wait(CUstream stream) const;  // work enqueued on `stream` after this waits for the point
  bool done() const;                      // cuEventQuery: the work before the point has finished

private:
  CUevent event_ = nullptr;
  CUcontext ctx_ = nullptr;
};

// The work `enqueue` puts on `stream`, captured once as a CUDA graph (global capture mode: a call
// that may not be captured, such as a synchronous copy, fails the capture with the driver's error)
// and replayed by launch(). What the work reads and writes is fixed at capture: replays see new
// contents of the same buffers.
class CapturedGraph {
public:
  CapturedGraph(CUstream stream, const std::function<void()>& enqueue);
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  void launch(CUstream stream);

private:
  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
};

struct PointerInfo {
  bool is_device_memory = false;  // device (or managed) memory of some GPU
  int device_ordinal = -1;        // that GPU; -1 for host memory
};
// What the driver knows about `p`; an ordinary host pointer (unknown to the driver) gives
// {false, -1} without throwing.
PointerInfo pointer_info(const void* p);

// A TMA tensor map for the GPU (cuTensorMapEncodeTiled). UserError when the spec breaks the
// driver's rules (emu::tensor_map_problem) or the driver is too old to make tensor maps.
emu::TensorMapBytes encode_tensor_map(const emu::TensorMapSpec& spec);

}  // namespace attnjit
