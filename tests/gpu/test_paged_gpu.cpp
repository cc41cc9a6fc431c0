// The paged forward (PagedAttention; templates/fwd_paged.cuh) against the float64 reference on
// each request's gathered tokens, on the device under test (tests/gpu/test_target.hpp): every
// example pattern, decode and chunked prefill, GQA, fp32/fp16/bf16, page sizes 1 to 64 in shuffled
// order with NaN in every slot no request owns, split-KV from one split to many, every tile the
// paged kernel takes, non-finite values, and the refusals.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "attnjit/reference.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/half.hpp"
#include "compiler/codegen/codegen.hpp"
#include "compiler/plan/paged_plan.hpp"
#include "runtime/kernel_params.hpp"
#include "tests/gpu/attention_cases.hpp"

namespace attnjit::gputest {
namespace {

struct PagedCase {
  std::string name;
  Pattern pattern;
  int64_t heads_q = 6, heads_kv = 2, head_dim = 64, head_dim_v = 64;
  DType dtype = DType::BF16;
  int64_t page_size = 16;
  std::vector<int64_t> kv_lens, queries;  // per request
  int32_t splits = 0;
  int arch = 80;
  KernelConfig config;
  uint64_t seed = 1;
  std::shared_ptr<const TemplateSet> templates;  // a deliberately broken kernel (null: the embedded templates)
  bool fp8 = false;  // FP8 e4m3 caches with a random scale per kv head for K and for V
  // How the call runs: forward(); plan() and run() over a workspace whose capacity exceeds the plan
  // (blocks past it return); or (a GPU) run() captured once in a CUDA graph and replayed after the
  // plan() of a step one token shorter, then after plan() of this call.
  // With lengths on the device (PagedCall::device_kv_lens, planned by the _plan kernel): forward();
  // run() over a workspace of needs() after a run() of the step one token shorter; or (a GPU) that
  // run() captured once and replayed after each step's lengths are copied into the same buffers.
  enum class Mode { Forward, PlanRun, Graph, DeviceForward, DeviceRun, DeviceGraph } mode = Mode::Forward;
  // Lengths on the device: one request's kv_len replaced by this (its rows then NaN, counted).
  int bad_length_request = -1;
  int64_t bad_length = 0;
  // The mutation tests: the counter's value a run must end with (-1: not checked).
  int expected_errors = -1;
  // DeviceRun: the workspace after the run (the device planner's tables) and its capacity.
  std::vector<unsigned char>* workspace_out = nullptr;
  PagedCapacity* capacity_out = nullptr;
  // A request whose first page index is past the cache, with an error counter: its keys there are
  // counted and skipped (its rows only finite), every other request's rows exact.
  int bad_page_request = -1;
  // V elements of one request's token set to a value (request, position, kv head, dim, value).
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, float>> v_values;
};

Device device_for(int arch) {
  switch (target()) {
    case Target::Gpu: return Device::cuda(0);
    case Target::Emu: return Device::emu(arch);
    case Target::Cpu: return Device::cpu();
  }
  return Device::cpu();
}

// Values as stored (rounded to the dtype) and their bytes.
float rounded(float x, DType dt) {
  if (dt == DType::E4M3) return e4m3_to_float(float_to_e4m3(x));
  return dt == DType::F16 ? half_to_float(float_to_half(x)) : dt == DType::BF16 ? bfloat16_to_float(float_to_bfloat16(x)) : x;
}
std::vector<unsigned char> bytes_of(const std::vector<float>& v, DType dt) {
  std::vector<unsigned char> b(v.size() * dtype_bytes(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::E4M3) {
      b[i] = float_to_e4m3(v[i]);
    } else if (dt == DType::F32) {
      std::memcpy(b.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = dt == DType::F16 ? float_to_half(v[i]) : float_to_bfloat16(v[i]);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}
float value_at(const std::vector<unsigned char>& b, size_t i, DType dt) {
  if (dt == DType::F32) {
    float f;
    std::memcpy(&f, b.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, b.data() + 2 * i, 2);
  return dt == DType::F16 ? half_to_float(h) : bfloat16_to_float(h);
}

struct PagedResult {
  size_t rows = 0, mismatches = 0;
  double worst = 0;
  int32_t errors = 0;  // the counter's value (bad_page_request)
};

PagedResult run_paged(const PagedCase& c) {
  const size_t batch = c.kv_lens.size();
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Pages: each request's, then three spare, all in a shuffled order.
  int64_t pages = 3, max_pages = 1;
  for (int64_t L : c.kv_lens) {
    pages += (L + c.page_size - 1) / c.page_size;
    max_pages = std::max(max_pages, (L + c.page_size - 1) / c.page_size);
  }
  std::vector<int32_t> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> table(batch * size_t(max_pages), -1);
  const int64_t hkv = c.heads_kv, d = c.head_dim, dv = c.head_dim_v;
  // FP8 caches: values of e4m3 (about +-2), each kv head's K and V times a scale of its own.
  const DType kvdt = c.fp8 ? DType::E4M3 : c.dtype;
  const float spread = c.fp8 ? 2.0f : 1.0f;
  std::vector<float> k_scale(size_t(hkv), 1.0f), v_scale(size_t(hkv), 1.0f);
  if (c.fp8) {
    std::uniform_real_distribution<float> scales(0.25f, 2.0f);
    for (int64_t h = 0; h < hkv; ++h) k_scale[h] = scales(rng), v_scale[h] = scales(rng);
  }
  std::vector<float> kc(size_t(pages * c.page_size * hkv * d), nan), vc(size_t(pages * c.page_size * hkv * dv), nan);
  // Each request's tokens contiguous [L, Hkv, D] for the reference.
  std::vector<std::vector<float>> ks(batch), vs(batch), qs(batch);
  size_t next = 0;
  int64_t total_q = 0;
  for (size_t b = 0; b < batch; ++b) {
    const int64_t L = c.kv_lens[b];
    ks[b].resize(size_t(L * hkv * d));
    vs[b].resize(size_t(L * hkv * dv));
    for (int64_t j = 0; j * c.page_size < L; ++j) table[b * max_pages + j] = order[next++];
    for (int64_t pos = 0; pos < L; ++pos) {
      const int64_t slot = table[b * max_pages + pos / c.page_size] * c.page_size + pos % c.page_size;
      for (int64_t h = 0; h < hkv; ++h) {
        for (int64_t x = 0; x < d; ++x) {
          kc[(slot * hkv + h) * d + x] = rounded(spread * uni(rng), kvdt);
          ks[b][(pos * hkv + h) * d + x] = kc[(slot * hkv + h) * d + x] * k_scale[h];
        }
        for (int64_t x = 0; x < dv; ++x) {
          vc[(slot * hkv + h) * dv + x] = rounded(spread * uni(rng), kvdt);
          vs[b][(pos * hkv + h) * dv + x] = vc[(slot * hkv + h) * dv + x] * v_scale[h];
        }
      }
    }
    for (const auto& [rb, pos, h, x, val] : c.v_values) {
      if (size_t(rb) != b) continue;
      const int64_t slot = table[b * max_pages + pos / c.page_size] * c.page_size + pos % c.page_size;
      vc[(slot * hkv + h) * dv + x] = val;
      vs[b][(pos * hkv + h) * dv + x] = val * v_scale[h];
    }
    qs[b].resize(size_t(c.queries[b] * c.heads_q * d));
    for (float& x : qs[b]) x = rounded(uni(rng), c.dtype);
    total_q += c.queries[b];
  }
  std::vector<float> q;
  std::vector<int64_t> cu{0};
  for (size_t b = 0; b < batch; ++b) {
    q.insert(q.end(), qs[b].begin(), qs[b].end());
    cu.push_back(cu.back() + c.queries[b]);
  }

  const size_t eb = size_t(dtype_bytes(c.dtype)), kvb = size_t(dtype_bytes(kvdt));
  Buf qb(std::max<size_t>(q.size() * eb, 16)), kb(kc.size() * kvb), vb(vc.size() * kvb), tb(table.size() * 4);
  Buf ksb(size_t(hkv) * 4), vsb(size_t(hkv) * 4);
  auto float_bytes = [](const std::vector<float>& f) {
    std::vector<unsigned char> b(f.size() * 4);
    std::memcpy(b.data(), f.data(), b.size());
    return b;
  };
  ksb.upload(float_bytes(k_scale));
  vsb.upload(float_bytes(v_scale));
  Buf ob(std::max<size_t>(size_t(total_q * c.heads_q * dv) * eb, 16)), lb(std::max<size_t>(size_t(total_q * c.heads_q) * 4, 16));
  qb.upload(bytes_of(q, c.dtype));
  kb.upload(bytes_of(kc, kvdt));
  vb.upload(bytes_of(vc, kvdt));
  if (c.bad_page_request >= 0) table[size_t(c.bad_page_request) * max_pages] = int32_t(pages + 5);
  std::vector<unsigned char> tbytes(table.size() * 4);
  std::memcpy(tbytes.data(), table.data(), tbytes.size());
  Buf eb4(4);
  eb4.upload(std::vector<unsigned char>(4, 0));
  tb.upload(tbytes);
  ob.poison(nullptr);
  lb.poison(nullptr);

  RuntimeOptions options = options_for(device_for(c.arch));
  options.config = c.config;
  options.templates = c.templates;
  Runtime rt(options);
  PagedProblem pb{c.heads_q, c.heads_kv, d, dv, c.dtype};
  if (c.fp8) pb.kv_dtype = DType::E4M3;
  PagedAttention pa = rt.prepare_paged(c.pattern, pb);
  PagedCall call;
  call.q = TensorView::contiguous(qb.data(), c.dtype, {total_q, c.heads_q, d});
  call.k_cache = TensorView::contiguous(kb.data(), kvdt, {pages, c.page_size, hkv, d});
  call.v_cache = TensorView::contiguous(vb.data(), kvdt, {pages, c.page_size, hkv, dv});
  if (c.fp8) {
    call.k_scale = static_cast<const float*>(ksb.data());
    call.v_scale = static_cast<const float*>(vsb.data());
  }
  call.block_table = static_cast<const int32_t*>(tb.data());
  call.block_table_stride = max_pages;
  call.kv_lens = c.kv_lens;
  call.cu_seqlens_q = cu;
  call.o = TensorView::contiguous(ob.data(), c.dtype, {total_q, c.heads_q, dv});
  const TensorView lse = TensorView::contiguous(lb.data(), DType::F32, {total_q, c.heads_q});
  call.lse = &lse;
  call.splits = c.splits;
  if (c.bad_page_request >= 0 || c.bad_length_request >= 0) call.errors = static_cast<int32_t*>(eb4.data());
  const bool on_device = c.mode == PagedCase::Mode::DeviceForward || c.mode == PagedCase::Mode::DeviceRun ||
                         c.mode == PagedCase::Mode::DeviceGraph;
  // Lengths on the device: int32 arrays the kernels read (the step's, or one token shorter).
  Buf lens_buf(std::max<size_t>(batch * 4, 16)), cu_buf((batch + 1) * 4);
  auto put_lengths = [&](bool shorter) {
    std::vector<int32_t> lens(batch), cu32(cu.begin(), cu.end());
    for (size_t b = 0; b < batch; ++b) {
      lens[b] = int32_t(c.kv_lens[b] - (shorter && c.kv_lens[b] > c.queries[b] ? 1 : 0));
      if (int(b) == c.bad_length_request) lens[b] = int32_t(c.bad_length);
    }
    std::vector<unsigned char> lb8(std::max<size_t>(batch * 4, 16), 0), cb8(cu32.size() * 4);
    std::memcpy(lb8.data(), lens.data(), batch * 4);
    std::memcpy(cb8.data(), cu32.data(), cb8.size());
    lens_buf.upload(lb8);
    cu_buf.upload(cb8);
  };
  if (on_device) {
    put_lengths(false);
    call.kv_lens.clear();
    call.cu_seqlens_q.clear();
    call.device_kv_lens = static_cast<const int32_t*>(lens_buf.data());
    // One query per request: the default (no cu_seqlens_q) where the call allows it.
    const bool one_each = std::all_of(c.queries.begin(), c.queries.end(), [](int64_t n) { return n == 1; });
    call.device_cu_seqlens_q = one_each ? nullptr : static_cast<const int32_t*>(cu_buf.data());
    call.requests = int64_t(batch);
  }
  if (c.mode == PagedCase::Mode::Forward || c.mode == PagedCase::Mode::DeviceForward) {
    pa.forward(call);
  } else if (on_device) {
    const PagedCapacity cap = pa.needs(call);
    Buf ws(std::max<size_t>(pa.workspace_bytes(cap), 16));
    ws.poison(nullptr);  // the planner writes what the kernels read
    if (c.mode == PagedCase::Mode::DeviceRun) {
      put_lengths(true);
      pa.run(call, ws.data(), cap);
      put_lengths(false);
      eb4.upload(std::vector<unsigned char>(4, 0));
      pa.run(call, ws.data(), cap);
      if (c.workspace_out) *c.workspace_out = ws.download(), *c.capacity_out = cap;
    } else {
      CUstream stream = create_stream();
      call.stream = stream;
      put_lengths(true);
      CapturedGraph graph(stream, [&] { pa.run(call, ws.data(), cap); });
      graph.launch(stream);
      synchronize(stream);
      put_lengths(false);
      eb4.upload(std::vector<unsigned char>(4, 0));
      graph.launch(stream);
      synchronize(stream);
    }
  } else {
    PagedCall early = call;  // a step one token shorter where its queries allow: other positions, the same buffers
    for (size_t b = 0; b < batch; ++b)
      if (early.kv_lens[b] > c.queries[b]) --early.kv_lens[b];
    PagedCapacity cap = pa.needs(call);
    cap.items += 8, cap.spans += 64, cap.entries += 64, cap.splits = std::max(cap.splits, 8);
    Buf ws(pa.workspace_bytes(cap));
    ws.upload(std::vector<unsigned char>(pa.workspace_bytes(cap), 0));
    if (c.mode == PagedCase::Mode::PlanRun) {
      pa.plan(early, ws.data(), cap);  // its tables are then overwritten by the step's
      pa.plan(call, ws.data(), cap);
      pa.run(call, ws.data(), cap);
    } else {
      CUstream stream = create_stream();
      call.stream = early.stream = stream;
      pa.plan(early, ws.data(), cap);
      CapturedGraph graph(stream, [&] { pa.run(early, ws.data(), cap); });
      graph.launch(stream);
      pa.plan(call, ws.data(), cap);
      graph.launch(stream);
      synchronize(stream);
    }
  }
  if (target() == Target::Gpu) synchronize(nullptr, "paged test");
  const std::vector<unsigned char> o = ob.download(), l = lb.download();

  PagedResult res;
  if (c.bad_page_request >= 0 || c.bad_length_request >= 0) std::memcpy(&res.errors, eb4.download().data(), 4);
  const double tol = c.dtype == DType::F32 ? 2e-5 : c.dtype == DType::F16 ? 2e-3 : 1.6e-2;
  for (size_t b = 0; b < batch; ++b) {
    const int64_t n = c.queries[b], L = c.kv_lens[b];
    if (n == 0) continue;
    if (int(b) == c.bad_length_request) {  // lengths the planner refused: every row NaN
      for (int64_t i = 0; i < n * c.heads_q * dv; ++i) {
        ++res.rows;
        if (!std::isnan(value_at(o, size_t(cu[b] * c.heads_q * dv + i), c.dtype)) && res.mismatches++ < 3)
          UNSCOPED_INFO(c.name << ": request " << b << " (wrong length) has a number in its output");
      }
      for (int64_t i = 0; i < n * c.heads_q; ++i) {
        float got;
        std::memcpy(&got, l.data() + 4 * size_t(cu[b] * c.heads_q + i), 4);
        if (!std::isnan(got) && res.mismatches++ < 3) UNSCOPED_INFO(c.name << ": request " << b << " (wrong length) has an lse");
      }
      continue;
    }
    // The request with a bad first page: its keys there skipped, so the reference over the tokens
    // from the second page on (k_offset keeps the positions).
    const int64_t from = int64_t(b) == c.bad_page_request ? c.page_size : 0;
    const Shape s = make_shape(1, n, L - from, c.heads_q, hkv, d, L - n, from);
    Shape sv = s;
    sv.head_dim_v = dv;
    const ReferenceOutput ref = reference_attention(c.pattern, sv, qs[b].data(), ks[b].data() + from * hkv * d,
                                                    vs[b].data() + from * hkv * dv, nullptr, 1);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t h = 0; h < c.heads_q; ++h) {
        ++res.rows;
        bool bad = false;
        for (int64_t x = 0; x < dv; ++x) {
          const double want = ref.o[size_t((i * c.heads_q + h) * dv + x)];
          const double got = value_at(o, size_t(((cu[b] + i) * c.heads_q + h) * dv + x), c.dtype);
          if (std::isnan(want) != std::isnan(got) || (std::isinf(want) && want != got)) bad = true;
          if (std::isfinite(want)) {
            const double err = std::abs(got - want);
            if (!(err <= tol + tol * std::abs(want))) bad = true;
            if (err > res.worst || std::isnan(err)) res.worst = err;
          }
        }
        const double want = ref.lse[size_t(h * n + i)];
        float got;
        std::memcpy(&got, l.data() + 4 * size_t((cu[b] + i) * c.heads_q + h), 4);
        if (std::isnan(want) != std::isnan(got) || (std::isinf(want) && want != got) ||
            (std::isfinite(want) && !(std::abs(got - want) <= 1e-3 + 1e-5 * std::abs(want))))
          bad = true;
        if (bad && res.mismatches++ < 3)
          UNSCOPED_INFO(c.name << ": request " << b << " query " << i << " head " << h << " differs (lse " << got << " want "
                               << want << ")");
      }
    }
  }
  return res;
}

void check(const PagedCase& c) {
  INFO(c.name);
  const PagedResult r = run_paged(c);
  CHECK(r.rows > 0);
  CHECK(r.mismatches == 0);
}

// Decode (one query per request), speculative decoding (4) and chunked prefill (a chunk of 37)
// at lengths around LongNet's segments and the block layouts' blocks, one request with no queries.
PagedCase mixed(std::string name, Pattern p, DType dt, int64_t page_size, int32_t splits) {
  PagedCase c;
  c.name = std::move(name);
  c.pattern = std::move(p);
  c.dtype = dt;
  c.page_size = page_size;
  c.kv_lens = {1, 70, 2100, 4500, 9, 300};
  c.queries = {1, 1, 4, 1, 0, 37};
  c.splits = splits;
  return c;
}

}  // namespace

TEST_CASE("paged attention: every example pattern, decode and chunked prefill, matches the reference", "[gpu][emu][paged]") {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (const auto& [name, p] : example_patterns()) {
    const DType dt = i % 3 == 0 ? DType::BF16 : i % 3 == 1 ? DType::F16 : DType::F32;
    check(mixed(name + "-" + to_string(dt), p, dt, i % 2 ? 16 : 64, 0));
    ++i;
  }
}

TEST_CASE("paged attention: page sizes, splits, tiles and head dims", "[gpu][emu][paged]") {
  SKIP_WITHOUT_GPU();
  const Pattern longnet = example_patterns().at(2).second;  // bigbird, causal_local, longnet, ...
  REQUIRE(example_patterns().at(2).first == "longnet");
  for (int64_t page : {1, 7, 256}) check(mixed("page " + std::to_string(page), longnet, DType::BF16, page, 0));
  for (int32_t splits : {1, 2, 5, 64}) check(mixed("splits " + std::to_string(splits), longnet, DType::BF16, 16, splits));
  for (const auto& [tq, tk] : std::vector<std::pair<int, int>>{{1, 16}, {8, 32}, {16, 64}, {64, 32}}) {
    PagedCase c = mixed("tile " + std::to_string(tq) + "x" + std::to_string(tk), longnet, DType::F16, 16, 3);
    c.config.tile_q = tq, c.config.tile_k = tk;
    check(c);
  }
  // 36: rows of 72 bytes, no 16-byte loads (AjPagedParams::vec16 off).
  for (const auto& [d, dv] : std::vector<std::pair<int64_t, int64_t>>{{32, 32}, {128, 128}, {256, 256}, {64, 32}, {40, 72}, {36, 36}}) {
    PagedCase c = mixed("head dims " + std::to_string(d) + "/" + std::to_string(dv), longnet, DType::BF16, 16, 2);
    c.head_dim = d, c.head_dim_v = dv;
    c.heads_q = 4, c.heads_kv = 4;
    check(c);
  }
  PagedCase sm61 = mixed("sm_61", longnet, DType::F16, 16, 0);
  sm61.arch = 61;
  check(sm61);
}

TEST_CASE("paged attention: FP8 e4m3 caches with per-head scales match the reference on their values", "[gpu][emu][paged][fp8]") {
  SKIP_WITHOUT_GPU();
  for (const auto& [name, p] : example_patterns()) {
    for (const DType dt : {DType::BF16, DType::F16, DType::F32}) {
      PagedCase c = mixed(name + " fp8 caches, " + to_string(dt) + " queries", p, dt, 16, dt == DType::F32 ? 1 : 3);
      c.fp8 = true;
      if (dt == DType::F16) c.head_dim = c.head_dim_v = 40;  // rows of 40 bytes: element loads
      check(c);
    }
  }
  PagedCase nan = mixed("fp8 caches, a NaN code in V", example_patterns().at(4).second, DType::BF16, 16, 2);
  nan.fp8 = true;
  nan.v_values = {{3, 4490, 0, 5, std::numeric_limits<float>::quiet_NaN()}};
  check(nan);
}

TEST_CASE("paged attention: plan() and run() over a workspace give forward()'s answer", "[gpu][emu][paged][graph]") {
  SKIP_WITHOUT_GPU();
  for (const auto& [name, p] : example_patterns()) {
    PagedCase c = mixed(name + " plan/run", p, DType::BF16, 16, name == "bigbird" ? 3 : 0);
    c.mode = PagedCase::Mode::PlanRun;
    c.fp8 = name == "longnet";
    check(c);
  }
}

TEST_CASE("paged attention: run() captured in a CUDA graph replays each step's plan()", "[gpu][paged][graph]") {
  SKIP_WITHOUT_GPU();
  if (on_host()) { WARN("SKIPPED on the emulator and the CPU device: CUDA graphs need a GPU"); return; }
  shared_context(0).make_current();
  for (const auto& [name, p] : example_patterns()) {
    PagedCase c = mixed(name + " graph", p, DType::BF16, 16, 0);
    c.mode = PagedCase::Mode::Graph;
    check(c);
  }
}

TEST_CASE("paged attention: a plan above the workspace's capacity is refused, naming the count", "[gpu][emu][paged][graph][errors]") {
  SKIP_WITHOUT_GPU();
  Runtime rt(options_for(device_for(80)));
  PagedAttention pa = rt.prepare_paged(example_patterns().at(1).second, PagedProblem{2, 1, 32, 32, DType::F32});
  Buf qb(3 * 2 * 32 * 4), kb(8 * 8 * 32 * 4), vb(8 * 8 * 32 * 4), ob(3 * 2 * 32 * 4), tb(3 * 2 * 4);
  std::vector<unsigned char> t(24);
  const int32_t pages[6] = {0, 1, 2, 3, 4, 5};
  std::memcpy(t.data(), pages, 24);
  tb.upload(t);
  PagedCall c;
  c.q = TensorView::contiguous(qb.data(), DType::F32, {3, 2, 32});
  c.k_cache = TensorView::contiguous(kb.data(), DType::F32, {8, 8, 1, 32});
  c.v_cache = TensorView::contiguous(vb.data(), DType::F32, {8, 8, 1, 32});
  c.block_table = static_cast<const int32_t*>(tb.data());
  c.block_table_stride = 2;
  c.kv_lens = {5, 16, 9};
  c.o = TensorView::contiguous(ob.data(), DType::F32, {3, 2, 32});
  const PagedCapacity need = pa.needs(c);
  CHECK(need.requests == 3);
  CHECK(need.items >= 3);
  for (const auto& [field, cap] : std::vector<std::pair<std::string, PagedCapacity>>{
           {"requests", PagedCapacity{2, need.items, need.spans, need.entries, 1}},
           {"items", PagedCapacity{3, need.items - 1, need.spans, need.entries, 1}},
           {"spans", PagedCapacity{3, need.items, need.spans - 1, need.entries, 1}}}) {
    Buf ws(pa.workspace_bytes(cap));
    try {
      pa.plan(c, ws.data(), cap);
      FAIL("not refused: " << field);
    } catch (const UserError& e) {
      CHECK(std::string(e.what()).find("PagedCapacity." + field) != std::string::npos);
    }
  }
  Buf ws(pa.workspace_bytes(need));
  CHECK_THROWS_WITH(pa.plan(c, nullptr, need), Catch::Contains("workspace"));
  PagedCapacity bad = need;
  bad.splits = 0;
  CHECK_THROWS_WITH(pa.plan(c, ws.data(), bad), Catch::Contains("PagedCapacity.splits"));
}

TEST_CASE("paged attention: a NaN or inf in V reaches only the rows that attend its key", "[gpu][emu][paged]") {
  SKIP_WITHOUT_GPU();
  const Pattern window = example_patterns().at(4).second;
  REQUIRE(example_patterns().at(4).first == "sliding_window");
  for (int32_t splits : {1, 4}) {
    PagedCase c = mixed("non-finite V, splits " + std::to_string(splits), window, DType::F32, 16, splits);
    const float inf = std::numeric_limits<float>::infinity();
    c.v_values = {{3, 4490, 0, 5, std::numeric_limits<float>::quiet_NaN()}, {3, 10, 1, 0, inf}, {5, 299, 1, 3, -inf}};
    check(c);
  }
}

// Decode and chunked prefill with splits, in bf16 and fp32, small enough for compute-sanitizer.
TEST_CASE("paged attention: a small subset for compute-sanitizer", "[gpu][paged][sanitize]") {
  SKIP_WITHOUT_GPU();
  for (const auto& [name, p] : example_patterns()) {
    if (name != "longnet" && name != "bigbird") continue;
    PagedCase c = mixed(name + " sanitize", p, name == "longnet" ? DType::BF16 : DType::F32, 16, 3);
    c.kv_lens = {1, 70, 2100, 300, 9, 300};
    check(c);
  }
}

TEST_CASE("paged attention: with a counter, keys on a page outside the cache are counted and skipped", "[gpu][emu][paged][errors]") {
  SKIP_WITHOUT_GPU();
  if (target() == Target::Cpu) { WARN("SKIPPED on the CPU device: it refuses a bad table on the host"); return; }
  for (int32_t splits : {1, 3}) {
    PagedCase c = mixed("a bad page, counted, splits " + std::to_string(splits), example_patterns().at(4).second, DType::BF16, 16, splits);
    c.bad_page_request = 5;  // 300 tokens, 37 queries: its first 16 tokens are in the window of every query
    const PagedResult r = run_paged(c);
    CHECK(r.mismatches == 0);
    CHECK(r.errors > 0);
  }
}

TEST_CASE("paged attention: bad calls are refused by name", "[gpu][emu][paged][errors]") {
  SKIP_WITHOUT_GPU();
  Runtime rt(options_for(device_for(80)));
  PagedAttention pa = rt.prepare_paged(example_patterns().at(1).second, PagedProblem{2, 1, 32, 32, DType::F32});
  Buf qb(2 * 2 * 32 * 4), kb(4 * 8 * 32 * 4), vb(4 * 8 * 32 * 4), ob(2 * 2 * 32 * 4), tb(2 * 2 * 4);
  std::vector<unsigned char> t(16);
  const int32_t pages[4] = {0, 1, 2, 3};
  std::memcpy(t.data(), pages, 16);
  tb.upload(t);
  auto base = [&] {
    PagedCall c;
    c.q = TensorView::contiguous(qb.data(), DType::F32, {2, 2, 32});
    c.k_cache = TensorView::contiguous(kb.data(), DType::F32, {4, 8, 1, 32});
    c.v_cache = TensorView::contiguous(vb.data(), DType::F32, {4, 8, 1, 32});
    c.block_table = static_cast<const int32_t*>(tb.data());
    c.block_table_stride = 2;
    c.kv_lens = {5, 16};
    c.o = TensorView::contiguous(ob.data(), DType::F32, {2, 2, 32});
    return c;
  };
  auto refused = [&](PagedCall c, const std::string& word) {
    INFO(word);
    try {
      pa.forward(c);
      FAIL("not refused");
    } catch (const UserError& e) {
      CHECK(std::string(e.what()).find(word) != std::string::npos);
    }
  };
  PagedCall c = base();
  c.kv_lens = {5, 17};
  refused(c, "kv_lens[1]");  // 17 tokens need 3 pages of 8, the table has 2
  c = base();
  c.kv_lens = {-1, 3};
  refused(c, "negative");
  c = base();
  c.cu_seqlens_q = {0, 2, 2};
  c.kv_lens = {1, 3};
  refused(c, "request 0");  // two queries, one cached token
  c = base();
  c.cu_seqlens_q = {0, 1};
  refused(c, "cu_seqlens_q");
  c = base();
  c.q = TensorView::contiguous(qb.data(), DType::F32, {2, 2, 16});
  refused(c, "q");
  c = base();
  c.k_cache = TensorView::contiguous(kb.data(), DType::F16, {4, 8, 1, 32});
  refused(c, "k_cache");
  c = base();
  c.splits = 65;
  refused(c, "splits");
  c = base();
  const float one = 1.0f;
  c.k_scale = &one;
  refused(c, "k_scale");  // fp32 caches take no scales
  try {
    rt.prepare_paged(example_patterns().at(1).second, PagedProblem{2, 1, 32, 32, DType::F32, DType::F16});
    FAIL("not refused");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find("kv_dtype") != std::string::npos);
  }
  if (on_host()) {  // a GPU reads the table on the device: a bad page makes its rows NaN instead
    const int32_t bad[4] = {0, 1, 7, 3};
    std::memcpy(t.data(), bad, 16);
    tb.upload(t);
    refused(base(), "block_table[1, 0]");
  }
  // Lengths on the device: given twice, a request count that is not the queries', a workspace
  // smaller than needs(), and plan() for such a call, each refused by name.
  Buf lb(16);
  const int32_t lens[2] = {5, 16};
  std::vector<unsigned char> lbytes(16, 0);
  std::memcpy(lbytes.data(), lens, 8);
  lb.upload(lbytes);
  auto on_device = [&] {
    PagedCall d = base();
    d.kv_lens.clear();
    d.device_kv_lens = static_cast<const int32_t*>(lb.data());
    d.requests = 2;
    return d;
  };
  c = on_device();
  c.kv_lens = {5, 16};
  refused(c, "not both");
  c = on_device();
  c.requests = 3;
  refused(c, "queries for 3 requests");
  if (target() != Target::Cpu) {  // the CPU device reads the lengths and takes its own path
    c = on_device();
    PagedCapacity cap = pa.needs(c);
    CHECK(cap.items == 2 * 1);  // two queries, one class of heads (the two heads of the kv head)
    Buf ws(pa.workspace_bytes(cap));
    try {
      pa.plan(c, ws.data(), cap);
      FAIL("not refused");
    } catch (const UserError& e) {
      CHECK(std::string(e.what()).find("call run() alone") != std::string::npos);
    }
    PagedCapacity small = cap;
    small.items = 1;
    try {
      pa.run(c, ws.data(), small);
      FAIL("not refused");
    } catch (const UserError& e) {
      CHECK(std::string(e.what()).find("PagedCapacity.items") != std::string::npos);
    }
  }
  // fp8_e4m3 is a cache dtype: an ordinary attention refuses it by name.
  try {
    rt.prepare(example_patterns().at(1).second, Problem{1, 8, 8, 2, 1, 32, 32, DType::E4M3});
    FAIL("not refused");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find("paged KV cache only") != std::string::npos);
  }
  // A pattern with a dynamic layout has no table for a paged cache.
  const Pattern dynamic = parse_spec(R"({"attnjit": 1, "branches": [{"segment": "full", "layout": {"dynamic": true}}]})");
  try {
    rt.prepare_paged(dynamic, PagedProblem{2, 1, 32, 32, DType::F32});
    FAIL("not refused");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find("dynamic layout") != std::string::npos);
  }
}

