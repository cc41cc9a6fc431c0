// The autotuner and the tuning database, offline: candidates, pruning, the search with an injected
// timer (ties, failures), keys and bucket fallback, metadata, corrupt files, concurrent writers,
// user-over-shipped precedence, and `attnjit tune` without a GPU.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "compiler/pattern/spec_json.hpp"
#include "compiler/support/error.hpp"
#include "compiler/support/knobs.hpp"
#include "compiler/tune/autotune.hpp"
#include "compiler/tune/tuning_db.hpp"
#include "runtime/cuda/cuda_driver.hpp"
#include "runtime/cuda/tuning_search.hpp"
#include "tests/unit/test_support.hpp"

using namespace attnjit;
namespace fs = std::filesystem;
using attnjit::testing::StderrCapture;
using attnjit::testing::TempDir;

namespace {



bool warnings_shown() { return knobs().log_level >= LogLevel::Warn; }

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  REQUIRE(out.good());
}

// Samples per config (by describe()), or a throw for configs in `fail`.
class FakeTimer : public CandidateTimer {
public:
  std::map<std::string, std::vector<double>> samples;
  std::map<std::string, std::string> fail;
  std::vector<KernelConfig> timed;
  int last_warmup = -1, last_iterations = -1;
  std::vector<double> time_ms(const KernelConfig& c, int warmup, int iterations) override {
    timed.push_back(c);
    last_warmup = warmup, last_iterations = iterations;
    if (fail.count(describe(c))) throw std::runtime_error(fail[describe(c)]);
    return samples.at(describe(c));
  }
};

const KernelConfig kA{64, 64, 2}, kB{64, 32, 2}, kC{128, 64, 2};

TuneKey key_for(int64_t bucket, const std::string& sig = "0123456789abcdef") {
  return TuneKey{"NVIDIA H100 80GB HBM3", 132, 90, sig, 128, 128, DType::BF16, bucket};
}

TuneResult result_for(const KernelConfig& best, double ms = 1.0) {
  TuneResult r;
  r.candidates = {{KernelConfig{64, 64, 2}, "ok", 1.5, 1.4, 1.6}, {best, "ok", ms, ms, ms},
                  {KernelConfig{128, 128, 3}, "pruned: spills 8B stores, 8B loads"}};
  r.best = best;
  r.best_ms = ms;
  r.default_ms = 1.5;
  return r;
}

DbMetadata meta(const std::string& version = ATTNJIT_VERSION) {
  DbMetadata m = running_metadata();
  m.attnjit_version = version;
  m.gpu = "NVIDIA H100 80GB HBM3", m.sm_count = 132, m.arch = 90, m.driver_version = 13000;
  return m;
}

}  // namespace

TEST_CASE("sequence buckets and pattern signatures key the results", "[autotune]") {
  CHECK(seq_bucket_of(1) == 1);
  CHECK(seq_bucket_of(4096) == 4096);
  CHECK(seq_bucket_of(4097) == 8192);
  CHECK(seq_bucket_of(3000) == 4096);
  CHECK(seq_bucket_of(3000, {1024, 8192, 32768}) == 8192);
  CHECK(seq_bucket_of(100000, {1024, 8192, 32768}) == 32768);
  CHECK_THROWS_AS(seq_bucket_of(0), UserError);
  CHECK_THROWS_AS(seq_bucket_of(10, {8192, 1024}), UserError);

  const Pattern a = PatternBuilder().branch(BranchSpec().segment(2048).dilation(1)).build();
  const Pattern b = PatternBuilder().branch(BranchSpec().segment(4096).dilation(1)).build();
  const Pattern c = PatternBuilder().branch(BranchSpec().segment(2048).dilation(2)).build();
  CHECK(pattern_signature(a) != pattern_signature(b));
  CHECK(pattern_signature(a) != pattern_signature(c));
  CHECK(pattern_signature(a) == pattern_signature(PatternBuilder().branch(BranchSpec().segment(2048)).build()));
  CHECK(key_for(4096).describe() == "NVIDIA H100 80GB HBM3 (132 SMs, sm_90) pattern 0123456789abcdef d=128/128 bf16 seq<=4096");
}

TEST_CASE("candidates come in a fixed order with the default first", "[autotune]") {
  KernelRequest r;  // bf16, d=128, sm_80: the tensor-core path
  r.head_dim = r.head_dim_v = 128;
  r.config = {128, 128, 4};  // ignored
  const std::vector<KernelConfig> c = candidate_configs(r);
  KernelRequest d = r;
  d.config = {};
  REQUIRE(!c.empty());
  CHECK(c[0] == resolve_config(d));
  CHECK(c == candidate_configs(r));
  std::vector<std::string> names;
  for (const KernelConfig& k : c) names.push_back(describe(k));
  // 64x128 s3 and 128x128 s3 need more than sm_80's 163 KB of shared memory at d=128, and so does
  // 128x128 s2 with 4 warps (Q read from shared memory at every tile needs space of its own);
  // 128-row tiles come with 16 rows per warp (8 warps) and 32 (4 warps), and with 32 also in one
  // stage (one K and one V buffer).
  CHECK(names == std::vector<std::string>{"64x64 s2 w4", "64x32 s2 w4", "64x32 s3 w4", "64x64 s3 w4", "64x128 s2 w4",
                                          "128x32 s2 w8", "128x32 s2 w4", "128x32 s3 w8", "128x32 s3 w4", "128x64 s2 w8",
                                          "128x64 s2 w4", "128x64 s3 w8", "128x64 s3 w4", "128x128 s2 w8",
                                          "128x32 s1 w4", "128x64 s1 w4", "128x128 s1 w4"});
  for (const KernelConfig& k : c) {
    d.config = k;
    CHECK(resolve_config(d) == k);
  }

  KernelRequest simt;
  simt.dtype = DType::F16;
  simt.arch = 70;
  const std::vector<KernelConfig> s = candidate_configs(simt);
  REQUIRE(choose_path(simt) == KernelPath::Simt);
  CHECK(describe(s[0]) == "32x32 s1 w4");
  CHECK(s.size() == 6);

  // Two output accumulators per warp do not fit the registers past head dim 128: no 32-row warps.
  KernelRequest wide = d;
  wide.head_dim = wide.head_dim_v = 256;
  for (const KernelConfig& k : candidate_configs(wide)) CHECK(k.tile_q / k.warps == 16);
}

