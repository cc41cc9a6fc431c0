// Code generation of the backward kernels: the column slices past head dim 128, and every variant of
// the compile matrix compiled with NVRTC (four entry points, no spills past their allowance, shared
// memory within the arch's budget, the tensor-core instructions each path is made of).
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

TEST_CASE("backward column slices: one up to head dim 128, then slices of at most 128 columns in 16-column blocks", "[codegen][grad]") {
  auto slices = [](int64_t d, int64_t dv) {
    KernelRequest r;
    r.head_dim = d, r.head_dim_v = dv;
    const BackwardSlices s = backward_slices(r);
    return std::to_string(s.count) + " x " + std::to_string(s.dk_cols) + "/" + std::to_string(s.dv_cols);
  };
  CHECK(slices(64, 64) == "1 x 64/64");
  CHECK(slices(128, 128) == "1 x 128/128");
  CHECK(slices(256, 256) == "2 x 128/128");
  CHECK(slices(208, 208) == "2 x 112/112");  // the second slice holds 96 columns
  CHECK(slices(144, 256) == "2 x 80/128");   // dK's second slice 64
  CHECK(slices(256, 64) == "2 x 128/32");
  CHECK(slices(160, 32) == "2 x 80/16");     // dV's second slice 16
  CHECK(slices(256, 16) == "2 x 128/16");    // dV's second slice empty
  CHECK(slices(16, 256) == "2 x 16/128");    // dK's second slice empty
  // The generator writes them into the tensor-core backward (the SIMT kernels have none).
  KernelRequest r;
  r.head_dim = r.head_dim_v = 208;
  const std::string src = generate_backward_kernels(no_mask(), r).source.source;
  CHECK(src.find("#define AJ_BWD_SLICES 2\n#define AJ_BWD_DK_COLS 112\n#define AJ_BWD_DV_COLS 112\n") != std::string::npos);
  r.dtype = DType::F32;
  CHECK(generate_backward_kernels(no_mask(), r).source.source.find("AJ_BWD_SLICES 2") == std::string::npos);
}

TEST_CASE("the backward kernels compile with NVRTC: four entry points, no spills, shared memory in budget, HMMA on the tensor path",
          "[codegen][nvrtc][grad]") {
  if (!nvrtc_available()) {
    WARN("SKIPPED: no NVRTC found; the backward kernels cannot be compiled");
    return;
  }
  std::vector<BackwardKernels> kernels;
  for (const auto& [arch, dt, d] : compile_variants(kBackwardArchs, kBackwardDims)) {
    KernelRequest r;
    r.head_dim = r.head_dim_v = d;
    r.dtype = dt;
    r.arch = arch;
    kernels.push_back(generate_backward_kernels(every_mask_kind(), r));
  }
  // The Hopper backward's dK/dV on wgmma (sm_90a, head dims 64 and 128): the TMA kernel with its
  // producer warpgroup, and the cp.async one (outside a full sweep, the half of the eight where
  // each pair of dtype, head dim and kernel appears once).
  for (DType dt : {DType::F16, DType::BF16})
    for (int d : {64, 128})
      for (bool tma : {true, false}) {
        if (!testing::full_sweep() && ((dt == DType::BF16) != (d == 128)) != tma) continue;
        KernelRequest r;
        r.head_dim = r.head_dim_v = d;
        r.dtype = dt;
        r.arch = 90;
        r.arch_specific = true;
        r.wgmma_backward = true;
        r.tma = tma;
        kernels.push_back(generate_backward_kernels(every_mask_kind(), r));
        REQUIRE(kernels.back().source.path == (tma ? KernelPath::Sm90Tma : KernelPath::Sm90));
      }
  std::vector<CompileRequest> requests;
  for (const BackwardKernels& k : kernels)
    requests.push_back({k.source.name, k.source.source, k.source.arch, {"--use_fast_math"}, 0});
  const auto results = compile_many(requests, 2);
  for (size_t n = 0; n < kernels.size(); ++n) {
    const BackwardKernels& k = kernels[n];
    INFO(k.source.name << " " << k.source.arch << "\n" << k.source.source.substr(0, 200));
    if (const auto* err = std::get_if<std::string>(&results[n])) FAIL(*err);
    const CompileResult& r = std::get<CompileResult>(results[n]);
    if (k.source.path == KernelPath::Sm80) CHECK(disassemble_cubin(r.cubin).find("HMMA") != std::string::npos);
    if (k.source.path == KernelPath::Sm90) CHECK(disassemble_cubin(r.cubin).find("HGMMA") != std::string::npos);
    if (k.source.path == KernelPath::Sm90Tma) {  // wgmma, TMA loads, the producer's registers given to the consumers
      const std::string sass = disassemble_cubin(r.cubin);
      for (const char* op : {"HGMMA", "UTMALDG", "USETMAXREG.DEALLOC", "USETMAXREG.TRY_ALLOC"}) {
        INFO(op);
        CHECK(sass.find(op) != std::string::npos);
      }
    }
    for (const auto& [entry, dynamic_bytes] : {std::pair<std::string, int>{k.pre, 0}, {k.dq, k.dq_shared_bytes},
                                              {k.dkdv, k.dkdv_shared_bytes}, {k.cvt, 0}}) {
      INFO(entry << " " << u_info(r, entry));
      const auto u = std::find_if(r.usage.begin(), r.usage.end(), [&](const ResourceUsage& x) { return x.kernel == entry; });
      REQUIRE(u != r.usage.end());
      CHECK(u->shared_bytes <= 48 * 1024);
      CHECK(u->shared_bytes + dynamic_bytes <= shared_limit(std::stoi(k.source.arch.substr(3))));
      if (k.source.source.find("#define AJ_HEAD_DIM 256") != std::string::npos) {
        // The SIMT kernels' four threads per row hold a quarter of each head vector: at head dim
        // 256 their dQ and dK/dV kernels keep 192-256 floats per thread and spill (known; eight
        // threads per row will fix it). The tensor-core _dkdv (two column slices) parks a few
        // values outside its products: the query entry's index once per query tile, the
        // epilogue's addresses (32 bytes on sm_80 and sm_90); its other entry points none.
        if (k.source.path == KernelPath::Simt) continue;
        const int allowed = entry == k.dkdv ? 64 : 0;
        CHECK(u->spill_store_bytes <= allowed);
        CHECK(u->spill_load_bytes <= allowed);
        continue;
      }
      CHECK(u->spill_store_bytes == 0);
      CHECK(u->spill_load_bytes == 0);
    }
  }
}
