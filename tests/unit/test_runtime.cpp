// The runtime API on the CPU device: same answers as the reference through any strides and
// dtypes; every input check is a clear error; a CUDA device without a GPU says so.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "attnjit/attnjit.hpp"
#include "compiler/support/error.hpp"
#include "compiler/pattern/mask.hpp"
#include "runtime/backend.hpp"
#include "runtime/kernel_params.hpp"
#include "runtime/cuda/cuda_driver.hpp"
#include "runtime/input_checks.hpp"
#include "runtime/npy.hpp"
#include "attnjit/reference.hpp"
#include "tests/unit/host_tensor.hpp"
#include "tests/unit/random_patterns.hpp"

using namespace attnjit;
using attnjit::testing::CaseGenerator;
using attnjit::testing::HostTensor;
using attnjit::testing::random_tensor;
using attnjit::testing::rounded_to_half;


TEST_CASE("the CPU device matches the reference through any layout and dtype", "[runtime][property]") {
  CaseGenerator gen(9090);
  Runtime rt;  // the CPU device
  for (int n = 0; n < 120; ++n) {
    const auto c = gen.next();
    const Shape& s = c.shape;
    const DType dt = n % 3 == 0 ? DType::F16 : DType::F32;
    const bool bhsd = n % 2 == 1;
    auto qv = random_tensor(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim), 3 * n);
    auto kv = random_tensor(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim), 3 * n + 1);
    auto vv = random_tensor(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim_v), 3 * n + 2);
    if (dt == DType::F16) {  // the reference sees exactly the values the runtime reads
      qv = rounded_to_half(qv);
      kv = rounded_to_half(kv);
      vv = rounded_to_half(vv);
    }
    HostTensor q(qv, {s.batch, s.seq_q, s.heads_q, s.head_dim}, dt, bhsd);
    HostTensor k(kv, {s.batch, s.seq_k, s.heads_kv, s.head_dim}, dt, bhsd);
    HostTensor v(vv, {s.batch, s.seq_k, s.heads_kv, s.head_dim_v}, dt, bhsd);
    // O's layout varies apart from the inputs' (float32 inputs are read in place whatever their row
    // strides; a contiguous float32 O is written in place), and so does the LSE's.
    const bool o_bhsd = (n / 2) % 2 == 1, lse_strided = n % 5 == 2;
    HostTensor o(std::vector<float>(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim_v), NAN),
                 {s.batch, s.seq_q, s.heads_q, s.head_dim_v}, dt, o_bhsd);
    std::vector<float> lse(static_cast<size_t>(s.batch * s.heads_q * s.seq_q), NAN);
    TensorView lse_view = TensorView::contiguous(lse.data(), DType::F32, {s.batch, s.heads_q, s.seq_q});
    if (lse_strided) {  // each (b, h) row padded by 3
      lse.assign(static_cast<size_t>(s.batch * s.heads_q * (s.seq_q + 3)), NAN);
      lse_view.data = lse.data();
      lse_view.strides = {s.heads_q * (s.seq_q + 3), s.seq_q + 3, 1};
    }
    const auto lse_at = [&](int64_t b, int64_t h, int64_t i) {
      return lse[static_cast<size_t>(b * lse_view.strides[0] + h * lse_view.strides[1] + i * lse_view.strides[2])];
    };
    Problem pb{s.batch, s.seq_q, s.seq_k, s.heads_q, s.heads_kv, s.head_dim, s.head_dim_v, dt, {}};
    ForwardOptions fo;
    fo.q_offset = s.q_offset;
    fo.k_offset = s.k_offset;
    fo.dynamic_layout = c.dynamic ? &*c.dynamic : nullptr;
    INFO("case " << n << (bhsd ? " [B,H,S,D] inputs" : "") << (o_bhsd ? " [B,H,S,D] O" : "") << (lse_strided ? " strided LSE" : "")
                  << "\n" << canonical_text(c.pattern));
    rt.prepare(c.pattern, pb).forward(q.view, k.view, v.view, o.view, &lse_view, fo);
    const ReferenceOutput want = reference_attention(c.pattern, s, qv.data(), kv.data(), vv.data(), fo.dynamic_layout, 1);
    const double tol = dt == DType::F16 ? 2e-3 : 1e-5;  // fp16 output rounding
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t i = 0; i < s.seq_q; ++i)
        for (int64_t h = 0; h < s.heads_q; ++h) {
          const double wl = want.lse[static_cast<size_t>((b * s.heads_q + h) * s.seq_q + i)];
          const float gl = lse_at(b, h, i);
          if (std::isinf(wl)) REQUIRE(gl == -INFINITY); else REQUIRE(gl == Approx(wl).epsilon(1e-5).margin(1e-5));
          for (int64_t d = 0; d < s.head_dim_v; ++d) {
            const double w = want.o[static_cast<size_t>(((b * s.seq_q + i) * s.heads_q + h) * s.head_dim_v + d)];
            REQUIRE(o.at(b, i, h, d) == Approx(w).epsilon(tol).margin(tol));
          }
        }
  }
}

