// The runtime's gradients and attention weights on the CPU device and the emulator: backward and
// backward_add against the reference gradients through any layout and dtype, weights against the
// reference's, and their bad inputs.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "attnjit/attnjit.hpp"
#include "attnjit/reference.hpp"
#include "compiler/support/half.hpp"
#include "tests/unit/host_tensor.hpp"
#include "tests/unit/random_patterns.hpp"

using namespace attnjit;
using attnjit::testing::CaseGenerator;
using attnjit::testing::HostTensor;
using attnjit::testing::random_tensor;
using attnjit::testing::rounded_to;

namespace {

// The generated kernels take head dims in multiples of 16 (4 on the SIMT path): the random case's
// head dims mapped onto 16, 32, 48, 64.
void emulated_head_dims(Shape& s) {
  s.head_dim = 16 * (1 + s.head_dim % 4);
  s.head_dim_v = 16 * (1 + s.head_dim_v % 4);
}

// Backward on `device` against the reference gradients, over random patterns, layouts and dtypes;
// and backward_add (D from the forward's O, onto accumulators that start random) likewise.
void check_backward(const Device& device, int cases, uint64_t seed, bool with_bf16) {
  CaseGenerator gen(seed);
  RuntimeOptions ro;
  ro.device = device;
  Runtime rt(ro);
  for (int n = 0; n < cases; ++n) {
    auto c = gen.next();
    Shape& s = c.shape;
    const DType dt = n % 3 == 2 && with_bf16 ? DType::BF16 : n % 2 ? DType::F16 : DType::F32;
    if (device.kind == DeviceKind::EMU) emulated_head_dims(s);
    const bool bhsd = n % 3 == 1;
    auto values = [&](int64_t seq, int64_t heads, int64_t d, uint64_t seed) {
      return rounded_to(dt, random_tensor(size_t(s.batch * seq * heads * d), seed));
    };
    const auto q = values(s.seq_q, s.heads_q, s.head_dim, 4 * n), k = values(s.seq_k, s.heads_kv, s.head_dim, 4 * n + 1),
               v = values(s.seq_k, s.heads_kv, s.head_dim_v, 4 * n + 2), dout = values(s.seq_q, s.heads_q, s.head_dim_v, 4 * n + 3);
    const DynamicLayout* dyn = c.dynamic ? &*c.dynamic : nullptr;
    INFO("case " << n << " " << to_string(dt) << (bhsd ? " bhsd" : " bshd") << "\n" << canonical_text(c.pattern));
    const ReferenceGradients want = reference_attention_backward(c.pattern, s, q.data(), k.data(), v.data(), dout.data(), dyn, 1);
    const std::vector<int64_t> qs{s.batch, s.seq_q, s.heads_q, s.head_dim}, ks{s.batch, s.seq_k, s.heads_kv, s.head_dim},
        vs{s.batch, s.seq_k, s.heads_kv, s.head_dim_v}, os{s.batch, s.seq_q, s.heads_q, s.head_dim_v};
    HostTensor tq(q, qs, dt, bhsd), tk(k, ks, dt, bhsd), tv(v, vs, dt, bhsd), tdo(dout, os, dt, bhsd);
    HostTensor to(std::vector<float>(dout.size()), os, dt, bhsd), tdq(q, qs, dt, bhsd), tdk(k, ks, dt, bhsd), tdv(v, vs, dt, bhsd);
    std::vector<float> lse(size_t(s.batch * s.heads_q * s.seq_q));
    const TensorView lv = TensorView::contiguous(lse.data(), DType::F32, {s.batch, s.heads_q, s.seq_q});
    Attention op = rt.prepare(c.pattern, Problem{s.batch, s.seq_q, s.seq_k, s.heads_q, s.heads_kv, s.head_dim, s.head_dim_v, dt, {}});
    ForwardOptions fo;
    fo.q_offset = s.q_offset, fo.k_offset = s.k_offset, fo.dynamic_layout = dyn;
    op.forward(tq.view, tk.view, tv.view, to.view, &lv, fo);
    op.backward(tq.view, tk.view, tv.view, to.view, lv, tdo.view, tdq.view, tdk.view, tdv.view, fo);
    // fp16/bf16: O (an input of backward) is rounded, and so are the stored gradients.
    const double tol = dt == DType::BF16 ? 3e-2 : dt == DType::F16 ? 1e-2 : 1e-4;
    auto compare = [&](const char* name, const HostTensor& got, const std::vector<double>& w, int64_t seq, int64_t heads, int64_t d) {
      size_t i = 0;
      for (int64_t b = 0; b < s.batch; ++b)
        for (int64_t x = 0; x < seq; ++x)
          for (int64_t h = 0; h < heads; ++h)
            for (int64_t e = 0; e < d; ++e, ++i) {
              INFO(name << "[" << b << "," << x << "," << h << "," << e << "]");
              REQUIRE(got.at(b, x, h, e) == Approx(w[i]).epsilon(tol).margin(tol));
            }
    };
    compare("dq", tdq, want.dq, s.seq_q, s.heads_q, s.head_dim);
    compare("dk", tdk, want.dk, s.seq_k, s.heads_kv, s.head_dim);
    compare("dv", tdv, want.dv, s.seq_k, s.heads_kv, s.head_dim_v);
    // backward_add: fp32 [B, S, H, D] accumulators that start random gain the same gradients.
    std::vector<float> delta(lse.size());
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t h = 0; h < s.heads_q; ++h)
        for (int64_t i = 0; i < s.seq_q; ++i) {
          float sum = 0.0f;
          for (int64_t e = 0; e < s.head_dim_v; ++e) sum += float(tdo.at(b, i, h, e)) * float(to.at(b, i, h, e));
          delta[size_t((b * s.heads_q + h) * s.seq_q + i)] = sum;
        }
    const std::vector<float> init[3] = {random_tensor(q.size(), 4 * n + 7), random_tensor(k.size(), 4 * n + 8),
                                        random_tensor(v.size(), 4 * n + 9)};
    std::vector<float> acc[3] = {init[0], init[1], init[2]};
    op.backward_add(tq.view, tk.view, tv.view, lv, tdo.view, TensorView::contiguous(delta.data(), DType::F32, {s.batch, s.heads_q, s.seq_q}),
                    TensorView::contiguous(acc[0].data(), DType::F32, qs), TensorView::contiguous(acc[1].data(), DType::F32, ks),
                    TensorView::contiguous(acc[2].data(), DType::F32, vs), fo);
    const double atol = dt == DType::F32 ? 1e-4 : 3e-2;
    for (int x = 0; x < 3; ++x) {
      const std::vector<double>& w = x == 0 ? want.dq : x == 1 ? want.dk : want.dv;
      for (size_t i = 0; i < w.size(); ++i) {
        INFO("backward_add, " << (x == 0 ? "dq" : x == 1 ? "dk" : "dv") << " element " << i);
        REQUIRE(double(acc[x][i]) - double(init[x][i]) == Approx(w[i]).epsilon(atol).margin(atol));
      }
    }
  }
}

}  // namespace

