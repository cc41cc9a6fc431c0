// attnjit cache ls|stats|verify|clear: look after the kernel cache.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

#include "compiler/jit/jit.hpp"
#include "compiler/nvrtc/cubin_info.hpp"
#include "compiler/support/knobs.hpp"
#include "emulator/emu_compiler.hpp"
#include "tools/cli_common.hpp"
#include "tools/commands.hpp"

namespace attnjit::cli {

namespace {
struct CacheOptions {
  std::string action, cache_dir;
};

// Beyond the checksums: a GPU kernel's payload must be a CUBIN whose ELF reads, an emulator
// kernel's a shared object this machine can load.
std::string payload_problem(const std::string& arch, const std::vector<uint8_t>& payload) {
  if (arch.compare(0, 3, "sm_") == 0) {
    try {
      inspect_cubin(payload);
    } catch (const UserError& e) {
      return "holds no usable CUBIN: " + e.message();
    }
    return "";
  }
  return emu::emulator_entry_problem(arch, payload);
}

// A --cache-dir given to look after must be a cache's directory: a file there would read as
// "disk cache disabled", and a missing one (a typo) would be created, listed empty or "cleared".
void check_cache_dir(const std::string& dir) {
  if (dir.empty()) return;  // the default cache (ATTNJIT_CACHE_DIR or ~/.cache/attnjit)
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(dir, ec);
  if (st.type() == std::filesystem::file_type::not_found)
    throw UserError("--cache-dir " + dir, "does not exist; give the directory of an existing kernel cache (attnjit compile and "
                                          "precompile create one with --cache-dir)");
  if (ec) throw UserError("--cache-dir " + dir, "cannot be read: " + ec.message());
  if (st.type() != std::filesystem::file_type::directory)
    throw UserError("--cache-dir " + dir, std::string(st.type() == std::filesystem::file_type::regular ? "is a file" : "is not a directory") +
                                              "; give the directory of a kernel cache");
}

int run_cache(const CacheOptions& o) {
  check_cache_dir(o.cache_dir);
  // The default cache (ATTNJIT_CACHE_DIR or ~/.cache/attnjit) before anything was compiled into
  // it: said as such, not created (ATTNJIT_CACHE_DIR=/typo would otherwise make /typo), and nothing
  // is wrong with it.
  const std::string dir = knobs().cache_dir;
  std::error_code ec;
  if (o.cache_dir.empty() && !dir.empty() && !knobs().disable_cache &&
      std::filesystem::status(dir, ec).type() == std::filesystem::file_type::not_found) {
    std::cout << "cache: " << dir << " does not exist yet: nothing has been compiled into it (ATTNJIT_CACHE_DIR names the "
              << "cache; compile or precompile creates it)\n";
    return 0;
  }
  KernelCache& cache = kernel_cache_for(o.cache_dir);
  if (!cache.disk_enabled()) {
    std::cout << "cache: disk cache disabled (" << (cache.dir().empty() ? "no directory" : cache.dir()) << ")\n";
    return o.action == "verify" ? 1 : 0;
  }
  if (o.action == "ls") {
    for (const CacheEntryInfo& e : cache.list(payload_problem)) {
      std::printf("%s %8lld B %-32s %-7s %s\n", e.hex.substr(0, 16).c_str(), static_cast<long long>(e.bytes),
                  e.kernel_name.c_str(), e.arch.c_str(), e.valid ? "ok" : ("BAD: " + e.problem).c_str());
    }
  } else if (o.action == "stats") {
    const CacheStats s = cache.stats();
    std::printf("cache: %s\nentries: %lld\nbytes: %lld (limit %lld)\n", cache.dir().c_str(),
                static_cast<long long>(s.entries), static_cast<long long>(s.bytes),
                static_cast<long long>(cache.max_bytes()));
  } else if (o.action == "verify") {
    std::vector<CacheEntryInfo> bad;
    const int64_t n = cache.verify_all(&bad, payload_problem);
    for (const CacheEntryInfo& e : bad) std::printf("BAD %s: %s\n", e.hex.c_str(), e.problem.c_str());
    std::printf("%lld bad entries in %s\n", static_cast<long long>(n), cache.dir().c_str());
    return n ? 1 : 0;
  } else {
    cache.clear();
    std::printf("cleared %s\n", cache.dir().c_str());
  }
  return 0;
}
}  // namespace

void register_cache(CLI::App& app, int& rc) {
  auto o = std::make_shared<CacheOptions>();
  CLI::App* sub = app.add_subcommand("cache", "list, count, verify or clear the kernel cache");
  sub->add_option("action", o->action, "ls, stats, verify or clear")
      ->required()
      ->check(CLI::IsMember({"ls", "stats", "verify", "clear"}));
  sub->add_option("--cache-dir", o->cache_dir,
                  "kernel cache directory, which must exist (default: ATTNJIT_CACHE_DIR or ~/.cache/attnjit)");
  sub->callback([o, &rc] { rc = guarded([&] { return run_cache(*o); }); });
}

}  // namespace attnjit::cli
