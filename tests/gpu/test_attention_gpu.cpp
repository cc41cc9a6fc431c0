// The generated kernels on a GPU against the float64 CPU reference (docs/testing.md): every
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
// Knobs: ATTNJIT_GPU_TEST_REPORT=FILE appends one JSON line per case (tests/device/device_check.sh);
// ATTNJIT_GPU_TESTS_RANDOM=N random cases (240 on a GPU; in the emulator 60, or 200 under
// ATTNJIT_TEST_SWEEP=1, as the other sweeps' counts: sweep_count); ATTNJIT_GPU_TESTS_SCALE=x
// scales the example lengths (1).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attnjit/attnjit.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/support/knobs.hpp"
#include "runtime/cuda/cuda_driver.hpp"
#include "tests/gpu/attention_cases.hpp"
#include "tests/unit/random_patterns.hpp"

using namespace attnjit;
using namespace attnjit::gputest;

TEST_CASE("every example pattern matches the float64 reference in the emulator", "[emu][attention][examples]") {
  if (target() != Target::Emu) { WARN("SKIPPED: an emulator case (ATTNJIT_GPU_TESTS_DEVICE=emu)"); return; }
  check_cases("emu-examples", emu_example_cases());
}

TEST_CASE("random patterns match the float64 reference in the emulator", "[emu][attention][random]") {
  if (target() != Target::Emu) { WARN("SKIPPED: an emulator case (ATTNJIT_GPU_TESTS_DEVICE=emu)"); return; }
  std::vector<Case> cases = random_cases(2026, sweep_count("ATTNJIT_GPU_TESTS_RANDOM", 60, 200), true);
  for (size_t n = 0; n < cases.size(); n += 5) {
    if (cases[n].dtype == DType::F16) cases[n].arch = 75;  // the SIMT path for half too
    if (cases[n].dtype == DType::BF16) cases[n].arch = 61;  // and for bf16 on Pascal
  }
  check_cases("emu-random", cases);
}

// The "torchscale" offset rule where the dilation does not divide the heads (H = 6 at r = 4,
// H = 4 at r = 8: residues without heads, two heads a residue), GQA and a query offset, on the
// sm_80 tensor-core and the SIMT paths; the plan executor under ATTNJIT_GPU_TESTS_DEVICE=cpu.
TEST_CASE("the torchscale offset rule matches the float64 reference on every path", "[gpu][emu][attention][torchscale]") {
  SKIP_WITHOUT_GPU();
  const Pattern p = PatternBuilder()
                        .branch(BranchSpec().segment(32).dilation(1))
                        .branch(BranchSpec().segment(64).dilation(4).offset(OffsetRule::Torchscale))
                        .branch(BranchSpec().segment(128).dilation(8).offset(OffsetRule::Torchscale))
                        .build();
  std::vector<Case> cases;
  uint64_t seed = 4800;
  for (const auto& [hq, hkv, q_offset, dt, arch] :
       {std::tuple<int64_t, int64_t, int64_t, DType, int>{6, 6, 0, DType::BF16, 80}, {6, 3, 40, DType::F16, 75},
        {4, 2, 0, DType::F32, 80}, {4, 4, 24, DType::BF16, 80}}) {
    Case c;
    c.name = "torchscale-H" + std::to_string(hq) + "-kv" + std::to_string(hkv) + "-off" + std::to_string(q_offset);
    c.pattern = p, c.shape = make_shape(1, 150, 190, hq, hkv, 64, q_offset, 0), c.dtype = dt, c.arch = arch;
    c.seed = seed++;
    cases.push_back(std::move(c));
  }
  check_cases("torchscale-offsets", cases);
}

TEST_CASE("every tile configuration the autotuner can choose matches the reference", "[gpu][emu][attention][configs]") {
  SKIP_WITHOUT_GPU();
  if (target() == Target::Cpu) { WARN("SKIPPED on the CPU device: it has no kernel configurations"); return; }
  // A GPU's candidates are those of its own arch (more shared memory on sm_90); the emulator's, sm_80's.
  const int arch = target() == Target::Gpu ? device_info(0).cc_major * 10 + device_info(0).cc_minor : 80;
  check_cases("configs", config_cases(target() == Target::Emu ? 203 : 1999, arch, target() == Target::Gpu && knobs().sm90a));
}