TEST_CASE("backward on the CPU device matches the reference gradients through any layout and dtype", "[runtime][grad][property]") {
  check_backward(Device::cpu(), 60, 5151, false);
}

TEST_CASE("backward on the emulator (the generated SIMT backward kernels) matches the reference gradients", "[emu][grad][property]") {
  check_backward(Device::emu(80), 40, 6161, true);
}

TEST_CASE("backward: every bad input is a clear error", "[runtime][grad][errors]") {
  Runtime rt;
  const Pattern p = PatternBuilder().branch(BranchSpec().full().causal()).build();
  Attention op = rt.prepare(p, Problem{1, 16, 16, 2, 1, 8, 8, DType::F32, {}});
  std::vector<float> q(16 * 2 * 8), k(16 * 8), v(16 * 8), o(16 * 2 * 8), dout(16 * 2 * 8), dq(q.size()), dk(k.size()),
      dv(v.size()), lse(2 * 16);
  auto t = [](std::vector<float>& x, std::vector<int64_t> shape) { return TensorView::contiguous(x.data(), DType::F32, std::move(shape)); };
  const TensorView Q = t(q, {1, 16, 2, 8}), K = t(k, {1, 16, 1, 8}), V = t(v, {1, 16, 1, 8}), O = t(o, {1, 16, 2, 8}),
                   L = t(lse, {1, 2, 16}), DO = t(dout, {1, 16, 2, 8}), DQ = t(dq, {1, 16, 2, 8}), DK = t(dk, {1, 16, 1, 8}),
                   DV = t(dv, {1, 16, 1, 8});
  op.forward(Q, K, V, O, &L);
  CHECK_NOTHROW(op.backward(Q, K, V, O, L, DO, DQ, DK, DV));
  CHECK_THROWS_WITH(op.backward(Q, K, V, O, L, t(dout, {1, 8, 2, 8}), DQ, DK, DV),
                    Catch::Contains("dout: has shape [1, 8, 2, 8] but the problem needs [1, 16, 2, 8]"));
  CHECK_THROWS_WITH(op.backward(Q, K, V, O, L, DO, DQ, t(dk, {1, 16, 2, 4}), DV), Catch::Contains("dk: has shape [1, 16, 2, 4]"));
  CHECK_THROWS_WITH(op.backward(Q, K, V, O, L, DO, Q, DK, DV), Catch::Contains("dq: overlaps q; each gradient needs its own memory"));
  CHECK_THROWS_WITH(op.backward(Q, K, V, O, L, DO, DQ, DK, DK), Catch::Contains("dk: overlaps dv"));
  TensorView dv_rows_on_one = DV;  // every key's row of dV on row 0
  dv_rows_on_one.strides[1] = 0;
  CHECK_THROWS_WITH(op.backward(Q, K, V, O, L, DO, DQ, DK, dv_rows_on_one), Catch::Contains("dv: is an output whose elements overlap"));
  CHECK_THROWS_WITH(op.backward(Q, K, V, O, t(lse, {1, 1, 16}), DO, DQ, DK, DV), Catch::Contains("lse: has shape [1, 1, 16]"));
  ForwardOptions bad;
  bad.q_offset = -1;
  CHECK_THROWS_WITH(op.backward(Q, K, V, O, L, DO, DQ, DK, DV, bad), Catch::Contains("offsets must be >= 0"));
  CHECK_THROWS_WITH(Attention().backward(Q, K, V, O, L, DO, DQ, DK, DV), Catch::Contains("is empty"));
  // backward_add: float32 contiguous accumulators and D, apart from the inputs; no dlse option.
  std::vector<float> delta(2 * 16), aq(q.size()), ak(k.size()), av(v.size());
  const TensorView D = t(delta, {1, 2, 16}), AQ = t(aq, {1, 16, 2, 8}), AK = t(ak, {1, 16, 1, 8}), AV = t(av, {1, 16, 1, 8});
  CHECK_NOTHROW(op.backward_add(Q, K, V, L, DO, D, AQ, AK, AV));
  CHECK_THROWS_WITH(op.backward_add(Q, K, V, L, DO, t(delta, {1, 16, 2}), AQ, AK, AV),
                    Catch::Contains("delta: has shape [1, 16, 2] but the problem needs [1, 2, 16]"));
  TensorView strided = AQ;
  strided.strides = {256, 8, 128, 1};  // [B, H, S, D] memory seen as [B, S, H, D]
  CHECK_THROWS_WITH(op.backward_add(Q, K, V, L, DO, D, strided, AK, AV),
                    Catch::Contains("dq_acc: must be contiguous float32 [1, 16, 2, 8] (strides [256, 8, 128, 1] given)"));
  std::vector<uint16_t> half_acc(q.size());
  CHECK_THROWS_WITH(op.backward_add(Q, K, V, L, DO, D, TensorView::contiguous(half_acc.data(), DType::F16, {1, 16, 2, 8}), AK, AV),
                    Catch::Contains("dq_acc"));
  CHECK_THROWS_WITH(op.backward_add(Q, K, V, L, DO, D, AQ, AK, AK), Catch::Contains("dk_acc: overlaps dv_acc"));
  CHECK_THROWS_WITH(op.backward_add(Q, K, V, L, DO, D, AQ, t(delta, {1, 16, 1, 2}), AV), Catch::Contains("dk_acc: has shape"));
  const TensorView dl = t(delta, {1, 2, 16});
  ForwardOptions with_dlse;
  with_dlse.dlse = &dl;
  CHECK_THROWS_WITH(op.backward_add(Q, K, V, L, DO, D, AQ, AK, AV, with_dlse),
                    Catch::Contains("dlse: is not an option of backward_add: subtract it from delta"));
  CHECK_THROWS_WITH(Attention().backward_add(Q, K, V, L, DO, D, AQ, AK, AV), Catch::Contains("is empty"));
  // The tensor-core kernels add into the accumulators 16 bytes at a time (bulk adds on Hopper): an
  // accumulator 4 bytes off is refused on the emulator before anything runs.
  RuntimeOptions emu;
  emu.device = Device::emu(80);
  Runtime ert(emu);
  Attention eop = ert.prepare(p, Problem{1, 16, 16, 2, 1, 16, 16, DType::BF16, {}});
  std::vector<uint16_t> hq(16 * 2 * 16), hk(16 * 16), hv(16 * 16), hdo(16 * 2 * 16);
  alignas(16) float aqe[16 * 2 * 16 + 4], ake[16 * 16], ave[16 * 16];
  auto h = [](std::vector<uint16_t>& x, std::vector<int64_t> shape) { return TensorView::contiguous(x.data(), DType::BF16, std::move(shape)); };
  CHECK_THROWS_WITH(eop.backward_add(h(hq, {1, 16, 2, 16}), h(hk, {1, 16, 1, 16}), h(hv, {1, 16, 1, 16}), L, h(hdo, {1, 16, 2, 16}), D,
                                     TensorView::contiguous(aqe + 1, DType::F32, {1, 16, 2, 16}),
                                     TensorView::contiguous(ake, DType::F32, {1, 16, 1, 16}),
                                     TensorView::contiguous(ave, DType::F32, {1, 16, 1, 16})),
                    Catch::Contains("dq_acc: data pointer is not 16-byte aligned"));
}

