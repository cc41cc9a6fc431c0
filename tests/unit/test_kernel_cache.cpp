// The kernel cache: round trips, every kind of corrupt entry, unusable directories, LRU eviction,
// concurrent processes and threads, and a golden file that pins the entry format.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "compiler/cache/kernel_cache.hpp"
#include "compiler/support/sha256.hpp"
#include "compiler/support/knobs.hpp"
#include "tests/unit/test_support.hpp"

using namespace attnjit;
namespace fs = std::filesystem;
using attnjit::testing::StderrCapture;
using attnjit::testing::TempDir;

namespace {

using Bytes = std::vector<uint8_t>;



bool warnings_shown() { return knobs().log_level >= LogLevel::Warn; }

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

CacheKey key_for(int i) {
  return make_cache_key({"0.1.0", sha256_hex("templates"), sha256_hex("source " + std::to_string(i)),
                         "-arch=sm_90a -std=c++17", "12.4", "sm_90a"});
}

Bytes payload_for(int i, size_t size = 1000) {
  Bytes b(size);
  for (size_t j = 0; j < size; ++j) b[j] = static_cast<uint8_t>((j * 131 + i * 17 + 7) & 0xff);
  return b;
}

std::string entry_file(const std::string& dir, const CacheKey& key) { return dir + "/" + key.hex + ".ajk"; }

Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

void set_mtime(const std::string& path, int64_t unix_seconds) {
  const struct timespec times[2] = {{unix_seconds, 0}, {unix_seconds, 0}};
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0);
}

int64_t mtime_of(const std::string& path) {
  struct stat st;
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mtim.tv_sec;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("kernel cache round trip in memory and on disk", "[cache]") {
  TempDir tmp;
  KernelCache cache(tmp.path, 1 << 20);
  REQUIRE(cache.disk_enabled());
  REQUIRE(cache.disk_writable());
  CHECK_FALSE(cache.get(key_for(1)).has_value());
  cache.put(key_for(1), payload_for(1), "attn_fwd", "sm_90a");
  CHECK(fs::exists(entry_file(tmp.path, key_for(1))));
  CHECK(cache.get(key_for(1)) == payload_for(1));

  CacheStats s = cache.stats();
  CHECK(s.memory_hits == 1);
  CHECK(s.disk_hits == 0);
  CHECK(s.misses == 1);
  CHECK(s.entries == 1);
  CHECK(s.bytes == static_cast<int64_t>(fs::file_size(entry_file(tmp.path, key_for(1)))));

  KernelCache second(tmp.path, 1 << 20);
  CHECK(second.get(key_for(1)) == payload_for(1));
  CHECK(second.get(key_for(1)) == payload_for(1));
  CHECK(second.stats().disk_hits == 1);
  CHECK(second.stats().memory_hits == 1);
  CHECK_FALSE(second.get(key_for(2)).has_value());

  std::vector<CacheEntryInfo> entries = second.list();
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].valid);
  CHECK(entries[0].hex == key_for(1).hex);
  CHECK(entries[0].kernel_name == "attn_fwd");
  CHECK(entries[0].arch == "sm_90a");
}

TEST_CASE("kernel cache with the disk turned off keeps kernels in memory", "[cache]") {
  TempDir tmp;
  StderrCapture err;
  KernelCache off(tmp.path + "/off", 1 << 20, /*enabled=*/false);
  KernelCache empty_dir("", 1 << 20);
  for (KernelCache* cache : {&off, &empty_dir}) {
    CHECK_FALSE(cache->disk_enabled());
    cache->put(key_for(1), payload_for(1), "k", "sm_80");
    CHECK(cache->get(key_for(1)) == payload_for(1));
    CHECK(cache->stats().entries == 1);
    CHECK(cache->list().empty());
  }
  CHECK_FALSE(fs::exists(tmp.path + "/off"));
  CHECK(err.text().empty());  // asked for, so no warning
}

