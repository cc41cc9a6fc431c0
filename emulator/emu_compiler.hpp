// Kernels for the CPU emulator: the exact CUDA text NVRTC would receive, compiled by the host C++
// compiler after the emulation prelude (emulator/emu_abi.h + emulator/prelude.h) into a shared
// object, and kept in the kernel cache under its own key (source and prelude, host compiler and
// its flags). Memory accesses are instrumented with -fsanitize=thread, whose hooks the prelude
// sends to the emulator; the sanitizer's own runtime is never linked.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compiler/cache/kernel_cache.hpp"
#include "compiler/codegen/codegen.hpp"
#include "compiler/support/knobs.hpp"

namespace attnjit::emu {

// What one emulated kernel is compiled from. The name must be the kernel function's (extern "C").
struct EmuSource {
  std::string name;           // e.g. attnjit_fwd_0123456789ab; the source file is called <name>.cu
  std::string source;         // CUDA text (as NVRTC would get it)
  std::string arch = "sm_80";  // the arch the text was generated for (part of the key)
  std::string template_hash;  // of the templates it was rendered from, if any
  std::vector<std::string> kernels;  // the __global__ functions to launch; empty: one, called `name`
};
EmuSource emu_source_of(const KernelSource& k);

struct EmuBinary {
  std::string name, arch;
  std::vector<uint8_t> shared_object;
  CacheKey key;
  bool cache_hit = false;
  double seconds = 0;
};

// The host compiler's identity and the flags it is run with (both part of the key). UserError when
// no host compiler can be found, naming ATTNJIT_EMU_CXX.
struct HostCompiler {
  std::string path;     // resolved executable
  std::string version;  // first line of --version
  std::vector<std::string> compile_flags;
};
const HostCompiler& host_compiler(const Knobs& k);

// The full translation unit handed to the host compiler: ABI, prelude, `#line 1 "<name>.cu"`, the
// kernel text, and per kernel K an entry point aj_emu_entry_K(void** args) that calls it.
std::string emulation_unit(const EmuSource& s);

// Memory layer, then the disk cache, then the host compiler. A compile error is a UserError that
// shows the compiler's log, its command line and the kernel source with line numbers; so is a
// compile that reports success without leaving a shared object that loads (a host compiler that is
// no compiler), which is never stored. A cached object that is no shared object is compiled again
// with a warning.
std::shared_ptr<const EmuBinary> compile_for_emulator(const EmuSource& s, KernelCache& cache, const Knobs& k);

// Why `bytes` are not a shared object this host could load (an ELF file of its word size, byte
// order and machine, of type ET_DYN, whose program headers and loadable segments lie within the
// file), or "".
std::string shared_object_problem(const std::vector<uint8_t>& bytes);

// The check `attnjit cache verify` makes of an emulator entry's payload (KernelCache::PayloadCheck):
// for an emulator kernel's arch ("emu-sm_80") shared_object_problem, for any other "".
std::string emulator_entry_problem(const std::string& arch, const std::vector<uint8_t>& payload);

}  // namespace attnjit::emu
