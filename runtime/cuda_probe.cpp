#include "runtime/cuda_probe.hpp"

#include <exception>

#include "runtime/cuda_driver.hpp"

#if defined(ATTNJIT_HAVE_NVRTC)
#include <nvrtc.h>
#endif

namespace attnjit {

DriverProbe probe_cuda_driver() {
  DriverProbe p;
  if (!CudaDriver::available(&p.problem)) return p;
  p.loaded = true;
  try {
    p.driver_version = driver_version();
    const int count = device_count();
    for (int n = 0; n < count; ++n) {
      const DeviceInfo d = device_info(n);
      GpuInfo g;
      g.index = n;
      g.name = d.name;
      g.cc_major = d.cc_major;
      g.cc_minor = d.cc_minor;
      g.sm_count = d.sm_count;
      p.gpus.push_back(g);
    }
  } catch (const std::exception& e) {
    p.problem = e.what();
    return p;
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
