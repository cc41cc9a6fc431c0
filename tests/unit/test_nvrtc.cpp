// NVRTC to CUBIN without a GPU: every arch compiles, the options are deterministic, resource usage
// read from the ELF agrees with cuobjdump, spills show, errors show the numbered source, the log and
// the options, timeouts kill the compile, and parallel compiles survive a broken request.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "compiler/nvrtc/cubin_info.hpp"
#include "compiler/nvrtc/nvrtc_compiler.hpp"
#include "compiler/support/error.hpp"

using namespace attnjit;

// Without NVRTC there is nothing to compile: say so in the test output instead of passing silently.
#define SKIP_WITHOUT_NVRTC()                                                                \
  do {                                                                                      \
    if (!nvrtc_available()) {                                                               \
      WARN("SKIPPED: no NVRTC found (`attnjit info` says where it looked)");                 \
      return;                                                                               \
    }                                                                                       \
  } while (0)

namespace {

const char* kAxpy = R"(extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
)";

// Several kernels with different resource profiles, for the cross-check against cuobjdump.
const char* kProfiles = R"(extern "C" __global__ void __launch_bounds__(128) bounded(float* a, const float* b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] += b[i];
}
extern "C" __global__ void local_array(float* out, const int* idx, int n) {
  float loc[256];  // dynamically indexed below, so it lives in local memory (the stack)
  for (int k = 0; k < 256; ++k) loc[k] = out[k * n + threadIdx.x];
  float s = 0;
  for (int k = 0; k < n; ++k) s += loc[idx[k] & 255];
  out[threadIdx.x] = s;
}
extern "C" __global__ void shared_buf(float* out) {
  __shared__ float buf[1024];
  buf[threadIdx.x] = threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = buf[(threadIdx.x * 7) & 1023];
}
__device__ __noinline__ float helper(const float* p, int n) {
  float loc[64];
  for (int k = 0; k < 64; ++k) loc[k] = p[k * n];
  return loc[n & 63] + loc[(n * 3) & 63];
}
template <int N>
__global__ void calls(float* out, int n) { out[threadIdx.x] = helper(out + threadIdx.x, n) * N; }
template __global__ void calls<3>(float*, int);
)";

// 48 live accumulators under a 32-register cap: ptxas must spill.
const char* kPressure = R"(extern "C" __global__ void __maxnreg__(32) pressure(float* out, const float* in, int n) {
  float acc[48];
#pragma unroll
  for (int k = 0; k < 48; ++k) acc[k] = in[k * 256 + threadIdx.x];
  for (int it = 0; it < n; ++it) {
#pragma unroll
    for (int k = 0; k < 48; ++k) acc[k] = acc[k] * acc[(k + 1) % 48] + acc[(k + 7) % 48];
  }
  float s = 0;
#pragma unroll
  for (int k = 0; k < 48; ++k) s += acc[k] * (k + 1);
  out[threadIdx.x] = s;
}
)";

const char* kMma = R"(extern "C" __global__ void mma_f16(const unsigned* a, const unsigned* b, float* c) {
  unsigned A[4], B[2];
  float C[4] = {0.f, 0.f, 0.f, 0.f};
  for (int i = 0; i < 4; ++i) A[i] = a[threadIdx.x * 4 + i];
  for (int i = 0; i < 2; ++i) B[i] = b[threadIdx.x * 2 + i];
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(C[0]), "+f"(C[1]), "+f"(C[2]), "+f"(C[3])
               : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(B[0]), "r"(B[1]));
  for (int i = 0; i < 4; ++i) c[threadIdx.x * 4 + i] = C[i];
}
)";

// Line 5 uses an undeclared name.
const char* kBroken = R"(// a generated kernel with a bug on line 5
extern "C" __global__ void broken(float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = undeclared_scale * out[i];
}
)";

CompileRequest request(std::string name, const char* source, std::string arch = "sm_80") {
  CompileRequest r;
  r.name = std::move(name);
  r.source = source;
  r.arch = std::move(arch);
  return r;
}

bool is_elf(const std::vector<uint8_t>& b) {
  return b.size() > 64 && b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F';
}

const ResourceUsage& usage_of(const std::vector<ResourceUsage>& usage, const std::string& kernel) {
  auto it = std::find_if(usage.begin(), usage.end(), [&](const ResourceUsage& u) { return u.kernel == kernel; });
  if (it == usage.end()) FAIL("no resource usage for kernel " << kernel);
  return *it;
}

bool supported(const std::string& arch) {
  const auto archs = supported_archs();
  return std::find(archs.begin(), archs.end(), arch) != archs.end();
}

}  // namespace

