// Forward timings on a GPU, per spec and sequence length:
//   - kernel time: CUDA events around forward() after warm-up, the L2 flushed (a 256 MB memset)
//     before every run, median (and min) of N runs; useful TFLOP/s = 4 * head_dim * attended
//     pairs (all heads, compiler/pattern/pattern_stats.hpp) * batch / time;
//   - time to first result for a fresh pattern: a new Runtime, prepare (codegen + NVRTC or cache,
//     plan, table upload) + the first forward + synchronize, with an empty kernel cache (cold:
//     NVRTC and the module load), a cache filled on disk by another process (warm disk: a copy of
//     the cold cache read and verified by a new cache object; the runtime keeps CUBINs loaded per
//     device, so no module load here) and one already in memory (warm memory).
//   - backward (unless --no-backward): Attention::backward timed the same way (dO random, O and
//     LSE from the forward), useful TFLOP/s = 2.5 x the forward's useful FLOP / time;
//   - the SM clock and board power after each timed run (NVML, bench/nvml_clocks.hpp): sm_mhz and
//     power_w beside times_ms in the JSON, or "clocks": "skipped: <why>";
//   - before each timed run the stream spins (a one-thread kernel reading clock64) for 2 ms or 1.5x
//     the call's host time as its warm-ups measured it, whichever is longer, so that the events time
//     the GPU's work and not the GPU waiting for the host to enqueue it; the host's time per call is
//     reported apart (host_ms, the median over the timed runs);
// One line per (spec, seq), then `JSON {...}` with every number. Without a GPU it prints
// "SKIPPED: no GPU: <why>" and exits 0; --dry-run only counts pairs (no GPU needed).
// Usage: attnjit_gpu_bench [--seq 4096,16384] [--heads 16] [--heads-kv H] [--head-dim 128]
//          [--dtype bf16] [--batch 1] [--runs 20] [--warmup 3] [--flush-mb 256] [--device 0]
//          [--no-ttfr] [--no-backward] [--dry-run] SPEC...
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include <vector>

#include "attnjit/attnjit.hpp"
#include "bench/nvml_clocks.hpp"
#include "compiler/pattern/pattern_stats.hpp"
#include "compiler/support/error.hpp"
#include "compiler/nvrtc/nvrtc_compiler.hpp"
#include "runtime/cuda/cuda_driver.hpp"
#include "runtime/npy.hpp"

using namespace attnjit;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

namespace {

struct Options {
  std::vector<int64_t> seqs{4096, 16384};
  int64_t heads = 16, heads_kv = 0, head_dim = 128, batch = 1;
  DType dtype = DType::BF16;
  int runs = 20, warmup = 3, device = 0;
  size_t flush_bytes = size_t{256} << 20;
  bool ttfr = true, backward = true, dry_run = false;
  std::vector<std::string> specs;
};

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = s.find(',', at);
    const std::string item = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (!item.empty()) out.push_back(std::stoll(item));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (out.empty()) throw UserError("--seq", "give at least one length, e.g. --seq 4096,16384");
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    auto value = [&]() -> std::string {
      if (a + 1 >= argc) throw UserError(arg, "needs a value");
      return argv[++a];
    };
    if (arg == "--seq") o.seqs = parse_list(value());
    else if (arg == "--heads") o.heads = std::stoll(value());
    else if (arg == "--heads-kv") o.heads_kv = std::stoll(value());
    else if (arg == "--head-dim") o.head_dim = std::stoll(value());
    else if (arg == "--dtype") o.dtype = parse_dtype(value());
    else if (arg == "--batch") o.batch = std::stoll(value());
    else if (arg == "--runs") o.runs = std::max(1, std::stoi(value()));
    else if (arg == "--warmup") o.warmup = std::max(0, std::stoi(value()));
    else if (arg == "--flush-mb") o.flush_bytes = size_t(std::stoll(value())) << 20;
    else if (arg == "--device") o.device = std::stoi(value());
    else if (arg == "--no-ttfr") o.ttfr = false;
    else if (arg == "--no-backward") o.backward = false;
    else if (arg == "--dry-run") o.dry_run = true;
    else if (arg == "-h" || arg == "--help") {
      std::printf("usage: attnjit_gpu_bench [--seq 4096,16384] [--heads 16] [--heads-kv H] [--head-dim 128] [--dtype bf16]\n"
                  "         [--batch 1] [--runs 20] [--warmup 3] [--flush-mb 256] [--device 0] [--no-ttfr] [--no-backward]\n"
                  "         [--dry-run] SPEC...\n");
      std::exit(0);
    } else if (arg.rfind("--", 0) == 0) throw UserError(arg, "unknown option (see --help)");
    else o.specs.push_back(arg);
  }
  if (!o.heads_kv) o.heads_kv = o.heads;
  if (o.specs.empty()) throw UserError("SPEC", "give at least one pattern spec (examples/*.json)");
  return o;
}

