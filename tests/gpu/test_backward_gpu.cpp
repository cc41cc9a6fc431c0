// The generated backward kernels against the float64 reference gradients: every example pattern
// and random patterns, in every dtype, on the device under test (ATTNJIT_GPU_TESTS_DEVICE: gpu;
// emu in CI; cpu for the plan executor). Gradients start poisoned (0xFF = NaN), so an unwritten
// element shows; the tolerance
// is a relative Frobenius error of 3e-2 for fp16/bf16 and 1e-5 for fp32 (the SIMT kernels compute
// in fp32 for every storage type).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <tuple>

#include "attnjit/attnjit.hpp"
#include "compiler/tune/autotune.hpp"
#include "emulator/emu_api.hpp"
#include "runtime/cuda/cuda_driver.hpp"
#include "runtime/npy.hpp"
#include "attnjit/reference.hpp"
#include "tests/gpu/test_target.hpp"
#include "tests/gpu/attention_cases.hpp"
#include "tests/unit/random_patterns.hpp"
#include "tests/gpu/backward_cases.hpp"

using namespace attnjit;
using namespace attnjit::gradtest;


TEST_CASE("backward: every example pattern matches the reference gradients", "[gpu][emu][grad][examples]") {
  if (on_gpu()) shared_context(0).make_current();
  RuntimeOptions ro;
  ro.device = device_under_test();
  Runtime rt(ro);
  int n = 0;
  for (const auto& [file, p] : example_patterns()) {
    for (const auto& [dt, d] : std::vector<std::pair<DType, int64_t>>{{DType::F32, 32}, {DType::F16, 64}, {DType::BF16, 128}}) {
      Shape s;
      s.batch = 1, s.seq_q = s.seq_k = on_gpu() ? 777 : 150, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = d;
      s.q_offset = dt == DType::F16 ? 37 : 0;
      INFO(file << " " << to_string(dt) << " head_dim " << d);
      CHECK(check_backward(rt, p, s, dt, nullptr, 100 + n++) == "");
    }
  }
}

// Small enough for compute-sanitizer (memcheck, racecheck, synccheck, initcheck): every example
// pattern through the tensor-core kernels (bf16, the dK/dV and dQ kernels and the row-delta pass),
// the SIMT kernels (fp32) and the deterministic mode, at a few tiles per row.
// tests/device/device_check.sh runs "[sanitize]" under each tool.
TEST_CASE("backward: a small subset for compute-sanitizer", "[gpu][grad][sanitize]") {
  if (!on_gpu()) { WARN("SKIPPED: a GPU case (compute-sanitizer runs it on hardware)"); return; }
  shared_context(0).make_current();
  RuntimeOptions ro;
  ro.device = device_under_test();
  Runtime rt(ro);
  int n = 0;
  for (const auto& [file, p] : example_patterns()) {
    for (const auto& [dt, d] : std::vector<std::pair<DType, int64_t>>{{DType::F32, 32}, {DType::BF16, 64}}) {
      Shape s;
      s.batch = 1, s.seq_q = s.seq_k = 200, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = d;
      INFO(file << " " << to_string(dt) << " head_dim " << d);
      CHECK(check_backward(rt, p, s, dt, nullptr, 700 + n, n % 4 == 1) == "");
      ++n;
    }
  }
  // The wgmma dK/dV kernels (a Hopper GPU; others run the sm_80 kernels for these options): the
  // TMA kernel on every example, the cp.async one on two.
  ro.wgmma_backward = true;
  Runtime hopper(ro);
  ro.tma = false;
  Runtime hopper_cp_async(ro);
  int cp_async_cases = 0;
  for (const auto& [file, p] : example_patterns()) {
    Shape s;
    s.batch = 1, s.seq_q = s.seq_k = 200, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = 128;
    INFO("wgmma backward: " << file);
    CHECK(check_backward(hopper, p, s, DType::BF16, nullptr, 800 + n++) == "");
    if (cp_async_cases++ < 2) {
      INFO("the cp.async kernel");
      CHECK(check_backward(hopper_cp_async, p, s, DType::BF16, nullptr, 800 + n++) == "");
    }
  }
  // Two examples, single pass then deterministic.
  auto two_examples = [&](Runtime& on, int64_t batch, int64_t d, const char* what, uint64_t seed) {
    int cases = 0;
    for (const auto& [file, p] : example_patterns()) {
      if (cases++ == 2) break;
      Shape s;
      s.batch = batch, s.seq_q = s.seq_k = 200, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = d;
      INFO(what << ": " << file);
      CHECK(check_backward(on, p, s, DType::BF16, nullptr, seed + n, n % 2 == 1) == "");
      ++n;
    }
  };
  // The persistent TMA _dkdv (three blocks taking the key items in turn): its ring across items
  // and its consumers' item barriers.
  ro.tma = true;
  ro.persistent_blocks = 3;
  Runtime persistent(ro);
  two_examples(persistent, 2, 64, "persistent wgmma backward", 850);
  // Head dim 256: the sm_80 kernels' _dkdv by column slices (its walks restage the first query tile).
  two_examples(rt, 1, 256, "head dim 256", 870);
}

TEST_CASE("backward: Pascal's kernels (sm_61: SIMT, fp32 arithmetic on fp16/bf16) match the reference gradients",
          "[emu][grad][pascal]") {
  if (gputest::target() != gputest::Target::Emu) {
    WARN("SKIPPED: an emulator case (ATTNJIT_GPU_TESTS_DEVICE=emu): it runs sm_61's kernels whatever the GPU");
    return;
  }
  RuntimeOptions ro;
  ro.device = Device::emu(61);
  Runtime rt(ro);
  int n = 0;
  for (const auto& [file, p] : example_patterns()) {
    for (const DType dt : {DType::F16, DType::BF16}) {
      Shape s;
      s.batch = 1, s.seq_q = s.seq_k = 130, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = 64;
      INFO(file << " " << to_string(dt));
      CHECK(check_backward(rt, p, s, dt, nullptr, 300 + n++) == "");
    }
  }
}

