// The CPU executor's inner loop in isolation: for each (head, query tile) the two tile products
// per key tile (S = Q K^T, acc += P V) with Eigen, optionally the row softmax's exp, over dense
// attention. It separates GEMM speed from everything around it (docs/performance.md, "The CPU device").
//
//   build/bench/attnjit_cpu_tile_bench [--seq 2048] [--heads 8] [--head-dim 64] [--tile 128x128] [--reps 3]
//
// Prints, per variant (K/V rows strided as in [B, S, H, D] or contiguous as in [B, H, S, D]; the
// GEMMs alone, with Eigen's exp, with the executor's exp), the best time of --reps and GFLOP/s
// (4 * S^2 * D * H / time), on one thread per core. Built with -mavx2 -mfma on x86-64, like the
// executor's AVX2 variant, and as attnjit_cpu_tile_bench_avx512 with its AVX-512 variant's flags.
#include <Eigen/Core>

#include "runtime/cpu/plan_executor_exp.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Rows = Eigen::Map<const Matrix, Eigen::Unaligned, Eigen::OuterStride<>>;

struct Args {
  int seq = 2048, heads = 8, dim = 64, tq = 128, tk = 128, reps = 3;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--seq") a.seq = std::stoi(v);
    else if (k == "--heads") a.heads = std::stoi(v);
    else if (k == "--head-dim") a.dim = std::stoi(v);
    else if (k == "--reps") a.reps = std::stoi(v);
    else if (k == "--tile") std::sscanf(v.c_str(), "%dx%d", &a.tq, &a.tk);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

enum class Exp { None, Eigen, Executor };

double run(const Args& a, bool strided, Exp exp, const std::vector<float>& q, const std::vector<float>& k,
           const std::vector<float>& v) {
  const int S = a.seq, H = a.heads, D = a.dim;
  const int64_t row = strided ? int64_t{H} * D : D;  // floats between consecutive positions of one head
  auto at = [&](const std::vector<float>& x, int h, int pos) {
    return x.data() + (strided ? (int64_t{pos} * H + h) * D : (int64_t{h} * S + pos) * D);
  };
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  auto work = [&](unsigned t) {
    Matrix s(a.tq, a.tk), acc(a.tq, D);
    for (int unit = static_cast<int>(t); unit < H * (S / a.tq); unit += static_cast<int>(threads)) {
      const int h = unit % H, qt = unit / H;
      const Rows qm(at(q, h, qt * a.tq), a.tq, D, Eigen::OuterStride<>(row));
      acc.setZero();
      for (int kt = 0; kt < S / a.tk; ++kt) {
        const Rows km(at(k, h, kt * a.tk), a.tk, D, Eigen::OuterStride<>(row));
        const Rows vm(at(v, h, kt * a.tk), a.tk, D, Eigen::OuterStride<>(row));
        s.noalias() = qm * km.transpose();
        for (int r = 0; exp != Exp::None && r < a.tq; ++r) {
          auto x = s.row(r).array();
          const float m = 0.125f * x.maxCoeff();
          if (exp == Exp::Eigen) x = (x * 0.125f - m).exp();
          else exp_row(x.data(), nullptr, a.tk, 0.125f, m);
        }
        acc.noalias() += s * vm;
      }
    }
  };
  double best = 1e30;
  for (int rep = 0; rep < a.reps; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work, t);
    work(0);
    for (auto& th : pool) th.join();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const size_t n = size_t(a.seq) * size_t(a.heads) * size_t(a.dim);
  std::vector<float> q(n), k(n), v(n);
  for (size_t i = 0; i < n; ++i) q[i] = float(i % 17) * 0.01f, k[i] = float(i % 13) * 0.01f, v[i] = float(i % 7) * 0.1f;
  const double flop = 4.0 * double(a.seq) * a.seq * a.dim * a.heads;
  std::printf("seq %d, heads %d, head dim %d, tile %dx%d, %u threads, best of %d\n", a.seq, a.heads, a.dim, a.tq, a.tk,
              std::max(1u, std::thread::hardware_concurrency()), a.reps);
  for (const bool strided : {true, false})
    for (const Exp exp : {Exp::None, Exp::Eigen, Exp::Executor}) {
      const double t = run(a, strided, exp, q, k, v);
      const char* what = exp == Exp::None ? "GEMMs" : exp == Exp::Eigen ? "+ Eigen exp" : "+ executor exp";
      std::printf("  %-10s %-15s %8.1f ms %7.1f GFLOP/s\n", strided ? "[B,S,H,D]" : "[B,H,S,D]", what, t * 1e3, flop / t / 1e9);
    }
  return 0;
}