TEST_CASE("rows with work only: the CPU device writes the rows that attend and leaves the others", "[runtime][property]") {
  // O and the LSE start as sentinels; a row that attends nothing keeps them or holds (0, -inf),
  // every other row is the reference's. float32 (written in place) and float16 (converted back).
  CaseGenerator gen(9191);
  Runtime rt;
  int64_t kept_rows = 0, idle_rows = 0;
  for (int n = 0; n < 80; ++n) {
    const auto c = gen.next();
    const Shape& s = c.shape;
    const DType dt = n % 2 ? DType::F16 : DType::F32;
    auto qv = random_tensor(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim), 5 * n);
    auto kv = random_tensor(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim), 5 * n + 1);
    auto vv = random_tensor(static_cast<size_t>(s.batch * s.seq_k * s.heads_kv * s.head_dim_v), 5 * n + 2);
    if (dt == DType::F16) qv = rounded_to_half(qv), kv = rounded_to_half(kv), vv = rounded_to_half(vv);
    HostTensor q(qv, {s.batch, s.seq_q, s.heads_q, s.head_dim}, dt, false);
    HostTensor k(kv, {s.batch, s.seq_k, s.heads_kv, s.head_dim}, dt, false);
    HostTensor v(vv, {s.batch, s.seq_k, s.heads_kv, s.head_dim_v}, dt, false);
    const float sentinel = 7.0f, lse_sentinel = 3.0f;
    HostTensor o(std::vector<float>(static_cast<size_t>(s.batch * s.seq_q * s.heads_q * s.head_dim_v), sentinel),
                 {s.batch, s.seq_q, s.heads_q, s.head_dim_v}, dt, false);
    std::vector<float> lse(static_cast<size_t>(s.batch * s.heads_q * s.seq_q), lse_sentinel);
    const TensorView lse_view = TensorView::contiguous(lse.data(), DType::F32, {s.batch, s.heads_q, s.seq_q});
    ForwardOptions fo;
    fo.q_offset = s.q_offset;
    fo.k_offset = s.k_offset;
    fo.dynamic_layout = c.dynamic ? &*c.dynamic : nullptr;
    fo.rows_with_work_only = true;
    INFO("case " << n << " " << to_string(dt) << "\n" << canonical_text(c.pattern));
    rt.prepare(c.pattern, Problem{s.batch, s.seq_q, s.seq_k, s.heads_q, s.heads_kv, s.head_dim, s.head_dim_v, dt, {}})
        .forward(q.view, k.view, v.view, o.view, &lse_view, fo);
    const ReferenceOutput want = reference_attention(c.pattern, s, qv.data(), kv.data(), vv.data(), fo.dynamic_layout, 1);
    const double tol = dt == DType::F16 ? 2e-3 : 1e-5;
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t i = 0; i < s.seq_q; ++i)
        for (int64_t h = 0; h < s.heads_q; ++h) {
          INFO("b " << b << " i " << i << " h " << h);
          const double wl = want.lse[static_cast<size_t>((b * s.heads_q + h) * s.seq_q + i)];
          const float gl = lse[static_cast<size_t>((b * s.heads_q + h) * s.seq_q + i)];
          if (std::isinf(wl)) {
            ++idle_rows;
            const bool kept = gl == lse_sentinel;
            kept_rows += kept;
            REQUIRE((kept || gl == -INFINITY));
            for (int64_t d = 0; d < s.head_dim_v; ++d) REQUIRE(o.at(b, i, h, d) == (kept ? sentinel : 0.0f));
            continue;
          }
          REQUIRE(gl == Approx(wl).epsilon(1e-5).margin(1e-5));
          for (int64_t d = 0; d < s.head_dim_v; ++d) {
            const double w = want.o[static_cast<size_t>(((b * s.seq_q + i) * s.heads_q + h) * s.head_dim_v + d)];
            REQUIRE(o.at(b, i, h, d) == Approx(w).epsilon(tol).margin(tol));
          }
        }
  }
  // The cases hold rows without work, and the option leaves most of them alone.
  CHECK(idle_rows > 0);
  CHECK(kept_rows > idle_rows / 2);
}