// The Hopper path's default up to head dim 64 is FlashAttention-3's 192-row tile, except for patterns
// with block layouts (a 192-row tile straddles their blocks); past head dim 64 it is 128 rows. The
// kernel a runtime generates and the tuner's baseline (the first candidate) agree.
TEST_CASE("the sm_90a default: 192 rows up to head dim 64 unless the pattern has block layouts", "[autotune][codegen]") {
  KernelRequest r;
  r.arch = 90, r.arch_specific = true, r.head_dim = r.head_dim_v = 64;
  const Pattern dense = PatternBuilder().branch(BranchSpec()).build();
  const Pattern dilated = PatternBuilder().branch(BranchSpec().segment(2048)).branch(BranchSpec().segment(4096).dilation(2)).build();
  const Pattern local = parse_spec(R"({"attnjit": 1, "causal": true, "layout": {"block": 128, "local": 3}, "branches": [{"segment": "full"}]})");
  for (const auto& [p, rows] : {std::pair<const Pattern*, int>{&dense, 192}, {&dilated, 192}, {&local, 128}}) {
    INFO(canonical_text(*p));
    const KernelSource k = generate_kernel(*p, r);
    CHECK(k.config.tile_q == rows);
    CHECK(k.config.tile_k == 128);
    CHECK(candidate_configs(for_pattern(r, *p))[0] == k.config);
  }
  CHECK(resolve_config(r).tile_q == 192);  // no pattern: no block layouts
  KernelRequest wide = r;
  wide.head_dim = wide.head_dim_v = 128;
  CHECK(generate_kernel(dense, wide).config.tile_q == 128);
  KernelRequest mixed = r;
  mixed.head_dim_v = 128;  // the larger of the two head dims decides
  CHECK(generate_kernel(dense, mixed).config.tile_q == 128);
  KernelRequest chosen = r;
  chosen.config = {128, 64, 3};  // a caller's (or the tuning database's) tiles stand
  CHECK(generate_kernel(dense, chosen).config.tile_q == 128);
  KernelRequest ampere = r;
  ampere.arch = 80, ampere.arch_specific = false;  // the portable kernel keeps its own default
  CHECK(generate_kernel(dense, ampere).config.tile_q == 64);
}

TEST_CASE("ties within the tolerance go to the earlier candidate, every run", "[autotune]") {
  FakeTimer t;
  t.samples["64x64 s2"] = {1.00, 1.01, 0.99};
  t.samples["64x32 s2"] = {0.99, 0.99, 0.99};  // 1% faster: a tie
  t.samples["128x64 s2"] = {1.2};
  TuneBudget budget;
  budget.warmup = 4, budget.max_iterations = 7;
  const TuneResult r = tune({kA, kB, kC}, t, budget);
  CHECK(r.best == kA);
  CHECK(r.best_ms == Approx(1.00));
  CHECK(r.default_ms == Approx(1.00));
  CHECK(t.last_warmup == 4);
  CHECK(t.last_iterations == 7);
  REQUIRE(r.candidates.size() == 3);
  CHECK(r.candidates[1].status == "ok");
  CHECK(r.candidates[2].p20_ms == Approx(1.2));

  // Swapping the order swaps the winner: the order, not the noise, decides.
  FakeTimer t2 = t;
  CHECK(tune({kB, kA, kC}, t2, budget).best == kB);

  // A clear win (10%) is taken whatever the order.
  t.samples["64x32 s2"] = {0.90};
  CHECK(tune({kA, kB, kC}, t, budget).best == kB);

  // Repeated runs with noise well inside the tolerance pick the same winner.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> noise(-0.004, 0.004);
  for (int run = 0; run < 20; ++run) {
    FakeTimer n;
    for (const auto& [name, ms] : std::map<std::string, double>{{"64x64 s2", 1.0}, {"64x32 s2", 0.995}, {"128x64 s2", 1.3}}) {
      for (int i = 0; i < 9; ++i) n.samples[name].push_back(ms * (1 + noise(rng)));
    }
    CHECK(tune({kA, kB, kC}, n, budget).best == kA);
  }
}

TEST_CASE("median and percentiles come from the samples", "[autotune]") {
  FakeTimer t;
  t.samples["64x64 s2"] = {5, 1, 4, 2, 3, 1e9 /* outlier */, -1 /* invalid, dropped */};
  const TuneResult r = tune({kA}, t, TuneBudget{});
  CHECK(r.candidates[0].median_ms == Approx(3.5));
  CHECK(r.candidates[0].p20_ms == Approx(2.0));
  CHECK(r.candidates[0].p80_ms == Approx(5.0));
}

