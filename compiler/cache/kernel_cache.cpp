#include "compiler/cache/kernel_cache.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <sstream>
#include <thread>

#include "compiler/support/sha256.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"

namespace attnjit {

namespace {

// ---- Entry layout (all integers little-endian) -------------------------------------------------
//   0  magic "ATNJKC01"          8 bytes
//   8  format version            u32
//  12  header size               u32  (= kFixedHeaderBytes + name length + arch length)
//  16  key hex                   64 bytes
//  80  kernel name length        u32
//  84  arch length               u32
//  88  kernel name, arch         name length + arch length bytes
//   .  payload size              u64
//   .  SHA-256 of the payload    32 bytes
//   .  SHA-256 of every header byte before this field   32 bytes
//   .  payload
// The header checksum is there so that a flipped byte in the kernel name or arch is caught too.
constexpr char kMagic[8] = {'A', 'T', 'N', 'J', 'K', 'C', '0', '1'};
constexpr size_t kNameOffset = 88;
constexpr size_t kFixedHeaderBytes = kNameOffset + 8 + 32 + 32;
constexpr uint32_t kMaxNameBytes = 4096;
constexpr const char* kEntrySuffix = ".ajk";
constexpr const char* kTempInfix = ".ajk.tmp.";
// "<alias hex>.aja" holds "<target hex>\n": another key under which the same binary is stored.
constexpr const char* kAliasSuffix = ".aja";
// A temp file this old belongs to a writer that died; younger ones may still be renamed into place.
constexpr int64_t kStaleTempSeconds = 600;

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint64_t get_le(const std::vector<uint8_t>& in, size_t offset, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{in[offset + i]} << (8 * i);
  return v;
}
void put_bytes(std::vector<uint8_t>& out, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  out.insert(out.end(), p, p + size);
}
std::array<uint8_t, 32> sha256_of(const uint8_t* data, size_t size) {
  Sha256 h;
  h.update(data, size);
  return h.digest();
}

bool is_hex64(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// "<64 hex>.ajk": the only names this cache reads, evicts or clears.
bool is_entry_name(const std::string& name) {
  return name.size() == 64 + 4 && name.compare(64, 4, kEntrySuffix) == 0 && is_hex64(name.substr(0, 64));
}
bool is_alias_name(const std::string& name) {
  return name.size() == 64 + 4 && name.compare(64, 4, kAliasSuffix) == 0 && is_hex64(name.substr(0, 64));
}
// "<64 hex or 'probe'>.ajk.tmp.<pid>.<thread>.<counter>"
bool is_temp_name(const std::string& name) {
  const size_t at = name.find(kTempInfix);
  if (at == std::string::npos) return false;
  const std::string stem = name.substr(0, at);
  return stem == "probe" || is_hex64(stem);
}

std::string errno_text(int err) { return std::strerror(err); }

struct DirFile {
  std::string name;
  int64_t bytes;
  int64_t mtime_ns;
  bool regular = true;
};

// Files in dir whose names pass `keep`: plain files, and with `others` also what is not one (a
// FIFO, a device, a directory or a symbolic link under an entry's name); files that vanish while
// we look are skipped.
std::vector<DirFile> scan_dir(const std::string& dir, bool (*keep)(const std::string&), bool others = false) {
  std::vector<DirFile> files;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return files;
  while (const dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (!keep(name)) continue;
    struct stat st;
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    const bool regular = S_ISREG(st.st_mode);
    if (!regular && !others) continue;
    files.push_back({std::move(name), regular ? static_cast<int64_t>(st.st_size) : 0,
                     static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec, regular});
  }
  ::closedir(d);
  return files;
}

// What a file that is not a regular one is, for messages.
std::string file_kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISDIR(mode)) return "a directory";
  return "not a regular file";
}

// Opens a cache file for reading without ever blocking: O_NONBLOCK keeps a FIFO from waiting for
// a writer, and what fstat says is checked on the open descriptor, so a file swapped in between
// cannot slip through. -1 with *problem set ("missing" when it does not exist) and *st filled
// when the file exists but is not a regular file.
int open_regular(const std::string& path, struct stat* st, std::string* problem) {
  *st = {};
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    *problem = errno == ENOENT ? "missing" : "cannot open: " + errno_text(errno);
    return -1;
  }
  if (::fstat(fd, st) != 0) {
    *problem = "cannot stat: " + errno_text(errno);
    *st = {};
    ::close(fd);
    return -1;
  }
  if (!S_ISREG(st->st_mode)) {
    *problem = "is " + file_kind(st->st_mode) + ", not a regular file";
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads the whole file behind fd; false and *problem on a read error.
bool read_fd(int fd, std::vector<uint8_t>& out, std::string* problem) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    *problem = "cannot stat: " + errno_text(errno);
    return false;
  }
  out.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *problem = "cannot read: " + errno_text(errno);
      return false;
    }
    if (n == 0) break;  // shrank under us; the size checks below report it
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return true;
}

