// The generated kernels on a GPU against the float64 CPU reference (DESIGN.md section 4): every
// example pattern at a moderate size, a few hundred random patterns (GQA, offsets, dynamic tables,
// head_groups) at the kernels' head dims and dtypes, through [B, S, H, D], [B, H, S, D] and padded
// strides, with and without lse, on the default and a non-default stream. Outputs are poisoned
// (0xFF = NaN) first, so unwritten rows show; bytes outside the output views must stay poisoned.
// fp16/bf16 inputs are rounded on the host and the reference sees the rounded values.
//
// The device under test is ATTNJIT_GPU_TESTS_DEVICE: gpu (default; CUDA device 0), emu (the same
// generated kernels in the CPU emulator, host memory: the "[emu]" cases at small shapes run in CI)
// or cpu (the plan executor; ATTNJIT_GPU_TESTS_ON_CPU=1 is the same), to dry-run this file.
//
// Knobs: ATTNJIT_GPU_TEST_REPORT=FILE appends one JSON line per case (bench/device_check.sh);
// ATTNJIT_GPU_TESTS_RANDOM=N random cases (240); ATTNJIT_GPU_TESTS_SCALE=x scales the example
// lengths (1).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "attnjit/attnjit.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"
#include "compiler/tune/autotune.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/npy.hpp"
#include "runtime/reference.hpp"
#include "tests/gpu/test_target.hpp"
#include "tests/unit/random_patterns.hpp"

using namespace attnjit;