TEST_CASE("the CPU device reads float32 inputs in place through any row strides", "[runtime]") {
  // K read with a zero batch stride (one K for every batch) and V out of a packed [B, S, 2, H, D]
  // tensor: the in-place forward must index each by its own strides.
  const Pattern p = PatternBuilder().causal().branch(BranchSpec().segment(8).dilation(2)).branch(BranchSpec().full()).build();
  const int64_t B = 2, S = 16, H = 2, D = 8;
  const std::vector<float> q = random_tensor(B * S * H * D, 11), k = random_tensor(S * H * D, 12),
                           v = random_tensor(B * S * H * D, 13);
  std::vector<float> k_batched, packed(static_cast<size_t>(B * S * 2 * H * D), NAN);
  for (int64_t b = 0; b < B; ++b) k_batched.insert(k_batched.end(), k.begin(), k.end());
  for (int64_t row = 0; row < B * S; ++row)  // (b, s): V's H * D values after H * D unused ones
    std::copy_n(v.begin() + row * H * D, H * D, packed.begin() + (row * 2 + 1) * H * D);
  TensorView kview = TensorView::contiguous(const_cast<float*>(k.data()), DType::F32, {B, S, H, D});
  kview.strides[0] = 0;
  TensorView vview = TensorView::contiguous(packed.data() + H * D, DType::F32, {B, S, H, D});
  vview.strides = {S * 2 * H * D, 2 * H * D, D, 1};
  std::vector<float> o(q.size(), NAN), lse(static_cast<size_t>(B * H * S), NAN);
  Runtime rt;
  Attention a = rt.prepare(p, Problem{B, S, S, H, H, D, D, DType::F32, {}});
  const TensorView lview = TensorView::contiguous(lse.data(), DType::F32, {B, H, S});
  a.forward(TensorView::contiguous(const_cast<float*>(q.data()), DType::F32, {B, S, H, D}), kview, vview,
            TensorView::contiguous(o.data(), DType::F32, {B, S, H, D}), &lview);
  Shape s;
  s.batch = B, s.seq_q = s.seq_k = S, s.heads_q = s.heads_kv = H, s.head_dim = s.head_dim_v = D;
  const ReferenceOutput want = reference_attention(p, s, q.data(), k_batched.data(), v.data());
  for (size_t i = 0; i < o.size(); ++i) REQUIRE(o[i] == Approx(want.o[i]).margin(1e-5));
  for (size_t i = 0; i < lse.size(); ++i) REQUIRE(lse[i] == Approx(want.lse[i]).margin(1e-5));

  // Batch 1 with strides that mean nothing on the size-1 dimension (7 for the batch, -3 for one
  // kv head): read in place as if they were 0.
  Runtime rt1;
  Attention one = rt1.prepare(p, Problem{1, S, S, H, 1, D, D, DType::F32, {}});
  TensorView q1 = TensorView::contiguous(const_cast<float*>(q.data()), DType::F32, {1, S, H, D});
  q1.strides[0] = 7;
  TensorView k1 = TensorView::contiguous(const_cast<float*>(k.data()), DType::F32, {1, S, 1, D});
  k1.strides = {7, H * D, -3, 1};  // head 0 of k's rows
  std::vector<float> o1(static_cast<size_t>(S * H * D), NAN);
  one.forward(q1, k1, k1, TensorView::contiguous(o1.data(), DType::F32, {1, S, H, D}));
  std::vector<float> k_head0;
  for (int64_t i = 0; i < S; ++i) k_head0.insert(k_head0.end(), k.begin() + i * H * D, k.begin() + i * H * D + D);
  Shape s1 = s;
  s1.batch = 1, s1.heads_kv = 1;
  const ReferenceOutput want1 = reference_attention(p, s1, q.data(), k_head0.data(), k_head0.data());
  for (size_t i = 0; i < o1.size(); ++i) REQUIRE(o1[i] == Approx(want1.o[i]).margin(1e-5));
}

TEST_CASE("attention() prepares once per pattern and problem", "[runtime]") {
  Runtime rt;
  const Pattern p = PatternBuilder().causal().branch(BranchSpec().full()).build();
  auto qv = random_tensor(2 * 8 * 2 * 4, 1);
  std::vector<float> o(qv.size());
  const TensorView t = TensorView::contiguous(qv.data(), DType::F32, {2, 8, 2, 4});
  const TensorView ov = TensorView::contiguous(o.data(), DType::F32, {2, 8, 2, 4});
  attention(rt, p, t, t, t, ov);
  // Row 0 attends only key 0: O equals V's row 0.
  for (int d = 0; d < 4; ++d) CHECK(o[static_cast<size_t>(d)] == Approx(qv[static_cast<size_t>(d)]));
  std::vector<float> o2(qv.size());
  attention(rt, p, t, t, t, TensorView::contiguous(o2.data(), DType::F32, {2, 8, 2, 4}));
  CHECK(o == o2);
  // The same prepared attention (shared state): its plan cache served both calls from the plan
  // prepare made.
  const Attention op = rt.prepared(p, Problem{2, 8, 8, 2, 2, 4, 4, DType::F32, {}});
  CHECK(op.plan_cache_stats().plans == 1);
  CHECK(op.plan_cache_stats().hits == 2);
  // Another problem is another attention, which no call has used yet.
  CHECK(rt.prepared(p, Problem{2, 16, 16, 2, 2, 4, 4, DType::F32, {}}).plan_cache_stats().hits == 0);
}

TEST_CASE("a prepared attention keeps its plans within a byte budget, least recently used dropped", "[runtime][plans]") {
  // A LongNet pattern over a chunk of a longer sequence: every q_offset is a plan of its own.
  const Pattern p = PatternBuilder().branch(BranchSpec().segment(32).dilation(1)).branch(BranchSpec().segment(128).dilation(4)).build();
  Problem pb;
  pb.batch = 1, pb.seq_q = 32, pb.seq_k = 256, pb.heads_q = pb.heads_kv = 4, pb.head_dim = pb.head_dim_v = 8;
  pb.dtype = DType::F32;
  const std::vector<float> q = random_tensor(32 * 4 * 8, 1), kv = random_tensor(256 * 4 * 8, 2);
  const TensorView qv = TensorView::contiguous(const_cast<float*>(q.data()), DType::F32, {1, 32, 4, 8});
  const TensorView kvv = TensorView::contiguous(const_cast<float*>(kv.data()), DType::F32, {1, 256, 4, 8});
  auto run = [&](Attention& a, int64_t q_offset) {
    std::vector<float> o(q.size());
    ForwardOptions fo;
    fo.q_offset = q_offset;
    a.forward(qv, kvv, kvv, TensorView::contiguous(o.data(), DType::F32, {1, 32, 4, 8}), nullptr, fo);
    Shape s = problem_shape(pb, q_offset, 0);
    const ReferenceOutput want = reference_attention(p, s, q.data(), kv.data(), kv.data());
    for (size_t i = 0; i < o.size(); ++i) REQUIRE(o[i] == Approx(want.o[i]).margin(1e-5));
  };
  RuntimeOptions unbounded;
  Runtime all(unbounded);
  Attention a = all.prepare(p, pb);
  int64_t one = 0;
  for (int64_t off : {32, 64, 96, 128, 160, 192, 224}) run(a, off);
  PlanCacheStats st = a.plan_cache_stats();
  CHECK(st.plans == 8);  // offsets 0 (made by prepare) and the seven above
  CHECK(st.misses == 8);
  CHECK(st.evictions == 0);
  one = st.bytes / st.plans;
  REQUIRE(one > 0);

  RuntimeOptions small;
  small.plan_cache_bytes = 3 * one;  // room for about three plans
  Runtime rt(small);
  Attention b = rt.prepare(p, pb);
  for (int64_t off : {32, 64, 96, 128, 160, 192, 224}) run(b, off);
  st = b.plan_cache_stats();
  CHECK(st.plans <= 3);
  CHECK(st.bytes <= small.plan_cache_bytes);
  CHECK(st.misses == 8);
  CHECK(st.evictions == st.misses - st.plans);
  run(b, 224);  // the most recent: a hit
  CHECK(b.plan_cache_stats().hits == 1);
  run(b, 32);  // dropped long ago: planned again, and right
  CHECK(b.plan_cache_stats().misses == 9);

  RuntimeOptions none;
  none.plan_cache_bytes = 0;  // keeps only the plan in use
  Runtime rt0(none);
  Attention c = rt0.prepare(p, pb);
  for (int64_t off : {32, 64, 32}) run(c, off);
  st = c.plan_cache_stats();
  CHECK(st.plans == 1);
  CHECK(st.misses == 4);
  CHECK(st.evictions == 3);
}

