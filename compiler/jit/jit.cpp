#include "compiler/jit/jit.hpp"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <variant>

#include "compiler/support/sha256.hpp"
#include "compiler/nvrtc/nvrtc_compiler.hpp"
#include "compiler/support/error.hpp"

namespace attnjit {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

std::mutex& counters_mutex() {
  static std::mutex m;
  return m;
}

JitCounters& counters() {
  static JitCounters c;
  return c;
}

}  // namespace

JitCounters jit_counters() {
  std::lock_guard<std::mutex> lock(counters_mutex());
  return counters();
}

// Kernels are compiled for speed: fast math for exp2/log2, and line info for profilers.
const std::vector<std::string>& kernel_compile_options() {
  static const std::vector<std::string> options = {"--use_fast_math", "-lineinfo"};
  return options;
}

KernelRequest knob_request(const Shape& s, DType dtype, int arch, bool arch_specific) {
  KernelRequest r = kernel_request(s, dtype, arch, arch_specific);
  r.tma = knobs().tma;
  r.wgmma_backward = knobs().bwd_wgmma;
  r.lazy_rescale = knobs().lazy_rescale;
  r.poly_exp2 = knobs().poly_exp2;
  r.pack_branches = knobs().pack_branches;
  r.persistent = knobs().persistent;
  return r;
}

KernelCache& default_kernel_cache() {
  static KernelCache cache(knobs().cache_dir, knobs().cache_max_bytes, !knobs().disable_cache);
  return cache;
}

KernelCache& kernel_cache_for(const std::string& dir) {
  if (dir.empty()) return default_kernel_cache();
  static std::mutex m;
  static std::map<std::string, std::unique_ptr<KernelCache>> caches;
  std::lock_guard<std::mutex> lock(m);
  std::unique_ptr<KernelCache>& c = caches[dir];
  if (!c) c = std::make_unique<KernelCache>(dir, knobs().cache_max_bytes, true);
  return *c;
}

KernelCompiler::KernelCompiler(KernelCache& cache, Knobs knobs) : cache_(cache), knobs_(std::move(knobs)) {}

CompileRequest KernelCompiler::request_for(const KernelSource& k) const {
  CompileRequest r;
  r.name = k.name;
  r.source = k.source;
  r.arch = k.arch;
  r.options = kernel_compile_options();
  return r;
}

CacheKey KernelCompiler::key_for(const KernelSource& k) const {
  const std::string version = nvrtc_version_for(k.arch);
  return key_with_nvrtc(k, version.empty() ? kAnyNvrtc : version);
}

CacheKey KernelCompiler::key_with_nvrtc(const KernelSource& k, const std::string& nvrtc_version) const {
  CacheKeyParts parts;
  parts.attnjit_version = ATTNJIT_VERSION;
  parts.template_hash = k.template_hash;
  parts.source_hash = k.source_hash;
  parts.options = join(canonical_options(request_for(k)));
  parts.nvrtc_version = nvrtc_version;
  parts.arch = k.arch;
  return make_cache_key(parts);
}

void KernelCompiler::dump(const KernelSource& k, const std::vector<std::string>& options, const std::string& log) const {
  if (knobs_.dump_dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(knobs_.dump_dir, ec);
  const std::string base = knobs_.dump_dir + "/" + k.name + "." + k.arch;
  std::ofstream(base + ".cu") << k.source;
  std::ofstream(base + ".options") << join(options) << "\n";
  std::ofstream(base + ".log") << log;
  if (!std::filesystem::exists(base + ".cu")) attnjit::log(LogLevel::Warn, "cannot write kernel dumps to " + knobs_.dump_dir);
}

std::shared_ptr<const CompiledKernel> KernelCompiler::get(const KernelSource& k) {
  const std::string id = k.source_hash + "/" + k.arch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = loaded_.find(id); it != loaded_.end()) return it->second;
  }
  std::vector<std::string> errors;
  std::vector<CompiledKernel> out = get_many({k}, 1, errors);
  if (!errors[0].empty()) throw UserError(k.name + " (" + k.arch + ")", errors[0]);
  auto compiled = std::make_shared<const CompiledKernel>(std::move(out[0]));
  std::lock_guard<std::mutex> lock(mutex_);
  return loaded_.emplace(id, std::move(compiled)).first->second;
}

