// Emulator speed: how long the generated kernel of a pattern takes to run on the CPU emulator
// (Device::emu), with the host compile of the kernel object measured apart (cold, with a fresh
// cache directory, and warm from disk).
// Usage: attnjit_emu_bench [--seq 512] [--heads 4] [--head-dim 64] [--dtype bf16] [--arch sm_80]
//                          [--repeat 5] SPEC...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "attnjit/attnjit.hpp"
#include "runtime/npy.hpp"

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
  int64_t seq = 512, heads = 4, head_dim = 64;
  int repeat = 5, arch = 80;
  DType dtype = DType::BF16;
  std::vector<std::string> specs;
  try {
    for (int a = 1; a < argc; ++a) {
      const std::string arg = argv[a];
      auto value = [&] { return std::string(a + 1 < argc ? argv[++a] : ""); };
      if (arg == "--seq") seq = std::stoll(value());
      else if (arg == "--heads") heads = std::stoll(value());
      else if (arg == "--head-dim") head_dim = std::stoll(value());
      else if (arg == "--dtype") dtype = parse_dtype(value());
      else if (arg == "--arch") arch = std::stoi(value().substr(3));
      else if (arg == "--repeat") repeat = std::stoi(value());
      else specs.push_back(arg);
    }
    const std::string dir = (std::filesystem::temp_directory_path() / "attnjit-emu-bench").string();
    std::filesystem::remove_all(dir);  // every kernel compiles cold once
    std::printf("%-20s %-8s %10s %10s %12s\n", "spec", "dtype", "compile_s", "prepare_s", "forward_s");
    for (const std::string& path : specs) {
      if (path.find("manifest") != std::string::npos) continue;  // a precompile manifest, not a pattern
      const Pattern p = load_spec_file(path);
      const Problem pb{1, seq, seq, heads, heads, head_dim, head_dim, dtype, {}};
      RuntimeOptions ro;
      ro.device = Device::emu(arch);
      ro.cache_dir = dir;
      auto t0 = Clock::now();
      Runtime(ro).prepare(p, pb);  // the host compiler builds the kernel object, which is loaded
      const double cold = since(t0);
      Runtime rt(ro);
      t0 = Clock::now();
      Attention op = rt.prepare(p, pb);  // the module is loaded now: plan and generate only
      const double warm = since(t0);
      const size_t n = size_t(seq * heads * head_dim), eb = size_t(dtype_bytes(dtype));
      std::vector<uint8_t> q(n * eb), k(n * eb), v(n * eb), o(n * eb);
      for (size_t i = 0; i < n; ++i) {  // small deterministic values in any dtype
        const float x = float(int(i * 2654435761u % 17) - 8) / 8;
        if (dtype == DType::F32) std::memcpy(&q[4 * i], &x, 4), std::memcpy(&k[4 * i], &x, 4), std::memcpy(&v[4 * i], &x, 4);
        else {
          const uint16_t h = dtype == DType::F16 ? float_to_half(x) : float_to_bfloat16(x);
          std::memcpy(&q[2 * i], &h, 2), std::memcpy(&k[2 * i], &h, 2), std::memcpy(&v[2 * i], &h, 2);
        }
      }
      auto view = [&](std::vector<uint8_t>& b) { return TensorView::contiguous(b.data(), dtype, {1, seq, heads, head_dim}); };
      std::vector<double> times;
      for (int r = 0; r < repeat; ++r) {
        t0 = Clock::now();
        op.forward(view(q), view(k), view(v), view(o));
        times.push_back(since(t0));
      }
      std::printf("%-20s %-8s %10.2f %10.3f %12.3f\n", std::filesystem::path(path).filename().c_str(), to_string(dtype), cold,
                  warm, median(times));
    }
    std::printf("seq %lld, %lld heads, head dim %lld, sm_%d; compile_s: cold host compile + load + plan; forward_s: median of %d runs\n", (long long)seq,
                (long long)heads, (long long)head_dim, arch, repeat);
    std::filesystem::remove_all(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
