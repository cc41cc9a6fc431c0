#include "compiler/nvrtc/cubin_info.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <regex>
#include <sstream>

#include "compiler/support/error.hpp"

extern char** environ;

namespace attnjit {

namespace {

// The ELF is parsed here rather than by running `cuobjdump --dump-resource-usage`: the binary
// utilities do not come with NVRTC (they are missing on machines that can compile), and every
// number it prints is in the ELF. Spills are the exception: only ptxas's log has them.

// ELF constants for the parts of a CUDA ELF this file reads.
constexpr uint16_t kEmCuda = 190;
constexpr uint32_t kShtSymtab = 2;
constexpr uint8_t kSttFunc = 2;
constexpr uint8_t kStoCudaEntry = 0x10;  // st_other bit nvdisasm prints as STO_CUDA_ENTRY: a __global__

// EIATTR record ids, checked against `cuobjdump --dump-resource-usage` on CUDA 13 CUBINs for
// sm_75 through sm_120. Register count and stack sizes live in the global `.nv.info` as
// (symbol index, value) pairs; launch bounds live in the kernel's own `.nv.info.<name>`.
constexpr uint8_t kEiattrMaxThreads = 0x05;    // __launch_bounds__ / .maxntid: x, y, z
constexpr uint8_t kEiattrReqntid = 0x10;       // .reqntid: x, y, z
constexpr uint8_t kEiattrFrameSize = 0x11;     // the kernel's own frame
constexpr uint8_t kEiattrMinStackSize = 0x12;  // frame plus callees: what cuobjdump calls STACK
constexpr uint8_t kEiattrRegcount = 0x2f;
constexpr uint8_t kEifmtSval = 0x04;  // a record with a u16 size and a payload; others are 4 bytes

[[noreturn]] void bad_cubin(const std::string& why) {
  throw UserError("cubin", "not a valid CUDA ELF (CUBIN): " + why);
}

// Bounds-checked little-endian reads: a truncated or corrupt CUBIN is a UserError, never a crash.
class Bytes {
public:
  explicit Bytes(const std::vector<uint8_t>& b) : b_(b) {}
  template <typename T>
  T read(uint64_t off) const {
    if (off > b_.size() || b_.size() - off < sizeof(T)) bad_cubin("a read at offset " + std::to_string(off) + " runs past the end");
    T v{};
    std::memcpy(&v, b_.data() + off, sizeof(T));  // x86-64 and aarch64 hosts are little-endian, like the CUBIN
    return v;
  }
  void check_range(uint64_t off, uint64_t size, const std::string& what) const {
    if (off > b_.size() || b_.size() - off < size) bad_cubin(what + " lies outside the file");
  }
  std::string cstr(uint64_t off) const {
    if (off >= b_.size()) bad_cubin("a name offset lies outside the file");
    const auto* p = reinterpret_cast<const char*>(b_.data() + off);
    return std::string(p, strnlen(p, b_.size() - off));
  }

private:
  const std::vector<uint8_t>& b_;
};

struct Section {
  std::string name;
  uint32_t type = 0;
  uint64_t offset = 0, size = 0;
  uint32_t link = 0, info = 0;
  uint64_t entsize = 0;
};

std::vector<Section> read_sections(const Bytes& in, size_t file_size) {
  if (file_size < 64) bad_cubin("the file has " + std::to_string(file_size) + " bytes, fewer than an ELF header");
  if (in.read<uint32_t>(0) != 0x464c457fu) bad_cubin("the ELF magic \\x7fELF is missing");
  if (in.read<uint8_t>(4) != 2 || in.read<uint8_t>(5) != 1) bad_cubin("it is not a 64-bit little-endian ELF");
  if (in.read<uint16_t>(18) != kEmCuda) bad_cubin("its machine is not EM_CUDA (190)");
  const uint64_t shoff = in.read<uint64_t>(0x28);
  const uint16_t shentsize = in.read<uint16_t>(0x3a), shnum = in.read<uint16_t>(0x3c), shstrndx = in.read<uint16_t>(0x3e);
  if (shentsize < 64 || shstrndx >= shnum) bad_cubin("its section header table is malformed");
  in.check_range(shoff, uint64_t{shentsize} * shnum, "the section header table");
  std::vector<Section> sections(shnum);
  std::vector<uint32_t> name_offsets(shnum);
  for (uint16_t i = 0; i < shnum; ++i) {
    const uint64_t h = shoff + uint64_t{i} * shentsize;
    Section& s = sections[i];
    name_offsets[i] = in.read<uint32_t>(h);
    s.type = in.read<uint32_t>(h + 4);
    s.offset = in.read<uint64_t>(h + 0x18);
    s.size = in.read<uint64_t>(h + 0x20);
    s.link = in.read<uint32_t>(h + 0x28);
    s.info = in.read<uint32_t>(h + 0x2c);
    s.entsize = in.read<uint64_t>(h + 0x38);
  }
  const Section& names = sections[shstrndx];
  for (uint16_t i = 0; i < shnum; ++i) {
    if (name_offsets[i] >= names.size) bad_cubin("a section name lies outside .shstrtab");
    sections[i].name = in.cstr(names.offset + name_offsets[i]);
  }
  return sections;
}

const Section* find_section(const std::vector<Section>& sections, const std::string& name) {
  for (const Section& s : sections)
    if (s.name == name) return &s;
  return nullptr;
}

struct Kernel {
  uint32_t symbol_index;
  std::string name;
  uint32_t text_section;
};

std::vector<Kernel> read_kernels(const Bytes& in, const std::vector<Section>& sections) {
  std::vector<Kernel> kernels;
  for (const Section& symtab : sections) {
    if (symtab.type != kShtSymtab) continue;
    if (symtab.entsize < 24 || symtab.link >= sections.size()) bad_cubin("its symbol table is malformed");
    in.check_range(symtab.offset, symtab.size, "the symbol table");
    const Section& strtab = sections[symtab.link];
    for (uint64_t i = 0; i < symtab.size / symtab.entsize; ++i) {
      const uint64_t e = symtab.offset + i * symtab.entsize;
      const uint32_t name_off = in.read<uint32_t>(e);
      const uint8_t info = in.read<uint8_t>(e + 4), other = in.read<uint8_t>(e + 5);
      const uint16_t shndx = in.read<uint16_t>(e + 6);
      if ((info & 0xf) != kSttFunc || !(other & kStoCudaEntry) || shndx >= sections.size()) continue;
      if (name_off >= strtab.size) bad_cubin("a symbol name lies outside .strtab");
      kernels.push_back({static_cast<uint32_t>(i), in.cstr(strtab.offset + name_off), shndx});
    }
  }
  return kernels;
}

// Calls visit(attribute, payload offset, payload size) for each EIATTR record of a .nv.info section.
template <typename Visit>
void for_each_eiattr(const Bytes& in, const Section& s, Visit visit) {
  in.check_range(s.offset, s.size, "section " + s.name);
  uint64_t pos = 0;
  while (pos + 4 <= s.size) {
    const uint8_t format = in.read<uint8_t>(s.offset + pos), attribute = in.read<uint8_t>(s.offset + pos + 1);
    uint64_t payload = 0;
    if (format == kEifmtSval) payload = in.read<uint16_t>(s.offset + pos + 2);
    if (pos + 4 + payload > s.size) bad_cubin("an EIATTR record runs past the end of " + s.name);
    visit(attribute, s.offset + pos + 4, payload);
    pos += 4 + payload;
  }
}

}  // namespace

std::vector<ResourceUsage> inspect_cubin(const std::vector<uint8_t>& cubin) {
  const Bytes in(cubin);
  const std::vector<Section> sections = read_sections(in, cubin.size());
  const std::vector<Kernel> kernels = read_kernels(in, sections);

  // (symbol index) -> value, for the global per-function records.
  std::map<uint32_t, int> regcount, frame_size, min_stack_size;
  if (const Section* info = find_section(sections, ".nv.info")) {
    for_each_eiattr(in, *info, [&](uint8_t attr, uint64_t off, uint64_t size) {
      if (size != 8) return;
      const uint32_t symbol = in.read<uint32_t>(off);
      const int value = static_cast<int>(in.read<uint32_t>(off + 4));
      if (attr == kEiattrRegcount) regcount[symbol] = value;
      if (attr == kEiattrFrameSize) frame_size[symbol] = value;
      if (attr == kEiattrMinStackSize) min_stack_size[symbol] = value;
    });
  }

  std::vector<ResourceUsage> out;
  for (const Kernel& k : kernels) {
    ResourceUsage u;
    u.kernel = k.name;
    if (auto it = regcount.find(k.symbol_index); it != regcount.end()) {
      u.registers = it->second;
    } else {
      // Older layouts keep the count only in the top byte of the text section's sh_info.
      u.registers = static_cast<int>(sections[k.text_section].info >> 24);
    }
    if (auto it = min_stack_size.find(k.symbol_index); it != min_stack_size.end()) {
      u.stack_bytes = it->second;
    } else if (auto f = frame_size.find(k.symbol_index); f != frame_size.end()) {
      u.stack_bytes = f->second;
    }
    if (const Section* s = find_section(sections, ".nv.shared." + k.name)) u.shared_bytes = static_cast<int>(s->size);
    if (const Section* s = find_section(sections, ".nv.local." + k.name)) u.local_bytes = static_cast<int>(s->size);
    if (const Section* s = find_section(sections, ".nv.info." + k.name)) {
      int maxntid = 0, reqntid = 0;
      for_each_eiattr(in, *s, [&](uint8_t attr, uint64_t off, uint64_t size) {
        if ((attr != kEiattrMaxThreads && attr != kEiattrReqntid) || size != 12) return;
        const int threads = static_cast<int>(in.read<uint32_t>(off) * in.read<uint32_t>(off + 4) * in.read<uint32_t>(off + 8));
        (attr == kEiattrMaxThreads ? maxntid : reqntid) = threads;
      });
      u.max_threads = maxntid ? maxntid : reqntid;
    }
    out.push_back(u);
  }
  return out;
}

void add_ptxas_log_spills(std::vector<ResourceUsage>& usage, const std::string& log) {
  // ptxas -v prints, per function:
  //   ptxas info    : Function properties for NAME
  //   ptxas         .     192 bytes stack frame, 352 bytes spill stores, 376 bytes spill loads
  static const std::regex header(R"(Function properties for (\S+))");
  static const std::regex spills(R"((\d+) bytes spill stores, (\d+) bytes spill loads)");
  std::istringstream lines(log);
  std::string line, current;
  while (std::getline(lines, line)) {
    std::smatch m;
    if (std::regex_search(line, m, header)) {
      current = m[1];
      continue;
    }
    if (current.empty() || !std::regex_search(line, m, spills)) continue;
    const int stores = std::stoi(m[1]), loads = std::stoi(m[2]);
    auto it = std::find_if(usage.begin(), usage.end(), [&](const ResourceUsage& u) { return u.kernel == current; });
    if (it != usage.end()) {
      it->spill_store_bytes = stores;
      it->spill_load_bytes = loads;
    } else if (stores > 0 || loads > 0) {
      ResourceUsage f;
      f.kernel = current;
      f.is_kernel = false;
      f.spill_store_bytes = stores;
      f.spill_load_bytes = loads;
      usage.push_back(f);
    }
    current.clear();
  }
}

namespace {

// A temp file holding the CUBIN, removed when it goes out of scope.
class TempCubin {
public:
  explicit TempCubin(const std::vector<uint8_t>& bytes) {
    char path[] = "/tmp/attnjit-cubin-XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) throw UserError("/tmp", std::string("cannot create a temp file for the CUBIN: ") + std::strerror(errno));
    path_ = path;
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fd);
        throw UserError(path_, std::string("cannot write the CUBIN: ") + std::strerror(errno));
      }
      done += static_cast<size_t>(n);
    }
    ::close(fd);
  }
  ~TempCubin() { ::unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

private:
  std::string path_;
};

