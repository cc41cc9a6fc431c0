// attnjit dump SPEC --stage pattern|plan|plan-bwd|cuda|ptx|sass [--backward]: the pipeline's values, printed.
#include <iostream>
#include <memory>

#include "compiler/jit.hpp"
#include "compiler/nvrtc/cubin_info.hpp"
#include "compiler/pattern/pattern_stats.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/plan/plan.hpp"
#include "compiler/plan/plan_backward.hpp"
#include "compiler/support/error.hpp"
#include "tools/cli_common.hpp"
#include "tools/commands.hpp"

namespace attnjit::cli {

namespace {
struct DumpOptions {
  std::string spec, stage = "pattern", tile = "64x64", dynamic;
  ShapeOptions shape;
  KernelOptions kernel;
  bool full = false, backward = false;
};

// --stage cuda|ptx|sass: the generated kernel for each --arch, as text.
int dump_kernel(const Pattern& p, const DumpOptions& o) {
  for (KernelRequest r : o.kernel.requests()) {
    r.head_dim = static_cast<int>(o.shape.head_dim);
    r.head_dim_v = static_cast<int>(o.shape.head_dim_v > 0 ? o.shape.head_dim_v : o.shape.head_dim);
    const KernelSource k = o.backward ? generate_backward_kernels(p, r).source : generate_kernel(p, r);
    if (o.stage == "cuda") {
      std::cout << k.source;
      continue;
    }
    CompileRequest req;
    req.name = k.name;
    req.source = k.source;
    req.arch = k.arch;
    if (o.stage == "ptx") {
      std::cout << compile_ptx(req);
    } else {
      KernelCompiler compiler(default_kernel_cache(), knobs());
      std::cout << disassemble_cubin(compiler.get(k)->cubin);
    }
  }
  return 0;
}

int run_dump(const DumpOptions& o) {
  const Pattern p = load_spec(o.spec);
  if (o.stage == "pattern") {
    std::cout << "; pattern " << pattern_hash(p) << "\n" << canonical_for_people(p, o.full);
    return 0;
  }
  if (o.stage != "plan" && o.stage != "plan-bwd") return dump_kernel(p, o);
  if (o.backward) throw UserError("--backward", "applies to --stage cuda, ptx and sass; the key-major plan is --stage plan-bwd");
  if (!o.shape.has_seq()) throw UserError("--seq", "is required for --stage " + o.stage + ": a plan is made for one shape");
  const Shape s = o.shape.shape();
  const std::optional<DynamicLayout> dyn = dynamic_table_for(p, s, o.dynamic);
  Plan plan = lower_to_plan(p, s, parse_tile_config(o.tile), dyn ? &*dyn : nullptr, nullptr,
                            o.kernel.random_in_kernel ? RandomLayouts::InKernel : RandomLayouts::InPlan);
  std::cout << "; pattern " << pattern_hash(p) << "\n";
  if (o.stage == "plan-bwd") {
    std::cout << print_backward_plan(lower_to_backward_plan(plan), o.full ? -1 : 8);
    return 0;
  }
  plan.stats.attended_pairs = pattern_stats(MaskContext{p, s, dyn ? &*dyn : nullptr}).attended_pairs;
  std::cout << print_plan(plan, o.full ? -1 : 8);
  std::cout << print_plan_sharing(p, s);  // which calls a runtime serves with this plan
  return 0;
}
}  // namespace

void register_dump(CLI::App& app, int& rc) {
  auto o = std::make_shared<DumpOptions>();
  CLI::App* sub = app.add_subcommand("dump", "print a stage of the pipeline: pattern, plan, plan-bwd, cuda, ptx or sass");
  sub->add_option("spec", o->spec, "pattern spec (JSON)")->required();
  sub->add_option("--stage", o->stage, "what to print (plan-bwd: the key-major plan of the backward pass)")
      ->check(CLI::IsMember({"pattern", "plan", "plan-bwd", "cuda", "ptx", "sass"}))
      ->capture_default_str();
  o->shape.add_to(sub, true);
  sub->add_option("--tile", o->tile, "query x key tile size of the plan")->capture_default_str();
  o->kernel.add_to(sub, false);
  sub->add_option("--dynamic", o->dynamic, "CSR table for a dynamic layout (JSON)");
  sub->add_flag("--full", o->full, "print every work item (default: the first 8), or with --stage pattern every block of long explicit lists (default: the first 16 of each)");
  sub->add_flag("--backward", o->backward, "--stage cuda|ptx|sass: the backward kernels (pre, dq, dkdv, cvt) instead of the forward");
  sub->callback([o, &rc] { rc = guarded([&] { return run_dump(*o); }); });
}

}  // namespace attnjit::cli
