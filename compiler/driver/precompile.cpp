// Precompile manifests (see the header).
#include "compiler/driver/precompile.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "compiler/jit/jit.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"
#include "compiler/support/read_file.hpp"
#include "compiler/tune/autotune.hpp"
#include "compiler/tune/tuning_db.hpp"

namespace attnjit {
namespace {

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
          k.head_dim_v != r.head_dim_v || k.dtype != r.dtype || k.backward != backward ||
          k.arch_specific != (r.arch_specific && !backward)) {
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

}  // namespace

std::vector<KernelSource> manifest_kernels(const std::string& path, const std::vector<ArchName>& archs, int top_k) {
  const TuningDb db = all_tuning_dbs();
  const std::string text = read_small_file(path, "manifest");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(path, std::string("invalid JSON: ") + printable(e.what(), 300));
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
            for (const ArchName& arch : archs)
              // Random layouts: also the kernels that decide them, which the runtime takes for
              // shapes whose plans would hash too many blocks (ATTNJIT_RANDOM_IN_KERNEL).
              for (const bool random_in_kernel : {false, true}) {
                if (random_in_kernel && !p.has_layout_kind(Layout::Kind::Random)) continue;
                Shape heads;
                heads.head_dim = heads.head_dim_v = d;
                KernelRequest r = knob_request(heads, parse_dtype(dt), arch.arch, arch.specific);
                r.tma = true;  // the TMA kernel, and its cp.async twin below: the runtime picks per call
                r.random_in_kernel = random_in_kernel;
                const std::vector<KernelConfig> configs = t == "default"      ? selected_configs(db, p, r, top_k)
                                                          : t == "candidates" ? candidate_configs(for_pattern(r, p))
                                                                              : std::vector<KernelConfig>{parse_kernel_tile(t)};
                for (const KernelConfig& c : configs) {
                  r.config = c;
                  kernels.push_back(generate_kernel(p, r));
                  // The Hopper path's cp.async kernel too: the runtime launches it for calls whose
                  // key rows tensor maps do not describe.
                  if (kernels.back().tma_maps) {
                    r.tma = false;
                    kernels.push_back(generate_kernel(p, r));
                    r.tma = true;
                  }
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

PrecompileReport precompile_manifest(const std::string& manifest, const std::vector<ArchName>& archs, const std::string& cache_dir,
                                     int jobs, int top_k, const std::function<void(size_t, size_t)>& progress) {
  const std::vector<KernelSource> kernels = manifest_kernels(manifest, archs, top_k);
  KernelCache& cache = kernel_cache_for(cache_dir);
  KernelCompiler compiler(cache, knobs());
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> errors;
  const std::vector<CompiledKernel> out = compiler.get_many(kernels, jobs, errors, progress);
  PrecompileReport r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.kernels = kernels.size();
  r.cache_dir = cache.dir();
  for (size_t n = 0; n < kernels.size(); ++n) {
    if (!errors[n].empty()) {
      r.errors.push_back(kernels[n].name + " for " + kernels[n].arch + ": " + errors[n]);
      ++r.failed;
    } else {
      (out[n].cache_hit ? r.cached : r.compiled)++;
    }
  }
  return r;
}

}  // namespace attnjit