namespace {

// Attention::weights on `device` against the reference weights computed from the same (rounded)
// inputs, and O = W V against the device's own O, over random patterns, layouts and dtypes.
void check_weights(const Device& device, int cases, uint64_t seed) {
  CaseGenerator gen(seed);
  RuntimeOptions ro;
  ro.device = device;
  Runtime rt(ro);
  for (int n = 0; n < cases; ++n) {
    auto c = gen.next();
    Shape& s = c.shape;
    const DType dt = n % 3 == 2 ? DType::BF16 : n % 2 ? DType::F16 : DType::F32;
    if (device.kind == DeviceKind::EMU) emulated_head_dims(s);
    const bool bhsd = n % 3 == 1;
    auto values = [&](int64_t seq, int64_t heads, int64_t d, uint64_t sd) {
      return rounded_to(dt, random_tensor(size_t(s.batch * seq * heads * d), sd));
    };
    const auto q = values(s.seq_q, s.heads_q, s.head_dim, 3 * n), k = values(s.seq_k, s.heads_kv, s.head_dim, 3 * n + 1),
               v = values(s.seq_k, s.heads_kv, s.head_dim_v, 3 * n + 2);
    const DynamicLayout* dyn = c.dynamic ? &*c.dynamic : nullptr;
    INFO("case " << n << " " << to_string(dt) << (bhsd ? " bhsd" : " bshd") << " on " << device.describe() << "\n"
                 << canonical_text(c.pattern));
    const std::vector<double> want = reference_weights(c.pattern, s, q.data(), k.data(), dyn, 1);
    const std::vector<int64_t> qs{s.batch, s.seq_q, s.heads_q, s.head_dim}, ks{s.batch, s.seq_k, s.heads_kv, s.head_dim},
        vs{s.batch, s.seq_k, s.heads_kv, s.head_dim_v}, os{s.batch, s.seq_q, s.heads_q, s.head_dim_v};
    HostTensor tq(q, qs, dt, bhsd), tk(k, ks, dt, bhsd), tv(v, vs, dt, bhsd), to(std::vector<float>(size_t(s.batch * s.seq_q * s.heads_q * s.head_dim_v)), os, dt, bhsd);
    std::vector<float> lse(size_t(s.batch * s.heads_q * s.seq_q)), w(want.size(), -7.0f);
    const TensorView lv = TensorView::contiguous(lse.data(), DType::F32, {s.batch, s.heads_q, s.seq_q});
    const TensorView wv = TensorView::contiguous(w.data(), DType::F32, {s.batch, s.heads_q, s.seq_q, s.seq_k});
    Attention op = rt.prepare(c.pattern, Problem{s.batch, s.seq_q, s.seq_k, s.heads_q, s.heads_kv, s.head_dim, s.head_dim_v, dt, {}});
    ForwardOptions fo;
    fo.q_offset = s.q_offset, fo.k_offset = s.k_offset, fo.dynamic_layout = dyn;
    op.forward(tq.view, tk.view, tv.view, to.view, &lv, fo);
    op.weights(tq.view, tk.view, lv, wv, fo);
    for (size_t x = 0; x < want.size(); ++x) {
      INFO("w index " << x);
      REQUIRE(w[x] == Approx(want[x]).epsilon(1e-4).margin(1e-5));
    }
    // O = W V: the weights explain the device's own output (to O's storage precision).
    const double tol = dt == DType::BF16 ? 1e-2 : dt == DType::F16 ? 2e-3 : 1e-5;
    const int64_t group = s.heads_q / s.heads_kv;
    for (int64_t b = 0; b < s.batch; ++b)
      for (int64_t i = 0; i < s.seq_q; ++i)
        for (int64_t h = 0; h < s.heads_q; ++h)
          for (int64_t d = 0; d < s.head_dim_v; ++d) {
            double sum = 0.0;
            for (int64_t j = 0; j < s.seq_k; ++j) sum += double(w[size_t(((b * s.heads_q + h) * s.seq_q + i) * s.seq_k + j)]) * tv.at(b, j, h / group, d);
            INFO("O[" << b << "," << i << "," << h << "," << d << "]");
            REQUIRE(to.at(b, i, h, d) == Approx(sum).epsilon(tol).margin(tol));
          }
  }
}

}  // namespace