bool write_all(int fd, const std::vector<uint8_t>& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// A name no other writer (process, thread, or earlier call) can pick.
std::string temp_name(const std::string& stem) {
  static std::atomic<uint64_t> counter{0};
  std::ostringstream os;
  os << stem << kTempInfix << ::getpid() << "." << std::hex << std::hash<std::thread::id>{}(std::this_thread::get_id())
     << "." << std::dec << counter.fetch_add(1);
  return os.str();
}

// Reads and verifies the entry at path, which should hold key `hex`. On success *payload and *info
// are filled; with `touch` its mtime becomes now (the last-use time that eviction sorts by).
// Returns false with info->problem set for a bad entry; *unreadable tells a missing or unreadable
// file (not the entry's fault) from a corrupt one. What is not a regular file is never read: it is
// a bad entry.
bool load_entry(const std::string& path, const std::string& hex, bool touch, std::vector<uint8_t>* payload,
                CacheEntryInfo* info, bool* unreadable, struct stat* st) {
  *unreadable = false;
  info->hex = hex;
  const int fd = open_regular(path, st, &info->problem);
  if (fd < 0) {
    // Not a regular file (a FIFO, a device, a directory): a bad entry, never something to wait on.
    *unreadable = st->st_mode == 0 || S_ISREG(st->st_mode);
    return false;
  }
  std::vector<uint8_t> bytes;
  const bool read_ok = read_fd(fd, bytes, &info->problem);
  if (read_ok && touch) ::futimens(fd, nullptr);  // best effort: a read-only cache still works
  ::close(fd);
  if (!read_ok) {
    *unreadable = true;
    return false;
  }
  info->bytes = static_cast<int64_t>(bytes.size());
  info->last_used_unix = touch ? static_cast<int64_t>(std::time(nullptr)) : static_cast<int64_t>(st->st_mtim.tv_sec);
  std::optional<DecodedCacheEntry> entry = decode_cache_entry(bytes, &info->problem);
  if (!entry) return false;
  info->kernel_name = entry->kernel_name;
  info->arch = entry->arch;
  if (entry->key_hex != hex) {
    info->problem = "holds key " + entry->key_hex + ", expected " + hex;
    return false;
  }
  info->valid = true;
  if (payload != nullptr) *payload = std::move(entry->payload);
  return true;
}

std::string escape_value(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

}  // namespace

CacheKey make_cache_key(const CacheKeyParts& parts) {
  const std::pair<const char*, const std::string*> fields[] = {
      {"attnjit_version", &parts.attnjit_version}, {"template_hash", &parts.template_hash},
      {"source_hash", &parts.source_hash},         {"options", &parts.options},
      {"nvrtc_version", &parts.nvrtc_version},     {"arch", &parts.arch},
  };
  CacheKey key;
  key.text = "format=" + std::to_string(kCacheFormatVersion) + "\n";
  for (const auto& [name, value] : fields) key.text += std::string(name) + "=" + escape_value(*value) + "\n";
  key.hex = sha256_hex(key.text);
  return key;
}

std::vector<uint8_t> encode_cache_entry(const std::string& key_hex, const std::vector<uint8_t>& payload,
                                        const std::string& kernel_name, const std::string& arch) {
  ATTNJIT_CHECK(is_hex64(key_hex), "cache key hex must be 64 lowercase hex digits (build keys with make_cache_key)");
  ATTNJIT_CHECK(kernel_name.size() <= kMaxNameBytes && arch.size() <= kMaxNameBytes,
                "kernel name or arch longer than 4096 bytes: " + kernel_name.substr(0, 80));
  std::vector<uint8_t> out;
  out.reserve(kFixedHeaderBytes + kernel_name.size() + arch.size() + payload.size());
  put_bytes(out, kMagic, sizeof(kMagic));
  put_u32(out, kCacheFormatVersion);
  put_u32(out, static_cast<uint32_t>(kFixedHeaderBytes + kernel_name.size() + arch.size()));
  put_bytes(out, key_hex.data(), key_hex.size());
  put_u32(out, static_cast<uint32_t>(kernel_name.size()));
  put_u32(out, static_cast<uint32_t>(arch.size()));
  put_bytes(out, kernel_name.data(), kernel_name.size());
  put_bytes(out, arch.data(), arch.size());
  put_u64(out, payload.size());
  put_bytes(out, sha256_of(payload.data(), payload.size()).data(), 32);
  put_bytes(out, sha256_of(out.data(), out.size()).data(), 32);
  put_bytes(out, payload.data(), payload.size());
  return out;
}

std::optional<DecodedCacheEntry> decode_cache_entry(const std::vector<uint8_t>& bytes, std::string* problem) {
  auto fail = [&](std::string why) -> std::optional<DecodedCacheEntry> {
    *problem = std::move(why);
    return std::nullopt;
  };
  const size_t size = bytes.size();
  if (size == 0) return fail("empty file");
  if (size < kNameOffset) return fail("truncated: " + std::to_string(size) + " bytes, shorter than the header");
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) return fail("bad magic (not an attnjit cache entry)");
  const uint64_t version = get_le(bytes, 8, 4);
  if (version != kCacheFormatVersion) {
    return fail("format version " + std::to_string(version) + ", this attnjit reads version " +
                std::to_string(kCacheFormatVersion));
  }
  const uint64_t name_len = get_le(bytes, 80, 4), arch_len = get_le(bytes, 84, 4);
  if (name_len > kMaxNameBytes || arch_len > kMaxNameBytes) return fail("corrupt header: name lengths out of range");
  const uint64_t header_size = get_le(bytes, 12, 4);
  if (header_size != kFixedHeaderBytes + name_len + arch_len) return fail("corrupt header: inconsistent header size");
  if (size < header_size) return fail("truncated: " + std::to_string(size) + " bytes, shorter than the header");
  const size_t checksum_at = header_size - 32;
  if (std::memcmp(sha256_of(bytes.data(), checksum_at).data(), bytes.data() + checksum_at, 32) != 0) {
    return fail("header checksum mismatch");
  }
  const size_t payload_size_at = kNameOffset + name_len + arch_len;
  const uint64_t payload_size = get_le(bytes, payload_size_at, 8);
  if (payload_size != size - header_size) {
    return fail("size mismatch: header says " + std::to_string(payload_size) + " payload bytes, file has " +
                std::to_string(size - header_size));
  }
  if (std::memcmp(sha256_of(bytes.data() + header_size, payload_size).data(), bytes.data() + payload_size_at + 8, 32) !=
      0) {
    return fail("payload checksum mismatch");
  }
  DecodedCacheEntry entry;
  entry.key_hex.assign(reinterpret_cast<const char*>(bytes.data()) + 16, 64);
  entry.kernel_name.assign(reinterpret_cast<const char*>(bytes.data()) + kNameOffset, name_len);
  entry.arch.assign(reinterpret_cast<const char*>(bytes.data()) + kNameOffset + name_len, arch_len);
  entry.payload.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header_size), bytes.end());
  return entry;
}