// The Hopper forward (sm_90a, wgmma) in the emulator: every example at head dims 64, 128 and 256
// in fp16 and bf16, a random sweep with those head dims (fp32 cases become bf16), and every
// configuration the autotuner offers that path, through the TMA kernel where tensor maps describe
// the keys; the examples again through the cp.async kernel, and the cases that need it. Other
// head dims fall back to the sm_80 kernel.
TEST_CASE("the sm_90a forward matches the float64 reference in the emulator", "[emu][attention][sm90a]") {
  if (target() != Target::Emu) { WARN("SKIPPED: an emulator case (ATTNJIT_GPU_TESTS_DEVICE=emu)"); return; }
  std::vector<Case> cases = emu_example_cases(true);
  std::mt19937_64 rng(2090);
  for (Case& c : random_cases(2090, sweep_count("ATTNJIT_GPU_TESTS_RANDOM_SM90A", 12, 30), true)) {
    const int64_t dims[] = {64, 128, 256};
    c.shape.head_dim = dims[rng() % 3];
    c.shape.head_dim_v = rng() % 4 ? c.shape.head_dim : dims[rng() % 3];
    if (c.dtype == DType::F32) c.dtype = DType::BF16;
    c.arch = 90, c.sm90a = true, c.name += "/sm90a";
    cases.push_back(std::move(c));
  }
  for (Case& c : config_cases(203, 90, true)) cases.push_back(std::move(c));
  // 176-key tiles (FlashAttention-3's 128 x 176) on every example without a block layout (those are
  // refused that tile: resolve_config), up to head dim 128, through both kernels: sequences of one
  // partial key tile, of one whole and one partial, and a chunk at an offset.
  int tile176 = 0;
  for (const bool tma : {true, false})
    for (Case c : emu_example_cases(true)) {
      const bool layouts = std::any_of(c.pattern.branches.begin(), c.pattern.branches.end(),
                                       [](const Branch& b) { return b.layout.has_value(); });
      if (layouts || c.shape.head_dim > 128) continue;
      c.config = KernelConfig{128, 176, 2}, c.tma = tma, c.name += std::string("/128x176") + (tma ? "" : "/cp.async");
      cases.push_back(std::move(c));
      ++tile176;
    }
  REQUIRE(tile176 >= 12);
  // ... and on a random sweep (patterns without block layouts, head dims 64 and 128), through the
  // TMA kernel.
  int random176 = 0;
  for (Case& c : random_cases(2176, 30, true)) {
    if (std::any_of(c.pattern.branches.begin(), c.pattern.branches.end(), [](const Branch& b) { return b.layout.has_value(); }))
      continue;
    c.shape.head_dim = c.shape.head_dim_v = random176 % 2 ? 128 : 64;
    if (c.dtype == DType::F32) c.dtype = DType::BF16;
    c.arch = 90, c.sm90a = true, c.config = KernelConfig{128, 176, 2}, c.name += "/sm90a/128x176";
    cases.push_back(std::move(c));
    if (++random176 >= sweep_count("ATTNJIT_GPU_TESTS_RANDOM_176", 4, 8)) break;
  }
  REQUIRE(random176 >= std::min(4, sweep_count("ATTNJIT_GPU_TESTS_RANDOM_176", 4, 8)));
  // The cp.async kernel (where tensor maps cannot describe the keys): every example once more.
  for (Case c : emu_example_cases(true)) {
    c.tma = false, c.name += "/cp.async";
    cases.push_back(std::move(c));
  }
  // Key strides past 8: tensor maps that fold the rows by a divisor of the stride and of the key
  // length (16 at 512 and 520 tokens: by 2; LongNet's rates at 610 tokens: 12 by 2; at 609: 12 by
  // 3), the cp.async kernel where none exists (16 at 521 tokens); five strides take five maps,
  // nine strides are more maps than the kernel takes (cp.async).
  const Pattern wide = PatternBuilder()
                           .branch(BranchSpec().segment(256).dilation(1).causal())
                           .branch(BranchSpec().segment(512).dilation(16).offset(OffsetRule::HeadMod))
                           .build();
  PatternBuilder five, nine, longnet;
  for (int r : {1, 2, 3, 5, 7}) five.branch(BranchSpec().segment(64 * r).dilation(r));
  for (int r : {1, 2, 3, 4, 5, 6, 7, 8, 9}) nine.branch(BranchSpec().segment(32 * r).dilation(r));
  for (int r : {1, 2, 4, 6, 12}) longnet.branch(BranchSpec().segment(48 * r).dilation(r).offset(OffsetRule::HeadMod));
  uint64_t seed = 9900;
  for (const auto& [name, p, seq] : {std::tuple<const char*, Pattern, int64_t>{"stride16-divides", wide, 512},
                                     {"stride16-fold2", wide, 520}, {"stride16-no-fold", wide, 521},
                                     {"five-strides", five.build(), 300}, {"nine-strides", nine.build(), 300},
                                     {"longnet-rates-fold2", longnet.build(), 610}, {"longnet-rates-fold3", longnet.build(), 609}})
    for (int64_t d : {64, 128}) {
      Case c;
      c.name = std::string(name) + "/sm90a-d" + std::to_string(d);
      c.pattern = p, c.shape = make_shape(1, seq, seq, 4, 2, d), c.dtype = DType::BF16, c.arch = 90, c.sm90a = true;
      c.seed = seed++;
      cases.push_back(std::move(c));
    }
  check_cases("emu-sm90a", cases);
}

