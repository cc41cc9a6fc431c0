// attnjit dump SPEC --stage pattern|plan|plan-bwd|plan-paged|cuda|ptx|sass [--backward|--paged]: the pipeline's
// values, printed.
#include <algorithm>
#include <iostream>
#include <memory>

#include "compiler/driver/dump.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/support/error.hpp"
#include "tools/cli_common.hpp"
#include "tools/commands.hpp"

namespace attnjit::cli {

namespace {
struct DumpOptions {
  std::string spec, stage = "pattern", tile = "64x64", dynamic;
  std::vector<int64_t> kv_lens, queries;
  ShapeOptions shape;
  KernelOptions kernel;
  bool full = false, backward = false, paged = false, pack_branches = false;
  const CLI::App* app = nullptr;  // which options were given
};

// The options that only some stages read, the stages that do and what for: given with another
// stage they would be ignored, so they are errors (docs/cli.md). The heads are read by the plans,
// and by the kernel stages with --paged only (check_stage_options).
struct StageOption {
  const char* name;
  std::vector<std::string> stages;
  const char* why;
};
const StageOption kStageOptions[] = {
    {"--backward", {"cuda", "ptx", "sass"}, "; the key-major plan is --stage plan-bwd"},
    {"--paged", {"cuda", "ptx", "sass"}, " (the paged forward's kernels); the plan of a paged call is --stage plan-paged"},
    {"--dtype", {"cuda", "ptx", "sass"}, " (the kernels' dtype)"},
    {"--arch", {"cuda", "ptx", "sass"}, " (the kernels' archs)"},
    {"--kernel-tile", {"cuda", "ptx", "sass"}, " (the kernels' tile); a plan's tile is --tile"},
    {"--stages", {"cuda", "ptx", "sass"}, " (the kernels' cp.async stages)"},
    {"--random-in-kernel", {"plan", "plan-bwd", "cuda", "ptx", "sass"}, " (random layouts left to the kernels)"},
    {"--tile", {"plan", "plan-bwd"}, " (the plan's tile); the kernels' tile is --kernel-tile"},
    {"--dynamic", {"plan", "plan-bwd"}, " (a dynamic layout's table, for a plan of one shape)"},
    // plan-bwd: dump_stage says why the backward's plans are never packed.
    {"--pack-branches", {"plan", "plan-bwd"}, " (the tiles packing leaves out and the key weights)"},
    {"--kv-lens", {"plan-paged"}, " (each request's cached tokens)"},
    {"--queries", {"plan-paged"}, " (each request's queries)"},
    {"--full", {"pattern", "plan", "plan-bwd", "plan-paged"}, " (every explicit block or work item)"},
    // The shape: a plan is made for one; a kernel serves every length, offset and batch.
    {"--seq", {"plan", "plan-bwd"}, " (a plan is made for one shape; the kernels serve every length)"},
    {"--seq-k", {"plan", "plan-bwd"}, " (a plan is made for one shape; the kernels serve every length)"},
    {"--q-offset", {"plan", "plan-bwd"}, " (a plan is made for one shape; the kernels serve every offset)"},
    {"--k-offset", {"plan", "plan-bwd"}, " (a plan is made for one shape; the kernels serve every offset)"},
    {"--batch", {"plan", "plan-bwd"}, " (a plan is made for one shape; the kernels serve every batch)"},
    {"--heads-q", {"plan", "plan-bwd", "plan-paged", "cuda", "ptx", "sass"}, " (the kernel stages with --paged)"},
    {"--heads-kv", {"plan", "plan-bwd", "plan-paged", "cuda", "ptx", "sass"}, " (the kernel stages with --paged)"},
    {"--head-dim", {"plan", "plan-bwd", "plan-paged", "cuda", "ptx", "sass"}, ""},
    {"--head-dim-v", {"plan", "plan-bwd", "plan-paged", "cuda", "ptx", "sass"}, ""},
};

void check_stage_options(const DumpOptions& o) {
  const bool kernel_stage = o.stage == "cuda" || o.stage == "ptx" || o.stage == "sass";
  for (const char* heads : {"--heads-q", "--heads-kv"})
    if (kernel_stage && !o.paged && o.app->get_option(heads)->count() > 0)
      throw UserError(std::string(heads) + " " + o.app->get_option(heads)->results().front(),
                      "applies to --stage " + o.stage + " with --paged (the paged kernels' heads); the other kernels serve "
                      "every head count");
  for (const StageOption& s : kStageOptions) {
    const CLI::Option* opt = o.app->get_option(s.name);
    if (opt->count() == 0 || std::find(s.stages.begin(), s.stages.end(), o.stage) != s.stages.end()) continue;
    std::string given = s.name;
    if (opt->get_expected_min() > 0) {  // an option with a value (not a flag): as given
      std::string values;
      for (const std::string& v : opt->results()) values += (values.empty() ? "" : ",") + v;
      given += " " + values;
    }
    std::string stages;
    for (size_t n = 0; n < s.stages.size(); ++n)
      stages += (n == 0 ? "" : n + 1 == s.stages.size() ? " and " : ", ") + s.stages[n];
    throw UserError(given, "applies to --stage " + stages + s.why);
  }
}

int run_dump(const DumpOptions& o) {
  const Pattern p = load_spec(o.spec);
  check_stage_options(o);
  DumpRequest r;
  r.stage = o.stage;
  r.full = o.full;
  r.backward = o.backward;
  r.paged = o.paged;
  if (!o.queries.empty() && o.queries.size() != o.kv_lens.size())
    throw UserError("--queries", "has " + std::to_string(o.queries.size()) + " entries for " + std::to_string(o.kv_lens.size()) +
                                     " requests (--kv-lens); give one per request, or leave it out for one query each");
  for (size_t b = 0; b < o.kv_lens.size(); ++b) r.paged_requests.push_back({o.queries.empty() ? 1 : o.queries[b], o.kv_lens[b]});
  r.paged_heads.heads_q = o.shape.heads_q;
  r.paged_heads.heads_kv = o.shape.heads_kv > 0 ? o.shape.heads_kv : o.shape.heads_q;
  r.paged_heads.head_dim = o.shape.head_dim;
  r.paged_heads.head_dim_v = o.shape.head_dim_v > 0 ? o.shape.head_dim_v : o.shape.head_dim;
  std::optional<DynamicLayout> dyn;
  if (o.shape.has_seq()) {
    r.shape = o.shape.shape();
    if (o.stage == "plan" || o.stage == "plan-bwd") dyn = dynamic_table_for(p, *r.shape, o.dynamic);
  }
  r.dynamic = dyn ? &*dyn : nullptr;
  r.tiles = parse_tile_config(o.tile);
  r.random_in_kernel = o.kernel.random_in_kernel;
  r.pack_branches = o.pack_branches;
  if (o.stage == "cuda" || o.stage == "ptx" || o.stage == "sass") {
    Shape heads;
    heads.head_dim = o.shape.head_dim;
    heads.head_dim_v = o.shape.head_dim_v > 0 ? o.shape.head_dim_v : o.shape.head_dim;
    r.kernels = o.kernel.requests(heads);
  }
  std::cout << dump_stage(p, r);
  return 0;
}
}  // namespace

void register_dump(CLI::App& app, int& rc) {
  auto o = std::make_shared<DumpOptions>();
  CLI::App* sub = app.add_subcommand("dump", "print a stage of the pipeline: pattern, plan, plan-bwd, plan-paged, cuda, ptx or sass");
  sub->add_option("spec", o->spec, "pattern spec (JSON)")->required();
  sub->add_option("--stage", o->stage, "what to print (plan-bwd: the key-major plan of the backward pass; plan-paged: a call over a paged KV cache)")
      ->check(CLI::IsMember({"pattern", "plan", "plan-bwd", "plan-paged", "cuda", "ptx", "sass"}))
      ->capture_default_str();
  o->shape.add_to(sub, true);
  sub->add_option("--tile", o->tile, "query x key tile size of the plan")->capture_default_str();
  o->kernel.add_to(sub, false);
  sub->add_option("--dynamic", o->dynamic, "CSR table for a dynamic layout (JSON)");
  sub->add_flag("--full", o->full, "print every work item (default: the first 8), or with --stage pattern every block of long explicit lists (default: the first 16 of each)");
  sub->add_option("--kv-lens", o->kv_lens, "--stage plan-paged: each request's cached tokens (its queries' own included)")
      ->delimiter(',');
  sub->add_option("--queries", o->queries, "--stage plan-paged: each request's queries, its last tokens (default: 1 each)")
      ->delimiter(',');
  sub->add_flag("--pack-branches", o->pack_branches,
                "--stage plan: a pair several branches attend computed once (the tiles left out and the key weights shown)");
  sub->add_flag("--paged", o->paged, "--stage cuda|ptx|sass: the paged forward's kernels (fwd, merge, plan)");
  sub->add_flag("--backward", o->backward, "--stage cuda|ptx|sass: the backward kernels (pre, dq, dkdv, cvt) instead of the forward");
  o->app = sub;
  sub->callback([o, &rc] { rc = guarded([&] { return run_dump(*o); }); });
}

}  // namespace attnjit::cli
