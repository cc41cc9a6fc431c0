// FP8 inputs (fp8_e4m3 q, k, v with descale factors; bf16 or fp16 O): the CPU device (the plan
// executor) and the emulated SIMT kernel against the float64 reference on the quantised inputs,
// within the bound the arithmetic allows (docs/spec.md, "FP8 inputs"); the kernels' e4m3 helpers
// against the host's conversions; every refusal a clear error.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "attnjit/attnjit.hpp"
#include "attnjit/reference.hpp"
#include "compiler/codegen/codegen.hpp"
#include "compiler/codegen/templates.hpp"
#include "compiler/tune/autotune.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/plan/plan.hpp"
#include "compiler/support/half.hpp"
#include "compiler/support/knobs.hpp"
#include "emulator/emu_compiler.hpp"
#include "emulator/emu_module.hpp"
#include "runtime/cpu/plan_executor.hpp"
#include "tests/unit/random_patterns.hpp"
#include "tests/unit/template_mutation.hpp"
#include "tests/unit/test_support.hpp"

using namespace attnjit;
using attnjit::testing::CaseGenerator;

namespace {

// Runtime options on `device` (with `templates` where given).
RuntimeOptions options_on(Device device, std::shared_ptr<const TemplateSet> templates = nullptr) {
  RuntimeOptions o;
  o.device = device;
  o.templates = std::move(templates);
  return o;
}

// One FP8 call: codes, descales (per (batch, kv head), or one per tensor through zero strides),
// and what they stand for in float64 (code value x descale), the reference's inputs.
struct Fp8Call {
  Shape s;
  std::vector<uint8_t> q, k, v;
  std::vector<float> q_descale, k_descale, v_descale;  // [B, Hkv] (size 1: broadcast)
  std::vector<double> qd, kd, vd;                      // the values, [B, S, H, D]
  double max_v = 0;                                    // the largest |value| of v
};

// Values of spread `sigma` (normal), stored as codes of value / descale.
Fp8Call make_call(const Shape& s, uint64_t seed, bool per_head, float sigma = 2.0f) {
  Fp8Call c;
  c.s = s;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> scale(0.25f, 4.0f);
  const size_t n_scales = per_head ? size_t(s.batch * s.heads_kv) : 1;
  for (auto* d : {&c.q_descale, &c.k_descale, &c.v_descale}) {
    d->resize(n_scales);
    for (float& x : *d) x = scale(rng);
  }
  std::normal_distribution<float> value(0.0f, sigma);
  auto fill = [&](std::vector<uint8_t>& codes, std::vector<double>& values, const std::vector<float>& ds, int64_t seq,
                  int64_t heads, int64_t dim) {
    const size_t n = size_t(s.batch * seq * heads * dim);
    codes.resize(n);
    values.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t b = int64_t(i) / (seq * heads * dim), h = int64_t(i) / dim % heads;
      const int64_t kvh = h / (heads / s.heads_kv);
      const float f = ds.size() == 1 ? ds[0] : ds[size_t(b * s.heads_kv + kvh)];
      codes[i] = float_to_e4m3(value(rng) / f);
      values[i] = double(e4m3_to_float(codes[i])) * f;
    }
  };
  fill(c.q, c.qd, c.q_descale, s.seq_q, s.heads_q, s.head_dim);
  fill(c.k, c.kd, c.k_descale, s.seq_k, s.heads_kv, s.head_dim);
  fill(c.v, c.vd, c.v_descale, s.seq_k, s.heads_kv, s.head_dim_v);
  for (double x : c.vd) c.max_v = std::max(c.max_v, std::abs(x));
  return c;
}

TensorView descale_view(std::vector<float>& d, const Shape& s) {
  TensorView t = TensorView::contiguous(d.data(), DType::F32, {s.batch, s.heads_kv});
  if (d.size() == 1) t.strides = {0, 0};
  return t;
}

struct Fp8Result {
  std::vector<float> o, lse;
};

// The call on `rt`, O in `out` (bf16 or fp16); `wrong_v` multiplies the v descale the device is
// given (a deliberately wrong factor must fail the checks).
Fp8Result run(Runtime& rt, const Pattern& p, Fp8Call& c, DType out, float wrong_v = 1.0f) {
  const Shape& s = c.s;
  Problem pb{s.batch, s.seq_q, s.seq_k, s.heads_q, s.heads_kv, s.head_dim, s.head_dim_v, DType::E4M3, out};
  std::vector<uint16_t> o(size_t(s.batch * s.seq_q * s.heads_q * s.head_dim_v), 0xffff);
  Fp8Result r;
  r.lse.assign(size_t(s.batch * s.heads_q * s.seq_q), NAN);
  std::vector<float> vd = c.v_descale;
  for (float& x : vd) x *= wrong_v;
  TensorView qs = descale_view(c.q_descale, s), ks = descale_view(c.k_descale, s), vs = descale_view(vd, s);
  ForwardOptions fo;
  fo.q_offset = s.q_offset;
  fo.k_offset = s.k_offset;
  fo.q_descale = &qs, fo.k_descale = &ks, fo.v_descale = &vs;
  const TensorView lse = TensorView::contiguous(r.lse.data(), DType::F32, {s.batch, s.heads_q, s.seq_q});
  rt.prepare(p, pb).forward(TensorView::contiguous(c.q.data(), DType::E4M3, {s.batch, s.seq_q, s.heads_q, s.head_dim}),
                            TensorView::contiguous(c.k.data(), DType::E4M3, {s.batch, s.seq_k, s.heads_kv, s.head_dim}),
                            TensorView::contiguous(c.v.data(), DType::E4M3, {s.batch, s.seq_k, s.heads_kv, s.head_dim_v}),
                            TensorView::contiguous(o.data(), out, {s.batch, s.seq_q, s.heads_q, s.head_dim_v}), &lse, fo);
  r.o.resize(o.size());
  for (size_t i = 0; i < o.size(); ++i) r.o[i] = out == DType::BF16 ? bfloat16_to_float(o[i]) : half_to_float(o[i]);
  return r;
}