namespace {

// A backend that runs nothing: it says whether the call's stream is capturing (`capturing`), marks
// the plans of captured calls as a CUDA device does, and counts plan tables freed.
struct GraphBackend final : Backend {
  bool capturing_now = false;
  std::shared_ptr<int> freed = std::make_shared<int>(0);
  struct Tables {
    std::shared_ptr<int> freed;
    ~Tables() { ++*freed; }
  };
  void upload(PlanEntry& e, const DynamicLayout*) override {
    auto t = std::make_shared<Tables>();
    t->freed = freed;
    e.device_state = t;
  }
  bool capturing(const ForwardOptions&) const override { return capturing_now; }
  void forward(const PlanEntry& e, const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView*,
               const ForwardOptions&) override {
    if (capturing_now) e.in_graph = true;
  }
  void backward(const PlanEntry&, const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                const TensorView&, const TensorView&, const TensorView&, const TensorView&, const ForwardOptions&,
                const GradientSink*) override {}
  std::string kernel_name() const override { return "graph_backend"; }
  TileConfig tiles() const override { return TileConfig{16, 16}; }
  int alignment() const override { return 4; }
};

}  // namespace

// The plan cache's rules for CUDA graphs, on the host: a plan a captured call ran is never dropped,
// whatever the budget; plans dropped by a call being captured are freed (freeing waits for the
// device) only by the next call that is not.
TEST_CASE("plans a CUDA graph reads stay and plans dropped during a capture are freed after it", "[runtime][plans][graph]") {
  PreparedState st;
  st.pattern = PatternBuilder().branch(BranchSpec().segment(32).dilation(1)).branch(BranchSpec().segment(128).dilation(4)).build();
  st.problem.batch = 1, st.problem.seq_q = 32, st.problem.seq_k = 256, st.problem.heads_q = st.problem.heads_kv = 2;
  st.problem.head_dim = st.problem.head_dim_v = 8, st.problem.dtype = DType::F32;
  st.period = translation_period(st.pattern);
  st.plan_budget = 0;  // only the plan in use, and plans in graphs
  auto backend = std::make_unique<GraphBackend>();
  GraphBackend& b = *backend;
  st.backend = std::move(backend);
  auto call = [&](int64_t q_offset) {
    ForwardOptions o;
    o.q_offset = q_offset;
    const std::shared_ptr<PlanEntry> e = plan_for(st, o);
    st.backend->forward(*e, {}, {}, {}, {}, nullptr, o);
  };
  call(0);
  b.capturing_now = true;
  call(32);  // drops offset 0's plan, but must not free it now
  CHECK(st.plan_stats.evictions == 1);
  CHECK(st.retired.size() == 1);
  CHECK(*b.freed == 0);
  call(64);  // still capturing: offset 32's plan is in the graph, so nothing is dropped
  CHECK(st.plan_stats.evictions == 1);
  b.capturing_now = false;
  call(64);  // a hit, not captured: frees the plan the capture dropped
  CHECK(st.plan_stats.hits == 1);
  CHECK(st.retired.empty());
  CHECK(*b.freed == 1);
  for (int64_t off : {96, 128, 160, 192}) call(off);
  CHECK(st.plans.size() == 3);  // the two plans in graphs (32 and 64) and the call's own
  CHECK(st.plan_stats.evictions == 4);  // 0, 96, 128, 160
  CHECK(*b.freed == 4);
  call(32);  // a plan in a graph is still there
  CHECK(st.plan_stats.hits == 2);
}

