#include "compiler/nvrtc/nvrtc_compiler.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <shared_mutex>
#include <sstream>
#include <thread>

#include "compiler/nvrtc/nvrtc_library.hpp"
#include "compiler/support/error.hpp"

namespace attnjit {

namespace {

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

std::string format_seconds(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

// sm_80 -> 80, sm_90a -> 90; nullopt when `arch` is not sm_<digits>[a|f].
std::optional<int> arch_number(const std::string& arch) {
  static const std::regex re(R"(sm_(\d{2,3})[af]?)");
  std::smatch m;
  if (!std::regex_match(arch, m, re)) return std::nullopt;
  return std::stoi(m[1]);
}

// Line numbers that an NVRTC log names for this program: "<name>.cu(12): error: ...".
std::vector<int> lines_named_in_log(const std::string& log, const std::string& file) {
  std::vector<int> lines;
  size_t pos = 0;
  const std::string key = file + "(";
  while ((pos = log.find(key, pos)) != std::string::npos) {
    pos += key.size();
    const size_t end = log.find(')', pos);
    if (end == std::string::npos) break;
    const std::string digits = log.substr(pos, end - pos);
    if (!digits.empty() && digits.size() < 9 && std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      lines.push_back(std::stoi(digits));
  }
  return lines;
}

std::string compile_error_text(const std::string& name, const std::string& arch, const std::string& reason,
                               const std::vector<std::string>& options, const std::string& log,
                               const std::string& source) {
  std::ostringstream os;
  os << "NVRTC failed to compile " << name << " for " << arch;
  if (!reason.empty()) os << ": " << reason;
  os << "\noptions: " << join(options, " ") << "\nNVRTC log:\n";
  std::istringstream log_lines(log);
  std::string line;
  bool any = false;
  while (std::getline(log_lines, line)) {
    if (line.empty()) continue;
    os << "  " << line << "\n";
    any = true;
  }
  if (!any) os << "  (empty)\n";
  const size_t line_count = static_cast<size_t>(std::count(source.begin(), source.end(), '\n')) +
                            (!source.empty() && source.back() != '\n' ? 1 : 0);
  os << "source " << name << ".cu (" << line_count << " lines):\n"
     << numbered_source(source, lines_named_in_log(log, name + ".cu"));
  return os.str();
}

// Built-in options first, in a fixed order; then the caller's, sorted and deduplicated.
std::vector<std::string> build_options(const CompileRequest& r, CompileTarget target) {
  if (!arch_number(r.arch)) {
    throw UserError("arch", "'" + r.arch + "' is not a GPU architecture name; use sm_XX, e.g. sm_80 or sm_90a");
  }
  std::vector<std::string> caller = r.options;
  for (size_t i = 0; i < caller.size(); ++i) {
    const std::string& o = caller[i];
    const std::string where = "options[" + std::to_string(i) + "]";
    if (o.empty() || o[0] != '-') {
      throw UserError(where, "'" + o + "' is not an option; give each option as one token starting with '-' "
                                       "(e.g. -DNAME=1, -Idir, --maxrregcount=64)");
    }
    if (o.rfind("-arch", 0) == 0 || o.rfind("--gpu-architecture", 0) == 0) {
      throw UserError(where, "'" + o + "' sets the architecture; set CompileRequest::arch instead");
    }
  }
  std::sort(caller.begin(), caller.end());
  caller.erase(std::unique(caller.begin(), caller.end()), caller.end());
  const bool caller_std = std::any_of(caller.begin(), caller.end(), [](const std::string& o) {
    return o.rfind("-std=", 0) == 0 || o.rfind("--std=", 0) == 0;
  });
  const std::string virtual_arch = "compute_" + r.arch.substr(3);
  std::vector<std::string> out{"--gpu-architecture=" + (target == CompileTarget::Cubin ? r.arch : virtual_arch)};
  if (!caller_std) out.push_back("-std=c++17");
  out.push_back("-default-device");
  if (target == CompileTarget::Cubin) out.push_back("--ptxas-options=-v");
  out.insert(out.end(), caller.begin(), caller.end());
  return out;
}

// What one NVRTC run produced; ok == false means NVRTC rejected the program (the log says why).
struct RawCompile {
  bool ok = false;
  std::string log;
  std::vector<uint8_t> output;  // CUBIN bytes or PTX text
};

// Compiles and children are forked only while no thread of this process is inside NVRTC: a child
// forked mid-compile would inherit NVRTC's locks held by a thread that does not exist in it.
std::shared_mutex& nvrtc_fork_lock() {
  static std::shared_mutex mu;
  return mu;
}

RawCompile run_nvrtc_unlocked(const NvrtcLibrary& lib, const CompileRequest& r, const std::vector<std::string>& options,
                              CompileTarget target) {
  const NvrtcApi& api = lib.api;
  auto check = [&](int result, const char* call) {
    ATTNJIT_CHECK(result == 0, std::string(call) + " failed (NVRTC " + lib.version + " at " + lib.path +
                                   "): " + api.get_error_string(result));
  };
  NvrtcApi::Program prog = nullptr;
  const std::string file = r.name + ".cu";
  check(api.create_program(&prog, r.source.c_str(), file.c_str(), 0, nullptr, nullptr), "nvrtcCreateProgram");
  struct Destroy {
    const NvrtcApi& api;
    NvrtcApi::Program* p;
    ~Destroy() { api.destroy_program(p); }
  } destroy{api, &prog};
  std::vector<const char*> argv;
  for (const std::string& o : options) argv.push_back(o.c_str());
  const int status = api.compile_program(prog, static_cast<int>(argv.size()), argv.data());
  RawCompile out;
  size_t size = 0;
  check(api.get_program_log_size(prog, &size), "nvrtcGetProgramLogSize");
  out.log.assign(size, '\0');
  check(api.get_program_log(prog, out.log.data()), "nvrtcGetProgramLog");
  if (!out.log.empty() && out.log.back() == '\0') out.log.pop_back();
  if (status != 0) {
    // Rejected options come back as NVRTC_ERROR_INVALID_OPTION with the reason in the log.
    if (out.log.empty()) out.log = std::string("nvrtc: ") + api.get_error_string(status);
    return out;
  }
  if (target == CompileTarget::Cubin) {
    check(api.get_cubin_size(prog, &size), "nvrtcGetCUBINSize");
    out.output.resize(size);
    check(api.get_cubin(prog, reinterpret_cast<char*>(out.output.data())), "nvrtcGetCUBIN");
  } else {
    check(api.get_ptx_size(prog, &size), "nvrtcGetPTXSize");
    out.output.resize(size);
    check(api.get_ptx(prog, reinterpret_cast<char*>(out.output.data())), "nvrtcGetPTX");
    if (!out.output.empty() && out.output.back() == 0) out.output.pop_back();
  }
  out.ok = true;
  return out;
}

RawCompile run_nvrtc(const NvrtcLibrary& lib, const CompileRequest& r, const std::vector<std::string>& options,
                     CompileTarget target) {
  std::shared_lock<std::shared_mutex> lock(nvrtc_fork_lock());
  return run_nvrtc_unlocked(lib, r, options, target);
}

// The child's message on the pipe: u64 total length, u8 kind (0 compiled, 1 rejected, 2 an
// exception), u64 + log, u64 + output. The length prefix means the parent never waits for EOF,
// which a sibling child that inherited this pipe's write end could hold back.
void put_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }

uint64_t get_u64(const std::string& s, size_t& pos) {
  ATTNJIT_CHECK(pos + 8 <= s.size(), "truncated message from the NVRTC child process");
  uint64_t v = 0;
  std::memcpy(&v, s.data() + pos, 8);
  pos += 8;
  return v;
}

[[noreturn]] void child_main(int fd, const NvrtcLibrary& lib, const CompileRequest& r, const std::vector<std::string>& options,
                             CompileTarget target) {
  std::string body;
  try {
    RawCompile c = run_nvrtc_unlocked(lib, r, options, target);
    body.push_back(c.ok ? 0 : 1);
    put_u64(body, c.log.size());
    body += c.log;
    put_u64(body, c.output.size());
    body.append(reinterpret_cast<const char*>(c.output.data()), c.output.size());
  } catch (const std::exception& e) {
    body.assign(1, 2);
    put_u64(body, std::strlen(e.what()));
    body += e.what();
    put_u64(body, 0);
  }
  std::string msg;
  put_u64(msg, body.size());
  msg += body;
  size_t done = 0;
  while (done < msg.size()) {
    const ssize_t n = ::write(fd, msg.data() + done, msg.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  _exit(0);  // no atexit handlers or static destructors: they belong to the parent
}

RawCompile run_nvrtc_with_timeout(const NvrtcLibrary& lib, const CompileRequest& r, const std::vector<std::string>& options,
                                  CompileTarget target) {
  int fds[2];
  if (pipe(fds) != 0) throw UserError("timeout_seconds", std::string("cannot create a pipe: ") + std::strerror(errno));
  pid_t pid = 0;
  {
    std::unique_lock<std::shared_mutex> lock(nvrtc_fork_lock());
    pid = fork();
  }
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw UserError("timeout_seconds", std::string("cannot fork the compile process: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::close(fds[0]);
    child_main(fds[1], lib, r, options, target);
  }
  ::close(fds[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(r.timeout_seconds);
  std::string msg;
  std::optional<uint64_t> expected;
  bool eof = false, timed_out = false;
  char buf[65536];
  while (!eof && !(expected && msg.size() >= *expected + 8)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;  // the deadline check above decides
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      eof = true;
      break;
    }
    msg.append(buf, static_cast<size_t>(n));
    if (!expected && msg.size() >= 8) {
      size_t pos = 0;
      expected = get_u64(msg, pos);
    }
  }
  ::close(fds[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    throw CompileError(r.name, r.arch,
                       "timed out after " + format_seconds(r.timeout_seconds) + " s (the compile process was killed)",
                       options, "", r.source);
  }
  if (!expected || msg.size() < *expected + 8) {
    const std::string how = WIFSIGNALED(status) ? "was killed by signal " + std::to_string(WTERMSIG(status))
                                                : "exited with status " + std::to_string(WEXITSTATUS(status));
    throw CompileError(r.name, r.arch, "the compile process " + how + " before it finished", options, "", r.source);
  }
  size_t pos = 8;
  const uint8_t kind = static_cast<uint8_t>(msg[pos++]);
  RawCompile out;
  const uint64_t log_size = get_u64(msg, pos);
  out.log = msg.substr(pos, log_size);
  pos += log_size;
  const uint64_t output_size = get_u64(msg, pos);
  ATTNJIT_CHECK(pos + output_size <= msg.size(), "truncated output from the NVRTC child process");
  out.output.assign(msg.begin() + static_cast<std::ptrdiff_t>(pos), msg.begin() + static_cast<std::ptrdiff_t>(pos + output_size));
  if (kind == 2) throw std::runtime_error("in the compile process: " + out.log);
  out.ok = kind == 0;
  return out;
}

// The NVRTC that compiles for `arch`, or a UserError that says what was found and how to get one.
NvrtcLibrary nvrtc_for(const std::string& arch) {
  if (std::optional<NvrtcLibrary> lib = nvrtc_for_arch(*arch_number(arch))) return std::move(*lib);
  const NvrtcSearch search = nvrtc_search();
  std::string why = "no NVRTC found here compiles for " + arch;
  if (!search.found.empty() && *arch_number(arch) < 75) {
    why += " (CUDA 13 dropped sm_50 to sm_72; CUDA 12's NVRTC still targets them: "
           "`pip install nvidia-cuda-nvrtc-cu12`)";
  }
  throw UserError("arch", why + "\n" + describe_nvrtc_search(search));
}

// Compiles (in process, or in a child when there is a timeout) and throws CompileError on failure.
RawCompile compile_or_throw(const CompileRequest& r, const std::vector<std::string>& options, CompileTarget target,
                            std::string* version = nullptr) {
  if (r.name.empty()) throw UserError("name", "a compile request needs a program name (e.g. attnjit_fwd_ab12cd)");
  if (!(r.timeout_seconds >= 0) || !std::isfinite(r.timeout_seconds)) {
    throw UserError("timeout_seconds", "must be a finite number of seconds >= 0 (0: no timeout)");
  }
  const NvrtcLibrary lib = nvrtc_for(r.arch);
  if (version) *version = lib.version;
  RawCompile c = r.timeout_seconds > 0 ? run_nvrtc_with_timeout(lib, r, options, target) : run_nvrtc(lib, r, options, target);
  const std::string arch = target == CompileTarget::Cubin ? r.arch : "compute_" + r.arch.substr(3);
  if (!c.ok) throw CompileError(r.name, arch, "", options, c.log, r.source);
  return c;
}

}  // namespace

std::string numbered_source(const std::string& source, const std::vector<int>& marked) {
  std::vector<std::string> lines;
  std::istringstream in(source);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  const int width = static_cast<int>(std::to_string(std::max<size_t>(lines.size(), 1)).size());
  const std::set<int> marks(marked.begin(), marked.end());
  std::ostringstream os;
  for (size_t i = 0; i < lines.size(); ++i) {
    const int n = static_cast<int>(i + 1);
    os << (marks.count(n) ? "> " : "  ") << std::setw(width) << n << " | " << lines[i] << "\n";
  }
  return os.str();
}

CompileError::CompileError(std::string name, std::string arch, std::string reason, std::vector<std::string> options,
                           std::string log, std::string source)
    : std::runtime_error(compile_error_text(name, arch, reason, options, log, source)),
      name_(std::move(name)),
      arch_(std::move(arch)),
      reason_(std::move(reason)),
      options_(std::move(options)),
      log_(std::move(log)),
      source_(std::move(source)) {}

std::vector<std::string> canonical_options(const CompileRequest& request, CompileTarget target) {
  return build_options(request, target);
}

CompileResult compile_cubin(const CompileRequest& request) {
  CompileResult result;
  result.options = canonical_options(request, CompileTarget::Cubin);
  const auto start = std::chrono::steady_clock::now();
  RawCompile c = compile_or_throw(request, result.options, CompileTarget::Cubin, &result.nvrtc_version);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.cubin = std::move(c.output);
  result.log = std::move(c.log);
  result.usage = inspect_cubin(result.cubin);
  add_ptxas_log_spills(result.usage, result.log);
  return result;
}

std::string compile_ptx(const CompileRequest& request) {
  const std::vector<std::string> options = canonical_options(request, CompileTarget::Ptx);
  RawCompile c = compile_or_throw(request, options, CompileTarget::Ptx);
  return std::string(c.output.begin(), c.output.end());
}

std::vector<CompileOutcome> compile_many(const std::vector<CompileRequest>& requests, int jobs,
                                         std::function<void(size_t done, size_t total)> progress,
                                         std::function<void(size_t index, const CompileOutcome& result)> finished) {
  std::vector<CompileOutcome> results(requests.size());
  if (jobs <= 0) jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const size_t workers = std::min(requests.size(), static_cast<size_t>(jobs));
  std::atomic<size_t> next{0};
  std::mutex progress_mu;
  size_t done = 0;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < requests.size();) {
      try {
        results[i] = compile_cubin(requests[i]);
      } catch (const std::exception& e) {
        results[i] = std::string(e.what());
      }
      if (finished) finished(i, results[i]);
      std::lock_guard<std::mutex> lock(progress_mu);
      ++done;
      if (progress) progress(done, requests.size());
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < workers; ++t) threads.emplace_back(work);
  work();  // the calling thread is one of the workers
  for (std::thread& t : threads) t.join();
  return results;
}

bool nvrtc_available() { return !nvrtc_search().found.empty(); }

std::string nvrtc_version() {
  const NvrtcSearch search = nvrtc_search();
  if (search.found.empty()) throw UserError("nvrtc", "attnjit cannot compile kernels: " + describe_nvrtc_search(search));
  return search.found.front().version;
}

std::string nvrtc_version_for(const std::string& arch) {
  const std::optional<int> number = arch_number(arch);
  if (!number) throw UserError("arch", "'" + arch + "' is not a GPU architecture name; use sm_XX, e.g. sm_80 or sm_90a");
  const std::optional<NvrtcLibrary> lib = nvrtc_for_arch(*number);
  return lib ? lib->version : "";
}

std::vector<std::string> supported_archs() {
  const NvrtcSearch search = nvrtc_search();
  if (search.found.empty()) throw UserError("nvrtc", "attnjit cannot compile kernels: " + describe_nvrtc_search(search));
  std::set<int> numbers;
  for (const NvrtcLibrary& lib : search.found) numbers.insert(lib.archs.begin(), lib.archs.end());
  std::vector<std::string> out;
  for (int n : numbers) out.push_back("sm_" + std::to_string(n));
  return out;
}

}  // namespace attnjit
