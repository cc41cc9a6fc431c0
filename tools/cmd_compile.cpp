// attnjit compile SPEC: build (or find in the cache) the kernels of a spec and report them.
// attnjit precompile MANIFEST: fill a cache directory ahead of deployment.
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>

#include "compiler/driver/precompile.hpp"
#include "compiler/jit/jit.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"
#include "compiler/tune/autotune.hpp"
#include "tools/cli_common.hpp"
#include "tools/commands.hpp"

namespace attnjit::cli {

namespace {

// -j: NVRTC compiles on as many threads, each holding a compile's memory; more than this is a typo.
constexpr int kMaxJobs = 1024;

struct CompileOptions {
  std::string spec, cache_dir;
  KernelOptions kernel;
  int jobs = 1;
  bool backward = false;
};

// One line per kernel (entry point `entry`, by default the kernel's name): where it came from and
// what it costs on the chip; a kernel compiled now ends with the NVRTC version that compiled it.
void report(const KernelSource& k, const CompiledKernel& c, const std::string& entry = "", int shared_bytes = -1,
            int threads = -1) {
  const std::string name = entry.empty() ? k.name : entry;
  const ResourceUsage* u = nullptr;
  for (const ResourceUsage& x : c.usage)
    if (x.kernel == name) u = &x;
  char line[640];
  const std::string tile = std::to_string(k.config.tile_q) + "x" + std::to_string(k.config.tile_k) + "w" +
                           std::to_string(k.config.warps) + " stages=" + std::to_string(k.config.stages);
  std::snprintf(line, sizeof line, "%s %s key=%s %s %.3fs registers=%d spills=%s shared=%dB+%dB threads=%d tile=%s%s\n",
                name.c_str(), k.arch.c_str(), c.key.hex.substr(0, 16).c_str(), c.cache_hit ? "hit" : "miss",
                c.seconds, u ? u->registers : -1,
                c.spills_known && u ? std::to_string(u->spill_store_bytes + u->spill_load_bytes).append("B").c_str()
                                    : "n/a(cached)",
                u ? u->shared_bytes : 0, shared_bytes >= 0 ? shared_bytes : k.shared_bytes, threads >= 0 ? threads : k.threads,
                tile.c_str(), c.nvrtc_version.empty() ? "" : (" nvrtc=" + c.nvrtc_version).c_str());
  std::cout << line;
}

int run_compile(const CompileOptions& o) {
  const Pattern p = load_spec(o.spec);
  // "--kernel-tile candidates": every configuration the autotuner would time, per arch.
  const bool candidates = o.kernel.tile == "candidates";
  KernelOptions base = o.kernel;
  if (candidates) base.tile = "default";
  std::vector<KernelRequest> requests;
  for (KernelRequest r : base.requests()) {
    if (!candidates) {
      requests.push_back(r);
      continue;
    }
    for (const KernelConfig& c : o.backward ? candidate_backward_configs(r) : candidate_configs(for_pattern(r, p))) {
      r.config = c;
      requests.push_back(r);
    }
  }
  std::vector<KernelSource> kernels;
  std::vector<BackwardKernels> backward;
  for (const KernelRequest& r : requests) {
    if (o.backward) {
      backward.push_back(generate_backward_kernels(p, r));
      kernels.push_back(backward.back().source);
    } else {
      kernels.push_back(generate_kernel(p, r));
    }
  }
  KernelCompiler compiler(kernel_cache_for(o.cache_dir), knobs());
  std::vector<std::string> errors;
  const std::vector<CompiledKernel> out = compiler.get_many(kernels, o.jobs, errors);
  int failed = 0;
  for (size_t n = 0; n < kernels.size(); ++n) {
    if (!errors[n].empty()) {
      std::cerr << "error: " << errors[n] << "\n";
      ++failed;
      continue;
    }
    if (!o.backward) {
      report(kernels[n], out[n]);
      continue;
    }
    const BackwardKernels& b = backward[n];
    report(kernels[n], out[n], b.pre, 0, b.aux_threads);
    report(kernels[n], out[n], b.dq, b.dq_shared_bytes, b.dq_threads);
    report(kernels[n], out[n], b.dkdv, b.dkdv_shared_bytes, b.dkdv_threads);
    report(kernels[n], out[n], b.cvt, 0, b.aux_threads);
  }
  return failed ? 1 : 0;
}

// ---- precompile ----------------------------------------------------------------------------

struct PrecompileOptions {
  std::string manifest, cache_dir, archs = "sm_80";
  int jobs = 1, top_k = 1;
};

void progress_bar(size_t done, size_t total) {
  const int width = 30, filled = total ? static_cast<int>(width * done / total) : width;
  std::fprintf(stderr, "\r[%s%s] %zu/%zu kernels", std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
               done, total);
  if (done == total) std::fprintf(stderr, "\n");
}

int run_precompile(const PrecompileOptions& o) {
  std::vector<ArchName> archs;
  std::stringstream ss(o.archs);
  for (std::string a; std::getline(ss, a, ',');)
    if (!a.empty()) archs.push_back(parse_arch_name(a));
  if (archs.empty()) throw UserError("--arch", "name at least one arch, e.g. sm_80");
  const PrecompileReport r = precompile_manifest(o.manifest, archs, o.cache_dir, o.jobs, o.top_k, progress_bar);
  for (const std::string& e : r.errors) std::cerr << "error: " << e << "\n";
  std::printf("precompiled %zu kernels into %s in %.1f s: %d compiled, %d already cached, %d failed\n", r.kernels,
              r.cache_dir.c_str(), r.seconds, r.compiled, r.cached, r.failed);
  return r.failed ? 1 : 0;
}

}  // namespace

void register_compile(CLI::App& app, int& rc) {
  auto o = std::make_shared<CompileOptions>();
  CLI::App* sub = app.add_subcommand("compile", "compile a spec's kernels (or find them in the cache) and report them");
  sub->add_option("spec", o->spec, "pattern spec (JSON)")->required();
  o->kernel.add_to(sub, true);
  sub->add_option("--cache-dir", o->cache_dir, "kernel cache directory (default: ATTNJIT_CACHE_DIR or ~/.cache/attnjit)");
  sub->add_option("-j,--jobs", o->jobs, "parallel compiles (1 to " + std::to_string(kMaxJobs) + ")")
      ->capture_default_str()
      ->check(in_range(1, kMaxJobs));
  sub->add_flag("--backward", o->backward, "the backward kernels (one line per entry point; --kernel-tile is their tile)");
  sub->callback([o, &rc] { rc = guarded([&] { return run_compile(*o); }); });

  auto m = std::make_shared<PrecompileOptions>();
  CLI::App* pre = app.add_subcommand("precompile", "fill a kernel cache from a manifest, ahead of deployment");
  pre->add_option("manifest", m->manifest, "manifest (JSON)")->required();
  pre->add_option("--arch", m->archs, "target archs, comma separated (sm_80, sm_90, sm_90a, ...)")->capture_default_str();
  pre->add_option("--cache-dir", m->cache_dir, "cache directory to fill");
  pre->add_option("-j,--jobs", m->jobs, "parallel compiles (1 to " + std::to_string(kMaxJobs) + ")")
      ->capture_default_str()
      ->check(in_range(1, kMaxJobs));
  pre->add_option("--top-k", m->top_k, "for \"default\" tiles: also the k fastest tuned configurations (0: the best only)")
      ->capture_default_str()
      ->check(at_least(0));
  pre->callback([m, &rc] { rc = guarded([&] { return run_precompile(*m); }); });
}

}  // namespace attnjit::cli
