// A stand-in for libnvidia-ml.so.1 with the four functions bench/nvml_clocks.hpp loads: a device
// for any UUID that starts with "GPU-", its SM clock 1980 MHz (other clocks 0), 612.345 W.
#include <cstring>

extern "C" {
int nvmlInit_v2() { return 0; }
int nvmlDeviceGetHandleByUUID(const char* uuid, void** device) {
  if (std::strncmp(uuid, "GPU-", 4) != 0) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *device = reinterpret_cast<void*>(0x1);
  return 0;
}
int nvmlDeviceGetClockInfo(void* device, int type, unsigned* mhz) {
  if (!device) return 1;
  *mhz = type == 1 ? 1980 : 0;  // NVML_CLOCK_SM
  return 0;
}
int nvmlDeviceGetPowerUsage(void* device, unsigned* milliwatts) {
  if (!device) return 1;
  *milliwatts = 612345;
  return 0;
}
}