TEST_CASE("a failing candidate scores +inf and tuning goes on", "[autotune]") {
  FakeTimer t;
  t.samples["64x64 s2"] = {1.0};
  t.fail["64x32 s2"] = "cuLaunchKernel failed: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES";
  t.samples["128x64 s2"] = {0.8};
  std::vector<std::pair<size_t, size_t>> seen;
  const TuneResult r = tune({kA, kB, kC}, t, TuneBudget{}, [&](size_t d, size_t n) { seen.push_back({d, n}); });
  CHECK(t.timed.size() == 3);
  CHECK(r.candidates[1].status == "failed: cuLaunchKernel failed: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES");
  CHECK(std::isinf(r.candidates[1].median_ms));
  CHECK(std::isinf(r.candidates[1].p80_ms));
  CHECK(r.best == kC);
  CHECK(seen.back() == std::pair<size_t, size_t>{3, 3});
  const std::string table = format_tune_table(r);
  CHECK(table.find("* 128x64 s2") != std::string::npos);  // the winner is marked
  CHECK(table.find("inf  failed: cuLaunchKernel failed") != std::string::npos);
  CHECK(table.find("ok (default)") != std::string::npos);

  // Nothing runs: no winner, the default stays the answer.
  FakeTimer all;
  all.fail["64x64 s2"] = "boom";
  const TuneResult none = tune({kA}, all, TuneBudget{});
  CHECK_FALSE(none.found());
  CHECK(none.best == kA);
  CHECK(none.candidates[0].status == "failed: boom");
}

TEST_CASE("the compile check prunes before timing", "[autotune]") {
  FakeTimer t;
  t.samples["64x64 s2"] = {1.0};
  t.samples["128x64 s2"] = {0.5};
  std::vector<bool> baselines;
  const CompileCheck check = [&baselines](const KernelConfig& c, bool baseline) -> std::optional<std::string> {
    baselines.push_back(baseline);
    if (c == kB) return std::string("spills 64B stores, 64B loads");
    if (c == kC) throw std::runtime_error("NVRTC failed to compile");
    return std::nullopt;
  };
  const std::vector<std::string> skip = prune_candidates({kA, kB, kC}, {}, check);
  CHECK(skip == std::vector<std::string>{"", "pruned: spills 64B stores, 64B loads", "failed: NVRTC failed to compile"});
  CHECK(baselines == std::vector<bool>{true, false, false});  // the default is the baseline
  const TuneResult r = tune({kA, kB, kC}, skip, t, TuneBudget{});
  CHECK(t.timed == std::vector<KernelConfig>{kA});
  CHECK(r.candidates[1].status == "pruned: spills 64B stores, 64B loads");
  CHECK(std::isinf(r.candidates[1].median_ms));
  CHECK(r.best == kA);
}

TEST_CASE("the cost model prunes configs computing over 1.5x the leanest one's pairs", "[autotune]") {
  // Injected costs: the default is kept whatever it costs; exactly 1.5x is kept.
  const std::map<std::string, int64_t> pairs{{"64x64 s2", 400}, {"64x32 s2", 100}, {"128x64 s2", 150}, {"128x32 s2", 151}};
  const CostModel cost = [&](const KernelConfig& c) { return pairs.at(describe(c)); };
  const std::vector<std::string> skip = prune_candidates({kA, kB, kC, KernelConfig{128, 32, 2}}, cost, {});
  CHECK(skip[0].empty());
  CHECK(skip[1].empty());
  CHECK(skip[2].empty());
  CHECK(skip[3] == "pruned: computes 151 pairs, over 1.5x the leanest candidate's 100 (cost model)");

  // Planned for real: a 32-token causal window wastes most of a 128x128 tile.
  const Pattern p = PatternBuilder().causal().window(32, 0).branch(BranchSpec().full()).build();
  const Shape s{1, 4096, 4096, 1, 1, 128, 128};
  const int64_t small = planned_pairs(p, s, KernelConfig{64, 32, 2});
  const int64_t big = planned_pairs(p, s, KernelConfig{128, 128, 2});
  CHECK(static_cast<double>(big) > 1.5 * static_cast<double>(small));
  const std::vector<std::string> real = prune_candidates(
      {kB, KernelConfig{128, 128, 2}}, [&](const KernelConfig& c) { return planned_pairs(p, s, c); }, {});
  CHECK(real[0].empty());
  CHECK(real[1].rfind("pruned: computes ", 0) == 0);
}

