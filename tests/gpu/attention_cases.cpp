// The GPU forward suite's harness: see attention_cases.hpp.
#include "tests/gpu/attention_cases.hpp"

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
#include "runtime/cuda/cuda_driver.hpp"
#include "runtime/npy.hpp"
#include "attnjit/reference.hpp"
#include "tests/gpu/test_target.hpp"
#include "tests/unit/random_patterns.hpp"
#include "tests/unit/test_support.hpp"

namespace attnjit::gputest {

double env_number(const char* name, double fallback) {
  const char* e = std::getenv(name);
  return e && *e ? std::atof(e) : fallback;
}
int sweep_count(const char* name, int ci, int full) {
  return int(env_number(name, !on_host() || testing::full_sweep() ? full : ci));
}
std::string no_gpu_reason() {
  if (on_host()) return "";
  std::string why;
  if (!CudaDriver::available(&why)) return why;
  return device_count() == 0 ? "the driver reports no GPUs" : "";
}

namespace {

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


}  // namespace

const char* to_string(Mem m) { return m == Mem::BSHD ? "bshd" : m == Mem::BHSD ? "bhsd" : "padded"; }

namespace {

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

}  // namespace

Tensor::Tensor(const std::vector<float>* values, std::vector<int64_t> shape, DType dt, Mem m)
    : view(make_view(shape, dt, m)), bytes(size_t(extent(view.shape, view.strides)) * dtype_bytes(dt) + kGuard), buf(bytes) {
  view.data = buf.data();
  if (!values) return;
  std::vector<unsigned char> host(bytes, 0xFF);
  for_each_element(view.shape, view.strides, [&](size_t n, int64_t at) {
    store(host.data() + at * dtype_bytes(dt), dt, (*values)[n]);
  });
  buf.upload(host);
}

TensorView Tensor::make_view(std::vector<int64_t> shape, DType dt, Mem m) {
  TensorView v;
  v.dtype = dt;
  v.strides = strides_of(shape, m, dt);
  v.shape = std::move(shape);
  return v;
}

namespace {

std::string describe(const Case& c) {
  const Shape& s = c.shape;
  std::ostringstream os;
  os << "case " << c.name << ": " << to_string(c.dtype) << " head_dim=" << s.head_dim << " head_dim_v=" << s.head_dim_v
     << " batch=" << s.batch << " seq_q=" << s.seq_q << " seq_k=" << s.seq_k << " heads_q=" << s.heads_q
     << " heads_kv=" << s.heads_kv << " q_offset=" << s.q_offset << " k_offset=" << s.k_offset << " layout=" << to_string(c.mem)
     << " lse=" << (c.lse ? "yes" : "nullptr") << " stream=" << (c.own_stream ? "non-blocking" : "default")
     << (c.dynamic ? " dynamic_table_heads=" + std::to_string(c.dynamic->heads) : "") << (c.device_table ? " device_table" : "")
     << (c.random_in_kernel ? " random_in_kernel" : "") << (target() == Target::Emu ? " arch=sm_" + std::to_string(c.arch) : "")
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
    for (const auto& [at, value] : c.v_values) p.v.at(at) = value;  // NaN and inf are exact in every dtype
    if (c.key_ramp != 0.0f) {
      for (size_t x = 0; x < p.q.size(); x += size_t(s.head_dim)) p.q[x] = dequantised({std::abs(p.q[x]) + 1.0f}, c.dtype)[0];
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t j = 0; j < s.seq_k; ++j)
          for (int64_t h = 0; h < s.heads_kv; ++h) {
            float& e = p.k[size_t(((b * s.seq_k + j) * s.heads_kv + h) * s.head_dim)];
            e = dequantised({e + c.key_ramp * float(j)}, c.dtype)[0];
          }
    }
    p.want = reference_attention(c.pattern, s, p.q.data(), p.k.data(), p.v.data(), c.dynamic ? &*c.dynamic : nullptr,
                                 c.ref_threads);
    const auto t0 = std::chrono::steady_clock::now();
    p.op = rt.prepare(c.pattern, Problem{s.batch, s.seq_q, s.seq_k, s.heads_q, s.heads_kv, s.head_dim, s.head_dim_v, c.dtype, {}});
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
    fo.rows_with_work_only = c.rows_with_work_only;
    // A table on the device: read in place by the kernels, its problems counted (none here).
    std::optional<DeviceTable> device_table;
    if (c.device_table && c.dynamic) {
      device_table.emplace(c.raw_table ? *c.raw_table : *c.dynamic);
      fo.dynamic_layout = nullptr;
      fo.device_dynamic_layout = &device_table->layout;
    }
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

