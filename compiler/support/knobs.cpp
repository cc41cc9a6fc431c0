#include "compiler/support/knobs.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <sstream>

#include "compiler/support/error.hpp"

namespace attnjit {

namespace {

// nullopt when unset or empty: `ATTNJIT_DUMP_DIR= attnjit run ...` is how shells unset a variable.
std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

void parse_bool(const char* name, const std::string& value, bool& out) {
  const std::string v = lower(value);
  if (v == "1" || v == "true" || v == "yes" || v == "on") {
    out = true;
  } else if (v == "0" || v == "false" || v == "no" || v == "off") {
    out = false;
  } else {
    throw UserError(name, "'" + value + "' is not a boolean; use 1/0, true/false, yes/no or on/off");
  }
}

void parse_log_level(const char* name, const std::string& value, LogLevel& out) {
  const std::string v = lower(value);
  for (LogLevel level : {LogLevel::Error, LogLevel::Warn, LogLevel::Info, LogLevel::Debug}) {
    if (v == log_level_name(level)) {
      out = level;
      return;
    }
  }
  throw UserError(name, "'" + value + "' is not a log level; use one of error, warn, info, debug");
}

void parse_cpu_simd(const char* name, const std::string& value, CpuSimd& out) {
  const std::string v = lower(value);
  for (CpuSimd simd : {CpuSimd::Auto, CpuSimd::Generic, CpuSimd::Avx2, CpuSimd::Avx512}) {
    if (v == cpu_simd_name(simd)) {
      out = simd;
      return;
    }
  }
  throw UserError(name, "'" + value + "' is not an instruction set; use one of auto, generic, avx2, avx512");
}

// A non-negative decimal count of `unit` ("bytes"); `example` shows one in the error.
void parse_count(const char* name, const std::string& value, int64_t& out, const std::string& unit, const std::string& example) {
  const std::string hint = "; use a non-negative number of " + unit + ", e.g. " + example;
  if (value.empty() || !std::all_of(value.begin(), value.end(), [](unsigned char c) { return std::isdigit(c); })) {
    throw UserError(name, "'" + value + "' is not a number of " + unit + hint);
  }
  int64_t v = 0;
  for (char c : value) {
    const int digit = c - '0';
    if (v > (INT64_MAX - digit) / 10) throw UserError(name, "'" + value + "' is too large" + hint);
    v = v * 10 + digit;
  }
  out = v;
}

void parse_bytes(const char* name, const std::string& value, int64_t& out) {
  parse_count(name, value, out, "bytes", "1073741824 for 1 GiB");
}

void parse_u64(const char* name, const std::string& value, uint64_t& out) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(value.c_str(), &end, 10);
  if (value.empty() || !std::isdigit(static_cast<unsigned char>(value[0])) || *end != '\0' || errno == ERANGE) {
    throw UserError(name, "'" + value + "' is not a non-negative integer; use e.g. 0 or 12345");
  }
  out = v;
}

// A count of elements, at least 1: its own message, since parse_u64's example (0) is refused here.
void parse_elements(const char* name, const std::string& value, int64_t& out) {
  const std::string error = "'" + value + "' is not a positive number of elements (1 to " + std::to_string(INT64_MAX) +
                            " = 2^63 - 1); use e.g. 268435456 (2^28, the default)";
  uint64_t v = 0;
  try {
    parse_u64(name, value, v);
  } catch (const UserError&) {
    throw UserError(name, error);
  }
  if (v == 0 || v > uint64_t{INT64_MAX}) throw UserError(name, error);
  out = static_cast<int64_t>(v);
}

void parse_count(const char* name, const std::string& value, int& out) {
  uint64_t v = 0;
  parse_u64(name, value, v);
  if (v > 4096) throw UserError(name, "'" + value + "' is too large; use 0 (one per core) up to 4096");
  out = static_cast<int>(v);
}

void parse_seconds(const char* name, const std::string& value, double& out) {
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (*end != '\0' || !(v > 0) || !std::isfinite(v)) {
    throw UserError(name, "'" + value + "' is not a positive number of seconds; use e.g. 300 or 0.5");
  }
  out = v;
}

std::string print_double(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string default_cache_dir() {
  // The XDG base directory spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
  if (auto xdg = env("XDG_CACHE_HOME"); xdg && (*xdg)[0] == '/') return *xdg + "/attnjit";
  if (auto home = env("HOME")) return *home + "/.cache/attnjit";
  return "/tmp/attnjit-cache";
}

// The single table of knobs: name, how to parse it into Knobs, how to print it back.
struct KnobSpec {
  const char* name;
  void (*parse)(const char* name, const std::string& value, Knobs& k);
  std::string (*print)(const Knobs& k);
};

std::string print_bool(bool b) { return b ? "1" : "0"; }

const KnobSpec kKnobs[] = {
    {"ATTNJIT_CACHE_DIR", [](const char*, const std::string& v, Knobs& k) { k.cache_dir = v; },
     [](const Knobs& k) { return k.cache_dir; }},
    {"ATTNJIT_DISABLE_CACHE", [](const char* n, const std::string& v, Knobs& k) { parse_bool(n, v, k.disable_cache); },
     [](const Knobs& k) { return print_bool(k.disable_cache); }},
    {"ATTNJIT_ALWAYS_COMPILE", [](const char* n, const std::string& v, Knobs& k) { parse_bool(n, v, k.always_compile); },
     [](const Knobs& k) { return print_bool(k.always_compile); }},
    {"ATTNJIT_NO_JIT", [](const char* n, const std::string& v, Knobs& k) { parse_bool(n, v, k.no_jit); },
     [](const Knobs& k) { return print_bool(k.no_jit); }},
    {"ATTNJIT_DUMP_DIR", [](const char*, const std::string& v, Knobs& k) { k.dump_dir = v; },
     [](const Knobs& k) { return k.dump_dir; }},
    {"ATTNJIT_LOG_LEVEL", [](const char* n, const std::string& v, Knobs& k) { parse_log_level(n, v, k.log_level); },
     [](const Knobs& k) { return std::string(log_level_name(k.log_level)); }},
    {"ATTNJIT_CACHE_MAX_BYTES", [](const char* n, const std::string& v, Knobs& k) { parse_bytes(n, v, k.cache_max_bytes); },
     [](const Knobs& k) { return std::to_string(k.cache_max_bytes); }},
    {"ATTNJIT_PLAN_CACHE_BYTES", [](const char* n, const std::string& v, Knobs& k) { parse_bytes(n, v, k.plan_cache_bytes); },
     [](const Knobs& k) { return std::to_string(k.plan_cache_bytes); }},
    {"ATTNJIT_RANDOM_IN_KERNEL",
     [](const char* n, const std::string& v, Knobs& k) {
       parse_count(n, v, k.random_in_kernel_above, "hashed blocks", "67108864 (0: always in the kernels)");
     },
     [](const Knobs& k) { return std::to_string(k.random_in_kernel_above); }},
    {"ATTNJIT_PRINT_AUTOTUNING",
     [](const char* n, const std::string& v, Knobs& k) { parse_bool(n, v, k.print_autotuning); },
     [](const Knobs& k) { return print_bool(k.print_autotuning); }},
    {"ATTNJIT_TUNE", [](const char* n, const std::string& v, Knobs& k) { parse_bool(n, v, k.tune); },
     [](const Knobs& k) { return print_bool(k.tune); }},
    {"ATTNJIT_SM90A", [](const char* n, const std::string& v, Knobs& k) { parse_bool(n, v, k.sm90a); },
     [](const Knobs& k) { return print_bool(k.sm90a); }},
    {"ATTNJIT_TMA", [](const char* n, const std::string& v, Knobs& k) { parse_bool(n, v, k.tma); },
     [](const Knobs& k) { return print_bool(k.tma); }},
    {"ATTNJIT_BWD_SINGLE_PASS", [](const char* n, const std::string& v, Knobs& k) { parse_bool(n, v, k.bwd_single_pass); },
     [](const Knobs& k) { return print_bool(k.bwd_single_pass); }},
    {"ATTNJIT_BWD_WGMMA", [](const char* n, const std::string& v, Knobs& k) { parse_bool(n, v, k.bwd_wgmma); },
     [](const Knobs& k) { return print_bool(k.bwd_wgmma); }},
    {"ATTNJIT_KEEP_POOL_MEMORY", [](const char* n, const std::string& v, Knobs& k) { parse_bool(n, v, k.keep_pool_memory); },
     [](const Knobs& k) { return print_bool(k.keep_pool_memory); }},
    {"ATTNJIT_LAZY_RESCALE", [](const char* n, const std::string& v, Knobs& k) { parse_bool(n, v, k.lazy_rescale); },
     [](const Knobs& k) { return print_bool(k.lazy_rescale); }},
    {"ATTNJIT_PACK_BRANCHES", [](const char* n, const std::string& v, Knobs& k) { parse_bool(n, v, k.pack_branches); },
     [](const Knobs& k) { return print_bool(k.pack_branches); }},
    {"ATTNJIT_PERSISTENT", [](const char* n, const std::string& v, Knobs& k) { parse_bool(n, v, k.persistent); },
     [](const Knobs& k) { return print_bool(k.persistent); }},
    {"ATTNJIT_POLY_EXP2", [](const char* n, const std::string& v, Knobs& k) { parse_bool(n, v, k.poly_exp2); },
     [](const Knobs& k) { return print_bool(k.poly_exp2); }},
    {"ATTNJIT_DETERMINISTIC", [](const char* n, const std::string& v, Knobs& k) { parse_bool(n, v, k.deterministic); },
     [](const Knobs& k) { return print_bool(k.deterministic); }},
    {"ATTNJIT_MAX_WEIGHTS", [](const char* n, const std::string& v, Knobs& k) { parse_elements(n, v, k.max_weights); },
     [](const Knobs& k) { return std::to_string(k.max_weights); }},
    {"ATTNJIT_SHIPPED_DB_DIR", [](const char*, const std::string& v, Knobs& k) { k.shipped_db_dir = v; },
     [](const Knobs& k) { return k.shipped_db_dir; }},
    {"ATTNJIT_NVRTC", [](const char*, const std::string& v, Knobs& k) { k.nvrtc = v; },
     [](const Knobs& k) { return k.nvrtc; }},
    {"ATTNJIT_CPU_SIMD", [](const char* n, const std::string& v, Knobs& k) { parse_cpu_simd(n, v, k.cpu_simd); },
     [](const Knobs& k) { return std::string(cpu_simd_name(k.cpu_simd)); }},
    {"ATTNJIT_EMU_CXX", [](const char*, const std::string& v, Knobs& k) { k.emu_cxx = v; },
     [](const Knobs& k) { return k.emu_cxx; }},
    {"ATTNJIT_EMU_SEED", [](const char* n, const std::string& v, Knobs& k) { parse_u64(n, v, k.emu_seed); },
     [](const Knobs& k) { return std::to_string(k.emu_seed); }},
    {"ATTNJIT_EMU_THREADS", [](const char* n, const std::string& v, Knobs& k) { parse_count(n, v, k.emu_threads); },
     [](const Knobs& k) { return std::to_string(k.emu_threads); }},
    {"ATTNJIT_EMU_TIMEOUT", [](const char* n, const std::string& v, Knobs& k) { parse_seconds(n, v, k.emu_timeout_s); },
     [](const Knobs& k) { return print_double(k.emu_timeout_s); }},
    {"ATTNJIT_PROGRESS_AFTER",
     [](const char* n, const std::string& v, Knobs& k) {
       char* end = nullptr;
       const double s = std::strtod(v.c_str(), &end);
       if (*end != '\0' || !(s >= 0) || !std::isfinite(s))
         throw UserError(n, "'" + v + "' is not a number of seconds >= 0; use e.g. 1 (0: progress at once)");
       k.progress_after_s = s;
     },
     [](const Knobs& k) { return print_double(k.progress_after_s); }},
};

}  // namespace

bool env_flag(const char* name, bool fallback) {
  bool out = fallback;
  if (const auto v = env(name)) parse_bool(name, *v, out);
  return out;
}

const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::Error: return "error";
    case LogLevel::Warn: return "warn";
    case LogLevel::Info: return "info";
    case LogLevel::Debug: return "debug";
  }
  internal_error(__FILE__, __LINE__, "unknown LogLevel");
}

