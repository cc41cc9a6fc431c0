// The GPU tests' entry point. Without a GPU the whole suite is skipped, and says so: ctest shows
// it as "Skipped" (exit code 77, SKIP_RETURN_CODE in tests/CMakeLists.txt) with the reason. With
// ATTNJIT_GPU_TESTS_DEVICE=emu the same tests run on the emulator (ctest emu_suite).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/cuda_driver.hpp"

int main(int argc, char** argv) {
  // On the emulator or the CPU device (ATTNJIT_GPU_TESTS_DEVICE=emu|cpu) nothing needs a GPU.
  const char* device = std::getenv("ATTNJIT_GPU_TESTS_DEVICE");
  const char* on_cpu = std::getenv("ATTNJIT_GPU_TESTS_ON_CPU");
  if ((device && std::string(device) != "gpu") || (on_cpu && *on_cpu == '1')) return Catch::Session().run(argc, argv);
  std::string why;
  if (!attnjit::CudaDriver::available(&why)) {
    std::printf("SKIPPED: the GPU tests need a CUDA GPU: %s\n", why.c_str());
    return 77;
  }
  if (attnjit::device_count() == 0) {
    std::printf("SKIPPED: the CUDA driver reports no GPUs\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