    const double tol = c.answer_unspecified ? INFINITY : c.dtype == DType::F32 ? 1e-5 : 2e-2;
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
    auto poisoned = [](const unsigned char* x, int bytes) { return std::all_of(x, x + bytes, [](unsigned char b) { return b == 0xFF; }); };
    // rows_with_work_only: is row i of head h in batch b one that attends nothing?
    auto idle_row = [&](int64_t b, int64_t h, int64_t i) {
      return c.rows_with_work_only && p.want.lse[size_t((b * s.heads_q + h) * s.seq_q + i)] == -INFINITY;
    };
    int64_t kept = 0;  // O elements of idle rows that kept their poison
    for_each_element(o.view.shape, o.view.strides, [&](size_t n, int64_t at) {
      std::memset(&covered[size_t(at * eb)], 1, size_t(eb));
      const int64_t row = int64_t(n) / s.head_dim_v;  // (b, i, h) flattened, [B, S, H]
      if (idle_row(row / (s.heads_q * s.seq_q), row % s.heads_q, row / s.heads_q % s.seq_q) &&
          poisoned(&ob[size_t(at * eb)], eb)) {
        ++kept;
        return;
      }
      const double g = load(&ob[size_t(at * eb)], c.dtype), w = p.want.o[n];
      // A reference NaN or inf (a non-finite V the row attends) must be matched exactly; it stays
      // out of the Frobenius sums. A NaN the reference lacks never passes.
      const bool exact = !std::isfinite(w);
      const bool same = std::isnan(w) ? std::isnan(g) : g == w;
      if (!exact) {
        diff2 += (g - w) * (g - w);
        want2 += w * w;
      }
      const double err = exact ? (same ? 0.0 : INFINITY) : std::abs(g - w) / (1 + std::abs(w));
      r.err_o = std::max(r.err_o, std::isnan(g) && !exact ? INFINITY : err);
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
          const unsigned char* raw = &lb[size_t(((b * s.heads_q + h) * lse_pitch + i) * 4)];
          if (idle_row(b, h, i) && poisoned(raw, 4)) continue;
          std::memcpy(&g, raw, 4);
          const double w = p.want.lse[size_t((b * s.heads_q + h) * s.seq_q + i)];
          const double err = std::isinf(w) ? (g == w ? 0.0 : INFINITY) : std::abs(g - w) / (1 + std::abs(w));
          r.err_lse = std::max(r.err_lse, std::isnan(g) ? INFINITY : err);
          if (!(err <= tol)) note("lse[b=" + std::to_string(b) + ", h=" + std::to_string(h) + ", i=" + std::to_string(i) + "]", g, w);
        }
    for (size_t at = c.lse ? size_t(extent(lse.shape, lse.strides)) * 4 : 0; at < lb.size(); ++at)  // lse nullptr: all poisoned
      if (lb[at] != 0xFF) { note("lse: byte " + std::to_string(at) + " outside the view was written", lb[at], 0xFF); break; }
    if (c.rows_with_work_only && kept == 0) note("rows_with_work_only: O elements of rows without work left unwritten", 0, 1);
    if (device_table) {
      const int32_t problems = device_table->problems();
      if (problems != c.table_problems) note("device table: problems counted", problems, c.table_problems);
    }
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
      {"layout", to_string(c.mem)}, {"lse", c.lse}, {"own_stream", c.own_stream}, {"dynamic", c.dynamic.has_value()}, {"device_table", c.device_table}, {"random_in_kernel", c.random_in_kernel},
      {"kernel", r.kernel}, {"max_err_o", finite(r.err_o)}, {"frobenius_o", finite(r.frobenius)}, {"max_err_lse", finite(r.err_lse)}, {"mismatches", r.mismatches},
      {"prepare_s", prepare_s}, {"forward_ms", r.forward_ms}, {"error", r.error}, {"first_mismatch", r.first_mismatch}};
  static std::mutex m;
  std::lock_guard<std::mutex> lock(m);
  std::ofstream(path, std::ios::app) << j.dump() << "\n";
}


}  // namespace

