// attnjit info: versions, driver and GPUs.
#include <iostream>
#include <sstream>

#include "compiler/jit/jit.hpp"
#include "compiler/support/knobs.hpp"
#include "compiler/nvrtc/nvrtc_library.hpp"

#include "runtime/cuda/cuda_probe.hpp"
#include "runtime/cpu/plan_executor.hpp"
#include "tools/cli_common.hpp"
#include "tools/commands.hpp"

namespace attnjit::cli {

namespace {

// "nvrtc: 13.0, 12.9", then one line per NVRTC (where, what found it, the archs it compiles for)
// and per file skipped; without any: why, and how to get one.
void print_nvrtcs(std::ostream& os) {
  const NvrtcSearch search = nvrtc_search();
  if (search.found.empty()) {
    os << "nvrtc: none" << (search.disabled ? ": ATTNJIT_NVRTC=none turns the search off" : " found") << "\n";
  } else {
    os << "nvrtc:";
    for (size_t i = 0; i < search.found.size(); ++i) os << (i ? ", " : " ") << search.found[i].version;
    os << "\n";
    for (const NvrtcLibrary& lib : search.found) {
      const std::vector<int> served = archs_served(search, lib);
      os << "  " << lib.version << " at " << lib.path << " (" << lib.found_by << "): compiles for "
         << (served.empty() ? std::string("no arch a newer one does not") : arch_list(served)) << "\n";
    }
  }
  for (const std::string& s : search.skipped) os << "  skipped " << s << "\n";
  if (search.found.empty() && !search.disabled) {
    os << "  " << how_to_get_nvrtc() << "\n";
  }
}

}  // namespace

void register_info(CLI::App& app, int& rc) {
  CLI::App* sub = app.add_subcommand("info", "versions, CUDA driver and GPUs");
  sub->callback([&rc] {
    rc = guarded([] {
      std::cout << "attnjit " << ATTNJIT_VERSION << "\n";
      std::cout << "spec format: " << kSpecVersion << "\n";
      print_nvrtcs(std::cout);
      const KernelCache& cache = default_kernel_cache();
      const CacheStats cs = cache.stats();
      std::cout << "kernel cache: " << (cache.disk_enabled() ? cache.dir() : "memory only") << " (" << cs.entries
                << " entries, " << cs.bytes << " bytes)\n";
      std::cout << "cpu executor: " << cpu_simd_name(cpu_simd_selected()) << "\n";
      std::cout << "knobs:\n";
      std::istringstream lines(knobs().describe());
      for (std::string line; std::getline(lines, line);) std::cout << "  " << line << "\n";
      const DriverProbe d = probe_cuda_driver();
      if (!d.loaded) {
        std::cout << "cuda driver: none\n  " << d.problem << "\n";
        return 0;
      }
      std::cout << "cuda driver: " << d.driver_version / 1000 << "." << d.driver_version % 1000 / 10 << "\n";
      if (d.gpus.empty()) std::cout << "  " << d.problem << "\n";
      for (const GpuInfo& g : d.gpus) {
        std::cout << "gpu " << g.index << ": " << g.name << " (sm_" << g.cc_major << g.cc_minor << ", " << g.sm_count
                  << " SMs)\n";
      }
      return 0;
    });
  });
}

}  // namespace attnjit::cli
