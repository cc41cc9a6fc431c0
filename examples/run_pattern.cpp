// Runs a pattern spec through the attnjit API on random data: on the GPU when there is one,
// checked against the CPU device (the plan executor) on the same inputs; on the CPU otherwise.
//   attnjit_example [SPEC] [--seq N] [--heads H] [--head-dim D] [--cpu]
#include <attnjit/attnjit.hpp>

#include <chrono>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "compiler/support/error.hpp"
#include "runtime/cuda/cuda_driver.hpp"

namespace aj = attnjit;

namespace {

struct Options {
  std::string spec = ATTNJIT_EXAMPLES_DIR "/longnet.json";
  int64_t seq = 4096, heads = 8, head_dim = 64;
  bool force_cpu = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    auto next = [&]() -> int64_t {
      if (a + 1 >= argc) throw aj::UserError(arg, "needs a value");
      return std::stoll(argv[++a]);
    };
    if (arg == "--seq") o.seq = next();
    else if (arg == "--heads") o.heads = next();
    else if (arg == "--head-dim") o.head_dim = next();
    else if (arg == "--cpu") o.force_cpu = true;
    else o.spec = arg;
  }
  return o;
}

// Random bf16 values (as their 16-bit patterns) and the floats they stand for.
std::vector<uint16_t> random_bf16(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<uint16_t> out(n);
  for (uint16_t& x : out) {
    const float f = normal(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    x = static_cast<uint16_t>(bits >> 16);
  }
  return out;
}

float bf16_value(uint16_t x) {
  const uint32_t bits = uint32_t{x} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Runs the problem on `rt`; host vectors in and out, device copies when the runtime is a GPU.
std::vector<uint16_t> run(aj::Runtime& rt, const aj::Pattern& p, const aj::Problem& pb, const std::vector<uint16_t>& q,
                          const std::vector<uint16_t>& k, const std::vector<uint16_t>& v, double* seconds) {
  const std::vector<int64_t> qs{pb.batch, pb.seq_q, pb.heads_q, pb.head_dim}, ks{pb.batch, pb.seq_k, pb.heads_kv, pb.head_dim};
  std::vector<uint16_t> o(q.size());
  aj::Attention op = rt.prepare(p, pb);
  const auto t0 = std::chrono::steady_clock::now();
  if (rt.device().kind == aj::DeviceKind::CPU) {
    op.forward(aj::TensorView::contiguous(const_cast<uint16_t*>(q.data()), pb.dtype, qs),
               aj::TensorView::contiguous(const_cast<uint16_t*>(k.data()), pb.dtype, ks),
               aj::TensorView::contiguous(const_cast<uint16_t*>(v.data()), pb.dtype, ks),
               aj::TensorView::contiguous(o.data(), pb.dtype, qs));
  } else {
    const size_t qb = q.size() * 2, kb = k.size() * 2;
    aj::DeviceBuffer dq(qb), dk(kb), dv(kb), dout(qb);
    aj::copy_to_device(dq.get(), q.data(), qb);
    aj::copy_to_device(dk.get(), k.data(), kb);
    aj::copy_to_device(dv.get(), v.data(), kb);
    auto view = [&](const aj::DeviceBuffer& b, const std::vector<int64_t>& s) {
      return aj::TensorView::contiguous(reinterpret_cast<void*>(b.get()), pb.dtype, s);
    };
    op.forward(view(dq, qs), view(dk, ks), view(dv, ks), view(dout, qs));
    aj::synchronize(nullptr);
    aj::copy_to_host(o.data(), dout.get(), qb);
  }
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("  %s via %s: %.3f s\n", rt.device().describe().c_str(), op.kernel_name().c_str(), *seconds);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    const aj::Pattern p = aj::load_spec_file(o.spec);
    aj::Problem pb{1, o.seq, o.seq, o.heads, o.heads, o.head_dim, o.head_dim, aj::DType::BF16, {}};
    std::printf("%s: seq %lld, %lld heads, head dim %lld, bf16\n", o.spec.c_str(), static_cast<long long>(o.seq),
                static_cast<long long>(o.heads), static_cast<long long>(o.head_dim));
    const size_t n = static_cast<size_t>(o.seq * o.heads * o.head_dim);
    const auto q = random_bf16(n, 1), k = random_bf16(n, 2), v = random_bf16(n, 3);
    aj::Runtime cpu;
    double cpu_s = 0, gpu_s = 0;
    std::string why;
    const bool gpu = !o.force_cpu && aj::CudaDriver::available(&why) && aj::device_count() > 0;
    if (!gpu) std::printf("no GPU (%s): running on the CPU device only\n", o.force_cpu ? "--cpu" : why.c_str());
    const std::vector<uint16_t> want = run(cpu, p, pb, q, k, v, &cpu_s);
    if (!gpu) return 0;
    aj::RuntimeOptions ro;
    ro.device = aj::Device::cuda(0);
    aj::Runtime rt(ro);
    const std::vector<uint16_t> got = run(rt, p, pb, q, k, v, &gpu_s);
    double worst = 0;
    for (size_t x = 0; x < got.size(); ++x) {
      const double g = bf16_value(got[x]), w = bf16_value(want[x]);
      if (std::isnan(g)) throw std::runtime_error("the GPU output has NaN at " + std::to_string(x));
      worst = std::max(worst, std::abs(g - w) / (2e-2 + 2e-2 * std::abs(w)));
    }
    std::printf("GPU vs CPU: worst error %.3f of the bf16 tolerance (2e-2): %s\n", worst, worst <= 1.0 ? "OK" : "MISMATCH");
    return worst <= 1.0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