namespace {

// Offsets a pattern cannot tell apart (translation_period 64 here: segments 32 and 64, a local
// layout of 16-row blocks, causal) share one plan, and each call still runs at its own positions:
// outputs and gradients against the reference at the call's offsets, plan counts from
// plan_cache_stats.
void check_shared_plans(const Device& device, DType dt, double tolerance) {
  const Pattern p = PatternBuilder()
                        .causal()
                        .branch(BranchSpec().segment(32).dilation(1))
                        .branch(BranchSpec().segment(64).dilation(2))
                        .branch(BranchSpec().full().layout(layouts::local(1, 16, 16)))
                        .build();
  REQUIRE(translation_period(p) == 64);
  Problem pb;
  pb.batch = 1, pb.seq_q = pb.seq_k = 48, pb.heads_q = pb.heads_kv = 2, pb.head_dim = pb.head_dim_v = 32;
  pb.dtype = dt;
  const std::vector<int64_t> shape{1, 48, 2, 32};
  std::vector<float> q = random_tensor(48 * 2 * 32, 11), k = random_tensor(48 * 2 * 32, 12), v = random_tensor(48 * 2 * 32, 13);
  if (dt != DType::F32) q = rounded_to_half(q), k = rounded_to_half(k), v = rounded_to_half(v);
  const HostTensor qt(q, shape, dt, false), kt(k, shape, dt, false), vt(v, shape, dt, false);
  RuntimeOptions ro;
  ro.device = device;
  Runtime rt(ro);
  Attention a = rt.prepare(p, pb);  // plans offsets (0, 0)
  std::vector<float> dout = random_tensor(48 * 2 * 32, 14);
  if (dt != DType::F32) dout = rounded_to_half(dout);
  const HostTensor dot(dout, shape, dt, false);
  auto run = [&](int64_t q_offset, int64_t k_offset) {
    INFO("q_offset " << q_offset << " k_offset " << k_offset);
    std::vector<float> zeros(q.size(), 0.0f), lse(2 * 48);
    HostTensor ot(zeros, shape, dt, false), dqt(zeros, shape, dt, false), dkt(zeros, shape, dt, false), dvt(zeros, shape, dt, false);
    const TensorView lv = TensorView::contiguous(lse.data(), DType::F32, {1, 2, 48});
    ForwardOptions fo;
    fo.q_offset = q_offset, fo.k_offset = k_offset;
    a.forward(qt.view, kt.view, vt.view, ot.view, &lv, fo);
    a.backward(qt.view, kt.view, vt.view, ot.view, lv, dot.view, dqt.view, dkt.view, dvt.view, fo);
    const Shape at = problem_shape(pb, q_offset, k_offset);
    const ReferenceOutput want = reference_attention(p, at, q.data(), k.data(), v.data());
    const ReferenceGradients grads = reference_attention_backward(p, at, q.data(), k.data(), v.data(), dout.data());
    size_t n = 0;
    for (int64_t s = 0; s < 48; ++s)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t d = 0; d < 32; ++d, ++n) {
          REQUIRE(ot.at(0, s, h, d) == Approx(want.o[n]).margin(tolerance));
          REQUIRE(dqt.at(0, s, h, d) == Approx(grads.dq[n]).margin(4 * tolerance));
          REQUIRE(dkt.at(0, s, h, d) == Approx(grads.dk[n]).margin(4 * tolerance));
          REQUIRE(dvt.at(0, s, h, d) == Approx(grads.dv[n]).margin(4 * tolerance));
        }
  };
  run(64, 64);    // 0 mod 64, distance 0: the prepared plan
  run(128, 128);  // the same
  run(80, 64);    // 16 mod 64, distance 16: a plan of its own
  run(16, 0);     // the same class as (80, 64)
  run(0, 16);     // distance -16: another
  const PlanCacheStats st = a.plan_cache_stats();
  CHECK(st.plans == 3);
  CHECK(st.misses == 3);
  CHECK(st.hits == 8);  // every backward finds its forward's plan
}

}  // namespace

TEST_CASE("offsets the mask cannot tell apart share one plan, each call at its own positions", "[runtime][plans]") {
  check_shared_plans(Device::cpu(), DType::F32, 1e-5);
}

TEST_CASE("offsets the mask cannot tell apart share one plan in the emulator (kernel arguments)", "[emu][plans]") {
  check_shared_plans(Device::emu(80), DType::F16, 2e-3);
}

