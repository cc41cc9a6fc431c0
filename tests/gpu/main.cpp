// The GPU tests' entry point. Without a GPU the whole suite is skipped, and says so: ctest shows
// it as "Skipped" (exit code 77, SKIP_RETURN_CODE in tests/CMakeLists.txt) with the reason.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>

#include "runtime/cuda_driver.hpp"

int main(int argc, char** argv) {
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
