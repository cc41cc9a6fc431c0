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
#include "compiler/support/nearest.hpp"
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

using json = nlohmann::json;

// A JSON value as an error shows it: a scalar as written (at most 80 characters), else its type.
std::string shown(const json& v) {
  if (!v.is_primitive()) return std::string("an ") + v.type_name();
  std::string text = v.dump();
  return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

// A field the manifest format does not have is an error (a typo such as "backwards" would otherwise
// leave a deployment without the kernels it asked for), naming the nearest valid one.
void check_fields(const json& obj, const std::string& where, const std::vector<std::string>& allowed) {
  for (const auto& [key, value] : obj.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) throw unknown_field(where, key, allowed);
  }
}

const char* const kEntryFields =
    "needs \"patterns\" (paths), \"head_dims\" (integers), \"dtypes\" (strings) and optionally \"tiles\" (\"default\", "
    "\"candidates\" or \"QxK\") and \"backward\" (true or false)";

// entry[key]: a non-empty array (or nullptr when optional and absent). Missing, not an array or
// empty is an error at `where` (the entry): an entry that gives no kernels is a mistake.
const json* list_field(const json& entry, const std::string& key, const std::string& where, bool required, const std::string& what) {
  const auto it = entry.find(key);
  if (it == entry.end()) {
    if (!required) return nullptr;
    throw UserError(where, std::string(kEntryFields) + "; \"" + key + "\" is missing");
  }
  if (!it->is_array()) throw UserError(where, std::string(kEntryFields) + "; \"" + key + "\" is " + shown(*it));
  if (it->empty())
    throw UserError(where + "/" + key, "is empty, so this entry gives no kernels; list at least one " + what +
                                          (required ? " (or drop the entry)" : " (or leave the field out for its default)"));
  return &*it;
}

}  // namespace

