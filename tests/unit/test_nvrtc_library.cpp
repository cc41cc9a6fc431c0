// NVRTC found at run time (compiler/nvrtc/nvrtc_library.hpp): places that hold nothing usable are
// reported, each version is kept once, the newest NVRTC that targets an arch compiles it, and CUDA
// 12's NVRTC (PyPI's nvidia-cuda-nvrtc-cu12, installed by scripts/setup_deps.sh) serves sm_61 and
// sm_70 beside CUDA 13's.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "compiler/nvrtc/cubin_info.hpp"
#include "compiler/nvrtc/nvrtc_compiler.hpp"
#include "compiler/nvrtc/nvrtc_library.hpp"

#if __has_include(<nvrtc.h>)
#include <nvrtc.h>
// NvrtcApi declares NVRTC's C API itself (so no header is needed to build); it must match.
static_assert(sizeof(nvrtcResult) == sizeof(int) && NVRTC_SUCCESS == 0);
static_assert(sizeof(nvrtcProgram) == sizeof(attnjit::NvrtcApi::Program));
static_assert(std::is_same_v<decltype(&nvrtcGetCUBINSize), nvrtcResult (*)(nvrtcProgram, size_t*)>);
static_assert(std::is_same_v<decltype(&nvrtcCompileProgram), nvrtcResult (*)(nvrtcProgram, int, const char* const*)>);
#endif

using namespace attnjit;

namespace {

// The folders the build found (tests/CMakeLists.txt): the toolkit's lib folder and the lib folder
// of the nvidia-cuda-nvrtc-cu12 wheel; empty when absent.
const std::string kToolkitDir = ATTNJIT_TEST_TOOLKIT_LIB_DIR;
const std::string kCuda12Dir = ATTNJIT_TEST_NVRTC12_DIR;

bool has_toolkit_nvrtc() {
  return !kToolkitDir.empty() && !search_nvrtc({kToolkitDir}, "test", false).found.empty();
}

const char* kAxpy = R"(extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
)";

}  // namespace

TEST_CASE("places that hold no NVRTC are reported with the reason", "[nvrtc]") {
  const std::string dir = std::filesystem::temp_directory_path() / "attnjit_nvrtc_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/libnvrtc.so.99") << "not a shared library";
  const NvrtcSearch s = search_nvrtc({dir + "/missing", "/", dir, dir + "/libnvrtc.so.99"}, "test", false);
  CHECK(s.found.empty());
  CHECK(!s.disabled);
  REQUIRE(s.skipped.size() == 3);  // the file is tried once, through the folder and by name
  CHECK(s.skipped[0] == dir + "/missing: no such file or folder");
  CHECK(s.skipped[1] == "/: no libnvrtc.so* in this folder");
  CHECK_THAT(s.skipped[2], Catch::StartsWith(dir + "/libnvrtc.so.99: cannot be loaded:"));
  const std::string text = describe_nvrtc_search(s);
  CHECK_THAT(text, Catch::Contains("no NVRTC was found") && Catch::Contains("pip install nvidia-cuda-nvrtc-cu12") &&
                       Catch::Contains("ATTNJIT_NVRTC"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("the toolkit's NVRTC loads once, with its version and archs", "[nvrtc]") {
  if (!has_toolkit_nvrtc()) {
    WARN("SKIPPED: no CUDA toolkit NVRTC at '" << kToolkitDir << "'");
    return;
  }
  // The folder and the file in it are one library, kept once.
  const NvrtcSearch s = search_nvrtc({kToolkitDir, kToolkitDir}, "test", false);
  REQUIRE(s.found.size() == 1);
  const NvrtcLibrary& lib = s.found[0];
  CHECK(std::regex_match(lib.version, std::regex(R"(\d+\.\d+)")));
  CHECK(lib.found_by == "test");
  CHECK(lib.targets(80));
  CHECK(lib.targets(90));
  CHECK(!lib.targets(81));
  CHECK(archs_served(s, lib) == lib.archs);
  const NvrtcSearch again = search_nvrtc({lib.path}, "again", false);
  CHECK(again.found[0].found_by == "again");
  CHECK(again.found[0].api.compile_program == lib.api.compile_program);  // loaded once per process
}

TEST_CASE("with CUDA 12's NVRTC beside CUDA 13's, each arch goes to the newest that targets it", "[nvrtc]") {
  if (!has_toolkit_nvrtc() || kCuda12Dir.empty()) {
    WARN("SKIPPED: needs the toolkit's NVRTC and the nvidia-cuda-nvrtc-cu12 wheel (scripts/setup_deps.sh installs it); "
         "toolkit '" << kToolkitDir << "', wheel '" << kCuda12Dir << "'");
    return;
  }
  const NvrtcSearch s = search_nvrtc({kCuda12Dir, kToolkitDir}, "test", false);
  REQUIRE(s.found.size() == 2);
  const NvrtcLibrary& newer = s.found[0];
  const NvrtcLibrary& cuda12 = s.found[1];  // newest first, whatever the search order
  CHECK(newer.major >= 13);
  CHECK(cuda12.major == 12);
  CHECK(cuda12.targets(61));
  CHECK(!newer.targets(61));
  const std::vector<int> served = archs_served(s, cuda12);
  CHECK(std::find(served.begin(), served.end(), 61) != served.end());
  CHECK(std::find(served.begin(), served.end(), 70) != served.end());
  CHECK(std::find(served.begin(), served.end(), 80) == served.end());  // CUDA 13 serves what it targets
  CHECK_THAT(describe_nvrtc_search(s), Catch::Contains("NVRTC " + cuda12.version + " at " + cuda12.path));

  // The process's search, with the wheel registered as the Python package would: sm_61 and sm_70
  // compile through CUDA 12, sm_90 through the newer one.
  add_nvrtc_search_path(kCuda12Dir);
  CHECK(nvrtc_version_for("sm_61").rfind("12.", 0) == 0);
  CHECK(nvrtc_version_for("sm_90a").rfind("12.", 0) != 0);
  for (const std::string arch : {"sm_61", "sm_70", "sm_90"}) {
    INFO(arch);
    const CompileResult r = compile_cubin({"axpy_prog", kAxpy, arch, {}, 0});
    CHECK(r.nvrtc_version == nvrtc_version_for(arch));
    CHECK(!r.usage.empty());
    CHECK(r.usage[0].registers > 0);
  }

  // Under a CUDA 12 driver (the CUDA device says so), CUDA 12's NVRTC compiles every arch it
  // targets; an arch only a newer one targets still goes to that one.
  prefer_nvrtc_for_driver(12);
  CHECK(nvrtc_version_for("sm_90").rfind("12.", 0) == 0);
  CHECK(nvrtc_version_for("sm_61").rfind("12.", 0) == 0);
  const std::vector<int> under_12 = archs_served(s, cuda12);
  CHECK(std::find(under_12.begin(), under_12.end(), 80) != under_12.end());
  const bool only_newer = newer.targets(88) && !cuda12.targets(88);
  if (only_newer) CHECK(nvrtc_version_for("sm_88").rfind("12.", 0) != 0);
  prefer_nvrtc_for_driver(11);  // nothing that old here: the newest, as without a driver
  CHECK(nvrtc_version_for("sm_90").rfind("12.", 0) != 0);
  prefer_nvrtc_for_driver(0);
  CHECK(nvrtc_version_for("sm_90").rfind("12.", 0) != 0);
}
