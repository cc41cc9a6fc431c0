// Rendering the paged forward (templates/fwd_paged.cuh, fwd_paged_tc.cuh) and its device planner
// (templates/plan_paged.cuh): path, tiles, the planner's tables, the source with its entry points.
#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "compiler/codegen/codegen.hpp"
#include "compiler/codegen/codegen_internal.hpp"
#include "compiler/plan/paged_plan.hpp"
#include "compiler/support/error.hpp"

namespace attnjit {

using namespace codegen_detail;

namespace {
// Static shared memory of the paged forward (fwd_paged.cuh's AjPagedShared).
int paged_smem_bytes(const KernelRequest& r, const KernelConfig& c) {
  const int pitch = r.head_dim % 4 == 0 ? r.head_dim + 4 : r.head_dim + 1;  // fwd_paged.cuh's AJ_PG_KPITCH
  return 4 * (c.tile_q * r.head_dim + c.tile_k * pitch + c.tile_k * r.head_dim_v + 4 * c.tile_k);
}
}  // namespace

KernelPath choose_paged_path(const KernelRequest& r) {
  const bool tiles = (r.config.tile_q == 0 || r.config.tile_q == 16) && (r.config.tile_k == 0 || r.config.tile_k == 64);
  const bool dims = r.head_dim % 16 == 0 && r.head_dim_v % 16 == 0 && r.head_dim <= 128 && r.head_dim_v <= 128;
  return r.arch >= 80 && (r.dtype == DType::F16 || r.dtype == DType::BF16) && dims && tiles ? KernelPath::Sm80 : KernelPath::Simt;
}

KernelConfig resolve_paged_config(const KernelRequest& r) {
  require(r.arch >= 60, "--arch " + arch_name(r.arch), "attnjit needs sm_60 or newer");
  require(r.head_dim >= 1 && r.head_dim_v >= 1 && r.head_dim <= 256 && r.head_dim_v <= 256, "--head-dim",
          "the paged forward takes head dims 1 to 256, got " + std::to_string(r.head_dim) + " and " +
              std::to_string(r.head_dim_v));
  require(r.dtype != DType::E4M3, "--dtype fp8_e4m3",
          "the paged forward's queries and output are fp32, fp16 or bf16; fp8_e4m3 is a KV cache dtype (kv_dtype)");
  require(!r.kv_dtype || *r.kv_dtype == r.dtype || *r.kv_dtype == DType::E4M3, "kv_dtype",
          std::string("the KV caches are the queries' dtype (") + to_string(r.dtype) + ") or fp8_e4m3, got " +
              (r.kv_dtype ? to_string(*r.kv_dtype) : ""));
  KernelConfig c = r.config;
  if (choose_paged_path(r) == KernelPath::Sm80) {  // fwd_paged_tc.cuh: one m16 tile of rows, 16 keys per warp
    require(c.stages == 0 || c.stages == 1, "stages", "the paged forward has one stage, got " + std::to_string(c.stages));
    require(c.warps == 0 || c.warps == 4, "warps", "the paged forward runs 4 warps, got " + std::to_string(c.warps));
    return KernelConfig{16, 64, 1, 4};
  }
  const bool default_q = c.tile_q == 0, default_k = c.tile_k == 0;
  if (default_q) c.tile_q = 16;
  if (default_k) c.tile_k = 32;
  require(c.tile_q >= 1 && c.tile_q <= 64, "tile_q", "the paged forward takes 1 to 64 query rows per item, got " +
                                                         std::to_string(c.tile_q));
  require(c.tile_k == 16 || c.tile_k == 32 || c.tile_k == 64, "tile_k",
          "the paged forward takes tile_k 16, 32 or 64, got " + std::to_string(c.tile_k));
  // Past head dim 128 the default tiles shrink to fit: 16 keys, then 8 rows.
  if (default_k && paged_smem_bytes(r, c) > 48 * 1024) c.tile_k = 16;
  if (default_q && paged_smem_bytes(r, c) > 48 * 1024) c.tile_q = 8;
  require(paged_smem_bytes(r, c) <= 48 * 1024, "config",
          "the paged forward's tiles " + std::to_string(c.tile_q) + "x" + std::to_string(c.tile_k) + " need " +
              std::to_string(paged_smem_bytes(r, c)) + " bytes of static shared memory, over 48 KB; use smaller tiles");
  require(c.stages == 0 || c.stages == 1, "stages", "the paged forward has one stage, got " + std::to_string(c.stages));
  require(c.warps == 0 || c.warps == 4, "warps", "the paged forward runs 4 warps, got " + std::to_string(c.warps));
  c.stages = 1;
  c.warps = 4;
  return c;
}

namespace {
// The device planner's tables (templates/plan_paged.cuh says what each holds).
std::string paged_planner_tables(const Pattern& p, const PagedHeads& heads, int32_t tile_q) {
  if (heads.heads_q < 1 || heads.heads_kv < 1 || heads.heads_q % heads.heads_kv)
    throw UserError("heads", std::to_string(heads.heads_q) + " query heads over " + std::to_string(heads.heads_kv) +
                                 " kv heads: both >= 1, and heads_kv must divide heads_q");
  const std::vector<PagedHeadClass> classes = paged_head_classes(p, heads.heads_q, heads.heads_kv, tile_q);
  std::ostringstream os;
  auto list = [&](const char* type, const char* name, const auto& values, const char* what) {
    os << "__device__ const " << type << " " << name << "[] = {";
    for (size_t i = 0; i < values.size(); ++i) os << (i ? ", " : "") << values[i] << (std::string(type) == "aj_i64" ? "ll" : "");
    os << "};  // " << what << "\n";
  };
  std::vector<int64_t> segment, dilation, left, right, offsets;
  std::vector<int32_t> first, count;
  for (const Branch& b : p.branches) {
    segment.push_back(b.segment.value_or(0));
    dilation.push_back(b.dilation);
    left.push_back(b.window.left >= 0 ? b.window.left : -1);
    const bool has_right = b.window.right >= 0 || b.causal;
    right.push_back(!has_right ? -1 : b.causal ? std::min<int64_t>(b.window.right >= 0 ? b.window.right : 0, 0) : b.window.right);
  }
  for (const PagedHeadClass& c : classes) {
    first.push_back(c.head);
    count.push_back(c.heads);
    offsets.insert(offsets.end(), c.offsets.begin(), c.offsets.end());
  }
  os << "// The device planner's pattern (templates/plan_paged.cuh), for " << heads.heads_q << " query heads over "
     << heads.heads_kv << " kv heads\n";
  os << "#define AJ_PG_NB " << p.branches.size() << "\n#define AJ_PG_CLASSES " << classes.size() << "\n";
  list("aj_i64", "aj_pg_segment", segment, "per branch: segment length (0: none)");
  list("aj_i64", "aj_pg_dilation", dilation, "dilation");
  list("aj_i64", "aj_pg_left", left, "band: kpos >= qpos - left (-1: unbounded)");
  list("aj_i64", "aj_pg_right", right, "band: kpos <= qpos + right (-1: unbounded)");
  list("int", "aj_pg_class_head", first, "per class of heads: its first head");
  list("int", "aj_pg_class_heads", count, "its heads");
  list("aj_i64", "aj_pg_class_offset", offsets, "[class][branch]: the offset, -1: the branch does not apply");
  return os.str();
}
}  // namespace

PagedKernels generate_paged_kernels(const Pattern& p, const KernelRequest& request, const PagedHeads& heads,
                                    const TemplateSet& templates) {
  const KernelRequest r = for_pattern(request, p);
  PagedKernels out;
  KernelSource& k = out.source;
  k.path = choose_paged_path(r);
  k.config = resolve_paged_config(r);
  k.arch = arch_name(r);
  k.threads = out.threads;
  k.template_hash = templates.hash();
  k.has_mask = pattern_has_mask(p);
  k.seeks = pattern_has_layout(p);  // the device planner leaves every layout to the forward
  std::ostringstream os;
  const std::string generated = generate_mask_predicate(p, true) + paged_planner_tables(p, heads, k.config.tile_q);
  const bool tc = k.path == KernelPath::Sm80;
  std::vector<std::string> bodies{"fwd_paged.cuh"};
  if (tc) bodies.push_back("fwd_paged_tc.cuh");
  bodies.push_back("plan_paged.cuh");
  std::string prefix = render_prefix("paged forward", k, r, p, generated, templates, bodies, true, true);
  if (r.kv_dtype && *r.kv_dtype == DType::E4M3) {  // before the templates: fwd_paged.cuh reads it
    const std::string at = "#define AJ_DTYPE ";
    std::string kv = "#define AJ_KV_DTYPE 3  // the caches: fp8 e4m3, scaled per kv head\n";
    // sm_89 and newer decode the codes with cvt.rn.f16x2.e4m3x2 (exact, two at a time), older archs
    // in software (exact too).
    if (r.arch >= 89) kv += "#define AJ_KV_CVT 1\n";
    prefix.insert(prefix.find(at), kv);
  }
  os << prefix;
  os << "\n// ---- generated: entry points\n";
  for (const auto& [entry, body] : {std::pair<const char*, const char*>{"fwd", tc ? "aj_fwd_paged_tc(p);" : "aj_fwd_paged(p);"},
                                    {"merge", "aj_paged_merge(p);"},
                                    {"plan", "aj_paged_plan(p);"}}) {
    os << "extern \"C\" __global__ void __launch_bounds__(" << out.threads << ", 1) AJ_KERNEL_NAME_" << entry
       << "(const AjPagedParams p) {\n  " << body << "\n}\n";
  }
  name_by_hash(k, os.str(), "attnjit_paged_");
  out.forward = k.name + "_fwd";
  out.merge = k.name + "_merge";
  out.plan = k.name + "_plan";
  return out;
}

}  // namespace attnjit

