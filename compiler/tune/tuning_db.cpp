// The tuning database: JSON files, lookup with fallbacks, locked read-merge-write. See tuning_db.hpp.
#include "compiler/tune/tuning_db.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "compiler/codegen/templates.hpp"
#include "compiler/nvrtc/nvrtc_compiler.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/read_file.hpp"

namespace attnjit {

using json = nlohmann::json;
namespace fs = std::filesystem;

const char* to_string(LookupResult::Source s) {
  switch (s) {
    case LookupResult::Source::Exact: return "exact";
    case LookupResult::Source::NearestBucket: return "nearest bucket";
    case LookupResult::Source::Heuristic: return "heuristic";
  }
  return "?";
}

DbMetadata running_metadata(int arch) {
  DbMetadata m;
  m.attnjit_version = ATTNJIT_VERSION;
  m.templates = TemplateSet::embedded().hash();
  m.nvrtc_version = arch > 0 ? nvrtc_version_for("sm_" + std::to_string(arch)) : nvrtc_available() ? nvrtc_version() : "";
  if (m.nvrtc_version.empty()) m.nvrtc_version = "none";
  return m;
}

namespace {

// ---- JSON <-> structs ---------------------------------------------------------------------

// The first thing wrong in a file, as a JSON pointer and a message.
struct Malformed {
  std::string where, what;
};

const json& field(const json& obj, const std::string& name, const std::string& at) {
  if (!obj.is_object()) throw Malformed{at, "expected an object"};
  auto it = obj.find(name);
  if (it == obj.end()) throw Malformed{at + "/" + name, "missing"};
  return *it;
}
int64_t get_int(const json& obj, const std::string& name, const std::string& at) {
  const json& v = field(obj, name, at);
  if (!v.is_number_integer()) throw Malformed{at + "/" + name, "expected an integer"};
  // Above INT64_MAX nlohmann holds an unsigned value, which get<int64_t>() would wrap.
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX})
    throw Malformed{at + "/" + name, v.dump() + " is out of range (at most " + std::to_string(INT64_MAX) + ")"};
  return v.get<int64_t>();
}
// An integer field read into an int: checked before narrowing, so 4294967360 is never read as 64.
// Out of range, `range` (when still empty) gets the JSON path and the value, which makes the entry
// invalid, and 0 is returned.
int get_int32(const json& obj, const std::string& name, const std::string& at, std::string& range) {
  const json& v = field(obj, name, at);
  if (!v.is_number_integer()) throw Malformed{at + "/" + name, "expected an integer"};
  const bool too_large = v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t{INT32_MAX} : v.get<int64_t>() > INT32_MAX;
  const bool too_small = !v.is_number_unsigned() && v.get<int64_t>() < INT32_MIN;
  if (!too_large && !too_small) return static_cast<int>(v.get<int64_t>());
  if (range.empty())
    range = at + "/" + name + ": " + v.dump() + " is out of range (at " +
            (too_large ? "most " + std::to_string(INT32_MAX) : "least " + std::to_string(INT32_MIN)) + ")";
  return 0;
}
std::string get_string(const json& obj, const std::string& name, const std::string& at) {
  const json& v = field(obj, name, at);
  if (!v.is_string()) throw Malformed{at + "/" + name, "expected a string"};
  return v.get<std::string>();
}
// Milliseconds: a number, or null for +inf.
double get_ms(const json& obj, const std::string& name, const std::string& at) {
  const json& v = field(obj, name, at);
  if (v.is_null()) return kInfMs;
  if (!v.is_number()) throw Malformed{at + "/" + name, "expected a number or null"};
  return v.get<double>();
}
json ms_json(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json config_json(const KernelConfig& c) {
  return {{"tile_q", c.tile_q}, {"tile_k", c.tile_k}, {"stages", c.stages}, {"warps", c.warps}};
}
// "warps" may be absent (databases written before it existed measured the default, 0).
KernelConfig read_config(const json& j, const std::string& at, std::string& range) {
  KernelConfig c;
  c.tile_q = get_int32(j, "tile_q", at, range);
  c.tile_k = get_int32(j, "tile_k", at, range);
  c.stages = get_int32(j, "stages", at, range);
  if (j.is_object() && j.contains("warps")) c.warps = get_int32(j, "warps", at, range);
  return c;
}

json key_json(const TuneKey& k) {
  json j = {{"gpu", k.gpu},           {"sm_count", k.sm_count},     {"arch", k.arch},
            {"pattern_signature", k.pattern_signature}, {"head_dim", k.head_dim}, {"head_dim_v", k.head_dim_v},
            {"dtype", to_string(k.dtype)}, {"seq_bucket", k.seq_bucket}, {"pass", k.backward ? "backward" : "forward"}};
  // Only where set: the portable kernels' entries read as they did before the field existed.
  if (k.arch_specific) j["arch_specific"] = true;
  return j;
}
TuneKey read_key(const json& j, const std::string& at, std::string& range) {
  TuneKey k;
  k.gpu = get_string(j, "gpu", at);
  k.sm_count = get_int32(j, "sm_count", at, range);
  k.arch = get_int32(j, "arch", at, range);
  k.pattern_signature = get_string(j, "pattern_signature", at);
  k.head_dim = get_int32(j, "head_dim", at, range);
  k.head_dim_v = get_int32(j, "head_dim_v", at, range);
  try {
    k.dtype = parse_dtype(get_string(j, "dtype", at));
  } catch (const UserError&) {
    throw Malformed{at + "/dtype", "expected fp32, fp16 or bf16"};
  }
  k.seq_bucket = get_int(j, "seq_bucket", at);
  // "pass" came with the backward kernels; entries written before it are the forward's.
  const std::string pass = j.contains("pass") ? get_string(j, "pass", at) : "forward";
  if (pass != "forward" && pass != "backward") throw Malformed{at + "/pass", "expected \"forward\" or \"backward\""};
  k.backward = pass == "backward";
  // "arch_specific" came with the Hopper path; entries without it are the portable kernels'.
  if (j.contains("arch_specific")) {
    if (!j["arch_specific"].is_boolean()) throw Malformed{at + "/arch_specific", "expected true or false"};
    k.arch_specific = j["arch_specific"].get<bool>();
  }
  return k;
}

json entry_json(const DbEntry& e) {
  json cands = json::array();
  for (const CandidateResult& c : e.result.candidates) {
    cands.push_back({{"config", config_json(c.config)}, {"status", c.status}, {"median_ms", ms_json(c.median_ms)},
                     {"p20_ms", ms_json(c.p20_ms)}, {"p80_ms", ms_json(c.p80_ms)}});
  }
  json out = {{"key", key_json(e.key)},
              {"best", config_json(e.result.best)},
              {"best_ms", ms_json(e.result.best_ms)},
              {"default_ms", ms_json(e.result.default_ms)},
              {"candidates", std::move(cands)},
              {"tuned_at", e.tuned_at}};
  if (!e.templates.empty()) out["templates"] = e.templates;
  return out;
}
// An entry with an integer out of range (see get_int32) comes back with its `problem` set.
DbEntry read_entry(const json& j, const std::string& at) {
  DbEntry e;
  std::string range;
  e.key = read_key(field(j, "key", at), at + "/key", range);
  e.result.best = read_config(field(j, "best", at), at + "/best", range);
  e.result.best_ms = get_ms(j, "best_ms", at);
  e.result.default_ms = get_ms(j, "default_ms", at);
  e.tuned_at = get_string(j, "tuned_at", at);
  if (j.contains("templates")) e.templates = get_string(j, "templates", at);
  const json& cands = field(j, "candidates", at);
  if (!cands.is_array()) throw Malformed{at + "/candidates", "expected an array"};
  for (size_t n = 0; n < cands.size(); ++n) {
    const std::string c_at = at + "/candidates/" + std::to_string(n);
    CandidateResult c;
    c.config = read_config(field(cands[n], "config", c_at), c_at + "/config", range);
    c.status = get_string(cands[n], "status", c_at);
    c.median_ms = get_ms(cands[n], "median_ms", c_at);
    c.p20_ms = get_ms(cands[n], "p20_ms", c_at);
    c.p80_ms = get_ms(cands[n], "p80_ms", c_at);
    e.result.candidates.push_back(std::move(c));
  }
  e.problem = range;
  return e;
}

// Why the entry's times cannot be right, or "": a time is a number of milliseconds >= 0, or null
// for none (a candidate that failed or was pruned, a default that did not run); the best
// configuration was timed, so its time is a number.
std::string times_problem(const DbEntry& e, const std::string& at) {
  auto bad = [](double ms) { return std::isnan(ms) || ms < 0; };
  if (bad(e.result.best_ms) || !std::isfinite(e.result.best_ms))
    return at + "/best_ms: the best configuration's time must be a number of milliseconds >= 0, got " + ms_json(e.result.best_ms).dump();
  if (bad(e.result.default_ms)) return at + "/default_ms: a time must be >= 0 ms (or null: none), got " + ms_json(e.result.default_ms).dump();
  for (size_t n = 0; n < e.result.candidates.size(); ++n) {
    const CandidateResult& c = e.result.candidates[n];
    const std::pair<const char*, double> times[] = {{"median_ms", c.median_ms}, {"p20_ms", c.p20_ms}, {"p80_ms", c.p80_ms}};
    for (const auto& [name, ms] : times)
      if (bad(ms))
        return at + "/candidates/" + std::to_string(n) + "/" + name + ": a time must be >= 0 ms (or null: none), got " +
               ms_json(ms).dump();
  }
  return "";
}

// Why `c` cannot be built for `key`'s kernels (the codegen's own checks), or "".
std::string config_problem(const TuneKey& key, const KernelConfig& c) {
  KernelRequest r;
  r.head_dim = key.head_dim;
  r.head_dim_v = key.head_dim_v;
  r.dtype = key.dtype;
  r.arch = key.arch;
  r.arch_specific = key.arch_specific;
  r.config = c;
  try {
    if (key.backward) resolve_backward_config(r);
    else resolve_config(r);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// Why the entry at `at` cannot be used: its best, or a candidate timed "ok" (precompile's --top-k
// builds those), is no configuration for its key. "" when it can.
std::string entry_problem(const DbEntry& e, const std::string& at) {
  std::string why = config_problem(e.key, e.result.best);
  if (!why.empty()) return at + "/best: " + why;
  for (size_t n = 0; n < e.result.candidates.size(); ++n) {
    const CandidateResult& c = e.result.candidates[n];
    if (c.status != "ok") continue;
    why = config_problem(e.key, c.config);
    if (!why.empty()) return at + "/candidates/" + std::to_string(n) + "/config: " + why;
  }
  return "";
}

auto key_order(const TuneKey& k) {
  return std::tie(k.gpu, k.sm_count, k.arch, k.pattern_signature, k.head_dim, k.head_dim_v, k.dtype, k.backward, k.arch_specific,
                  k.seq_bucket);
}

// "13.2" -> "13": a minor NVRTC release keeps the code a tile choice was timed on close enough (and
// several NVRTCs of one major version are often installed side by side: the toolkit's, PyPI's).
std::string nvrtc_major(const std::string& version) { return version.substr(0, version.find('.')); }

bool same_versions(const DbMetadata& a, const DbMetadata& b) {
  return a.attnjit_version == b.attnjit_version && nvrtc_major(a.nvrtc_version) == nvrtc_major(b.nvrtc_version);
}

// ---- files --------------------------------------------------------------------------------

// nullopt when the file does not exist; *problem set when it exists but cannot be read.
std::optional<std::string> read_text(const std::string& path, std::string* problem) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  try {
    return read_small_file(path, "tuning database");  // a regular file of sane size only
  } catch (const UserError& e) {
    *problem = e.message();
    return std::string();
  }
}

DbFile load_file(const std::string& path, const DbMetadata& current) {
  std::string problem;
  const std::optional<std::string> text = read_text(path, &problem);
  DbFile f;
  f.path = path;
  if (!text) return f;  // no file: nothing tuned yet
  if (problem.empty()) f = parse_tuning_db(path, *text, current);
  else f.problem = problem;
  if (!f.problem.empty()) {
    log(LogLevel::Warn, "tuning database " + path + " is malformed (" + f.problem +
                            "); ignoring it. Fix or delete it; `attnjit tune` writes a new one");
  }
  for (const DbEntry& e : f.invalid) {
    log(LogLevel::Warn, "tuning database " + path + ": skipping the entry for " + e.key.describe() + " (" + e.problem +
                            "); fix or delete it, or re-tune that key with `attnjit tune`");
  }
  return f;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Holds an exclusive flock on a lock file until destroyed.
class FileLock {
public:
  explicit FileLock(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw UserError(path, std::string("cannot open the lock file: ") + std::strerror(errno));
    int rc;
    while ((rc = ::flock(fd_, LOCK_EX)) != 0 && errno == EINTR) {
    }
    if (rc != 0) {
      const int err = errno;
      ::close(fd_);
      throw UserError(path, std::string("cannot lock: ") + std::strerror(err));
    }
  }
  ~FileLock() { ::close(fd_); }  // closing releases the lock
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

private:
  int fd_ = -1;
};

// Writes `text` to a temp file next to `path` and renames it into place: readers see the old file
// or the new one, never a half-written one.
void write_atomically(const std::string& path, const std::string& text) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError(path, std::string("cannot write the tuning database: ") + std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw UserError(path, std::string("cannot write the tuning database: ") + std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw UserError(path, std::string("cannot replace the tuning database: ") + std::strerror(err));
  }
}

}  // namespace

DbFile parse_tuning_db(const std::string& path, const std::string& text, const DbMetadata& current) {
  DbFile f;
  f.path = path;
  try {
    const json j = json::parse(text);
    if (!j.is_object() || !j.contains("attnjit_tuning_db")) throw Malformed{"", "not an attnjit tuning database"};
    const int64_t version = get_int(j, "attnjit_tuning_db", "");
    if (version != kTuningDbFormatVersion)
      throw Malformed{"/attnjit_tuning_db", "format " + std::to_string(version) + ", this attnjit reads format " +
                                                std::to_string(kTuningDbFormatVersion)};
    const json& m = field(j, "metadata", "");
    f.metadata.attnjit_version = get_string(m, "attnjit_version", "/metadata");
    f.metadata.nvrtc_version = get_string(m, "nvrtc_version", "/metadata");
    std::string range;  // the metadata's integers: one out of range makes the file malformed
    f.metadata.driver_version = get_int32(m, "driver_version", "/metadata", range);
    f.metadata.gpu = get_string(m, "gpu", "/metadata");
    f.metadata.sm_count = get_int32(m, "sm_count", "/metadata", range);
    f.metadata.arch = get_int32(m, "arch", "/metadata", range);
    if (!range.empty()) throw Malformed{"", range};
    const json& entries = field(j, "entries", "");
    if (!entries.is_array()) throw Malformed{"/entries", "expected an array"};
    std::vector<std::string> valid_at;  // f.entries' JSON paths
    for (size_t n = 0; n < entries.size(); ++n) {
      const std::string at = "/entries/" + std::to_string(n);
      DbEntry e = read_entry(entries[n], at);
      if (e.problem.empty()) e.problem = times_problem(e, at);
      if (e.problem.empty()) e.problem = entry_problem(e, at);
      // A key given twice: lookups take the first, so the second is reported and skipped.
      for (size_t m2 = 0; m2 < f.entries.size() && e.problem.empty(); ++m2)
        if (f.entries[m2].key == e.key)
          e.problem = at + "/key: the same key as " + valid_at[m2] + ", which lookups use; delete one of the two";
      if (e.problem.empty()) {
        valid_at.push_back(at);
        f.entries.push_back(std::move(e));
      } else {
        f.invalid.push_back(std::move(e));
        f.invalid_json.push_back(entries[n].dump());
      }
    }
  } catch (const json::exception& e) {
    f.problem = std::string("invalid JSON: ") + e.what();
  } catch (const Malformed& m) {
    f.problem = (m.where.empty() ? "" : m.where + ": ") + m.what;
  }
  if (!f.problem.empty()) {
    f.entries.clear();
    f.invalid.clear();
    f.invalid_json.clear();
    return f;
  }
  f.present = true;
  f.trusted = same_versions(f.metadata, current);
  return f;
}

namespace {
json tuning_db_json(const DbMetadata& m, const std::vector<DbEntry>& entries) {
  json out = {{"attnjit_tuning_db", kTuningDbFormatVersion},
              {"metadata",
               {{"attnjit_version", m.attnjit_version},
                {"nvrtc_version", m.nvrtc_version},
                {"driver_version", m.driver_version},
                {"gpu", m.gpu},
                {"sm_count", m.sm_count},
                {"arch", m.arch}}},
              {"entries", json::array()}};
  for (const DbEntry& e : entries) out["entries"].push_back(entry_json(e));
  return out;
}
}  // namespace

std::string serialize_tuning_db(const DbMetadata& m, const std::vector<DbEntry>& entries) {
  return tuning_db_json(m, entries).dump(1) + "\n";
}

TuningDb::TuningDb(std::vector<std::string> files, DbMetadata current) : current_(std::move(current)) {
  for (const std::string& path : files) files_.push_back(load_file(path, current_));
}

bool TuningDb::stale(const DbEntry& e) const {
  return !e.templates.empty() && !current_.templates.empty() && e.templates != current_.templates;
}

LookupResult TuningDb::lookup(const TuneKey& key) const {
  std::string ignored;
  // Entries timed with other kernel templates: one warning per file and process.
  static std::mutex warned_mutex;
  static std::set<std::string> warned;
  for (const DbFile& f : files_) {
    if (!f.trusted) continue;
    const size_t n = static_cast<size_t>(std::count_if(f.entries.begin(), f.entries.end(), [&](const DbEntry& e) { return stale(e); }));
    if (n == 0) continue;
    const std::lock_guard<std::mutex> lock(warned_mutex);
    if (warned.insert(f.path).second)
      log(LogLevel::Warn, "tuning database " + f.path + ": " + std::to_string(n) +
                              " entries were timed with other kernel templates and are ignored; `attnjit tune SPEC --refresh` "
                              "retimes them");
  }
  for (const DbFile& f : files_) {
    if (f.present && !f.trusted && !f.entries.empty()) {
      ignored += "; ignored " + f.path + " (tuned with attnjit " + f.metadata.attnjit_version + ", NVRTC " +
                 f.metadata.nvrtc_version + "; running attnjit " + current_.attnjit_version + ", NVRTC " +
                 current_.nvrtc_version + ": re-tune with `attnjit tune`)";
    }
  }
  for (const DbFile& f : files_) {
    if (!f.trusted) continue;
    for (const DbEntry& e : f.entries) {
      if (!(e.key == key)) continue;
      if (stale(e)) {
        ignored += "; ignored the entry in " + f.path + " (timed with other kernel templates: `attnjit tune --refresh`)";
        continue;
      }
      return {e.result.best, LookupResult::Source::Exact, f.path, "tuned for " + key.describe() + " in " + f.path + ignored};
    }
  }
  // Nearest bucket by the ratio of the lengths (log distance), compared exactly as fractions.
  const DbEntry* best = nullptr;
  const DbFile* best_file = nullptr;
  auto ratio = [&](int64_t b) {
    return std::pair<int64_t, int64_t>{std::max(b, key.seq_bucket), std::min(b, key.seq_bucket)};
  };
  for (const DbFile& f : files_) {
    if (!f.trusted) continue;
    for (const DbEntry& e : f.entries) {
      TuneKey k = e.key;
      k.seq_bucket = key.seq_bucket;
      if (!(k == key) || e.key.seq_bucket < 1 || stale(e)) continue;
      if (best) {
        const auto [hi, lo] = ratio(e.key.seq_bucket);
        const auto [bhi, blo] = ratio(best->key.seq_bucket);
        const __int128 mine = static_cast<__int128>(hi) * blo, theirs = static_cast<__int128>(bhi) * lo;
        // Closer wins; at equal distance the smaller bucket; at the same bucket the earlier file.
        if (mine > theirs || (mine == theirs && e.key.seq_bucket >= best->key.seq_bucket)) continue;
      }
      best = &e;
      best_file = &f;
    }
  }
  if (best) {
    return {best->result.best, LookupResult::Source::NearestBucket, best_file->path,
            "no entry for seq bucket " + std::to_string(key.seq_bucket) + "; using the nearest tuned bucket " +
                std::to_string(best->key.seq_bucket) + " from " + best_file->path + ignored};
  }
  return {KernelConfig{}, LookupResult::Source::Heuristic, "",
          "no tuned entry for " + key.describe() + "; using the default config" + ignored};
}

bool TuningDb::needs_retune(const TuneKey& key) const {
  for (const DbFile& f : files_) {
    if (!f.trusted) continue;
    for (const DbEntry& e : f.entries)
      if (e.key == key && !stale(e)) return false;
  }
  return true;
}

void TuningDb::record(const std::string& file, const TuneKey& key, const TuneResult& result, const DbMetadata& metadata) {
  const fs::path dir = fs::path(file).parent_path();
  std::error_code ec;
  if (!dir.empty()) fs::create_directories(dir, ec);
  if (ec) throw UserError(file, "cannot create the directory " + dir.string() + ": " + ec.message());

  FileLock lock(file + ".lock");
  // Under the lock: what other processes wrote since we read is in the file now.
  std::vector<DbEntry> entries;
  std::vector<std::string> invalid;  // invalid entries as read, kept unless this entry replaces them
  std::string problem;
  if (const std::optional<std::string> text = read_text(file, &problem); text && problem.empty()) {
    DbFile old = parse_tuning_db(file, *text, metadata);
    if (!old.problem.empty()) {
      log(LogLevel::Warn, "tuning database " + file + " is malformed (" + old.problem + "); moving it to " + file +
                              ".corrupt and starting a new one");
      if (::rename(file.c_str(), (file + ".corrupt").c_str()) != 0)
        throw UserError(file, std::string("cannot move the malformed database aside: ") + std::strerror(errno));
    } else if (!old.trusted) {
      log(LogLevel::Info, "tuning database " + file + " was tuned with attnjit " + old.metadata.attnjit_version +
                              ", NVRTC " + old.metadata.nvrtc_version + "; starting it afresh for these versions");
    } else {
      // Invalid entries are kept as they were (they are skipped with a warning on every read).
      entries = std::move(old.entries);
      for (size_t n = 0; n < old.invalid.size(); ++n)
        if (!(old.invalid[n].key == key)) invalid.push_back(old.invalid_json[n]);
    }
  } else if (!problem.empty()) {
    throw UserError(file, problem);
  }

  DbEntry mine{key, result, utc_now(), {}, metadata.templates};
  mine.result.wall_s = 0;
  // This entry replaces every one of its key (a duplicate too).
  entries.erase(std::remove_if(entries.begin(), entries.end(), [&](const DbEntry& e) { return e.key == key; }), entries.end());
  entries.push_back(std::move(mine));
  std::sort(entries.begin(), entries.end(),
            [](const DbEntry& a, const DbEntry& b) { return key_order(a.key) < key_order(b.key); });
  json out = tuning_db_json(metadata, entries);
  for (const std::string& e : invalid) out["entries"].push_back(json::parse(e));
  const std::string text = out.dump(1) + "\n";
  write_atomically(file, text);

  for (DbFile& f : files_)
    if (f.path == file) f = parse_tuning_db(file, text, current_);
}

std::string sanitize_gpu_name(const std::string& gpu) {
  std::string out;
  for (char c : gpu) {
    const bool keep = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-';
    if (keep) out += c;
    else if (!out.empty() && out.back() != '_') out += '_';
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out.empty() ? "unknown_gpu" : out;
}

std::string shipped_db_dir() {
  const std::string& dir = knobs().shipped_db_dir;
  if (dir == "none") return "";
  // A folder named by ATTNJIT_SHIPPED_DB_DIR that is not one (a typo) would leave every lookup on
  // the defaults without a word: said once per process. The compiled-in default is left quiet.
  static std::once_flag warned;
  std::error_code ec;
  if (dir != default_shipped_db_dir() && !fs::is_directory(dir, ec))
    std::call_once(warned, [&] {
      log(LogLevel::Warn, "ATTNJIT_SHIPPED_DB_DIR=" + dir + " is not a folder, so no shipped tuning database is read; name the "
                          "folder that holds them, or none to read only your own");
    });
  return dir;
}

std::vector<std::string> default_db_files(const Knobs& knobs, const std::string& gpu, const std::string& shipped_dir) {
  const std::string name = sanitize_gpu_name(gpu) + ".json";
  std::vector<std::string> files;
  if (!knobs.cache_dir.empty()) files.push_back((fs::path(knobs.cache_dir) / "tuning" / name).string());
  if (!shipped_dir.empty()) files.push_back((fs::path(shipped_dir) / name).string());
  return files;
}

}  // namespace attnjit