// ---- KernelCache ---------------------------------------------------------------------------------

KernelCache::KernelCache(std::string dir, int64_t max_bytes, bool enabled) : dir_(std::move(dir)), max_bytes_(max_bytes) {
  if (!enabled || dir_.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  std::error_code is_dir_ec;
  if (!std::filesystem::is_directory(dir_, is_dir_ec)) {
    warned_ = true;
    log(LogLevel::Warn, "kernel cache directory '" + dir_ + "' cannot be created (" +
                            (ec ? ec.message() : std::string("a file is in the way")) +
                            "); compiled kernels are kept in memory only. Set ATTNJIT_CACHE_DIR to a writable "
                            "directory, or ATTNJIT_DISABLE_CACHE=1 to silence this warning.");
    return;
  }
  disk_readable_ = true;
  // Probe with a real file: access(W_OK) says yes to root on a read-only mount and knows nothing of quotas.
  const std::string probe = dir_ + "/" + temp_name("probe");
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  const int err = errno;
  if (fd >= 0) {
    const bool ok = write_all(fd, {0});
    ::close(fd);
    ::unlink(probe.c_str());
    if (ok) {
      disk_writable_ = true;
      return;
    }
  }
  disable_writes(fd >= 0 ? "cannot write a file in it" : errno_text(err));
}

std::string KernelCache::entry_path(const std::string& hex) const { return dir_ + "/" + hex + kEntrySuffix; }

void KernelCache::disable_writes(const std::string& why) {
  disk_writable_ = false;
  if (warned_.exchange(true)) return;
  log(LogLevel::Warn, "kernel cache directory '" + dir_ + "' is not writable (" + why +
                          "); existing entries are still read, new kernels are kept in memory only. Set "
                          "ATTNJIT_CACHE_DIR to a writable directory, or ATTNJIT_DISABLE_CACHE=1 to silence this warning.");
}

std::optional<std::vector<uint8_t>> KernelCache::get(const CacheKey& key) {
  ATTNJIT_CHECK(is_hex64(key.hex), "cache key hex must be 64 lowercase hex digits (build keys with make_cache_key)");
  if (auto payload = lookup(key.hex)) return payload;
  if (std::optional<std::string> target = alias_target(key.hex)) {
    if (auto payload = lookup(*target)) return payload;
    // The entry it named was evicted or cleared; the alias is stale.
    if (disk_writable_) ::unlink(alias_path(key.hex).c_str());
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.misses;
  return std::nullopt;
}

std::optional<std::vector<uint8_t>> KernelCache::lookup(const std::string& hex) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = memory_.find(hex); it != memory_.end()) {
      ++stats_.memory_hits;
      return it->second;
    }
  }
  if (!disk_readable_) return std::nullopt;
  const std::string path = entry_path(hex);
  std::vector<uint8_t> payload;
  CacheEntryInfo info;
  bool unreadable = false;
  struct stat st {};
  if (load_entry(path, hex, /*touch=*/true, &payload, &info, &unreadable, &st)) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.disk_hits;
    memory_[hex] = payload;
    return payload;
  }
  if (!unreadable) {
    // Remove the bad file only if it is still the one we read: a writer may have renamed a good
    // entry over it meanwhile.
    struct stat now {};
    std::string removed = "removed it";
    if (::stat(path.c_str(), &now) == 0 && now.st_ino == st.st_ino && now.st_dev == st.st_dev &&
        ::unlink(path.c_str()) != 0) {
      removed = "cannot remove it (" + errno_text(errno) + "), remove it by hand";
    }
    const std::string what = S_ISREG(st.st_mode) ? "is corrupt (" + info.problem + ")" : info.problem;
    log(LogLevel::Warn, "kernel cache entry " + path + " " + what + "; " + removed + ", the kernel will be compiled again");
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.corrupt;
  } else if (info.problem != "missing") {
    log(LogLevel::Debug, "kernel cache entry " + path + ": " + info.problem);
  }
  return std::nullopt;
}

