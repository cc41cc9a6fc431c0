// attnjit tune SPEC|MANIFEST: time the candidate kernel configs of each problem on this GPU and
// record the winners in the tuning database. attnjit tune --show: what the databases hold.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "compiler/driver/precompile.hpp"
#include "compiler/pattern/spec_json.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"
#include "compiler/support/parse_int.hpp"
#include "compiler/support/read_file.hpp"
#include "compiler/tune/tuning_db.hpp"
#include "runtime/cuda/cuda_probe.hpp"
#include "runtime/cuda/tuning_search.hpp"
#include "tools/cli_common.hpp"
#include "tools/commands.hpp"

namespace attnjit::cli {

namespace {

namespace fs = std::filesystem;

struct TuneOptions {
  std::string input, seqs = "4096", dtype = "bf16", db, cache_dir;
  int head_dim = kDefaultHeadDim, head_dim_v = 0, warmup = 3, iterations = 50;
  int64_t heads_q = 16, heads_kv = 0;  // heads_kv 0: heads_q
  double seconds = 2.0;
  bool show = false, backward = false, refresh = false;
  CLI::Option *head_dim_option = nullptr, *head_dim_v_option = nullptr, *dtype_option = nullptr;
};

struct TuneJob {
  std::string name;  // the spec's path
  Pattern pattern;
  int head_dim, head_dim_v;
  DType dtype;
};

std::vector<int64_t> parse_seqs(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  for (std::string s; std::getline(ss, s, ',');) {
    const std::optional<int64_t> v = parse_int(s, 1, INT64_MAX);
    if (!v) throw UserError("--seq", "expected positive integers separated by commas (4096,16384), got \"" + text + "\"");
    out.push_back(*v);
  }
  if (out.empty()) throw UserError("--seq", "give at least one sequence length");
  return out;
}

// A spec gives one job, at --head-dim and --dtype; a precompile manifest one per pattern, head dim
// and dtype of each entry, read as strictly as precompile reads it (read_manifest: a typo is an
// error, never an entry tuned at other head dims than asked). Its head dims and dtypes are the
// entries' own, so --head-dim, --head-dim-v and --dtype with a manifest are errors; its "tiles"
// and "backward" are precompile's (tune times every candidate, of the forward or with --backward
// of the backward kernels).
std::vector<TuneJob> load_jobs(const TuneOptions& o) {
  const std::string text = read_small_file(o.input, "spec or manifest");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    j = nullptr;  // load_spec_file reports the JSON error with its position
  }
  if (!j.is_object() || !j.contains("attnjit_manifest")) {
    const int dv = o.head_dim_v ? o.head_dim_v : o.head_dim;
    return {TuneJob{o.input, load_spec_file(o.input), o.head_dim, dv, parse_dtype(o.dtype)}};
  }
  for (const CLI::Option* given : {o.head_dim_option, o.head_dim_v_option, o.dtype_option})
    if (given->count() > 0)
      throw UserError(given->get_name(), "applies to a spec; " + o.input + " is a manifest, whose entries name their own "
                                         "\"head_dims\" and \"dtypes\" (drop " + given->get_name() + ")");
  std::vector<TuneJob> jobs;
  const fs::path dir = fs::path(o.input).parent_path();
  for (const ManifestEntry& e : read_manifest(o.input))
    for (const std::string& spec : e.patterns) {
      const Pattern p = load_spec_file((dir / spec).string());
      for (int d : e.head_dims)
        for (DType dt : e.dtypes) jobs.push_back(TuneJob{spec, p, d, d, dt});
    }
  return jobs;
}

void progress_bar(const std::string& phase, size_t done, size_t total) {
  const int width = 30, filled = total ? static_cast<int>(width * done / total) : width;
  std::fprintf(stderr, "\r[%s%s] %s %zu/%zu candidates ", std::string(filled, '#').c_str(),
               std::string(width - filled, '.').c_str(), phase.c_str(), done, total);
  if (done == total) std::fprintf(stderr, "\n");
}

std::string ms_text(double v) {
  char b[32];
  if (std::isfinite(v)) std::snprintf(b, sizeof b, "%.4f ms", v);
  else std::snprintf(b, sizeof b, "none");
  return b;
}

int run_tune(const TuneOptions& o) {
  if (o.input.empty()) throw UserError("attnjit tune", "give a spec or a manifest to tune (or --show)");
  const std::vector<int64_t> seqs = parse_seqs(o.seqs);
  const std::vector<TuneJob> jobs = load_jobs(o);
  const TuningGpu gpu = tuning_gpu(0);  // "tuning needs a GPU: ..." without one
  const std::string db_file = o.db.empty() ? default_db_files(knobs(), gpu.name).front() : o.db;
  TuningDb db({db_file});
  TuneBudget budget;
  budget.warmup = o.warmup;
  budget.max_iterations = o.iterations;
  budget.seconds_per_candidate = o.seconds;
  GpuTuneOptions go;
  go.cache_dir = o.cache_dir;
  go.backward = o.backward;
  int failed = 0;
  for (const TuneJob& job : jobs) {
    for (int64_t seq : seqs) {
      const int64_t heads_kv = o.heads_kv ? o.heads_kv : o.heads_q;
      const Problem pb{1, seq, seq, o.heads_q, heads_kv, job.head_dim, job.head_dim_v, job.dtype, std::nullopt};
      if (o.refresh) {  // only keys with no entry of this build's templates
        const TuneKey key = tune_key_for(gpu, job.pattern, pb, go.buckets, o.backward);
        if (!db.needs_retune(key)) {
          std::cout << "up to date: " << key.describe() << " (tuned with these kernel templates)\n";
          continue;
        }
      }
      std::cout << "tuning " << job.name << " seq=" << seq << " heads_q=" << o.heads_q << " heads_kv=" << heads_kv
                << " d=" << job.head_dim << " "
                << to_string(job.dtype) << (o.backward ? " backward" : "") << " on " << gpu.name << "\n"
                << std::flush;
      const GpuTuneOutcome out = tune_on_gpu(job.pattern, pb, budget, go, progress_bar);
      std::cout << format_tune_table(out.result);
      if (!out.result.found()) {
        std::cerr << "error: no candidate ran for " << out.key.describe() << "; nothing recorded\n";
        ++failed;
        continue;
      }
      char speedup[48] = "";
      if (std::isfinite(out.result.default_ms) && out.result.best_ms > 0)
        std::snprintf(speedup, sizeof speedup, ", %.2fx faster", out.result.default_ms / out.result.best_ms);
      std::printf("winner: %s %s (default %s%s) in %.1f s\n", describe(out.result.best).c_str(),
                  ms_text(out.result.best_ms).c_str(), ms_text(out.result.default_ms).c_str(), speedup, out.result.wall_s);
      db.record(db_file, out.key, out.result, out.metadata);
      std::cout << "recorded in " << db_file << "\n" << std::flush;
    }
  }
  return failed ? 1 : 0;
}

// Every *.json in a directory, sorted.
std::vector<std::string> json_files_in(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".json") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

int run_show(const TuneOptions& o) {
  std::string gpu;
  std::vector<std::string> files;
  const DriverProbe probe = probe_cuda_driver();
  if (probe.loaded && !probe.gpus.empty()) {
    gpu = probe.gpus[0].name;
    files = o.db.empty() ? default_db_files(knobs(), gpu) : std::vector<std::string>{o.db};
    std::cout << "tuning databases for " << gpu << ":\n";
  } else {
    files = o.db.empty() ? json_files_in((fs::path(knobs().cache_dir) / "tuning").string()) : std::vector<std::string>{o.db};
    if (o.db.empty())
      for (const std::string& f : json_files_in(shipped_db_dir())) files.push_back(f);
    std::cout << "no GPU (" << probe.problem << "); every entry of every database:\n";
  }
  if (files.empty()) std::cout << "(no tuning databases found)\n";
  const TuningDb db(files);
  for (const DbFile& f : db.files()) {
    if (!f.present) {
      std::cout << f.path << ": " << (f.problem.empty() ? "no such file" : "ignored: " + f.problem) << "\n";
      continue;
    }
    std::cout << f.path << ": " << f.entries.size() << " entries"
              << (f.invalid.empty() ? "" : " (and " + std::to_string(f.invalid.size()) + " invalid, skipped)") << ", attnjit "
              << f.metadata.attnjit_version << ", NVRTC " << f.metadata.nvrtc_version
              << (f.trusted ? "" : " (other versions than this attnjit's: ignored by lookups, re-tune)") << "\n";
    for (const DbEntry& e : f.entries) {
      if (!gpu.empty() && e.key.gpu != gpu) continue;
      std::cout << "  " << e.key.describe() << ": " << describe(e.result.best) << " " << ms_text(e.result.best_ms)
                << " (default " << ms_text(e.result.default_ms) << ", " << e.result.candidates.size()
                << " candidates) tuned " << e.tuned_at
                << (db.stale(e)            ? ", STALE: timed with other kernel templates (ignored; tune --refresh retimes it)"
                    : e.templates.empty() ? ", templates unknown"
                                          : "")
                << "\n";
    }
    for (const DbEntry& e : f.invalid) {
      if (!gpu.empty() && e.key.gpu != gpu) continue;
      std::cout << "  " << e.key.describe() << ": INVALID, skipped: " << e.problem << "\n";
    }
  }
  return 0;
}

// --show prints the databases: the options that choose what to tune (a spec, --seq, --backward,
// ...) would be ignored beside it, so they are errors; --db says which database (else the
// knobs': ATTNJIT_CACHE_DIR's tuning/ and the shipped ones; --cache-dir is the kernel cache tuning
// compiles into).
void check_show_options(const CLI::App& sub) {
  for (const CLI::Option* opt : sub.get_options()) {
    const std::string name = opt->get_name();
    if (opt->count() == 0 || name == "--show" || name == "--db" || name == "--help") continue;
    throw UserError(name == "input" ? "attnjit tune --show " + opt->results().front() : name,
                    std::string(name == "input" ? "names what to tune" : "applies to tuning") +
                        "; --show prints what the databases hold (drop it, or --show)");
  }
}

}  // namespace