TEST_CASE("every bad input is a clear error before anything runs", "[runtime][errors]") {
  Runtime rt;
  const Pattern p = PatternBuilder().branch(BranchSpec().full()).build();
  const Problem pb{1, 8, 8, 2, 1, 16, 16, DType::F32, {}};
  Attention op = rt.prepare(p, pb);
  std::vector<float> q(8 * 2 * 16), k(8 * 16), v(8 * 16), o(8 * 2 * 16), lse(2 * 8);
  auto Q = TensorView::contiguous(q.data(), DType::F32, {1, 8, 2, 16});
  auto K = TensorView::contiguous(k.data(), DType::F32, {1, 8, 1, 16});
  auto V = TensorView::contiguous(v.data(), DType::F32, {1, 8, 1, 16});
  auto O = TensorView::contiguous(o.data(), DType::F32, {1, 8, 2, 16});
  auto L = TensorView::contiguous(lse.data(), DType::F32, {1, 2, 8});
  CHECK_NOTHROW(op.forward(Q, K, V, O, &L));

  auto bad = [&](auto mutate, const std::string& words) {
    TensorView q2 = Q, k2 = K, v2 = V, o2 = O, l2 = L;
    mutate(q2, k2, v2, o2, l2);
    CHECK_THROWS_WITH(op.forward(q2, k2, v2, o2, &l2), Catch::Contains(words));
  };
  bad([](TensorView& q2, auto&, auto&, auto&, auto&) { q2.shape[1] = 7; }, "q: has shape [1, 7, 2, 16] but the problem needs [1, 8, 2, 16]");
  bad([](auto&, TensorView& k2, auto&, auto&, auto&) { k2.shape[3] = 8; }, "k: has shape");
  bad([](auto&, auto&, TensorView& v2, auto&, auto&) { v2.dtype = DType::F16; }, "v: has dtype fp16 but must be fp32");
  bad([](TensorView& q2, auto&, auto&, auto&, auto&) { q2.strides[3] = 2; }, "q: last dimension has stride 2");
  bad([](TensorView& q2, auto&, auto&, auto&, auto&) { q2.data = nullptr; }, "q: is a null pointer");
  bad([](TensorView& q2, auto&, auto&, TensorView& o2, auto&) { o2.data = q2.data; }, "o: overlaps an input");
  bad([](auto&, auto&, auto&, auto&, TensorView& l2) { l2.shape = {1, 8, 2}; }, "lse: has shape [1, 8, 2]");
  bad([](auto&, auto&, auto&, auto&, TensorView& l2) { l2.strides.pop_back(); }, "lse: has 2 strides for 3 dimensions");
  // An output whose indices share elements: every row of o on row 0 (a stride 0), heads laid over
  // the head dim, the LSE's heads on one row. Each would be written by several threads at once.
  bad([](auto&, auto&, auto&, TensorView& o2, auto&) { o2.strides[1] = 0; }, "o: is an output whose elements overlap: dimension 1 (size 8, stride 0)");
  bad([](auto&, auto&, auto&, TensorView& o2, auto&) { o2.strides[2] = 1; }, "o: is an output whose elements overlap");
  bad([](auto&, auto&, auto&, auto&, TensorView& l2) { l2.strides[1] = 0; }, "lse: is an output whose elements overlap: dimension 1");
  // Strides past any memory: the extent's arithmetic would wrap (before, the kernels read wrapped
  // addresses and forward returned).
  bad([](TensorView& q2, auto&, auto&, auto&, auto&) { q2.strides[1] = INT64_MAX / 2; }, "q: strides [256, 4611686018427387903, 16, 1] over shape [1, 8, 2, 16] reach more than 2^56 bytes");
  bad([](auto&, TensorView& k2, auto&, auto&, auto&) { k2.strides[1] = int64_t{1} << 60; }, "k: strides");
  // A permuted or padded layout of o is no overlap: [batch, heads, seq, dim] storage, rows padded.
  {
    std::vector<float> wide(2 * 8 * 24);
    TensorView o2 = O;
    o2.data = wide.data();
    o2.strides = {2 * 8 * 24, 24, 8 * 24, 1};
    CHECK_NOTHROW(op.forward(Q, K, V, o2, &L));
  }

  // Alignment the tensor-core kernel needs (checked the same way on a GPU).
  auto misaligned = Q;
  misaligned.data = reinterpret_cast<char*>(q.data()) + 4;
  CHECK_THROWS_WITH(check_forward_inputs(pb, misaligned, K, V, O, &L, 16), Catch::Contains("q: data pointer is not 16-byte aligned"));
  auto odd_stride = Q;
  odd_stride.strides = {8 * 2 * 18, 2 * 18, 18, 1};
  CHECK_THROWS_WITH(check_forward_inputs(pb, odd_stride, K, V, O, &L, 16), Catch::Contains("q: stride of dimension 2 (18 elements) is not a multiple of 16 bytes"));
  // A size-1 dimension's stride is never used: any value passes (PyTorch gives them odd ones).
  auto size1 = K;  // [1, 8, 1, 16]: batch and heads_kv have size 1
  size1.strides = {7, 16, -3, 1};
  CHECK_NOTHROW(check_forward_inputs(pb, Q, size1, V, O, &L, 16));
  size1.strides[1] = 18;  // the sequence dimension (size 8) is still checked
  CHECK_THROWS_WITH(check_forward_inputs(pb, Q, size1, V, O, &L, 16), Catch::Contains("k: stride of dimension 1 (18 elements)"));
  // O is stored in 16-byte chunks on the tensor-core path: the inputs' alignment; the LSE float by float.
  auto odd_lse = L;
  odd_lse.data = reinterpret_cast<char*>(lse.data()) + 2;
  CHECK_THROWS_WITH(check_forward_inputs(pb, Q, K, V, O, &odd_lse, 16), Catch::Contains("lse: data pointer is not 4-byte aligned"));
  auto odd_o = O;
  odd_o.data = reinterpret_cast<char*>(o.data()) + 1;
  CHECK_THROWS_WITH(check_forward_inputs(pb, Q, K, V, odd_o, &L, 16), Catch::Contains("o: data pointer is not 16-byte aligned"));
  auto o_plus_8 = O;  // element-aligned, not 16-byte aligned
  o_plus_8.data = reinterpret_cast<char*>(o.data()) + 8;
  CHECK_THROWS_WITH(check_forward_inputs(pb, Q, K, V, o_plus_8, &L, 16), Catch::Contains("o: data pointer is not 16-byte aligned"));
  auto o_odd_stride = O;  // [1, 8, 2, 16] with head rows 18 elements apart
  o_odd_stride.strides = {8 * 2 * 18, 2 * 18, 18, 1};
  CHECK_THROWS_WITH(check_forward_inputs(pb, Q, K, V, o_odd_stride, &L, 16), Catch::Contains("o: stride of dimension 2 (18 elements) is not a multiple of 16 bytes"));

  CHECK_THROWS_WITH(rt.prepare(p, Problem{1, 0, 8, 2, 1, 16, 16, DType::F32, {}}), Catch::Contains("problem.seq_q: must be at least 1"));
  CHECK_THROWS_WITH(rt.prepare(p, Problem{1, 8, 8, 3, 2, 16, 16, DType::F32, {}}), Catch::Contains("problem.heads_kv: 2 does not divide"));
  RuntimeOptions bad_blocks;
  bad_blocks.persistent_blocks = -2;
  CHECK_THROWS_WITH(Runtime(bad_blocks).prepare(p, pb),
                    Catch::Contains("RuntimeOptions.persistent_blocks: -2 is not a block count; use -1 (one per SM)"));
  // Values that name nothing (before: a device kind past the enum had no backend and crashed
  // prepare; a negative cap other than -1 was taken for the knob's).
  RuntimeOptions bad_kind;
  bad_kind.device.kind = static_cast<DeviceKind>(9);
  CHECK_THROWS_WITH(Runtime(bad_kind), Catch::Contains("RuntimeOptions.device.kind: 9 is no device kind"));
  // An emulated arch no GPU has (before: compiled for sm_99 and failed deep in NVRTC, or ran an
  // arch nobody can check against), sm_XXa other than sm_90a, a negative CUDA ordinal.
  CHECK_THROWS_WITH(Runtime({.device = Device::emu(99)}),
                    Catch::Contains("RuntimeOptions.device: Device::emu(99): no GPU has sm_99, so the emulator cannot model it; "
                                    "use one of sm_60") && Catch::Contains("sm_90a"));
  CHECK_THROWS_WITH(Runtime({.device = Device::emu(80, true)}),
                    Catch::Contains("Device::emu(80, arch_specific): attnjit has arch-specific kernels for sm_90a only"));
  CHECK_THROWS_WITH(Runtime({.device = Device::cuda(-1)}), Catch::Contains("Device::cuda(-1): a CUDA device ordinal is 0 or more"));
  CHECK_NOTHROW(Runtime({.device = Device::emu(90, true)}));
  CHECK_NOTHROW(Runtime({.device = Device::emu(75)}));
  RuntimeOptions bad_cap;
  bad_cap.plan_cache_bytes = -5;
  CHECK_THROWS_WITH(Runtime(bad_cap), Catch::Contains("RuntimeOptions.plan_cache_bytes: -5 is negative; use -1"));
  bad_cap.plan_cache_bytes = -1;
  bad_cap.random_in_kernel_above = -7;
  CHECK_THROWS_WITH(Runtime(bad_cap), Catch::Contains("RuntimeOptions.random_in_kernel_above: -7 is negative"));
  Problem bad_dtype = pb;
  bad_dtype.dtype = static_cast<DType>(77);
  CHECK_THROWS_WITH(rt.prepare(p, bad_dtype), Catch::Contains("problem.dtype: 77 is no dtype"));
  ForwardOptions neg;
  neg.q_offset = -1;
  CHECK_THROWS_WITH(op.forward(Q, K, V, O, &L, neg), Catch::Contains("offsets must be >= 0"));
  const Pattern dyn = PatternBuilder().branch(BranchSpec().full().layout(layouts::dynamic(4, 4))).build();
  CHECK_THROWS_WITH(rt.prepare(dyn, pb).forward(Q, K, V, O, &L), Catch::Contains("pass its CSR table"));
}