TEST_CASE("backward: random patterns match the reference gradients", "[gpu][emu][grad][random]") {
  if (on_gpu()) shared_context(0).make_current();
  RuntimeOptions ro;
  ro.device = device_under_test();
  Runtime rt(ro);
  ro.random_in_kernel_above = 0;
  Runtime rt_seek(ro);  // random layouts decided in the kernels
  testing::CaseGenerator gen(31337);
  const int count = gputest::sweep_count("ATTNJIT_GPU_TESTS_RANDOM_BACKWARD", 16, 40);
  for (int n = 0; n < count; ++n) {
    auto c = gen.next();
    const DType dt = n % 3 == 0 ? DType::F32 : n % 3 == 1 ? DType::F16 : DType::BF16;
    c.shape.head_dim = 16 * (1 + c.shape.head_dim % 4);
    c.shape.head_dim_v = 16 * (1 + c.shape.head_dim_v % 4);
    INFO("case " << n << " " << to_string(dt) << "\n" << canonical_text(c.pattern));
    // Half of the dynamic tables stay on the device (DeviceDynamicLayout); half of the random
    // layouts are decided in the kernels.
    const bool seek = (n / 2) % 2 == 0;
    INFO((c.dynamic && n % 2 == 0 ? "device table" : "") << (seek && c.pattern.has_layout_kind(Layout::Kind::Random) ? " random in the kernels" : ""));
    CHECK(check_backward(seek ? rt_seek : rt, c.pattern, c.shape, dt, c.dynamic ? &*c.dynamic : nullptr, 1000 + 10 * n, false,
                         nullptr, false, n % 2 == 0) == "");
  }
}

TEST_CASE("backward: random layouts decided in the kernels match the reference gradients", "[gpu][emu][grad][random_in_kernel]") {
  if (on_gpu()) shared_context(0).make_current();
  RuntimeOptions ro;
  ro.device = device_under_test();
  ro.random_in_kernel_above = 0;
  Runtime rt(ro);
  int n = 0;
  for (const auto& [name, p] : gputest::random_in_kernel_patterns()) {
    for (const auto& [dt, d] : {std::pair<DType, int64_t>{DType::BF16, 64}, {DType::F32, 32}}) {
      Shape s;
      s.batch = 1, s.seq_q = 230, s.seq_k = 250, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = d;
      s.q_offset = dt == DType::F32 ? 17 : 0;
      INFO(name << " " << to_string(dt));
      CHECK(check_backward(rt, p, s, dt, nullptr, 500 + n++) == "");
    }
  }
}

TEST_CASE("backward: the deterministic mode gives the same bits every time, overlapping key tiles included", "[gpu][emu][grad][deterministic]") {
  if (on_gpu()) shared_context(0).make_current();
  RuntimeOptions ro;
  ro.device = device_under_test();
  Runtime rt(ro);
  // A dense and a dilated branch: their key tiles overlap, so dK/dV take several layers.
  const Pattern p = PatternBuilder()
                        .branch(BranchSpec().segment(64).dilation(1))
                        .branch(BranchSpec().segment(128).dilation(2).offset(OffsetRule::HeadMod))
                        .branch(BranchSpec().segment(256).dilation(4).offset(OffsetRule::HeadMod))
                        .build();
  Shape s;
  s.seq_q = s.seq_k = on_gpu() ? 4099 : 300, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = 32;
  // fp32: the SIMT kernels; bf16: the tensor-core kernels' two-pass form (a dQ kernel over the
  // forward plan, dK/dV layer by layer), which the deterministic mode runs instead of the single pass.
  for (const auto& [dt, d] : std::vector<std::pair<DType, int64_t>>{{DType::F32, 32}, {DType::BF16, 64}}) {
    INFO(to_string(dt));
    s.head_dim = s.head_dim_v = d;
    std::vector<uint8_t> first, again;
    REQUIRE(check_backward(rt, p, s, dt, nullptr, 5, true, &first) == "");
    for (int run = 0; run < 3; ++run) {
      again.clear();
      REQUIRE(check_backward(rt, p, s, dt, nullptr, 5, true, &again) == "");
      CHECK(again == first);
    }
  }
}

TEST_CASE("backward: rows that attend nothing give and get no gradient (never NaN)", "[gpu][emu][grad][empty]") {
  if (on_gpu()) shared_context(0).make_current();
  RuntimeOptions ro;
  ro.device = device_under_test();
  Runtime rt(ro);
  // Causal with the keys starting 70 positions after the queries: query rows 0..69 attend nothing
  // (their LSE is -inf), and a window leaves more rows empty inside a dilated branch.
  const Pattern p = PatternBuilder()
                        .branch(BranchSpec().segment(64).dilation(1).causal())
                        .branch(BranchSpec().segment(128).dilation(2).offset(OffsetRule::HeadMod).causal())
                        .build();
  for (const auto& [dt, d] : std::vector<std::pair<DType, int64_t>>{{DType::F32, 32}, {DType::F16, 64}, {DType::BF16, 128}}) {
    Shape s;
    s.seq_q = s.seq_k = on_gpu() ? 1000 : 200, s.heads_q = 4, s.heads_kv = 1, s.head_dim = s.head_dim_v = d;
    s.k_offset = 70;
    INFO(to_string(dt) << " head_dim " << d);
    CHECK(check_backward(rt, p, s, dt, nullptr, 77) == "");
  }
}