// Spawns argv with stdout and stderr on a pipe and collects both. nullopt when the program does not
// exist; posix_spawnp searches PATH itself, so no environment variable is read here.
std::optional<std::string> spawn_capture(const std::vector<std::string>& argv, int& exit_status) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw UserError(argv[0], std::string("cannot create a pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const bool has_slash = argv[0].find('/') != std::string::npos;
  const int rc = has_slash ? posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ)
                           : posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    if (rc == ENOENT || rc == EACCES || rc == ENOTDIR) return std::nullopt;
    throw UserError(argv[0], std::string("cannot run it: ") + std::strerror(rc));
  }
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return out;
}

}  // namespace

std::optional<std::string> run_cuda_tool_on_cubin(const std::string& tool, const std::vector<std::string>& args,
                                                  const std::vector<uint8_t>& cubin) {
  const TempCubin file(cubin);
  for (const std::string& program : {tool, "/usr/local/cuda/bin/" + tool}) {
    std::vector<std::string> argv{program};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back(file.path());
    int status = 0;
    std::optional<std::string> out = spawn_capture(argv, status);
    if (!out) continue;
    if (status != 0) {
      throw UserError(tool, "exited with status " + std::to_string(status) + " on the CUBIN; it said:\n" + *out);
    }
    return out;
  }
  return std::nullopt;
}

std::string disassemble_cubin(const std::vector<uint8_t>& cubin) {
  inspect_cubin(cubin);  // a clear "not a CUBIN" error beats a tool's
  if (auto sass = run_cuda_tool_on_cubin("nvdisasm", {"--print-code"}, cubin)) return *sass;
  if (auto sass = run_cuda_tool_on_cubin("cuobjdump", {"-sass"}, cubin)) return *sass;
  throw UserError("nvdisasm",
                  "neither nvdisasm nor cuobjdump was found on PATH or in /usr/local/cuda/bin; install the CUDA "
                  "binary utilities (Debian: nvidia-cuda-toolkit; PyPI: nvidia-cuda-nvdisasm, nvidia-cuda-cuobjdump) "
                  "to see SASS");
}

}  // namespace attnjit