void register_tune(CLI::App& app, int& rc) {
  auto o = std::make_shared<TuneOptions>();
  CLI::App* sub = app.add_subcommand("tune", "time kernel configs on this GPU and record the best in the tuning database");
  sub->add_option("input", o->input, "pattern spec or precompile manifest (JSON)");
  sub->add_option("--seq", o->seqs, "sequence lengths, comma separated")->capture_default_str();
  o->head_dim_option = sub->add_option("--head-dim", o->head_dim, "a spec's head dimension (a manifest names its own)")->capture_default_str();
  o->head_dim_v_option = sub->add_option("--head-dim-v", o->head_dim_v, "a spec's head dimension of V (default: --head-dim)");
  o->dtype_option = sub->add_option("--dtype", o->dtype, "a spec's dtype: fp16, bf16, fp32 or fp8_e4m3 (a manifest names its own)")
                        ->capture_default_str();
  // The same names as run, validate and mask.
  sub->add_option("--heads-q", o->heads_q, "query heads")->capture_default_str()->check(at_least(1));
  sub->add_option("--heads-kv", o->heads_kv, "key/value heads (default: --heads-q)")->check(at_least(1));
  sub->add_option("--db", o->db, "tuning database file (default: <cache dir>/tuning/<gpu>.json)");
  sub->add_option("--cache-dir", o->cache_dir, "kernel cache directory (default: ATTNJIT_CACHE_DIR or ~/.cache/attnjit)");
  sub->add_option("--warmup", o->warmup, "untimed runs per candidate")->capture_default_str();
  sub->add_option("--iterations", o->iterations, "timed runs per candidate, at most")->capture_default_str();
  sub->add_option("--seconds", o->seconds, "timing budget per candidate")->capture_default_str();
  sub->add_flag("--backward", o->backward, "tune the backward kernels' tiles (recorded under their own key)");
  sub->add_flag("--refresh", o->refresh,
                "tune only the keys whose entry is missing or was timed with other kernel templates (stale)");
  sub->add_flag("--show", o->show, "print what the tuning databases hold for this GPU (all entries without a GPU)");
  sub->callback([o, sub, &rc] {
    rc = guarded([&] {
      if (o->show) check_show_options(*sub);
      return o->show ? run_show(*o) : run_tune(*o);
    });
  });
}

}  // namespace attnjit::cli