TEST_CASE("backward candidates: the backward default first, powers-of-two tiles, SIMT for fp32", "[autotune][grad]") {
  KernelRequest r;  // bf16, d=128, sm_80
  r.head_dim = r.head_dim_v = 128;
  const std::vector<KernelConfig> c = candidate_backward_configs(r);
  KernelRequest d = r;
  REQUIRE(!c.empty());
  CHECK(c[0] == resolve_backward_config(d));
  CHECK(describe(c[0]) == "64x64 s2 w4");
  CHECK(c == candidate_backward_configs(r));
  for (const KernelConfig& k : c) {
    INFO(describe(k));
    d.config = k;
    CHECK(resolve_backward_config(d) == k);
    CHECK((k.tile_q == 32 || k.tile_q == 64 || k.tile_q == 128));
    CHECK((k.tile_k == 32 || k.tile_k == 64 || k.tile_k == 128));
    CHECK(k.stages == 2);
  }
  CHECK(c.size() > 3);
  // Past head dim 128 the tensor-core backward still (dK and dV by column slices), with the tiles
  // whose two kernels fit the arch's shared memory: on sm_80 (163 KB) 32 x 32 alone (_dq's two
  // stages of 64 keys take 132 KB beside its query tile); on sm_90 (227 KB) from 64 x 64 on.
  KernelRequest wide = r;
  wide.head_dim = wide.head_dim_v = 256;
  REQUIRE(choose_backward_path(wide) == KernelPath::Sm80);
  const std::vector<KernelConfig> w80 = candidate_backward_configs(wide);
  REQUIRE(w80.size() == 1);
  CHECK(describe(w80[0]) == "32x32 s2 w2");
  wide.arch = 90;
  const std::vector<KernelConfig> w = candidate_backward_configs(wide);
  REQUIRE(!w.empty());
  CHECK(describe(w[0]) == "64x64 s2 w4");
  CHECK(w.size() > 2);
  for (const KernelConfig& k : w) {
    INFO(describe(k));
    wide.config = k;
    CHECK(resolve_backward_config(wide) == k);
  }
  // fp32: the SIMT backward, whose static shared memory holds K and V of 16 keys at most at
  // d=256: tile_q {16, 32, 64} x 16.
  KernelRequest simt = r;
  simt.head_dim = simt.head_dim_v = 256;
  simt.dtype = DType::F32;
  REQUIRE(choose_backward_path(simt) == KernelPath::Simt);
  CHECK(candidate_backward_configs(simt).size() == 3);
}

TEST_CASE("backward tuning results are keyed apart from the forward's", "[autotune][grad]") {
  TempDir tmp;
  const std::string file = tmp.file("gpu.json");
  TuneKey bwd = key_for(4096);
  bwd.backward = true;
  CHECK(bwd.describe().find(" backward") != std::string::npos);
  CHECK(key_for(4096).describe().find("backward") == std::string::npos);
  {
    TuningDb writer({});
    writer.record(file, key_for(4096), result_for(kB), meta());
    writer.record(file, bwd, result_for(kC), meta());
  }
  const TuningDb db({file}, meta());
  CHECK(db.lookup(key_for(4096)).config == kB);
  CHECK(db.lookup(bwd).config == kC);
  TuneKey bwd_other = bwd;
  bwd_other.seq_bucket = 8192;  // the nearest backward bucket, never the forward's entry
  CHECK(db.lookup(bwd_other).config == kC);
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  CHECK(text.str().find("\"pass\": \"backward\"") != std::string::npos);
  // Files written before the backward existed have no "pass": their entries are the forward's.
  std::string old = text.str();
  for (size_t at; (at = old.find("\"pass\": \"forward\",")) != std::string::npos;) old.erase(at, 19);
  for (size_t at; (at = old.find(",\n          \"pass\": \"forward\"")) != std::string::npos;) old.erase(at, 30);
  REQUIRE(old.find("\"forward\"") == std::string::npos);
  const DbFile f = parse_tuning_db(file, old, meta());
  REQUIRE(f.problem.empty());
  REQUIRE(f.entries.size() == 2);
  CHECK(f.entries[0].key.backward != f.entries[1].key.backward);
  // Any other pass is a malformed file, named as such.
  std::string bad = text.str();
  bad.replace(bad.find("\"backward\""), 10, "\"sideways\"");
  const DbFile g = parse_tuning_db(file, bad, meta());
  CHECK(g.problem.find("pass") != std::string::npos);
}

TEST_CASE("the Hopper kernels' tiles are keyed apart from the same GPU's portable ones", "[autotune]") {
  TempDir tmp;
  const std::string file = tmp.file("gpu.json");
  TuneKey hopper = key_for(4096);
  hopper.arch_specific = true;
  CHECK(hopper.describe().find("(132 SMs, sm_90a)") != std::string::npos);
  CHECK(key_for(4096).describe().find("(132 SMs, sm_90)") != std::string::npos);
  {
    TuningDb writer({});
    writer.record(file, key_for(4096), result_for(kB), meta());
    writer.record(file, hopper, result_for(kC), meta());
  }
  const TuningDb db({file}, meta());
  CHECK(db.lookup(key_for(4096)).config == kB);
  CHECK(db.lookup(hopper).config == kC);
  TuneKey hopper_far = hopper;
  hopper_far.seq_bucket = 65536;  // the nearest Hopper bucket, never the portable entry
  CHECK(db.lookup(hopper_far).config == kC);
  TuneKey portable_far = key_for(65536);
  CHECK(db.lookup(portable_far).config == kB);
  // Neither entry answers for the other kind with the same bucket missing.
  TuningDb only_portable({});
  const std::string file2 = tmp.file("portable.json");
  only_portable.record(file2, key_for(4096), result_for(kB), meta());
  const TuningDb db2({file2}, meta());
  CHECK(db2.lookup(hopper).source == LookupResult::Source::Heuristic);
  CHECK(db2.needs_retune(hopper));

  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  // The field is written only where set: portable entries read as before it existed.
  size_t count = 0;
  for (size_t at = 0; (at = text.str().find("\"arch_specific\"", at)) != std::string::npos; ++at) ++count;
  CHECK(count == 1);
  CHECK(text.str().find("\"arch_specific\": true") != std::string::npos);
  const DbFile f = parse_tuning_db(file, text.str(), meta());
  REQUIRE(f.problem.empty());
  REQUIRE(f.entries.size() == 2);
  CHECK(f.entries[0].key.arch_specific != f.entries[1].key.arch_specific);
  // Anything but a boolean is a malformed file, named as such.
  std::string bad = text.str();
  bad.replace(bad.find("\"arch_specific\": true"), 21, "\"arch_specific\": \"yes\"");
  const DbFile g = parse_tuning_db(file, bad, meta());
  CHECK(g.problem.find("arch_specific") != std::string::npos);
}