// A loss that uses the lse output as well as O (merging partial attentions by their LSEs): its
// gradient dlse enters each row's dS as P dlse. Every example through the tensor-core kernels'
// single pass and two-pass form and the SIMT kernels, and rows that attend nothing (dlse NaN
// there, which must reach no gradient).
TEST_CASE("backward: the gradient through the lse output matches the reference", "[gpu][emu][grad][dlse]") {
  if (on_gpu()) shared_context(0).make_current();
  RuntimeOptions ro;
  ro.device = device_under_test();
  Runtime rt(ro);
  int n = 0;
  for (const auto& [file, p] : example_patterns()) {
    Shape s;
    s.seq_q = s.seq_k = on_gpu() ? 500 : 130, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = 64;
    for (const auto& [dt, deterministic] : std::vector<std::pair<DType, bool>>{{DType::BF16, false}, {DType::BF16, true}, {DType::F32, false}}) {
      INFO(file << " " << to_string(dt) << (deterministic ? " deterministic" : ""));
      CHECK(check_backward(rt, p, s, dt, nullptr, 900 + n++, deterministic, nullptr, false, false, false, {}, true) == "");
    }
  }
  const Pattern empty_rows = PatternBuilder().branch(BranchSpec().segment(64).dilation(1).causal()).build();
  Shape s;
  s.seq_q = s.seq_k = on_gpu() ? 1000 : 200, s.heads_q = 2, s.heads_kv = 1, s.head_dim = s.head_dim_v = 64;
  s.k_offset = 70;  // query rows 0..69 attend nothing
  for (const DType dt : {DType::BF16, DType::F32}) {
    INFO("rows that attend nothing, " << to_string(dt));
    CHECK(check_backward(rt, empty_rows, s, dt, nullptr, 990, false, nullptr, false, false, false, {}, true) == "");
  }
}

// A NaN or inf in V at keys that some rows mask, and at keys no row attends (causal with the keys
// 30 positions ahead: the last 30 keys are attended by nobody but share tiles with keys that are):
// dP = dO V^T is NaN for every row of such a key's tile, and a masked pair's dS must be 0 all the
// same (selected, not P = 0 times NaN), so the gradients are the reference's: NaN or inf only
// where it has them, dK and dV of the keys nobody attends zero.
TEST_CASE("backward: a NaN or inf in V reaches only the gradients the reference gives it", "[gpu][emu][grad][nonfinite]") {
  if (on_gpu()) shared_context(0).make_current();
  const Pattern p = PatternBuilder()
                        .branch(BranchSpec().segment(64).dilation(1).causal())
                        .branch(BranchSpec().segment(128).dilation(2).offset(OffsetRule::HeadMod).causal())
                        .build();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const auto& [dt, d, arch] : std::vector<std::tuple<DType, int64_t, int>>{
           {DType::F32, 32, 80}, {DType::F16, 64, 80}, {DType::BF16, 128, 80}, {DType::BF16, 64, 61}, {DType::BF16, 256, 80}}) {
    if (on_gpu() && arch != 80) continue;
    RuntimeOptions ro;
    ro.device = gputest::target() == gputest::Target::Emu ? Device::emu(arch) : device_under_test();
    Runtime rt(ro);
    Shape s;
    s.seq_q = s.seq_k = 200, s.heads_q = 2, s.heads_kv = 1, s.head_dim = s.head_dim_v = d;
    s.k_offset = 30;
    auto at = [&](int64_t key, int64_t dim) { return size_t(key * d + dim); };
    // Key 40: masked by the rows before it in its tiles; keys 180 and 195: attended by no row. Past
    // head dim 128, two of them in the second column slice of dK and dV (the exact sums add a
    // slice's columns only).
    const int64_t hi = d > 128 ? 128 : 0;
    const std::vector<Poke> values = {{'v', at(40, hi + 1), nan}, {'v', at(180, 0), nan}, {'v', at(195, hi + 2), inf}};
    INFO(to_string(dt) << " head_dim " << d << " sm_" << arch);
    CHECK(check_backward(rt, p, s, dt, nullptr, 91, false, nullptr, false, false, false, values) == "");
  }
}

// The same for a NaN or inf in Q, K or dO. The tensor cores multiply them by the zero dS (or P) of
// the pairs that mask them: a query row's Q and dO reach dK and dV of every key in its tiles, a
// key's K reaches dQ of every row in its tiles. With the keys 30 positions ahead (causal), query
// rows 0..29 attend nothing and keys 170..199 are attended by nobody, so an inf there must reach
// nothing; a NaN in a row or key that does attend reaches exactly what the reference says (its
// own gradients, and through its LSE and D everything it attends). One input at a time.
TEST_CASE("backward: a NaN or inf in Q or K or dO reaches only the gradients the reference gives it", "[gpu][emu][grad][nonfinite]") {
  if (on_gpu()) shared_context(0).make_current();
  const Pattern p = PatternBuilder()
                        .branch(BranchSpec().segment(64).dilation(1).causal())
                        .branch(BranchSpec().segment(128).dilation(2).offset(OffsetRule::HeadMod).causal())
                        .build();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const auto& [dt, d, arch, deterministic] : std::vector<std::tuple<DType, int64_t, int, bool>>{
           {DType::F32, 32, 80, false}, {DType::F16, 64, 80, false}, {DType::BF16, 128, 80, false},
           {DType::BF16, 64, 80, true}, {DType::BF16, 64, 61, false}, {DType::BF16, 256, 80, false}, {DType::BF16, 256, 80, true}}) {
    if (on_gpu() && arch != 80) continue;
    RuntimeOptions ro;
    ro.device = gputest::target() == gputest::Target::Emu ? Device::emu(arch) : device_under_test();
    Runtime rt(ro);
    Shape s;
    s.seq_q = s.seq_k = 200, s.heads_q = 2, s.heads_kv = 1, s.head_dim = s.head_dim_v = d;
    s.k_offset = 30;
    // Element (row, head, dim) of a [1, 200, heads, d] tensor.
    auto at = [&](int64_t row, int64_t head, int64_t heads, int64_t dim) { return size_t((row * heads + head) * d + dim); };
    // Past head dim 128, some columns in the second slice of dK and dV (and of the single pass's
    // dQ), whose exact sums add that slice's columns only.
    const int64_t hi = d > 128 ? 128 : 0;
    const std::vector<std::pair<const char*, std::vector<Poke>>> cases = {
        // Rows 10 and 20 attend nothing; row 100 attends keys up to 70.
        {"q", {{'q', at(10, 0, 2, 1), nan}, {'q', at(20, 1, 2, hi), inf}, {'q', at(100, 0, 2, hi + 3), nan}}},
        // Rows 5 and 25 attend nothing (their D is NaN: dO times O = 0); row 120 attends keys up to 90.
        {"dO", {{'o', at(5, 1, 2, hi), nan}, {'o', at(25, 0, 2, 2), -inf}, {'o', at(120, 0, 2, hi + 1), nan}}},
        // Keys 180 and 190 are attended by nobody; key 60 by rows from 90 on.
        {"k", {{'k', at(180, 0, 1, hi), nan}, {'k', at(190, 0, 1, 2), inf}, {'k', at(60, 0, 1, hi + 1), nan}}},
    };
    for (const auto& [what, pokes] : cases) {
      INFO(to_string(dt) << " head_dim " << d << " sm_" << arch << (deterministic ? " deterministic" : "") << ", non-finite "
                         << what);
      CHECK(check_backward(rt, p, s, dt, nullptr, 93, deterministic, nullptr, false, false, false, pokes) == "");
    }
  }
}