TEST_CASE("kernel cache treats every kind of bad entry as a miss and removes it", "[cache]") {
  const CacheKey key = key_for(1);
  const Bytes payload = payload_for(1);
  const std::vector<std::pair<const char*, std::function<void(Bytes&)>>> corruptions = {
      {"truncated payload", [](Bytes& b) { b.resize(b.size() - 10); }},
      {"truncated header", [](Bytes& b) { b.resize(100); }},
      {"flipped payload byte", [](Bytes& b) { b[b.size() - 500] ^= 0x01; }},
      {"flipped byte in the kernel name", [](Bytes& b) { b[90] ^= 0x20; }},
      {"flipped byte in the payload size", [](Bytes& b) { b[88 + 8 + 6 + 1] ^= 0x01; }},
      {"flipped magic", [](Bytes& b) { b[0] ^= 0xff; }},
      {"wrong format version", [](Bytes& b) { b[8] = 2; }},
      {"wrong key inside the header",
       [&](Bytes& b) { b = encode_cache_entry(key_for(2).hex, payload, "attn_fwd", "sm_90a"); }},
      {"extra bytes at the end", [](Bytes& b) { b.push_back(0); }},
      {"empty file", [](Bytes& b) { b.clear(); }},
      {"random garbage",
       [](Bytes& b) {
         std::mt19937 rng(7);
         b.assign(1000, 0);
         for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
       }},
  };
  for (const auto& [name, corrupt] : corruptions) {
    INFO(name);
    TempDir tmp;
    const std::string path = entry_file(tmp.path, key);
    KernelCache(tmp.path, 1 << 20).put(key, payload, "attn_fwd", "sm_90a");
    Bytes bytes = read_bytes(path);
    corrupt(bytes);
    write_bytes(path, bytes);

    KernelCache cache(tmp.path, 1 << 20);
    std::vector<CacheEntryInfo> bad;
    CHECK(cache.verify_all(&bad) == 1);  // reported, not removed
    REQUIRE(bad.size() == 1);
    CHECK_FALSE(bad[0].problem.empty());
    CHECK(fs::exists(path));

    StderrCapture err;
    std::optional<Bytes> got;
    REQUIRE_NOTHROW(got = cache.get(key));
    const std::string warning = err.text();
    CHECK_FALSE(got.has_value());
    CHECK_FALSE(fs::exists(path));
    CHECK(cache.stats().corrupt == 1);
    CHECK(cache.stats().misses == 1);
    if (warnings_shown()) CHECK_THAT(warning, Catch::Contains("warning") && Catch::Contains(path));

    cache.put(key, payload, "attn_fwd", "sm_90a");
    CHECK(KernelCache(tmp.path, 1 << 20).get(key) == payload);
  }
}

// A reader that waits on a FIFO would hang the test: after a few seconds a watchdog keeps opening
// the FIFOs for writing (which ends such a read: it sees an empty file) and says so.
class FifoWatchdog {
public:
  explicit FifoWatchdog(std::vector<std::string> fifos)
      : fifos_(std::move(fifos)), thread_([this] {
          for (int n = 0; !done_; ++n) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            if (n < 500) continue;
            for (const std::string& f : fifos_) {
              const int fd = ::open(f.c_str(), O_WRONLY | O_NONBLOCK);  // succeeds only while a reader waits
              if (fd >= 0) {
                fired_ = true;
                ::close(fd);
              }
            }
          }
        }) {}
  ~FifoWatchdog() { finish(); }
  bool finish() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
    return fired_;
  }

private:
  std::vector<std::string> fifos_;
  std::atomic<bool> done_{false}, fired_{false};
  std::thread thread_;
};