// Scores in the thousands (q and k times 12: the softmax is nearly one-hot): the running maximum
// must be in the units the exponent uses, or exp2 under- or overflows and rows come out empty or
// NaN. Ordinary inputs cannot tell: softmax does not depend on the shift.
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

// A NaN or an inf in V reaches exactly the rows that attend its key, as in the reference: a row
// that masks the key (a causal diagonal, a window's edge, a dilated branch's other residues, keys
// past the sequence's end) must not see it, though its tile holds the key and the tensor cores'
// P V multiplies the value by that row's P = 0. This is what an uninitialised tail of a KV cache
// does. Rows that attend nothing stay 0 beside it.
TEST_CASE("a NaN or inf in V reaches only the rows that attend its key, on every kernel path", "[gpu][emu][attention][nonfinite]") {
  SKIP_WITHOUT_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<std::pair<std::string, Pattern>> patterns = {
      {"window-5-0", PatternBuilder().branch(BranchSpec().full().window(5, 0)).build()},
      {"causal", PatternBuilder().branch(BranchSpec().full().causal()).build()},
      {"dilated", PatternBuilder()
                      .branch(BranchSpec().segment(64).dilation(2).offset(OffsetRule::HeadMod).causal())
                      .branch(BranchSpec().segment(32).dilation(1).causal())
                      .build()},
      {"local-blocks", PatternBuilder().branch(BranchSpec().layout(layouts::local(1, 16, 16))).build()},
  };
  std::vector<Case> cases;
  uint64_t seed = 4400;
  for (const auto& [pname, pattern] : patterns)
    for (const Path& path : forward_paths())
      for (const int64_t d : {int64_t(64), int64_t(128)}) {
        if (d == 128 && (path.arch < 80 || pname != "dilated")) continue;  // head dim 128: one pattern, the tensor-core paths
        Case c;
        c.name = pname + "/" + path.name + "/d" + std::to_string(d);
        c.pattern = pattern, c.dtype = path.dtype, c.arch = path.arch, c.sm90a = path.sm90a, c.tma = path.tma;
        c.seed = seed++;
        // 150 keys: a last tile cut short. Heads 4 over 2 kv heads.
        c.shape = make_shape(1, 150, 150, 4, 2, d);
        auto at = [&](int64_t key, int64_t kvh, int64_t dim) { return size_t((key * 2 + kvh) * d + dim); };
        c.v_values = {{at(40, 0, 3), nan}, {at(63, 0, 7), nan}, {at(63, 1, 0), inf}, {at(97, 1, 5), -inf},
                      {at(149, 0, d - 1), nan}};
        cases.push_back(std::move(c));
      }
  check_cases("nonfinite-v", cases);
}

