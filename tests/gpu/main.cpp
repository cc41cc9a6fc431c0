// The GPU tests' entry point. Without a GPU the whole suite is skipped, and says so: ctest shows
// it as "Skipped" (exit code 77, SKIP_RETURN_CODE in tests/CMakeLists.txt) with the reason. With
// ATTNJIT_GPU_TESTS_DEVICE=emu the same tests run on the emulator (ctest emu_suite), with =cpu
// (or ATTNJIT_GPU_TESTS_ON_CPU=1 when the former is unset) on the CPU device: neither needs a GPU.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/cuda/cuda_driver.hpp"
#include "tests/gpu/test_target.hpp"

int main(int argc, char** argv) {
  const std::string target = attnjit::gputest::target_name();
  if (!attnjit::gputest::target_name_valid(target)) {
    std::fprintf(stderr, "ATTNJIT_GPU_TESTS_DEVICE=%s: expected gpu, emu or cpu\n", target.c_str());
    return 2;
  }
  if (target != "gpu") return Catch::Session().run(argc, argv);
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