TEST_CASE("lookup: exact key, then the nearest bucket, then the heuristic", "[autotune]") {
  TempDir tmp;
  const std::string file = tmp.file("gpu.json");
  {
    TuningDb writer({});
    writer.record(file, key_for(4096), result_for(kB), meta());
    writer.record(file, key_for(65536), result_for(kC), meta());
  }
  const TuningDb db({file}, meta());
  LookupResult r = db.lookup(key_for(4096));
  CHECK(r.source == LookupResult::Source::Exact);
  CHECK(r.config == kB);
  CHECK(r.file == file);
  CHECK_FALSE(db.needs_retune(key_for(4096)));

  r = db.lookup(key_for(8192));  // 2x from 4096, 8x from 65536
  CHECK(r.source == LookupResult::Source::NearestBucket);
  CHECK(r.config == kB);
  CHECK(r.why.find("nearest tuned bucket 4096") != std::string::npos);
  CHECK(db.needs_retune(key_for(8192)));
  CHECK(db.lookup(key_for(32768)).config == kC);  // 2x from 65536, 8x from 4096
  CHECK(db.lookup(key_for(16384)).config == kB);  // 4x either way: the smaller bucket

  for (TuneKey other : {key_for(4096, "fedcba9876543210"), key_for(4096)}) {
    if (other.pattern_signature == "0123456789abcdef") other.dtype = DType::F16;
    r = db.lookup(other);
    CHECK(r.source == LookupResult::Source::Heuristic);
    CHECK(r.config == KernelConfig{});
    CHECK(r.file.empty());
    CHECK(r.why.find("using the default config") != std::string::npos);
  }
  CHECK(std::string(to_string(LookupResult::Source::NearestBucket)) == "nearest bucket");
}

TEST_CASE("the database keeps every candidate and writes +inf as null", "[autotune]") {
  TempDir tmp;
  const std::string file = tmp.file("sub/dir/gpu.json");
  TuningDb db({file});
  db.record(file, key_for(4096), result_for(kB, 0.75), meta());
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  CHECK(text.str().find("\"attnjit_tuning_db\": 1") != std::string::npos);
  CHECK(text.str().find("\"median_ms\": null") != std::string::npos);
  CHECK(text.str().find("\"tuned_at\": \"20") != std::string::npos);
  const DbFile f = parse_tuning_db(file, text.str(), meta());
  REQUIRE(f.problem.empty());
  CHECK(f.trusted);
  CHECK(f.metadata.gpu == "NVIDIA H100 80GB HBM3");
  CHECK(f.metadata.driver_version == 13000);
  REQUIRE(f.entries.size() == 1);
  const TuneResult& r = f.entries[0].result;
  REQUIRE(r.candidates.size() == 3);
  CHECK(r.candidates[2].status == "pruned: spills 8B stores, 8B loads");
  CHECK(std::isinf(r.candidates[2].median_ms));
  CHECK(r.candidates[0].p20_ms == 1.4);
  CHECK(r.best_ms == 0.75);
  CHECK(db.lookup(key_for(4096)).config == kB);  // the in-memory copy is refreshed by record()
  // Recording the same key again replaces it.
  db.record(file, key_for(4096), result_for(kC), meta());
  CHECK(TuningDb({file}).files()[0].entries.size() == 1);
  CHECK(TuningDb({file}).lookup(key_for(4096)).config == kC);
}

TEST_CASE("a config's warps survive the database, and entries without them read as the default", "[autotune]") {
  TempDir tmp;
  const std::string file = tmp.file("gpu.json");
  const KernelConfig four_warps{128, 64, 2, 4};
  TuningDb({file}).record(file, key_for(4096), result_for(four_warps), meta());
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  CHECK(text.str().find("\"warps\": 4") != std::string::npos);
  CHECK(TuningDb({file}, meta()).lookup(key_for(4096)).config == four_warps);

  // A file written before configs named their warps: the entry measured the default (0).
  std::string legacy = text.str();
  for (size_t at; (at = legacy.find("\"warps\": ")) != std::string::npos;) {
    const size_t end = legacy.find_first_of(",}", at);
    const size_t comma = legacy.rfind(',', at);
    legacy.erase(comma, end - comma);
  }
  REQUIRE(legacy.find("warps") == std::string::npos);
  write_text(file, legacy);
  const TuningDb old({file}, meta());
  REQUIRE(old.files()[0].problem.empty());
  CHECK(old.lookup(key_for(4096)).config == KernelConfig{128, 64, 2, 0});
}