namespace {

// A deliberately broken kernel: `from` replaced by `to` in the template `file`.
struct TemplateMutation {
  const char* name;
  const char* file;
  const char* from;
  const char* to;
};

// Rows that came out wrong over `cases` run with `templates` (a fault counts one; so does a counter
// other than a case's expected_errors), and the rows checked.
std::pair<size_t, size_t> failures(std::vector<PagedCase> cases, std::shared_ptr<const TemplateSet> templates) {
  size_t bad = 0, rows = 0;
  for (PagedCase& c : cases) {
    c.templates = templates;
    try {
      const PagedResult r = run_paged(c);
      bad += r.mismatches + (c.expected_errors >= 0 && r.errors != c.expected_errors), rows += r.rows;
    } catch (const std::exception& e) {
      UNSCOPED_INFO("fault: " << e.what());
      ++bad;
    }
  }
  return {bad, rows};
}

// The cases pass with the embedded templates, and each mutation makes some row of them fail.
void check_mutations(const std::vector<PagedCase>& cases, const std::vector<TemplateMutation>& mutations) {
  const auto clean = failures(cases, nullptr);
  CHECK(clean.first == 0);
  CHECK(clean.second > 0);
  for (const TemplateMutation& m : mutations) {
    INFO("mutation: " << m.name);
    auto t = std::make_shared<TemplateSet>(TemplateSet::embedded());
    std::string text = t->text(m.file);
    const size_t at = text.find(m.from);
    REQUIRE(at != std::string::npos);  // the template changed: update the mutation
    text.replace(at, std::string(m.from).size(), m.to);
    t->replace(m.file, text);
    CHECK(failures(cases, t).first > 0);
  }
}

// A NaN in V at a key its request's query attends, and an inf at key 299 of request 5, which only
// its last query attends (a masked non-finite V for the others); FP8 caches keep the NaN alone.
void put_non_finite_values(PagedCase& c) {
  c.v_values = {{3, 4490, 0, 5, std::numeric_limits<float>::quiet_NaN()}, {5, 299, 1, 3, -std::numeric_limits<float>::infinity()}};
  if (c.fp8) c.v_values.resize(1);  // e4m3 has no infinity
}

}  // namespace

