// The CUDA driver loader without a GPU: on a machine with no libcuda.so.1 every entry point says
// so in words (a UserError, never a crash); grid limits are checked before any driver call; and,
// where the toolkit's cuda.h is installed, the constants, handle types, entry-point signatures and
// versioned symbol names the loader uses are checked against the header at compile time.
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "compiler/support/error.hpp"
#include "runtime/cuda/cuda_driver.hpp"
#include "runtime/cuda/cuda_probe.hpp"

// Each DriverApi member's type, taken before cuda.h is included: its macros (cuMemAlloc ->
// cuMemAlloc_v2, ...) would otherwise rename the member names below.
#define ATTNJIT_TEST_ENTRY_POINTS(X)                                                                         \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGetCount) X(cuDeviceGet)  \
  X(cuDeviceGetName) X(cuDeviceGetAttribute) X(cuDeviceTotalMem) X(cuDeviceGetUuid)                          \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuCtxGetCurrent)             \
  X(cuCtxSynchronize)                                                                                        \
  X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) X(cuFuncSetAttribute) X(cuLaunchKernel)       \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor)                                                             \
  X(cuMemAlloc) X(cuMemFree) X(cuMemAllocAsync) X(cuMemFreeAsync) X(cuDeviceGetDefaultMemPool)               \
  X(cuMemPoolSetAttribute) X(cuMemcpyHtoD) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoH) X(cuMemcpyDtoHAsync)         \
  X(cuMemsetD8Async) X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuEventCreate)            \
  X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize) X(cuEventElapsedTime) X(cuPointerGetAttribute)     \
  X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphExecDestroy)  \
  X(cuGraphDestroy) X(cuStreamIsCapturing) X(cuThreadExchangeStreamCaptureMode) X(cuStreamWaitEvent)           \
  X(cuEventQuery) X(cuMemAllocHost) X(cuMemFreeHost)

namespace ours {
#define ATTNJIT_MEMBER_TYPE(api) using api##_t = decltype(attnjit::DriverApi::api);
ATTNJIT_TEST_ENTRY_POINTS(ATTNJIT_MEMBER_TYPE)
#undef ATTNJIT_MEMBER_TYPE
}  // namespace ours

#if __has_include(<cuda.h>)
#include <cuda.h>
#define ATTNJIT_HAVE_CUDA_H 1
#endif

using attnjit::UserError;

