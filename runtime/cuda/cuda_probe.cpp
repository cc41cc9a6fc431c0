#include "runtime/cuda/cuda_probe.hpp"

#include <exception>

#include "runtime/cuda/cuda_driver.hpp"

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

}  // namespace attnjit