std::string KernelCache::alias_path(const std::string& hex) const { return dir_ + "/" + hex + kAliasSuffix; }

std::optional<std::string> KernelCache::alias_target(const std::string& hex) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = aliases_.find(hex); it != aliases_.end()) return it->second;
  }
  if (!disk_readable_) return std::nullopt;
  struct stat st {};
  std::string problem;
  const int fd = open_regular(alias_path(hex), &st, &problem);
  if (fd < 0) {
    if (st.st_mode != 0) log(LogLevel::Warn, "kernel cache alias " + alias_path(hex) + " " + problem + "; ignored it");
    return std::nullopt;
  }
  std::vector<uint8_t> bytes;
  const bool ok = read_fd(fd, bytes, &problem);
  ::close(fd);
  const std::string text(bytes.begin(), bytes.end());
  if (!ok || text.size() != 65 || text[64] != '\n' || !is_hex64(text.substr(0, 64))) {
    log(LogLevel::Debug, "kernel cache alias " + alias_path(hex) + " is not \"<64 hex digits>\\n\"; ignored");
    return std::nullopt;
  }
  std::lock_guard<std::mutex> lock(mu_);
  return aliases_[hex] = text.substr(0, 64);
}

void KernelCache::put_alias(const CacheKey& alias, const std::string& target_hex) {
  ATTNJIT_CHECK(is_hex64(alias.hex) && is_hex64(target_hex), "cache alias and target must be 64 lowercase hex digits");
  if (alias.hex == target_hex) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    aliases_[alias.hex] = target_hex;
  }
  if (!disk_writable_) return;
  const std::string tmp = dir_ + "/" + temp_name(alias.hex);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    disable_writes("cannot create " + tmp + ": " + errno_text(errno));
    return;
  }
  const std::string text = target_hex + "\n";
  const bool wrote = write_all(fd, std::vector<uint8_t>(text.begin(), text.end()));
  if (::close(fd) != 0 || !wrote || ::rename(tmp.c_str(), alias_path(alias.hex).c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    disable_writes("cannot write " + alias_path(alias.hex) + ": " + errno_text(err));
  }
}