// One step of ring attention: the forward writes only the rows that attend a key and leaves the
// others as they were (ForwardOptions::rows_with_work_only), on every kernel path. Keys after most
// queries (causal at k_offset 200: rows 0..199 attend nothing, whole tiles of them), and a dilated
// branch whose other residues attend nothing; GQA, a last tile cut short.
TEST_CASE("the forward of rows with work only writes those rows and leaves the others, on every kernel path", "[gpu][emu][attention][work_rows]") {
  SKIP_WITHOUT_GPU();
  const std::vector<std::tuple<std::string, Pattern, int64_t>> patterns = {
      {"causal-keys-later", PatternBuilder().branch(BranchSpec().full().causal()).build(), 200},
      {"dilated", PatternBuilder().branch(BranchSpec().segment(128).dilation(4).offset(OffsetRule::HeadMod)).build(), 0},
  };
  std::vector<Case> cases;
  uint64_t seed = 5100;
  for (const auto& [pname, pattern, k_offset] : patterns)
    for (const Path& path : forward_paths())
      for (const Mem mem : {Mem::BSHD, Mem::Padded}) {
        Case c;
        c.name = pname + "/" + path.name + "/" + to_string(mem);
        c.pattern = pattern, c.dtype = path.dtype, c.arch = path.arch, c.sm90a = path.sm90a, c.tma = path.tma, c.mem = mem;
        c.seed = seed++;
        c.shape = make_shape(1, 300, 300, 4, 2, 64, 0, k_offset);
        c.rows_with_work_only = true;
        cases.push_back(std::move(c));
      }
  check_cases("work-rows", cases);
}

// Scores so large that a fused exponent (s * scale - max in one fma) is off by the product's
// rounding error, which reaches hundreds here: P of the maximum would overflow fp16 (at about 1e9)
// or float (bf16 inputs at about 4e20) and the row come out inf or NaN. The maximum's weight must
// be exactly 1: each exponent is the rounded scaled score minus the maximum rounded the same way.
TEST_CASE("extreme finite scores: the maximum's weight is exactly 1 on every kernel path", "[gpu][emu][attention][extreme]") {
  SKIP_WITHOUT_GPU();
  std::vector<Case> cases;
  uint64_t seed = 4500;
  for (const auto& [pname, pattern] : {std::pair<std::string, Pattern>{"full", PatternBuilder().branch(BranchSpec().full()).build()},
                                       {"causal-dilated", PatternBuilder()
                                                              .branch(BranchSpec().segment(64).dilation(2).causal())
                                                              .branch(BranchSpec().full().window(20, 0))
                                                              .build()}})
    for (const Path& path : forward_paths()) {
      Case c;
      c.name = pname + "/extreme-" + path.name;
      c.pattern = pattern, c.dtype = path.dtype, c.arch = path.arch, c.sm90a = path.sm90a, c.tma = path.tma;
      c.seed = seed++;
      c.shape = make_shape(1, 130, 130, 2, 1, 64);
      // q and k up to these magnitudes: scores of about 1e10 in fp16, 1e23 in bf16, 1e33 in fp32.
      c.input_scale = path.dtype == DType::F16 ? 3e4f : path.dtype == DType::BF16 ? 1e11f : 1e16f;
      cases.push_back(std::move(c));
    }
  check_cases("extreme", cases);
}