// The plan executor's FP8 arithmetic at a kernel's tiles (the SIMT kernel's default 32 x 32, the
// Hopper kernel's 128 x 128 or 64 x 128): the same tiles give the same running maxima, so the same
// P is rounded (other tiles round other multiples of it).
Fp8Result run_executor(const Pattern& p, const Fp8Call& c, TileConfig tiles = TileConfig{32, 32}, bool tensor_core_sums = false) {
  const Shape& s = c.s;
  const Plan plan = lower_to_plan(p, s, tiles);
  Fp8Arithmetic a;
  a.tensor_core_sums = tensor_core_sums;
  for (int64_t u = 0; u < s.batch * s.heads_kv; ++u) {
    auto at = [&](const std::vector<float>& d) { return d.size() == 1 ? d[0] : d[size_t(u)]; };
    a.qk.push_back(at(c.q_descale) * at(c.k_descale));
    a.v.push_back(at(c.v_descale));
  }
  auto values = [](const std::vector<uint8_t>& codes) {
    std::vector<float> f(codes.size());
    for (size_t i = 0; i < f.size(); ++i) f[i] = e4m3_to_float(codes[i]);
    return f;
  };
  const std::vector<float> q = values(c.q), k = values(c.k), v = values(c.v);
  ExecutorOutput out = execute_plan(plan, p, q.data(), k.data(), v.data(), nullptr, {.fp8 = &a});
  return Fp8Result{std::move(out.o), std::move(out.lse)};
}

// How far a result lies from the float64 reference on the quantised inputs, against the bound.
// O: P is rounded to e4m3 (relative error <= 2^-4 each, the row sums unrounded), so |O - O*| <=
// 2^-4 max|v| plus the output's rounding (2^-8 relative covers bf16's 2^-9) and fp32 slack; on
// average far less (the roundings are independent): the mean error must stay under 2^-8 max|v|.
// LSE: P's rounding does not reach it; the scores are fp32 dot products of exact products, except
// where Hopper's tensor core sums them (`tensor_core_sums`: the FP8 wgmma kernel, whose emulation
// truncates as the hardware does): there each score may move by 2^-13 of the step's largest term
// per k32 step and by the sum's own truncation, which the allowance 2^-10 of the row's largest
// sum of |q_d k_d| times the softmax scale covers (docs/spec.md, "FP8 inputs").
struct Fp8Check {
  bool within = true;
  std::string first_failure;
  double mean_err = 0;
};

// [B, H, S_q]: 2^-10 of each query row's largest sum over keys of |q_d k_d|, times the softmax scale.
std::vector<double> tensor_core_lse_slack(const Pattern& p, const Fp8Call& c) {
  const Shape& s = c.s;
  const double scale = softmax_scale(p, s);
  std::vector<double> out(size_t(s.batch * s.heads_q * s.seq_q), 0.0);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads_q; ++h) {
      const int64_t kvh = h / (s.heads_q / s.heads_kv);
      for (int64_t i = 0; i < s.seq_q; ++i) {
        double most = 0;
        for (int64_t j = 0; j < s.seq_k; ++j) {
          double sum = 0;
          for (int64_t d = 0; d < s.head_dim; ++d)
            sum += std::abs(c.qd[size_t(((b * s.seq_q + i) * s.heads_q + h) * s.head_dim + d)] *
                            c.kd[size_t(((b * s.seq_k + j) * s.heads_kv + kvh) * s.head_dim + d)]);
          most = std::max(most, sum);
        }
        out[size_t((b * s.heads_q + h) * s.seq_q + i)] = std::ldexp(most * scale, -10);
      }
    }
  return out;
}

Fp8Check check_against_reference(const Pattern& p, const Fp8Call& c, const Fp8Result& r, bool tensor_core_sums = false) {
  const Shape& s = c.s;
  const ReferenceOutput want = reference_attention(p, s, c.qd.data(), c.kd.data(), c.vd.data(), nullptr, 1);
  const std::vector<double> slack = tensor_core_sums ? tensor_core_lse_slack(p, c) : std::vector<double>(want.lse.size(), 0.0);
  Fp8Check out;
  const double bound = c.max_v / 16.0 + 1e-6;
  double sum = 0;
  for (size_t i = 0; i < want.o.size(); ++i) {
    const double err = std::abs(double(r.o[i]) - want.o[i]);
    sum += err;
    if (!(err <= bound + std::abs(want.o[i]) / 256.0) && out.within) {
      out.within = false;
      out.first_failure = "O[" + std::to_string(i) + "] = " + std::to_string(r.o[i]) + ", reference " + std::to_string(want.o[i]);
    }
  }
  out.mean_err = want.o.empty() ? 0 : sum / double(want.o.size());
  if (out.mean_err > c.max_v / 256.0 && out.within) {
    out.within = false;
    out.first_failure = "mean |O - reference| = " + std::to_string(out.mean_err) + " over max|v| / 256";
  }
  for (size_t i = 0; i < want.lse.size(); ++i) {
    const double w = want.lse[i], g = r.lse[i];
    const bool ok = std::isinf(w) ? g == -INFINITY : std::abs(g - w) <= 1e-4 * (1 + std::abs(w)) + slack[i];
    if (!ok && out.within) {
      out.within = false;
      out.first_failure = "LSE[" + std::to_string(i) + "] = " + std::to_string(g) + ", reference " + std::to_string(w);
    }
  }
  return out;
}

// Whether the kernel's output agrees with the executor's at the same tiles as the same arithmetic
// must: apart from fp32 orderings (the products' sums, ex2 against exp) they round the same P, so
// what is left is O's bf16 rounding (2^-9 relative; 2^-8 allowed) and a rare P that lies within an
// fp32 ulp or two of a midpoint between e4m3 values (2^-11 max|v| allowed).
bool devices_agree(const Fp8Call& c, const Fp8Result& a, const Fp8Result& b, std::string* failure = nullptr) {
  // A P within an ulp or two of a midpoint rounds either way (ex2.approx against exp differ by
  // ulps): about one probability in 2^17 does, so a few outputs may differ by that term (each still
  // within the reference's bound, checked apart); a defect moves many.
  size_t off = 0, first = 0;
  for (size_t i = 0; i < a.o.size(); ++i)
    if (!(std::abs(a.o[i] - b.o[i]) <= std::abs(b.o[i]) / 256 + c.max_v / 2048) && off++ == 0) first = i;
  if (off <= std::max<size_t>(2, a.o.size() / 2000)) return true;
  if (failure)
    *failure = std::to_string(off) + " of " + std::to_string(a.o.size()) + " outputs differ, the first O[" + std::to_string(first) +
               "]: " + std::to_string(a.o[first]) + " against " + std::to_string(b.o[first]);
  return false;
}