// Past head dim 128 the tensor-core _dkdv adds dK and dV (and, in the single pass, dQ) a column
// slice at a time (compiler/codegen/codegen.hpp: backward_slices): two slices of 128 at head dim
// 256, uneven ones at 208 (112 and 96 columns) and at 144 (80 and 64), head dims of q and v apart
// (dV's slices of 32 columns beside dK's of 128; at 256 and 16 dV's second slice is empty, and
// at 16 and 256 dK's), in the single pass and the two-pass form. Finite inputs take no exact sum
// (the emulator counts them): an empty slice must not read a neighbour's columns as its own.
TEST_CASE("backward: head dims past 128 (dK and dV by column slices) match the reference gradients", "[gpu][emu][grad][wide]") {
  if (on_gpu()) shared_context(0).make_current();
  RuntimeOptions ro;
  ro.device = device_under_test();
  Runtime rt(ro);
  const Pattern p = PatternBuilder()
                        .branch(BranchSpec().segment(64).dilation(1).causal())
                        .branch(BranchSpec().segment(128).dilation(2).offset(OffsetRule::HeadMod))
                        .build();
  for (const auto& [dt, d, dv, deterministic] : std::vector<std::tuple<DType, int64_t, int64_t, bool>>{
           {DType::BF16, 256, 256, false}, {DType::BF16, 256, 256, true}, {DType::F16, 208, 208, false},
           {DType::BF16, 144, 256, false}, {DType::BF16, 256, 64, true}, {DType::BF16, 256, 16, false},
           {DType::F16, 16, 256, true}}) {
    Shape s;
    s.seq_q = s.seq_k = on_gpu() ? 777 : 150, s.heads_q = 4, s.heads_kv = 2, s.head_dim = d, s.head_dim_v = dv;
    INFO(to_string(dt) << " head dims " << d << " and " << dv << (deterministic ? ", deterministic" : ""));
    const uint64_t rare_before = emu::rare_paths_taken();
    CHECK(check_backward(rt, p, s, dt, nullptr, 260 + d + dv, deterministic) == "");
    CHECK(emu::rare_paths_taken() == rare_before);
  }
  // A Hopper's defaults (the emulator as sm_90a; on a GPU, its own defaults, a Hopper's where it
  // is one): the sm_80 kernels there, at the 64 x 64 tiles its shared memory fits (sm_80's takes
  // 32 x 32), single pass and deterministic.
  RuntimeOptions hro;
  hro.device = gputest::target() == gputest::Target::Emu ? Device::emu(90, true) : device_under_test();
  Runtime hopper(hro);
  for (const bool deterministic : {false, true}) {
    Shape s;
    s.seq_q = s.seq_k = on_gpu() ? 777 : 150, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = 256;
    INFO("sm_90a defaults, head dim 256" << (deterministic ? ", deterministic" : ""));
    CHECK(check_backward(hopper, p, s, DType::BF16, nullptr, 777, deterministic) == "");
  }
}