TEST_CASE("entries tuned with another attnjit or NVRTC version are ignored", "[autotune]") {
  TempDir tmp;
  const std::string file = tmp.file("gpu.json");
  write_text(file, serialize_tuning_db(meta("0.0.1-old"), {DbEntry{key_for(4096), result_for(kB), "2024-01-01T00:00:00Z", {}, {}}}));
  const TuningDb db({file}, meta());
  CHECK(db.files()[0].present);
  CHECK_FALSE(db.files()[0].trusted);
  const LookupResult r = db.lookup(key_for(4096));
  CHECK(r.source == LookupResult::Source::Heuristic);
  CHECK(r.why.find("ignored " + file) != std::string::npos);
  CHECK(r.why.find("0.0.1-old") != std::string::npos);
  CHECK(db.needs_retune(key_for(4096)));

  DbMetadata nvrtc = meta();
  nvrtc.nvrtc_version = "1.0";
  write_text(file, serialize_tuning_db(nvrtc, {DbEntry{key_for(4096), result_for(kB), "2024-01-01T00:00:00Z", {}, {}}}));
  CHECK(TuningDb({file}, meta()).lookup(key_for(4096)).source == LookupResult::Source::Heuristic);
  // Another minor release of the same NVRTC is trusted (13.0's entries under 13.2).
  DbMetadata minor = meta();
  minor.nvrtc_version = minor.nvrtc_version.substr(0, minor.nvrtc_version.find('.')) + ".99";
  write_text(file, serialize_tuning_db(minor, {DbEntry{key_for(4096), result_for(kB), "2024-01-01T00:00:00Z", {}, {}}}));
  CHECK(TuningDb({file}, meta()).lookup(key_for(4096)).source == LookupResult::Source::Exact);
  write_text(file, serialize_tuning_db(nvrtc, {DbEntry{key_for(4096), result_for(kB), "2024-01-01T00:00:00Z", {}, {}}}));
  // Recording with today's versions starts the file afresh.
  TuningDb({file}).record(file, key_for(8192), result_for(kC), meta());
  const TuningDb fresh({file}, meta());
  CHECK(fresh.files()[0].trusted);
  CHECK(fresh.files()[0].entries.size() == 1);
}

// An entry records the hash of the kernel templates it was timed with; one of other templates is
// stale: lookups skip it (an exact key falls to the nearest fresh bucket or the heuristic), the
// key needs re-tuning, and recording replaces it with this build's hash. An entry without the
// field (files written before it) is used as it is.
TEST_CASE("entries timed with other kernel templates are stale: skipped, re-tuned, replaced", "[autotune]") {
  TempDir tmp;
  const std::string file = tmp.file("gpu.json");
  const DbMetadata now = meta();
  REQUIRE_FALSE(now.templates.empty());
  DbEntry old{key_for(4096), result_for(kB), "2024-01-01T00:00:00Z", {}, "0000000000000000"};
  DbEntry fresh{key_for(16384), result_for(kC), "2024-01-01T00:00:00Z", {}, now.templates};
  write_text(file, serialize_tuning_db(now, {old, fresh}));
  const TuningDb db({file}, now);
  REQUIRE(db.files()[0].entries.size() == 2);
  CHECK(db.files()[0].entries[0].templates == "0000000000000000");
  CHECK(db.stale(db.files()[0].entries[0]));
  CHECK_FALSE(db.stale(db.files()[0].entries[1]));
  const LookupResult r = db.lookup(key_for(4096));
  CHECK(r.source == LookupResult::Source::NearestBucket);  // the fresh 16384 entry, not the stale exact one
  CHECK(r.config == kC);
  CHECK(r.why.find("other kernel templates") != std::string::npos);
  CHECK(db.needs_retune(key_for(4096)));
  CHECK_FALSE(db.needs_retune(key_for(16384)));

  // Unrecorded templates: used.
  DbEntry unknown{key_for(4096), result_for(kB), "2024-01-01T00:00:00Z", {}, ""};
  write_text(file, serialize_tuning_db(now, {unknown}));
  const TuningDb legacy({file}, now);
  CHECK_FALSE(legacy.stale(legacy.files()[0].entries[0]));
  CHECK(legacy.lookup(key_for(4096)).source == LookupResult::Source::Exact);
  CHECK_FALSE(legacy.needs_retune(key_for(4096)));

  // Recording writes this build's hash, replacing the stale entry.
  write_text(file, serialize_tuning_db(now, {old}));
  TuningDb({file}, now).record(file, key_for(4096), result_for(kC), now);
  const TuningDb after({file}, now);
  REQUIRE(after.files()[0].entries.size() == 1);
  CHECK(after.files()[0].entries[0].templates == now.templates);
  CHECK(after.lookup(key_for(4096)).source == LookupResult::Source::Exact);
}

TEST_CASE("a corrupt database file is one warning, then ignored", "[autotune]") {
  TempDir tmp;
  const std::string file = tmp.file("gpu.json");
  const std::string good = serialize_tuning_db(meta(), {DbEntry{key_for(4096), result_for(kB), "2024-01-01T00:00:00Z", {}, {}}});
  std::string wrong_type = good;
  wrong_type.replace(wrong_type.find("\"head_dim\": 128"), 15, "\"head_dim\": \"x\"");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"attnjit_tuning_db\": 1, \"entr", "invalid JSON"},
      {good.substr(0, good.size() / 2), "invalid JSON"},
      {"[1, 2, 3]", "not an attnjit tuning database"},
      {"{\"attnjit_tuning_db\": 7}", "/attnjit_tuning_db: format 7"},
      {wrong_type, "/entries/0/key/head_dim: expected an integer"},
      {std::string("\0\x01\xff garbage", 11), "invalid JSON"}};
  for (const auto& [text, problem] : cases) {
    write_text(file, text);
    StderrCapture err;
    std::optional<TuningDb> db;
    REQUIRE_NOTHROW(db.emplace(std::vector<std::string>{file}, meta()));
    const LookupResult r = db->lookup(key_for(4096));
    const std::string out = err.text();
    CHECK(r.source == LookupResult::Source::Heuristic);
    CHECK(db->files()[0].problem.find(problem) != std::string::npos);
    if (warnings_shown()) {
      CHECK(out.find("attnjit: warning: tuning database " + file + " is malformed") != std::string::npos);
      CHECK(std::count(out.begin(), out.end(), '\n') == 1);
    }
  }
  // Recording over it moves the bad file aside and starts anew.
  {
    StderrCapture err;
    TuningDb({}).record(file, key_for(4096), result_for(kC), meta());
  }
  CHECK(fs::exists(file + ".corrupt"));
  CHECK(TuningDb({file}, meta()).lookup(key_for(4096)).config == kC);
}

