// Deliberately broken kernels: each mutation below puts one defect into the real templates (a
// missing barrier, a missing cp.async wait, a wrong ldmatrix lane map, an off-by-one in a row map,
// swapped conversion operands) and the emulator must catch it, by a fault (race, bounds) or by an
// answer that no longer matches the float64 reference. The unmutated kernel passes the same check,
// so the check is what tells them apart.
#include <catch2/catch.hpp>

#include <cmath>

#include "attnjit/attnjit.hpp"
#include "emulator/emu_module.hpp"
#include "runtime/npy.hpp"
#include "runtime/reference.hpp"
#include "tests/unit/random_patterns.hpp"

using namespace attnjit;

namespace {

struct Mutation {
  const char* name;
  const char* file;
  const char* from;
  const char* to;
  DType dtype;  // bf16: the tensor-core path; fp32: the SIMT path
};

const Mutation kMutations[] = {
    {"no barrier before a stage is overwritten", "fwd_sm80.cuh",
     "    aj_syncthreads();  // this stage is overwritten by a later prefetch\n", "\n", DType::BF16},
    {"no barrier after the cp.async wait", "fwd_sm80.cuh", "    aj_cp_async_wait<AJ_STAGES - 1>();\n    aj_syncthreads();\n",
     "    aj_cp_async_wait<AJ_STAGES - 1>();\n", DType::BF16},
    {"no cp.async wait", "fwd_sm80.cuh", "    aj_cp_async_wait<AJ_STAGES - 1>();\n", "\n", DType::BF16},
    {"K fragments loaded with V's ldmatrix lane map", "fwd_sm80.cuh",
     "const int k_row = (lane & 7) + ((lane >> 4) << 3), k_col = ((lane >> 3) & 1) * 8;",
     "const int k_row = (lane & 7) + ((lane >> 3) & 1) * 8, k_col = (lane >> 4) * 8;", DType::BF16},
    {"off-by-one in the output row map", "fwd_sm80.cuh",
     "const aj_i64 i0 = item.rows_start + (aj_i64)r0 * item.rows_stride,",
     "const aj_i64 i0 = item.rows_start + (aj_i64)(r0 + 1) * item.rows_stride,", DType::BF16},
    {"cvt.rn.bf16x2 operands swapped", "fwd_sm80.cuh", "  return aj_cvt_bf16x2(hi, lo);", "  return aj_cvt_bf16x2(lo, hi);",
     DType::BF16},
    {"SIMT: no barrier before the next tile is loaded", "fwd_simt.cuh",
     "    aj_syncthreads();  // the previous tile is no longer read\n", "\n", DType::F32},
};

// Runs `templates`' kernel on the emulator; "" when it matches the reference, else what went wrong.
std::string check_kernel(const std::shared_ptr<const TemplateSet>& templates, DType dt) {
  const Pattern p = PatternBuilder()
                        .branch(BranchSpec().segment(128).dilation(1).causal())
                        .branch(BranchSpec().segment(256).dilation(2).offset(OffsetRule::HeadMod))
                        .build();
  Shape s;
  s.seq_q = s.seq_k = 203;  // not a multiple of any tile
  s.heads_q = 2, s.heads_kv = 1, s.head_dim = s.head_dim_v = 64;
  const size_t nq = size_t(s.seq_q * s.heads_q * 64), nk = size_t(s.seq_k * s.heads_kv * 64);
  auto rounded = [&](std::vector<float> v) {
    if (dt == DType::BF16)
      for (float& x : v) x = bfloat16_to_float(float_to_bfloat16(x));
    return v;
  };
  const std::vector<float> q = rounded(testing::random_tensor(nq, 1)), k = rounded(testing::random_tensor(nk, 2)),
                           v = rounded(testing::random_tensor(nk, 3));
  const ReferenceOutput want = reference_attention(p, s, q.data(), k.data(), v.data(), nullptr, 1);
  auto store = [&](const std::vector<float>& x) {
    std::vector<uint16_t> h;
    for (float f : x) h.push_back(float_to_bfloat16(f));
    return h;
  };
  RuntimeOptions ro;
  ro.device = Device::emu(80);
  ro.templates = templates;
  Runtime rt(ro);
  std::vector<float> o(nq, NAN), lse(size_t(s.heads_q * s.seq_q), NAN);
  std::vector<uint16_t> qh = store(q), kh = store(k), vh = store(v), oh(nq, 0xFFFF);
  const bool f32 = dt == DType::F32;
  auto view = [&](void* data, int64_t seq, int64_t heads) {
    return TensorView::contiguous(data, dt, {1, seq, heads, 64});
  };
  const TensorView lv = TensorView::contiguous(lse.data(), DType::F32, {1, s.heads_q, s.seq_q});
  try {
    attention(rt, p, view(f32 ? (void*)q.data() : qh.data(), s.seq_q, 2), view(f32 ? (void*)k.data() : kh.data(), s.seq_k, 1),
              view(f32 ? (void*)v.data() : vh.data(), s.seq_k, 1), view(f32 ? (void*)o.data() : oh.data(), s.seq_q, 2), &lv);
  } catch (const emu::KernelFault& e) {
    return std::string("fault: ") + e.what();
  }
  if (!f32)
    for (size_t i = 0; i < nq; ++i) o[i] = bfloat16_to_float(oh[i]);
  double num = 0, den = 0;
  for (size_t i = 0; i < nq; ++i) {
    if (std::isnan(o[i])) return "NaN in O at element " + std::to_string(i);
    num += (o[i] - want.o[i]) * (o[i] - want.o[i]);
    den += want.o[i] * want.o[i];
  }
  const double rel = std::sqrt(num / den), tol = f32 ? 1e-5 : 2e-2;
  if (rel > tol) return "relative Frobenius error of O " + std::to_string(rel);
  for (size_t i = 0; i < lse.size(); ++i)
    if (!(std::abs(lse[i] - want.lse[i]) <= tol * (1 + std::abs(want.lse[i])))) return "LSE differs at " + std::to_string(i);
  return "";
}

}  // namespace

TEST_CASE("the unmutated kernels pass the check the mutations must fail", "[emu][mutation]") {
  const auto embedded = std::make_shared<const TemplateSet>(TemplateSet::embedded());
  CHECK(check_kernel(embedded, DType::BF16) == "");
  CHECK(check_kernel(embedded, DType::F32) == "");
}

TEST_CASE("every deliberately broken kernel fails in the emulator", "[emu][mutation]") {
  for (const Mutation& m : kMutations) {
    INFO("mutation: " << m.name);
    auto t = std::make_shared<TemplateSet>(TemplateSet::embedded());
    std::string text = t->text(m.file);
    const size_t at = text.find(m.from);
    REQUIRE(at != std::string::npos);  // the template changed: update the mutation
    text.replace(at, std::string(m.from).size(), m.to);
    t->replace(m.file, text);
    const std::string outcome = check_kernel(t, m.dtype);
    INFO("outcome: " << outcome);
    CHECK(!outcome.empty());
  }
}