// The Hopper backward's dK/dV kernels on the warpgroup MMA (the default there: RuntimeOptions::wgmma_backward):
// the TMA kernel with its producer warpgroup (templates/bwd_sm90_tma.cuh, 64 x 128 tiles) and the
// cp.async one (templates/bwd_sm90.cuh, RuntimeOptions::tma off), emulated as sm_90a, or on a GPU
// of compute capability 9.0 (other GPUs run the sm_80 kernels for the same options, and the case
// says so). Every example pattern, fp16 and bf16, head dims 64 and 128, the single pass and the
// two-pass form (its dQ from bwd_sm90_dq.cuh's _dq), rows that attend nothing, and non-finite inputs
// at masked pairs.
TEST_CASE("backward: the sm_90a wgmma dK/dV kernels match the reference gradients", "[gpu][emu][grad][sm90a]") {
  if (on_gpu()) shared_context(0).make_current();
  const bool tma = GENERATE(true, false);
  INFO((tma ? "the TMA kernel (bwd_sm90_tma.cuh)" : "the cp.async kernel (bwd_sm90.cuh)"));
  RuntimeOptions ro;
  ro.device = gputest::target() == gputest::Target::Emu ? Device::emu(90, true) : device_under_test();
  ro.wgmma_backward = true;
  ro.tma = tma;
  if (on_gpu() && device_info(0).cc_major * 10 + device_info(0).cc_minor != 90)
    WARN("not a Hopper GPU: the sm_80 backward kernels run instead of the wgmma one");
  Runtime rt(ro);
  int n = 0;
  for (const auto& [file, p] : example_patterns()) {
    Shape s;
    s.seq_q = s.seq_k = on_gpu() ? 777 : 150, s.heads_q = 4, s.heads_kv = 2;
    for (const auto& [dt, d, deterministic] : std::vector<std::tuple<DType, int64_t, bool>>{
             {DType::BF16, 64, false}, {DType::F16, 128, false}, {DType::BF16, 128, true}}) {
      s.head_dim = s.head_dim_v = d;
      INFO(file << " " << to_string(dt) << " head_dim " << d << (deterministic ? " deterministic" : ""));
      CHECK(check_backward(rt, p, s, dt, nullptr, 700 + n++, deterministic, nullptr, false, false, false, {}, true) == "");
    }
  }
  {
    // Query rows no tensor map describes (stride 16, an odd length: no fold): the TMA kernel's
    // call runs its fallback (the sm_80 kernels at the same tiles); stride 12 folds by 3.
    for (const int64_t rate : {16, 12}) {
      const Pattern dilated = PatternBuilder()
                                  .branch(BranchSpec().segment(64).dilation(1))
                                  .branch(BranchSpec().segment(64 * rate).dilation(rate).offset(OffsetRule::HeadMod))
                                  .build();
      Shape s;
      s.seq_q = s.seq_k = on_gpu() ? 1001 : 301, s.heads_q = 2, s.heads_kv = 1, s.head_dim = s.head_dim_v = 64;
      INFO("query stride " << rate << " at " << s.seq_q << " rows");
      CHECK(check_backward(rt, dilated, s, DType::BF16, nullptr, 96) == "");
    }
  }
  const Pattern p = PatternBuilder()
                        .branch(BranchSpec().segment(64).dilation(1).causal())
                        .branch(BranchSpec().segment(128).dilation(2).offset(OffsetRule::HeadMod).causal())
                        .build();
  Shape s;
  s.seq_q = s.seq_k = 200, s.heads_q = 2, s.heads_kv = 1, s.head_dim = s.head_dim_v = 64;
  s.k_offset = 30;  // rows 0..29 attend nothing, keys 170..199 are attended by nobody
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  auto at = [&](int64_t row, int64_t head, int64_t heads) { return size_t((row * heads + head) * 64 + 1); };
  const std::vector<std::pair<const char*, std::vector<Poke>>> cases = {
      {"none", {}},
      {"q", {{'q', at(10, 0, 2), nan}, {'q', at(100, 0, 2), nan}}},
      {"dO", {{'o', at(5, 1, 2), nan}, {'o', at(120, 0, 2), nan}}},
      {"k", {{'k', at(180, 0, 1), nan}, {'k', at(190, 0, 1), inf}, {'k', at(60, 0, 1), nan}}},
      {"v", {{'v', at(40, 0, 1), nan}, {'v', at(195, 0, 1), inf}}},
  };
  for (const auto& [what, pokes] : cases) {
    for (const bool deterministic : {false, true}) {  // the single pass; the two-pass form's dQ kernel (bwd_sm90_dq.cuh)
      INFO("causal with empty rows, non-finite " << what << (deterministic ? ", deterministic" : ""));
      CHECK(check_backward(rt, p, s, DType::BF16, nullptr, 95, deterministic, nullptr, false, false, false, pokes) == "");
    }
  }
}

// Persistent _dkdv blocks (RuntimeOptions::persistent_blocks): the Hopper TMA backward launched with
// fewer blocks than units (a launch's key items x batch entries), each block taking units in turn,
// its producer running on into the next item's query entries while the consumers finish the last.
// Every example at head dims 64 and 128; one block (every unit in it), two, three and one per SM
// (the emu device's 4); a batch of 2 (units interleave the batch entries); the single pass, the
// deterministic mode (one launch per layer of disjoint key tiles) and one causal branch (dK and dV
// stored, items without query entries included: the keys that no row attends). On a GPU without
// the Hopper kernels the option must change nothing, which the same cases check.
TEST_CASE("backward: persistent dK/dV blocks give the reference gradients on every example", "[gpu][emu][grad][persistent]") {
  if (on_gpu()) shared_context(0).make_current();
  int n = 0;
  auto runtime = [&](int blocks) {
    RuntimeOptions ro;
    ro.device = gputest::target() == gputest::Target::Emu ? Device::emu(90, true) : device_under_test();
    ro.wgmma_backward = true;
    ro.persistent_blocks = blocks;
    return Runtime(ro);
  };
  for (const auto& [file, p] : example_patterns()) {
    for (const int64_t d : {int64_t(64), int64_t(128)}) {
      const int blocks = std::vector<int>{1, 2, 3, -1}[size_t(n % 4)];
      const bool deterministic = n % 3 == 1;
      Runtime rt = runtime(blocks);
      Shape s;
      s.batch = 2, s.seq_q = s.seq_k = on_gpu() ? 777 : 150, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = d;
      INFO(file << " head_dim " << d << ", " << blocks << " persistent blocks" << (deterministic ? ", deterministic" : ""));
      CHECK(check_backward(rt, p, s, DType::BF16, nullptr, 9300 + n, deterministic, nullptr, false, false, false, {}, true) == "");
      ++n;
    }
  }
  const Pattern causal = PatternBuilder().branch(BranchSpec().full().causal()).build();
  Shape s;
  s.batch = 2, s.seq_q = s.seq_k = 300, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = 64;
  s.k_offset = 100;  // the last 100 keys are attended by no row
  for (const int blocks : {2, 3}) {
    Runtime rt = runtime(blocks);
    INFO("one causal branch, dK and dV stored, " << blocks << " persistent blocks");
    CHECK(check_backward(rt, causal, s, DType::BF16, nullptr, 9390 + blocks) == "");
  }
}

