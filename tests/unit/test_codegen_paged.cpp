// Code generation of the paged forward: every variant of its compile matrix compiled with NVRTC,
// the path a request takes (tensor cores or SIMT), its tiles and the refusals that name the fix.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "compiler/codegen/codegen.hpp"
#include "compiler/nvrtc/cubin_info.hpp"
#include "compiler/nvrtc/nvrtc_compiler.hpp"
#include "compiler/support/error.hpp"
#include "tests/unit/codegen_test_support.hpp"
#include "tests/unit/test_support.hpp"

using namespace attnjit;
using namespace attnjit::codegen_tests;

TEST_CASE("the paged kernels compile with NVRTC: three entry points, no spills, static shared memory under 48 KB",
          "[codegen][nvrtc][paged]") {
  if (!nvrtc_available()) {
    WARN("SKIPPED: no NVRTC found; the paged kernels cannot be compiled");
    return;
  }
  std::vector<PagedKernels> kernels;
  for (const auto& [arch, dt, d] : compile_variants(kPagedArchs, kPagedDims)) {
    KernelRequest r;
    r.head_dim = r.head_dim_v = d;
    r.dtype = dt;
    r.arch = arch;
    kernels.push_back(generate_paged_kernels(every_mask_kind(), r, PagedHeads{32, 8}));
  }
  // FP8 e4m3 caches (head dim 128, 16-bit queries): every pair of arch and query dtype but sm_80's
  // fp16 (a full sweep builds that too).
  for (int arch : kPagedArchs)
    for (DType dt : {DType::F16, DType::BF16}) {
      if (dt == DType::BF16 && arch < 80) continue;
      if (!testing::full_sweep() && arch == 80 && dt == DType::F16) continue;
      KernelRequest r;
      r.head_dim = r.head_dim_v = 128;
      r.dtype = dt;
      r.arch = arch;
      r.kv_dtype = DType::E4M3;
      kernels.push_back(generate_paged_kernels(every_mask_kind(), r));
      REQUIRE(kernels.back().source.source.find("#define AJ_KV_DTYPE 3") != std::string::npos);
    }
  std::vector<CompileRequest> requests;
  for (const PagedKernels& k : kernels) requests.push_back({k.source.name, k.source.source, k.source.arch, {"--use_fast_math"}, 0});
  const auto results = compile_many(requests, 2);
  for (size_t n = 0; n < kernels.size(); ++n) {
    const PagedKernels& k = kernels[n];
    INFO(k.source.name << " " << k.source.arch << "\n" << k.source.source.substr(0, 200));
    if (const auto* err = std::get_if<std::string>(&results[n])) FAIL(*err);
    const CompileResult& r = std::get<CompileResult>(results[n]);
    for (const std::string& entry : {k.forward, k.merge, k.plan}) {
      INFO(entry << " " << u_info(r, entry));
      const auto u = std::find_if(r.usage.begin(), r.usage.end(), [&](const ResourceUsage& x) { return x.kernel == entry; });
      REQUIRE(u != r.usage.end());
      CHECK(u->shared_bytes <= 48 * 1024);
      CHECK(u->spill_store_bytes == 0);
      CHECK(u->spill_load_bytes == 0);
    }
  }
}

TEST_CASE("the paged kernels' path: tensor cores for 16-bit queries on sm_80+, SIMT elsewhere", "[codegen][paged]") {
  KernelRequest r;
  r.arch = 80;
  r.head_dim = r.head_dim_v = 128;
  CHECK(choose_paged_path(r) == KernelPath::Sm80);  // bf16
  CHECK(resolve_paged_config(r) == KernelConfig{16, 64, 1, 4});
  r.dtype = DType::F16;
  r.arch = 90;
  CHECK(choose_paged_path(r) == KernelPath::Sm80);
  r.config = KernelConfig{16, 64, 1, 4};
  CHECK(choose_paged_path(r) == KernelPath::Sm80);  // its own tiles, asked for
  r.config = KernelConfig{16, 32, 0, 0};  // other tiles: SIMT
  CHECK(choose_paged_path(r) == KernelPath::Simt);
  r.config = {};
  r.arch = 70;
  CHECK(choose_paged_path(r) == KernelPath::Simt);  // no bf16/fp16 mma.m16n8k16 path before sm_80 here
  r.arch = 80;
  r.dtype = DType::F32;
  CHECK(choose_paged_path(r) == KernelPath::Simt);
  r.dtype = DType::BF16;
  for (const auto& [d, dv] : std::vector<std::pair<int, int>>{{40, 40}, {256, 256}, {128, 256}, {64, 72}}) {
    r.head_dim = d, r.head_dim_v = dv;
    CHECK(choose_paged_path(r) == KernelPath::Simt);
  }
  r.head_dim = r.head_dim_v = 64;
  r.kv_dtype = DType::E4M3;  // FP8 pages decoded into bf16
  CHECK(choose_paged_path(r) == KernelPath::Sm80);
  r.config = KernelConfig{16, 64, 2, 0};
  CHECK_THROWS_WITH(resolve_paged_config(r), Catch::Contains("one stage"));
  r.config = KernelConfig{0, 0, 0, 8};
  CHECK_THROWS_WITH(resolve_paged_config(r), Catch::Contains("4 warps"));
}