TEST_CASE("kernel cache takes a FIFO under an entry's or alias's name for a bad entry without opening it to wait", "[cache]") {
  TempDir tmp;
  const CacheKey key = key_for(1), alias = key_for(2);
  const std::string path = entry_file(tmp.path, key), alias_path = tmp.path + "/" + alias.hex + ".aja";
  REQUIRE(::mkfifo(path.c_str(), 0644) == 0);
  REQUIRE(::mkfifo(alias_path.c_str(), 0644) == 0);
  FifoWatchdog watchdog({path, alias_path});

  KernelCache cache(tmp.path, 1 << 20);
  std::vector<CacheEntryInfo> bad;
  CHECK(cache.verify_all(&bad) == 1);
  REQUIRE(bad.size() == 1);
  CHECK(bad[0].hex == key.hex);
  CHECK(bad[0].problem == "is a FIFO (named pipe), not a regular file");
  REQUIRE(cache.list().size() == 1);
  CHECK_FALSE(cache.list()[0].valid);

  StderrCapture err;
  std::optional<Bytes> got = cache.get(key);
  std::optional<Bytes> through_alias = cache.get(alias);
  const std::string warning = err.text();
  CHECK_FALSE(watchdog.finish());  // nothing waited on a FIFO
  CHECK_FALSE(got.has_value());
  CHECK_FALSE(through_alias.has_value());
  CHECK(cache.stats().misses == 2);
  if (warnings_shown()) {
    CHECK_THAT(warning, Catch::Contains(path + " is a FIFO (named pipe), not a regular file; removed it"));
    CHECK_THAT(warning, Catch::Contains(alias_path + " is a FIFO (named pipe), not a regular file; ignored it"));
  }
  CHECK_FALSE(fs::exists(path));
  // The kernel is stored again as usual.
  cache.put(key, payload_for(1), "attn_fwd", "sm_90a");
  CHECK(KernelCache(tmp.path, 1 << 20).get(key) == payload_for(1));
  CHECK(cache.verify_all(nullptr) == 0);
  cache.clear();
  CHECK_FALSE(fs::exists(alias_path));
}

TEST_CASE("kernel cache problems name what is wrong", "[cache]") {
  TempDir tmp;
  KernelCache cache(tmp.path, 1 << 20);
  for (int i = 0; i < 3; ++i) cache.put(key_for(i), payload_for(i), "attn_fwd", "sm_90a");
  Bytes version = read_bytes(entry_file(tmp.path, key_for(0)));
  version[8] = 7;
  write_bytes(entry_file(tmp.path, key_for(0)), version);
  Bytes flipped = read_bytes(entry_file(tmp.path, key_for(1)));
  flipped.back() ^= 0x80;
  write_bytes(entry_file(tmp.path, key_for(1)), flipped);
  std::vector<CacheEntryInfo> bad;
  CHECK(cache.verify_all(&bad) == 2);
  std::vector<CacheEntryInfo> all = cache.list();
  REQUIRE(all.size() == 3);
  for (const CacheEntryInfo& info : all) {
    INFO(info.hex << ": " << info.problem);
    if (info.hex == key_for(0).hex) CHECK(info.problem == "format version 7, this attnjit reads version 1");
    if (info.hex == key_for(1).hex) CHECK(info.problem == "payload checksum mismatch");
    if (info.hex == key_for(2).hex) CHECK((info.valid && info.problem.empty()));
  }
}

TEST_CASE("kernel cache in a directory that cannot be created works in memory with one warning", "[cache]") {
  TempDir tmp;
  write_bytes(tmp.path + "/file", {1, 2, 3});
  for (const std::string& dir : {tmp.path + "/file/cache", tmp.path + "/file"}) {
    INFO(dir);
    StderrCapture err;
    KernelCache cache(dir, 1 << 20);
    CHECK_FALSE(cache.disk_enabled());
    CHECK_FALSE(cache.disk_writable());
    for (int i = 0; i < 3; ++i) cache.put(key_for(i), payload_for(i), "k", "sm_80");
    for (int i = 0; i < 3; ++i) CHECK(cache.get(key_for(i)) == payload_for(i));
    CHECK(cache.list().empty());
    const std::string text = err.text();
    if (warnings_shown()) {
      CHECK(count_of(text, "attnjit: warning:") == 1);
      CHECK_THAT(text, Catch::Contains(dir) && Catch::Contains("ATTNJIT_CACHE_DIR"));
    }
  }
  CHECK(files_in(tmp.path) == std::vector<std::string>{"file"});
}