// A deliberately broken kernel: `from` replaced by `to` in template `file`.
struct Defect {
  const char *name, *file, *from, *to;
};

// Head dims the SIMT kernel takes: multiples of 4.
Shape simt_shape(Shape s) {
  s.head_dim = (s.head_dim + 3) / 4 * 4;
  s.head_dim_v = (s.head_dim_v + 3) / 4 * 4;
  return s;
}

}  // namespace

TEST_CASE("FP8 inputs on the CPU device are within the bound of the float64 reference", "[fp8][runtime][property]") {
  CaseGenerator gen(4848);
  Runtime rt;
  double worst_mean = 0;
  for (int n = 0; n < 60; ++n) {
    const auto g = gen.next();
    if (g.dynamic) continue;  // no table here: the FP8 path is the same for every mask
    Fp8Call c = make_call(g.shape, 100 + n, n % 2 == 0);
    const DType out = n % 3 == 0 ? DType::F16 : DType::BF16;
    INFO("case " << n << "\n" << canonical_text(g.pattern));
    const Fp8Check k = check_against_reference(g.pattern, c, run(rt, g.pattern, c, out));
    INFO(k.first_failure);
    REQUIRE(k.within);
    worst_mean = std::max(worst_mean, k.mean_err / std::max(c.max_v, 1e-30));
  }
  // P's rounding is there: the error is not the fp32 forward's.
  CHECK(worst_mean > 1e-4);
}

TEST_CASE("the emulated FP8 kernel is within the bound of the reference and agrees with the plan executor", "[fp8][emu]") {
  CaseGenerator gen(4949);
  Runtime emu(options_on(Device::emu(90, true)));
  for (int n = 0; n < 12; ++n) {
    auto g = gen.next();
    if (g.dynamic) continue;
    const Shape s = simt_shape(g.shape);
    Fp8Call c = make_call(s, 200 + n, n % 2 == 1);
    INFO("case " << n << "\n" << canonical_text(g.pattern));
    const Fp8Result e = run(emu, g.pattern, c, DType::BF16), h = run_executor(g.pattern, c);
    const Fp8Check k = check_against_reference(g.pattern, c, e);
    INFO(k.first_failure);
    REQUIRE(k.within);
    std::string failure;
    const bool agree = devices_agree(c, e, h, &failure);
    INFO(failure);
    REQUIRE(agree);
  }
}

TEST_CASE("a wrong descale fails the FP8 checks, on the CPU device and in the kernel", "[fp8][emu]") {
  const Pattern p = PatternBuilder().causal().branch(BranchSpec().segment(16).dilation(1)).branch(BranchSpec().segment(32).dilation(2)).build();
  Shape s;
  s.batch = 2, s.seq_q = s.seq_k = 64, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = 32;
  Runtime cpu, emu(options_on(Device::emu(80)));
  for (Runtime* rt : {&cpu, &emu}) {
    Fp8Call c = make_call(s, 7, true);
    CHECK(check_against_reference(p, c, run(*rt, p, c, DType::BF16)).within);
    CHECK_FALSE(check_against_reference(p, c, run(*rt, p, c, DType::BF16, 1.05f)).within);
    // A wrong q descale moves the LSE.
    Fp8Call bad = c;
    for (float& x : bad.q_descale) x *= 1.05f;
    CHECK_FALSE(check_against_reference(p, c, run(*rt, p, bad, DType::BF16)).within);
  }
}

TEST_CASE("deliberately broken FP8 kernels fail the checks in the emulator", "[fp8][emu][mutation]") {
  // Each defect in the SIMT kernel's FP8 arithmetic; the unmutated kernel passes the same check
  // (the test above). Wide dilated branches, so that P's rounding at small probabilities matters.
  const Pattern p = PatternBuilder().branch(BranchSpec().segment(32).dilation(1)).branch(BranchSpec().segment(64).dilation(2)).build();
  Shape s;
  s.batch = 2, s.seq_q = s.seq_k = 64, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = 16;
  const Defect defects[] = {
      {"P rounded without its 2^8 (small probabilities flushed)", "fwd_simt.cuh", "aj_round_e4m3(pr * 256.0f) * 0.00390625f", "aj_round_e4m3(pr)"},
      {"P rounded to e4m3 and its 2^8 kept", "fwd_simt.cuh", "aj_round_e4m3(pr * 256.0f) * 0.00390625f", "aj_round_e4m3(pr * 256.0f)"},
      {"the k descale read from q's factors", "common.cuh", "aj_descale(p, 0, b, kvh) * aj_descale(p, 1, b, kvh)",
       "aj_descale(p, 0, b, kvh) * aj_descale(p, 0, b, kvh)"},
      {"O without its v descale", "fwd_simt.cuh", "p.output_scale * aj_descale(p, 2, b, kvh)", "p.output_scale"},
      {"the descales of kv head 0 for every head", "common.cuh", "aj_descale(p, 0, b, kvh) * aj_descale(p, 1, b, kvh)",
       "aj_descale(p, 0, b, 0) * aj_descale(p, 1, b, 0)"},
      {"e4m3 codes decoded with the exponent bias of fp8 e5m2", "common.cuh", "((e + 120u) << 23)", "((e + 112u) << 23)"},
  };
  for (const Defect& d : defects) {
    INFO(d.name);
    auto t = attnjit::testing::mutated_templates(d.file, d.from, d.to);
    REQUIRE(t);
    Runtime emu(options_on(Device::emu(80), t));
    Fp8Call c = make_call(s, 21, true);
    const Fp8Result e = run(emu, p, c, DType::BF16);
    CHECK_FALSE((check_against_reference(p, c, e).within && devices_agree(c, e, run_executor(p, c))));
  }
  Fp8Call c = make_call(s, 21, true);
  Runtime emu(options_on(Device::emu(80)));
  const Fp8Result e = run(emu, p, c, DType::BF16);
  CHECK(check_against_reference(p, c, e).within);
  CHECK(devices_agree(c, e, run_executor(p, c)));
}

