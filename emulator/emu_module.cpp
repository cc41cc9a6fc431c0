#include "emulator/emu_module.hpp"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>
#include <xmmintrin.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"
#include "emulator/emu_api.hpp"

namespace attnjit::emu {
namespace {

// Where loaded kernel objects live on disk (kept for addr2line; removed at exit).
struct ModuleDir {
  std::string path;
  ModuleDir() {
    char tmpl[] = "/tmp/attnjit-emu-modules-XXXXXX";
    if (const char* d = mkdtemp(tmpl)) path = d;
  }
  ~ModuleDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};
ModuleDir& module_dir() {
  static ModuleDir d;
  return d;
}

struct PhdrSearch {
  std::string path;
  std::vector<ReadOnlyRange>* out;
};

// NVRTC compiles kernels with --use_fast_math (-ftz=true): fp32 subnormals are flushed. MXCSR's
// FTZ and DAZ give the host's SSE arithmetic the same rule while a worker runs blocks.
struct FlushDenormals {
  unsigned saved = _mm_getcsr();
  FlushDenormals() { _mm_setcsr(saved | 0x8040); }
  ~FlushDenormals() { _mm_setcsr(saved); }
};

}  // namespace

EmuModule::EmuModule(std::shared_ptr<const EmuBinary> binary) : binary_(std::move(binary)) {
  if (module_dir().path.empty()) throw UserError("emulator", "cannot create a temporary directory in /tmp for kernel objects");
  path_ = module_dir().path + "/" + binary_->key.hex.substr(0, 16) + "-" + binary_->name + ".so";
  {
    std::ofstream f(path_, std::ios::binary);
    f.write(reinterpret_cast<const char*>(binary_->shared_object.data()), std::streamsize(binary_->shared_object.size()));
    if (!f) throw UserError(path_, "cannot write the kernel object for the emulator (disk full?)");
  }
  handle_ = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) throw UserError(binary_->name, std::string("the emulator cannot load its kernel object: ") + dlerror());
  auto bind = reinterpret_cast<int (*)(const AjEmuApi*)>(dlsym(handle_, "aj_emu_bind"));
  if (!bind) throw UserError(binary_->name, "the kernel object lacks aj_emu_bind (not built by the emulator?)");
  if (bind(&emu_api()) != AJ_EMU_ABI_VERSION) throw UserError(binary_->name, "the kernel object was built for another emulator ABI");
  PhdrSearch search{path_, &readable_};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* arg) {
        auto& s = *static_cast<PhdrSearch*>(arg);
        if (!info->dlpi_name || s.path != info->dlpi_name) return 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD) continue;
          const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          s.out->push_back({lo, lo + ph.p_memsz});
        }
        return 1;
      },
      &search);
}

EmuModule::~EmuModule() = default;

EmuModule::Entry EmuModule::entry(const std::string& kernel) const {
  const std::string k = kernel.empty() ? binary_->name : kernel;
  auto e = reinterpret_cast<Entry>(dlsym(handle_, ("aj_emu_entry_" + k).c_str()));
  if (!e) throw UserError(binary_->name, "the kernel object has no kernel '" + k + "'");
  return e;
}  // never unloaded: a process keeps its modules (as the CUDA device does)

std::string EmuModule::symbolize(const void* pc) const {
  static std::mutex m;
  static std::map<const void*, std::string> memo;
  std::lock_guard<std::mutex> lock(m);
  if (auto it = memo.find(pc); it != memo.end()) return it->second;
  Dl_info info{};
  std::ostringstream fallback;
  fallback << pc;
  std::string result = fallback.str();
  if (dladdr(pc, &info) && info.dli_fbase) {
    // A return address: the call is the byte before it.
    const uintptr_t offset = reinterpret_cast<uintptr_t>(pc) - reinterpret_cast<uintptr_t>(info.dli_fbase) - 1;
    char cmd[1024];
    std::snprintf(cmd, sizeof cmd, "addr2line -C -f -i -e '%s' 0x%lx 2>/dev/null", path_.c_str(), static_cast<unsigned long>(offset));
    if (FILE* f = popen(cmd, "r")) {
      std::vector<std::string> lines;
      char buf[1024];
      while (std::fgets(buf, sizeof buf, f)) {
        std::string l(buf);
        l.erase(l.find_last_not_of("\n\r") + 1);
        lines.push_back(l);
      }
      pclose(f);
      std::string chain;
      for (size_t i = 0; i + 1 < lines.size(); i += 2) {
        std::string loc = lines[i + 1];
        if (const size_t p = loc.find(" (discriminator"); p != std::string::npos) loc.erase(p);
        if (loc.rfind("??", 0) == 0) continue;
        if (const size_t slash = loc.rfind('/'); slash != std::string::npos) loc.erase(0, slash + 1);  // the compile directory
        chain += (chain.empty() ? "" : " <- ") + loc + " in " + lines[i];
      }
      if (!chain.empty()) result = chain;
    }
  }
  memo.emplace(pc, result);
  return result;
}

void EmuModule::launch(const LaunchRequest& r) const {
  const Knobs& k = knobs();
  BlockLaunch bl;
  std::copy(r.grid, r.grid + 3, bl.grid);
  bl.block_threads = r.block_threads;
  bl.dynamic_shared = r.dynamic_shared;
  bl.entry = entry(r.kernel);
  bl.args = r.args;
  bl.buffers = r.buffers;
  bl.readable = readable_;
  bl.seed = r.seed.value_or(k.emu_seed);
  bl.timeout_s = r.timeout_s.value_or(k.emu_timeout_s);
  bl.symbolize = [this](const void* pc) { return symbolize(pc); };
  if (r.block_threads == 0 || r.block_threads > 1024) {
    throw UserError(name(), "block size " + std::to_string(r.block_threads) + " is outside 1..1024");
  }
  const uint64_t blocks = uint64_t(r.grid[0]) * r.grid[1] * r.grid[2];
  if (blocks == 0) return;
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const unsigned workers = unsigned(std::min<uint64_t>(blocks, k.emu_threads > 0 ? unsigned(k.emu_threads) : hw));
  std::atomic<uint64_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex m;
  std::string first_error;
  uint64_t first_block = UINT64_MAX;
  auto work = [&] {
    try {
      FlushDenormals ftz;
      BlockExecutor ex(bl);
      for (uint64_t b; !stop && (b = next++) < blocks;) {
        const unsigned x = unsigned(b % r.grid[0]), y = unsigned(b / r.grid[0] % r.grid[1]), z = unsigned(b / r.grid[0] / r.grid[1]);
        std::string err = ex.run(x, y, z);
        if (err.empty()) continue;
        std::lock_guard<std::mutex> lock(m);
        if (b < first_block) first_block = b, first_error = std::move(err);
        stop = true;
      }
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(m);
      if (first_error.empty()) first_error = e.what();
      stop = true;
    }
  };
  if (workers == 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    for (unsigned w = 0; w < workers; ++w) pool.emplace_back(work);
    for (auto& t : pool) t.join();
  }
  if (!first_error.empty()) throw KernelFault("emulator: kernel " + name() + ": " + first_error);
}

std::shared_ptr<const EmuModule> load_emu_module(std::shared_ptr<const EmuBinary> binary) {
  static std::mutex m;
  static auto* modules = new std::map<std::string, std::shared_ptr<const EmuModule>>;  // never destroyed
  std::lock_guard<std::mutex> lock(m);
  auto& slot = (*modules)[binary->key.hex];
  if (!slot) slot = std::make_shared<EmuModule>(std::move(binary));
  return slot;
}

}  // namespace attnjit::emu