TEST_CASE("kernel cache in a read-only directory reads entries and keeps new ones in memory", "[cache]") {
  TempDir tmp;
  KernelCache(tmp.path, 1 << 20).put(key_for(0), payload_for(0), "k", "sm_80");
  REQUIRE(::chmod(tmp.path.c_str(), 0555) == 0);
  // root writes through mode bits; the "cannot be created" test covers that case.
  const std::string probe = tmp.path + "/probe";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT, 0644);
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
    WARN("running as root: chmod 0555 does not stop writes, read-only case not tested");
    return;
  }
  StderrCapture err;
  KernelCache cache(tmp.path, 1 << 20);
  CHECK(cache.disk_enabled());
  CHECK_FALSE(cache.disk_writable());
  CHECK(cache.get(key_for(0)) == payload_for(0));
  for (int i = 1; i < 4; ++i) cache.put(key_for(i), payload_for(i), "k", "sm_80");
  for (int i = 1; i < 4; ++i) CHECK(cache.get(key_for(i)) == payload_for(i));
  CHECK(files_in(tmp.path).size() == 1);
  const std::string text = err.text();
  if (warnings_shown()) CHECK(count_of(text, "attnjit: warning:") == 1);
}

TEST_CASE("kernel cache with a directory in an entry's place keeps that kernel in memory and writes the others", "[cache]") {
  TempDir tmp;
  REQUIRE(std::filesystem::create_directories(entry_file(tmp.path, key_for(0)) + "/x"));  // not empty: rename cannot replace it
  StderrCapture err;
  KernelCache cache(tmp.path, 1 << 20);
  for (int i = 0; i < 3; ++i) cache.put(key_for(i), payload_for(i), "k", "sm_80");
  for (int i = 0; i < 3; ++i) CHECK(cache.get(key_for(i)) == payload_for(i));
  CHECK(cache.disk_writable());  // the entry's problem, not the cache's
  for (int i = 1; i < 3; ++i) CHECK(std::filesystem::is_regular_file(entry_file(tmp.path, key_for(i))));
  const std::string text = err.text();
  if (warnings_shown()) {
    CHECK_THAT(text, Catch::Contains(entry_file(tmp.path, key_for(0)) + " is a directory"));
    CHECK_THAT(text, !Catch::Contains("not writable"));
  }
}

TEST_CASE("kernel cache evicts least recently used entries above its cap", "[cache]") {
  TempDir tmp;
  const int64_t entry_bytes = static_cast<int64_t>(encode_cache_entry(key_for(0).hex, payload_for(0), "k", "sm_90a").size());
  KernelCache cache(tmp.path, entry_bytes * 3 + entry_bytes / 2);  // room for three entries
  for (int i = 0; i < 3; ++i) cache.put(key_for(i), payload_for(i), "k", "sm_90a");
  for (int i = 0; i < 3; ++i) set_mtime(entry_file(tmp.path, key_for(i)), 1000000 + i * 1000);  // 0 oldest

  // A disk hit (a fresh cache, so not from memory) makes entry 0 the most recently used.
  CHECK(KernelCache(tmp.path, 1 << 30).get(key_for(0)) == payload_for(0));
  CHECK(mtime_of(entry_file(tmp.path, key_for(0))) > 1000000 + 2000);

  cache.put(key_for(3), payload_for(3), "k", "sm_90a");
  CHECK(fs::exists(entry_file(tmp.path, key_for(0))));
  CHECK_FALSE(fs::exists(entry_file(tmp.path, key_for(1))));  // least recently used
  CHECK(fs::exists(entry_file(tmp.path, key_for(2))));
  CHECK(fs::exists(entry_file(tmp.path, key_for(3))));
  CHECK(cache.stats().bytes == 3 * entry_bytes);

  // Evicted entries still hit from memory in the process that had them.
  CHECK(cache.get(key_for(1)) == payload_for(1));

  // Under a cap smaller than one entry, the entry just written is the one that stays.
  for (int i = 0; i < 4; ++i) {
    if (fs::exists(entry_file(tmp.path, key_for(i)))) set_mtime(entry_file(tmp.path, key_for(i)), 4000000000);
  }
  KernelCache tiny(tmp.path, 10);
  tiny.put(key_for(5), payload_for(5), "k", "sm_90a");
  CHECK(files_in(tmp.path) == std::vector<std::string>{key_for(5).hex + ".ajk"});
}