TEST_CASE("the plan executor rounds P to e4m3 only on FP8 arithmetic", "[fp8][executor]") {
  // The same values with and without Fp8Arithmetic: P's rounding must change O, and with factors
  // of 1 nothing else may.
  const Pattern p = PatternBuilder().branch(BranchSpec().full()).build();
  Shape s;
  s.batch = 1, s.seq_q = s.seq_k = 48, s.heads_q = s.heads_kv = 1, s.head_dim = s.head_dim_v = 16;
  const Fp8Call c = make_call(s, 9, false);
  std::vector<float> q(c.qd.begin(), c.qd.end()), k(c.kd.begin(), c.kd.end()), v(c.vd.begin(), c.vd.end());
  const Plan plan = lower_to_plan(p, s, TileConfig{16, 16});
  Fp8Arithmetic ones{{1.0f}, {1.0f}};
  const ExecutorOutput plain = execute_plan(plan, p, q.data(), k.data(), v.data());
  const ExecutorOutput fp8 = execute_plan(plan, p, q.data(), k.data(), v.data(), nullptr, {.fp8 = &ones});
  double diff = 0;
  for (size_t i = 0; i < plain.o.size(); ++i) diff = std::max(diff, double(std::abs(plain.o[i] - fp8.o[i])));
  CHECK(diff > 1e-4);
  CHECK(diff <= c.max_v / 16);
  for (size_t i = 0; i < plain.lse.size(); ++i) CHECK(plain.lse[i] == fp8.lse[i]);
}

TEST_CASE("NaN inputs stay NaN in the FP8 forward", "[fp8][emu]") {
  const Pattern p = PatternBuilder().causal().branch(BranchSpec().full()).build();
  Shape s;
  s.batch = 1, s.seq_q = s.seq_k = 24, s.heads_q = s.heads_kv = 1, s.head_dim = s.head_dim_v = 8;
  Runtime cpu, emu(options_on(Device::emu(80)));
  for (Runtime* rt : {&cpu, &emu}) {
    Fp8Call c = make_call(s, 11, false);
    c.q[5 * 8 + 3] = 0x7f;   // query row 5: a NaN code
    c.v[20 * 8 + 1] = 0xff;  // key 20's V: NaN (sign set); rows 20.. attend it
    const Fp8Result r = run(*rt, p, c, DType::BF16);
    for (int64_t i = 0; i < s.seq_q; ++i) {
      INFO("row " << i);
      CHECK(std::isnan(r.o[size_t(i * 8 + 1)]) == (i == 5 || i >= 20));
      CHECK(std::isnan(r.lse[size_t(i)]) == (i == 5));
    }
  }
}

TEST_CASE("FP8 calls that cannot run are refused by name", "[fp8][runtime]") {
  const Pattern p = PatternBuilder().branch(BranchSpec().full()).build();
  Runtime rt;
  Shape s;
  s.batch = 2, s.seq_q = s.seq_k = 8, s.heads_q = 2, s.heads_kv = 1, s.head_dim = s.head_dim_v = 8;
  Fp8Call c = make_call(s, 3, true);
  const Problem pb{2, 8, 8, 2, 1, 8, 8, DType::E4M3, {}};
  CHECK(pb.o_dtype() == DType::BF16);
  Attention a = rt.prepare(p, pb);
  std::vector<uint16_t> o(size_t(2 * 8 * 2 * 8));
  std::vector<float> lse(32), wrong(3, 1.0f);
  const TensorView qv = TensorView::contiguous(c.q.data(), DType::E4M3, {2, 8, 2, 8});
  const TensorView kv = TensorView::contiguous(c.k.data(), DType::E4M3, {2, 8, 1, 8});
  const TensorView vv = TensorView::contiguous(c.v.data(), DType::E4M3, {2, 8, 1, 8});
  const TensorView ov = TensorView::contiguous(o.data(), DType::BF16, {2, 8, 2, 8});
  TensorView qs = descale_view(c.q_descale, s), ks = descale_view(c.k_descale, s), vs = descale_view(c.v_descale, s);
  ForwardOptions fo;
  fo.q_descale = &qs, fo.k_descale = &ks;
  CHECK_THROWS_WITH(a.forward(qv, kv, vv, ov, nullptr, fo), Catch::Contains("v_descale: is missing"));
  TensorView bad = TensorView::contiguous(wrong.data(), DType::F32, {3, 1});
  fo.v_descale = &bad;
  CHECK_THROWS_WITH(a.forward(qv, kv, vv, ov, nullptr, fo), Catch::Contains("[batch, heads_kv]"));
  fo.v_descale = &vs;
  a.forward(qv, kv, vv, ov, nullptr, fo);  // the good call runs
  const TensorView of16 = TensorView::contiguous(o.data(), DType::F16, {2, 8, 2, 8});
  CHECK_THROWS_WITH(a.forward(qv, kv, vv, of16, nullptr, fo), Catch::Contains("o: has dtype fp16 but must be bf16"));
  const TensorView l = TensorView::contiguous(lse.data(), DType::F32, {2, 2, 8});
  CHECK_THROWS_WITH(a.backward(qv, kv, vv, ov, l, ov, ov, ov, ov), Catch::Contains("forward only"));
  std::vector<float> w(size_t(2 * 2 * 8 * 8));
  CHECK_THROWS_WITH(a.weights(qv, kv, l, TensorView::contiguous(w.data(), DType::F32, {2, 2, 8, 8})),
                    Catch::Contains("forward only"));
  // Output dtypes: bf16 or fp16 for FP8 inputs; none other than the inputs' elsewhere.
  CHECK_THROWS_WITH(rt.prepare(p, Problem{2, 8, 8, 2, 1, 8, 8, DType::E4M3, DType::F32}), Catch::Contains("bf16 or fp16"));
  CHECK_THROWS_WITH(rt.prepare(p, Problem{2, 8, 8, 2, 1, 8, 8, DType::BF16, DType::F16}),
                    Catch::Contains("only fp8_e4m3 inputs"));
  // Descales with other inputs are refused, not ignored.
  std::vector<uint16_t> b16(size_t(2 * 8 * 2 * 8));
  Attention bf = rt.prepare(p, Problem{2, 8, 8, 2, 1, 8, 8, DType::BF16, {}});
  const TensorView bq = TensorView::contiguous(b16.data(), DType::BF16, {2, 8, 2, 8});
  std::vector<uint16_t> bk(size_t(2 * 8 * 8)), bvv(size_t(2 * 8 * 8));
  CHECK_THROWS_WITH(bf.forward(bq, TensorView::contiguous(bk.data(), DType::BF16, {2, 8, 1, 8}),
                               TensorView::contiguous(bvv.data(), DType::BF16, {2, 8, 1, 8}), ov, nullptr, fo),
                    Catch::Contains("q_descale: is only for fp8_e4m3 inputs"));
}

