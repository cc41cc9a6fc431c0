// What a compiled CUBIN costs each kernel (registers, stack, shared memory, spills), read without a
// GPU, and its SASS through NVIDIA's binary utilities when they are installed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace attnjit {

struct ResourceUsage {
  int registers = -1;         // per thread; -1 when unknown (a device function seen only in the ptxas log)
  int spill_store_bytes = 0;  // from the ptxas log only (compile_cubin fills it); 0 from inspect_cubin
  int spill_load_bytes = 0;
  int stack_bytes = 0;   // per thread, cumulative over the call tree (cuobjdump's STACK); spills live here
  int shared_bytes = 0;  // static shared memory per block, including what the arch reserves (sm_90+: 1 KiB)
  int local_bytes = 0;   // static local memory per thread outside the stack (cuobjdump's LOCAL)
  int max_threads = 0;   // from __launch_bounds__ / __maxntid__ / reqntid; 0 when the kernel sets none
  std::string kernel;    // the symbol name (mangled unless extern "C")
  bool is_kernel = true;  // false: a non-inlined device function that ptxas reported spills for
};

// Per kernel (__global__ entry) in the CUBIN, in symbol-table order. Reads the ELF directly: the
// register count and stack size from the EIATTR records of `.nv.info`, max threads from the
// kernel's `.nv.info.<name>`, shared and local memory from the sizes of `.nv.shared.<name>` and
// `.nv.local.<name>`. The tests check every number against `cuobjdump --dump-resource-usage`.
// Bytes that are not a 64-bit little-endian CUDA ELF are a UserError("cubin", ...).
std::vector<ResourceUsage> inspect_cubin(const std::vector<uint8_t>& cubin);

// Adds what `--ptxas-options=-v` printed ("N bytes spill stores, M bytes spill loads") to the
// matching kernels; device functions that spill are appended with is_kernel = false, so a spill
// anywhere in the program shows.
void add_ptxas_log_spills(std::vector<ResourceUsage>& usage, const std::string& log);

// SASS text from `nvdisasm` (preferred) or `cuobjdump -sass`, whichever is found first on PATH or
// in /usr/local/cuda/bin. UserError when neither is installed or the tool rejects the CUBIN.
std::string disassemble_cubin(const std::vector<uint8_t>& cubin);

// Runs `tool args... <temp copy of cubin>` (tool looked up like disassemble_cubin's) and returns
// its stdout and stderr; nullopt when the tool is not installed. A non-zero exit is a UserError
// holding the tool's output.
std::optional<std::string> run_cuda_tool_on_cubin(const std::string& tool, const std::vector<std::string>& args,
                                                  const std::vector<uint8_t>& cubin);

}  // namespace attnjit