// A dynamic table on the device with problems: entries past the key blocks, negative ones, repeats,
// a last row offset past the entries, rows out of order. The kernels count them as
// sanitize_dynamic_table does, skip the bad entries (the answer is the reference's over the table
// without them) and read nothing outside the arrays (the emulator checks every read). A branch
// whose layout is the table and one that joins it with another layout, strided; the SIMT path too.
TEST_CASE("a dynamic table on the device: problems counted, bad entries skipped, reads in bounds", "[gpu][emu][attention][device_table]") {
  SKIP_WITHOUT_GPU();
  const Pattern p = PatternBuilder()
                        .branch(BranchSpec().causal().layout(layouts::dynamic(16, 16)))
                        .branch(BranchSpec().segment(96).dilation(2).layout(
                            layouts::union_of({layouts::dynamic(16, 16), layouts::local(0, 32, 32)})))
                        // The seek through every other kind: explicit pairs, a random layout, an intersection.
                        .branch(BranchSpec().layout(layouts::union_of(
                            {layouts::dynamic(16, 16), layouts::explicit_blocks({{0, 3}, {2, 1}, {5, 6}, {6, 0}}, 32, 32),
                             layouts::intersect_of({layouts::random(0.3, 77, 16, 16), layouts::offsets({-2, 1}, 16, 16)})})))
                        .build();
  std::mt19937_64 rng(4711);
  std::vector<Case> cases, unspecified;
  int n = 0;
  for (bool unsorted : {false, true}) {
    for (const auto& [dt, arch, q_offset] : {std::tuple<DType, int, int64_t>{DType::BF16, 80, 0}, {DType::F16, 75, 40}, {DType::F32, 80, 24}}) {
      Case c;
      c.name = std::string("device-table-") + (unsorted ? "unsorted-" : "") + to_string(dt);
      c.pattern = p, c.dtype = dt, c.arch = arch, c.seed = 8400 + uint64_t(n++);
      c.shape = make_shape(1, 200, 240, 4, 2, dt == DType::F16 ? 32 : 64, q_offset, 0);
      const int64_t heads = 4, q_blocks = (q_offset + 200 + 15) / 16, k_blocks = (240 + 15) / 16;
      DynamicLayout raw;
      raw.heads = heads;
      raw.row_offsets = {0};
      for (int64_t r = 0; r < heads * q_blocks; ++r) {
        std::vector<int32_t> row;
        if (r % 5 == 1) row.push_back(int32_t(-1 - r));  // negative: before every real block
        for (int32_t kb = 0; kb < k_blocks; ++kb)
          if (rng() % 3 == 0) row.push_back(kb);
        if (r % 7 == 2 && !row.empty()) row.push_back(row.back());           // a repeat
        if (r % 3 == 0) row.push_back(int32_t(k_blocks + r));                // past the key blocks
        if (unsorted && r % 4 == 3 && row.size() > 2) std::swap(row.front(), row.back());
        raw.col_indices.insert(raw.col_indices.end(), row.begin(), row.end());
        raw.row_offsets.push_back(int64_t(raw.col_indices.size()));
      }
      raw.row_offsets.back() += 5;  // past the entries: clamped, counted twice (its row and the end)
      DynamicLayout clean;
      clean.heads = heads;
      c.table_problems = int32_t(sanitize_dynamic_table(raw.row_offsets.data(), heads * q_blocks, raw.col_indices.data(),
                                                         int64_t(raw.col_indices.size()), k_blocks, clean));
      c.dynamic = std::move(clean);
      c.raw_table = std::move(raw);
      c.device_table = true;
      c.answer_unspecified = unsorted;
      (unsorted ? unspecified : cases).push_back(std::move(c));
    }
  }
  check_cases("device-table", cases);
  check_cases("device-table-unsorted", unspecified);
}

// Random layouts decided in the kernels (the planning threshold at 0): the plan visits every tile
// the band allows and the kernels seek through the layout, taking a tile whole only where the
// layout keeps it whole (random_in_kernel_patterns); the SIMT path and the tensor-core path, with
// GQA and offsets. The backward: test_backward_gpu.cpp.
TEST_CASE("random layouts decided in the kernels match the reference", "[gpu][emu][attention][random_in_kernel]") {
  SKIP_WITHOUT_GPU();
  std::vector<Case> cases;
  int n = 0;
  for (const auto& [name, p] : random_in_kernel_patterns()) {
    for (const auto& [dt, arch, d, q_offset] :
         {std::tuple<DType, int, int64_t, int64_t>{DType::BF16, 80, 64, 0}, {DType::F16, 75, 32, 40}, {DType::BF16, 80, 128, 17}}) {
      Case c;
      c.name = "random-in-kernel/" + name + "-" + to_string(dt) + "-d" + std::to_string(d);
      c.pattern = p, c.dtype = dt, c.arch = arch, c.seed = 8600 + uint64_t(n++);
      c.shape = make_shape(1, 230, 250, 4, 2, d, q_offset, 0);
      c.random_in_kernel = true;
      cases.push_back(std::move(c));
    }
  }
  check_cases("random-in-kernel", cases);
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

// Small enough for compute-sanitizer (memcheck, racecheck): tests/device/device_check.sh runs "[sanitize]".
TEST_CASE("a small subset for compute-sanitizer", "[gpu][attention][sanitize]") {
  SKIP_WITHOUT_GPU();
  std::vector<Case> cases = example_cases(1.0, true);
  // The persistent forward (a Hopper GPU's TMA kernel; elsewhere the option changes nothing): its
  // rings running across items and its consumers' Q barrier under every tool.
  for (size_t i = 0; i < 2 && i < cases.size(); ++i) {
    Case c = cases[i];
    c.name += "/persistent3";
    c.persistent_blocks = 3;
    cases.push_back(std::move(c));
  }
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
    Attention op = rt.prepare(p, Problem{1, 1000, 1000, 4, 4, 64, 64, dt, {}});
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
        CHECK(byte_difference(o.buf.download(), want1.first) == "");
        CHECK(byte_difference(lse_buf.download(), want1.second) == "");
      }
      q.buf.upload(q2.buf.download());
      synchronize(nullptr);  // a copy from pageable memory may return before it lands
      graph.launch(stream);
      synchronize(stream);
      CHECK(byte_difference(o.buf.download(), want2.first) == "");
      CHECK(byte_difference(lse_buf.download(), want2.second) == "");
    }
    destroy_stream(stream);
  }
}

