// What the code generation tests share (test_codegen.cpp, test_codegen_backward.cpp,
// test_codegen_paged.cpp): patterns that exercise every predicate, the compile matrices and their
// pairwise cover, and reading a compile's resources.
#pragma once

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "compiler/codegen/codegen.hpp"
#include "compiler/nvrtc/cubin_info.hpp"
#include "compiler/nvrtc/nvrtc_compiler.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/support/error.hpp"
#include "tests/unit/test_support.hpp"

namespace attnjit::codegen_tests {

// One branch per mask kind, so one kernel carries every predicate the templates can generate.
inline Pattern every_mask_kind() {
  return parse_spec(R"({"attnjit": 1, "branches": [
    {"segment": "full", "causal": true},
    {"segment": 1024, "dilation": 2, "window": [100, 20]},
    {"segment": "full", "layout": {"block": 64, "local": 2}},
    {"segment": "full", "layout": {"block": [64, 32], "global": [0, 3, 5, 7, 9, 11, 13, 15, 17, 19]}},
    {"segment": "full", "layout": {"strided": {"stride": 4, "phase": 1}}},
    {"segment": "full", "layout": {"offsets": [-1, 0, 2]}},
    {"segment": "full", "layout": {"random": {"density": 0.1, "seed": 7}}},
    {"segment": "full", "layout": {"explicit": {"blocks": [[0, 0], [3, 1]]}}},
    {"segment": "full", "layout": {"explicit": {"per_head": [[[0, 1]], [], [[2, 2]], [[1, 0]]]}}},
    {"segment": "full", "layout": {"union": [{"dynamic": true}, {"intersect": [{"local": 1}, {"strided": {"stride": 2}}]}]}}
  ]})");
}

inline Pattern no_mask() {
  return parse_spec(R"({"attnjit": 1, "branches": [{"segment": 2048}, {"segment": 4096, "dilation": 2}]})");
}

// Registers and spills of one entry point, for a failure message.
inline std::string u_info(const CompileResult& r, const std::string& entry) {
  for (const ResourceUsage& u : r.usage)
    if (u.kernel == entry)
      return std::to_string(u.registers) + " registers, " + std::to_string(u.spill_store_bytes) + " bytes spill stores";
  return "not found";
}

inline int shared_limit(int arch) { return arch >= 90 ? 227 * 1024 : arch == 80 ? 163 * 1024 : arch >= 86 ? 99 * 1024 : 64 * 1024; }

inline bool have_disassembler() {
  try {
    disassemble_cubin({});
  } catch (const UserError& e) {
    return std::string(e.what()).find("neither nvdisasm nor cuobjdump") == std::string::npos;
  } catch (...) {
  }
  return true;
}

// The (arch, dtype, head dim) variants a compile matrix builds: the whole product under
// ATTNJIT_TEST_SWEEP (bf16 from sm_80 on), else a pairwise cover of it: every (arch, head dim)
// once, each with the dtype that adds the most (arch, dtype) and (dtype, head dim) pairs not yet
// built, then any such pair still missing. What a variant's spills and shared memory depend on
// (the arch's budget, a 16- or 32-bit dtype, the head dim) are pairs, so the cover builds a third
// to a half of the product and meets each of them.
struct Variant {
  int arch;
  DType dtype;
  int head_dim;
};

inline std::vector<Variant> compile_variants(const std::vector<int>& archs, const std::vector<int>& head_dims) {
  const DType dtypes[] = {DType::F16, DType::BF16, DType::F32};
  auto valid = [](int arch, DType dt) { return dt != DType::BF16 || arch >= 80; };
  std::vector<Variant> out;
  if (testing::full_sweep()) {
    for (int arch : archs)
      for (DType dt : dtypes)
        for (int d : head_dims)
          if (valid(arch, dt)) out.push_back({arch, dt, d});
    return out;
  }
  std::set<std::pair<int, DType>> arch_dt;
  std::set<std::pair<DType, int>> dt_d;
  auto add = [&](int arch, DType dt, int d) {
    out.push_back({arch, dt, d});
    arch_dt.insert({arch, dt});
    dt_d.insert({dt, d});
  };
  for (int arch : archs)
    for (int d : head_dims) {
      int best = -1;
      DType pick = DType::F32;
      for (DType dt : dtypes) {
        if (!valid(arch, dt)) continue;
        const int gain = int(!arch_dt.count({arch, dt})) + int(!dt_d.count({dt, d}));
        if (gain > best) best = gain, pick = dt;
      }
      add(arch, pick, d);
    }
  for (int arch : archs)
    for (DType dt : dtypes)
      if (valid(arch, dt) && !arch_dt.count({arch, dt})) add(arch, dt, head_dims.front());
  for (DType dt : dtypes)
    for (int d : head_dims)
      if (!dt_d.count({dt, d})) add(*std::find_if(archs.begin(), archs.end(), [&](int a) { return valid(a, dt); }), dt, d);
  return out;
}

// The compile matrices: forward (every mask kind, and no mask at head dims 64 and 128), backward,
// paged.
inline const std::vector<int> kForwardArchs = {75, 80, 86, 90}, kForwardDims = {32, 64, 96, 128, 256}, kPlainDims = {64, 128};
inline const std::vector<int> kBackwardArchs = {75, 80, 90}, kBackwardDims = {32, 64, 128, 256};
inline const std::vector<int> kPagedArchs = {61, 80, 90}, kPagedDims = {32, 64, 128, 256};

}  // namespace attnjit::codegen_tests