TEST_CASE("canonical options are deterministic: built-ins first, caller options sorted and deduplicated", "[nvrtc]") {
  CompileRequest r = request("k", kAxpy, "sm_90a");
  r.options = {"-DB=2", "--use_fast_math", "-DA=1", "-DB=2"};
  const auto opts = canonical_options(r);
  const std::vector<std::string> expected{"--gpu-architecture=sm_90a", "-std=c++17", "-default-device",
                                          "--ptxas-options=-v", "--use_fast_math", "-DA=1", "-DB=2"};
  CHECK(opts == expected);
  std::reverse(r.options.begin(), r.options.end());
  CHECK(canonical_options(r) == expected);
  CHECK(canonical_options(r, CompileTarget::Ptx)[0] == "--gpu-architecture=compute_90a");

  r.options = {"-std=c++20"};
  const auto with_std = canonical_options(r);
  CHECK(std::count(with_std.begin(), with_std.end(), "-std=c++17") == 0);
  CHECK(std::count(with_std.begin(), with_std.end(), "-std=c++20") == 1);

  r.options = {"-I", "include"};
  CHECK_THROWS_AS(canonical_options(r), UserError);
  r.options = {"-arch=sm_70"};
  CHECK_THROWS_WITH(canonical_options(r), Catch::Contains("CompileRequest::arch"));
  r.options = {};
  r.arch = "ampere";
  CHECK_THROWS_WITH(canonical_options(r), Catch::Contains("sm_XX"));
}

TEST_CASE("nvrtc reports its version and the archs it targets", "[nvrtc]") {
  SKIP_WITHOUT_NVRTC();
  CHECK(std::regex_match(nvrtc_version(), std::regex(R"(\d+\.\d+)")));
  const auto archs = supported_archs();
  REQUIRE(!archs.empty());
  for (const auto& a : archs) CHECK(a.rfind("sm_", 0) == 0);
  CHECK(supported("sm_80"));
}

TEST_CASE("a small kernel compiles to CUBIN for every arch NVRTC supports, others are a clear error", "[nvrtc]") {
  SKIP_WITHOUT_NVRTC();
  for (const std::string arch : {"sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"}) {
    INFO("arch " << arch);
    if (!supported(arch)) {
      CHECK_THROWS_WITH(compile_cubin(request("axpy_prog", kAxpy, arch)),
                        Catch::Contains("no NVRTC found here compiles for " + arch) && Catch::Contains("nvidia-cuda-nvrtc-cu12"));
      WARN("NVRTC " << nvrtc_version() << " does not target " << arch << ": checked that it is refused clearly");
      continue;
    }
    const CompileResult res = compile_cubin(request("axpy_prog", kAxpy, arch));
    CHECK(is_elf(res.cubin));
    CHECK(res.options[0] == "--gpu-architecture=" + arch);
    CHECK(res.seconds > 0);
    CHECK(usage_of(res.usage, "axpy").registers > 0);
  }
}

TEST_CASE("inspect_cubin reads registers, stack, shared memory and launch bounds, cuobjdump agrees", "[nvrtc]") {
  SKIP_WITHOUT_NVRTC();
  // The ELF layout moved between generations (sm_90 reserves shared memory, sm_100 adds sections).
  for (const std::string arch : {"sm_75", "sm_80", "sm_90", "sm_100", "sm_120"}) {
    INFO("arch " << arch);
    if (!supported(arch)) continue;
    const CompileResult res = compile_cubin(request("profiles", kProfiles, arch));
    const auto usage = inspect_cubin(res.cubin);
    REQUIRE(usage.size() == 4);  // the noinline device function is not a kernel
    for (const auto& u : usage) CHECK(u.registers > 0);
    CHECK(usage_of(usage, "bounded").max_threads == 128);
    CHECK(usage_of(usage, "shared_buf").max_threads == 0);
    CHECK(usage_of(usage, "shared_buf").shared_bytes >= 4096);
    CHECK(usage_of(usage, "local_array").stack_bytes >= 1024);
    CHECK(usage_of(usage, "_Z5callsILi3EEvPfi").stack_bytes > 0);

    const auto dump = run_cuda_tool_on_cubin("cuobjdump", {"--dump-resource-usage"}, res.cubin);
    if (!dump) {
      WARN("SKIPPED the cuobjdump cross-check: cuobjdump is not on PATH or in /usr/local/cuda/bin");
      continue;
    }
    // " Function NAME:\n  REG:10 STACK:0 SHARED:4096 LOCAL:0 CONSTANT[0]:360 ..."
    static const std::regex re(R"(Function ([^:\s]+):\s+REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+))");
    int seen = 0;
    for (std::sregex_iterator it(dump->begin(), dump->end(), re), end; it != end; ++it, ++seen) {
      const ResourceUsage& u = usage_of(usage, (*it)[1]);
      INFO("kernel " << u.kernel << "; cuobjdump says: " << it->str());
      CHECK(u.registers == std::stoi((*it)[2]));
      CHECK(u.stack_bytes == std::stoi((*it)[3]));
      CHECK(u.shared_bytes == std::stoi((*it)[4]));
      CHECK(u.local_bytes == std::stoi((*it)[5]));
    }
    CHECK(seen == 4);
  }
}