namespace {

#if defined(ATTNJIT_HAVE_CUDA_H)

// Whether a parameter or result type of ours passes the same bits as the header's: the same type,
// integers/enums of one size (CUresult is an enum there, int here), or pointers to such (void*
// stands for a struct pointer such as CUuuid*).
template <class A, class B>
constexpr bool abi_same() {
  if constexpr (std::is_same_v<A, B>) {
    return true;
  } else if constexpr (std::is_pointer_v<A> && std::is_pointer_v<B>) {
    using PA = std::remove_pointer_t<A>;
    using PB = std::remove_pointer_t<B>;
    if constexpr (std::is_const_v<PA> != std::is_const_v<PB>) {
      return false;
    } else if constexpr (std::is_void_v<PA>) {
      return true;
    } else {
      return abi_same<std::remove_const_t<PA>, std::remove_const_t<PB>>();
    }
  } else if constexpr ((std::is_integral_v<A> || std::is_enum_v<A>) && (std::is_integral_v<B> || std::is_enum_v<B>)) {
    return sizeof(A) == sizeof(B);
  } else {
    return false;
  }
}

template <class A, class B>
struct same_signature : std::false_type {};
template <class RA, class... A, class RB, class... B>
struct same_signature<RA (*)(A...), RB (*)(B...)> {
  static constexpr bool check() {
    if constexpr (sizeof...(A) != sizeof...(B)) {
      return false;
    } else {
      return abi_same<RA, RB>() && (abi_same<A, B>() && ...);
    }
  }
  static constexpr bool value = check();
};

// Every entry point: our member's signature is cuda.h's, and the symbol we dlsym is the name the
// header maps the API to (cuMemAlloc -> cuMemAlloc_v2). The member's name is taken unexpanded (#api).
#define ATTNJIT_STR2(x) #x
#define ATTNJIT_STR(x) ATTNJIT_STR2(x)
#define ATTNJIT_CHECK_SIGNATURE(api) \
  static_assert(same_signature<ours::api##_t, decltype(&::api)>::value, "signature of " #api " differs from cuda.h");
ATTNJIT_TEST_ENTRY_POINTS(ATTNJIT_CHECK_SIGNATURE)

std::map<std::string, std::string> header_symbols() {
  std::map<std::string, std::string> out;
#define ATTNJIT_HEADER_SYMBOL(api) out[#api] = ATTNJIT_STR(api);
  ATTNJIT_TEST_ENTRY_POINTS(ATTNJIT_HEADER_SYMBOL)
#undef ATTNJIT_HEADER_SYMBOL
  return out;
}

namespace cu = attnjit::cu;
static_assert(std::is_same_v<attnjit::CUcontext, ::CUcontext>);
static_assert(std::is_same_v<attnjit::CUmodule, ::CUmodule>);
static_assert(std::is_same_v<attnjit::CUfunction, ::CUfunction>);
static_assert(std::is_same_v<attnjit::CUstream, ::CUstream>);
static_assert(std::is_same_v<attnjit::CUevent, ::CUevent>);
static_assert(std::is_same_v<attnjit::CUmemoryPool, ::CUmemoryPool>);
static_assert(std::is_same_v<attnjit::CUgraph, ::CUgraph>);
static_assert(std::is_same_v<attnjit::CUgraphExec, ::CUgraphExec>);
static_assert(cu::CU_STREAM_CAPTURE_MODE_GLOBAL == ::CU_STREAM_CAPTURE_MODE_GLOBAL);
static_assert(cu::CU_STREAM_CAPTURE_MODE_RELAXED == ::CU_STREAM_CAPTURE_MODE_RELAXED);
static_assert(cu::CU_STREAM_CAPTURE_STATUS_NONE == ::CU_STREAM_CAPTURE_STATUS_NONE);
static_assert(cu::CU_STREAM_CAPTURE_STATUS_ACTIVE == ::CU_STREAM_CAPTURE_STATUS_ACTIVE);
static_assert(cu::CU_STREAM_CAPTURE_STATUS_INVALIDATED == ::CU_STREAM_CAPTURE_STATUS_INVALIDATED);
static_assert(cu::CUDA_ERROR_NOT_READY == ::CUDA_ERROR_NOT_READY);
static_assert(sizeof(int) == sizeof(::CUstreamCaptureStatus) && sizeof(int) == sizeof(::CUstreamCaptureMode));
static_assert(std::is_same_v<attnjit::CUdevice, ::CUdevice>);
static_assert(std::is_same_v<attnjit::CUdeviceptr, ::CUdeviceptr>);
static_assert(sizeof(attnjit::CUresult) == sizeof(::CUresult));
static_assert(sizeof(CUuuid) == 16);
static_assert(cu::CUDA_SUCCESS == ::CUDA_SUCCESS);
static_assert(cu::CUDA_ERROR_INVALID_VALUE == ::CUDA_ERROR_INVALID_VALUE);
static_assert(cu::CUDA_ERROR_OUT_OF_MEMORY == ::CUDA_ERROR_OUT_OF_MEMORY);
static_assert(cu::CUDA_ERROR_NOT_INITIALIZED == ::CUDA_ERROR_NOT_INITIALIZED);
static_assert(cu::CUDA_ERROR_DEINITIALIZED == ::CUDA_ERROR_DEINITIALIZED);
static_assert(cu::CUDA_ERROR_STUB_LIBRARY == ::CUDA_ERROR_STUB_LIBRARY);
static_assert(cu::CUDA_ERROR_NO_DEVICE == ::CUDA_ERROR_NO_DEVICE);
static_assert(cu::CUDA_ERROR_INVALID_CONTEXT == ::CUDA_ERROR_INVALID_CONTEXT);
static_assert(cu::CUDA_ERROR_NOT_FOUND == ::CUDA_ERROR_NOT_FOUND);
static_assert(cu::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK == ::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
static_assert(cu::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT == ::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
static_assert(cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR == ::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
static_assert(cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR == ::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
static_assert(cu::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN ==
              ::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
static_assert(cu::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED == ::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED);
static_assert(cu::CU_POINTER_ATTRIBUTE_MEMORY_TYPE == ::CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
static_assert(cu::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL == ::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
static_assert(cu::CU_MEMORYTYPE_HOST == ::CU_MEMORYTYPE_HOST);
static_assert(cu::CU_MEMORYTYPE_DEVICE == ::CU_MEMORYTYPE_DEVICE);
static_assert(cu::CU_MEMORYTYPE_ARRAY == ::CU_MEMORYTYPE_ARRAY);
static_assert(cu::CU_MEMORYTYPE_UNIFIED == ::CU_MEMORYTYPE_UNIFIED);
static_assert(sizeof(unsigned) == sizeof(::CUmemorytype));  // pointer_info reads the memory type into an unsigned
static_assert(cu::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES == ::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
static_assert(cu::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD == ::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD);
static_assert(cu::CU_STREAM_DEFAULT == ::CU_STREAM_DEFAULT);
static_assert(cu::CU_STREAM_NON_BLOCKING == ::CU_STREAM_NON_BLOCKING);
static_assert(cu::CU_EVENT_DEFAULT == ::CU_EVENT_DEFAULT);
static_assert(cu::CU_EVENT_DISABLE_TIMING == ::CU_EVENT_DISABLE_TIMING);

#endif  // ATTNJIT_HAVE_CUDA_H

const char* kNoGpu = "no GPU";

}  // namespace

TEST_CASE("the driver entry points match cuda.h's prototypes and versioned names", "[driver]") {
#if defined(ATTNJIT_HAVE_CUDA_H)
  // The signatures, constants and handle types were checked by the static_asserts above.
  const std::map<std::string, std::string> expected = header_symbols();
  std::map<std::string, std::string> ours;
  for (const auto& [member, symbol] : attnjit::driver_entry_points()) ours[member] = symbol;
  CHECK(ours == expected);
  CHECK(ours.at("cuMemAlloc") == "cuMemAlloc_v2");
  CHECK(ours.at("cuMemcpyHtoDAsync") == "cuMemcpyHtoDAsync_v2");
  CHECK(ours.at("cuDevicePrimaryCtxRelease") == "cuDevicePrimaryCtxRelease_v2");
#else
  WARN("SKIPPED: cuda.h is not installed, so the driver declarations are not checked against it");
#endif
}

TEST_CASE("grid and block limits are checked before the driver is called", "[driver]") {
  using attnjit::launch;
  auto msg = [](auto&& f) {
    try {
      f();
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  const std::string y = msg([] { launch(nullptr, 1, 65536, 1, 128, 0, nullptr, nullptr, "my_kernel"); });
  CHECK(y.find("my_kernel") != std::string::npos);
  CHECK(y.find("grid_y = 65536") != std::string::npos);
  CHECK(y.find("65535") != std::string::npos);
  CHECK_THAT(msg([] { launch(nullptr, 1, 1, 70000, 128, 0, nullptr, nullptr, "k"); }),
             Catch::Contains("grid_z = 70000") && Catch::Contains("65535"));
  CHECK_THAT(msg([] { launch(nullptr, 2147483648u, 1, 1, 128, 0, nullptr, nullptr, "k"); }),
             Catch::Contains("grid_x = 2147483648") && Catch::Contains("2147483647"));
  CHECK_THAT(msg([] { launch(nullptr, 0, 1, 1, 128, 0, nullptr, nullptr, "k"); }), Catch::Contains("grid_x = 0"));
  CHECK_THAT(msg([] { launch(nullptr, 1, 1, 1, 2048, 0, nullptr, nullptr, "k"); }),
             Catch::Contains("block_x = 2048") && Catch::Contains("1024"));
}

TEST_CASE("CudaError names the call, the driver's error and the context", "[driver]") {
  const attnjit::CudaError e("cuLaunchKernel", 701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
                             "too many resources requested for launch", "attnjit_fwd: grid (4, 1, 1)");
  CHECK(std::string(e.what()) ==
        "cuLaunchKernel failed: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (too many resources requested for launch): "
        "attnjit_fwd: grid (4, 1, 1)");
  CHECK(e.result() == 701);
  CHECK(e.call() == "cuLaunchKernel");
}

TEST_CASE("without a CUDA driver every entry point says there is no GPU", "[driver]") {
  std::string why;
  if (attnjit::CudaDriver::available(&why)) {
    CHECK(why.empty());
    CHECK_NOTHROW(attnjit::CudaDriver::get());
    CHECK(attnjit::probe_cuda_driver().loaded);
    WARN("SKIPPED: this machine has a CUDA driver; the no-driver messages are checked where there is none");
    return;
  }
  CHECK_THAT(why, Catch::Contains(kNoGpu) || Catch::Contains("cuInit failed"));
  CHECK(attnjit::CudaDriver::available() == false);  // a second call gives the same answer
  const std::string expected = "CUDA driver: " + why;
  auto throws_no_driver = [&](const char* what, auto&& f) {
    INFO(what);
    try {
      f();
      FAIL("no error");
    } catch (const UserError& e) {
      CHECK(e.where() == "CUDA driver");
      CHECK(std::string(e.what()) == expected);
    }
  };
  throws_no_driver("get", [] { attnjit::CudaDriver::get(); });
  throws_no_driver("driver_version", [] { attnjit::driver_version(); });
  throws_no_driver("device_count", [] { attnjit::device_count(); });
  throws_no_driver("device_info", [] { attnjit::device_info(0); });
  throws_no_driver("Context", [] { attnjit::Context c(0); });
  throws_no_driver("shared_context", [] { attnjit::shared_context(0); });
  throws_no_driver("Module", [] { attnjit::Module m(std::vector<uint8_t>(16, 0)); });
  throws_no_driver("alloc_async", [] { attnjit::alloc_async(256, nullptr); });
  throws_no_driver("device_alloc", [] { attnjit::device_alloc(256); });
  throws_no_driver("DeviceBuffer", [] { attnjit::DeviceBuffer b(256); });
  throws_no_driver("copy_to_host", [] {
    char c[4];
    attnjit::copy_to_host(c, 0x1000, 4);
  });
  throws_no_driver("create_stream", [] { attnjit::create_stream(); });
  throws_no_driver("synchronize", [] { attnjit::synchronize(nullptr); });
  throws_no_driver("EventTimer", [] { attnjit::EventTimer t; });
  throws_no_driver("pointer_info", [] {
    int x = 0;
    attnjit::pointer_info(&x);
  });
  throws_no_driver("launch", [] { attnjit::launch(nullptr, 1, 1, 1, 32, 0, nullptr, nullptr, "k"); });
  // Nothing to do needs no driver.
  CHECK(attnjit::alloc_async(0, nullptr) == 0);
  CHECK_NOTHROW(attnjit::free_async(0, nullptr));
  CHECK_NOTHROW(attnjit::DeviceBuffer());
  CHECK(attnjit::pointer_info(nullptr).is_device_memory == false);

  const attnjit::DriverProbe probe = attnjit::probe_cuda_driver();
  CHECK_FALSE(probe.loaded);
  CHECK(probe.problem == why);
  CHECK(probe.gpus.empty());
}

TEST_CASE("the no-driver message is the one users see", "[driver]") {
  std::string why;
  if (attnjit::CudaDriver::available(&why)) return;
  // On a machine with no libcuda.so.1 at all (this project's CI), the exact text.
  if (why.find("cuInit") == std::string::npos) {
    CHECK(why == "no CUDA driver (libcuda.so.1) on this machine: no GPU is available; use the CPU device");
  }
}