// A *first* forward() captured in a CUDA graph: the plan is made, its tables allocated and their
// copy recorded inside the capture (nothing synchronises). Replays give the bits of the same call
// made eagerly on another prepared attention; an eager call after the capture (which ran nothing)
// copies the tables itself, on another stream, and gives them too.
TEST_CASE("a first forward() captured in a CUDA graph plans, copies its tables and gives the eager answer", "[gpu][attention][graph]") {
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
    const Problem pb{1, 1000, 1000, 4, 4, 64, 64, dt, {}};
    Attention reference = rt.prepare(p, pb), op = rt.prepare(p, pb);
    const std::vector<float> x1 = testing::random_tensor(1000 * 4 * 64, 21), x2 = testing::random_tensor(1000 * 4 * 64, 22);
    Tensor q(&x1, shape, dt, Mem::BSHD), k(&x1, shape, dt, Mem::BSHD), v(&x1, shape, dt, Mem::BSHD);
    Tensor q2(&x2, shape, dt, Mem::BSHD), o(nullptr, shape, dt, Mem::BSHD);
    Buf lse_buf(4 * 1000 * 4);
    const TensorView lse{lse_buf.data(), DType::F32, {1, 4, 1000}, {4000, 1000, 1}};
    CUstream stream = create_stream(), other = create_stream();
    ForwardOptions fo;
    fo.stream = stream;
    fo.q_offset = fo.k_offset = 100;  // prepare() plans offset 0: these offsets plan inside the capture
    auto run = [&](Attention& a, Tensor& query, CUstream s) {
      o.buf.poison(s);
      ForwardOptions f = fo;
      f.stream = s;
      a.forward(query.view, k.view, v.view, o.view, &lse, f);
      synchronize(s);
      return std::make_pair(o.buf.download(), lse_buf.download());
    };
    const auto want1 = run(reference, q, stream), want2 = run(reference, q2, stream);
    o.buf.poison(stream);
    synchronize(stream);
    {
      CapturedGraph graph(stream, [&] { op.forward(q.view, k.view, v.view, o.view, &lse, fo); });
      const PlanCacheStats st = op.plan_cache_stats();
      CHECK(st.misses == 2);  // prepare()'s plan for offset 0 and the capture's
      CHECK(st.hits == 0);
      CHECK(st.in_graph == 1);
      for (int replay = 0; replay < 2; ++replay) {
        o.buf.poison(stream);
        graph.launch(stream);
        synchronize(stream);
        CHECK(byte_difference(o.buf.download(), want1.first) == "");
        CHECK(byte_difference(lse_buf.download(), want1.second) == "");
      }
      const auto again = run(op, q, other);  // eager, on a stream the capture never saw
      CHECK(byte_difference(again.first, want1.first) == "");
      CHECK(byte_difference(again.second, want1.second) == "");
      CHECK(op.plan_cache_stats().hits == 1);
      q.buf.upload(q2.buf.download());
      synchronize(nullptr);  // a copy from pageable memory may return before it lands
      o.buf.poison(stream);
      graph.launch(stream);
      synchronize(stream);
      CHECK(byte_difference(o.buf.download(), want2.first) == "");
      CHECK(byte_difference(lse_buf.download(), want2.second) == "");
    }
    destroy_stream(other);
    destroy_stream(stream);
  }
}