std::vector<CompiledKernel> KernelCompiler::get_many(const std::vector<KernelSource>& kernels, int jobs,
                                                     std::vector<std::string>& errors,
                                                     const std::function<void(size_t, size_t)>& progress) {
  std::vector<CompiledKernel> out(kernels.size());
  errors.assign(kernels.size(), "");
  std::vector<size_t> misses;
  for (size_t n = 0; n < kernels.size(); ++n) {
    const auto t0 = std::chrono::steady_clock::now();
    CompiledKernel& c = out[n];
    c.name = kernels[n].name;
    c.arch = kernels[n].arch;
    c.key = key_for(kernels[n]);
    // A kernel some other NVRTC compiled (its alias, put below) is taken where no NVRTC here
    // compiles for the arch, and under no-JIT, where a precompiled cache is all there is.
    const CacheKey any = key_with_nvrtc(kernels[n], kAnyNvrtc);
    if (!knobs_.always_compile) {
      std::optional<std::vector<uint8_t>> bin = cache_.get(c.key);
      if (!bin && knobs_.no_jit && c.key.hex != any.hex) bin = cache_.get(any);
      if (bin) {
        c.cubin = std::move(*bin);
        c.cache_hit = true;
        c.usage = inspect_cubin(c.cubin);
        c.seconds = seconds_since(t0);
        std::lock_guard<std::mutex> lock(counters_mutex());
        counters().cache_hits += 1;
        counters().lookup_seconds += c.seconds;
        continue;
      }
    }
    misses.push_back(n);
  }
  if (knobs_.no_jit && !misses.empty()) {
    std::string list;
    for (size_t n : misses) list += "\n  " + kernels[n].name + " for " + kernels[n].arch + " (key " + out[n].key.hex + ")";
    throw UserError("ATTNJIT_NO_JIT", std::to_string(misses.size()) + " kernel(s) are not in the cache at " +
                                          cache_.dir() + " and JIT is off:" + list +
                                          "\nprecompile them (attnjit precompile) or unset ATTNJIT_NO_JIT");
  }
  std::vector<CompileRequest> requests;
  for (size_t n : misses) requests.push_back(request_for(kernels[n]));
  // Each kernel goes into the cache as soon as it is compiled, on the thread that compiled it: an
  // interrupted precompile keeps what it finished. Each call fills only its own kernel's slots; the
  // process-wide counters (jit_counters) take their lock.
  auto finished = [&](size_t m, const CompileOutcome& result) {
    {
      std::lock_guard<std::mutex> lock(counters_mutex());
      if (const auto* ok = std::get_if<CompileResult>(&result)) {
        counters().compiled += 1;
        counters().compile_seconds += ok->seconds;
      } else {
        counters().failed += 1;
      }
    }
    const size_t n = misses[m];
    if (const auto* err = std::get_if<std::string>(&result)) {
      errors[n] = *err;
      dump(kernels[n], canonical_options(requests[m]), *err);
      return;
    }
    const CompileResult& r = std::get<CompileResult>(result);
    CompiledKernel& c = out[n];
    c.cubin = r.cubin;
    c.seconds = r.seconds;
    c.usage = r.usage;
    c.spills_known = true;
    c.nvrtc_version = r.nvrtc_version;
    c.key = key_with_nvrtc(kernels[n], r.nvrtc_version);  // the NVRTC that did compile it
    cache_.put(c.key, c.cubin, c.name, c.arch);
    cache_.put_alias(key_with_nvrtc(kernels[n], kAnyNvrtc), c.key.hex);
    dump(kernels[n], r.options, r.log);
  };
  const auto t_compile = std::chrono::steady_clock::now();
  compile_many(requests, jobs, progress, finished);
  if (!misses.empty()) {
    std::lock_guard<std::mutex> lock(counters_mutex());
    counters().compile_wall_seconds += seconds_since(t_compile);
  }
  return out;
}

}  // namespace attnjit