TEST_CASE("kernel cache shared by concurrent processes stays valid", "[cache]") {
  TempDir tmp;
  constexpr int kChildren = 6, kKeys = 3, kRounds = 20;
  attnjit::testing::run_processes_at_once(kChildren, [&](int) {
    int status = 0;
    KernelCache writer(tmp.path, 1 << 30);
    for (int r = 0; r < kRounds; ++r) {
      for (int k = 0; k < kKeys; ++k) {
        writer.put(key_for(k), payload_for(k), "attn_fwd", "sm_90a");
        KernelCache reader(tmp.path, 1 << 30);  // fresh memory: this get reads the disk
        if (reader.get(key_for(k)) != payload_for(k)) status = 1;
        if (reader.stats().corrupt != 0) status = 2;
      }
    }
    if (!writer.disk_writable()) status = 3;
    return status;
  });
  std::vector<std::string> expected;
  for (int k = 0; k < kKeys; ++k) expected.push_back(key_for(k).hex + ".ajk");
  std::sort(expected.begin(), expected.end());
  CHECK(files_in(tmp.path) == expected);  // no temp files left behind
  KernelCache check(tmp.path, 1 << 30);
  CHECK(check.verify_all(nullptr) == 0);
  for (int k = 0; k < kKeys; ++k) CHECK(check.get(key_for(k)) == payload_for(k));
}