TEST_CASE("an entry whose tiles cannot be built for its key is one warning naming the file and key, then skipped",
          "[autotune]") {
  TempDir tmp;
  const std::string file = tmp.file("gpu.json");
  TuneResult bad_best = result_for(kB);
  bad_best.best = KernelConfig{-64, 64, 99};
  TuneResult bad_candidate = result_for(kB);
  bad_candidate.candidates[0].config = KernelConfig{64, 64, 99};  // timed "ok": --top-k would build it
  write_text(file, serialize_tuning_db(meta(), {DbEntry{key_for(4096), result_for(kB), "2024-01-01T00:00:00Z", {}, {}},
                                                DbEntry{key_for(8192), bad_best, "2024-01-01T00:00:00Z", {}, {}},
                                                DbEntry{key_for(16384), bad_candidate, "2024-01-01T00:00:00Z", {}, {}}}));
  StderrCapture err;
  const TuningDb db({file}, meta());
  const std::string out = err.text();
  const DbFile& f = db.files()[0];
  REQUIRE(f.problem.empty());
  REQUIRE(f.entries.size() == 1);
  REQUIRE(f.invalid.size() == 2);
  CHECK(f.invalid[0].key == key_for(8192));
  CHECK(f.invalid[0].problem == "/entries/1/best: tile_q: the tensor-core path needs tile_q in {16, 32, ..., 128} (16 rows per warp), got -64");
  CHECK(f.invalid[1].problem == "/entries/2/candidates/0/config: stages: the sm_80 forward takes 1 stage (one K and one V "
                                "buffer, FlashAttention-2's pipeline) to 4, got 99");
  if (warnings_shown()) {
    CHECK(out.find("tuning database " + file + ": skipping the entry for " + key_for(8192).describe() + " (/entries/1/best") !=
          std::string::npos);
    CHECK(out.find("tuning database " + file + ": skipping the entry for " + key_for(16384).describe()) != std::string::npos);
  }
  // Lookups never hand out the bad tiles: the exact key misses, and the nearest valid bucket serves.
  CHECK(db.lookup(key_for(8192)).source == LookupResult::Source::NearestBucket);
  CHECK(db.lookup(key_for(8192)).config == kB);
  CHECK(db.needs_retune(key_for(8192)));
  // Recording another key keeps the bad entries as they were; recording their key replaces one.
  {
    StderrCapture quiet;
    TuningDb({}).record(file, key_for(32768), result_for(kC), meta());
    TuningDb({}).record(file, key_for(8192), result_for(kC), meta());
  }
  StderrCapture quiet;
  const TuningDb after({file}, meta());
  CHECK(after.files()[0].entries.size() == 3);
  CHECK(after.files()[0].invalid.size() == 1);
  CHECK(after.lookup(key_for(8192)).config == kC);
}

TEST_CASE("integers past their field's range, negative times and repeated keys make an entry invalid, never truncated",
          "[autotune]") {
  TempDir tmp;
  const std::string file = tmp.file("gpu.json");
  TuneResult negative = result_for(kB);
  negative.best_ms = -0.5;
  TuneResult no_time = result_for(kB);
  no_time.best_ms = kInfMs;  // written as null
  TuneResult bad_candidate = result_for(kB);
  bad_candidate.candidates[1].p80_ms = -2;
  std::string text = serialize_tuning_db(meta(), {DbEntry{key_for(4096), result_for(kB), "2024-01-01T00:00:00Z", {}, {}},
                                                  DbEntry{key_for(8192), result_for(kA), "2024-01-01T00:00:00Z", {}, {}},
                                                  DbEntry{key_for(16384), negative, "2024-01-01T00:00:00Z", {}, {}},
                                                  DbEntry{key_for(32768), no_time, "2024-01-01T00:00:00Z", {}, {}},
                                                  DbEntry{key_for(65536), bad_candidate, "2024-01-01T00:00:00Z", {}, {}},
                                                  DbEntry{key_for(4096), result_for(kC), "2024-01-01T00:00:00Z", {}, {}}});
  // 4294967360 is 2^32 + 64: a cast to int read it as 64, a valid tile.
  const size_t best = text.rfind("\"best\"", text.find("\"seq_bucket\": 8192"));  // "best" precedes "key"
  const size_t tile_k = text.find("\"tile_k\": 64", best);
  REQUIRE(tile_k != std::string::npos);
  text.replace(tile_k, std::string("\"tile_k\": 64").size(), "\"tile_k\": 4294967360");
  write_text(file, text);
  StderrCapture err;
  const TuningDb db({file}, meta());
  const DbFile& f = db.files()[0];
  REQUIRE(f.problem.empty());
  REQUIRE(f.entries.size() == 1);
  REQUIRE(f.invalid.size() == 5);
  CHECK(f.invalid[0].problem == "/entries/1/best/tile_k: 4294967360 is out of range (at most 2147483647)");
  CHECK(f.invalid[1].problem.find("/entries/2/best_ms: the best configuration's time must be a number of milliseconds >= 0, got -0.5") == 0);
  CHECK(f.invalid[2].problem.find("/entries/3/best_ms:") == 0);
  CHECK(f.invalid[3].problem.find("/entries/4/candidates/1/p80_ms: a time must be >= 0 ms") == 0);
  CHECK(f.invalid[4].problem == "/entries/5/key: the same key as /entries/0, which lookups use; delete one of the two");
  CHECK(db.lookup(key_for(4096)).config == kB);
  CHECK(db.lookup(key_for(8192)).source == LookupResult::Source::NearestBucket);
  CHECK(db.needs_retune(key_for(8192)));
  // Recording another key writes the invalid entries back as they were, never the 0 read for the
  // value out of range; recording the repeated key replaces both of its entries.
  {
    StderrCapture quiet;
    TuningDb({}).record(file, key_for(131072), result_for(kC), meta());
  }
  std::ifstream in(file);
  std::stringstream written;
  written << in.rdbuf();
  CHECK(written.str().find("4294967360") != std::string::npos);
  {
    StderrCapture quiet;
    const TuningDb again({file}, meta());
    CHECK(again.files()[0].entries.size() == 2);
    CHECK(again.files()[0].invalid.size() == 5);
    TuningDb({}).record(file, key_for(4096), result_for(kA), meta());
  }
  StderrCapture quiet;
  const TuningDb after({file}, meta());
  CHECK(after.files()[0].entries.size() == 2);
  CHECK(after.files()[0].invalid.size() == 4);
  CHECK(after.lookup(key_for(4096)).config == kA);
}

