// Code generation and cache timings on this machine (no GPU needed):
//   cold NVRTC compile per kernel, a warm hit from disk (a fresh cache object each time, so the
//   entry is read and verified), and an in-memory hit.
// Usage: attnjit_codegen_bench [--arch sm_80] [--head-dim 128] [--dtype bf16] [--repeat N] SPEC...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "compiler/codegen/codegen.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/pattern/spec_json.hpp"

using namespace attnjit;
using Clock = std::chrono::steady_clock;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

int main(int argc, char** argv) {
  KernelRequest req;
  req.head_dim = req.head_dim_v = 128;  // the head dim the recorded compile times are for
  int repeat = 20;
  std::vector<std::string> specs;
  try {
    for (int a = 1; a < argc; ++a) {
      const std::string arg = argv[a];
      auto value = [&] { return std::string(a + 1 < argc ? argv[++a] : ""); };
      if (arg == "--arch") req.arch = std::stoi(value().substr(3));
      else if (arg == "--head-dim") req.head_dim = req.head_dim_v = std::stoi(value());
      else if (arg == "--dtype") req.dtype = parse_dtype(value());
      else if (arg == "--repeat") repeat = std::stoi(value());
      else specs.push_back(arg);
    }
    const std::string dir = (std::filesystem::temp_directory_path() / "attnjit-codegen-bench").string();
    std::filesystem::remove_all(dir);
    std::printf("%-20s %-26s %10s %12s %12s %14s\n", "spec", "kernel", "cold_s", "disk_hit_ms", "mem_hit_us",
                "cache_mem_us");
    std::vector<double> colds;
    for (const std::string& path : specs) {
      const KernelSource k = generate_kernel(load_spec_file(path), req);
      KernelCache cache(dir, int64_t{1} << 30, true);
      KernelCompiler compiler(cache, Knobs{});
      auto t0 = Clock::now();
      compiler.get(k);  // cold: NVRTC
      const double cold = since(t0);
      colds.push_back(cold);
      std::vector<double> disk, mem, cache_mem;
      const CacheKey key = compiler.key_for(k);
      for (int r = 0; r < repeat; ++r) {
        KernelCache fresh(dir, int64_t{1} << 30, true);
        KernelCompiler c2(fresh, Knobs{});
        t0 = Clock::now();
        c2.get(k);
        disk.push_back(since(t0) * 1e3);
        t0 = Clock::now();
        c2.get(k);
        mem.push_back(since(t0) * 1e6);
        t0 = Clock::now();
        fresh.get(key);  // the cache's own memory layer (copies the image out)
        cache_mem.push_back(since(t0) * 1e6);
      }
      std::printf("%-20s %-26s %10.3f %12.3f %12.2f %14.1f\n", std::filesystem::path(path).filename().c_str(),
                  k.name.c_str(), cold, median(disk), median(mem), median(cache_mem));
    }
    std::printf("median cold compile: %.3f s (%s, head_dim %d, %s)\n", median(colds), ("sm_" + std::to_string(req.arch)).c_str(),
                req.head_dim, to_string(req.dtype));
    std::filesystem::remove_all(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