// Deliberately broken paged kernels: each must fail the check the unmutated kernel passes (two
// examples, decode and chunked prefill, one split and several, a NaN and an inf in V).
TEST_CASE("paged attention: every deliberately broken SIMT paged kernel fails in the emulator", "[emu][paged][mutation]") {
  if (target() != Target::Emu) {
    WARN("SKIPPED: the mutations run in the emulator (ATTNJIT_GPU_TESTS_DEVICE=emu)");
    return;
  }
  const Pattern longnet = example_patterns().at(2).second, window = example_patterns().at(4).second;
  std::vector<PagedCase> cases;
  for (const Pattern* p : {&longnet, &window}) {
    for (int32_t splits : {1, 3}) {
      PagedCase c = mixed("mutation", *p, splits == 1 ? DType::F32 : DType::BF16, 16, splits);
      c.config.tile_k = 32;  // the SIMT kernel (fwd_paged.cuh), where tensor cores would take bf16
      if (p == &window && splits == 1) c.head_dim = c.head_dim_v = 36;  // rows of 144 bytes for fp32: 16-byte loads
      if (p == &window && splits == 3) c.head_dim = c.head_dim_v = 36;  // 72 bytes for bf16: one element at a time
      if (p == &longnet && splits == 3) c.fp8 = true;  // FP8 caches (16-byte loads of 16 codes)
      if (p == &window && splits == 3) c.mode = PagedCase::Mode::PlanRun;  // a graph's launch, in the emulator
      if (p == &window && splits == 1) c.bad_page_request = 5;            // a bad page, counted and skipped
      put_non_finite_values(c);
      cases.push_back(c);
    }
  }
  const char* f = "fwd_paged.cuh";
  check_mutations(cases, {
      {"the running sum not rescaled", f, "      l[j] = l[j] * rescale + sum;", "      l[j] = l[j] + sum;"},
      {"a masked key weighted instead of skipped", f, "        if (pc == -1.0f) continue;\n", "\n"},
      {"the mask not asked on partial tiles", f, "          if (!t.full) ok = aj_keys_allowed", "          if (false) ok = aj_keys_allowed"},
      {"queries at their request's row, not its position", f, "  out.pos = q_pos + local;", "  out.pos = local;"},
      {"every row of a packed item taken as its first head's", f, "  out.head = item.head + h;", "  out.head = item.head;"},
      {"the token's slot one past its own", f, "(pos % pp.page_size) * row_stride", "((pos + 1) % pp.page_size) * row_stride"},
      {"every split takes every tile", f, "    if (n % splits != split) continue;\n", "\n"},
      {"a graph's launch: blocks past the step's plan run", f, "  return aj_block_idx_x() < pp.header[0] && aj_block_idx_y() < splits;",
       "  return true;"},
      {"the merge weighs every split alike", f, "        const float w = aj_ex2(v - top);", "        const float w = 1.0f;"},
      {"16-byte loads: each vector stored one vector along", f, "      for (int i = 0; i < kVec; ++i) dst[r * PITCH + d + i] = val[i];",
       "      for (int i = 0; i < kVec; ++i) dst[r * PITCH + (d + kVec) % D + i] = val[i];"},
      {"element loads: each element read from its neighbour", f, "      val = row ? aj_kv_load(row + d) * scale : bad;",
       "      val = row ? aj_kv_load(row + (d + 1) % D) * scale : bad;"},
      {"a counted bad page's keys attended, not skipped", f, "        bool ok = c < t.count && !sh.skip[c];", "        bool ok = c < t.count;"},
      {"fp8: the scale not applied", f, "        for (int i = 0; i < kVec; ++i) val[i] = aj_kv_load(e + i) * scale;",
       "        for (int i = 0; i < kVec; ++i) val[i] = aj_kv_load(e + i);"},
      {"fp8: the exponent bias one off", f, "((e + 120u) << 23)", "((e + 121u) << 23)"},
      {"fp8: subnormals read as zero", f, "const float f = (float)m * 0.001953125f;", "const float f = 0.0f;"},
      {"fp8: the scales of the first kv head for every head", f, "pp.k_scale ? pp.k_scale[kvh] : 1.0f", "pp.k_scale ? pp.k_scale[0] : 1.0f"},
      {"no warp barrier before the probabilities are read", f, "      aj_named_sync(1 + warp, 32);  // the warp's probabilities are in place\n", "\n"},
      {"no barrier before the next tile overwrites K and V", f, "    aj_syncthreads();  // the previous tile is no longer read (and Q is in place)\n", "\n"},
  });
}

}  // namespace attnjit::gputest