TEST_CASE("register spills and local arrays show in the resource usage", "[nvrtc]") {
  SKIP_WITHOUT_NVRTC();
  const CompileResult res = compile_cubin(request("pressure_prog", kPressure));
  const ResourceUsage& u = usage_of(res.usage, "pressure");
  CHECK(u.registers <= 32);
  CHECK(u.spill_store_bytes > 0);
  CHECK(u.spill_load_bytes > 0);
  CHECK(u.stack_bytes > 0);
  CHECK(inspect_cubin(res.cubin)[0].spill_store_bytes == 0);  // the ELF alone does not record spills

  const CompileResult local = compile_cubin(request("profiles", kProfiles));
  CHECK(usage_of(local.usage, "local_array").stack_bytes >= 1024);
  CHECK(usage_of(local.usage, "local_array").spill_store_bytes == 0);
}

TEST_CASE("ptxas log spills are attributed to kernels, spilling device functions are kept", "[nvrtc]") {
  std::vector<ResourceUsage> usage(1);
  usage[0].kernel = "k";
  usage[0].registers = 32;
  add_ptxas_log_spills(usage,
                       "ptxas info    : Function properties for k\n"
                       "ptxas         .     192 bytes stack frame, 352 bytes spill stores, 376 bytes spill loads\n"
                       "ptxas info    : Function properties for _Z6helperPKfi\n"
                       "ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
                       "ptxas info    : Function properties for _Z5quietv\n"
                       "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n");
  REQUIRE(usage.size() == 2);
  CHECK(usage[0].spill_store_bytes == 352);
  CHECK(usage[0].spill_load_bytes == 376);
  CHECK(usage[1].kernel == "_Z6helperPKfi");
  CHECK_FALSE(usage[1].is_kernel);
  CHECK(usage[1].spill_store_bytes == 8);
}

TEST_CASE("inspect_cubin rejects bytes that are not a CUBIN", "[nvrtc]") {
  CHECK_THROWS_AS(inspect_cubin({}), UserError);
  std::vector<uint8_t> junk(200, 0x41);
  CHECK_THROWS_WITH(inspect_cubin(junk), Catch::Contains("magic"));
  junk[0] = 0x7f, junk[1] = 'E', junk[2] = 'L', junk[3] = 'F', junk[4] = 2, junk[5] = 1, junk[18] = 190, junk[19] = 0;
  CHECK_THROWS_AS(inspect_cubin(junk), UserError);  // a header whose section table points nowhere
}

TEST_CASE("mma.sync m16n8k16 for sm_80 disassembles to HMMA", "[nvrtc]") {
  SKIP_WITHOUT_NVRTC();
  const CompileResult res = compile_cubin(request("mma_prog", kMma));
  std::string sass;
  try {
    sass = disassemble_cubin(res.cubin);
  } catch (const UserError& e) {
    CHECK_THAT(e.what(), Catch::Contains("nvdisasm") && Catch::Contains("cuobjdump"));
    WARN("SKIPPED the SASS check: " << e.what());
    return;
  }
  CHECK_THAT(sass, Catch::Contains("HMMA.16816.F32"));
}

TEST_CASE("a compile error shows the numbered source, the NVRTC log and the options", "[nvrtc]") {
  SKIP_WITHOUT_NVRTC();
  CompileRequest r = request("attnjit_broken_1", kBroken);
  r.options = {"-DUNUSED=1"};
  try {
    compile_cubin(r);
    FAIL("the broken kernel compiled");
  } catch (const CompileError& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("NVRTC failed to compile attnjit_broken_1 for sm_80"));
    CHECK_THAT(what, Catch::Contains("options: --gpu-architecture=sm_80 -std=c++17 -default-device"));
    CHECK_THAT(what, Catch::Contains("-DUNUSED=1"));
    CHECK_THAT(what, Catch::Contains("attnjit_broken_1.cu(5): error"));
    CHECK_THAT(what, Catch::Contains("undeclared_scale"));
    CHECK_THAT(what, Catch::Contains("  1 | // a generated kernel with a bug on line 5"));
    CHECK_THAT(what, Catch::Contains("> 5 |   out[i] = undeclared_scale * out[i];"));
    CHECK_THAT(what, Catch::Contains("  6 | }"));
    CHECK_FALSE(e.timed_out());
    CHECK_THAT(e.log(), Catch::Contains("error"));
  }
}