// The Hopper two-pass form's dQ kernel (templates/bwd_sm90_dq.cuh: two warpgroups over each key
// tile's halves, warpgroup 1's sums added to warpgroup 0's in a fixed order), which the
// deterministic mode runs beside either dK/dV kernel: the same bits on every run, with key tiles of
// several branches overlapping, head dims 64 and 128 with Dv != D, fp16 and bf16, tiles whose
// second half holds no key (a 64-key segment in a 128-key tile; 280 rows end in a tile of 24),
// against the reference.
TEST_CASE("backward: the sm_90a dQ kernel of the deterministic mode gives the same bits every time", "[gpu][emu][grad][sm90a][deterministic]") {
  if (on_gpu()) shared_context(0).make_current();
  const bool tma = GENERATE(true, false);
  INFO((tma ? "beside the TMA dK/dV kernel (64 x 128 tiles)" : "beside the cp.async dK/dV kernel (64 x 64 tiles)"));
  RuntimeOptions ro;
  ro.device = gputest::target() == gputest::Target::Emu ? Device::emu(90, true) : device_under_test();
  ro.wgmma_backward = true;
  ro.tma = tma;
  Runtime rt(ro);
  const Pattern p = PatternBuilder()
                        .branch(BranchSpec().segment(64).dilation(1))
                        .branch(BranchSpec().segment(128).dilation(2).offset(OffsetRule::HeadMod))
                        .branch(BranchSpec().segment(256).dilation(4).offset(OffsetRule::HeadMod).causal())
                        .build();
  int n = 0;
  for (const auto& [dt, d, dv, len] : std::vector<std::tuple<DType, int64_t, int64_t, int64_t>>{
           {DType::BF16, 64, 64, 300}, {DType::F16, 128, 64, 280}, {DType::BF16, 64, 128, 161}}) {
    Shape s;
    s.seq_q = s.seq_k = on_gpu() ? len * 10 + 3 : len, s.heads_q = 4, s.heads_kv = 2, s.head_dim = d, s.head_dim_v = dv;
    INFO(to_string(dt) << " head dims " << d << "/" << dv << " at " << s.seq_q << " rows");
    std::vector<uint8_t> first, again;
    REQUIRE(check_backward(rt, p, s, dt, nullptr, 60 + n, true, &first) == "");
    for (int run = 0; run < 2; ++run) {
      again.clear();
      REQUIRE(check_backward(rt, p, s, dt, nullptr, 60 + n, true, &again) == "");
      CHECK(again == first);
    }
    ++n;
  }
}

TEST_CASE("backward: a caller's workspace gives the same bits as the pool's, a wrong one is a clear error", "[gpu][emu][grad][workspace]") {
  if (on_gpu()) shared_context(0).make_current();
  RuntimeOptions ro;
  ro.device = device_under_test();
  Runtime rt(ro);
  const Pattern p = load_spec_file(std::string(ATTNJIT_EXAMPLES_DIR) + "/longnet.json");
  Shape s;
  s.seq_q = s.seq_k = on_gpu() ? 4096 : 256, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = 64;
  std::vector<uint8_t> pool, caller;
  CHECK(check_backward(rt, p, s, DType::BF16, nullptr, 5, true, &pool) == "");
  CHECK(check_backward(rt, p, s, DType::BF16, nullptr, 5, true, &caller, true) == "");
  CHECK(pool == caller);
  Attention op = rt.prepare(p, Problem{1, s.seq_q, s.seq_k, s.heads_q, s.heads_kv, 64, 64, DType::BF16, {}});
  const size_t need = op.backward_workspace_bytes();
  if (on_gpu()) CHECK(need >= size_t(s.seq_k * s.heads_kv * 64) * 8);  // at least the fp32 dK and dV accumulators
  else CHECK(need == 0);                                                // the emulator and the CPU need none
  // The errors are checked before anything runs, so the tensors may be anything of the right shape.
  std::vector<std::unique_ptr<Mem>> mems;
  auto tensor = [&](DType t, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    mems.push_back(std::make_unique<Mem>(size_t(n) * size_t(dtype_bytes(t))));
    return TensorView::contiguous(mems.back()->data(), t, std::move(shape));
  };
  const std::vector<int64_t> qs{1, s.seq_q, s.heads_q, 64}, ks{1, s.seq_k, s.heads_kv, 64};
  const TensorView q = tensor(DType::BF16, qs), k = tensor(DType::BF16, ks), v = tensor(DType::BF16, ks),
                   o = tensor(DType::BF16, qs), dout = tensor(DType::BF16, qs), dq = tensor(DType::BF16, qs),
                   dk = tensor(DType::BF16, ks), dv = tensor(DType::BF16, ks),
                   lse = tensor(DType::F32, {1, s.heads_q, s.seq_q});
  Mem ws(need + 512);
  ForwardOptions fo;
  fo.workspace_bytes = 1024;
  CHECK_THROWS_WITH(op.backward(q, k, v, o, lse, dout, dq, dk, dv, fo), Catch::Contains("workspace: is null but workspace_bytes is 1024"));
  char* const base = static_cast<char*>(ws.data());
  char* const aligned = base + (256 - reinterpret_cast<uintptr_t>(base) % 256) % 256;
  fo.workspace = aligned + 16;
  CHECK_THROWS_WITH(op.backward(q, k, v, o, lse, dout, dq, dk, dv, fo), Catch::Contains("workspace: must be 256-byte aligned"));
  if (on_gpu()) {
    fo.workspace = aligned, fo.workspace_bytes = need - 1;
    CHECK_THROWS_WITH(op.backward(q, k, v, o, lse, dout, dq, dk, dv, fo), Catch::Contains("bytes but this backward needs " + std::to_string(need)));
  }
}

