// NVRTC straight to CUBIN for the exact arch (docs/architecture.md, "Compile and cache"), by the
// newest NVRTC found that targets it (nvrtc_library.hpp). A failed compile shows everything a
// person needs to find the bug: the generated source with line numbers, the NVRTC log and the
// exact options. No GPU is needed to compile.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "compiler/nvrtc/cubin_info.hpp"

namespace attnjit {

struct CompileRequest {
  std::string name;                  // program name, e.g. "attnjit_fwd_ab12cd"; the log calls the source <name>.cu
  std::string source;                // complete, self-contained CUDA source
  std::string arch;                  // "sm_80", "sm_90a", ...: see supported_archs()
  std::vector<std::string> options;  // extra options, one token each: "-DFOO=1", "--use_fast_math", "--maxrregcount=64"
  double timeout_seconds = 0;        // 0: compile in this process, no timeout
};

enum class CompileTarget { Cubin, Ptx };

// The exact option list passed to NVRTC, deterministic for a request (it goes into cache keys):
//   --gpu-architecture=sm_XX (compute_XX for Ptx), -std=c++17 (unless the caller gives -std=...),
//   -default-device, --ptxas-options=-v (Cubin only: the log then reports spills),
//   then the caller's options sorted and deduplicated.
// UserError for a malformed arch, an empty option, an option that does not start with '-' (a
// two-token form such as "-I" "dir"), or an option that sets the architecture.
std::vector<std::string> canonical_options(const CompileRequest& request, CompileTarget target = CompileTarget::Cubin);

struct CompileResult {
  std::vector<uint8_t> cubin;
  std::string ptx_or_empty;  // always empty: NVRTC compiling for sm_XX goes straight to SASS, no PTX is kept
  std::string log;           // NVRTC's log: warnings and the ptxas resource report
  double seconds = 0;        // wall time of the compile
  std::vector<std::string> options;  // canonical_options(request)
  std::vector<ResourceUsage> usage;  // inspect_cubin(cubin) plus the spills ptxas reported
  std::string nvrtc_version;         // of the NVRTC that compiled it, "12.9"
};

// Thrown when NVRTC rejects the program or runs out of time. what() holds, in this order:
//   NVRTC failed to compile <name> for <arch>[: timed out after N s ...]
//   options: <the options, space-separated>
//   NVRTC log: <the log, indented>
//   source <name>.cu (N lines): every line as "  12 | text", lines the log names marked "> 12 | text"
class CompileError : public std::runtime_error {
public:
  CompileError(std::string name, std::string arch, std::string reason, std::vector<std::string> options,
               std::string log, std::string source);
  const std::string& name() const { return name_; }
  const std::string& arch() const { return arch_; }
  const std::string& reason() const { return reason_; }  // "" for a compile error, else e.g. "timed out after 5 s"
  const std::vector<std::string>& options() const { return options_; }
  const std::string& log() const { return log_; }
  const std::string& source() const { return source_; }
  bool timed_out() const { return reason_.rfind("timed out", 0) == 0; }

private:
  std::string name_, arch_, reason_;
  std::vector<std::string> options_;
  std::string log_, source_;
};

// The source with right-aligned line numbers ("   7 | text"); the lines in `marked` get "> "
// instead of two leading spaces.
std::string numbered_source(const std::string& source, const std::vector<int>& marked = {});

// NVRTC to CUBIN. With timeout_seconds > 0 the compile runs in a fork()ed child (NVRTC cannot be
// interrupted) that is killed when time runs out: CompileError whose reason says "timed out".
// UserError when no NVRTC found targets the arch (the message lists what was found and how to
// get one).
CompileResult compile_cubin(const CompileRequest& request);

// The same program as PTX for the virtual arch (sm_80 -> compute_80); same errors as compile_cubin.
std::string compile_ptx(const CompileRequest& request);

// Compiles every request on `jobs` threads (jobs <= 0: one per hardware thread). A failure becomes
// its error text and never stops the others; results are in request order. `finished` is called
// as each request finishes, on the thread that compiled it (so possibly on several at once), with
// its index and result; then `progress`, from one thread at a time, with (finished so far, total).
using CompileOutcome = std::variant<CompileResult, std::string>;
std::vector<CompileOutcome> compile_many(const std::vector<CompileRequest>& requests, int jobs,
                                         std::function<void(size_t done, size_t total)> progress = {},
                                         std::function<void(size_t index, const CompileOutcome& result)> finished = {});

bool nvrtc_available();                      // some NVRTC was found
std::string nvrtc_version();                 // the newest found, "13.0"; UserError without any
std::string nvrtc_version_for(const std::string& arch);  // the one that compiles `arch`; "" when none does
std::vector<std::string> supported_archs();  // "sm_50", ..., "sm_121": every arch some NVRTC found targets; UserError without any

}  // namespace attnjit