TEST_CASE("the kernels' e4m3 decoding and rounding equal the host's conversions", "[fp8][emu]") {
  // Every code decoded; then the rounding at every midpoint between neighbouring non-negative
  // codes, a float either side of it, the codes themselves and random values, up to 448.
  std::vector<float> in;
  for (int c = 0; c < 0x7f; ++c) {
    const float a = e4m3_to_float(uint8_t(c)), b = e4m3_to_float(uint8_t(c + 1));
    const float mid = (a + b) / 2;  // exact: both have 4 significant bits
    in.insert(in.end(), {a, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)});
  }
  std::mt19937_64 rng(5);
  for (int n = 0; n < 4000; ++n) in.push_back(std::ldexp(std::uniform_real_distribution<float>(1, 2)(rng), int(rng() % 20) - 12));
  in.insert(in.end(), {0.0f, 1e-30f, std::numeric_limits<float>::denorm_min(), 448.0f, std::nanf("")});
  const int n = int(in.size());
  std::vector<float> out(in.size() + 256, -1.0f);
  const TemplateSet& t = TemplateSet::embedded();
  const std::string source =
      "#define AJ_HEAD_DIM 8\n#define AJ_HEAD_DIM_V 8\n#define AJ_TILE_Q 16\n#define AJ_TILE_K 16\n#define AJ_STAGES 1\n"
      "#define AJ_WARPS 1\n#define AJ_DTYPE 3\n#define AJ_OUT_DTYPE 2\n" +
      t.blocks() + t.text("kernel_abi.h") + t.text("common.cuh") +
      "extern \"C\" __global__ void e4m3_helpers(const float* in, float* out, int n) {\n"
      "  for (int i = aj_thread_idx(); i < n; i += 64) out[i] = aj_round_e4m3(in[i]);\n"
      "  for (int c = aj_thread_idx(); c < 256; c += 64) { const unsigned char code = (unsigned char)c; "
      "out[n + c] = aj_load(&code); }\n}\n";
  auto m = emu::load_emu_module(emu::compile_for_emulator({"e4m3_helpers", source, "sm_80", "", {}}, default_kernel_cache(), knobs()));
  const float* pin = in.data();
  float* pout = out.data();
  int count = n;
  void* args[] = {&pin, &pout, &count};
  emu::LaunchRequest r;
  r.block_threads = 64;
  r.args = args;
  r.buffers = {{"in", in.data(), in.size() * 4, 4, false}, {"out", out.data(), out.size() * 4, 4, true}};
  m->launch(r);
  for (int i = 0; i < n; ++i) {
    const float want = e4m3_to_float(float_to_e4m3(in[size_t(i)]));
    INFO("x = " << in[size_t(i)]);
    if (std::isnan(want)) CHECK(std::isnan(out[size_t(i)]));
    else CHECK(out[size_t(i)] == want);
  }
  for (int c = 0; c < 256; ++c) {
    const float want = e4m3_to_float(uint8_t(c)), got = out[size_t(n + c)];
    INFO("code " << c);
    if (std::isnan(want)) CHECK(std::isnan(got));
    else CHECK(std::memcmp(&want, &got, 4) == 0);
  }
}

