// The GPU's SM clock and board power after each timed run, read through NVML (the library
// nvidia-smi uses), loaded at run time so that the benchmark builds and runs where it is missing.
// A run that reads them can tell clock drift (power or temperature limits) from a kernel's own
// variation: the same kernel at a lower clock is slower for no reason of its own.
#pragma once

#include <dlfcn.h>

#include <string>

namespace attnjit_bench {

class NvmlClocks {
 public:
  // `uuid`: the CUDA device's UUID as "GPU-xxxxxxxx-..." (NVML's spelling).
  explicit NvmlClocks(const std::string& uuid) {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib_) {
      why_ = "libnvidia-ml.so.1 not found";
      return;
    }
    init_ = reinterpret_cast<Init>(dlsym(lib_, "nvmlInit_v2"));
    by_uuid_ = reinterpret_cast<ByUuid>(dlsym(lib_, "nvmlDeviceGetHandleByUUID"));
    clock_ = reinterpret_cast<ClockInfo>(dlsym(lib_, "nvmlDeviceGetClockInfo"));
    power_ = reinterpret_cast<PowerUsage>(dlsym(lib_, "nvmlDeviceGetPowerUsage"));
    if (!init_ || !by_uuid_ || !clock_ || !power_) {
      why_ = "libnvidia-ml.so.1 lacks nvmlInit_v2, nvmlDeviceGetHandleByUUID, nvmlDeviceGetClockInfo or nvmlDeviceGetPowerUsage";
      return;
    }
    if (int rc = init_(); rc != 0) {
      why_ = "nvmlInit_v2 returned " + std::to_string(rc);
      return;
    }
    if (int rc = by_uuid_(uuid.c_str(), &device_); rc != 0) {
      why_ = "nvmlDeviceGetHandleByUUID(" + uuid + ") returned " + std::to_string(rc);
      return;
    }
    ok_ = true;
  }
  NvmlClocks(const NvmlClocks&) = delete;
  NvmlClocks& operator=(const NvmlClocks&) = delete;
  // The library stays loaded and initialised until the process ends (no dlclose, no nvmlShutdown:
  // unloading it under its own exit handlers is what to avoid).
  ~NvmlClocks() = default;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }  // why no clocks are read, when !ok()

  // The SM clock in MHz and the board's power in W now; false (and nothing written) when not read.
  bool read(double& sm_mhz, double& power_w) const {
    if (!ok_) return false;
    unsigned mhz = 0, mw = 0;
    if (clock_(device_, 1 /* NVML_CLOCK_SM */, &mhz) != 0 || power_(device_, &mw) != 0) return false;
    sm_mhz = mhz, power_w = mw / 1000.0;
    return true;
  }

 private:
  using Device = void*;
  using Init = int (*)();
  using ByUuid = int (*)(const char*, Device*);
  using ClockInfo = int (*)(Device, int, unsigned*);
  using PowerUsage = int (*)(Device, unsigned*);
  void* lib_ = nullptr;
  Init init_ = nullptr;
  ByUuid by_uuid_ = nullptr;
  ClockInfo clock_ = nullptr;
  PowerUsage power_ = nullptr;
  Device device_ = nullptr;
  bool ok_ = false;
  std::string why_;
};

}  // namespace attnjit_bench