// A first forward and backward captured in one CUDA graph: the backward kernels compile and load,
// both plans' tables are copied and the workspace is allocated inside the capture (nothing
// synchronises). The replays match the reference, and in the deterministic mode the eager bits.
TEST_CASE("backward: a first forward and backward captured in a CUDA graph match the reference and the eager bits", "[gpu][grad][graph]") {
  if (!on_gpu()) { WARN("SKIPPED on the emulator and the CPU device: CUDA graphs need a GPU"); return; }
  shared_context(0).make_current();
  RuntimeOptions ro;
  ro.device = Device::cuda(0);
  Runtime rt(ro);
  const Pattern p = load_spec_file(std::string(ATTNJIT_EXAMPLES_DIR) + "/longnet.json");
  Shape s;
  s.seq_q = s.seq_k = 2048, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = 64;
  for (bool caller_workspace : {false, true}) {
    INFO("caller's workspace: " << caller_workspace);
    std::vector<uint8_t> eager, captured;
    CHECK(check_backward(rt, p, s, DType::BF16, nullptr, 9, true, &eager, caller_workspace) == "");
    CHECK(check_backward(rt, p, s, DType::BF16, nullptr, 9, true, &captured, caller_workspace, false, true) == "");
    CHECK(eager == captured);
  }
}

TEST_CASE("backward: every tile configuration the tuner can pick matches the reference", "[gpu][emu][grad][configs]") {
  if (gputest::target() == gputest::Target::Cpu) {
    WARN("SKIPPED on the CPU device: it has no kernel configurations");
    return;
  }
  if (on_gpu()) shared_context(0).make_current();
  const int arch = on_gpu() ? device_info(0).cc_major * 10 + device_info(0).cc_minor : 80;
  const Pattern p = PatternBuilder()
                        .branch(BranchSpec().segment(64).dilation(1).causal())
                        .branch(BranchSpec().segment(256).dilation(4).offset(OffsetRule::HeadMod))
                        .build();
  // The emulator takes one head dim per path (each config is a compile) and head dim 256 (column
  // slices; on sm_80 one config fits); a GPU takes all.
  std::vector<std::pair<DType, int>> kinds = {{DType::BF16, 64}, {DType::F32, 32}, {DType::BF16, 256}};
  if (on_gpu()) kinds.push_back({DType::F16, 128});
  int n = 0;
  for (const auto& [dt, d] : kinds) {
    KernelRequest r;
    r.head_dim = r.head_dim_v = d, r.dtype = dt, r.arch = arch;
    for (const KernelConfig& c : candidate_backward_configs(r)) {
      RuntimeOptions ro;
      ro.device = device_under_test();
      ro.backward_config = c;
      Runtime rt(ro);
      Shape s;
      s.seq_q = s.seq_k = on_gpu() ? 2000 : 300, s.heads_q = 2, s.heads_kv = 1, s.head_dim = s.head_dim_v = d;
      INFO(to_string(dt) << " d=" << d << " backward config " << describe(c));
      CHECK(check_backward(rt, p, s, dt, nullptr, 500 + n++) == "");
    }
  }
}

TEST_CASE("backward: a tile configuration no kernel supports is a clear error", "[gpu][emu][grad][configs]") {
  if (gputest::target() == gputest::Target::Cpu) {
    WARN("SKIPPED on the CPU device: it has no kernel configurations");
    return;
  }
  if (on_gpu()) shared_context(0).make_current();
  RuntimeOptions ro;
  ro.device = device_under_test();
  ro.backward_config = KernelConfig{48, 64, 2};
  Runtime rt(ro);
  const Pattern p = PatternBuilder().branch(BranchSpec().full()).build();
  CHECK_THROWS_WITH(rt.prepare(p, Problem{1, 128, 128, 2, 2, 64, 64, DType::BF16, {}}),
                    Catch::Contains("backward tile") && Catch::Contains("{16, 32, 64, 128}"));
}

TEST_CASE("weights: from the device's own LSE, equal to the reference's and explaining its O", "[gpu][emu][weights]") {
  if (on_gpu()) shared_context(0).make_current();
  RuntimeOptions ro;
  ro.device = device_under_test();
  Runtime rt(ro);
  const Pattern p = load_spec_file(std::string(ATTNJIT_EXAMPLES_DIR) + "/longnet.json");
  Shape s;
  s.batch = 2, s.seq_q = s.seq_k = 200, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = 64;
  const DType dt = DType::BF16;
  const std::vector<int64_t> qs{s.batch, s.seq_q, s.heads_q, 64}, ks{s.batch, s.seq_k, s.heads_kv, 64};
  const auto q = rounded(testing::random_tensor(size_t(s.batch * s.seq_q * s.heads_q * 64), 91), dt);
  const auto k = rounded(testing::random_tensor(size_t(s.batch * s.seq_k * s.heads_kv * 64), 92), dt);
  const auto v = rounded(testing::random_tensor(size_t(s.batch * s.seq_k * s.heads_kv * 64), 93), dt);
  Mem mq(q.size() * 2), mk(k.size() * 2), mv(v.size() * 2), mo(q.size() * 2), ml(size_t(s.batch * s.heads_q * s.seq_q) * 4),
      mw(size_t(s.batch * s.heads_q * s.seq_q * s.seq_k) * 4);
  mq.upload(encode(q, dt)), mk.upload(encode(k, dt)), mv.upload(encode(v, dt));
  Attention op = rt.prepare(p, Problem{s.batch, s.seq_q, s.seq_k, s.heads_q, s.heads_kv, 64, 64, dt, {}});
  const TensorView Q = TensorView::contiguous(mq.data(), dt, qs), K = TensorView::contiguous(mk.data(), dt, ks),
                   V = TensorView::contiguous(mv.data(), dt, ks), O = TensorView::contiguous(mo.data(), dt, qs),
                   L = TensorView::contiguous(ml.data(), DType::F32, {s.batch, s.heads_q, s.seq_q}),
                   W = TensorView::contiguous(mw.data(), DType::F32, {s.batch, s.heads_q, s.seq_q, s.seq_k});
  op.forward(Q, K, V, O, &L);
  op.weights(Q, K, L, W);  // on a GPU: after the (default) stream finishes, without a synchronise here
  const std::vector<float> w = decode(mw.download(), DType::F32), o = decode(mo.download(), dt);
  const std::vector<double> want = reference_weights(p, s, q.data(), k.data());
  double worst = 0.0;
  for (size_t x = 0; x < want.size(); ++x) worst = std::max(worst, std::abs(double(w[x]) - want[x]));
  CHECK(worst <= 2e-3);  // the kernel's LSE from bf16 inputs, fp32 accumulation
  double worst_o = 0.0;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t i = 0; i < s.seq_q; ++i)
      for (int64_t h = 0; h < s.heads_q; ++h)
        for (int64_t d = 0; d < 64; ++d) {
          double sum = 0.0;
          for (int64_t j = 0; j < s.seq_k; ++j)
            sum += double(w[size_t(((b * s.heads_q + h) * s.seq_q + i) * s.seq_k + j)]) * v[size_t(((b * s.seq_k + j) * s.heads_kv + h / 2) * 64 + d)];
          worst_o = std::max(worst_o, std::abs(sum - o[size_t(((b * s.seq_q + i) * s.heads_q + h) * 64 + d)]));
        }
  CHECK(worst_o <= 1e-2);  // O is stored in bf16
}