RuntimeOptions options_for(Device d) {
  RuntimeOptions o;
  o.device = d;
  return o;
}

namespace {

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
    const std::string key =
        d.describe() + "/" + describe(c.config) + (c.tma ? "" : "/cp.async") + (c.random_in_kernel ? "/random-in-kernel" : "") +
        (c.lazy_rescale ? "/lazy-rescale" : "") + (c.poly_exp2 ? "/poly-exp2" : "") +
        (c.persistent_blocks ? "/persistent" + std::to_string(c.persistent_blocks) : "");
    std::lock_guard<std::mutex> lock(m_);
    std::unique_ptr<Runtime>& rt = map_[key];
    if (!rt) {
      RuntimeOptions o = options_for(d);
      o.config = c.config;
      o.tma = c.tma;
      o.lazy_rescale = c.lazy_rescale;
      o.poly_exp2 = c.poly_exp2;
      o.persistent_blocks = c.persistent_blocks;
      if (c.random_in_kernel) o.random_in_kernel_above = 0;
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
  size_t gqa = 0, offsets = 0, dynamic = 0, device_tables = 0, random_in_kernel = 0, empty_rows = 0, ragged = 0, no_lse = 0;
  void add(const Case& c, const Prepared& p) {
    const Shape& s = c.shape;
    dtypes.insert(to_string(c.dtype));
    head_dims.insert(s.head_dim), head_dims.insert(s.head_dim_v);
    archs.insert(c.arch);
    configs.insert(c.config == KernelConfig{} ? "default" : describe(c.config));
    gqa += s.heads_q != s.heads_kv;
    offsets += s.q_offset != 0 || s.k_offset != 0;
    dynamic += c.dynamic.has_value();
    device_tables += c.device_table && c.dynamic;
    random_in_kernel += c.random_in_kernel && c.pattern.has_layout_kind(Layout::Kind::Random);
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
       << dynamic << " (on the device " << device_tables << "), random layouts in the kernels " << random_in_kernel << ", lengths no multiple of 64 " << ragged << ", no lse " << no_lse << "; " << configs.size() << " kernel configs";
    return os.str();
  }
};

}  // namespace

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