// Random inputs in [-1, 1) in the storage type, made on the host once and uploaded.
DeviceBuffer random_device_tensor(size_t elements, DType dt, uint64_t seed) {
  const int eb = dtype_bytes(dt);
  std::vector<unsigned char> host(elements * size_t(eb));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t n = 0; n < elements; ++n) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const float f = float(double(x >> 11) * 0x1.0p-53 * 2.0 - 1.0);
    if (dt == DType::F32) {
      std::memcpy(&host[n * 4], &f, 4);
    } else {
      uint16_t h;
      if (dt == DType::F16) {
        h = float_to_half(f);
      } else {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        h = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      }
      std::memcpy(&host[n * 2], &h, 2);
    }
  }
  DeviceBuffer b(host.size());
  copy_to_device(b.get(), host.data(), host.size());
  return b;
}

// q, k, v, o, lse of one problem on the device; dO and the gradients once `with_backward` is called.
struct Tensors {
  DeviceBuffer q, k, v, o, lse, dout, dq, dk, dv;
  TensorView qv, kv, vv, ov, lv, dov, dqv, dkv, dvv;
  Tensors(const Problem& pb, uint64_t seed) {
    const size_t nq = size_t(pb.batch * pb.seq_q * pb.heads_q * pb.head_dim);
    const size_t nk = size_t(pb.batch * pb.seq_k * pb.heads_kv * pb.head_dim);
    const size_t nv = size_t(pb.batch * pb.seq_k * pb.heads_kv * pb.head_dim_v);
    const size_t no = size_t(pb.batch * pb.seq_q * pb.heads_q * pb.head_dim_v);
    q = random_device_tensor(nq, pb.dtype, seed);
    k = random_device_tensor(nk, pb.dtype, seed + 1);
    v = random_device_tensor(nv, pb.dtype, seed + 2);
    o = DeviceBuffer(no * size_t(dtype_bytes(pb.dtype)));
    lse = DeviceBuffer(size_t(pb.batch * pb.heads_q * pb.seq_q) * 4);
    auto ptr = [](const DeviceBuffer& b) { return reinterpret_cast<void*>(b.get()); };
    qv = TensorView::contiguous(ptr(q), pb.dtype, {pb.batch, pb.seq_q, pb.heads_q, pb.head_dim});
    kv = TensorView::contiguous(ptr(k), pb.dtype, {pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim});
    vv = TensorView::contiguous(ptr(v), pb.dtype, {pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim_v});
    ov = TensorView::contiguous(ptr(o), pb.dtype, {pb.batch, pb.seq_q, pb.heads_q, pb.head_dim_v});
    lv = TensorView::contiguous(ptr(lse), DType::F32, {pb.batch, pb.heads_q, pb.seq_q});
  }
  void with_backward(const Problem& pb, uint64_t seed) {
    const size_t eb = size_t(dtype_bytes(pb.dtype));
    dout = random_device_tensor(size_t(pb.batch * pb.seq_q * pb.heads_q * pb.head_dim_v), pb.dtype, seed);
    dq = DeviceBuffer(size_t(pb.batch * pb.seq_q * pb.heads_q * pb.head_dim) * eb);
    dk = DeviceBuffer(size_t(pb.batch * pb.seq_k * pb.heads_kv * pb.head_dim) * eb);
    dv = DeviceBuffer(size_t(pb.batch * pb.seq_k * pb.heads_kv * pb.head_dim_v) * eb);
    auto ptr = [](const DeviceBuffer& b) { return reinterpret_cast<void*>(b.get()); };
    dov = TensorView::contiguous(ptr(dout), pb.dtype, {pb.batch, pb.seq_q, pb.heads_q, pb.head_dim_v});
    dqv = TensorView::contiguous(ptr(dq), pb.dtype, {pb.batch, pb.seq_q, pb.heads_q, pb.head_dim});
    dkv = TensorView::contiguous(ptr(dk), pb.dtype, {pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim});
    dvv = TensorView::contiguous(ptr(dv), pb.dtype, {pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim_v});
  }
  void forward(Attention& op, CUstream s) {
    ForwardOptions fo;
    fo.stream = s;
    op.forward(qv, kv, vv, ov, &lv, fo);
  }
  void backward(Attention& op, CUstream s) {
    ForwardOptions fo;
    fo.stream = s;
    op.backward(qv, kv, vv, ov, lv, dov, dqv, dkv, dvv, fo);
  }
};