// Under a byte budget of 0 every new plan drops the others: a plan dropped by a call being captured
// is freed later (freeing waits for the device, which a capture must not), and the captured plan
// is never dropped while its graph may run (PlanCacheStats::in_graph), however many plans come after.
TEST_CASE("a plan a CUDA graph reads outlives the plan cache's byte budget", "[gpu][attention][graph][plans]") {
  SKIP_WITHOUT_GPU();
  if (on_host()) { WARN("SKIPPED on the emulator and the CPU device: CUDA graphs need a GPU"); return; }
  shared_context(0).make_current();
  RuntimeOptions ro = options_for(Device::cuda(0));
  ro.plan_cache_bytes = 0;
  Runtime rt(ro);
  const Pattern p = parse_spec(R"({"attnjit": 1, "branches": [{"segment": 64}, {"segment": 256, "dilation": 4}]})");
  const Problem pb{1, 64, 256, 2, 2, 64, 64, DType::BF16, {}};
  Attention reference = rt.prepare(p, pb), op = rt.prepare(p, pb);
  const std::vector<float> xq = testing::random_tensor(64 * 2 * 64, 31), xkv = testing::random_tensor(256 * 2 * 64, 32);
  Tensor q(&xq, {1, 64, 2, 64}, DType::BF16, Mem::BSHD), kv(&xkv, {1, 256, 2, 64}, DType::BF16, Mem::BSHD);
  Tensor o(nullptr, {1, 64, 2, 64}, DType::BF16, Mem::BSHD);
  CUstream stream = create_stream();
  auto forward = [&](Attention& a, int64_t q_offset) {
    ForwardOptions fo;
    fo.q_offset = q_offset, fo.stream = stream;
    a.forward(q.view, kv.view, kv.view, o.view, nullptr, fo);
  };
  auto eager = [&](Attention& a, int64_t q_offset) {
    o.buf.poison(stream);
    forward(a, q_offset);
    synchronize(stream);
    return o.buf.download();
  };
  const std::vector<unsigned char> want = eager(reference, 64);
  eager(op, 0);  // prepare()'s plan for offset 0 (a hit), dropped by the captured call's plan
  o.buf.poison(stream);
  synchronize(stream);
  {
    CapturedGraph graph(stream, [&] { forward(op, 64); });
    PlanCacheStats st = op.plan_cache_stats();
    CHECK(st.plans == 1);
    CHECK(st.evictions == 1);
    CHECK(st.in_graph == 1);
    for (int64_t offset : {128, 192, 0}) CHECK(byte_difference(eager(op, offset), eager(reference, offset)) == "");
    st = op.plan_cache_stats();
    CHECK(st.plans == 2);  // the graph's plan and the last call's
    CHECK(st.evictions == 3);
    CHECK(st.in_graph == 1);
    o.buf.poison(stream);
    graph.launch(stream);
    synchronize(stream);
    CHECK(byte_difference(o.buf.download(), want) == "");
    CHECK(byte_difference(eager(op, 64), want) == "");  // the graph's plan, run eagerly: a hit
    st = op.plan_cache_stats();
    CHECK(st.hits == 2);
    CHECK(st.misses == 5);  // offsets 0 (in prepare()), 64 (in the capture), 128, 192 and 0 again
  }
  destroy_stream(stream);
}

TEST_CASE("host memory and misaligned device pointers are rejected before launch", "[gpu][attention][errors]") {
  SKIP_WITHOUT_GPU();
  if (on_host()) { WARN("SKIPPED on the emulator and the CPU device: host memory is what they take"); return; }
  shared_context(0).make_current();
  Runtime rt(options_for(Device::cuda(0)));
  const Pattern p = PatternBuilder().branch(BranchSpec().full().causal()).build();
  for (DType dt : {DType::BF16, DType::F32}) {
    INFO(to_string(dt));
    Attention op = rt.prepare(p, Problem{1, 128, 128, 2, 2, 64, 64, dt, {}});
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