void KernelCache::put(const CacheKey& key, const std::vector<uint8_t>& binary, const std::string& kernel_name,
                      const std::string& arch) {
  ATTNJIT_CHECK(is_hex64(key.hex), "cache key hex must be 64 lowercase hex digits (build keys with make_cache_key)");
  {
    std::lock_guard<std::mutex> lock(mu_);
    memory_[key.hex] = binary;
  }
  if (!disk_writable_) return;
  if (write_entry(key, binary, kernel_name, arch)) evict_over_limit(key.hex);
}

bool KernelCache::write_entry(const CacheKey& key, const std::vector<uint8_t>& binary, const std::string& kernel_name,
                              const std::string& arch) {
  const std::vector<uint8_t> bytes = encode_cache_entry(key.hex, binary, kernel_name, arch);
  const std::string tmp = dir_ + "/" + temp_name(key.hex);
  const std::string path = entry_path(key.hex);
  // No fsync: after a crash a torn entry fails verification and is rebuilt, which costs less than
  // an fsync on every compile.
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    disable_writes("cannot create " + tmp + ": " + errno_text(errno));
    return false;
  }
  const bool wrote = write_all(fd, bytes);
  const int write_err = errno;
  // close() is where NFS reports a failed write-back.
  if (::close(fd) != 0 || !wrote) {
    ::unlink(tmp.c_str());
    disable_writes("cannot write " + tmp + ": " + errno_text(wrote ? errno : write_err));
    return false;
  }
  // rename() replaces atomically: readers see the old complete entry or the new one, never a mix,
  // and when several processes write the same key the last rename wins with identical bytes.
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    if (err == EISDIR || err == ENOTEMPTY || err == EEXIST) {
      // A directory holds this entry's name: the entry's problem, not the cache's; others are still written.
      log(LogLevel::Warn, "kernel cache entry " + path + " is a directory, so this kernel is kept in memory only; remove it");
      return false;
    }
    disable_writes("cannot rename " + tmp + " to " + path + ": " + errno_text(err));
    return false;
  }
  return true;
}