Shape make_shape(int64_t batch, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d, int64_t q_off, int64_t k_off) {
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
    c.device_table = c.dynamic && n % 2 == 0;  // half of the tables stay on the device
    c.random_in_kernel = c.pattern.has_layout_kind(Layout::Kind::Random) && (n / 2) % 2 == 0;  // half of the random layouts
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
std::vector<Case> emu_example_cases(bool sm90a) {
  std::vector<Case> cases;
  uint64_t seed = sm90a ? 9000 : 7000;
  for (const auto& [name, p] : example_patterns()) {
    auto add = [&](const std::string& tag, Shape s, DType dt, Mem m, int arch = 80) {
      Case c;
      c.name = name + (sm90a ? "/sm90a-" : "/") + tag;
      c.pattern = p, c.shape = s, c.dtype = dt, c.mem = m, c.arch = sm90a ? 90 : arch, c.sm90a = sm90a, c.seed = seed++;
      c.lse = seed % 5 != 0;
      c.random_in_kernel = p.has_layout_kind(Layout::Kind::Random) && seed % 2 == 0;  // half of them
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

std::vector<std::pair<std::string, Pattern>> random_in_kernel_patterns() {
  return {
      {"bigbird-32", PatternBuilder()
                         .layout(layouts::union_of({layouts::local(1, 32, 32), layouts::global({0}, 32, 32),
                                                    layouts::random(0.15, 5, 32, 32)}, 32, 32))
                         .branch(BranchSpec().full())
                         .build()},
      {"random-128-beside-local", PatternBuilder()
                                      .branch(BranchSpec().layout(layouts::random(0.1, 11, 128, 128)))
                                      .branch(BranchSpec().causal().layout(layouts::local(0, 64, 64)))
                                      .build()},
      {"dilated-causal-intersect", PatternBuilder()
                                       .branch(BranchSpec().segment(96).dilation(2).offset(OffsetRule::HeadMod).causal().layout(
                                           layouts::intersect_of({layouts::random(0.5, 9, 16, 16), layouts::local(3, 16, 16)}, 16, 16)))
                                       .branch(BranchSpec().segment(64).dilation(1))
                                       .build()},
      {"small-blocks-offsets", PatternBuilder()
                                   .branch(BranchSpec().layout(layouts::union_of(
                                       {layouts::random(0.1, 3, 8, 8), layouts::offsets({-1, 2}, 8, 8)}, 8, 8)))
                                   .build()},
  };
}

// Every configuration the autotuner can choose (compiler/tune/autotune.cpp's candidate_configs for
// `arch`: tensor-core tiles 64/128 x 32/64/128 with 2 or 3 stages that fit, 128-row tiles with 16
// or 32 rows per warp, 128-row tiles of 32-row warps with one K and one V buffer, SIMT tiles
// 16/32/64 x 16/32), plus a 4-stage pipeline and a 64-row tile of
// two 32-row warps, on a pattern with causal and dilated branches at lengths that are no multiple
// of any tile (so residue tiles leave some warps without rows). Head dim 256 has its own, smaller set; on the emulator
// fp16 also runs the SIMT candidates of sm_75, and bf16 those of sm_61. With `sm90a` (arch 90):
// the Hopper forward's candidates at head dims 64, 128 and 256.
std::vector<Case> config_cases(int64_t seq, int arch, bool sm90a) {
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
    r.arch_specific = sm90a && kind.arch == 90;  // the Hopper path's candidates (an H100's default)
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

std::string byte_difference(const std::vector<unsigned char>& got, const std::vector<unsigned char>& want) {
  if (got.size() != want.size()) return std::to_string(got.size()) + " bytes, want " + std::to_string(want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return "byte " + std::to_string(i) + " of " + std::to_string(got.size()) + " is " + std::to_string(int(got[i])) +
             ", want " + std::to_string(int(want[i]));
    }
  }
  return "";
}

std::vector<Path> forward_paths() {
  if (target() != Target::Emu) return {{"bf16", DType::BF16, 80, false, true}, {"fp16", DType::F16, 80, false, true},
                                       {"fp32", DType::F32, 80, false, true}};
  return {{"sm80-bf16", DType::BF16, 80, false, true},  {"sm80-fp16", DType::F16, 80, false, true},
          {"simt-fp32", DType::F32, 80, false, true},   {"sm75-fp16", DType::F16, 75, false, true},
          {"sm61-bf16", DType::BF16, 61, false, true},  {"sm90a-tma-bf16", DType::BF16, 90, true, true},
          {"sm90a-cp.async-fp16", DType::F16, 90, true, false}};
}

}  // namespace attnjit::gputest
