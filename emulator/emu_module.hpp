// A kernel object loaded into the emulator, and its launches: the grid's blocks run on a pool of
// OS threads, each block on a BlockExecutor (a fiber per GPU thread). A launch either completes
// or throws KernelFault with the first problem found, located by block, thread and source line.
#pragma once

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "emulator/block_executor.hpp"
#include "emulator/emu_compiler.hpp"

namespace attnjit::emu {

// A defect of the kernel (or of its launch) that the emulator caught.
class KernelFault : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

struct LaunchRequest {
  std::string kernel;                   // the __global__ function; empty: the module's own name
  unsigned grid[3] = {1, 1, 1};
  unsigned block_threads = 1;
  size_t dynamic_shared = 0;
  void** args = nullptr;                // as cuLaunchKernel: one pointer per kernel parameter
  std::vector<GlobalBuffer> buffers;    // every global buffer the kernel may touch
  std::optional<uint64_t> seed;         // thread order; default: the ATTNJIT_EMU_SEED knob
  std::optional<double> timeout_s;      // per block; default: the ATTNJIT_EMU_TIMEOUT knob
};

class EmuModule {
public:
  // Loads the shared object (written to a private temporary file, dlopen()ed, bound to the
  // emulator's table). UserError if it cannot be loaded.
  explicit EmuModule(std::shared_ptr<const EmuBinary> binary);
  ~EmuModule();
  EmuModule(const EmuModule&) = delete;
  EmuModule& operator=(const EmuModule&) = delete;

  // Runs the kernel over the grid. Seed, threads and timeout come from the knobs. Thread-safe.
  void launch(const LaunchRequest& r) const;
  const std::string& name() const { return binary_->name; }
  // "<name>.cu:LINE in FUNCTION" for a code address of this module (inlined frames joined by " <- ").
  std::string symbolize(const void* pc) const;

private:
  std::shared_ptr<const EmuBinary> binary_;
  std::string path_;
  using Entry = void (*)(void**);
  Entry entry(const std::string& kernel) const;  // UserError when the module has no such kernel
  void* handle_ = nullptr;
  std::vector<ReadOnlyRange> readable_;
};

// One loaded module per compiled binary, for the life of the process.
std::shared_ptr<const EmuModule> load_emu_module(std::shared_ptr<const EmuBinary> binary);

}  // namespace attnjit::emu
