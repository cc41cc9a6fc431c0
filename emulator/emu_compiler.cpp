#include "emulator/emu_compiler.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "compiler/support/sha256.hpp"
#include "compiler/codegen/templates.hpp"
#include "compiler/nvrtc/nvrtc_compiler.hpp"
#include "compiler/support/error.hpp"

namespace attnjit {
const std::vector<TemplateFile>& embedded_emulator_files();  // generated from emulator/ by embed.cmake
}

namespace attnjit::emu {
namespace {

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs a shell command; returns its exit status and what it printed (stdout and stderr).
int run_command(const std::string& command, std::string& output) {
  output.clear();
  FILE* f = popen((command + " 2>&1").c_str(), "r");
  if (!f) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) output.append(buf, n);
  const int status = pclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string find_executable(const std::string& name) {
  if (name.find('/') != std::string::npos) return access(name.c_str(), X_OK) == 0 ? name : "";
  std::string out;
  if (run_command("command -v " + quote(name), out) != 0) return "";
  out.erase(out.find_last_not_of("\n\r ") + 1);
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

const std::string& embedded(const std::string& name) {
  for (const TemplateFile& f : embedded_emulator_files())
    if (f.name == name) return f.text;
  ATTNJIT_CHECK(false, "emulator file " + name + " is not embedded");
}

// Line numbers of <file>:<line>: in a GCC or Clang log.
std::vector<int> lines_in_log(const std::string& log, const std::string& file) {
  std::vector<int> lines;
  const std::string key = file + ":";
  for (size_t pos = 0; (pos = log.find(key, pos)) != std::string::npos;) {
    pos += key.size();
    size_t end = pos;
    while (end < log.size() && std::isdigit(static_cast<unsigned char>(log[end]))) ++end;
    if (end > pos && end - pos < 9 && end < log.size() && log[end] == ':') lines.push_back(std::stoi(log.substr(pos, end - pos)));
  }
  std::sort(lines.begin(), lines.end());
  lines.erase(std::unique(lines.begin(), lines.end()), lines.end());
  return lines;
}

constexpr const char* kArchPrefix = "emu-";  // an emulator kernel's arch in its cache key and entry

}  // namespace

std::string shared_object_problem(const std::vector<uint8_t>& bytes) {
  if (bytes.empty()) return "an empty file";
  ElfW(Ehdr) h;
  if (bytes.size() < sizeof h) return std::to_string(bytes.size()) + " bytes, fewer than an ELF header";
  std::memcpy(&h, bytes.data(), sizeof h);
  if (std::memcmp(h.e_ident, ELFMAG, SELFMAG) != 0) return "not an ELF file (the magic \\x7fELF is missing)";
  const unsigned char elf_class = sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32;
  const unsigned char elf_data = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB;
  if (h.e_ident[EI_CLASS] != elf_class || h.e_ident[EI_DATA] != elf_data) {
    return "an ELF file of another word size or byte order than this machine's";
  }
  if (h.e_type != ET_DYN) return "an ELF file but not a shared object (type " + std::to_string(h.e_type) + ")";
#if defined(__x86_64__)
  if (h.e_machine != EM_X86_64) return "a shared object for another machine (e_machine " + std::to_string(h.e_machine) + ")";
#elif defined(__aarch64__)
  if (h.e_machine != EM_AARCH64) return "a shared object for another machine (e_machine " + std::to_string(h.e_machine) + ")";
#endif
  const uint64_t size = bytes.size();
  if (h.e_phnum == 0 || h.e_phentsize != sizeof(ElfW(Phdr)) || h.e_phoff > size ||
      uint64_t{h.e_phnum} * sizeof(ElfW(Phdr)) > size - h.e_phoff) {
    return "truncated or corrupt: its program headers are missing or lie past the end of the file";
  }
  for (unsigned n = 0; n < h.e_phnum; ++n) {
    ElfW(Phdr) ph;
    std::memcpy(&ph, bytes.data() + h.e_phoff + n * sizeof ph, sizeof ph);
    if (ph.p_type == PT_LOAD && (ph.p_offset > size || ph.p_filesz > size - ph.p_offset)) {
      return "truncated: a loadable segment ends past the file's " + std::to_string(size) + " bytes";
    }
  }
  return "";
}

std::string emulator_entry_problem(const std::string& arch, const std::vector<uint8_t>& payload) {
  if (arch.compare(0, std::strlen(kArchPrefix), kArchPrefix) != 0) return "";
  const std::string why = shared_object_problem(payload);
  return why.empty() ? "" : "holds no emulator kernel object: " + why;
}

EmuSource emu_source_of(const KernelSource& k) { return EmuSource{k.name, k.source, k.arch, k.template_hash, {}}; }

const HostCompiler& host_compiler(const Knobs& k) {
  static std::mutex m;
  static std::map<std::string, HostCompiler> found;
  std::lock_guard<std::mutex> lock(m);
  if (auto it = found.find(k.emu_cxx); it != found.end()) return it->second;
  HostCompiler c;
  c.path = find_executable(k.emu_cxx);
  if (c.path.empty()) {
    throw UserError("ATTNJIT_EMU_CXX", "the emulator compiles kernels with a host C++ compiler, and '" + k.emu_cxx +
                                           "' was not found; install one (Debian: apt-get install g++) or point "
                                           "ATTNJIT_EMU_CXX at g++ or clang++");
  }
  std::string out;
  if (run_command(quote(c.path) + " --version", out) != 0) {
    throw UserError("ATTNJIT_EMU_CXX", "'" + c.path + " --version' failed; the emulator needs g++ or clang++:\n" + out);
  }
  c.version = out.substr(0, out.find('\n'));
  const bool clang = c.version.find("clang") != std::string::npos;
  // -fsanitize=thread instruments every load and store; the prelude routes the hooks to the
  // emulator's checks. -ffp-contract=fast (+ FMA) contracts a*b+c as NVRTC's default --fmad=true does.
  c.compile_flags = {"-std=c++17", "-O2", "-g1", "-fPIC", "-fsanitize=thread", "-fno-strict-aliasing",
                     "-ffp-contract=fast", "-fno-math-errno", "-w"};
  if (!clang) c.compile_flags.push_back("--param=tsan-instrument-func-entry-exit=0");
#if defined(__x86_64__)
  if (__builtin_cpu_supports("fma")) c.compile_flags.push_back("-mfma");
#endif
  return found.emplace(k.emu_cxx, std::move(c)).first->second;
}

std::string emulation_unit(const EmuSource& s) {
  std::ostringstream os;
  os << embedded("emu_abi.h") << "\n" << embedded("prelude.h") << "\n#line 1 \"" << s.name << ".cu\"\n" << s.source;
  if (!s.source.empty() && s.source.back() != '\n') os << "\n";
  os << "#line 1 \"attnjit_emulator_entry\"\n";
  for (const std::string& k : s.kernels.empty() ? std::vector<std::string>{s.name} : s.kernels) {
    os << "extern \"C\" __attribute__((visibility(\"default\"), no_sanitize_thread)) void aj_emu_entry_" << k
       << "(void** args) {\n  aj_emu_call(&" << k << ", args);\n}\n";
  }
  return os.str();
}

std::shared_ptr<const EmuBinary> compile_for_emulator(const EmuSource& s, KernelCache& cache, const Knobs& k) {
  const HostCompiler& cxx = host_compiler(k);
  const std::string unit = emulation_unit(s);
  CacheKeyParts parts;
  parts.attnjit_version = ATTNJIT_VERSION;
  parts.template_hash = s.template_hash;
  parts.source_hash = sha256_hex(unit);  // the kernel text and the prelude
  parts.options = join(cxx.compile_flags);
  parts.nvrtc_version = "host compiler: " + cxx.version;
  parts.arch = kArchPrefix + s.arch;
  const CacheKey key = make_cache_key(parts);

  static std::mutex m;
  static std::map<std::string, std::shared_ptr<const EmuBinary>> loaded;
  {
    std::lock_guard<std::mutex> lock(m);
    if (auto it = loaded.find(key.hex); it != loaded.end()) return it->second;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto out = std::make_shared<EmuBinary>();
  out->name = s.name;
  out->arch = parts.arch;
  out->key = key;
  std::optional<std::vector<uint8_t>> bin = k.always_compile ? std::nullopt : cache.get(key);
  if (bin) {
    // Checksums say the entry is what was stored; this says what was stored is an object at all.
    if (const std::string why = shared_object_problem(*bin); !why.empty()) {
      log(LogLevel::Warn, "kernel cache entry " + cache.dir() + "/" + key.hex + ".ajk holds no emulator kernel object (" +
                              why + "); compiling " + s.name + " again");
      bin.reset();
    }
  }
  if (bin) {
    out->shared_object = std::move(*bin);
    out->cache_hit = true;
  } else {
    if (k.no_jit) {
      throw UserError("ATTNJIT_NO_JIT", "the emulator kernel " + s.name + " (" + parts.arch + ", key " + key.hex +
                                            ") is not in the cache at " + cache.dir() + " and JIT is off; unset ATTNJIT_NO_JIT");
    }
    char tmpl[] = "/tmp/attnjit-emu-XXXXXX";
    const char* dir = mkdtemp(tmpl);
    if (!dir) throw UserError("emulator", "cannot create a temporary directory in /tmp to compile " + s.name);
    const std::filesystem::path d(dir), src = d / (s.name + ".cpp"), obj = d / "kernel.o", so = d / "kernel.so";
    std::ofstream(src) << unit;
    const std::string compile = quote(cxx.path) + " " + join(cxx.compile_flags) + " -c " + quote(src) + " -o " + quote(obj);
    const std::string link = quote(cxx.path) + " -shared -o " + quote(so) + " " + quote(obj);
    std::string log;
    int rc = run_command(compile, log);
    if (rc == 0) rc = run_command(link, log);
    if (rc != 0) {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
      std::ostringstream os;
      os << "the host compiler failed to build " << s.name << " for the emulator (" << parts.arch << ")\ncommand: " << compile
         << "\ncompiler log:\n" << log << "source " << s.name << ".cu:\n" << numbered_source(s.source, lines_in_log(log, s.name + ".cu"));
      throw UserError(s.name, os.str());
    }
    // A compiler that exits 0 may still have written nothing usable (ATTNJIT_EMU_CXX=true): what it
    // left must be a shared object that loads before it goes into the cache.
    std::string problem;
    std::ifstream in(so, std::ios::binary);
    if (!in) {
      problem = "it wrote no " + so.filename().string();
    } else {
      out->shared_object.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      problem = shared_object_problem(out->shared_object);
    }
    if (problem.empty()) {
      if (void* handle = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL)) {
        dlclose(handle);
      } else {
        const char* why = dlerror();
        problem = std::string("it does not load: ") + (why ? why : "dlopen failed");
      }
    }
    std::error_code ec;
    std::filesystem::remove_all(d, ec);
    if (!problem.empty()) {
      std::ostringstream os;
      os << "the host compiler '" << cxx.path << "' reported success but left no loadable shared object for " << s.name
         << " (" << parts.arch << "): " << problem << "; point ATTNJIT_EMU_CXX at g++ or clang++\ncommand: " << compile
         << "\nlink: " << link << "\ncompiler log:\n" << log;
      throw UserError(s.name, os.str());
    }
    cache.put(key, out->shared_object, s.name, parts.arch);
  }
  out->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(m);
  return loaded.emplace(key.hex, std::move(out)).first->second;
}

}  // namespace attnjit::emu