TEST_CASE("kernel cache shared by threads stays valid", "[cache]") {
  TempDir tmp;
  constexpr int kThreads = 8, kKeys = 5, kRounds = 30;
  KernelCache shared(tmp.path, 1 << 30);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      KernelCache own(tmp.path, 1 << 30);
      for (int r = 0; r < kRounds; ++r) {
        const int k = (t + r) % kKeys;
        KernelCache& cache = r % 2 == 0 ? shared : own;
        cache.put(key_for(k), payload_for(k), "attn_fwd", "sm_90a");
        if (cache.get(key_for(k)) != payload_for(k)) ++failures;
        if (KernelCache(tmp.path, 1 << 30).get(key_for((k + 1) % kKeys)).value_or(payload_for((k + 1) % kKeys)) !=
            payload_for((k + 1) % kKeys)) {
          ++failures;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  CHECK(failures == 0);
  CHECK(files_in(tmp.path).size() == kKeys);
  CHECK(shared.verify_all(nullptr) == 0);
  CHECK(shared.stats().corrupt == 0);
}

TEST_CASE("kernel cache clear removes only its own files", "[cache]") {
  TempDir tmp;
  KernelCache cache(tmp.path, 1 << 30);
  for (int i = 0; i < 3; ++i) cache.put(key_for(i), payload_for(i), "k", "sm_90a");
  const std::string stale = tmp.path + "/" + key_for(7).hex + ".ajk.tmp.123.abc.0";
  const std::string fresh = tmp.path + "/" + key_for(8).hex + ".ajk.tmp.123.abc.1";
  write_bytes(stale, {1});
  write_bytes(fresh, {1});
  set_mtime(stale, 1000);  // a writer that died long ago
  write_bytes(tmp.path + "/notes.txt", {1});
  write_bytes(tmp.path + "/ABC.ajk", {1});
  cache.clear();
  // A young temp file may belong to a writer about to rename it, so it stays.
  CHECK(files_in(tmp.path) == std::vector<std::string>{fs::path(fresh).filename().string(), "ABC.ajk", "notes.txt"});
  CHECK_FALSE(cache.get(key_for(0)).has_value());  // the memory layer is cleared too
}

// The entry format is pinned by a file committed in tests/unit/golden/. If this test fails, the
// format changed: bump kCacheFormatVersion (old caches then miss instead of misreading) and
// regenerate the golden deliberately with: attnjit_unit_tests "[regenerate-golden]"
namespace {

const std::string kGoldenPath = fs::path(__FILE__).parent_path().string() + "/golden/kernel_cache_entry_v1.ajk";

CacheKey golden_key() {
  return make_cache_key({"0.1.0", sha256_hex("golden templates"), sha256_hex("golden source"),
                         "-arch=sm_90a -std=c++17 -default-device", "12.4", "sm_90a"});
}

Bytes golden_payload() {
  Bytes b(300);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>((i * 37 + 11) & 0xff);
  return b;
}

}  // namespace

TEST_CASE("kernel cache golden entry reads back", "[cache]") {
  const Bytes golden = read_bytes(kGoldenPath);
  REQUIRE_FALSE(golden.empty());
  TempDir tmp;
  write_bytes(entry_file(tmp.path, golden_key()), golden);
  KernelCache cache(tmp.path, 1 << 20);
  CHECK(cache.get(golden_key()) == golden_payload());
  CHECK(cache.stats().disk_hits == 1);
  std::vector<CacheEntryInfo> entries = cache.list();
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].kernel_name == "attnjit_golden_kernel");
  CHECK(entries[0].arch == "sm_90a");
}

TEST_CASE("kernel cache writes the golden entry byte for byte", "[cache]") {
  TempDir tmp;
  KernelCache(tmp.path, 1 << 20).put(golden_key(), golden_payload(), "attnjit_golden_kernel", "sm_90a");
  CHECK(read_bytes(entry_file(tmp.path, golden_key())) == read_bytes(kGoldenPath));
}

TEST_CASE("kernel cache golden regeneration", "[.][regenerate-golden]") {
  write_bytes(kGoldenPath, encode_cache_entry(golden_key().hex, golden_payload(), "attnjit_golden_kernel", "sm_90a"));
}

TEST_CASE("make_cache_key covers every part", "[cache]") {
  const CacheKeyParts base{"0.1.0", "tmpl", "src", "-O3 -arch=sm_90a", "12.4", "sm_90a"};
  const CacheKey key = make_cache_key(base);
  CHECK(key.text ==
        "format=1\nattnjit_version=0.1.0\ntemplate_hash=tmpl\nsource_hash=src\noptions=-O3 -arch=sm_90a\n"
        "nvrtc_version=12.4\narch=sm_90a\n");
  CHECK(key.hex == sha256_hex(key.text));
  CHECK(make_cache_key(base).hex == key.hex);

  std::vector<std::string CacheKeyParts::*> fields = {&CacheKeyParts::attnjit_version, &CacheKeyParts::template_hash,
                                                      &CacheKeyParts::source_hash,     &CacheKeyParts::options,
                                                      &CacheKeyParts::nvrtc_version,   &CacheKeyParts::arch};
  for (auto field : fields) {
    CacheKeyParts changed = base;
    changed.*field += "x";
    CHECK(make_cache_key(changed).hex != key.hex);
  }
  // A value cannot forge another field's line.
  CacheKeyParts forged = base;
  forged.options = "-O3\narch=sm_80";
  CacheKeyParts other = base;
  other.options = "-O3";
  other.arch = "sm_80";
  CHECK(make_cache_key(forged).hex != make_cache_key(other).hex);
  CHECK(count_of(make_cache_key(forged).text, "\n") == 7);
}
