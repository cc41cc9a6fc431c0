// Knobs: defaults, every variable parsed, malformed values rejected with the variable's name.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <map>
#include <sstream>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"
#include "compiler/support/progress.hpp"
#include "tests/unit/test_support.hpp"

using attnjit::env_flag;
using attnjit::Knobs;
using attnjit::LogLevel;
using attnjit::UserError;

namespace {

const std::vector<std::string> kAllVariables = {
    "ATTNJIT_CACHE_DIR", "ATTNJIT_DISABLE_CACHE",   "ATTNJIT_ALWAYS_COMPILE",  "ATTNJIT_NO_JIT", "ATTNJIT_DUMP_DIR",
    "ATTNJIT_LOG_LEVEL", "ATTNJIT_CACHE_MAX_BYTES", "ATTNJIT_PRINT_AUTOTUNING", "ATTNJIT_TUNE",  "XDG_CACHE_HOME",
    "HOME", "ATTNJIT_DETERMINISTIC", "ATTNJIT_EMU_CXX", "ATTNJIT_EMU_SEED", "ATTNJIT_EMU_THREADS", "ATTNJIT_EMU_TIMEOUT",
    "ATTNJIT_CPU_SIMD", "ATTNJIT_MAX_WEIGHTS", "ATTNJIT_NVRTC", "ATTNJIT_PLAN_CACHE_BYTES", "ATTNJIT_SM90A", "ATTNJIT_TMA",
    "ATTNJIT_RANDOM_IN_KERNEL", "ATTNJIT_PROGRESS_AFTER", "ATTNJIT_BWD_WGMMA", "ATTNJIT_LAZY_RESCALE", "ATTNJIT_POLY_EXP2",
    "ATTNJIT_PACK_BRANCHES", "ATTNJIT_PERSISTENT"};

// Clears every variable the knobs read and restores the caller's environment afterwards.
class CleanEnvironment {
public:
  CleanEnvironment() {
    for (const std::string& name : kAllVariables) {
      if (const char* v = std::getenv(name.c_str())) saved_[name] = v;
      ::unsetenv(name.c_str());
    }
  }
  ~CleanEnvironment() {
    for (const std::string& name : kAllVariables) {
      auto it = saved_.find(name);
      if (it == saved_.end()) ::unsetenv(name.c_str());
      else ::setenv(name.c_str(), it->second.c_str(), 1);
    }
  }
  void set(const std::string& name, const std::string& value) { ::setenv(name.c_str(), value.c_str(), 1); }

private:
  std::map<std::string, std::string> saved_;
};

// The UserError that from_environment() throws, or nullopt.
std::optional<UserError> parse_error() {
  try {
    Knobs::from_environment();
  } catch (const UserError& e) {
    return e;
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("knobs defaults", "[knobs]") {
  CleanEnvironment env;
  env.set("HOME", "/home/someone");
  const Knobs k = Knobs::from_environment();
  CHECK(k.cache_dir == "/home/someone/.cache/attnjit");
  CHECK_FALSE(k.disable_cache);
  CHECK_FALSE(k.always_compile);
  CHECK_FALSE(k.no_jit);
  CHECK(k.dump_dir.empty());
  CHECK(k.log_level == LogLevel::Warn);
  CHECK(k.cache_max_bytes == (int64_t{1} << 30));
  CHECK_FALSE(k.print_autotuning);
  CHECK_FALSE(k.tune);
  CHECK(k.tma);  // the Hopper forward uses TMA where it can
}

TEST_CASE("knobs default cache dir follows XDG, then HOME, then /tmp", "[knobs]") {
  CleanEnvironment env;
  CHECK(Knobs::from_environment().cache_dir == "/tmp/attnjit-cache");
  env.set("HOME", "/h");
  CHECK(Knobs::from_environment().cache_dir == "/h/.cache/attnjit");
  env.set("XDG_CACHE_HOME", "/xdg");
  CHECK(Knobs::from_environment().cache_dir == "/xdg/attnjit");
  env.set("XDG_CACHE_HOME", "relative/dir");  // invalid per the XDG spec, so ignored
  CHECK(Knobs::from_environment().cache_dir == "/h/.cache/attnjit");
  env.set("ATTNJIT_CACHE_DIR", "/explicit");
  CHECK(Knobs::from_environment().cache_dir == "/explicit");
}

TEST_CASE("knobs parse every variable", "[knobs]") {
  CleanEnvironment env;
  env.set("ATTNJIT_CACHE_DIR", "/c");
  env.set("ATTNJIT_DISABLE_CACHE", "1");
  env.set("ATTNJIT_DUMP_DIR", "/d");
  env.set("ATTNJIT_LOG_LEVEL", "debug");
  env.set("ATTNJIT_CACHE_MAX_BYTES", "12345");
  env.set("ATTNJIT_PRINT_AUTOTUNING", "yes");
  env.set("ATTNJIT_TUNE", "on");
  Knobs k = Knobs::from_environment();
  CHECK(k.cache_dir == "/c");
  CHECK(k.disable_cache);
  CHECK(k.dump_dir == "/d");
  CHECK(k.log_level == LogLevel::Debug);
  CHECK(k.cache_max_bytes == 12345);
  CHECK(k.print_autotuning);
  CHECK(k.tune);

  env.set("ATTNJIT_DISABLE_CACHE", "0");
  env.set("ATTNJIT_ALWAYS_COMPILE", "TRUE");
  k = Knobs::from_environment();
  CHECK_FALSE(k.disable_cache);
  CHECK(k.always_compile);
  CHECK_FALSE(k.no_jit);

  env.set("ATTNJIT_ALWAYS_COMPILE", "off");
  env.set("ATTNJIT_NO_JIT", "1");
  CHECK(Knobs::from_environment().no_jit);

  env.set("ATTNJIT_CACHE_MAX_BYTES", "0");
  CHECK(Knobs::from_environment().cache_max_bytes == 0);

  CHECK(Knobs::from_environment().plan_cache_bytes == int64_t{256} << 20);
  env.set("ATTNJIT_PLAN_CACHE_BYTES", "4096");
  CHECK(Knobs::from_environment().plan_cache_bytes == 4096);
  CHECK(Knobs::from_environment().random_in_kernel_above == int64_t{1} << 26);
  env.set("ATTNJIT_RANDOM_IN_KERNEL", "0");
  CHECK(Knobs::from_environment().random_in_kernel_above == 0);
  env.set("ATTNJIT_TMA", "0");
  CHECK_FALSE(Knobs::from_environment().tma);
  CHECK(Knobs::from_environment().bwd_wgmma);
  env.set("ATTNJIT_BWD_WGMMA", "0");
  CHECK_FALSE(Knobs::from_environment().bwd_wgmma);
  CHECK_FALSE(Knobs::from_environment().persistent);
  env.set("ATTNJIT_PERSISTENT", "1");
  CHECK(Knobs::from_environment().persistent);
  CHECK_FALSE(Knobs::from_environment().lazy_rescale);
  env.set("ATTNJIT_LAZY_RESCALE", "1");
  CHECK(Knobs::from_environment().lazy_rescale);
  CHECK(Knobs::from_environment().pack_branches);
  env.set("ATTNJIT_PACK_BRANCHES", "0");
  CHECK_FALSE(Knobs::from_environment().pack_branches);
  CHECK_FALSE(Knobs::from_environment().poly_exp2);
  env.set("ATTNJIT_POLY_EXP2", "1");
  CHECK(Knobs::from_environment().poly_exp2);
  CHECK(Knobs::from_environment().progress_after_s == 1.0);
  env.set("ATTNJIT_PROGRESS_AFTER", "0");
  CHECK(Knobs::from_environment().progress_after_s == 0.0);
  env.set("ATTNJIT_PROGRESS_AFTER", "2.5");
  CHECK(Knobs::from_environment().progress_after_s == 2.5);
  for (const char* bad : {"-1", "soon", "inf", "nan"}) {
    INFO(bad);
    env.set("ATTNJIT_PROGRESS_AFTER", bad);
    const std::optional<UserError> e = parse_error();
    REQUIRE(e);
    CHECK(e->where() == "ATTNJIT_PROGRESS_AFTER");
  }
}

// Progress lines: none while the work is quick, then at most one a second and a last one.
TEST_CASE("progress prints nothing before its delay, then a line and a last one", "[knobs][progress]") {
  std::ostringstream quiet;
  attnjit::Progress later("counting", quiet, 3600.0);
  for (int n = 0; n < 5000; ++n) later.update(n / 5000.0);
  later.done();
  CHECK(quiet.str().empty());

  std::ostringstream shown;
  attnjit::Progress now("counting", shown, 0.0);
  for (int n = 0; n < 5000; ++n) now.update(n / 5000.0);  // the clock is read every 1024th call
  now.done();
  const std::string out = shown.str();
  CHECK(out.rfind("counting: 0% (0.0 s)\n", 0) == 0);  // the first call prints; the next within a second do not
  CHECK(out.find("counting: done in ") != std::string::npos);
  CHECK(std::count(out.begin(), out.end(), '\n') == 2);
}

TEST_CASE("knobs booleans take every spelling in any case", "[knobs]") {
  CleanEnvironment env;
  for (const char* yes : {"1", "true", "True", "YES", "on", "On"}) {
    env.set("ATTNJIT_TUNE", yes);
    CHECK(Knobs::from_environment().tune);
  }
  for (const char* no : {"0", "false", "FALSE", "no", "off", "OFF"}) {
    env.set("ATTNJIT_TUNE", no);
    CHECK_FALSE(Knobs::from_environment().tune);
  }
  env.set("ATTNJIT_TUNE", "");  // empty counts as unset
  CHECK_FALSE(Knobs::from_environment().tune);
}

TEST_CASE("env_flag reads a variable outside the knobs with their spellings, junk named", "[knobs]") {
  const char* name = "ATTNJIT_ENV_FLAG_UNDER_TEST";
  ::unsetenv(name);
  CHECK(env_flag(name, true));  // unset: the fallback
  CHECK_FALSE(env_flag(name, false));
  ::setenv(name, "", 1);  // empty counts as unset
  CHECK(env_flag(name, true));
  for (const char* yes : {"1", "TRUE", "yes", "On"}) {
    ::setenv(name, yes, 1);
    CHECK(env_flag(name, false));
  }
  for (const char* no : {"0", "False", "NO", "off"}) {
    ::setenv(name, no, 1);
    CHECK_FALSE(env_flag(name, true));
  }
  ::setenv(name, "maybe", 1);
  const std::string e = attnjit::testing::error_of([&] { env_flag(name, false); });
  CHECK(e.find(name) != std::string::npos);
  CHECK(e.find("is not a boolean") != std::string::npos);
  ::unsetenv(name);
}

TEST_CASE("knobs log levels in any case", "[knobs]") {
  CleanEnvironment env;
  const std::pair<const char*, LogLevel> cases[] = {
      {"error", LogLevel::Error}, {"WARN", LogLevel::Warn}, {"Info", LogLevel::Info}, {"debug", LogLevel::Debug}};
  for (const auto& [text, level] : cases) {
    env.set("ATTNJIT_LOG_LEVEL", text);
    CHECK(Knobs::from_environment().log_level == level);
  }
}

TEST_CASE("knobs reject malformed values naming the variable and the valid values", "[knobs]") {
  CleanEnvironment env;
  struct Case {
    const char* name;
    const char* value;
    const char* hint;
  };
  const Case cases[] = {
      {"ATTNJIT_LOG_LEVEL", "loud", "error, warn, info, debug"},
      {"ATTNJIT_LOG_LEVEL", "3", "error, warn, info, debug"},
      {"ATTNJIT_CACHE_MAX_BYTES", "-3", "non-negative number of bytes"},
      {"ATTNJIT_CACHE_MAX_BYTES", "abc", "non-negative number of bytes"},
      {"ATTNJIT_CACHE_MAX_BYTES", "12abc", "non-negative number of bytes"},
      {"ATTNJIT_CACHE_MAX_BYTES", "1.5", "non-negative number of bytes"},
      {"ATTNJIT_CACHE_MAX_BYTES", "99999999999999999999", "too large"},
      {"ATTNJIT_PLAN_CACHE_BYTES", "-1", "non-negative number of bytes"},
      {"ATTNJIT_PLAN_CACHE_BYTES", "lots", "non-negative number of bytes"},
      {"ATTNJIT_RANDOM_IN_KERNEL", "-1", "non-negative number of hashed blocks"},
      {"ATTNJIT_RANDOM_IN_KERNEL", "1e6", "non-negative number of hashed blocks"},
      {"ATTNJIT_DISABLE_CACHE", "maybe", "1/0, true/false, yes/no or on/off"},
      {"ATTNJIT_ALWAYS_COMPILE", "2", "1/0, true/false, yes/no or on/off"},
      {"ATTNJIT_NO_JIT", "y", "1/0, true/false, yes/no or on/off"},
      {"ATTNJIT_TMA", "sometimes", "1/0, true/false, yes/no or on/off"},
      {"ATTNJIT_PRINT_AUTOTUNING", "enabled", "1/0, true/false, yes/no or on/off"},
      {"ATTNJIT_TUNE", " 1", "1/0, true/false, yes/no or on/off"},
  };
  for (const Case& c : cases) {
    INFO(c.name << "=" << c.value);
    env.set(c.name, c.value);
    std::optional<UserError> e = parse_error();
    REQUIRE(e.has_value());
    CHECK(e->where() == c.name);
    CHECK_THAT(e->what(), Catch::Contains(c.name) && Catch::Contains(c.value) && Catch::Contains(c.hint));
    ::unsetenv(c.name);
  }
}

TEST_CASE("knobs reject contradictory settings", "[knobs]") {
  CleanEnvironment env;
  env.set("ATTNJIT_NO_JIT", "1");
  env.set("ATTNJIT_ALWAYS_COMPILE", "1");
  std::optional<UserError> e = parse_error();
  REQUIRE(e.has_value());
  CHECK_THAT(e->what(), Catch::Contains("ATTNJIT_NO_JIT") && Catch::Contains("ATTNJIT_ALWAYS_COMPILE"));

  env.set("ATTNJIT_ALWAYS_COMPILE", "0");
  env.set("ATTNJIT_DISABLE_CACHE", "1");
  e = parse_error();
  REQUIRE(e.has_value());
  CHECK_THAT(e->what(), Catch::Contains("ATTNJIT_NO_JIT") && Catch::Contains("ATTNJIT_DISABLE_CACHE"));
}

TEST_CASE("the shipped tuning databases' folder: compiled in, replaced, or none", "[knobs]") {
  CleanEnvironment env;
  CHECK(Knobs::from_environment().shipped_db_dir == attnjit::default_shipped_db_dir());
  CHECK(attnjit::default_shipped_db_dir() != "none");  // this build compiles in the repository's autotune_db/
  env.set("ATTNJIT_SHIPPED_DB_DIR", "/opt/dbs");
  CHECK(Knobs::from_environment().shipped_db_dir == "/opt/dbs");
  env.set("ATTNJIT_SHIPPED_DB_DIR", "none");
  CHECK(Knobs::from_environment().shipped_db_dir == "none");
}

TEST_CASE("knobs describe lists every knob once as NAME=value", "[knobs]") {
  CleanEnvironment env;
  env.set("ATTNJIT_CACHE_DIR", "/c");
  env.set("ATTNJIT_LOG_LEVEL", "info");
  env.set("ATTNJIT_TUNE", "yes");
  env.set("ATTNJIT_SHIPPED_DB_DIR", "none");
  const std::string text = Knobs::from_environment().describe();
  CHECK(text ==
        "ATTNJIT_CACHE_DIR=/c\n"
        "ATTNJIT_DISABLE_CACHE=0\n"
        "ATTNJIT_ALWAYS_COMPILE=0\n"
        "ATTNJIT_NO_JIT=0\n"
        "ATTNJIT_DUMP_DIR=\n"
        "ATTNJIT_LOG_LEVEL=info\n"
        "ATTNJIT_CACHE_MAX_BYTES=1073741824\n"
        "ATTNJIT_PLAN_CACHE_BYTES=268435456\n"
        "ATTNJIT_RANDOM_IN_KERNEL=67108864\n"
        "ATTNJIT_PRINT_AUTOTUNING=0\n"
        "ATTNJIT_TUNE=1\n"
        "ATTNJIT_SM90A=1\n"
        "ATTNJIT_TMA=1\n"
        "ATTNJIT_BWD_SINGLE_PASS=1\n"
        "ATTNJIT_BWD_WGMMA=1\n"
        "ATTNJIT_KEEP_POOL_MEMORY=0\n"
        "ATTNJIT_LAZY_RESCALE=0\n"
        "ATTNJIT_PACK_BRANCHES=1\n"
        "ATTNJIT_PERSISTENT=0\n"
        "ATTNJIT_POLY_EXP2=0\n"
        "ATTNJIT_DETERMINISTIC=0\n"
        "ATTNJIT_MAX_WEIGHTS=268435456\n"
        "ATTNJIT_SHIPPED_DB_DIR=none\n"
        "ATTNJIT_NVRTC=\n"
        "ATTNJIT_CPU_SIMD=auto\n"
        "ATTNJIT_EMU_CXX=c++\n"
        "ATTNJIT_EMU_SEED=0\n"
        "ATTNJIT_EMU_THREADS=0\n"
        "ATTNJIT_EMU_TIMEOUT=300\n"
        "ATTNJIT_PROGRESS_AFTER=1\n");
}

TEST_CASE("ATTNJIT_CPU_SIMD picks the CPU executor's instruction set, in any case, others are rejected", "[knobs]") {
  CleanEnvironment env;
  CHECK(Knobs::from_environment().cpu_simd == attnjit::CpuSimd::Auto);
  for (const auto& [text, want] : std::vector<std::pair<const char*, attnjit::CpuSimd>>{
           {"generic", attnjit::CpuSimd::Generic}, {"AVX2", attnjit::CpuSimd::Avx2}, {"avx512", attnjit::CpuSimd::Avx512},
           {"Auto", attnjit::CpuSimd::Auto}}) {
    CleanEnvironment one;
    one.set("ATTNJIT_CPU_SIMD", text);
    CHECK(Knobs::from_environment().cpu_simd == want);
  }
  env.set("ATTNJIT_CPU_SIMD", "avx10");
  CHECK_THROWS_WITH(Knobs::from_environment(),
                    Catch::Contains("'avx10' is not an instruction set; use one of auto, generic, avx2, avx512"));
}

TEST_CASE("ATTNJIT_MAX_WEIGHTS caps Attention::weights, zero and junk are rejected", "[knobs]") {
  CleanEnvironment env;
  CHECK(Knobs::from_environment().max_weights == (int64_t{1} << 28));
  env.set("ATTNJIT_MAX_WEIGHTS", "1000");
  CHECK(Knobs::from_environment().max_weights == 1000);
  for (const char* bad : {"0", "-5", "1e9", "lots"}) {
    CleanEnvironment one;
    one.set("ATTNJIT_MAX_WEIGHTS", bad);
    INFO(bad);
    const auto e = parse_error();
    REQUIRE(e.has_value());
    CHECK(e->where() == std::string("ATTNJIT_MAX_WEIGHTS"));
  }
}

TEST_CASE("the emulator's knobs parse, and malformed values name the variable and the fix", "[knobs]") {
  CleanEnvironment env;
  env.set("ATTNJIT_EMU_CXX", "clang++");
  env.set("ATTNJIT_EMU_SEED", "18446744073709551615");
  env.set("ATTNJIT_EMU_THREADS", "3");
  env.set("ATTNJIT_EMU_TIMEOUT", "0.5");
  const Knobs k = Knobs::from_environment();
  CHECK(k.emu_cxx == "clang++");
  CHECK(k.emu_seed == 18446744073709551615ull);
  CHECK(k.emu_threads == 3);
  CHECK(k.emu_timeout_s == 0.5);
  const std::vector<std::tuple<const char*, const char*, const char*>> bad = {
      {"ATTNJIT_EMU_SEED", "-1", "not a non-negative integer"},
      {"ATTNJIT_EMU_SEED", "12x", "not a non-negative integer"},
      {"ATTNJIT_EMU_SEED", "99999999999999999999999", "not a non-negative integer"},
      {"ATTNJIT_EMU_THREADS", "5000", "too large"},
      {"ATTNJIT_EMU_TIMEOUT", "0", "not a positive number of seconds"},
      {"ATTNJIT_EMU_TIMEOUT", "soon", "not a positive number of seconds"},
      {"ATTNJIT_EMU_TIMEOUT", "inf", "not a positive number of seconds"},
  };
  for (const auto& [name, value, why] : bad) {
    CleanEnvironment one;
    one.set(name, value);
    const auto e = parse_error();
    INFO(name << "=" << value);
    REQUIRE(e.has_value());
    CHECK(e->where() == name);
    CHECK_THAT(e->what(), Catch::Contains(why));
  }
}

TEST_CASE("knobs describe round-trips through the environment", "[knobs]") {
  CleanEnvironment env;
  env.set("ATTNJIT_CACHE_DIR", "/c");
  env.set("ATTNJIT_DUMP_DIR", "/d");
  env.set("ATTNJIT_LOG_LEVEL", "error");
  env.set("ATTNJIT_CACHE_MAX_BYTES", "77");
  env.set("ATTNJIT_ALWAYS_COMPILE", "1");
  env.set("ATTNJIT_PRINT_AUTOTUNING", "1");
  const std::string first = Knobs::from_environment().describe();
  // Setting each printed line back as a variable gives the same knobs.
  CleanEnvironment again;
  size_t start = 0;
  while (start < first.size()) {
    const size_t end = first.find('\n', start);
    const std::string line = first.substr(start, end - start);
    const size_t eq = line.find('=');
    again.set(line.substr(0, eq), line.substr(eq + 1));
    start = end + 1;
  }
  CHECK(Knobs::from_environment().describe() == first);
}

TEST_CASE("knobs log filters by level and prefixes the line", "[knobs]") {
  // knobs() is read once per process, so compare against whatever level it holds.
  const LogLevel level = attnjit::knobs().log_level;
  std::FILE* capture = std::tmpfile();
  REQUIRE(capture != nullptr);
  std::fflush(stderr);
  const int saved = ::dup(2);
  ::dup2(::fileno(capture), 2);
  attnjit::log(LogLevel::Error, "first message");
  attnjit::log(LogLevel::Warn, "second message");
  attnjit::log(LogLevel::Debug, "third message");
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::string text;
  std::rewind(capture);
  for (int c; (c = std::fgetc(capture)) != EOF;) text += static_cast<char>(c);
  std::fclose(capture);
  CHECK_THAT(text, Catch::Contains("attnjit: error: first message\n"));
  CHECK((text.find("attnjit: warning: second message\n") != std::string::npos) == (level >= LogLevel::Warn));
  CHECK((text.find("attnjit: debug: third message\n") != std::string::npos) == (level >= LogLevel::Debug));
}