TEST_CASE("weights on the CPU device match the reference's and explain O through any layout and dtype", "[runtime][weights][property]") {
  check_weights(Device::cpu(), 60, 8181);
}

TEST_CASE("weights on the emulator (from the generated kernel's LSE) match the reference's and explain its O", "[emu][weights][property]") {
  check_weights(Device::emu(80), 25, 8282);
}

TEST_CASE("weights: every bad input is a clear error", "[runtime][weights][errors]") {
  Runtime rt;
  const Pattern p = PatternBuilder().branch(BranchSpec().full().causal()).build();
  Attention op = rt.prepare(p, Problem{1, 16, 12, 2, 1, 8, 8, DType::F32, {}});
  std::vector<float> q(16 * 2 * 8), k(12 * 8), v(12 * 8), o(16 * 2 * 8), lse(2 * 16), w(2 * 16 * 12);
  auto t = [](std::vector<float>& x, std::vector<int64_t> shape) { return TensorView::contiguous(x.data(), DType::F32, std::move(shape)); };
  const TensorView Q = t(q, {1, 16, 2, 8}), K = t(k, {1, 12, 1, 8}), V = t(v, {1, 12, 1, 8}), O = t(o, {1, 16, 2, 8}),
                   L = t(lse, {1, 2, 16}), W = t(w, {1, 2, 16, 12});
  op.forward(Q, K, V, O, &L);
  CHECK_NOTHROW(op.weights(Q, K, L, W));
  CHECK_THROWS_WITH(op.weights(Q, K, L, t(w, {1, 2, 12, 16})),
                    Catch::Contains("w: has shape [1, 2, 12, 16] but the problem needs [1, 2, 16, 12] ([batch, heads_q, seq_q, seq_k])"));
  TensorView transposed = W;
  std::swap(transposed.strides[2], transposed.strides[3]);
  transposed.strides[3] = 1;  // a padded row: contiguous last dimension, gaps between rows
  transposed.strides[2] = 13;
  CHECK_THROWS_WITH(op.weights(Q, K, L, transposed), Catch::Contains("w: must be contiguous [batch, heads_q, seq_q, seq_k]"));
  TensorView half = W;
  half.dtype = DType::F16;
  CHECK_THROWS_WITH(op.weights(Q, K, L, half), Catch::Contains("w: has dtype fp16 but must be fp32"));
  CHECK_THROWS_WITH(op.weights(Q, K, L, t(q, {1, 2, 16, 12})), Catch::Contains("w: overlaps q; give the weights their own memory"));
  CHECK_THROWS_WITH(op.weights(Q, K, t(lse, {1, 1, 16}), W), Catch::Contains("lse: has shape [1, 1, 16]"));
  CHECK_THROWS_WITH(Attention().weights(Q, K, L, W), Catch::Contains("is empty"));
}
