// The JIT front: a KernelSource -> a loadable CUBIN, from the in-memory layer, the disk cache or
// NVRTC, following the knobs (always compile, no JIT, dump dir).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "compiler/cache/kernel_cache.hpp"
#include "compiler/codegen/codegen.hpp"
#include "compiler/nvrtc/cubin_info.hpp"
#include "compiler/nvrtc/nvrtc_compiler.hpp"
#include "compiler/support/knobs.hpp"

namespace attnjit {

struct CompiledKernel {
  std::string name, arch;
  std::vector<uint8_t> cubin;
  CacheKey key;
  bool cache_hit = false;
  double seconds = 0;                // compile time on a miss, lookup time on a hit
  std::vector<ResourceUsage> usage;  // from the CUBIN (and ptxas' spill counts when compiled now)
  bool spills_known = false;         // ptxas reported spills (only when compiled in this process)
  std::string nvrtc_version;         // of the NVRTC that compiled it in this process; "" for a cache hit
};

class KernelCompiler {
public:
  KernelCompiler(KernelCache& cache, Knobs knobs);

  // Everything that changes the bytes: attnjit version, templates, source, options, NVRTC, arch.
  // The NVRTC is the one that compiles k.arch here, or kAnyNvrtc where none does: that key is
  // every compiled kernel's alias (KernelCache::put_alias), so it finds what any NVRTC compiled.
  CacheKey key_for(const KernelSource& k) const;
  static constexpr const char* kAnyNvrtc = "any";

  // Memoised: a kernel found or compiled once is handed out again without touching the cache.
  std::shared_ptr<const CompiledKernel> get(const KernelSource& k);

  // Compiles misses in parallel (`jobs` threads), storing each in the cache as it finishes (before
  // `progress` counts it), so an interrupted call keeps what it compiled. With no-JIT, every miss is
  // listed in one error. Failures come back as error text in `errors` (same index), never aborting
  // the others.
  std::vector<CompiledKernel> get_many(const std::vector<KernelSource>& kernels, int jobs,
                                       std::vector<std::string>& errors,
                                       const std::function<void(size_t, size_t)>& progress = {});

  KernelCache& cache() { return cache_; }

private:
  CompileRequest request_for(const KernelSource& k) const;
  CacheKey key_with_nvrtc(const KernelSource& k, const std::string& nvrtc_version) const;
  void dump(const KernelSource& k, const std::vector<std::string>& options, const std::string& log) const;

  KernelCache& cache_;
  Knobs knobs_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const CompiledKernel>> loaded_;  // by source hash + arch
};

// Process-wide JIT counters, summed over every KernelCompiler since the process started: kernels
// NVRTC compiled here (compile_seconds: their compile times summed; compile_wall_seconds: the wall
// time of the compile batches, which run in parallel), kernels found in a kernel cache (memory or
// disk layer) and the time spent finding them, and failed compiles. A caller reads them before
// and after a call to tell what the call compiled (bench/peers.py's time to first result).
struct JitCounters {
  int64_t compiled = 0, cache_hits = 0, failed = 0;
  double compile_seconds = 0, compile_wall_seconds = 0, lookup_seconds = 0;
};
JitCounters jit_counters();

// The NVRTC options every kernel is compiled with (the emulator follows their semantics:
// --use_fast_math flushes fp32 subnormals and contracts a * b + c to fma).
const std::vector<std::string>& kernel_compile_options();

// kernel_request() with what the knobs choose for a call that names nothing else (TMA loads, the
// wgmma backward): the kernels the precompiler, `attnjit compile`/`dump` and attnjit.dump build.
KernelRequest knob_request(const Shape& s, DType dtype, int arch, bool arch_specific);

// The process-wide cache built from the knobs (directory, size cap, disabled).
KernelCache& default_kernel_cache();

// The process-wide cache of a directory (created on first use, kept for the process); an empty
// `dir` is default_kernel_cache().
KernelCache& kernel_cache_for(const std::string& dir);

}  // namespace attnjit