TEST_CASE("numbered_source aligns the numbers and marks lines", "[nvrtc]") {
  std::string src;
  for (int i = 1; i <= 12; ++i) src += "line" + std::to_string(i) + "\n";
  const std::string out = numbered_source(src, {10});
  CHECK_THAT(out, Catch::StartsWith("   1 | line1\n"));
  CHECK_THAT(out, Catch::Contains("\n> 10 | line10\n"));
  CHECK_THAT(out, Catch::EndsWith("  12 | line12\n"));
}

TEST_CASE("a compile that runs past its timeout is killed", "[nvrtc]") {
  SKIP_WITHOUT_NVRTC();
  CompileRequest r = request("pressure_prog", kPressure);
  r.timeout_seconds = 0.001;
  try {
    compile_cubin(r);
    FAIL("a 1 ms compile finished");
  } catch (const CompileError& e) {
    CHECK(e.timed_out());
    CHECK_THAT(e.what(), Catch::Contains("NVRTC failed to compile pressure_prog for sm_80: timed out after 0.001 s"));
    CHECK_THAT(e.what(), Catch::Contains("  1 | extern \"C\" __global__"));
  }
}

TEST_CASE("a compile with a timeout runs in a child and gives the same CUBIN and errors", "[nvrtc]") {
  SKIP_WITHOUT_NVRTC();
  CompileRequest r = request("axpy_prog", kAxpy);
  const CompileResult in_process = compile_cubin(r);
  r.timeout_seconds = 120;
  const CompileResult in_child = compile_cubin(r);
  CHECK(in_child.cubin == in_process.cubin);
  CHECK_THAT(in_child.log, Catch::Contains("Function properties for axpy"));  // ptxas's timings differ
  CHECK(usage_of(in_child.usage, "axpy").registers == usage_of(in_process.usage, "axpy").registers);

  CompileRequest broken = request("attnjit_broken_2", kBroken);
  broken.timeout_seconds = 120;
  CHECK_THROWS_WITH(compile_cubin(broken), Catch::Contains("attnjit_broken_2.cu(5): error") &&
                                               Catch::Contains("> 5 |   out[i] = undeclared_scale"));
}

TEST_CASE("compile_many keeps going past a broken request and reports progress", "[nvrtc]") {
  SKIP_WITHOUT_NVRTC();
  const std::vector<CompileRequest> requests{request("many_0", kAxpy), request("many_1", kBroken),
                                             request("many_2", kMma), request("many_3", kAxpy, "sm_90")};
  std::vector<std::pair<size_t, size_t>> calls;
  const auto results = compile_many(requests, 2, [&](size_t done, size_t total) { calls.emplace_back(done, total); });
  REQUIRE(results.size() == 4);
  for (size_t i : {0u, 2u, 3u}) {
    INFO("request " << i);
    REQUIRE(std::holds_alternative<CompileResult>(results[i]));
    CHECK(is_elf(std::get<CompileResult>(results[i]).cubin));
  }
  REQUIRE(std::holds_alternative<std::string>(results[1]));
  CHECK_THAT(std::get<std::string>(results[1]), Catch::Contains("NVRTC failed to compile many_1 for sm_80"));
  REQUIRE(calls.size() == 4);
  for (size_t i = 0; i < calls.size(); ++i) CHECK(calls[i] == std::make_pair(i + 1, size_t{4}));
  CHECK(compile_many({}, 2).empty());
}

TEST_CASE("PTX for the virtual arch targets that arch", "[nvrtc]") {
  SKIP_WITHOUT_NVRTC();
  const std::string ptx = compile_ptx(request("axpy_prog", kAxpy));
  CHECK_THAT(ptx, Catch::Contains(".target sm_80"));
  CHECK_THAT(ptx, Catch::Contains(".entry axpy"));
  CHECK_THROWS_WITH(compile_ptx(request("attnjit_broken_3", kBroken)),
                    Catch::Contains("NVRTC failed to compile attnjit_broken_3 for compute_80"));
}