TEST_CASE("concurrent processes recording into one file lose nothing", "[autotune]") {
  TempDir tmp;
  const std::string file = tmp.file("shared.json");
  constexpr int kChildren = 4, kKeys = 10;
  attnjit::testing::run_processes_at_once(kChildren, [&](int c) {
    TuningDb db({file});
    for (int k = 0; k < kKeys; ++k) db.record(file, key_for(int64_t{1} << (c * kKeys + k)), result_for(kB), meta());
    return 0;
  });
  const TuningDb db({file}, meta());
  REQUIRE(db.files()[0].problem.empty());
  CHECK(db.files()[0].entries.size() == kChildren * kKeys);
  for (int n = 0; n < kChildren * kKeys; ++n) CHECK(db.lookup(key_for(int64_t{1} << n)).source == LookupResult::Source::Exact);
  for (const auto& e : fs::directory_iterator(tmp.path))  // no temp files left behind
    CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
}

TEST_CASE("the user's database takes precedence over the shipped one", "[autotune]") {
  TempDir tmp;
  const std::string user = tmp.file("user/gpu.json"), shipped = tmp.file("shipped/gpu.json");
  TuningDb({}).record(user, key_for(4096), result_for(kB), meta());
  TuningDb({}).record(shipped, key_for(4096), result_for(kC), meta());
  TuningDb({}).record(shipped, key_for(8192), result_for(kC), meta());
  TuningDb({}).record(user, key_for(65536), result_for(kB), meta());
  const TuningDb db({user, shipped}, meta());
  LookupResult r = db.lookup(key_for(4096));
  CHECK(r.config == kB);
  CHECK(r.file == user);
  r = db.lookup(key_for(8192));  // shipped exact beats the user's nearest
  CHECK(r.source == LookupResult::Source::Exact);
  CHECK(r.file == shipped);
  CHECK(TuningDb({shipped, user}, meta()).lookup(key_for(4096)).config == kC);
  // The same bucket in both files: the earlier file's entry is the nearest.
  r = db.lookup(key_for(2048));
  CHECK(r.source == LookupResult::Source::NearestBucket);
  CHECK(r.file == user);

  Knobs k;
  k.cache_dir = "/home/u/.cache/attnjit";
  CHECK(default_db_files(k, "NVIDIA H100 80GB HBM3", "/src/autotune_db") ==
        std::vector<std::string>{"/home/u/.cache/attnjit/tuning/NVIDIA_H100_80GB_HBM3.json",
                                 "/src/autotune_db/NVIDIA_H100_80GB_HBM3.json"});
  CHECK(sanitize_gpu_name("NVIDIA A100-SXM4-40GB (MIG 1g.5gb)") == "NVIDIA_A100-SXM4-40GB_MIG_1g.5gb");
  CHECK(fs::path(default_shipped_db_dir()).filename() == "autotune_db");  // compiled in; the knob may replace it
}

TEST_CASE("attnjit tune without a GPU fails with a clear error", "[autotune]") {
  if (CudaDriver::available() && device_count() > 0) {
    WARN("SKIPPED: this machine has a GPU");
    return;
  }
  const Pattern p = PatternBuilder().branch(BranchSpec().segment(2048)).build();
  const Problem pb{1, 4096, 4096, 16, 16, 128, 128, DType::BF16, {}};
  try {
    tune_on_gpu(p, pb, TuneBudget{});
    FAIL("tune_on_gpu ran without a GPU");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).rfind("attnjit tune: tuning needs a GPU: ", 0) == 0);
    CHECK(e.message().size() > std::string("tuning needs a GPU: ").size());  // says why
  }
  CHECK_THROWS_WITH(GpuCandidateTimer(p, pb), Catch::Contains("tuning needs a GPU"));
}