namespace {

// The FP8 tensor-core kernels: where each runs (the emulated device), its key tile, its template,
// and whether its sums are the warpgroup MMA's reduced-precision ones (docs/spec.md, "FP8 inputs").
struct Fp8Kernel {
  const char* name;
  int arch;
  bool arch_specific;
  int tile_k;
  const char* file;
  bool wgmma_sums;
};
const Fp8Kernel kHopper{"the FP8 Hopper kernel (wgmma)", 90, true, 128, "fwd_sm90_fp8.cuh", true};
const Fp8Kernel kSm89{"the FP8 sm_89 kernel (mma.sync)", 89, false, 64, "fwd_sm89_fp8.cuh", false};
// Head dim 256 on a Hopper: the sm_89 kernel compiled for sm_90a (no wgmma swizzle has 256-byte rows).
const Fp8Kernel kSm89OnHopper{"the FP8 sm_89 kernel (mma.sync) on sm_90a", 90, true, 64, "fwd_sm89_fp8.cuh", false};

// An FP8 tensor-core kernel on `p` at `shape` with head dims `d` and `dv` (64, 128; 256 on the sm_89 kernel) and tiles
// `tile_q` x the kernel's: within the bound of the reference, and agreeing with the plan executor
// at the same tiles. Empty when both hold, else what failed.
std::string check_kernel(const Fp8Kernel& kernel, const Pattern& p, Shape s, uint64_t seed, int tile_q,
                         const std::shared_ptr<TemplateSet>& templates = nullptr, int d = 128, int dv = 128) {
  s.head_dim = d, s.head_dim_v = dv;
  RuntimeOptions ro = options_on(Device::emu(kernel.arch, kernel.arch_specific), templates);
  ro.config = KernelConfig{tile_q, kernel.tile_k, 0, 0};
  Runtime emu(ro);
  Fp8Call c = make_call(s, seed, seed % 2 == 0);
  const Fp8Result e = run(emu, p, c, seed % 3 == 0 ? DType::F16 : DType::BF16);
  const bool tensor_core_sums = kernel.wgmma_sums;
  const Fp8Check k = check_against_reference(p, c, e, tensor_core_sums);
  if (!k.within) return k.first_failure;
  std::string failure;
  if (!devices_agree(c, e, run_executor(p, c, TileConfig{tile_q, kernel.tile_k}, tensor_core_sums), &failure))
    return "against the executor: " + failure;
  return "";
}

// Every example at 200 tokens (GQA, per-head descales on even seeds) at tile_q 128 with head dim
// 128 and at 64 with head dim 64, then random patterns, tiles and head dims.
void check_examples_and_sweep(const Fp8Kernel& kernel, uint64_t seed) {
  int n = 0;
  for (const char* name : {"bigbird", "causal_local", "longnet", "seed_dilated", "sliding_window"}) {
    const Pattern pattern = load_spec_file(std::string(ATTNJIT_EXAMPLES_DIR) + "/" + name + ".json");
    Shape s;
    s.batch = 1, s.seq_q = s.seq_k = 200, s.heads_q = 4, s.heads_kv = 2;
    for (int tile_q : {128, 64}) {
      const int d = tile_q == 128 ? 128 : 64;
      INFO(kernel.name << ": " << name << ", tile " << tile_q << "x" << kernel.tile_k << ", head dim " << d);
      const std::string failure = check_kernel(kernel, pattern, s, seed + n++, tile_q, nullptr, d, d);
      INFO(failure);
      CHECK(failure.empty());
    }
  }
  CaseGenerator gen(seed);
  for (int i = 0; i < 10; ++i) {
    const auto g = gen.next();
    if (g.dynamic) continue;
    INFO(kernel.name << ": random case " << i << "\n" << canonical_text(g.pattern));
    const std::string failure =
        check_kernel(kernel, g.pattern, g.shape, seed + 100 + i, i % 2 ? 64 : 128, nullptr, i % 3 ? 128 : 64, i % 4 ? 128 : 64);
    INFO(failure);
    CHECK(failure.empty());
  }
}

// Each defect must fail check_kernel (or fault in the emulator) on a causal dilated pattern whose
// unmutated run passes; the dense branch's last rows visit 4 tiles of 128 keys (8 of 64), so every
// stage of the pipelines is reused. At head dim `d` (both q's and v's).
void check_defects_fail(const Fp8Kernel& kernel, const std::vector<Defect>& defects, int head_dim = 128) {
  const Pattern p = PatternBuilder().causal().branch(BranchSpec().segment(512).dilation(1)).branch(BranchSpec().segment(512).dilation(2)).build();
  Shape s;
  s.batch = 1, s.seq_q = s.seq_k = 512, s.heads_q = 2, s.heads_kv = 1;
  REQUIRE(check_kernel(kernel, p, s, 31, 128, nullptr, head_dim, head_dim).empty());
  for (const Defect& d : defects) {
    INFO(kernel.name << ": " << d.name);
    auto t = attnjit::testing::mutated_templates(d.file, d.from, d.to);
    REQUIRE(t);
    std::string failure;
    try {
      failure = check_kernel(kernel, p, s, 31, 128, t, head_dim, head_dim);
    } catch (const std::exception& e) {
      failure = e.what();  // a fault the emulator reports
    }
    CHECK_FALSE(failure.empty());
  }
}

// Key 100's V is NaN: causal rows below 100 share its tiles but mask it, and are summed again
// exactly where the tensor cores let 0 x NaN through; rows from 100 on attend it.
void check_nan_in_v(const Fp8Kernel& kernel) {
  const Pattern p = PatternBuilder().causal().branch(BranchSpec().full()).build();
  Shape s;
  s.batch = 1, s.seq_q = s.seq_k = 160, s.heads_q = s.heads_kv = 1, s.head_dim = s.head_dim_v = 128;
  Runtime emu(options_on(Device::emu(kernel.arch, kernel.arch_specific)));
  Fp8Call c = make_call(s, 41, false);
  c.v[100 * 128 + 7] = 0x7f;
  const Fp8Result r = run(emu, p, c, DType::BF16);
  for (int64_t i = 0; i < s.seq_q; ++i) {
    INFO(kernel.name << ": row " << i);
    CHECK(std::isnan(r.o[size_t(i * 128 + 7)]) == (i >= 100));
    CHECK(std::isfinite(r.o[size_t(i * 128 + 8)]));
  }
}

}  // namespace

TEST_CASE("the FP8 Hopper kernel (wgmma on e4m3) is right on every example, a random sweep, both tiles and head dims", "[fp8][emu]") {
  check_examples_and_sweep(kHopper, 300);
}

TEST_CASE("the FP8 sm_89 kernel (mma.sync m16n8k32) is right on every example, a random sweep, both tiles and head dims", "[fp8][emu]") {
  check_examples_and_sweep(kSm89, 500);
}