TEST_CASE("the paged kernels' tiles: defaults that fit, refusals that name the fix", "[codegen][paged]") {
  KernelRequest r;
  r.arch = 80;
  r.dtype = DType::F32;  // the SIMT kernel's tiles (bf16 at head dims up to 128 takes tensor cores)
  r.head_dim = r.head_dim_v = 128;
  CHECK(resolve_paged_config(r) == KernelConfig{16, 32, 1, 4});
  r.head_dim = r.head_dim_v = 256;
  CHECK(resolve_paged_config(r) == KernelConfig{8, 16, 1, 4});  // shrunk to fit 48 KB
  r.config = KernelConfig{16, 64, 0, 0};
  CHECK_THROWS_WITH(resolve_paged_config(r), Catch::Contains("48 KB"));
  r.head_dim = r.head_dim_v = 64;
  r.config = KernelConfig{65, 32, 0, 0};
  CHECK_THROWS_WITH(resolve_paged_config(r), Catch::Contains("1 to 64 query rows"));
  r.config = KernelConfig{16, 48, 0, 0};
  CHECK_THROWS_WITH(resolve_paged_config(r), Catch::Contains("tile_k 16, 32 or 64"));
  r.config = KernelConfig{16, 32, 2, 0};
  CHECK_THROWS_WITH(resolve_paged_config(r), Catch::Contains("one stage"));
  r.config = {};
  r.head_dim = 300;
  CHECK_THROWS_WITH(resolve_paged_config(r), Catch::Contains("head dims 1 to 256"));
  r.head_dim = 64;
  r.dtype = DType::BF16;
  r.kv_dtype = DType::F16;  // bf16 queries over fp16 caches: not a pair the kernel reads
  CHECK_THROWS_WITH(resolve_paged_config(r), Catch::Contains("kv_dtype"));
  r.kv_dtype = DType::E4M3;
  r.arch = 61;  // SIMT (f16 and bf16 take tensor cores from sm_80)
  CHECK(resolve_paged_config(r) == KernelConfig{16, 32, 1, 4});
  r.arch = 80;
  r.dtype = DType::E4M3;
  CHECK_THROWS_WITH(resolve_paged_config(r), Catch::Contains("queries and output are fp32, fp16 or bf16"));
  CHECK(parse_dtype("fp8_e4m3") == DType::E4M3);
  CHECK(parse_dtype("float8_e4m3fn") == DType::E4M3);
  CHECK(parse_dtype("bf16") == DType::BF16);
  CHECK(std::string(to_string(DType::E4M3)) == "fp8_e4m3");
  CHECK(dtype_bytes(DType::E4M3) == 1);
  // FP8 inputs (bf16 or fp16 out) take the Hopper FP8 kernel at head dims 64 and 128 on sm_90a,
  // the mma.sync one on sm_89 and newer, the SIMT forward elsewhere, and have no backward.
  KernelRequest fwd;
  fwd.dtype = DType::E4M3;
  fwd.arch = 90;
  fwd.arch_specific = true;
  CHECK(choose_path(fwd) == KernelPath::Sm90);
  fwd.arch_specific = false;
  CHECK(choose_path(fwd) == KernelPath::Sm80);
  fwd.arch = 80;
  CHECK(choose_path(fwd) == KernelPath::Simt);
  fwd.arch = 90;
  fwd.arch_specific = true;
  fwd.out_dtype = DType::F32;
  CHECK_THROWS_WITH(choose_path(fwd), Catch::Contains("bf16 or fp16"));
  fwd.out_dtype = DType::F16;
  CHECK_THROWS_WITH(choose_backward_path(fwd), Catch::Contains("forward only"));
  KernelRequest bf16;
  bf16.out_dtype = DType::F16;  // only FP8 inputs write another dtype
  CHECK_THROWS_WITH(choose_path(bf16), Catch::Contains("--out-dtype fp16"));
}