// The runs of one timed body (time_runs) and their median and minimum, in ms.
struct Timing {
  std::vector<double> times;
  std::vector<double> sm_mhz, power_w;  // after each run, where NVML reads them
  std::vector<double> host_ms;          // each run's enqueueing on the host
  double median = NAN, best = NAN;
  double spin_ms = 0;                   // the spin before each run
};

// A kernel that keeps the stream busy for a number of GPU clock cycles (one thread).
class Spinner {
public:
  explicit Spinner(const DeviceInfo& d)
      : module_(compile_cubin(CompileRequest{"attnjit_bench_spin", kSource,
                                             "sm_" + std::to_string(d.cc_major) + std::to_string(d.cc_minor), {}, 0})
                    .cubin,
                "attnjit_bench_spin"),
        function_(module_.function("attnjit_bench_spin")) {}
  void spin(double ms, CUstream stream) const {
    long long cycles = static_cast<long long>(ms * 2e6);  // about 2 GHz: at a lower clock it spins longer
    void* args[] = {&cycles};
    launch(function_, 1, 1, 1, 32, 0, stream, args, "attnjit_bench_spin");
  }

private:
  static constexpr const char* kSource =
      "extern \"C\" __global__ void attnjit_bench_spin(long long cycles) {\n"
      "  const long long t0 = clock64();\n"
      "  while (clock64() - t0 < cycles) {}\n"
      "}\n";
  Module module_;
  CUfunction function_;
};

RuntimeOptions on_device(int device, const std::string& cache_dir) {
  RuntimeOptions o;
  o.device = Device::cuda(device);
  o.cache_dir = cache_dir;
  return o;
}