TEST_CASE("documents: packed documents on the device equal the packed reference, forward and backward", "[gpu][emu][documents]") {
  if (on_gpu()) shared_context(0).make_current();
  RuntimeOptions ro;
  ro.device = device_under_test();
  Runtime rt(ro);
  ro.random_in_kernel_above = 0;
  Runtime rt_seek(ro);  // random layouts decided in the kernels, at positions within each document
  const Pattern longnet = load_spec_file(std::string(ATTNJIT_EXAMPLES_DIR) + "/longnet.json");
  const Pattern bigbird = PatternBuilder()
                              .layout(layouts::union_of({layouts::local(1, 32, 32), layouts::global({0}, 32, 32),
                                                         layouts::random(0.2, 99, 32, 32)}, 32, 32))
                              .branch(BranchSpec().full())
                              .build();
  for (const auto& [name, p, runtime] : {std::tuple<const char*, const Pattern*, Runtime*>{"longnet", &longnet, &rt},
                                         {"bigbird-like, random in the kernels", &bigbird, &rt_seek}}) {
    INFO(name);
    Shape s;
    s.batch = 1, s.seq_q = s.seq_k = 700, s.heads_q = 4, s.heads_kv = 2, s.head_dim = s.head_dim_v = 64;
    const std::vector<int64_t> cu{0, 150, 150, 413, 700};  // an empty document, lengths no multiple of a tile
    const DType dt = DType::BF16;
    const std::vector<int64_t> qs{1, s.seq_q, s.heads_q, 64}, ks{1, s.seq_k, s.heads_kv, 64};
    const auto q = rounded(testing::random_tensor(size_t(s.seq_q * s.heads_q * 64), 71), dt);
    const auto k = rounded(testing::random_tensor(size_t(s.seq_k * s.heads_kv * 64), 72), dt);
    const auto v = rounded(testing::random_tensor(size_t(s.seq_k * s.heads_kv * 64), 73), dt);
    const auto dout = rounded(testing::random_tensor(size_t(s.seq_q * s.heads_q * 64), 74), dt);
    Mem mq(q.size() * 2), mk(k.size() * 2), mv(v.size() * 2), mo(q.size() * 2), mdo(q.size() * 2), ml(size_t(s.heads_q * s.seq_q) * 4),
        mdq(q.size() * 2), mdk(k.size() * 2), mdv(v.size() * 2);
    mq.upload(encode(q, dt)), mk.upload(encode(k, dt)), mv.upload(encode(v, dt)), mdo.upload(encode(dout, dt));
    Attention op = runtime->prepare(*p, Problem{1, s.seq_q, s.seq_k, s.heads_q, s.heads_kv, 64, 64, dt, {}});
    const TensorView Q = TensorView::contiguous(mq.data(), dt, qs), K = TensorView::contiguous(mk.data(), dt, ks),
                     V = TensorView::contiguous(mv.data(), dt, ks), O = TensorView::contiguous(mo.data(), dt, qs),
                     dO = TensorView::contiguous(mdo.data(), dt, qs), L = TensorView::contiguous(ml.data(), DType::F32, {1, s.heads_q, s.seq_q}),
                     dQ = TensorView::contiguous(mdq.data(), dt, qs), dK = TensorView::contiguous(mdk.data(), dt, ks),
                     dV = TensorView::contiguous(mdv.data(), dt, ks);
    ForwardOptions fo;
    fo.cu_seqlens = &cu;
    op.forward(Q, K, V, O, &L, fo);
    op.backward(Q, K, V, O, L, dO, dQ, dK, dV, fo);
    if (on_gpu()) synchronize(nullptr);
    const ReferenceOutput want = reference_attention(*p, s, q.data(), k.data(), v.data(), nullptr, 0, &cu);
    const ReferenceGradients gwant = reference_attention_backward(*p, s, q.data(), k.data(), v.data(), dout.data(), nullptr, 0, &cu);
    auto worst = [](const std::vector<float>& got, const std::vector<double>& w) {
      double e = 0.0;
      for (size_t x = 0; x < w.size(); ++x) e = std::max(e, std::abs(double(got[x]) - w[x]) / (1.0 + std::abs(w[x])));
      return e;
    };
    const std::vector<float> lse = decode(ml.download(), DType::F32);
    double worst_lse = 0.0;
    for (size_t x = 0; x < lse.size(); ++x) worst_lse = std::max(worst_lse, std::abs(double(lse[x]) - want.lse[x]));
    CHECK(worst(decode(mo.download(), dt), want.o) <= 1e-2);  // O stored in bf16
    CHECK(worst_lse <= 1e-4);
    CHECK(worst(decode(mdq.download(), dt), gwant.dq) <= 3e-2);
    CHECK(worst(decode(mdk.download(), dt), gwant.dk) <= 3e-2);
    CHECK(worst(decode(mdv.download(), dt), gwant.dv) <= 3e-2);
  }
}