namespace attnjit::gputest {
namespace {

// Decode at lengths around LongNet's segments and the layouts' blocks: one query per request, no
// cu_seqlens_q, GQA 4:1 (the heads of a kv group share items where their offsets agree).
PagedCase decode(std::string name, Pattern p, DType dt, int64_t page_size, int32_t splits) {
  PagedCase c = mixed(std::move(name), std::move(p), dt, page_size, splits);
  c.kv_lens = {1, 64, 65, 2048, 2049, 4500, 300, 17};
  c.queries.assign(c.kv_lens.size(), 1);
  c.heads_q = 8, c.heads_kv = 2;
  return c;
}


}  // namespace

TEST_CASE("paged attention planned on the device: every example, decode, speculative and chunked prefill", "[gpu][emu][paged][device-plan]") {
  SKIP_WITHOUT_GPU();
  int i = 0;
  for (const auto& [name, p] : example_patterns()) {
    const DType dt = i % 3 == 0 ? DType::BF16 : i % 3 == 1 ? DType::F16 : DType::F32;
    PagedCase m = mixed(name + " mixed, planned on the device", p, dt, i % 2 ? 16 : 64, 0);
    m.mode = i % 2 ? PagedCase::Mode::DeviceForward : PagedCase::Mode::DeviceRun;
    check(m);
    PagedCase d = decode(name + " decode, planned on the device", p, dt, i % 2 ? 64 : 16, i % 3 == 2 ? 4 : 0);
    d.mode = i % 2 ? PagedCase::Mode::DeviceRun : PagedCase::Mode::DeviceForward;
    d.fp8 = name == "longnet";
    check(d);
    ++i;
  }
}

TEST_CASE("paged attention planned on the device: tiles, page sizes and head classes", "[gpu][emu][paged][device-plan]") {
  SKIP_WITHOUT_GPU();
  const Pattern longnet = example_patterns().at(2).second;
  for (const auto& [tq, tk] : std::vector<std::pair<int, int>>{{1, 16}, {4, 32}, {64, 32}}) {
    PagedCase c = mixed("tile " + std::to_string(tq) + "x" + std::to_string(tk), longnet, DType::BF16, 7, 2);
    c.config.tile_q = tq, c.config.tile_k = tk;
    c.mode = PagedCase::Mode::DeviceRun;
    check(c);
  }
  // 16 query heads over 2: classes of up to tile_q heads where offsets agree (none for LongNet's
  // rates, all 8 for the window's), and page size 1.
  for (const auto& [name, p] : std::vector<std::pair<std::string, Pattern>>{{"longnet", longnet}, {"window", example_patterns().at(4).second}}) {
    PagedCase c = decode(name + " 16:2 heads, page size 1", p, DType::F16, 1, 0);
    c.heads_q = 16;
    c.mode = PagedCase::Mode::DeviceForward;
    check(c);
    // GQA 16:1 (a class of 16 heads fills the tensor cores' 16 rows) and a chunk of 128 queries.
    PagedCase g = mixed(name + " 16:1 heads, 128 queries", p, DType::BF16, 16, 0);
    g.heads_q = 16, g.heads_kv = 1;
    g.kv_lens = {1, 2100, 700};
    g.queries = {1, 1, 128};
    for (const PagedCase::Mode mode : {PagedCase::Mode::Forward, PagedCase::Mode::DeviceRun}) {
      g.mode = mode;
      check(g);
    }
  }
}

TEST_CASE("paged attention planned on the device: wrong lengths make their request's rows NaN, counted (CPU: refused)", "[gpu][emu][paged][device-plan][errors]") {
  SKIP_WITHOUT_GPU();
  const Pattern causal = example_patterns().at(1).second;
  // Request 2 has 4 queries: fewer cached tokens than that, a negative length, more than its table.
  for (const int64_t wrong : {int64_t{2}, int64_t{-5}, int64_t{1} << 30}) {
    PagedCase c = mixed("kv_len " + std::to_string(wrong) + " for 4 queries", causal, DType::BF16, 16, wrong == 2 ? 3 : 0);
    c.mode = wrong == 2 ? PagedCase::Mode::DeviceRun : PagedCase::Mode::DeviceForward;
    c.bad_length_request = 2;
    c.bad_length = wrong;
    INFO(c.name);
    if (target() == Target::Cpu) {  // its memory is the host's: the lengths are checked, the call refused by name
      CHECK_THROWS_WITH(run_paged(c), Catch::Contains("request 2") || Catch::Contains("kv_lens[2]"));
      continue;
    }
    const PagedResult r = run_paged(c);
    CHECK(r.mismatches == 0);
    CHECK(r.errors == 1);
  }
}

TEST_CASE("paged attention planned on the device: a decode step visits the host plan's key tiles", "[emu][paged][device-plan]") {
  if (target() != Target::Emu) {
    WARN("SKIPPED: the device planner's tables are read back in the emulator (ATTNJIT_GPU_TESTS_DEVICE=emu)");
    return;
  }
  for (const auto& [name, p] : example_patterns()) {
    INFO(name);
    PagedCase c = decode(name + " tables", p, DType::BF16, 16, 0);
    c.mode = PagedCase::Mode::DeviceRun;
    std::vector<unsigned char> bytes;
    PagedCapacity cap;
    c.workspace_out = &bytes, c.capacity_out = &cap;
    CHECK(run_paged(c).mismatches == 0);
    KernelRequest k;
    k.head_dim = int(c.head_dim), k.head_dim_v = int(c.head_dim_v);
    const KernelConfig kc = resolve_paged_config(k);
    const PagedWorkspace w = paged_workspace(cap, kc.tile_q, c.head_dim_v);
    int32_t items = 0;
    std::memcpy(&items, bytes.data() + w.header, 4);
    // Tiles visited per (request, head): the device plan's items against the host's.
    auto at = [&](size_t offset, size_t i, auto type) {
      decltype(type) v;
      std::memcpy(&v, bytes.data() + offset + i * sizeof(v), sizeof(v));
      return v;
    };
    int64_t device_tiles = 0;
    for (int32_t i = 0; i < items; ++i) {
      const DeviceItem it = at(w.items, size_t(i), DeviceItem{});
      for (int s = it.span_begin; s < it.span_end; ++s) {
        const DeviceSpan sp = at(w.spans, size_t(s), DeviceSpan{});
        device_tiles += int64_t(sp.tile_end - sp.tile_begin) * at(w.item_heads, size_t(i), int32_t{});
      }
    }
    std::vector<PagedRequest> requests;
    for (size_t b = 0; b < c.kv_lens.size(); ++b) requests.push_back({c.queries[b], c.kv_lens[b]});
    const PagedPlan host = lower_paged_plan(p, c.heads_q, c.heads_kv, c.head_dim, c.head_dim_v, requests, {kc.tile_q, kc.tile_k});
    int64_t host_tiles = 0;
    for (size_t i = 0; i < host.tables.items.size(); ++i) {
      const WorkItem& it = host.tables.items[i];
      for (int64_t s = it.span_begin; s < it.span_end; ++s)
        host_tiles += span_tile_count(host.tables, host.tables.spans[size_t(s)]) * host.item_heads[i];
    }
    // A layout's tiles are the band's on the device (the forward seeks through the layout), the
    // layout's own in the host's plan.
    if (pattern_has_layout(p)) {
      CHECK(device_tiles >= host_tiles);
    } else {
      CHECK(device_tiles == host_tiles);
    }
    CHECK(host_tiles > 0);
  }
}

TEST_CASE("paged attention planned on the device: run() captured once replays while lengths change", "[gpu][paged][device-plan][graph]") {
  SKIP_WITHOUT_GPU();
  if (on_host()) { WARN("SKIPPED on the emulator and the CPU device: CUDA graphs need a GPU"); return; }
  shared_context(0).make_current();
  for (const auto& [name, p] : example_patterns()) {
    PagedCase c = decode(name + " captured decode, planned on the device", p, DType::BF16, 16, 0);
    c.mode = PagedCase::Mode::DeviceGraph;
    check(c);
    PagedCase m = mixed(name + " captured chunks, planned on the device", p, DType::BF16, 16, 3);
    m.mode = PagedCase::Mode::DeviceGraph;
    check(m);
  }
}

TEST_CASE("paged attention planned on the device: every deliberately broken planner fails in the emulator", "[emu][paged][device-plan][mutation]") {
  if (target() != Target::Emu) {
    WARN("SKIPPED: the mutations run in the emulator (ATTNJIT_GPU_TESTS_DEVICE=emu)");
    return;
  }
  const Pattern longnet = example_patterns().at(2).second, window = example_patterns().at(4).second;
  // Causal segments of 64 tokens: consecutive rows share items, and a chunk crosses a boundary.
  const Pattern segments = parse_spec(R"({"attnjit": 1, "branches": [{"segment": 64, "dilation": 1, "causal": true}]})");
  std::vector<PagedCase> cases;
  for (const Pattern* p : {&longnet, &window, &segments}) {
    for (int n = 0; n < 3; ++n) {
      PagedCase c = n == 1 ? decode("mutation", *p, DType::F32, 16, 0) : mixed("mutation", *p, DType::F32, 16, n == 0 ? 1 : 3);
      c.mode = n == 0 ? PagedCase::Mode::DeviceForward : PagedCase::Mode::DeviceRun;
      if (n == 2) c.bad_length_request = 2, c.bad_length = 3, c.expected_errors = 1;
      if (p == &segments && n != 1) c.kv_lens[5] = 340;  // queries at 303 .. 339, across 320
      cases.push_back(c);
    }
  }
  check_mutations(cases, {
      {"keys one past the step's length", "plan_paged.cuh", "seg + seg_len < kv_len ? seg + seg_len : kv_len;",
       "seg + seg_len < kv_len ? seg + seg_len : kv_len + 1;"},
      {"the band's left edge taken as full", "plan_paged.cuh", "    fb = (flo + tk - 1) / tk;\n", "    fb = 0;\n"},
      {"rows of different branches in one item", "plan_paged.cuh", "    if (sa != aj_pg_selected(b, off, c)) return false;\n", "\n"},
      {"rows of different segments in one item", "plan_paged.cuh",
       "    if (sa && aj_pg_segment_of(b, a) != aj_pg_segment_of(b, c)) return false;\n", "\n"},
      {"every class at offset 0", "plan_paged.cuh", "!aj_pg_selected(br, off, r.q_pos + i)", "!aj_pg_selected(br, 0, r.q_pos + i)"},
      {"queries one position late", "plan_paged.cuh", "r.q_pos = r.len_ok ? r.kv_len - r.queries : 0;",
       "r.q_pos = r.len_ok ? r.kv_len - r.queries + 1 : 0;"},
      {"each thread's items from its count, not the prefix", "plan_paged.cuh", "      sums[x] = run;\n", "\n"},
      {"no barrier before the prefix is read", "plan_paged.cuh", "    tiles[0] = run;  // the total, until the barrier below\n  }\n  aj_syncthreads();\n",
       "    tiles[0] = run;  // the total, until the barrier below\n  }\n"},
      {"a refused length's rows left as numbers", "fwd_paged.cuh", "  if (item.span_begin < 0) {", "  if (false) {"},
      {"a refused length attended anyway", "plan_paged.cuh", "  r.len_ok = r.kv_len >= r.queries && pages <= pp.table_stride;",
       "  r.len_ok = r.kv_len >= 0;"},
  });
}

}  // namespace attnjit::gputest