std::vector<ManifestEntry> read_manifest(const std::string& path) {
  const std::string text = read_small_file(path, "manifest");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw UserError(path, std::string("invalid JSON: ") + printable(e.what(), 300));
  }
  const std::string shape_hint = "expected {\"attnjit_manifest\": 1, \"entries\": [{\"patterns\": [...], \"head_dims\": [...], "
                                 "\"dtypes\": [...], \"tiles\": [\"default\"]}]}";
  if (j.is_object()) check_fields(j, path + ": ", {"attnjit_manifest", "entries"});
  if (!j.is_object() || !j.contains("attnjit_manifest") || !j.contains("entries") || !j["entries"].is_array())
    throw UserError(path, shape_hint);
  const json& version = j["attnjit_manifest"];
  if (!version.is_number_integer() || version.get<int64_t>() != 1)
    throw UserError(path + ": /attnjit_manifest", "expected 1 (the manifest format this attnjit reads), got " + shown(version));
  const json& entries = j["entries"];
  if (entries.empty())
    throw UserError(path + ": /entries", "is empty, so the manifest gives no kernels; add an entry: {\"patterns\": [...], "
                                         "\"head_dims\": [...], \"dtypes\": [...]}");
  std::vector<ManifestEntry> out;
  for (size_t e = 0; e < entries.size(); ++e) {
    const json& entry = entries[e];
    const std::string where = path + ": /entries/" + std::to_string(e);
    if (!entry.is_object()) throw UserError(where, std::string(kEntryFields) + "; got " + shown(entry));
    check_fields(entry, where, {"patterns", "head_dims", "dtypes", "tiles", "backward"});
    ManifestEntry m;
    const json& patterns = *list_field(entry, "patterns", where, true, "spec path");
    for (size_t n = 0; n < patterns.size(); ++n) {
      if (!patterns[n].is_string())
        throw UserError(where + "/patterns/" + std::to_string(n), "expected a spec's path (a string), got " + shown(patterns[n]));
      m.patterns.push_back(patterns[n].get<std::string>());
    }
    // Integers only, checked before narrowing: 64.9 or 2^32 + 64 is never read as 64.
    const json& dims = *list_field(entry, "head_dims", where, true, "head dim");
    for (size_t n = 0; n < dims.size(); ++n) {
      const json& d = dims[n];
      const bool in_range = d.is_number_unsigned() ? d.get<uint64_t>() >= 1 && d.get<uint64_t>() <= uint64_t{INT32_MAX}
                                                   : d.is_number_integer() && d.get<int64_t>() >= 1 && d.get<int64_t>() <= INT32_MAX;
      if (!in_range)
        throw UserError(where + "/head_dims/" + std::to_string(n),
                        "expected a head dim, an integer in [1, " + std::to_string(INT32_MAX) + "], got " + shown(d));
      m.head_dims.push_back(static_cast<int>(d.get<int64_t>()));
    }
    const json& dtypes = *list_field(entry, "dtypes", where, true, "dtype");
    for (size_t n = 0; n < dtypes.size(); ++n) {
      const std::string at = where + "/dtypes/" + std::to_string(n);
      if (!dtypes[n].is_string()) throw UserError(at, "expected a dtype (fp32, fp16, bf16 or fp8_e4m3), got " + shown(dtypes[n]));
      try {
        m.dtypes.push_back(parse_dtype(dtypes[n].get<std::string>()));
      } catch (const UserError&) {
        throw UserError(at, "unknown dtype " + shown(dtypes[n]) + "; use fp32, fp16, bf16 or fp8_e4m3");
      }
    }
    if (const json* tiles = list_field(entry, "tiles", where, false, "tile (\"default\")")) {
      m.tiles.clear();
      for (size_t n = 0; n < tiles->size(); ++n) {
        const json& t = (*tiles)[n];
        const std::string at = where + "/tiles/" + std::to_string(n);
        if (!t.is_string()) throw UserError(at, "expected \"default\", \"candidates\" or a tile \"QxK\", got " + shown(t));
        const std::string name = t.get<std::string>();
        if (name != "default" && name != "candidates") {
          try {
            parse_kernel_tile(name);
          } catch (const UserError& err) {
            throw UserError(at, shown(t) + " is not \"default\", \"candidates\" or a tile: " + err.message());
          }
        }
        m.tiles.push_back(name);
      }
    }
    if (entry.contains("backward")) {
      if (!entry["backward"].is_boolean())
        throw UserError(where, std::string(kEntryFields) + "; \"backward\" is " + shown(entry["backward"]));
      m.backward = entry["backward"].get<bool>();
    }
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<KernelSource> manifest_kernels(const std::string& path, const std::vector<ArchName>& archs, int top_k) {
  if (archs.empty()) throw UserError("arch", "name at least one arch to compile for, e.g. sm_80");
  const std::vector<ManifestEntry> entries = read_manifest(path);
  const TuningDb db = all_tuning_dbs();
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::vector<KernelSource> kernels;
  for (const ManifestEntry& entry : entries) {
    const std::vector<std::string>& patterns = entry.patterns;
    const std::vector<int>& head_dims = entry.head_dims;
    const std::vector<DType>& dtypes = entry.dtypes;
    const std::vector<std::string>& tiles = entry.tiles;
    const bool backward = entry.backward;
    for (const std::string& spec : patterns) {
      const Pattern p = load_spec_file((dir / spec).string());
      for (int d : head_dims)
        for (const DType dt : dtypes)
          for (const std::string& t : tiles)
            for (const ArchName& arch : archs)
              // Random layouts: also the kernels that decide them, which the runtime takes for
              // shapes whose plans would hash too many blocks (ATTNJIT_RANDOM_IN_KERNEL).
              for (const bool random_in_kernel : {false, true}) {
                if (random_in_kernel && !p.has_layout_kind(Layout::Kind::Random)) continue;
                Shape heads;
                heads.head_dim = heads.head_dim_v = d;
                KernelRequest r = knob_request(heads, dt, arch.arch, arch.specific);
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
