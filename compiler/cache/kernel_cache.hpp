// The kernel cache: compiled binaries, content-addressed by everything that changes their bytes,
// kept in memory and in one file per entry on disk. Concurrent processes share the directory
// without locks: writers rename a finished temp file into place, readers verify what they read.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace attnjit {

// Bump when the key text or the entry layout changes; old entries then miss (and the golden file
// tests/unit/golden/kernel_cache_entry_v1.ajk must be regenerated deliberately).
constexpr uint32_t kCacheFormatVersion = 1;

// Everything that changes the bytes of a compiled kernel.
struct CacheKeyParts {
  std::string attnjit_version;
  std::string template_hash;
  std::string source_hash;
  std::string options;  // canonical, space-joined
  std::string nvrtc_version;
  std::string arch;
};

// text: "format=N" then one "field=value" line per part (newlines and backslashes in values are
// escaped, so different parts never give the same text); hex: SHA-256 of text.
struct CacheKey {
  std::string text;
  std::string hex;
};

CacheKey make_cache_key(const CacheKeyParts& parts);

struct CacheEntryInfo {
  std::string hex;
  int64_t bytes = 0;           // file size
  int64_t last_used_unix = 0;  // file mtime
  std::string kernel_name;
  std::string arch;
  bool valid = false;
  std::string problem;  // why the entry is not valid; empty when it is
};

struct CacheStats {
  int64_t entries = 0;  // disk entries when the disk is in use, else memory entries
  int64_t bytes = 0;
  int64_t memory_hits = 0;
  int64_t disk_hits = 0;
  int64_t misses = 0;
  int64_t corrupt = 0;  // bad disk entries found (and removed) by get()
};

class KernelCache {
public:
  // An empty dir or enabled=false: memory only. A directory that cannot be created degrades to
  // memory only; one that exists but cannot be written is still read (a shared precompiled cache),
  // new entries stay in memory. Either case, and a later failed write (disk full), warns once.
  KernelCache(std::string dir, int64_t max_bytes, bool enabled = true);

  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // Memory first, then disk. A disk entry is verified (magic, version, header checksum, key, size,
  // payload checksum); a bad one is a miss with a warning naming the file, and the file is removed.
  // So is what is not a regular file (a FIFO, a device): it is never opened in a way that waits.
  // A disk hit refreshes the entry's last-use time (its mtime). A key with no entry of its own is
  // looked up through its alias, if it has one.
  std::optional<std::vector<uint8_t>> get(const CacheKey& key);

  // Makes `alias` a second key of the entry `target_hex` (a small "<alias hex>.aja" file holding
  // the target's hex; not an entry: list(), stats() and eviction do not see it, clear() removes
  // it). The JIT gives every kernel one under its key without the NVRTC version, so a machine with
  // no NVRTC for the arch still finds kernels another machine compiled. Failures only warn.
  void put_alias(const CacheKey& alias, const std::string& target_hex);

  // Stores in memory and, when the disk is writable, atomically on disk; then evicts least recently
  // used entries while the directory holds more than max_bytes (never the entry just written).
  // A failed disk write is a warning, never an exception.
  void put(const CacheKey& key, const std::vector<uint8_t>& binary, const std::string& kernel_name,
           const std::string& arch);

  // What a payload must be beyond its checksums, for entries whose format the cache does not know
  // (a CUBIN, an emulator object): why the payload of an entry for `arch` is unusable, or "".
  using PayloadCheck = std::function<std::string(const std::string& arch, const std::vector<uint8_t>& payload)>;

  // Every entry file on disk, verified (and its payload checked by `check`, when given), sorted by
  // hex; a non-regular file under an entry's name is listed as a bad entry.
  std::vector<CacheEntryInfo> list(const PayloadCheck& check = {}) const;
  CacheStats stats() const;
  // Number of bad entries on disk; their descriptions go to *bad when given. Removes nothing.
  int64_t verify_all(std::vector<CacheEntryInfo>* bad, const PayloadCheck& check = {});
  // Empties the memory layer and removes every file this cache scheme wrote (entries, aliases and
  // leftover temp files); other files in the directory are left alone.
  void clear();

  const std::string& dir() const { return dir_; }
  bool disk_enabled() const { return disk_readable_; }
  bool disk_writable() const { return disk_writable_.load(); }
  int64_t max_bytes() const { return max_bytes_; }

private:
  std::string entry_path(const std::string& hex) const;
  std::string alias_path(const std::string& hex) const;
  std::optional<std::vector<uint8_t>> lookup(const std::string& hex);  // get() without aliases or miss counting
  std::optional<std::string> alias_target(const std::string& hex);
  bool write_entry(const CacheKey& key, const std::vector<uint8_t>& binary, const std::string& kernel_name,
                   const std::string& arch);
  void evict_over_limit(const std::string& keep_hex);
  void disable_writes(const std::string& why);

  std::string dir_;
  int64_t max_bytes_;
  bool disk_readable_ = false;
  std::atomic<bool> disk_writable_{false};
  std::atomic<bool> warned_{false};

  mutable std::mutex mu_;  // guards memory_ and the counters in stats_
  std::map<std::string, std::vector<uint8_t>> memory_;
  std::map<std::string, std::string> aliases_;  // alias hex -> target hex
  CacheStats stats_;
};

// The exact bytes of a cache entry file, and their inverse; exposed for tests and `attnjit cache`.
std::vector<uint8_t> encode_cache_entry(const std::string& key_hex, const std::vector<uint8_t>& payload,
                                        const std::string& kernel_name, const std::string& arch);
struct DecodedCacheEntry {
  std::string key_hex, kernel_name, arch;
  std::vector<uint8_t> payload;
};
// nullopt and *problem set when the bytes are not a valid entry.
std::optional<DecodedCacheEntry> decode_cache_entry(const std::vector<uint8_t>& bytes, std::string* problem);

}  // namespace attnjit