namespace attnjit::gputest {

TEST_CASE("paged attention on tensor cores: every deliberately broken kernel fails in the emulator", "[emu][paged][mutation]") {
  if (target() != Target::Emu) {
    WARN("SKIPPED: the mutations run in the emulator (ATTNJIT_GPU_TESTS_DEVICE=emu)");
    return;
  }
  const Pattern longnet = example_patterns().at(2).second, window = example_patterns().at(4).second;
  std::vector<PagedCase> cases;
  for (const Pattern* p : {&longnet, &window}) {
    for (int n = 0; n < 3; ++n) {
      PagedCase c = mixed("tensor-core mutation", *p, n == 1 ? DType::F16 : DType::BF16, 16, n == 0 ? 1 : 3);
      KernelRequest k;
      k.head_dim = int(c.head_dim), k.head_dim_v = int(c.head_dim_v), k.dtype = c.dtype, k.arch = c.arch;
      REQUIRE(choose_paged_path(k) == KernelPath::Sm80);
      c.fp8 = n == 2;
      if (p == &window && n == 0) c.bad_page_request = 5;  // a bad page, counted and skipped
      if (p == &longnet && n == 1) c.mode = PagedCase::Mode::DeviceRun;
      put_non_finite_values(c);
      cases.push_back(c);
    }
  }
  const char* f = "fwd_paged_tc.cuh";
  check_mutations(cases, {
      {"the running sum not rescaled", f, "      l[h] = l[h] * rescale[h] + sum[h];", "      l[h] = l[h] + sum[h];"},
      {"the output not rescaled", f, "      acc[j][0] *= rescale[0], acc[j][1] *= rescale[0];", "      acc[j][0] *= 1.0f, acc[j][1] *= rescale[0];"},
      {"the mask not asked on partial tiles", f, "        if (ok && !t.full) ok = aj_keys_allowed", "        if (false) ok = aj_keys_allowed"},
      {"a masked non-finite V multiplied by P = 0", f, "    if (aj_warp_any(bad)) {", "    if (false) {"},
      {"the warps' results merged with equal weights", f, "sh.m[w][r] == AJ_NEG_INF ? 0.0f : aj_ex2(sh.m[w][r] - top);",
       "sh.m[w][r] == AJ_NEG_INF ? 0.0f : 1.0f;"},
      {"fp8: K's scale not applied", f, "p.scale_log2 * (pp.k_scale ? pp.k_scale[kvh] : 1.0f);", "p.scale_log2;"},
      {"fp8: V's scale not applied", f, "const float v_scale = pp.v_scale ? pp.v_scale[kvh] : 1.0f;", "const float v_scale = 1.0f;"},
      {"every warp on the first 16 keys", f, "  const int k0 = warp * AJ_PT_KEYS;", "  const int k0 = 0;"},
      {"P's second register from the wrong columns", f, "    pa[1] = aj_pack2(s[0][2], s[0][3]);", "    pa[1] = aj_pack2(s[0][0], s[0][1]);"},
      {"Q's fragments from the wrong columns", f, "&sh.q[lane % 16][ks * 16 + (lane / 16) * 8]", "&sh.q[lane % 16][ks * 16]"},
      {"no barrier before the next tile overwrites K and V", f, "    aj_syncthreads();  // the previous tile is no longer read\n", "\n"},
      {"the copies not waited for", f, "  aj_cp_async_commit();\n  aj_cp_async_wait<0>();\n", "  aj_cp_async_commit();\n"},
      {"a counted bad page's keys attended", f, "c < t.count && !sh.skip[c];", "c < t.count;"},
  });
}

}  // namespace attnjit::gputest