TEST_CASE("a device dynamic table: the answer of its sanitised host table, problems counted, bad inputs clear errors", "[runtime][dynamic][errors]") {
  Runtime rt;
  const Pattern p = PatternBuilder().branch(BranchSpec().full().layout(layouts::dynamic(4, 4))).build();
  const Problem pb{1, 8, 8, 2, 1, 16, 16, DType::F32, {}};  // 2 query blocks per head, 2 key blocks
  Attention op = rt.prepare(p, pb);
  const std::vector<float> q = random_tensor(8 * 2 * 16, 1), k = random_tensor(8 * 16, 2), v = random_tensor(8 * 16, 3);
  std::vector<float> o(8 * 2 * 16), o_host(8 * 2 * 16), lse(2 * 8);
  auto Q = TensorView::contiguous(const_cast<float*>(q.data()), DType::F32, {1, 8, 2, 16});
  auto K = TensorView::contiguous(const_cast<float*>(k.data()), DType::F32, {1, 8, 1, 16});
  auto V = TensorView::contiguous(const_cast<float*>(v.data()), DType::F32, {1, 8, 1, 16});
  auto O = TensorView::contiguous(o.data(), DType::F32, {1, 8, 2, 16});
  auto OH = TensorView::contiguous(o_host.data(), DType::F32, {1, 8, 2, 16});
  auto L = TensorView::contiguous(lse.data(), DType::F32, {1, 2, 8});

  // One table for both heads; row 1 repeats block 0 and names block 5 of 2: two problems.
  const std::vector<int64_t> offsets{0, 1, 4};
  const std::vector<int32_t> cols{1, 0, 0, 5};
  int32_t errors = 0;
  DeviceDynamicLayout d;
  d.row_offsets = offsets.data(), d.col_indices = cols.data(), d.rows = 2, d.entries = 4, d.heads = 1, d.errors = &errors;
  ForwardOptions fo;
  fo.device_dynamic_layout = &d;
  REQUIRE_NOTHROW(op.forward(Q, K, V, O, &L, fo));
  CHECK(errors == 2);
  DynamicLayout host{1, {0, 1, 2}, {1, 0}};
  ForwardOptions fh;
  fh.dynamic_layout = &host;
  REQUIRE_NOTHROW(op.forward(Q, K, V, OH, nullptr, fh));
  CHECK(o == o_host);
  REQUIRE_NOTHROW(op.forward(Q, K, V, O, &L, fo));
  CHECK(errors == 4);  // added to, not overwritten

  auto bad = [&](auto mutate, const std::string& words) {
    DeviceDynamicLayout d2 = d;
    ForwardOptions f2 = fo;
    f2.device_dynamic_layout = &d2;
    mutate(d2, f2);
    CHECK_THROWS_WITH(op.forward(Q, K, V, O, &L, f2), Catch::Contains(words));
  };
  bad([](DeviceDynamicLayout& t, auto&) { t.heads = 3; }, "device_dynamic_layout.heads: is 3; give 1 (one table for every head) or heads_q (2)");
  bad([](DeviceDynamicLayout& t, auto&) { t.rows = 3; }, "device_dynamic_layout.rows: is 3; the table needs heads * query blocks = 1 * 2 rows");
  bad([](DeviceDynamicLayout& t, auto&) { t.heads = 2; }, "device_dynamic_layout.rows: is 2; the table needs heads * query blocks = 2 * 2 rows");
  bad([](DeviceDynamicLayout& t, auto&) { t.entries = -1; }, "device_dynamic_layout.entries: must be >= 0");
  bad([](DeviceDynamicLayout& t, auto&) { t.row_offsets = nullptr; }, "needs row_offsets (rows + 1 entries)");
  bad([](DeviceDynamicLayout& t, auto&) { t.col_indices = nullptr; }, "with entries > 0, col_indices");
  bad([&](auto&, ForwardOptions& f) { f.dynamic_layout = &host; }, "and ForwardOptions.dynamic_layout are both set");
  const std::vector<int64_t> cu{0, 4, 8};
  bad([&](auto&, ForwardOptions& f) { f.cu_seqlens = &cu; }, "packed documents with a dynamic layout are not supported yet");
  bad([&](auto&, ForwardOptions& f) { f.rows_with_work_only = true; }, "with ForwardOptions.rows_with_work_only is not supported");
  // An empty table is fine without column indices: nothing attends, every row is empty.
  const std::vector<int64_t> none{0, 0, 0};
  DeviceDynamicLayout empty{none.data(), nullptr, 2, 0, 1, nullptr};
  ForwardOptions fe;
  fe.device_dynamic_layout = &empty;
  REQUIRE_NOTHROW(op.forward(Q, K, V, O, &L, fe));
  for (float x : o) CHECK(x == 0.0f);

  // A pattern without a dynamic layout refuses the table.
  Attention dense = rt.prepare(PatternBuilder().branch(BranchSpec().full()).build(), pb);
  CHECK_THROWS_WITH(dense.forward(Q, K, V, O, &L, fo), Catch::Contains("was given, but the pattern has no \"dynamic\" layout"));
}