const char* cpu_simd_name(CpuSimd simd) {
  switch (simd) {
    case CpuSimd::Auto: return "auto";
    case CpuSimd::Generic: return "generic";
    case CpuSimd::Avx2: return "avx2";
    case CpuSimd::Avx512: return "avx512";
  }
  internal_error(__FILE__, __LINE__, "unknown CpuSimd");
}

Knobs Knobs::from_environment() {
  Knobs k;
  k.cache_dir = default_cache_dir();
  for (const KnobSpec& spec : kKnobs) {
    if (auto value = env(spec.name)) spec.parse(spec.name, *value, k);
  }
  // Without JIT every kernel must come from the disk cache; these settings make that impossible.
  if (k.no_jit && k.always_compile) {
    throw UserError("ATTNJIT_NO_JIT",
                    "ATTNJIT_NO_JIT=1 forbids compiling but ATTNJIT_ALWAYS_COMPILE=1 compiles every kernel; unset one");
  }
  if (k.no_jit && k.disable_cache) {
    throw UserError("ATTNJIT_NO_JIT",
                    "ATTNJIT_NO_JIT=1 loads kernels only from the disk cache but ATTNJIT_DISABLE_CACHE=1 turns it off; "
                    "unset one");
  }
  return k;
}

std::string Knobs::describe() const {
  std::ostringstream os;
  for (const KnobSpec& spec : kKnobs) os << spec.name << "=" << spec.print(*this) << "\n";
  return os.str();
}

const Knobs& knobs() {
  // If from_environment() throws, the static stays uninitialized and the next call tries again.
  static const Knobs k = Knobs::from_environment();
  return k;
}

void log(LogLevel level, const std::string& message) {
  LogLevel threshold = Knobs{}.log_level;
  try {
    threshold = knobs().log_level;
  } catch (const UserError&) {
    // The malformed variable is reported where knobs() is first used for real; a warning must not throw.
  }
  if (level > threshold) return;
  const char* tag = level == LogLevel::Warn ? "warning" : log_level_name(level);
  // One fwrite per line under a lock, so lines from different threads never interleave.
  const std::string line = std::string("attnjit: ") + tag + ": " + message + "\n";
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace attnjit
