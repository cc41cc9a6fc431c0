// attnjit compile SPEC: build (or find in the cache) the kernels of a spec and report them.
// attnjit precompile MANIFEST: fill a cache directory ahead of deployment.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "compiler/error.hpp"
#include "compiler/jit.hpp"
#include "compiler/knobs.hpp"
#include "compiler/spec_json.hpp"
#include "compiler/tuning_db.hpp"
#include "tools/cli_common.hpp"
#include "tools/commands.hpp"

namespace attnjit::cli {

namespace {

struct CompileOptions {
  std::string spec, cache_dir;
  KernelOptions kernel;
  int jobs = 1;
  bool backward = false;
};

// One line per kernel (entry point `entry`, by default the kernel's name): where it came from and
// what it costs on the chip.
void report(const KernelSource& k, const CompiledKernel& c, const std::string& entry = "", int shared_bytes = -1,
            int threads = -1) {
  const std::string name = entry.empty() ? k.name : entry;
  const ResourceUsage* u = nullptr;
  for (const ResourceUsage& x : c.usage)
    if (x.kernel == name) u = &x;
  char line[512];
  std::snprintf(line, sizeof line, "%s %s key=%s %s %.3fs registers=%d spills=%s shared=%dB+%dB threads=%d\n",
                name.c_str(), k.arch.c_str(), c.key.hex.substr(0, 16).c_str(), c.cache_hit ? "hit" : "miss",
                c.seconds, u ? u->registers : -1,
                c.spills_known && u ? std::to_string(u->spill_store_bytes + u->spill_load_bytes).append("B").c_str()
                                    : "n/a(cached)",
                u ? u->shared_bytes : 0, shared_bytes >= 0 ? shared_bytes : k.shared_bytes, threads >= 0 ? threads : k.threads);
  std::cout << line;
}

int run_compile(const CompileOptions& o) {
  const Pattern p = load_spec_file(o.spec);
  std::vector<KernelSource> kernels;
  std::vector<BackwardKernels> backward;
  for (const KernelRequest& r : o.kernel.requests()) {
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

// Every tuning database on this machine: the user's (<cache dir>/tuning/*.json) and the shipped
// ones (autotune_db/*.json), for any GPU: the build machine need not be the one that runs.
TuningDb all_tuning_dbs() {
  std::vector<std::string> files;
  for (const std::string& dir : {knobs().cache_dir + "/tuning", shipped_db_dir()}) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
      if (e.path().extension() == ".json") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return TuningDb(files);
}

// "default" in a manifest: the default configuration plus what the tuning databases selected
// for this pattern, head dims, dtype and arch (their best, or their `top_k` fastest), for the
// forward kernel or, with `backward`, the backward kernels.
std::vector<KernelConfig> selected_configs(const TuningDb& db, const Pattern& p, const KernelRequest& r, int top_k,
                                           bool backward = false) {
  std::vector<KernelConfig> out{KernelConfig{}};
  const std::string signature = pattern_signature(p);
  for (const DbFile& f : db.files()) {
    if (!f.trusted) continue;
    for (const DbEntry& e : f.entries) {
      const TuneKey& k = e.key;
      if (k.arch != r.arch || k.pattern_signature != signature || k.head_dim != r.head_dim ||
          k.head_dim_v != r.head_dim_v || k.dtype != r.dtype || k.backward != backward) {
        continue;
      }
      std::vector<CandidateResult> ok;
      for (const CandidateResult& c : e.result.candidates)
        if (c.status == "ok") ok.push_back(c);
      std::stable_sort(ok.begin(), ok.end(), [](const auto& a, const auto& b) { return a.median_ms < b.median_ms; });
      out.push_back(e.result.best);
      for (int n = 0; n < top_k && n < static_cast<int>(ok.size()); ++n) out.push_back(ok[static_cast<size_t>(n)].config);
    }
  }
  return out;
}

// A manifest: {"attnjit_manifest": 1, "entries": [{"patterns": [...], "head_dims": [...],
// "dtypes": [...], "tiles": ["default", "64x64"], "backward": true}]}; pattern paths are relative
// to the manifest; "backward" (default false) adds the backward kernels for training. The tile
// "candidates" stands for every configuration the autotuner may time (forward, and backward with
// "backward"): a cache filled so, in parallel, lets `attnjit tune` time without compiling.
std::vector<KernelSource> manifest_kernels(const std::string& path, const std::vector<int>& archs, int top_k) {
  const TuningDb db = all_tuning_dbs();
  std::ifstream in(path);
  if (!in) throw UserError(path, "cannot open the manifest; check the path");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path, std::string("invalid JSON: ") + e.what());
  }
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!j.is_object() || j.value("attnjit_manifest", 0) != 1 || !j.contains("entries") || !j["entries"].is_array()) {
    throw UserError(path, "expected {\"attnjit_manifest\": 1, \"entries\": [{\"patterns\": [...], \"head_dims\": [...], "
                          "\"dtypes\": [...], \"tiles\": [\"default\"]}]}");
  }
  std::vector<KernelSource> kernels;
  for (size_t e = 0; e < j["entries"].size(); ++e) {
    const nlohmann::json& entry = j["entries"][e];
    const std::string where = path + ": /entries/" + std::to_string(e);
    std::vector<std::string> patterns, dtypes, tiles = {"default"};
    std::vector<int> head_dims;
    bool backward = false;
    try {
      patterns = entry.at("patterns").get<std::vector<std::string>>();
      head_dims = entry.at("head_dims").get<std::vector<int>>();
      dtypes = entry.at("dtypes").get<std::vector<std::string>>();
      if (entry.contains("tiles")) tiles = entry["tiles"].get<std::vector<std::string>>();
      if (entry.contains("backward")) backward = entry["backward"].get<bool>();
    } catch (const nlohmann::json::exception&) {
      throw UserError(where, "needs \"patterns\" (paths), \"head_dims\" (integers), \"dtypes\" (strings) and optionally "
                             "\"tiles\" (\"default\", \"candidates\" or \"QxK\") and \"backward\" (true or false)");
    }
    for (const std::string& spec : patterns) {
      const Pattern p = load_spec_file((dir / spec).string());
      for (int d : head_dims)
        for (const std::string& dt : dtypes)
          for (const std::string& t : tiles)
            for (int arch : archs) {
              KernelRequest r;
              r.head_dim = r.head_dim_v = d;
              r.dtype = parse_dtype(dt);
              r.arch = arch;
              if (r.dtype == DType::BF16 && arch < 80) continue;  // no such kernel; not a failure
              const std::vector<KernelConfig> configs = t == "default"      ? selected_configs(db, p, r, top_k)
                                                        : t == "candidates" ? candidate_configs(r)
                                                                            : std::vector<KernelConfig>{parse_kernel_tile(t)};
              for (const KernelConfig& c : configs) {
                r.config = c;
                kernels.push_back(generate_kernel(p, r));
              }
              // Training: the backward kernels of this pattern, head dim, dtype and arch, with the
              // tiles the tuning databases selected for them (and the default), or every candidate.
              if (!backward) continue;
              r.config = {};
              for (const KernelConfig& c : t == "candidates" ? candidate_backward_configs(r) : selected_configs(db, p, r, top_k, true)) {
                r.config = c;
                kernels.push_back(generate_backward_kernels(p, r).source);
              }
            }
    }
  }
  // Patterns that share their masks share kernels: compile each once.
  std::vector<KernelSource> unique;
  for (KernelSource& k : kernels) {
    bool seen = false;
    for (const KernelSource& u : unique) seen |= u.name == k.name && u.arch == k.arch;
    if (!seen) unique.push_back(std::move(k));
  }
  return unique;
}

void progress_bar(size_t done, size_t total) {
  const int width = 30, filled = total ? static_cast<int>(width * done / total) : width;
  std::fprintf(stderr, "\r[%s%s] %zu/%zu kernels", std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
               done, total);
  if (done == total) std::fprintf(stderr, "\n");
}

int run_precompile(const PrecompileOptions& o) {
  std::vector<int> archs;
  std::stringstream ss(o.archs);
  for (std::string a; std::getline(ss, a, ',');)
    if (!a.empty()) archs.push_back(parse_arch(a));
  const std::vector<KernelSource> kernels = manifest_kernels(o.manifest, archs, o.top_k);
  KernelCache& cache = kernel_cache_for(o.cache_dir);
  KernelCompiler compiler(cache, knobs());
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> errors;
  const std::vector<CompiledKernel> out = compiler.get_many(kernels, o.jobs, errors, progress_bar);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int hits = 0, compiled = 0, failed = 0;
  for (size_t n = 0; n < kernels.size(); ++n) {
    if (!errors[n].empty()) {
      std::cerr << "error: " << kernels[n].name << " for " << kernels[n].arch << ": " << errors[n] << "\n";
      ++failed;
    } else {
      (out[n].cache_hit ? hits : compiled)++;
    }
  }
  std::printf("precompiled %zu kernels into %s in %.1f s: %d compiled, %d already cached, %d failed\n", kernels.size(),
              cache.dir().c_str(), secs, compiled, hits, failed);
  return failed ? 1 : 0;
}

}  // namespace

