// Code generation of the forward: every template variant compiles with NVRTC for every arch it
// targets, without spills and within shared memory; tensor-core variants use HMMA; the tuner's
// compile check; codegen is deterministic; a changed template changes the key; a broken template
// shows numbered source and the log; the JIT's cache and counters. The backward's and the paged
// forward's: test_codegen_backward.cpp, test_codegen_paged.cpp.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <tuple>

#include "compiler/codegen/codegen.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/nvrtc/cubin_info.hpp"
#include "compiler/nvrtc/nvrtc_compiler.hpp"
#include "compiler/nvrtc/sass_loop.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/support/error.hpp"
#include "compiler/tune/autotune.hpp"
#include "runtime/backend.hpp"
#include "tests/unit/codegen_test_support.hpp"
#include "tests/unit/test_support.hpp"

using namespace attnjit;
using namespace attnjit::codegen_tests;

TEST_CASE("the compile matrices' cover builds every pair of arch, dtype and head dim", "[codegen]") {
  for (const auto& [archs, dims] : {std::pair{kForwardArchs, kForwardDims}, {kForwardArchs, kPlainDims},
                                    {kBackwardArchs, kBackwardDims}, {kPagedArchs, kPagedDims}}) {
    const std::vector<Variant> v = compile_variants(archs, dims);
    std::set<std::tuple<int, int, int>> built;
    for (const Variant& x : v) {
      CHECK((x.dtype != DType::BF16 || x.arch >= 80));
      built.insert({x.arch, int(x.dtype), x.head_dim});
    }
    CHECK(built.size() == v.size());  // nothing built twice
    for (int arch : archs)
      for (DType dt : {DType::F16, DType::BF16, DType::F32})
        for (int d : dims) {
          if (dt == DType::BF16 && arch < 80) continue;
          auto has = [&](auto pred) { return std::any_of(v.begin(), v.end(), pred); };
          INFO("sm_" << arch << " " << to_string(dt) << " head dim " << d);
          CHECK(has([&](const Variant& x) { return x.arch == arch && x.dtype == dt; }));
          CHECK(has([&](const Variant& x) { return x.arch == arch && x.head_dim == d; }));
          CHECK(has([&](const Variant& x) { return x.dtype == dt && x.head_dim == d; }));
        }
    for (const Variant& x : v) CHECK(std::find(archs.begin(), archs.end(), x.arch) != archs.end());
    const size_t product = archs.size() * dims.size() * 3 - std::count_if(archs.begin(), archs.end(), [](int a) { return a < 80; }) * dims.size();
    if (!testing::full_sweep()) CHECK(v.size() <= product / 2);
    if (testing::full_sweep()) CHECK(v.size() == product);
  }
}

TEST_CASE("every template variant compiles for every arch: no spills, shared memory in budget, HMMA on tensor cores",
          "[codegen][nvrtc]") {
  if (!nvrtc_available()) {
    WARN("SKIPPED: no NVRTC found; the codegen matrix cannot run");
    return;
  }
  std::vector<KernelSource> kernels;
  const Pattern masks = every_mask_kind(), plain = no_mask();
  for (const bool with_masks : {true, false})
    for (const auto& [arch, dt, d] : compile_variants(kForwardArchs, with_masks ? kForwardDims : kPlainDims)) {
      KernelRequest r;
      r.head_dim = r.head_dim_v = d;
      r.dtype = dt;
      r.arch = arch;
      kernels.push_back(generate_kernel(with_masks ? masks : plain, r));
    }
  std::vector<CompileRequest> requests;
  for (const KernelSource& k : kernels) requests.push_back({k.name, k.source, k.arch, {"--use_fast_math"}, 0});
  const auto results = compile_many(requests, 2);
  const bool sass = have_disassembler();
  if (!sass) WARN("SKIPPED (HMMA check only): no nvdisasm or cuobjdump; run scripts/setup_deps.sh");
  for (size_t n = 0; n < kernels.size(); ++n) {
    const KernelSource& k = kernels[n];
    INFO(k.name << " " << k.arch << " " << to_string(k.path) << " tile " << k.config.tile_q << "x" << k.config.tile_k
                << "\n" << k.source.substr(0, 200));
    if (const auto* err = std::get_if<std::string>(&results[n])) FAIL(*err);
    const CompileResult& r = std::get<CompileResult>(results[n]);
    bool found = false;
    for (const ResourceUsage& u : r.usage) {
      if (u.kernel != k.name) continue;
      found = true;
      CHECK(u.registers > 0);
      CHECK(u.registers <= 255);
      CHECK(u.spill_store_bytes == 0);
      CHECK(u.spill_load_bytes == 0);
      CHECK(u.shared_bytes + k.shared_bytes <= shared_limit(std::stoi(k.arch.substr(3))));
    }
    CHECK(found);
    if (sass && k.path == KernelPath::Sm80) CHECK(disassemble_cubin(r.cubin).find("HMMA") != std::string::npos);
  }
}