// Time to first result with a new Runtime on `cache_dir`: {prepare ms, total ms}, and the kernel.
std::pair<double, double> first_result(const Options& opt, const std::string& cache_dir, const Pattern& p,
                                       const Problem& pb, Tensors& t, CUstream s, Attention* keep = nullptr) {
  const auto t0 = Clock::now();
  Runtime rt(on_device(opt.device, cache_dir));
  Attention op = rt.prepare(p, pb);
  const double prep = ms_since(t0);
  t.forward(op, s);
  synchronize(s, "first forward");
  const double total = ms_since(t0);
  if (keep) *keep = op;
  return {prep, total};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

json num(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }

// A timing's clocks for the JSON: the SM clock and power after each run, or why they are missing.
void put_clocks(json& r, const Timing& t, const attnjit_bench::NvmlClocks& clocks) {
  if (t.sm_mhz.size() == t.times.size() && !t.times.empty())
    r["sm_mhz"] = t.sm_mhz, r["power_w"] = t.power_w;
  else
    r["clocks"] = "skipped: " + (clocks.ok() ? std::string("NVML did not answer for every run") : clocks.why());
}

// `opt.warmup` untimed runs of `body` (each one's host time measured, the stream idle before it),
// then `opt.runs` timed by CUDA events, the L2 flushed and the stream kept busy (`spinner`) before each.
template <class Body>
Timing time_runs(const Options& opt, const DeviceBuffer& flush, EventTimer& timer, CUstream stream,
                 const attnjit_bench::NvmlClocks& clocks, const Spinner& spinner, Body body) {
  std::vector<double> warm;
  for (int w = 0; w < opt.warmup; ++w) {
    synchronize(stream, "bench warm-up");
    const auto t0 = Clock::now();
    body();
    warm.push_back(ms_since(t0));
  }
  Timing t;
  t.spin_ms = std::max(2.0, 1.5 * (warm.empty() ? 0.0 : median(warm)));
  for (int n = 0; n < opt.runs; ++n) {
    memset_d8_async(flush.get(), static_cast<unsigned char>(n), flush.size(), stream, "L2 flush");
    spinner.spin(t.spin_ms, stream);
    timer.record_start(stream);
    const auto t0 = Clock::now();
    body();
    t.host_ms.push_back(ms_since(t0));
    timer.record_stop(stream);
    t.times.push_back(timer.elapsed_ms());
    double mhz = 0, watts = 0;
    if (clocks.read(mhz, watts)) t.sm_mhz.push_back(mhz), t.power_w.push_back(watts);
  }
  t.median = median(t.times);
  t.best = *std::min_element(t.times.begin(), t.times.end());
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  try {
    opt = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attnjit_gpu_bench: %s\n", e.what());
    return 2;
  }
  json out = {{"bench", "attnjit_gpu_bench"}, {"dry_run", opt.dry_run}, {"results", json::array()}};
  out["options"] = {{"seq", opt.seqs}, {"heads", opt.heads}, {"heads_kv", opt.heads_kv}, {"head_dim", opt.head_dim},
                    {"dtype", to_string(opt.dtype)}, {"batch", opt.batch}, {"runs", opt.runs}, {"warmup", opt.warmup},
                    {"flush_bytes", opt.flush_bytes}};
  std::string why;
  if (!opt.dry_run && (!CudaDriver::available(&why) || device_count() <= opt.device)) {
    if (why.empty()) why = "the driver reports " + std::to_string(device_count()) + " GPU(s), no device " + std::to_string(opt.device);
    std::printf("SKIPPED: no GPU: %s\n", why.c_str());
    return 0;
  }
  int failures = 0;
  const std::string tmp = (std::filesystem::temp_directory_path() / ("attnjit-gpu-bench-" + std::to_string(getpid()))).string();
  try {
    CUstream stream = nullptr;
    DeviceBuffer flush;
    std::unique_ptr<EventTimer> timer;
    std::unique_ptr<attnjit_bench::NvmlClocks> clocks;
    std::unique_ptr<Spinner> spinner;
    if (!opt.dry_run) {
      shared_context(opt.device).make_current();
      const DeviceInfo d = device_info(opt.device);
      out["device"] = {{"name", d.name}, {"arch", "sm_" + std::to_string(d.cc_major) + std::to_string(d.cc_minor)},
                       {"sm_count", d.sm_count}, {"memory_bytes", d.total_memory}, {"driver_version", driver_version()},
                       {"uuid", d.uuid_or_empty}};
      std::printf("device: %s (sm_%d%d, %d SMs), driver %d\n", d.name.c_str(), d.cc_major, d.cc_minor, d.sm_count,
                  driver_version());
      stream = create_stream();
      flush = DeviceBuffer(opt.flush_bytes, "L2 flush buffer");
      timer = std::make_unique<EventTimer>();
      clocks = std::make_unique<attnjit_bench::NvmlClocks>(d.uuid_or_empty);
      spinner = std::make_unique<Spinner>(d);
      if (!clocks->ok()) std::printf("clocks: skipped: %s\n", clocks->why().c_str());
      // First use of NVRTC and the driver's module loader, so that no spec's cold time pays for it.
      const auto t0 = Clock::now();
      const Pattern warm = PatternBuilder().branch(BranchSpec().full().causal()).build();
      const Problem wpb{1, 64, 64, 1, 1, 64, 64, opt.dtype == DType::F32 ? DType::F16 : DType::F32, {}};
      Tensors wt(wpb, 1);
      first_result(opt, tmp + "/warmup", warm, wpb, wt, stream);
      out["warmup_ms"] = ms_since(t0);
    }
    std::printf("%-16s %6s %5s %-5s %4s %14s %8s %10s %10s %8s %11s %11s %11s %10s %8s  %s\n", "spec", "seq", "heads", "dtype",
                "d", "pairs", "density", "median_ms", "min_ms", "TFLOP/s", "ttfr_cold", "ttfr_disk", "ttfr_mem", "bwd_ms",
                "bwd_TF/s", "kernel");
    int index = 0;
    for (const std::string& path : opt.specs) {
      const std::string name = std::filesystem::path(path).stem().string();
      for (int64_t seq : opt.seqs) {
        json r = {{"spec", path}, {"name", name}, {"seq", seq}};
        try {
          const Pattern p = load_spec_file(path);
          if (p.has_dynamic_layout()) throw UserError(path, "has a dynamic layout; the bench has no table to give it");
          Shape s;
          s.batch = opt.batch, s.seq_q = s.seq_k = seq, s.heads_q = opt.heads, s.heads_kv = opt.heads_kv;
          s.head_dim = s.head_dim_v = opt.head_dim;
          const auto ts = Clock::now();
          const PatternStats st = pattern_stats(MaskContext{p, s, nullptr});
          r["stats_ms"] = ms_since(ts);
          r["attended_pairs"] = st.attended_pairs;  // all heads, batch 1
          r["density"] = st.density;
          r["empty_rows"] = st.empty_rows;
          const double flop = 4.0 * double(opt.head_dim) * double(st.attended_pairs) * double(opt.batch);
          r["useful_flop"] = flop;
          std::string kernel = "-";
          double med = NAN, best = NAN, tflops = NAN, cold = NAN, disk = NAN, mem = NAN, bwd_med = NAN, bwd_tflops = NAN;
          if (!opt.dry_run) {
            const Problem pb{opt.batch, seq, seq, opt.heads, opt.heads_kv, opt.head_dim, opt.head_dim, opt.dtype, {}};
            Tensors t(pb, 17 + uint64_t(index));
            Attention op;
            const std::string cold_dir = tmp + "/cold-" + std::to_string(index), disk_dir = tmp + "/disk-" + std::to_string(index);
            if (opt.ttfr) {
              const auto [cp, ct] = first_result(opt, cold_dir, p, pb, t, stream);
              std::filesystem::copy(cold_dir, disk_dir, std::filesystem::copy_options::recursive);
              const auto [dp, dt] = first_result(opt, disk_dir, p, pb, t, stream);
              const auto [mp, mt] = first_result(opt, cold_dir, p, pb, t, stream, &op);
              cold = ct, disk = dt, mem = mt;
              r["ttfr"] = {{"cold_ms", ct}, {"cold_prepare_ms", cp}, {"warm_disk_ms", dt}, {"warm_disk_prepare_ms", dp},
                           {"warm_memory_ms", mt}, {"warm_memory_prepare_ms", mp}};
            } else {
              first_result(opt, "", p, pb, t, stream, &op);
            }
            kernel = op.kernel_name();
            const Timing fwd = time_runs(opt, flush, *timer, stream, *clocks, *spinner, [&] { t.forward(op, stream); });
            med = fwd.median, best = fwd.best;
            tflops = flop / (med * 1e-3) / 1e12;
            r["times_ms"] = fwd.times;
            r["host_ms"] = median(fwd.host_ms);
            r["spin_ms"] = fwd.spin_ms;
            put_clocks(r, fwd, *clocks);
            if (opt.backward) {
              t.with_backward(pb, 99 + uint64_t(index));
              const Timing bwd = time_runs(opt, flush, *timer, stream, *clocks, *spinner, [&] { t.backward(op, stream); });
              bwd_med = bwd.median;
              bwd_tflops = 2.5 * flop / (bwd.median * 1e-3) / 1e12;
              r["backward"] = {{"times_ms", bwd.times}, {"median_ms", bwd.median}, {"min_ms", bwd.best},
                               {"useful_flop", 2.5 * flop}, {"tflops", num(bwd_tflops)},
                               {"host_ms", median(bwd.host_ms)}, {"spin_ms", bwd.spin_ms}};
              put_clocks(r["backward"], bwd, *clocks);
            }
            r["median_ms"] = med;
            r["min_ms"] = best;
            r["tflops"] = num(tflops);
            r["tflops_best"] = num(flop / (best * 1e-3) / 1e12);
            r["kernel"] = kernel;
          }
          std::printf("%-16s %6lld %5lld %-5s %4lld %14lld %8.4f %10.3f %10.3f %8.1f %11.1f %11.1f %11.1f %10.3f %8.1f  %s\n",
                      name.c_str(), (long long)seq, (long long)opt.heads, to_string(opt.dtype), (long long)opt.head_dim,
                      (long long)st.attended_pairs, st.density, med, best, tflops, cold, disk, mem, bwd_med, bwd_tflops,
                      kernel.c_str());
          r["ok"] = true;
        } catch (const std::exception& e) {
          ++failures;
          r["ok"] = false;
          r["error"] = e.what();
          std::printf("%-16s %6lld ERROR: %s\n", name.c_str(), (long long)seq, e.what());
        }
        std::fflush(stdout);
        out["results"].push_back(r);
        ++index;
      }
    }
    if (stream) destroy_stream(stream);
  } catch (const std::exception& e) {
    ++failures;
    out["error"] = e.what();
    std::printf("ERROR: %s\n", e.what());
  }
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  out["failures"] = failures;
  std::printf("JSON %s\n", out.dump().c_str());
  return failures ? 1 : 0;
}
