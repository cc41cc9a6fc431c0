// The kernels' shared-memory accesses against the emulator's bank model (emulator/bank_profile.hpp):
// on every kernel family, every access by threads takes the wavefronts its bytes need and no more
// (no bank conflict). A kernel change that brings one fails here, naming its source line; a
// deliberately conflicted kernel shows that the profile sees one.
#include <catch2/catch.hpp>

#include "attnjit/attnjit.hpp"
#include "emulator/bank_profile.hpp"
#include "tests/unit/host_tensor.hpp"
#include "tests/unit/random_patterns.hpp"
#include "tests/unit/template_mutation.hpp"

using namespace attnjit;
using attnjit::testing::HostTensor;
using attnjit::testing::random_tensor;
using attnjit::testing::rounded_to;

namespace {

struct Family {
  const char* name;
  Device device;
  DType dtype;
  int head_dim;
  bool backward;
  KernelConfig config = {};
  bool deterministic = false;
};

struct Profiled {
  std::vector<emu::BankSite> sites;
  std::vector<float> dq;
};

// A LongNet-like pattern (a causal branch and a dilated one) forward, and backward when asked, on
// the family's device with the bank profile on.
Profiled profile(const Family& f, std::shared_ptr<const TemplateSet> templates = nullptr) {
  RuntimeOptions ro;
  ro.device = f.device;
  ro.config = f.config;
  ro.templates = std::move(templates);
  Runtime rt(ro);
  const Pattern p = PatternBuilder()
                        .branch(BranchSpec().segment(128).dilation(1).causal())
                        .branch(BranchSpec().segment(256).dilation(2).offset(OffsetRule::HeadMod))
                        .build();
  const int64_t S = 160, H = 2, D = f.head_dim;
  const std::vector<int64_t> shape{1, S, H, D};
  auto values = [&](uint64_t seed) { return rounded_to(f.dtype, random_tensor(size_t(S * H * D), seed)); };
  HostTensor q(values(1), shape, f.dtype, false), k(values(2), shape, f.dtype, false), v(values(3), shape, f.dtype, false),
      dout(values(4), shape, f.dtype, false), o(values(5), shape, f.dtype, false), dq(values(6), shape, f.dtype, false),
      dk(values(7), shape, f.dtype, false), dv(values(8), shape, f.dtype, false);
  std::vector<float> lse(size_t(H * S));
  const TensorView lv = TensorView::contiguous(lse.data(), DType::F32, {1, H, S});
  Attention op = rt.prepare(p, Problem{1, S, S, H, H, D, D, f.dtype, {}});
  ForwardOptions fo;
  fo.deterministic = f.deterministic;
  emu::clear_bank_profile();
  emu::set_bank_profile(true);
  op.forward(q.view, k.view, v.view, o.view, &lv, fo);
  if (f.backward) op.backward(q.view, k.view, v.view, o.view, lv, dout.view, dq.view, dk.view, dv.view, fo);
  emu::set_bank_profile(false);
  Profiled out{emu::bank_profile(), {}};
  for (int64_t s = 0; s < S; ++s)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) out.dq.push_back(dq.at(0, s, h, d));
  return out;
}

void check_no_conflict(const std::string& name, const std::vector<emu::BankSite>& sites) {
  INFO(name << "\n" << emu::bank_report(sites, 100));
  CHECK(!sites.empty());
  for (const emu::BankSite& s : sites) {
    INFO(to_string(s.op) << " at " << s.where);
    CHECK(s.count.instructions > 0);
    CHECK(s.count.wavefronts == s.count.ideal);
  }
}

}  // namespace

TEST_CASE("the kernels' shared-memory accesses meet no bank conflict", "[emu][banks]") {
  const Family families[] = {
      {"sm_80 bf16, head dim 64", Device::emu(80), DType::BF16, 64, true},
      {"sm_80 bf16, head dim 128, 128x64 tiles", Device::emu(80), DType::BF16, 128, false, KernelConfig{128, 64, 2, 4}},
      {"sm_80 fp32 (SIMT)", Device::emu(80), DType::F32, 64, true},
      {"sm_75 fp16", Device::emu(75), DType::F16, 64, true},
      {"sm_90a bf16, head dim 128 (wgmma backward)", Device::emu(90, true), DType::BF16, 128, true},
      {"sm_90a bf16, head dim 64, deterministic", Device::emu(90, true), DType::BF16, 64, true, {}, true},
  };
  for (const Family& f : families) check_no_conflict(f.name, profile(f).sites);
}

TEST_CASE("dQ's staging rows without their skew: the same gradients, the conflicts counted at the store", "[emu][banks]") {
  // 64 floats a row instead of 72: the 8-byte pairs of a half warp's four rows share eight banks.
  auto conflicted = attnjit::testing::mutated_templates("bwd_sm90_tma.cuh", "#define AJ_BWDT_DQ_BYTES",
                                                        "#undef AJ_BWDT_DQ_PITCH\n#define AJ_BWDT_DQ_PITCH 64\n#define AJ_BWDT_DQ_BYTES");
  REQUIRE(conflicted);
  const Family f{"sm_90a bf16, head dim 128", Device::emu(90, true), DType::BF16, 128, true};
  const Profiled good = profile(f), bad = profile(f, conflicted);
  INFO(emu::bank_report(bad.sites, 100));
  CHECK(bad.dq == good.dq);
  bool staging = false;
  for (const emu::BankSite& s : bad.sites) {
    if (s.op != emu::SharedOp::Store || s.where.find("aj_st_f32x2") == std::string::npos) {
      CHECK(s.count.wavefronts == s.count.ideal);
      continue;
    }
    staging = true;
    CHECK(s.count.wavefronts == 4 * s.count.ideal);
  }
  CHECK(staging);
}