void KernelCache::evict_over_limit(const std::string& keep_hex) {
  std::vector<DirFile> files = scan_dir(dir_, is_entry_name);
  int64_t total = 0;
  for (const DirFile& f : files) total += f.bytes;
  if (total <= max_bytes_) return;
  std::sort(files.begin(), files.end(), [](const DirFile& a, const DirFile& b) {
    return a.mtime_ns != b.mtime_ns ? a.mtime_ns < b.mtime_ns : a.name < b.name;
  });
  int evicted = 0;
  for (const DirFile& f : files) {
    if (total <= max_bytes_) break;
    if (f.name.compare(0, 64, keep_hex) == 0) continue;
    // ENOENT means another process evicted it first; either way it is gone.
    if (::unlink((dir_ + "/" + f.name).c_str()) == 0 || errno == ENOENT) {
      total -= f.bytes;
      ++evicted;
    }
  }
  log(LogLevel::Info, "kernel cache: evicted " + std::to_string(evicted) + " least recently used entries to stay under " +
                          std::to_string(max_bytes_) + " bytes (ATTNJIT_CACHE_MAX_BYTES)");
}

std::vector<CacheEntryInfo> KernelCache::list(const PayloadCheck& check) const {
  std::vector<CacheEntryInfo> out;
  if (!disk_readable_) return out;
  for (const DirFile& f : scan_dir(dir_, is_entry_name, /*others=*/true)) {
    CacheEntryInfo info;
    bool unreadable = false;
    struct stat st {};
    std::vector<uint8_t> payload;
    if (load_entry(dir_ + "/" + f.name, f.name.substr(0, 64), /*touch=*/false, check ? &payload : nullptr, &info,
                   &unreadable, &st) &&
        check) {
      info.problem = check(info.arch, payload);
      info.valid = info.problem.empty();
    }
    if (info.problem == "missing") continue;  // evicted or cleared while we looked
    if (unreadable || !f.regular) {
      info.bytes = f.bytes;
      info.last_used_unix = f.mtime_ns / 1000000000;
    }
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const CacheEntryInfo& a, const CacheEntryInfo& b) { return a.hex < b.hex; });
  return out;
}

CacheStats KernelCache::stats() const {
  CacheStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = stats_;
    s.entries = static_cast<int64_t>(memory_.size());
    s.bytes = 0;
    for (const auto& [hex, bytes] : memory_) s.bytes += static_cast<int64_t>(bytes.size());
  }
  if (disk_readable_) {
    s.entries = 0;
    s.bytes = 0;
    for (const DirFile& f : scan_dir(dir_, is_entry_name)) {
      ++s.entries;
      s.bytes += f.bytes;
    }
  }
  return s;
}

int64_t KernelCache::verify_all(std::vector<CacheEntryInfo>* bad, const PayloadCheck& check) {
  int64_t count = 0;
  for (CacheEntryInfo& info : list(check)) {
    if (info.valid) continue;
    ++count;
    if (bad != nullptr) bad->push_back(std::move(info));
  }
  return count;
}

void KernelCache::clear() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    memory_.clear();
    aliases_.clear();
  }
  if (!disk_readable_) return;
  for (const DirFile& f : scan_dir(dir_, is_entry_name, /*others=*/true)) ::unlink((dir_ + "/" + f.name).c_str());
  for (const DirFile& f : scan_dir(dir_, is_alias_name, /*others=*/true)) ::unlink((dir_ + "/" + f.name).c_str());
  const int64_t stale_before_ns = (static_cast<int64_t>(std::time(nullptr)) - kStaleTempSeconds) * 1000000000;
  for (const DirFile& f : scan_dir(dir_, is_temp_name)) {
    if (f.mtime_ns < stale_before_ns) ::unlink((dir_ + "/" + f.name).c_str());
  }
}

}  // namespace attnjit
