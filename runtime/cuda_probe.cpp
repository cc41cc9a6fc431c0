#include "runtime/cuda_probe.hpp"

#include <dlfcn.h>

#if defined(ATTNJIT_HAVE_NVRTC)
#include <nvrtc.h>
#endif

namespace attnjit {

namespace {
// The few driver entry points the probe needs, with the driver API's C signatures.
using CUresult = int;
using CUdevice = int;
constexpr int kAttrComputeMajor = 75, kAttrComputeMinor = 76, kAttrSmCount = 16;
}  // namespace

DriverProbe probe_cuda_driver() {
  DriverProbe p;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    p.problem = "no CUDA driver (libcuda.so.1 could not be loaded): this machine has no usable NVIDIA GPU; "
                "the CPU device works";
    return p;
  }
  auto sym = [&](const char* name) { return dlsym(lib, name); };
  auto cuInit = reinterpret_cast<CUresult (*)(unsigned)>(sym("cuInit"));
  auto cuDriverGetVersion = reinterpret_cast<CUresult (*)(int*)>(sym("cuDriverGetVersion"));
  auto cuDeviceGetCount = reinterpret_cast<CUresult (*)(int*)>(sym("cuDeviceGetCount"));
  auto cuDeviceGet = reinterpret_cast<CUresult (*)(CUdevice*, int)>(sym("cuDeviceGet"));
  auto cuDeviceGetName = reinterpret_cast<CUresult (*)(char*, int, CUdevice)>(sym("cuDeviceGetName"));
  auto cuDeviceGetAttribute = reinterpret_cast<CUresult (*)(int*, int, CUdevice)>(sym("cuDeviceGetAttribute"));
  if (!cuInit || !cuDriverGetVersion || !cuDeviceGetCount || !cuDeviceGet || !cuDeviceGetName || !cuDeviceGetAttribute) {
    p.problem = "libcuda.so.1 lacks basic driver entry points; reinstall the NVIDIA driver";
    return p;
  }
  if (const CUresult r = cuInit(0); r != 0) {
    p.problem = "cuInit failed with CUDA error " + std::to_string(r) + " (no GPU visible, or the driver is not running)";
    return p;
  }
  p.loaded = true;
  cuDriverGetVersion(&p.driver_version);
  int count = 0;
  cuDeviceGetCount(&count);
  for (int n = 0; n < count; ++n) {
    CUdevice dev = 0;
    if (cuDeviceGet(&dev, n) != 0) continue;
    GpuInfo g;
    g.index = n;
    char name[256] = {};
    cuDeviceGetName(name, sizeof name, dev);
    g.name = name;
    cuDeviceGetAttribute(&g.cc_major, kAttrComputeMajor, dev);
    cuDeviceGetAttribute(&g.cc_minor, kAttrComputeMinor, dev);
    cuDeviceGetAttribute(&g.sm_count, kAttrSmCount, dev);
    p.gpus.push_back(g);
  }
  if (p.gpus.empty()) p.problem = "the CUDA driver is loaded but reports no GPUs";
  return p;
}

std::string nvrtc_version_string() {
#if defined(ATTNJIT_HAVE_NVRTC)
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) == NVRTC_SUCCESS) return std::to_string(major) + "." + std::to_string(minor);
  return "unknown (nvrtcVersion failed)";
#else
  return "not built in (the CUDA toolkit was not found at build time)";
#endif
}

}  // namespace attnjit
