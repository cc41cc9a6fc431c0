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
  {
    emu::BankProfileScope on;
    op.forward(q.view, k.view, v.view, o.view, &lv, fo);
    if (f.backward) op.backward(q.view, k.view, v.view, o.view, lv, dout.view, dq.view, dk.view, dv.view, fo);
  }
  Profiled out{emu::bank_profile(), {}};
  for (int64_t s = 0; s < S; ++s)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) out.dq.push_back(dq.at(0, s, h, d));
  return out;
}

struct PagedOptions {
  std::vector<int64_t> cu_seqlens_q;  // empty: one query per request
  bool unaligned = false;             // caches one element past 16-byte alignment: no 16-byte copies
};

struct PagedProfiled {
  std::vector<emu::BankSite> sites;
  std::vector<float> o;
};

// Decode and chunked prefill over a paged cache (pages of 16 tokens, in shuffled order), causal,
// with the bank profile on (the tensor-core kernel: fp16/bf16 on sm_80 and newer).
PagedProfiled paged_profile(int64_t heads_q, int64_t heads_kv, int64_t d, const PagedOptions& po = {}) {
  RuntimeOptions ro;
  ro.device = Device::emu(80);
  Runtime rt(ro);
  const DType dt = DType::BF16;
  const Pattern p = PatternBuilder().branch(BranchSpec().causal()).build();
  PagedAttention op = rt.prepare_paged(p, PagedProblem{heads_q, heads_kv, d, d, dt, {}});
  const std::vector<int64_t> kv_lens{37, 100, 5};
  const int64_t page = 16, stride = 7, pages = 3 * stride, total_q = po.cu_seqlens_q.empty() ? 3 : po.cu_seqlens_q.back();
  std::vector<int32_t> table(size_t(3 * stride));
  for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t((i * 5 + 3) % size_t(pages));
  auto values = [&](int64_t n, uint64_t seed) { return rounded_to(dt, random_tensor(size_t(n), seed)); };
  HostTensor q(values(total_q * heads_q * d, 1), {1, total_q, heads_q, d}, dt, false),
      k(values(pages * page * heads_kv * d, 2), {pages, page, heads_kv, d}, dt, false),
      v(values(pages * page * heads_kv * d, 3), {pages, page, heads_kv, d}, dt, false),
      o(values(total_q * heads_q * d, 4), {1, total_q, heads_q, d}, dt, false);
  // The same caches one element into a larger buffer, where asked.
  std::vector<uint16_t> k_moved, v_moved;
  auto moved = [&](const HostTensor& t, std::vector<uint16_t>& buffer) {
    if (!po.unaligned) return t.view;
    buffer.assign(t.f16.size() + 1, 0);
    std::copy(t.f16.begin(), t.f16.end(), buffer.begin() + 1);
    TensorView view = t.view;
    view.data = buffer.data() + 1;
    return view;
  };
  PagedCall call;
  auto three_d = [](TensorView t) {  // [1, S, H, D] -> [S, H, D]
    t.shape.erase(t.shape.begin());
    t.strides.erase(t.strides.begin());
    return t;
  };
  call.q = three_d(q.view), call.o = three_d(o.view), call.k_cache = moved(k, k_moved), call.v_cache = moved(v, v_moved);
  call.block_table = table.data(), call.block_table_stride = stride;
  call.kv_lens = kv_lens, call.cu_seqlens_q = po.cu_seqlens_q;
  {
    emu::BankProfileScope on;
    op.forward(call);
  }
  PagedProfiled out{emu::bank_profile(), {}};
  for (int64_t i = 0; i < total_q; ++i)
    for (int64_t h = 0; h < heads_q; ++h)
      for (int64_t e = 0; e < d; ++e) out.o.push_back(o.at(0, i, h, e));
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

// The tensor-core kernel at head dims 64 and 128. Not held here (docs/performance.md, "Shared-memory
// banks of the paged kernels"): its row copies at head dims that are no multiple of 64, and the
// SIMT kernel's fp16 tile loads and slot records.
TEST_CASE("the paged tensor-core kernel's shared-memory accesses meet no bank conflict", "[emu][banks][paged]") {
  check_no_conflict("decode, one query head a kv head", paged_profile(2, 2, 64).sites);
  check_no_conflict("decode, GQA groups of 8 (tensor cores)", paged_profile(16, 2, 128).sites);
  check_no_conflict("chunked prefill", paged_profile(4, 2, 64, {.cu_seqlens_q = {0, 1, 20, 23}}).sites);
  // Caches off 16-byte alignment: every row element by element into one 16-byte store, the same
  // bits as the copies give.
  const PagedProfiled copied = paged_profile(8, 2, 64), stored = paged_profile(8, 2, 64, {.unaligned = true});
  check_no_conflict("caches off 16-byte alignment", stored.sites);
  CHECK(stored.o == copied.o);
  bool copies = false;
  for (const emu::BankSite& s : stored.sites) copies |= s.op == emu::SharedOp::CpAsync;
  CHECK(!copies);
}

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
