#include "compiler/driver/dump.hpp"

#include <sstream>

#include "compiler/jit/jit.hpp"
#include "compiler/nvrtc/cubin_info.hpp"
#include "compiler/pattern/pattern_stats.hpp"
#include "compiler/plan/plan_backward.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"

namespace attnjit {

const std::vector<std::string>& dump_stages() {
  static const std::vector<std::string> stages = {"pattern", "plan", "plan-bwd", "plan-paged", "cuda", "ptx", "sass"};
  return stages;
}

namespace {

std::string joined_stages() {
  std::string out;
  for (const std::string& s : dump_stages()) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string pattern_text(const Pattern& p, const DumpRequest& r) {
  std::string text = "; pattern " + pattern_hash(p) + "\n";
  if (r.full) return text + canonical_text(p);
  int64_t not_shown = 0;
  text += canonical_summary(p, 16, &not_shown);
  if (not_shown > 0) {
    text += "(" + std::to_string(not_shown) + " explicit blocks not shown; " + r.full_hint +
            " prints every one, the hash covers them all)\n";
  }
  return text;
}

std::string plan_text(const Pattern& p, const DumpRequest& r) {
  if (r.backward)
    throw UserError(r.backward_name, "applies to " + r.stage_name + " cuda, ptx and sass; the key-major plan is " + r.stage_name +
                                         " plan-bwd");
  if (!r.shape) throw UserError(r.seq_name, "is required for " + r.stage_name + " " + r.stage + ": a plan is made for one shape");
  const Shape& s = *r.shape;
  if (r.pack_branches && r.stage == "plan-bwd")
    throw UserError(r.pack_branches_name, "applies to " + r.stage_name + " plan; the backward's plans are never packed");
  Plan plan = lower_to_plan(p, s, r.tiles, r.dynamic, nullptr, r.random_in_kernel ? RandomLayouts::InKernel : RandomLayouts::InPlan,
                            r.pack_branches ? BranchPacking::Packed : BranchPacking::Separate);
  std::string text = "; pattern " + pattern_hash(p) + "\n";
  const int64_t items = r.full ? -1 : 8;
  if (r.stage == "plan-bwd") return text + print_backward_plan(lower_to_backward_plan(plan), items);
  plan.stats.attended_pairs = pattern_stats(MaskContext{p, s, r.dynamic}).attended_pairs;
  return text + print_plan(plan, items) + print_plan_sharing(p, s);  // which calls a runtime serves with this plan
}

std::string paged_plan_text(const Pattern& p, const DumpRequest& r) {
  if (r.paged_requests.empty())
    throw UserError(r.kv_lens_name, "is required for " + r.stage_name + " plan-paged: each request's cached tokens");
  KernelRequest k;
  k.head_dim = static_cast<int>(r.paged_heads.head_dim), k.head_dim_v = static_cast<int>(r.paged_heads.head_dim_v);
  k.config = r.paged_config;
  const KernelConfig c = resolve_paged_config(k);
  const PagedPlan plan = lower_paged_plan(p, r.paged_heads.heads_q, r.paged_heads.heads_kv, r.paged_heads.head_dim,
                                          r.paged_heads.head_dim_v, r.paged_requests, TileConfig{c.tile_q, c.tile_k});
  return "; pattern " + pattern_hash(p) + "\n" + print_paged_plan(plan, r.full ? -1 : 8);
}

std::string kernel_text(const Pattern& p, const DumpRequest& r) {
  if (r.paged && r.backward) throw UserError(r.backward_name, "the paged forward has no backward kernels");
  std::string text;
  for (const KernelRequest& k : r.kernels) {
    const KernelSource source = r.paged      ? generate_paged_kernels(p, k, PagedHeads{r.paged_heads.heads_q, r.paged_heads.heads_kv}).source
                                : r.backward ? generate_backward_kernels(p, k).source
                                             : generate_kernel(p, k);
    if (r.stage == "cuda") {
      text += source.source;
      continue;
    }
    CompileRequest req;
    req.name = source.name, req.source = source.source, req.arch = source.arch;
    if (r.stage == "ptx") {
      text += compile_ptx(req);
    } else {
      KernelCompiler compiler(default_kernel_cache(), knobs());
      text += disassemble_cubin(compiler.get(source)->cubin);
    }
  }
  return text;
}

}  // namespace

std::string dump_stage(const Pattern& p, const DumpRequest& r) {
  if (r.stage == "pattern") return pattern_text(p, r);
  if (r.stage == "plan" || r.stage == "plan-bwd") return plan_text(p, r);
  if (r.stage == "plan-paged") return paged_plan_text(p, r);
  if (r.stage == "cuda" || r.stage == "ptx" || r.stage == "sass") return kernel_text(p, r);
  throw UserError(r.stage_name, "expected one of " + joined_stages() + ", got \"" + r.stage + "\"");
}

}  // namespace attnjit