namespace {

using gputest::Target;
using gputest::target;
using gputest::on_host;
double env_number(const char* name, double fallback) {
  const char* e = std::getenv(name);
  return e && *e ? std::atof(e) : fallback;
}
std::string no_gpu_reason() {
  if (on_host()) return "";
  std::string why;
  if (!CudaDriver::available(&why)) return why;
  return device_count() == 0 ? "the driver reports no GPUs" : "";
}

#define SKIP_WITHOUT_GPU() \
  if (const std::string why_ = no_gpu_reason(); !why_.empty()) { WARN("SKIPPED: no CUDA driver/GPU: " + why_); return; }

// ---- memory of the device under test: device memory, or host memory in CPU mode ------------

class Buf {
public:
  explicit Buf(size_t bytes) : bytes_(bytes) {
    if (on_host()) host_.reset(static_cast<unsigned char*>(std::aligned_alloc(256, (bytes + 255) / 256 * 256)));
    else dev_ = DeviceBuffer(bytes);
  }
  void* data() const { return on_host() ? static_cast<void*>(host_.get()) : reinterpret_cast<void*>(dev_.get()); }
  void upload(const std::vector<unsigned char>& b) {
    if (on_host()) std::memcpy(host_.get(), b.data(), b.size()); else copy_to_device(dev_.get(), b.data(), b.size());
  }
  std::vector<unsigned char> download() const {
    std::vector<unsigned char> b(bytes_);
    if (on_host()) std::memcpy(b.data(), host_.get(), bytes_); else copy_to_host(b.data(), dev_.get(), bytes_);
    return b;
  }
  void poison(CUstream s) {  // 0xFF bytes: NaN in fp32, fp16 and bf16
    if (on_host()) std::memset(host_.get(), 0xFF, bytes_); else memset_d8_async(dev_.get(), 0xFF, bytes_, s);
  }

private:
  struct Free { void operator()(unsigned char* p) const { std::free(p); } };
  size_t bytes_;
  DeviceBuffer dev_;
  std::unique_ptr<unsigned char, Free> host_;
};

// ---- storage types and layouts ------------------------------------------------------------------

uint16_t float_to_bf16(float f) {  // round to nearest even (inputs are finite)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float load(const unsigned char* p, DType dt) {
  uint32_t u = 0;
  std::memcpy(&u, p, size_t(dtype_bytes(dt)));
  if (dt == DType::F16) return half_to_float(uint16_t(u));
  if (dt == DType::BF16) u <<= 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
void store(unsigned char* p, DType dt, float x) {
  if (dt == DType::F32) return void(std::memcpy(p, &x, 4));
  const uint16_t h = dt == DType::F16 ? float_to_half(x) : float_to_bf16(x);
  std::memcpy(p, &h, 2);
}
std::vector<float> dequantised(std::vector<float> v, DType dt) {  // what the kernel reads
  std::vector<unsigned char> b(4);
  for (float& x : v) { store(b.data(), dt, x); x = load(b.data(), dt); }
  return v;
}

enum class Mem { BSHD, BHSD, Padded };  // Padded: [B, S, H, D] with 16 spare bytes after each head row
const char* to_string(Mem m) { return m == Mem::BSHD ? "bshd" : m == Mem::BHSD ? "bhsd" : "padded"; }

std::vector<int64_t> strides_of(const std::vector<int64_t>& sh, Mem m, DType dt) {
  const int64_t S = sh[1], H = sh[2], D = sh[3], Dp = D + (m == Mem::Padded ? 16 / dtype_bytes(dt) : 0);
  if (m == Mem::BHSD) return {H * S * D, D, S * D, 1};
  return {S * H * Dp, H * Dp, Dp, 1};
}
int64_t extent(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  int64_t last = 0;
  for (size_t d = 0; d < shape.size(); ++d) last += (shape[d] - 1) * strides[d];
  return last + 1;
}
// Calls f(index of the element in BSHD order, its offset in elements) for every element of a 4-D view.
template <typename F>
void for_each_element(const std::vector<int64_t>& sh, const std::vector<int64_t>& st, F&& f) {
  size_t n = 0;
  for (int64_t b = 0; b < sh[0]; ++b)
    for (int64_t s = 0; s < sh[1]; ++s)
      for (int64_t h = 0; h < sh[2]; ++h)
        for (int64_t d = 0; d < sh[3]; ++d) f(n++, b * st[0] + s * st[1] + h * st[2] + d * st[3]);
}

constexpr size_t kGuard = 256;  // poisoned bytes after every output; they must stay poisoned

// A tensor on the device under test: `values` (BSHD contiguous) stored in `dt` and layout `m`;
// without values, an output, poisoned. Elements outside the view (padding, guard) are 0xFF.
struct Tensor {
  TensorView view;
  size_t bytes;
  Buf buf;
  Tensor(const std::vector<float>* values, std::vector<int64_t> shape, DType dt, Mem m)
      : view(make_view(shape, dt, m)), bytes(size_t(extent(view.shape, view.strides)) * dtype_bytes(dt) + kGuard), buf(bytes) {
    view.data = buf.data();
    if (!values) return;
    std::vector<unsigned char> host(bytes, 0xFF);
    for_each_element(view.shape, view.strides, [&](size_t n, int64_t at) {
      store(host.data() + at * dtype_bytes(dt), dt, (*values)[n]);
    });
    buf.upload(host);
  }
  static TensorView make_view(std::vector<int64_t> shape, DType dt, Mem m) {
    TensorView v;
    v.dtype = dt;
    v.strides = strides_of(shape, m, dt);
    v.shape = std::move(shape);
    return v;
  }
};

// ---- cases --------------------------------------------------------------------------------------

struct Case {
  std::string name;
  Pattern pattern;
  Shape shape;
  DType dtype = DType::BF16;
  Mem mem = Mem::BSHD;
  bool lse = true, own_stream = false;
  int arch = 80;         // emu: the arch whose kernel runs (75: the SIMT path for fp16 too)
  bool sm90a = false;    // emu: with arch 90, the arch-specific kernels (the Hopper forward)
  bool tma = true;       // the Hopper forward's TMA kernel where tensor maps describe the keys (else cp.async)
  KernelConfig config;   // zeros: the default (or the tuning database's choice on a GPU)
  std::optional<DynamicLayout> dynamic;
  uint64_t seed = 0;
  unsigned ref_threads = 1;
  float input_scale = 1.0f;  // q and k times this: large scores test the softmax's running maximum
};

std::string describe(const Case& c) {
  const Shape& s = c.shape;
  std::ostringstream os;
  os << "case " << c.name << ": " << to_string(c.dtype) << " head_dim=" << s.head_dim << " head_dim_v=" << s.head_dim_v
     << " batch=" << s.batch << " seq_q=" << s.seq_q << " seq_k=" << s.seq_k << " heads_q=" << s.heads_q
     << " heads_kv=" << s.heads_kv << " q_offset=" << s.q_offset << " k_offset=" << s.k_offset << " layout=" << to_string(c.mem)
     << " lse=" << (c.lse ? "yes" : "nullptr") << " stream=" << (c.own_stream ? "non-blocking" : "default")
     << (c.dynamic ? " dynamic_table_heads=" + std::to_string(c.dynamic->heads) : "")
     << (target() == Target::Emu ? " arch=sm_" + std::to_string(c.arch) : "")
     << (c.config == KernelConfig{} ? "" : " config=" + attnjit::describe(c.config))
     << "\npattern:\n" << canonical_text(c.pattern);
  return os.str();
}

struct Prepared {
  std::vector<float> q, k, v;  // dequantised, BSHD contiguous
  ReferenceOutput want;
  Attention op;
  std::string error;
  double prepare_s = 0;
};

Prepared prepare_case(Runtime& rt, const Case& c) {
  Prepared p;
  try {
    const Shape& s = c.shape;
    auto scaled = [&](std::vector<float> x) {
      for (float& e : x) e *= c.input_scale;
      return x;
    };
    p.q = dequantised(scaled(testing::random_tensor(size_t(s.batch * s.seq_q * s.heads_q * s.head_dim), 3 * c.seed)), c.dtype);
    p.k = dequantised(scaled(testing::random_tensor(size_t(s.batch * s.seq_k * s.heads_kv * s.head_dim), 3 * c.seed + 1)), c.dtype);
    p.v = dequantised(testing::random_tensor(size_t(s.batch * s.seq_k * s.heads_kv * s.head_dim_v), 3 * c.seed + 2), c.dtype);
    p.want = reference_attention(c.pattern, s, p.q.data(), p.k.data(), p.v.data(), c.dynamic ? &*c.dynamic : nullptr,
                                 c.ref_threads);
    const auto t0 = std::chrono::steady_clock::now();
    p.op = rt.prepare(c.pattern, Problem{s.batch, s.seq_q, s.seq_k, s.heads_q, s.heads_kv, s.head_dim, s.head_dim_v, c.dtype});
    p.prepare_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } catch (const std::exception& e) {
    p.error = std::string("prepare: ") + e.what();
  }
  return p;
}

struct Outcome {
  bool ok = false;
  std::string error, first_mismatch, kernel;
  int64_t mismatches = 0;
  double err_o = 0, err_lse = 0, forward_ms = 0;  // errors: max |got - want| / (1 + |want|)
  double frobenius = 0;                            // ||got - want|| / ||want|| over O
};

Outcome run_case(const Case& c, Prepared& p, CUstream own) {
  Outcome r;
  if (!p.error.empty()) { r.error = p.error; return r; }
  const Shape& s = c.shape;
  const CUstream stream = c.own_stream ? own : nullptr;
  try {
    r.kernel = p.op.kernel_name();
    Tensor q(&p.q, {s.batch, s.seq_q, s.heads_q, s.head_dim}, c.dtype, c.mem);
    Tensor k(&p.k, {s.batch, s.seq_k, s.heads_kv, s.head_dim}, c.dtype, c.mem);
    Tensor v(&p.v, {s.batch, s.seq_k, s.heads_kv, s.head_dim_v}, c.dtype, c.mem);
    Tensor o(nullptr, {s.batch, s.seq_q, s.heads_q, s.head_dim_v}, c.dtype, c.mem);
    // lse [B, H, S]; padded layouts give it a padded head stride too.
    const int64_t lse_pitch = s.seq_q + (c.mem == Mem::Padded ? 5 : 0);
    const size_t lse_bytes = size_t((s.batch * s.heads_q - 1) * lse_pitch + s.seq_q) * 4 + kGuard;
    Buf lse_buf(lse_bytes);
    TensorView lse{lse_buf.data(), DType::F32, {s.batch, s.heads_q, s.seq_q}, {s.heads_q * lse_pitch, lse_pitch, 1}};
    ForwardOptions fo;
    fo.q_offset = s.q_offset;
    fo.k_offset = s.k_offset;
    fo.dynamic_layout = c.dynamic ? &*c.dynamic : nullptr;
    if (!on_host() && c.own_stream && (c.dynamic || s.q_offset || s.k_offset)) {
      // Such a plan is made and uploaded (cuMemcpyHtoD on the legacy stream) inside the first
      // forward; a kernel on a non-blocking stream is not ordered after that copy. Make the plan
      // on the legacy stream first, so this case tests the stream and not that race.
      p.op.forward(q.view, k.view, v.view, o.view, c.lse ? &lse : nullptr, fo);
    }
    fo.stream = stream;
    if (!on_host()) synchronize(nullptr);  // the uploads above went through the legacy stream
    o.buf.poison(stream);
    lse_buf.poison(stream);
    const auto t0 = std::chrono::steady_clock::now();
    p.op.forward(q.view, k.view, v.view, o.view, c.lse ? &lse : nullptr, fo);
    if (!on_host()) synchronize(stream, "after forward");
    r.forward_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const std::vector<unsigned char> ob = o.buf.download(), lb = lse_buf.download();

    const double tol = c.dtype == DType::F32 ? 1e-5 : 2e-2;
    auto note = [&](const std::string& what, double got, double want) {
      if (r.mismatches++ == 0) {
        std::ostringstream os;
        os.precision(9);
        os << "first mismatch: " << what << " got " << got << " want " << want << " (tolerance " << tol
           << " relative + absolute; -inf must match exactly; NaN never passes)";
        r.first_mismatch = os.str();
      }
    };
    const int eb = dtype_bytes(c.dtype);
    std::vector<char> covered(ob.size(), 0);
    double diff2 = 0, want2 = 0;  // relative Frobenius error of O
    for_each_element(o.view.shape, o.view.strides, [&](size_t n, int64_t at) {
      std::memset(&covered[size_t(at * eb)], 1, size_t(eb));
      const double g = load(&ob[size_t(at * eb)], c.dtype), w = p.want.o[n];
      diff2 += (g - w) * (g - w);
      want2 += w * w;
      const double err = std::abs(g - w) / (1 + std::abs(w));
      r.err_o = std::max(r.err_o, std::isnan(g) ? INFINITY : err);
      if (!(err <= tol)) {
        const int64_t d = int64_t(n) % s.head_dim_v, h = int64_t(n) / s.head_dim_v % s.heads_q;
        const int64_t i = int64_t(n) / (s.head_dim_v * s.heads_q) % s.seq_q, b = int64_t(n) / (s.head_dim_v * s.heads_q * s.seq_q);
        note("o[b=" + std::to_string(b) + ", i=" + std::to_string(i) + ", h=" + std::to_string(h) + ", d=" + std::to_string(d) + "]", g, w);
      }
    });
    r.frobenius = want2 > 0 ? std::sqrt(diff2 / want2) : std::sqrt(diff2);
    if (!(r.frobenius <= tol)) note("o: relative Frobenius error", r.frobenius, tol);
    for (size_t at = 0; at < ob.size(); ++at)
      if (!covered[at] && ob[at] != 0xFF) { note("o: byte " + std::to_string(at) + " outside the view was written", ob[at], 0xFF); break; }
    for (int64_t b = 0; c.lse && b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads_q; ++h)
        for (int64_t i = 0; i < s.seq_q; ++i) {
          float g;
          std::memcpy(&g, &lb[size_t(((b * s.heads_q + h) * lse_pitch + i) * 4)], 4);
          const double w = p.want.lse[size_t((b * s.heads_q + h) * s.seq_q + i)];
          const double err = std::isinf(w) ? (g == w ? 0.0 : INFINITY) : std::abs(g - w) / (1 + std::abs(w));
          r.err_lse = std::max(r.err_lse, std::isnan(g) ? INFINITY : err);
          if (!(err <= tol)) note("lse[b=" + std::to_string(b) + ", h=" + std::to_string(h) + ", i=" + std::to_string(i) + "]", g, w);
        }
    for (size_t at = c.lse ? size_t(extent(lse.shape, lse.strides)) * 4 : 0; at < lb.size(); ++at)  // lse nullptr: all poisoned
      if (lb[at] != 0xFF) { note("lse: byte " + std::to_string(at) + " outside the view was written", lb[at], 0xFF); break; }
    r.ok = r.mismatches == 0;
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  return r;
}

void record(const std::string& suite, const Case& c, const Outcome& r, double prepare_s) {
  const char* path = std::getenv("ATTNJIT_GPU_TEST_REPORT");
  if (!path || !*path) return;
  const Shape& s = c.shape;
  auto finite = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json("inf"); };
  const nlohmann::json j = {
      {"suite", suite}, {"case", c.name}, {"ok", r.ok}, {"pattern_hash", pattern_hash(c.pattern)}, {"dtype", to_string(c.dtype)},
      {"head_dim", s.head_dim}, {"head_dim_v", s.head_dim_v}, {"batch", s.batch}, {"seq_q", s.seq_q}, {"seq_k", s.seq_k},
      {"heads_q", s.heads_q}, {"heads_kv", s.heads_kv}, {"q_offset", s.q_offset}, {"k_offset", s.k_offset},
      {"layout", to_string(c.mem)}, {"lse", c.lse}, {"own_stream", c.own_stream}, {"dynamic", c.dynamic.has_value()},
      {"kernel", r.kernel}, {"max_err_o", finite(r.err_o)}, {"frobenius_o", finite(r.frobenius)}, {"max_err_lse", finite(r.err_lse)}, {"mismatches", r.mismatches},
      {"prepare_s", prepare_s}, {"forward_ms", r.forward_ms}, {"error", r.error}, {"first_mismatch", r.first_mismatch}};
  static std::mutex m;
  std::lock_guard<std::mutex> lock(m);
  std::ofstream(path, std::ios::app) << j.dump() << "\n";
}

RuntimeOptions options_for(Device d) {
  RuntimeOptions o;
  o.device = d;
  return o;
}

Device device_for(const Case& c) {
  switch (target()) {
    case Target::Gpu: return Device::cuda(0);
    case Target::Emu: return Device::emu(c.arch, c.sm90a);
    case Target::Cpu: return Device::cpu();
  }
  return Device::cpu();
}

// One runtime per device and kernel configuration the cases ask for.
class Runtimes {
public:
  Runtime& operator()(const Case& c) {
    const Device d = device_for(c);
    const std::string key = d.describe() + "/" + describe(c.config) + (c.tma ? "" : "/cp.async");
    std::lock_guard<std::mutex> lock(m_);
    std::unique_ptr<Runtime>& rt = map_[key];
    if (!rt) {
      RuntimeOptions o = options_for(d);
      o.config = c.config;
      o.tma = c.tma;
      rt = std::make_unique<Runtime>(o);
    }
    return *rt;
  }

private:
  std::mutex m_;
  std::map<std::string, std::unique_ptr<Runtime>> map_;
};

template <typename F>
void parallel_for(size_t n, F&& f) {
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  const size_t threads = std::min<size_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back([&] { for (size_t i; (i = next++) < n;) f(i); });
  for (auto& t : pool) t.join();
}

// What a suite exercised, printed after it: the emulator suite's requirements (dtypes, head dims,
// GQA, offsets, rows that attend nothing, dynamic tables, ragged lengths, kernel configurations)
// are met by the cases the generators produce, and this line shows that they still are.
struct Coverage {
  std::set<std::string> dtypes, configs;
  std::set<int64_t> head_dims;
  std::set<int> archs;
  size_t gqa = 0, offsets = 0, dynamic = 0, empty_rows = 0, ragged = 0, no_lse = 0;
  void add(const Case& c, const Prepared& p) {
    const Shape& s = c.shape;
    dtypes.insert(to_string(c.dtype));
    head_dims.insert(s.head_dim), head_dims.insert(s.head_dim_v);
    archs.insert(c.arch);
    configs.insert(c.config == KernelConfig{} ? "default" : describe(c.config));
    gqa += s.heads_q != s.heads_kv;
    offsets += s.q_offset != 0 || s.k_offset != 0;
    dynamic += c.dynamic.has_value();
    empty_rows += std::any_of(p.want.lse.begin(), p.want.lse.end(), [](double x) { return std::isinf(x); });
    ragged += s.seq_q % 64 != 0 || s.seq_k % 64 != 0;
    no_lse += !c.lse;
  }
  std::string str() const {
    std::ostringstream os;
    auto list = [&](const auto& set) { for (const auto& x : set) os << (&x == &*set.begin() ? "" : ",") << x; };
    os << "dtypes ";
    list(dtypes);
    os << "; head dims ";
    list(head_dims);
    if (target() == Target::Emu) { os << "; sm_"; list(archs); }
    os << "; cases with GQA " << gqa << ", offsets " << offsets << ", rows that attend nothing " << empty_rows << ", dynamic tables "
       << dynamic << ", lengths no multiple of 64 " << ragged << ", no lse " << no_lse << "; " << configs.size() << " kernel configs";
    return os.str();
  }
};

// Prepares every case in parallel (reference, plan, kernel compile), then runs them one by one.
void check_cases(const std::string& suite, const std::vector<Case>& cases) {
  // Streams and buffers are made on this thread: the GPU's context must be current here.
  if (target() == Target::Gpu) shared_context(0).make_current();
  Runtimes runtimes;
  std::vector<Prepared> prep(cases.size());
  const auto t0 = std::chrono::steady_clock::now();
  parallel_for(cases.size(), [&](size_t n) { prep[n] = prepare_case(runtimes(cases[n]), cases[n]); });
  const double prep_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  struct StreamGuard {
    CUstream s = on_host() ? nullptr : create_stream();
    ~StreamGuard() { if (s) destroy_stream(s); }
  } own;
  size_t passed = 0, cuda_errors = 0;
  std::map<std::string, std::pair<double, double>> worst;  // dtype -> max err (o, lse) over passing cases
  double worst_frobenius = 0;
  Coverage coverage;
  for (size_t n = 0; n < cases.size(); ++n) {
    if (prep[n].error.empty()) coverage.add(cases[n], prep[n]);
    const Outcome r = run_case(cases[n], prep[n], own.s);
    record(suite, cases[n], r, prep[n].prepare_s);
    prep[n] = Prepared{};
    worst_frobenius = std::max(worst_frobenius, r.frobenius);
    if (r.ok) {
      auto& w = worst[to_string(cases[n].dtype)];
      w = {std::max(w.first, r.err_o), std::max(w.second, r.err_lse)};
      ++passed, cuda_errors = 0;
      continue;
    }
    FAIL_CHECK(describe(cases[n]) << (r.error.empty() ? r.first_mismatch + " (" + std::to_string(r.mismatches) + " mismatches)"
                                                      : "error: " + r.error));
    if (r.error.find("CUDA_ERROR_") != std::string::npos && ++cuda_errors >= 3) {
      FAIL("three CUDA errors in a row: the context is broken, stopping " << suite);
    }
  }
  std::printf("%s: %zu/%zu cases passed (prepared in %.1f s on %u threads)\n", suite.c_str(), passed, cases.size(), prep_s,
              std::max(1u, std::thread::hardware_concurrency()));
  for (const auto& [dt, w] : worst) std::printf("  %s: max error o %.3g, lse %.3g (|got-want|/(1+|want|))\n", dt.c_str(), w.first, w.second);
  std::printf("  worst relative Frobenius error of O: %.3g\n  covered: %s\n", worst_frobenius, coverage.str().c_str());
  std::fflush(stdout);
  CHECK(passed == cases.size());
}

// ---- the suites ---------------------------------------------------------------------------------

std::vector<std::pair<std::string, Pattern>> example_patterns() {
  std::vector<std::pair<std::string, Pattern>> out;
  for (const auto& e : std::filesystem::directory_iterator(ATTNJIT_EXAMPLES_DIR)) {
    if (e.path().extension() != ".json") continue;
    std::ifstream in(e.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.find("\"attnjit_manifest\"") != std::string::npos) continue;  // a precompile manifest, not a pattern
    out.emplace_back(e.path().stem().string(), load_spec_file(e.path().string()));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

Shape make_shape(int64_t batch, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d, int64_t q_off = 0, int64_t k_off = 0) {
  Shape s;
  s.batch = batch, s.seq_q = sq, s.seq_k = sk, s.heads_q = hq, s.heads_kv = hkv, s.head_dim = s.head_dim_v = d;
  s.q_offset = q_off, s.k_offset = k_off;
  return s;
}

std::vector<Case> example_cases(double scale, bool small) {
  auto len = [&](int64_t n) { return std::max<int64_t>(65, int64_t(n * scale)); };
  std::vector<Case> cases;
  uint64_t seed = 1000;
  for (const auto& [name, p] : example_patterns()) {
    auto add = [&](const std::string& tag, Shape s, DType dt, Mem m, bool own) {
      Case c;
      c.name = name + "/" + tag;
      c.pattern = p, c.shape = s, c.dtype = dt, c.mem = m, c.own_stream = own, c.seed = seed++, c.ref_threads = 0;
      cases.push_back(std::move(c));
    };
    if (small) {  // for compute-sanitizer: a few tiles per row, two dtypes
      add("small-bf16", make_shape(1, 333, 333, 3, 1, 64), DType::BF16, Mem::BSHD, false);
      add("small-fp32", make_shape(1, 201, 301, 4, 2, 32, 100, 0), DType::F32, Mem::BHSD, true);
      continue;
    }
    add("bf16-d128-gqa", make_shape(1, len(3001), len(3001), 8, 2, 128), DType::BF16, Mem::BSHD, false);
    add("fp16-d64-bhsd", make_shape(2, len(1537), len(1537), 4, 4, 64), DType::F16, Mem::BHSD, true);
    add("fp32-d64-chunk", make_shape(1, len(1111), len(2111), 4, 1, 64, len(1000), 0), DType::F32, Mem::Padded, false);
  }
  return cases;
}

// The generator's small shapes, scaled to the kernels' head dims; half of the cases without a
// dynamic table get longer sequences (still multiples of nothing in particular).
std::vector<Case> random_cases(uint64_t seed, int count, bool scale_lengths) {
  testing::CaseGenerator gen(seed);
  std::mt19937_64 rng(seed ^ 0x5eed);
  auto pick = [&](const std::vector<int64_t>& v) { return v[size_t(rng() % v.size())]; };
  std::vector<Case> cases;
  for (int n = 0; n < count; ++n) {
    testing::RandomCase rc = gen.next();
    Case c;
    c.name = "random" + std::to_string(seed) + "#" + std::to_string(n);
    c.dtype = n % 3 == 0 ? DType::F16 : n % 3 == 1 ? DType::BF16 : DType::F32;
    const std::vector<int64_t> dims = {32, 64, 96, 128, 256};
    Shape s = rc.shape;
    const bool same_dv = s.head_dim_v == s.head_dim;
    s.head_dim = pick(dims);
    s.head_dim_v = same_dv ? s.head_dim : pick(dims);
    if (scale_lengths && n % 2 == 1 && !rc.dynamic) {
      const bool same_len = s.seq_k == s.seq_q;
      const int64_t m = 2 + int64_t(rng() % 8);
      s.seq_q = s.seq_q * m + int64_t(rng() % uint64_t(m));
      s.seq_k = same_len ? s.seq_q : s.seq_k * m + int64_t(rng() % uint64_t(m));
    }
    c.pattern = std::move(rc.pattern);
    c.shape = s;
    c.dynamic = std::move(rc.dynamic);
    c.mem = n % 4 == 1 ? Mem::BHSD : n % 4 == 3 ? Mem::Padded : Mem::BSHD;
    c.lse = n % 7 != 3;
    c.own_stream = n % 5 == 2;
    c.seed = seed * 100000 + uint64_t(n);
    cases.push_back(std::move(c));
  }
  return cases;
}

// Small shapes for the emulator: every example at each dtype, head dims 32..256, GQA, offsets,
// three heads at least (seed_dilated has a group per branch),
// [B, H, S, D] and padded layouts, lengths that are no multiple of any tile, and the SIMT path
// for fp16 through sm_75 and for bf16 through sm_61 (Pascal: fp32 arithmetic on half storage).
// With `sm90a`, the Hopper forward's shapes instead (head dims 64, 128 and 256, fp16 and bf16).
std::vector<Case> emu_example_cases(bool sm90a = false) {
  std::vector<Case> cases;
  uint64_t seed = sm90a ? 9000 : 7000;
  for (const auto& [name, p] : example_patterns()) {
    auto add = [&](const std::string& tag, Shape s, DType dt, Mem m, int arch = 80) {
      Case c;
      c.name = name + (sm90a ? "/sm90a-" : "/") + tag;
      c.pattern = p, c.shape = s, c.dtype = dt, c.mem = m, c.arch = sm90a ? 90 : arch, c.sm90a = sm90a, c.seed = seed++;
      c.lse = seed % 5 != 0;
      cases.push_back(std::move(c));
    };
    add("bf16-d64-gqa", make_shape(1, 200, 200, 4, 2, 64), DType::BF16, Mem::BSHD);
    add("fp16-d128-bhsd", make_shape(2, 150, 150, 3, 3, 128), DType::F16, Mem::BHSD);
    add("bf16-d256", make_shape(1, 97, 97, 3, 1, 256), DType::BF16, Mem::Padded);
    if (sm90a) {
      add("fp16-d128-chunk", make_shape(1, 130, 260, 3, 3, 128, 130, 0), DType::F16, Mem::BSHD);
      continue;
    }
    add("fp16-d96-chunk", make_shape(1, 130, 260, 3, 3, 96, 130, 0), DType::F16, Mem::BSHD);
    add("fp32-d32-chunk", make_shape(1, 111, 211, 4, 1, 32, 100, 0), DType::F32, Mem::Padded);
    add("fp16-d32-sm75", make_shape(1, 120, 120, 3, 1, 32), DType::F16, Mem::BSHD, 75);
    add("bf16-d64-sm61", make_shape(1, 90, 90, 3, 3, 64), DType::BF16, Mem::BSHD, 61);
  }
  return cases;
}

// Every configuration the autotuner can choose (compiler/tune/autotune.cpp's candidate_configs for
// `arch`: tensor-core tiles 64/128 x 32/64/128 with 2 or 3 stages that fit, 128-row tiles with 16
// or 32 rows per warp, SIMT tiles 16/32/64 x 16/32), plus a 4-stage pipeline and a 64-row tile of
// two 32-row warps, on a pattern with causal and dilated branches at lengths that are no multiple
// of any tile (so residue tiles leave some warps without rows). Head dim 256 has its own, smaller set; on the emulator
// fp16 also runs the SIMT candidates of sm_75, and bf16 those of sm_61. With `sm90a` (arch 90):
// the Hopper forward's candidates at head dims 64, 128 and 256.
std::vector<Case> config_cases(int64_t seq, int arch, bool sm90a = false) {
  const Pattern p = PatternBuilder()
                        .branch(BranchSpec().segment(128).dilation(1).causal())
                        .branch(BranchSpec().segment(256).dilation(2).offset(OffsetRule::HeadMod))
                        .build();
  struct Kind { DType dtype; int head_dim, arch; };
  std::vector<Kind> kinds = {{DType::BF16, 64, arch}, {DType::F16, 128, arch}, {DType::F32, 64, arch}, {DType::BF16, 256, arch}};
  if (sm90a) kinds = {{DType::BF16, 64, arch}, {DType::F16, 128, arch}, {DType::BF16, 256, arch}};
  else if (target() == Target::Emu) {
    kinds.push_back({DType::F16, 64, 75});
    kinds.push_back({DType::BF16, 64, 61});
  }
  std::vector<Case> cases;
  for (const Kind& kind : kinds) {
    KernelRequest r;
    r.head_dim = r.head_dim_v = kind.head_dim;
    r.dtype = kind.dtype;
    r.arch = kind.arch;
    r.arch_specific = sm90a && kind.arch == 90;  // the Hopper path's candidates (ATTNJIT_SM90A=1 on an H100)
    std::vector<KernelConfig> configs = candidate_configs(r);
    if (kind.dtype == DType::BF16 && kind.head_dim == 64 && kind.arch >= 80 && !r.arch_specific) {
      configs.push_back({128, 64, 4});    // fits at head dim 64
      configs.push_back({64, 64, 2, 2});  // 32 rows per warp in a 64-row tile
    }
    for (const KernelConfig& k : configs) {
      Case c;
      c.name = std::string("config/") + to_string(kind.dtype) + "-d" + std::to_string(kind.head_dim) + "-sm_" +
               std::to_string(kind.arch) + (r.arch_specific ? "a/" : "/") + describe(k);
      c.pattern = p, c.dtype = kind.dtype, c.config = k, c.arch = kind.arch, c.sm90a = r.arch_specific, c.seed = 31 + cases.size();
      c.shape = make_shape(1, seq, seq, 2, 1, kind.head_dim, 7, 0);
      cases.push_back(std::move(c));
    }
  }
  return cases;
}

}  // namespace

TEST_CASE("every example pattern matches the float64 reference in the emulator", "[emu][attention][examples]") {
  if (target() != Target::Emu) { WARN("SKIPPED: an emulator case (ATTNJIT_GPU_TESTS_DEVICE=emu)"); return; }
  check_cases("emu-examples", emu_example_cases());
}

TEST_CASE("random patterns match the float64 reference in the emulator", "[emu][attention][random]") {
  if (target() != Target::Emu) { WARN("SKIPPED: an emulator case (ATTNJIT_GPU_TESTS_DEVICE=emu)"); return; }
  std::vector<Case> cases = random_cases(2026, int(env_number("ATTNJIT_GPU_TESTS_RANDOM", 200)), true);
  for (size_t n = 0; n < cases.size(); n += 5) {
    if (cases[n].dtype == DType::F16) cases[n].arch = 75;  // the SIMT path for half too
    if (cases[n].dtype == DType::BF16) cases[n].arch = 61;  // and for bf16 on Pascal
  }
  check_cases("emu-random", cases);
}

TEST_CASE("every tile configuration the autotuner can choose matches the reference", "[gpu][emu][attention][configs]") {
  SKIP_WITHOUT_GPU();
  if (target() == Target::Cpu) { WARN("SKIPPED on the CPU device: it has no kernel configurations"); return; }
  // A GPU's candidates are those of its own arch (more shared memory on sm_90); the emulator's, sm_80's.
  const int arch = target() == Target::Gpu ? device_info(0).cc_major * 10 + device_info(0).cc_minor : 80;
  check_cases("configs", config_cases(target() == Target::Emu ? 203 : 1999, arch, target() == Target::Gpu && knobs().sm90a));
}

// Scores in the thousands (q and k times 12: the softmax is nearly one-hot): the running maximum
// must be in the units the exponent uses, or exp2 under- or overflows and rows come out empty or
// NaN. Ordinary inputs cannot tell: softmax does not depend on the shift.
// The Hopper forward (sm_90a, wgmma) in the emulator: every example at head dims 64, 128 and 256
// in fp16 and bf16, a random sweep with those head dims (fp32 cases become bf16), and every
// configuration the autotuner offers that path, through the TMA kernel where tensor maps describe
// the keys; the examples again through the cp.async kernel, and the cases that need it. Other
// head dims fall back to the sm_80 kernel.
TEST_CASE("the sm_90a forward matches the float64 reference in the emulator", "[emu][attention][sm90a]") {
  if (target() != Target::Emu) { WARN("SKIPPED: an emulator case (ATTNJIT_GPU_TESTS_DEVICE=emu)"); return; }
  std::vector<Case> cases = emu_example_cases(true);
  std::mt19937_64 rng(2090);
  for (Case& c : random_cases(2090, int(env_number("ATTNJIT_GPU_TESTS_RANDOM_SM90A", 30)), true)) {
    const int64_t dims[] = {64, 128, 256};
    c.shape.head_dim = dims[rng() % 3];
    c.shape.head_dim_v = rng() % 4 ? c.shape.head_dim : dims[rng() % 3];
    if (c.dtype == DType::F32) c.dtype = DType::BF16;
    c.arch = 90, c.sm90a = true, c.name += "/sm90a";
    cases.push_back(std::move(c));
  }
  for (Case& c : config_cases(203, 90, true)) cases.push_back(std::move(c));
  // The cp.async kernel (where tensor maps cannot describe the keys): every example once more.
  for (Case c : emu_example_cases(true)) {
    c.tma = false, c.name += "/cp.async";
    cases.push_back(std::move(c));
  }
  // Key strides past 8: the residue-form tensor maps where the stride divides the key length, the
  // cp.async kernel where it does not; five strides (more maps than the kernel takes): cp.async.
  const Pattern wide = PatternBuilder()
                           .branch(BranchSpec().segment(256).dilation(1).causal())
                           .branch(BranchSpec().segment(512).dilation(16).offset(OffsetRule::HeadMod))
                           .build();
  PatternBuilder five;
  for (int r : {1, 2, 3, 5, 7}) five.branch(BranchSpec().segment(64 * r).dilation(r));
  uint64_t seed = 9900;
  for (const auto& [name, p, seq] : {std::tuple<const char*, Pattern, int64_t>{"stride16-divides", wide, 512},
                                     {"stride16-no-divide", wide, 520}, {"five-strides", five.build(), 300}})
    for (int64_t d : {64, 128}) {
      Case c;
      c.name = std::string(name) + "/sm90a-d" + std::to_string(d);
      c.pattern = p, c.shape = make_shape(1, seq, seq, 4, 2, d), c.dtype = DType::BF16, c.arch = 90, c.sm90a = true;
      c.seed = seed++;
      cases.push_back(std::move(c));
    }
  check_cases("emu-sm90a", cases);
}

TEST_CASE("large scores: the online softmax keeps every exponent in range", "[gpu][emu][attention][large]") {
  SKIP_WITHOUT_GPU();
  if (target() == Target::Cpu) { WARN("SKIPPED on the CPU device: this is about the kernels' online softmax"); return; }
  std::vector<Case> cases;
  uint64_t seed = 8100;
  for (const auto& [name, p] : example_patterns()) {
    for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
      Case c;
      c.name = name + "/large-" + to_string(dt);
      c.pattern = p, c.dtype = dt, c.seed = seed++, c.input_scale = 12.0f;
      c.shape = make_shape(1, 160, 160, 4, 2, 64);
      cases.push_back(std::move(c));
    }
  }
  check_cases("large", cases);
}

TEST_CASE("a batch past the grid's 65535 rows folds into grid z", "[gpu][emu][attention][batch]") {
  SKIP_WITHOUT_GPU();
  if (target() == Target::Cpu) { WARN("SKIPPED on the CPU device: this is about the kernels' grid"); return; }
  // 65535 + 2 batch entries: two slices of grid z, the second mostly past the batch (a block that
  // did not return there would write out of bounds, which the emulator reports). Both paths share
  // aj_batch_index() and the guard; the tensor-core path runs here (the emulator takes a minute).
  std::vector<Case> cases;
  Case c;
  c.name = "batch-65537-bf16";
  c.pattern = PatternBuilder().branch(BranchSpec().segment(2).dilation(1).causal()).build();
  c.dtype = DType::BF16, c.seed = 8300;
  c.shape = make_shape(65537, 2, 2, 1, 1, 16);
  cases.push_back(std::move(c));
  check_cases("batch", cases);
}

TEST_CASE("every example pattern matches the float64 reference on the GPU", "[gpu][attention][examples]") {
  SKIP_WITHOUT_GPU();
  check_cases("examples", example_cases(env_number("ATTNJIT_GPU_TESTS_SCALE", 1.0), false));
}

TEST_CASE("random patterns match the float64 reference on the GPU", "[gpu][attention][random]") {
  SKIP_WITHOUT_GPU();
  check_cases("random", random_cases(4242, int(env_number("ATTNJIT_GPU_TESTS_RANDOM", 240)), true));
}

// Small enough for compute-sanitizer (memcheck, racecheck): bench/device_check.sh runs "[sanitize]".
TEST_CASE("a small subset for compute-sanitizer", "[gpu][attention][sanitize]") {
  SKIP_WITHOUT_GPU();
  std::vector<Case> cases = example_cases(1.0, true);
  for (Case& c : random_cases(77, 12, false)) cases.push_back(std::move(c));
  check_cases("sanitize", cases);
}

TEST_CASE("layouts, optional lse and streams do not change the answer", "[gpu][attention][layouts]") {
  SKIP_WITHOUT_GPU();
  const Pattern p = PatternBuilder()
                        .branch(BranchSpec().segment(256).dilation(1).causal())
                        .branch(BranchSpec().segment(512).dilation(2).offset(OffsetRule::HeadMod))
                        .build();
  std::vector<Case> cases;
  for (DType dt : {DType::BF16, DType::F32})
    for (Mem m : {Mem::BSHD, Mem::BHSD, Mem::Padded})
      for (int variant = 0; variant < 2; ++variant) {
        Case c;
        c.name = std::string("layouts/") + to_string(dt) + "/" + to_string(m) + (variant ? "/no-lse/own-stream" : "");
        c.pattern = p, c.dtype = dt, c.mem = m, c.seed = 7, c.ref_threads = 0;
        c.shape = make_shape(2, 700, 700, 4, 2, 64);
        c.lse = variant == 0, c.own_stream = variant == 1;
        cases.push_back(std::move(c));
      }
  check_cases("layouts", cases);
}

// A forward() captured in a CUDA graph (after one eager call, as PyTorch's graph capture also
// asks) and replayed: the replays give the eager call's bits, and read the buffers' current
// contents (new inputs, a new answer).
TEST_CASE("a forward() captured in a CUDA graph and replayed gives the eager answer", "[gpu][attention][graph]") {
  SKIP_WITHOUT_GPU();
  if (on_host()) { WARN("SKIPPED on the emulator and the CPU device: CUDA graphs need a GPU"); return; }
  shared_context(0).make_current();
  Runtime rt(options_for(Device::cuda(0)));
  const Pattern p = PatternBuilder()
                        .branch(BranchSpec().segment(256).dilation(1).causal())
                        .branch(BranchSpec().segment(512).dilation(2).offset(OffsetRule::HeadMod))
                        .build();
  for (DType dt : {DType::BF16, DType::F32}) {
    INFO(to_string(dt));
    const std::vector<int64_t> shape{1, 1000, 4, 64};
    Attention op = rt.prepare(p, Problem{1, 1000, 1000, 4, 4, 64, 64, dt});
    const std::vector<float> x1 = testing::random_tensor(1000 * 4 * 64, 11), x2 = testing::random_tensor(1000 * 4 * 64, 12);
    Tensor q(&x1, shape, dt, Mem::BSHD), k(&x1, shape, dt, Mem::BSHD), v(&x1, shape, dt, Mem::BSHD);
    Tensor q2(&x2, shape, dt, Mem::BSHD), o(nullptr, shape, dt, Mem::BSHD);
    Buf lse_buf(4 * 1000 * 4);
    const TensorView lse{lse_buf.data(), DType::F32, {1, 4, 1000}, {4000, 1000, 1}};
    CUstream stream = create_stream();
    ForwardOptions fo;
    fo.stream = stream;
    auto eager = [&](Tensor& query) {
      o.buf.poison(stream);
      op.forward(query.view, k.view, v.view, o.view, &lse, fo);
      synchronize(stream);
      return std::make_pair(o.buf.download(), lse_buf.download());
    };
    const auto want1 = eager(q), want2 = eager(q2);
    // The graph reads q's buffer; q2's contents are copied into it between replays.
    o.buf.poison(stream);
    synchronize(stream);
    {
      CapturedGraph graph(stream, [&] { op.forward(q.view, k.view, v.view, o.view, &lse, fo); });
      for (int replay = 0; replay < 2; ++replay) {
        o.buf.poison(stream);
        graph.launch(stream);
        synchronize(stream);
        CHECK(o.buf.download() == want1.first);
        CHECK(lse_buf.download() == want1.second);
      }
      q.buf.upload(q2.buf.download());
      graph.launch(stream);
      synchronize(stream);
      CHECK(o.buf.download() == want2.first);
      CHECK(lse_buf.download() == want2.second);
    }
    destroy_stream(stream);
  }
}

TEST_CASE("host memory and misaligned device pointers are rejected before launch", "[gpu][attention][errors]") {
  SKIP_WITHOUT_GPU();
  if (on_host()) { WARN("SKIPPED on the emulator and the CPU device: host memory is what they take"); return; }
  shared_context(0).make_current();
  Runtime rt(options_for(Device::cuda(0)));
  const Pattern p = PatternBuilder().branch(BranchSpec().full().causal()).build();
  for (DType dt : {DType::BF16, DType::F32}) {
    INFO(to_string(dt));
    Attention op = rt.prepare(p, Problem{1, 128, 128, 2, 2, 64, 64, dt});
    const std::vector<float> x = testing::random_tensor(128 * 2 * 64, 5);
    Tensor q(&x, {1, 128, 2, 64}, dt, Mem::BSHD), k(&x, {1, 128, 2, 64}, dt, Mem::BSHD), v(&x, {1, 128, 2, 64}, dt, Mem::BSHD);
    Tensor o(nullptr, {1, 128, 2, 64}, dt, Mem::BSHD);
    Buf lse_buf(2 * 128 * 4 + kGuard);
    const TensorView lse{lse_buf.data(), DType::F32, {1, 2, 128}, {256, 128, 1}};
    CHECK_NOTHROW(op.forward(q.view, k.view, v.view, o.view, &lse));
    synchronize(nullptr);

    // Host memory, 256-byte aligned so that only the device check can refuse it.
    std::unique_ptr<void, void (*)(void*)> host(std::aligned_alloc(256, 128 * 2 * 64 * 4 + kGuard), std::free);
    auto on_host = [&](TensorView t) { t.data = host.get(); return t; };
    CHECK_THROWS_WITH(op.forward(on_host(q.view), k.view, v.view, o.view, &lse), Catch::Contains("q: is not device memory"));
    CHECK_THROWS_WITH(op.forward(q.view, on_host(k.view), v.view, o.view, &lse), Catch::Contains("k: is not device memory"));
    CHECK_THROWS_WITH(op.forward(q.view, k.view, v.view, on_host(o.view), &lse), Catch::Contains("o: is not device memory"));
    const TensorView host_lse = on_host(lse);
    CHECK_THROWS_WITH(op.forward(q.view, k.view, v.view, o.view, &host_lse), Catch::Contains("lse: is not device memory"));

    // base + 2 bytes: the tensor-core path needs 16-byte alignment, the SIMT path the element size.
    const std::string align = dt == DType::F32 ? "4-byte aligned" : "16-byte aligned";
    auto shifted = [](TensorView t) { t.data = static_cast<char*>(t.data) + 2; return t; };
    CHECK_THROWS_WITH(op.forward(shifted(q.view), k.view, v.view, o.view, &lse), Catch::Contains("q: data pointer is not " + align));
    CHECK_THROWS_WITH(op.forward(q.view, k.view, shifted(v.view), o.view, &lse), Catch::Contains("v: data pointer is not " + align));
  }
}