TEST_CASE("deliberately broken FP8 Hopper kernels fail in the emulator", "[fp8][emu][mutation]") {
  check_defects_fail(kHopper, {
      {"V^T's columns not renumbered as P's", "fwd_fp8.cuh", "const int k0 = (4 * g & ~31) | aj_fp8_key(4 * g & 31);", "const int k0 = 4 * g;"},
      {"V's bytes transposed into the wrong columns", "fwd_fp8.cuh", "aj_prmt(ab01, cd01, 0x7632)", "aj_prmt(ab01, cd01, 0x7610)"},
      {"P rounded without its 2^8", "fwd_fp8.cuh", "aj_cvt_e4m3x2(256.0f * s[j][e + 1], 256.0f * s[j][e])", "aj_cvt_e4m3x2(s[j][e + 1], s[j][e])"},
      {"P's bytes of a register in the wrong order", "fwd_fp8.cuh", "pa[kc][reg] = hi << 16 | lo;", "pa[kc][reg] = lo << 16 | hi;"},
      {"V^T's byte stores not fenced for the async proxy", "fwd_sm90_fp8.cuh", "      aj_fence_proxy_async();  // the copies", "      // the copies"},
      {"the next tile's V^T stored while this tile's P V reads it", "fwd_sm90_fp8.cuh",
       "unsigned char* const vt_next = svt + (stage ^ 1) * AJ_FP8_VT_STAGE;", "unsigned char* const vt_next = svt + stage * AJ_FP8_VT_STAGE;"},
      {"K(j + 2) copied into the stage S(j + 1) reads", "fwd_sm90_fp8.cuh", "sk + stage * AJ_FP8_K_STAGE, kb, p.k_row_stride, t2.first",
       "sk + (stage ^ 1) * AJ_FP8_K_STAGE, kb, p.k_row_stride, t2.first"},
      {"the softmax of S(j + 1) before it has landed", "fwd_sm90_fp8.cuh", "        aj_wgmma_wait<1>();  // S(j + 1) has landed", "        //"},
      {"O rescaled while P(j) V(j) is in flight", "fwd_sm90_fp8.cuh", "        aj_wgmma_wait<0>();  // P(j) V(j) has landed\n        aj_tc_rescale(acc, c);\n",
       "        aj_tc_rescale(acc, c);\n        aj_wgmma_wait<0>();  // P(j) V(j) has landed\n"},
      {"P V from the other stage's V^T", "fwd_sm90_fp8.cuh", "v_desc + stage * (AJ_FP8_VT_STAGE >> 4)", "v_desc + (stage ^ 1) * (AJ_FP8_VT_STAGE >> 4)"},
      {"the k descale read from q's factors", "common.cuh", "aj_descale(p, 0, b, kvh) * aj_descale(p, 1, b, kvh)",
       "aj_descale(p, 0, b, kvh) * aj_descale(p, 0, b, kvh)"},
      {"a k32 step of S moved 16 bytes in K", "fwd_sm90_fp8.cuh", "(AJ_FP8_K_STAGE >> 4) + ks * 2", "(AJ_FP8_K_STAGE >> 4) + ks"},
      {"O without the 2^-8 of P's factor", "fwd_sm90_fp8.cuh", "acc, m, l, 0.00390625f,", "acc, m, l, 1.0f,"},
  });
}

TEST_CASE("deliberately broken FP8 sm_89 kernels fail in the emulator", "[fp8][emu][mutation]") {
  check_defects_fail(kSm89, {
      {"V^T's columns not renumbered as P's", "fwd_fp8.cuh", "const int k0 = (4 * g & ~31) | aj_fp8_key(4 * g & 31);", "const int k0 = 4 * g;"},
      {"V's bytes transposed into the wrong columns", "fwd_fp8.cuh", "aj_prmt(ab01, cd01, 0x7632)", "aj_prmt(ab01, cd01, 0x7610)"},
      {"K's fragments read with Q's matrix order", "fwd_sm89_fp8.cuh", "k_at[ks] = aj_fp8_frag<AJ_FP8_QK, 2, 1>", "k_at[ks] = aj_fp8_frag<AJ_FP8_QK, 1, 2>"},
      {"Q's fragments read with K's matrix order", "fwd_sm89_fp8.cuh", "aj_fp8_frag<AJ_FP8_QK, 1, 2>(ks * 32, lane)", "aj_fp8_frag<AJ_FP8_QK, 2, 1>(ks * 32, lane)"},
      {"V^T's fragments of the second key chunk read from the first", "fwd_sm89_fp8.cuh", "vt_at[kc] = aj_fp8_frag<AJ_FP8_VT, 2, 1>(kc * 32, lane)",
       "vt_at[kc] = aj_fp8_frag<AJ_FP8_VT, 2, 1>(0, lane)"},
      {"the second n-tile of a K load given the first's B registers", "fwd_sm89_fp8.cuh", "aj_mma_e4m3(s[j + 1], qa[qs], kf[2], kf[3]);",
       "aj_mma_e4m3(s[j + 1], qa[qs], kf[0], kf[1]);"},
      {"the next tile loaded before every warp has read the stage it overwrites", "fwd_fp8.cuh",
       "    aj_syncthreads();  // tile j's stage has landed; tile j - 1's is read no more\n", ""},
      {"the next tile's K copied into the stage being read", "fwd_fp8.cuh", "sk + (stage ^ 1) * AJ_FP8_K_STAGE, kb", "sk + stage * AJ_FP8_K_STAGE, kb"},
      {"the next tile's V^T stored while this tile's P V reads it", "fwd_fp8.cuh", "aj_fp8_store_vt(svt + (stage ^ 1) * AJ_FP8_VT_STAGE, v)",
       "aj_fp8_store_vt(svt + stage * AJ_FP8_VT_STAGE, v)"},
      {"O without the 2^-8 of P's factor", "fwd_sm89_fp8.cuh", "acc, m, l, 0.00390625f,", "acc, m, l, 1.0f,"},
      {"O without its v descale", "fwd_sm89_fp8.cuh", "0.00390625f, aj_descale(p, 2, b, w.kvh)", "0.00390625f, 1.0f"},
  });
}

// Head dim 256: the sm_89 kernel alone (on sm_89, and compiled for sm_90a as a Hopper runs it), Q's
// fragments read from its tile each k32 step, the tiles' rows of 256 bytes with their own
// swizzle; both tiles, every example's shape at 200 tokens, and q's and v's head dims apart.
TEST_CASE("the FP8 sm_89 kernel at head dim 256 matches the reference and the executor", "[fp8][emu]") {
  int n = 0;
  for (const Fp8Kernel& kernel : {kSm89, kSm89OnHopper}) {
    for (const char* name : {"bigbird", "longnet", "sliding_window"}) {
      const Pattern pattern = load_spec_file(std::string(ATTNJIT_EXAMPLES_DIR) + "/" + name + ".json");
      Shape s;
      s.batch = 1, s.seq_q = s.seq_k = 200, s.heads_q = 4, s.heads_kv = 2;
      const int tile_q = n % 2 ? 64 : 128;
      INFO(kernel.name << ": " << name << ", tile " << tile_q << "x64, head dim 256");
      const std::string failure = check_kernel(kernel, pattern, s, 700 + n++, tile_q, nullptr, 256, 256);
      INFO(failure);
      CHECK(failure.empty());
    }
  }
  const Pattern causal = PatternBuilder().causal().branch(BranchSpec().full()).build();
  Shape s;
  s.batch = 2, s.seq_q = s.seq_k = 150, s.heads_q = 2, s.heads_kv = 1;
  for (const auto& [d, dv] : {std::pair<int, int>{256, 128}, {64, 256}}) {
    INFO("head dims " << d << " and " << dv);
    const std::string failure = check_kernel(kSm89, causal, s, 720 + d + dv, 128, nullptr, d, dv);
    INFO(failure);
    CHECK(failure.empty());
  }
}