TEST_CASE("find_main_loop: the back edge with the most HMMA and its local loads and stores, not one over an EXIT",
          "[codegen][sass]") {
  const std::string sass = R"(
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   STL [R1], R0 ;
.L_x_1:
        /*0020*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0030*/              @!P0 BRA `(.L_x_1) ;
.L_x_2:
        /*0040*/                   LDL R2, [R1] ;
        /*0050*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0060*/                   HMMA.16816.F32.BF16 R16, R8, R14, R16 ;
        /*0070*/               @P1 STL.64 [R1+0x8], R4 ;
        /*0080*/                   ISETP.GE.AND P1, PT, R0, 0x4, PT ;
        /*0090*/               @P1 BRA `(.L_x_2) ;
        /*00a0*/                   LDL R3, [R1] ;
        /*00b0*/                   EXIT ;
.L_x_3:
        /*00c0*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*00d0*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*00e0*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*00f0*/                   BRA `(.L_x_2) ;
)";
  // .L_x_1 holds one HMMA; .L_x_2's body two, one LDL and one predicated STL; the last back edge
  // (to .L_x_2, over the EXIT) is a cold path's, not a loop.
  const std::optional<SassLoop> loop = find_main_loop(sass);
  REQUIRE(loop.has_value());
  CHECK(loop->hmma == 2);
  CHECK(loop->instructions == 6);
  CHECK(loop->local_accesses == 2);
  const std::optional<SassLoop> hopper = find_main_loop(R"(
.L_x_9:
        /*0000*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0010*/                   BRA `(.L_x_9) ;
)");
  REQUIRE(hopper.has_value());
  CHECK(hopper->hmma == 16);  // 64 x 128 x 16 by a warpgroup: 16 m16n8k16 a warp
  CHECK(hopper->local_accesses == 0);
  const std::optional<SassLoop> fp8 = find_main_loop(R"(
.L_x_3:
        /*0000*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], R24 ;
        /*0010*/                   QMMA.16832.F32.E4M3.E4M3 R4, R8, R12, R4 ;
        /*0020*/                   BRA `(.L_x_3) ;
)");
  REQUIRE(fp8.has_value());
  CHECK(fp8->hmma == 32 + 2);  // FP8's k32: twice the multiply-adds of the 16-bit forms
  CHECK_FALSE(find_main_loop("        /*0000*/                   EXIT ;\n").has_value());
}

TEST_CASE("the tuner's compile check keeps a candidate whose spills stay out of its main loop, prunes one that spills in it",
          "[codegen][nvrtc][autotune]") {
  if (!nvrtc_available()) {
    WARN("SKIPPED: no NVRTC found; the compile check cannot run");
    return;
  }
  const Pattern dense = parse_spec(R"({"attnjit": 1, "branches": [{"segment": "full"}]})");
  KernelRequest r;  // sm_80, bf16
  r.head_dim = r.head_dim_v = 128;
  KernelCache cache("", 0, false);
  KernelCompiler compiler(cache, Knobs{});
  const CompileCheck check = kernel_compile_check(dense, r, compiler, 60);
  // 128x64 with 4 warps and two stages: ptxas keeps the batch index in local memory from the
  // prologue to the epilogue (docs/performance.md), and nothing in the loop.
  const KernelConfig parked{128, 64, 2, 4}, in_loop{128, 128, 1, 4};
  auto spills = [&](const KernelConfig& c) {
    KernelRequest k = r;
    k.config = c;
    const KernelSource src = generate_kernel(dense, k);
    for (const ResourceUsage& u : compiler.get(src)->usage)
      if (u.kernel.find(src.name) != std::string::npos) return u.spill_store_bytes + u.spill_load_bytes;
    return -1;
  };
  INFO("the fixtures must spill for this test to mean anything: pick other tiles if ptxas changed");
  REQUIRE(spills(parked) > 0);
  REQUIRE(spills(in_loop) > 0);
  const std::optional<std::string> keep = check(parked, false), prune = check(in_loop, false);
  REQUIRE(prune.has_value());
  if (have_disassembler()) {
    CHECK_FALSE(keep.has_value());
    CHECK(prune->find("local loads and stores in the main loop") != std::string::npos);
  } else {
    WARN("SKIPPED (prune only): no nvdisasm or cuobjdump; without the SASS every spill prunes");
    REQUIRE(keep.has_value());
    CHECK(keep->find("no nvdisasm or cuobjdump") != std::string::npos);
  }
  CHECK_FALSE(check(in_loop, true).has_value());  // the baseline is timed whatever it spills
}

TEST_CASE("archs NVRTC cannot target are refused clearly", "[codegen][nvrtc]") {
  if (!nvrtc_available()) {
    WARN("SKIPPED: no NVRTC found");
    return;
  }
  KernelRequest r;
  r.dtype = DType::F32;
  r.arch = 60;
  const KernelSource k = generate_kernel(no_mask(), r);  // the SIMT path is written for sm_60
  const auto archs = supported_archs();
  if (std::find(archs.begin(), archs.end(), "sm_60") != archs.end()) {
    CHECK_NOTHROW(compile_cubin({k.name, k.source, k.arch, {}, 0}));
  } else {
    WARN("NVRTC " << nvrtc_version() << " cannot target sm_60 (CUDA 13 dropped it); checking the error instead");
    CHECK_THROWS_WITH(compile_cubin({k.name, k.source, k.arch, {}, 0}), Catch::Contains("no NVRTC found here compiles for sm_60"));
  }
}

TEST_CASE("codegen is deterministic, the name and key follow the source and the templates", "[codegen]") {
  const Pattern p = every_mask_kind();
  KernelRequest r;
  // A second pattern built from scratch: same meaning, so the same bytes.
  const KernelSource a = generate_kernel(p, r), b = generate_kernel(every_mask_kind(), r);
  CHECK(a.source == b.source);
  CHECK(a.name == b.name);
  // Segments and dilations live in the plan, not the kernel: patterns with the same masks share it.
  const Pattern other_segments = parse_spec(R"({"attnjit": 1, "branches": [{"segment": 512}, {"segment": 8192, "dilation": 4}]})");
  CHECK(generate_kernel(no_mask(), r).source == generate_kernel(other_segments, r).source);

  KernelCache cache("", 0, false);
  KernelCompiler compiler(cache, Knobs{});
  CHECK(compiler.key_for(a).hex == compiler.key_for(b).hex);
  TemplateSet changed = TemplateSet::embedded();
  changed.replace("fwd_sm80.cuh", changed.text("fwd_sm80.cuh") + "\n// a change\n");
  const KernelSource c = generate_kernel(p, r, changed);
  CHECK(c.template_hash != a.template_hash);
  CHECK(c.name != a.name);
  CHECK(compiler.key_for(c).hex != compiler.key_for(a).hex);
  KernelRequest other = r;
  other.arch = 90;
  CHECK(compiler.key_for(generate_kernel(p, other)).hex != compiler.key_for(a).hex);
}

TEST_CASE("kernels carry the seek only where plans leave layouts to them", "[codegen][random_in_kernel]") {
  const Pattern bigbird = parse_spec(R"({"attnjit": 1, "layout": {"union": [{"local": 1}, {"random": {"density": 0.1, "seed": 7}}]},
                                         "branches": [{"segment": "full"}]})");
  const Pattern table = parse_spec(R"({"attnjit": 1, "branches": [{"segment": "full", "layout": {"dynamic": true}}]})");
  const std::string seek = "#define AJ_KERNEL_SEEK 1";
  KernelRequest r;
  r.head_dim = r.head_dim_v = 64;
  for (const bool random_in_kernel : {false, true}) {
    INFO("random_in_kernel " << random_in_kernel);
    r.random_in_kernel = random_in_kernel;
    const KernelSource k = generate_kernel(bigbird, r), b = generate_backward_kernels(bigbird, r).source;
    CHECK(k.seeks == random_in_kernel);
    CHECK(b.seeks == random_in_kernel);
    CHECK((k.source.find(seek) != std::string::npos) == random_in_kernel);
    CHECK((b.source.find(seek) != std::string::npos) == random_in_kernel);
    // A table may be on the device on any call: its kernels always seek; a pattern without random
    // or dynamic layouts never does.
    CHECK(generate_kernel(table, r).seeks);
    CHECK_FALSE(generate_kernel(no_mask(), r).seeks);
  }
  KernelRequest planned = r;
  planned.random_in_kernel = false;
  CHECK(generate_kernel(bigbird, r).name != generate_kernel(bigbird, planned).name);
  // A plan that leaves a layout to kernels that do not seek is refused, not run.
  Plan plan;
  plan.kernel_seeks = 1;
  r.random_in_kernel = false;
  CHECK_THROWS_WITH(check_kernel_seeks(plan, generate_kernel(bigbird, r)), Catch::Contains("does not seek"));
}

TEST_CASE("a broken template shows numbered source, the NVRTC log and the options", "[codegen][nvrtc]") {
  if (!nvrtc_available()) {
    WARN("SKIPPED: no NVRTC found");
    return;
  }
  TemplateSet broken = TemplateSet::embedded();
  broken.replace("fwd_sm80.cuh", broken.text("fwd_sm80.cuh") + "\n__device__ int aj_broken() { return undefined_name; }\n");
  KernelRequest r;
  const KernelSource k = generate_kernel(no_mask(), r, broken);
  try {
    compile_cubin({k.name, k.source, k.arch, {}, 0});
    FAIL("the broken template compiled");
  } catch (const CompileError& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("NVRTC failed to compile " + k.name));
    CHECK_THAT(what, Catch::Contains("undefined_name"));
    CHECK_THAT(what, Catch::Contains("--gpu-architecture=sm_80"));
    CHECK_THAT(what, Catch::Contains("| __device__ int aj_broken() { return undefined_name; }"));
  }
}

TEST_CASE("with JIT off a cache miss is an error listing the missing kernels", "[codegen][cache]") {
  KernelCache cache("", 0, false);
  Knobs k;
  k.no_jit = true;
  KernelCompiler compiler(cache, k);
  KernelRequest r;
  const KernelSource src = generate_kernel(no_mask(), r);
  CHECK_THROWS_WITH(compiler.get(src), Catch::Contains("not in the cache") && Catch::Contains(src.name) &&
                                           Catch::Contains("attnjit precompile"));
}

TEST_CASE("get_many stores each kernel in the cache as it finishes, so an interrupted call keeps what it compiled",
          "[codegen][cache][nvrtc]") {
  if (!nvrtc_available()) {
    WARN("SKIPPED: no NVRTC found");
    return;
  }
  attnjit::testing::TempDir tmp;
  KernelCache cache(tmp.path, int64_t{1} << 30);
  KernelCompiler compiler(cache, Knobs{});
  std::vector<KernelSource> kernels;
  for (int tile_q : {64, 32, 16}) {
    KernelRequest r;
    r.head_dim = r.head_dim_v = 64;
    r.config.tile_q = tile_q;
    kernels.push_back(generate_kernel(no_mask(), r));
  }
  // The second kernel's progress report stands for an interruption (Ctrl-C, kill -9) at that point.
  struct Interrupted {};
  std::vector<std::string> errors;
  CHECK_THROWS_AS(compiler.get_many(kernels, 1, errors,
                                    [](size_t done, size_t) {
                                      if (done == 2) throw Interrupted{};
                                    }),
                  Interrupted);
  KernelCache reread(tmp.path, int64_t{1} << 30);
  CHECK(reread.get(compiler.key_for(kernels[0])).has_value());
  CHECK(reread.get(compiler.key_for(kernels[1])).has_value());
  CHECK_FALSE(reread.get(compiler.key_for(kernels[2])).has_value());
}

TEST_CASE("the JIT counters count a compile with its time, then a cache hit without one", "[codegen][nvrtc][cache]") {
  if (!nvrtc_available()) {
    WARN("SKIPPED: no NVRTC found; nothing compiles");
    return;
  }
  KernelCache cache("", 0, false);  // memory only: a second compiler finds the kernel there
  KernelRequest r;
  r.head_dim = r.head_dim_v = 64;
  const KernelSource src = generate_kernel(no_mask(), r);
  const JitCounters before = jit_counters();
  KernelCompiler first(cache, Knobs{});
  const auto compiled = first.get(src);
  const JitCounters mid = jit_counters();
  CHECK(mid.compiled == before.compiled + 1);
  CHECK(mid.cache_hits == before.cache_hits);
  CHECK(mid.failed == before.failed);
  CHECK(mid.compile_wall_seconds - before.compile_wall_seconds >= compiled->seconds * 0.99);
  CHECK(mid.compile_seconds - before.compile_seconds == Approx(compiled->seconds));
  CHECK(compiled->seconds > 0);
  KernelCompiler second(cache, Knobs{});
  CHECK(second.get(src)->cache_hit);
  const JitCounters after = jit_counters();
  CHECK(after.compiled == mid.compiled);
  CHECK(after.cache_hits == mid.cache_hits + 1);
  CHECK(after.compile_wall_seconds == mid.compile_wall_seconds);
}

TEST_CASE("unsupported requests are user errors naming the fix", "[codegen]") {
  KernelRequest r;
  r.head_dim = 72;
  CHECK_THROWS_WITH(generate_kernel(no_mask(), r), Catch::Contains("multiples of 16"));
  r.head_dim = 64;
  r.arch = 52;
  CHECK_THROWS_WITH(generate_kernel(no_mask(), r), Catch::Contains("attnjit needs sm_60 or newer"));
  r.arch = 80;
  r.config.tile_q = 48 + 1;
  CHECK_THROWS_WITH(generate_kernel(no_mask(), r), Catch::Contains("tile_q"));
  r.config = KernelConfig{128, 128, 4};
  r.head_dim = r.head_dim_v = 256;
  CHECK_THROWS_WITH(generate_kernel(no_mask(), r), Catch::Contains("shared memory"));
  CHECK_THROWS_WITH(parse_dtype("int8"), Catch::Contains("use fp32, fp16, bf16 or fp8_e4m3"));
  // Warps: 16 or 32 rows each on the tensor-core path, 32 only up to head dim 128; the SIMT path's
  // block shape follows its tile.
  r.config = KernelConfig{128, 64, 2, 3};
  r.head_dim = r.head_dim_v = 128;
  CHECK_THROWS_WITH(generate_kernel(no_mask(), r), Catch::Contains("16 or 32 query rows") && Catch::Contains("8 or 4 warps"));
  r.config.warps = 2;  // 64 rows per warp
  CHECK_THROWS_WITH(generate_kernel(no_mask(), r), Catch::Contains("16 or 32 query rows"));
  r.config = KernelConfig{128, 32, 2, 4};
  r.head_dim = r.head_dim_v = 256;
  CHECK_THROWS_WITH(generate_kernel(no_mask(), r), Catch::Contains("up to head dim 128") && Catch::Contains("use 8 warps"));
  r.head_dim = r.head_dim_v = 64;
  r.dtype = DType::F32;
  r.config = KernelConfig{32, 32, 0, 2};
  CHECK_THROWS_WITH(generate_kernel(no_mask(), r), Catch::Contains("SIMT path runs tile_q / 8 warps"));
  r.dtype = DType::BF16;
  r.config = KernelConfig{64, 64, 2, 2};
  CHECK_THROWS_WITH(generate_backward_kernels(no_mask(), r), Catch::Contains("16 query rows per warp"));
  CHECK_THROWS_WITH(parse_kernel_tile("128x64w"), Catch::Contains("QxKwN"));
  CHECK_THROWS_WITH(parse_kernel_tile("128x64w0"), Catch::Contains("QxKwN"));
  CHECK_THROWS_WITH(parse_kernel_tile("128x64w4x"), Catch::Contains("QxKwN"));
  CHECK_THROWS_WITH(parse_kernel_tile("candidates"), Catch::Contains("--kernel-tile candidates: expected QxK, QxKwN (N warps) or default"));
  CHECK_THROWS_WITH(parse_kernel_tile("64x"), Catch::Contains("--kernel-tile 64x: expected"));
}

TEST_CASE("Q lies over the last V stage where that lets one more block onto an SM", "[codegen]") {
  KernelRequest r;
  r.head_dim = r.head_dim_v = 128;
  r.arch = 80;  // 164 KB per SM: 64x64 with Q of its own takes 87 KB, one block; over a V stage 68 KB, two
  KernelSource k = generate_kernel(no_mask(), r);
  CHECK(k.shared_bytes == 2 * (2 * 64 * 136 * 2));
  CHECK(k.source.find("#define AJ_Q_OVER_KV 1\n") != std::string::npos);
  r.arch = 90;  // 228 KB: two blocks either way (and registers allow no third)
  k = generate_kernel(no_mask(), r);
  CHECK(k.shared_bytes == 2 * (64 * 136 + 2 * 64 * 136 * 2));
  CHECK(k.source.find("#define AJ_Q_OVER_KV 0\n") != std::string::npos);
  r.arch = 86;  // 99 KB a block: 128x64 at d=128 fits only with Q over the last V stage (and past it)
  r.config = parse_kernel_tile("128x64");
  k = generate_kernel(no_mask(), r);
  CHECK(k.shared_bytes == 2 * (2 * 64 * 136 + 64 * 136 + 128 * 136));
  CHECK(k.source.find("#define AJ_Q_OVER_KV 1\n") != std::string::npos);
  // Q read from shared memory at every tile (32 rows per warp at d=128) keeps its own space.
  r.config = parse_kernel_tile("64x64w2");
  r.arch = 80;
  k = generate_kernel(no_mask(), r);
  CHECK(k.source.find("#define AJ_Q_IN_REGS 0\n#define AJ_Q_OVER_KV 0\n") != std::string::npos);
  CHECK(k.shared_bytes == 2 * (64 * 136 + 2 * 64 * 136 * 2));
  // The backward kernels never do.
  r.config = {};
  CHECK(generate_backward_kernels(no_mask(), r).source.source.find("#define AJ_Q_OVER_KV 0\n") != std::string::npos);
}

// The persistent TMA forward's shared memory: a second Q buffer where it fits, then O's staging
// tile where that fits too and the toolchain takes its parameters past 4 KB; the one-block-per-item
// kernel takes one Q buffer and no staging.
TEST_CASE("the persistent Hopper forward: two Q buffers and O's staging tile where they fit", "[codegen]") {
  KernelRequest r;
  r.arch = 90, r.arch_specific = true;
  const int barriers = 4 * 8 * 2 + 1024;  // the rings' mbarriers (two stages) and the alignment slack
  struct Want { int d; bool persistent, large; int q_buffers; bool staged; int bytes; };
  for (const Want& w : {Want{128, false, true, 1, false, 128 * 128 * 2 + 2 * 2 * 128 * 128 * 2 + barriers + 16},
                        Want{128, true, true, 2, true, 2 * 128 * 128 * 2 + 2 * 2 * 128 * 128 * 2 + barriers + 32 + 128 * 128 * 2},
                        Want{128, true, false, 2, false, 2 * 128 * 128 * 2 + 2 * 2 * 128 * 128 * 2 + barriers + 32},
                        Want{256, true, true, 1, false, 128 * 256 * 2 + 2 * 2 * 64 * 256 * 2 + barriers + 16}}) {
    INFO("head dim " << w.d << (w.persistent ? ", persistent" : "") << (w.large ? "" : ", parameters up to 4 KB"));
    r.head_dim = r.head_dim_v = w.d;
    r.persistent = w.persistent, r.large_params = w.large;
    const KernelSource k = generate_kernel(no_mask(), r);
    REQUIRE(k.path == KernelPath::Sm90Tma);
    CHECK(k.q_buffers == w.q_buffers);
    CHECK(k.o_staged == w.staged);
    CHECK(k.shared_bytes == w.bytes);
    CHECK(k.shared_bytes <= 232448);
    CHECK((k.source.find("#define AJ_O_STAGED 1\n") != std::string::npos) == w.staged);
    CHECK(k.source.find("#define AJ_Q_BUFFERS " + std::to_string(w.q_buffers) + "\n") != std::string::npos);
  }
}

TEST_CASE("one K and one V buffer: FlashAttention-2's 128x64 tile takes two blocks per SM on an A100", "[codegen]") {
  KernelRequest r;
  r.head_dim = r.head_dim_v = 128;
  r.arch = 80;
  r.config = KernelConfig{128, 64, 1, 4};
  const KernelSource k = generate_kernel(no_mask(), r);
  CHECK(k.config == KernelConfig{128, 64, 1, 4});
  CHECK(k.source.find("#define AJ_STAGES 1\n") != std::string::npos);
  CHECK(k.shared_bytes == 2 * (128 * 136 + 64 * 136 * 2));  // 69,632 bytes: two blocks in 164 KB
  CHECK(2 * (k.shared_bytes + 1024) <= 167936);
  r.config.stages = 2;
  CHECK(generate_kernel(no_mask(), r).shared_bytes == 2 * (128 * 136 + 2 * 64 * 136 * 2));  // 104,448: one
  r.config.stages = 5;
  CHECK_THROWS_WITH(generate_kernel(no_mask(), r), Catch::Contains("takes 1 stage") && Catch::Contains("to 4, got 5"));
}

TEST_CASE("the warps of a config shape the block: rows per warp, threads, the instantiation header", "[codegen]") {
  KernelRequest r;
  r.head_dim = r.head_dim_v = 128;
  r.config = parse_kernel_tile("128x64w4");
  CHECK(r.config == KernelConfig{128, 64, 0, 4});
  KernelSource k = generate_kernel(no_mask(), r);
  CHECK(k.config == KernelConfig{128, 64, 2, 4});
  CHECK(k.threads == 128);
  CHECK(k.source.find("#define AJ_WARPS 4\n") != std::string::npos);
  // Without warps, 16 rows per warp (what every config ran before warps could be chosen).
  r.config = parse_kernel_tile("128x64");
  k = generate_kernel(no_mask(), r);
  CHECK(k.config.warps == 8);
  CHECK(k.threads == 256);
  CHECK(k.source.find("#define AJ_WARPS 8\n") != std::string::npos);
  // Equal configs give equal kernels; a different warp count is a different kernel.
  r.config.warps = 8;
  CHECK(generate_kernel(no_mask(), r).name == k.name);
  r.config.warps = 4;
  CHECK(generate_kernel(no_mask(), r).name != k.name);
  // The backward takes only its own block shape.
  r.config = {};
  CHECK(generate_backward_kernels(no_mask(), r).source.config.warps == generate_backward_kernels(no_mask(), r).source.config.tile_q / 16);
}
