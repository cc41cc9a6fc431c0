// Finding the CUDA driver and its GPUs without a link-time dependency: the library and the CLI
// load, and say so plainly, on machines with no driver.
#pragma once

#include <string>
#include <vector>

namespace attnjit {

struct GpuInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
};

struct DriverProbe {
  bool loaded = false;        // libcuda.so.1 was found and cuInit succeeded
  std::string problem;        // why not, in words a user can act on
  int driver_version = 0;     // e.g. 13000
  std::vector<GpuInfo> gpus;
};

DriverProbe probe_cuda_driver();

}  // namespace attnjit