TEST_CASE("deliberately broken FP8 sm_89 kernels at head dim 256 fail in the emulator", "[fp8][emu][mutation]") {
  check_defects_fail(kSm89, {
      {"Q's fragments of every k32 step read from the first", "fwd_sm89_fp8.cuh",
       "aj_ldmatrix_x4(qa[0], sh.q + warp * 16 * AJ_FP8_QK + aj_fp8_frag<AJ_FP8_QK, 1, 2>(ks * 32, lane));",
       "aj_ldmatrix_x4(qa[0], sh.q + warp * 16 * AJ_FP8_QK + aj_fp8_frag<AJ_FP8_QK, 1, 2>(0, lane));"},
      {"256-byte rows swizzled by the row within 32 (the fragments' offsets repeat every 16 rows)", "fwd_fp8.cuh",
       "if (W == 256) return at ^ ((r & 7) << 4);", "if (W == 256) return at ^ (((r & 7) | (r & 16) >> 1) << 4);"},
      {"K's fragments of the second half of each row read from the first", "fwd_sm89_fp8.cuh",
       "k_at[ks] = aj_fp8_frag<AJ_FP8_QK, 2, 1>(ks * 32, lane);", "k_at[ks] = aj_fp8_frag<AJ_FP8_QK, 2, 1>(ks % 4 * 32, lane);"},
  }, 256);
}

TEST_CASE("a NaN in V reaches only the rows that attend it in the FP8 tensor-core kernels", "[fp8][emu]") {
  check_nan_in_v(kHopper);
  check_nan_in_v(kSm89);
}

TEST_CASE("the tuner's FP8 candidates are the tiles the FP8 kernels take", "[fp8][autotune]") {
  KernelRequest r;
  r.dtype = DType::E4M3;
  r.out_dtype = DType::BF16;
  r.head_dim = r.head_dim_v = 128;
  r.arch = 90;
  r.arch_specific = true;
  const std::vector<KernelConfig> hopper = candidate_configs(r);
  REQUIRE(hopper.size() == 2);
  CHECK(hopper[0] == KernelConfig{128, 128, 2, 8});  // the default first
  CHECK(hopper[1] == KernelConfig{64, 128, 2, 4});
  for (const KernelConfig& c : hopper) {  // each renders the FP8 Hopper kernel
    r.config = c;
    CHECK(generate_kernel(PatternBuilder().branch(BranchSpec().full()).build(), r).source.find("aj_fwd_sm90_fp8(p);") != std::string::npos);
  }
  r.config = {};
  r.head_dim = r.head_dim_v = 96;  // no FP8 wgmma kernel at this head dim: the SIMT kernel's tiles
  for (const KernelConfig& c : candidate_configs(r)) CHECK(c.stages == 1);
  CHECK(choose_path(r) == KernelPath::Simt);
  r.head_dim = r.head_dim_v = 128;
  r.config = KernelConfig{128, 64, 2, 0};
  CHECK_THROWS_WITH(resolve_config(r), Catch::Contains("the FP8 sm_90a path takes 128-key tiles"));
}

TEST_CASE("FP8 on sm_89 and newer without wgmma takes mma.sync at head dims 64, 128 and 256, the SIMT kernel elsewhere", "[fp8][autotune]") {
  KernelRequest r;
  r.dtype = DType::E4M3;
  r.out_dtype = DType::BF16;
  r.head_dim = r.head_dim_v = 128;
  const Pattern full = PatternBuilder().branch(BranchSpec().full()).build();
  for (int arch : {89, 90, 120}) {
    INFO("sm_" << arch);
    r.arch = arch, r.arch_specific = false, r.config = {};
    CHECK(choose_path(r) == KernelPath::Sm80);
    const std::vector<KernelConfig> candidates = candidate_configs(r);
    REQUIRE(candidates.size() == 2);
    CHECK(candidates[0] == KernelConfig{128, 64, 2, 8});  // the default first
    CHECK(candidates[1] == KernelConfig{64, 64, 2, 4});
    for (const KernelConfig& c : candidates) {
      r.config = c;
      CHECK(generate_kernel(full, r).source.find("aj_fwd_sm89_fp8(p);") != std::string::npos);
    }
  }
  r.arch = 89, r.config = KernelConfig{128, 128, 2, 0};
  CHECK_THROWS_WITH(resolve_config(r), Catch::Contains("the FP8 sm_89 path takes 64-key tiles"));
  r.config = KernelConfig{128, 64, 2, 4};
  CHECK_THROWS_WITH(resolve_config(r), Catch::Contains("one warp per 16 query rows"));
  r.config = KernelConfig{128, 64, 1, 8};
  CHECK_THROWS_WITH(resolve_config(r), Catch::Contains("the FP8 sm_89 path has two stages"));
  r.config = {};
  r.arch = 86;  // no e4m3 tensor cores before sm_89
  CHECK(choose_path(r) == KernelPath::Simt);
  r.arch = 89, r.head_dim = r.head_dim_v = 96;
  CHECK(choose_path(r) == KernelPath::Simt);
  // Head dim 256: the mma.sync kernel, on a Hopper too (the wgmma one stops at 128).
  r.head_dim = r.head_dim_v = 256;
  for (const auto& [arch, specific] : {std::pair<int, bool>{89, false}, {90, false}, {90, true}, {120, false}}) {
    INFO("sm_" << arch << (specific ? "a" : "") << ", head dim 256");
    r.arch = arch, r.arch_specific = specific;
    REQUIRE(choose_path(r) == KernelPath::Sm80);
    CHECK(generate_kernel(full, r).source.find("aj_fwd_sm89_fp8(p);") != std::string::npos);
  }
  r.arch = 86;
  CHECK(choose_path(r) == KernelPath::Simt);
}