// A persistent forward's launch: one block per SM (-1) or the count asked for, never more blocks
// than work units (items x batch entries) and never none, all in x; otherwise a block per item
// with the batch in y and z. The request asks for the persistent kernel exactly when the choice
// is not 0.
TEST_CASE("persistent blocks: the grid a launch takes, and the kernel request", "[runtime]") {
  auto x = [](int64_t items, int64_t batch, int blocks, int64_t sms) {
    const LaunchGrid g = item_grid(items, batch, true, blocks, sms);
    CHECK(g.y == 1);
    CHECK(g.z == 1);
    return int64_t{g.x};
  };
  CHECK(x(2048, 1, -1, 132) == 132);
  CHECK(x(100, 1, -1, 132) == 100);
  CHECK(x(50, 2, -1, 132) == 100);
  CHECK(x(100, 1, 3, 132) == 3);
  CHECK(x(100, 1, 500, 132) == 100);
  CHECK(x(0, 1, -1, 132) == 1);
  CHECK(x(int64_t{1} << 20, (int64_t{1} << 11) - 1, -1, 132) == 132);  // under 2^31 units
  CHECK_THROWS_WITH(item_grid(int64_t{1} << 20, int64_t{1} << 11, true, -1, 132),  // 2^31: one more than fits
                    Catch::Contains("RuntimeOptions.persistent_blocks") && Catch::Contains("more than 2^31 - 1"));
  const LaunchGrid plain = item_grid(100, 70000, false, -1, 132);
  CHECK(plain.x == 100);
  CHECK(plain.y == batch_grid(70000).y);
  CHECK(plain.z == batch_grid(70000).z);
  KernelChoices c;
  CHECK_FALSE(forward_request(KernelRequest{}, {}, c).persistent);
  c.persistent_blocks = -1;
  CHECK(forward_request(KernelRequest{}, {}, c).persistent);
  c.persistent_blocks = 2;
  CHECK(forward_request(KernelRequest{}, {}, c).persistent);
}

TEST_CASE("a CUDA device on a machine without a GPU is a clear error", "[runtime][errors]") {
  std::string why;
  if (CudaDriver::available(&why)) {
    WARN("SKIPPED: this machine has a CUDA driver; the no-GPU error cannot be shown here");
    return;
  }
  RuntimeOptions options;
  options.device = Device::cuda(0);
  Runtime rt(options);
  const Pattern p = PatternBuilder().branch(BranchSpec().full()).build();
  CHECK_THROWS_WITH(rt.prepare(p, Problem{1, 8, 8, 1, 1, 64, 64, DType::BF16, {}}),
                    Catch::Contains("no CUDA driver (libcuda.so.1) on this machine: no GPU is available; use the CPU device"));
}