void register_compile(CLI::App& app, int& rc) {
  auto o = std::make_shared<CompileOptions>();
  CLI::App* sub = app.add_subcommand("compile", "compile a spec's kernels (or find them in the cache) and report them");
  sub->add_option("spec", o->spec, "pattern spec (JSON)")->required();
  o->kernel.add_to(sub, true);
  sub->add_option("--cache-dir", o->cache_dir, "kernel cache directory (default: ATTNJIT_CACHE_DIR or ~/.cache/attnjit)");
  sub->add_option("-j,--jobs", o->jobs, "parallel compiles")->capture_default_str();
  sub->add_flag("--backward", o->backward, "the backward kernels (one line per entry point; --kernel-tile is their tile)");
  sub->callback([o, &rc] { rc = guarded([&] { return run_compile(*o); }); });

  auto m = std::make_shared<PrecompileOptions>();
  CLI::App* pre = app.add_subcommand("precompile", "fill a kernel cache from a manifest, ahead of deployment");
  pre->add_option("manifest", m->manifest, "manifest (JSON)")->required();
  pre->add_option("--arch", m->archs, "target archs, comma separated")->capture_default_str();
  pre->add_option("--cache-dir", m->cache_dir, "cache directory to fill");
  pre->add_option("-j,--jobs", m->jobs, "parallel compiles")->capture_default_str();
  pre->add_option("--top-k", m->top_k, "for \"default\" tiles: also the k fastest tuned configurations")
      ->capture_default_str();
  pre->callback([m, &rc] { rc = guarded([&] { return run_precompile(*m); }); });
}

}  // namespace attnjit::cli
