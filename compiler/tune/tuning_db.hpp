// The tuning database (docs/architecture.md, "Tune"): tuning results as JSON files,
// one per GPU model, looked up by TuneKey with a fallback to the nearest sequence bucket and then
// to the default config. The user's file (in the cache directory) comes first, the shipped one
// (autotune_db/) second.
//
//   {"attnjit_tuning_db": 1,
//    "metadata": {"attnjit_version", "nvrtc_version", "driver_version", "gpu", "sm_count", "arch"},
//    "entries": [{"key": {"gpu", "sm_count", "arch", "pattern_signature", "head_dim", "head_dim_v",
//                         "dtype", "seq_bucket", "pass": "forward" | "backward" (absent: forward)},
//                 "best": {"tile_q", "tile_k", "stages"}, "best_ms", "default_ms",
//                 "candidates": [{"config": {...}, "status", "median_ms", "p20_ms", "p80_ms"}],
//                 "tuned_at": "2025-01-31T12:00:00Z", "templates": "<hash>"}]}
//
// Times that are +inf (pruned or failed candidates) are written as null. Entries tuned with another
// attnjit version or NVRTC major version are untrusted: the kernels they timed may differ from today's.
// Each entry also records the hash of the kernel templates it was timed with ("templates"); an
// entry of other templates is stale: lookups skip it (one warning per file and process), `attnjit
// tune --show` marks it and `attnjit tune --refresh` retimes exactly such keys. An entry without
// the field (written before it existed) is used as it is and shown as "templates unknown". Writers
// lock <file>.lock, re-read, merge and rename a temp file into place; readers take no lock.
#pragma once

#include <string>
#include <vector>

#include "compiler/support/knobs.hpp"
#include "compiler/tune/autotune.hpp"

namespace attnjit {

constexpr int kTuningDbFormatVersion = 1;

struct DbMetadata {
  std::string attnjit_version, nvrtc_version;
  int driver_version = 0;
  std::string gpu;
  int sm_count = 0, arch = 0;
  std::string templates;  // the kernel templates' hash (per entry in the file, not in its metadata)
};

// This build's attnjit version and the version of the NVRTC that compiles for `arch` (90 for
// sm_90; 0: the newest found), "none" without one; no GPU fields.
DbMetadata running_metadata(int arch = 0);

struct DbEntry {
  TuneKey key;
  TuneResult result;  // wall_s is not stored (0 when read)
  std::string tuned_at;
  std::string problem;  // why the entry cannot be used (see DbFile::invalid); empty when it can
  std::string templates;  // the templates' hash it was timed with; empty: not recorded (older files)
};

// One database file as read.
struct DbFile {
  std::string path;
  bool present = false;  // the file exists and parsed
  std::string problem;   // why it was ignored (malformed), empty otherwise
  bool trusted = false;  // present and its metadata matches the running versions
  DbMetadata metadata;
  std::vector<DbEntry> entries;
  // Entries that parse but cannot be used: an integer out of its field's range (a tile of 2^32 + 64,
  // never read as 64), a time that is negative (or a best time that is null), a best (or a timed
  // candidate) that is not a configuration the kernels can be built with for the entry's key, e.g.
  // a negative tile, or a key an earlier entry of the file already has. Kept out of `entries`, so
  // no lookup or precompile uses them; their `problem` names the JSON path and what is wrong.
  std::vector<DbEntry> invalid;
  // Each invalid entry's JSON as read, which record() writes back unchanged (an integer out of
  // range is read as 0, which must never be written as if it were the entry's value).
  std::vector<std::string> invalid_json;
};

struct LookupResult {
  KernelConfig config;  // zeros for the heuristic (resolve_config's default)
  enum class Source { Exact, NearestBucket, Heuristic } source = Source::Heuristic;
  std::string file;  // where the entry came from; empty for the heuristic
  std::string why;   // one line for logs and `attnjit tune --show`
};
const char* to_string(LookupResult::Source s);  // "exact", "nearest bucket", "heuristic"

class TuningDb {
public:
  // Reads every file now (a missing file is empty, a malformed one is one warning and ignored, an
  // invalid entry one warning naming the file and the key, and skipped).
  // Files earlier in the list take precedence: the user's first, then shipped ones.
  explicit TuningDb(std::vector<std::string> files, DbMetadata current = running_metadata());

  // The exact key (first file that has it), else the nearest sequence bucket (log distance, ties
  // to the smaller bucket, then to the earlier file) with the same GPU, arch, SM count, pattern,
  // head dims and dtype, else the heuristic default. Untrusted files are skipped (and `why` says so).
  LookupResult lookup(const TuneKey& key) const;

  // True when no trusted file holds the exact key (a miss, or only a stale entry): with tuning on
  // (knobs().tune) the runtime tunes and records it.
  bool needs_retune(const TuneKey& key) const;

  // Whether `e` was timed with other kernel templates than this build's (not when unrecorded).
  bool stale(const DbEntry& e) const;

  // Adds or replaces the entry for `key` in `file` (created with its directory if missing) under an
  // exclusive lock on <file>.lock: re-reads the file, merges by key (this entry, the newest, wins;
  // the others are kept), writes a temp file and renames it into place. A file with different
  // metadata versions is started afresh (its entries were untrusted anyway); a malformed one is
  // moved aside to <file>.corrupt with a warning. UserError when the file cannot be written.
  // The in-memory copy of `file`, when it is one of this database's files, is refreshed.
  void record(const std::string& file, const TuneKey& key, const TuneResult& result, const DbMetadata& metadata);

  const std::vector<DbFile>& files() const { return files_; }
  const DbMetadata& current() const { return current_; }

private:
  std::vector<DbFile> files_;
  DbMetadata current_;
};

// Parses one file's text; `problem` names the JSON path of the first thing wrong. For tests and tools.
DbFile parse_tuning_db(const std::string& path, const std::string& text, const DbMetadata& current);
std::string serialize_tuning_db(const DbMetadata& metadata, const std::vector<DbEntry>& entries);

// "NVIDIA H100 80GB HBM3" -> "NVIDIA_H100_80GB_HBM3": a file name for a GPU model.
std::string sanitize_gpu_name(const std::string& gpu);

// The shipped tuning databases' folder: the ATTNJIT_SHIPPED_DB_DIR knob (default the repository's
// autotune_db/, the ATTNJIT_AUTOTUNE_DB_DIR compile definition); "" for "none".
std::string shipped_db_dir();

// The files to consult for a GPU: <cache_dir>/tuning/<gpu>.json (the user's, written by
// `attnjit tune`), then <shipped_dir>/<gpu>.json.
std::vector<std::string> default_db_files(const Knobs& knobs, const std::string& gpu,
                                          const std::string& shipped_dir = shipped_db_dir());

}  // namespace attnjit
